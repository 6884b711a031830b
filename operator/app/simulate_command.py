"""`specpilot simulate`: the emulator's fast mode over a sweep of load, as one JSON object.

`--world-seed S` runs in hidden world S (`specpilot.runtime.emulator.world`) and reports its
hidden parameters under `world`; the default 0 is the nominal world (truth = priors + catalog).
Without `--json` it prints one line per load point; `--json [PATH]` writes the whole report
(cli_conventions). A `--duration` that leaves nothing measured after the warmup is an error,
not a `speedup` of null.
"""

from __future__ import annotations

import argparse
import math
from typing import Any, cast

from specpilot.operator.app.cli_conventions import add_json_option, progress, write_json
from specpilot.runtime.emulator.fast_sweep import TASK_SHAPES, simulate
from specpilot.runtime.emulator.world import draw_world
from specpilot.runtime.engines import get_adapter
from specpilot.tuner import (
    DRAFT_WEIGHT_METHODS,
    GPUS,
    PROFILES,
    ConfigError,
    SpecConfig,
    SpecMethod,
)

WARMUP_S = 20.0
"""Simulated seconds before measuring: the batch fills and the first requests finish."""


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "simulate", help="emulated throughput of a config against no speculation"
    )
    parser.add_argument("--gpu", default="H100", help=" | ".join(GPUS))
    parser.add_argument("--model-profile", default="llama-3.1-8b", help=" | ".join(PROFILES))
    parser.add_argument("--engine", default="vllm", choices=["vllm", "sglang"], help="dialect")
    parser.add_argument("--method", required=True, help="speculative method, or none")
    parser.add_argument("--k", type=int, default=3, help="num_speculative_tokens")
    parser.add_argument("--draft-model", help="draft name (emulated; no weights are read)")
    parser.add_argument("--task", default="chat", help=" | ".join(TASK_SHAPES))
    parser.add_argument("--concurrency", help="closed loop, comma-separated, e.g. 1,8,32")
    parser.add_argument("--rps", help="open loop Poisson arrivals, comma-separated")
    parser.add_argument(
        "--duration",
        type=float,
        default=120.0,
        help=f"simulated seconds, the first {WARMUP_S:g} of them warmup (not measured)",
    )
    parser.add_argument("--seed", type=int, default=0, help="arrivals, lengths and acceptance")
    parser.add_argument(
        "--world-seed", type=int, default=0, help="hidden world (0: nominal, truth = the priors)"
    )
    add_json_option(parser, "the report")
    parser.set_defaults(run=run)


def _numbers(flag: str, text: str, cast_to: type[int] | type[float]) -> list[Any]:
    try:
        values = [cast_to(part) for part in text.split(",") if part.strip()]
    except ValueError as exc:
        raise ConfigError(flag, text, "comma-separated positive numbers") from exc
    if not values or any(v <= 0 for v in values):
        raise ConfigError(flag, text, "comma-separated positive numbers")
    return values


def run(ns: argparse.Namespace) -> int:
    draft = ns.draft_model
    if draft is None and ns.method in DRAFT_WEIGHT_METHODS and ns.method != "mtp":
        draft = f"emulated-{ns.method}-draft"
    if ns.method == "none":
        config = SpecConfig()
    else:
        config = SpecConfig(
            method=cast(SpecMethod, ns.method), num_speculative_tokens=ns.k, draft_model=draft
        )
    get_adapter(ns.engine).check(config)
    world = draw_world(ns.world_seed)
    perf = world.step_cost(ns.gpu, ns.model_profile)  # validates both names
    if (ns.concurrency is None) == (ns.rps is None):
        raise ConfigError("--concurrency/--rps", None, "exactly one of them")
    if not (math.isfinite(ns.duration) and ns.duration > WARMUP_S):
        allowed = f"a finite number of seconds above the {WARMUP_S:g} s warmup"
        raise ConfigError("--duration", ns.duration, allowed)
    loads: list[tuple[str, Any]] = (
        [("concurrency", c) for c in _numbers("--concurrency", ns.concurrency, int)]
        if ns.concurrency
        else [("rps", r) for r in _numbers("--rps", ns.rps, float)]
    )
    points = []
    common = {
        "performance": perf,
        "task": ns.task,
        "duration_s": ns.duration,
        "warmup_s": WARMUP_S,
        "seed": ns.seed,
        "acceptance": world.acceptance_curve,
    }
    with progress("simulate", 2 * len(loads)) as bar:
        for kind, value in loads:
            spec = simulate(config=config, **common, **{kind: value})
            bar.advance()
            base = simulate(config=SpecConfig(), **common, **{kind: value})
            bar.advance()
            if not (spec.tokens_per_s > 0 and base.tokens_per_s > 0):
                allowed = "long enough that both configs generate tokens after the warmup"
                hint = f"{kind} {value}: nothing was measured"
                raise ConfigError("--duration", ns.duration, allowed, hint)
            points.append(
                {
                    kind: value,
                    "spec_tok_s": round(spec.tokens_per_s, 2),
                    "base_tok_s": round(base.tokens_per_s, 2),
                    "speedup": round(spec.tokens_per_s / base.tokens_per_s, 4),
                    "acceptance_length": spec.acceptance_length
                    and round(spec.acceptance_length, 4),
                    "tpot_ms_p50": spec.tpot_ms_p50 and round(spec.tpot_ms_p50, 3),
                    "base_tpot_ms_p50": base.tpot_ms_p50 and round(base.tpot_ms_p50, 3),
                    "mean_decode_batch": round(spec.mean_decode_batch, 2),
                }
            )
    report = {
        "gpu": perf.gpu.name,
        "model_profile": perf.profile.name,
        "engine": ns.engine,
        "config": config.to_dict(),
        "task": ns.task,
        "step_time_model": perf.step_model.source,
        "world": world.describe(),
        "points": points,
    }
    if ns.json is not None:
        write_json(ns.json, report)
        return 0
    print(f"{config.describe()} on {perf.gpu.name} x {perf.profile.name} ({ns.engine}, {ns.task})")
    for point in points:
        kind = "concurrency" if "concurrency" in point else "rps"
        print(
            f"  {kind} {point[kind]}: {point['speedup']:.3f}x ({point['spec_tok_s']:.1f} vs"
            f" {point['base_tok_s']:.1f} tok/s), acceptance length"
            f" {point['acceptance_length']}, mean decode batch {point['mean_decode_batch']}"
        )
    return 0
