"""`specpilot run`: the control loop against one local engine (the emulator or a real vLLM)."""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import cast, get_args

from specpilot.operator.app.cli_conventions import check_count, check_port, check_seconds
from specpilot.operator.loop import ControlLoop, TickRecord
from specpilot.runtime.engines import LaunchSettings, get_adapter, max_batch_from_args
from specpilot.runtime.local_engine import LocalEngine
from specpilot.tuner import (
    DEFAULT_MAX_BATCH,
    DRAFT_WEIGHT_METHODS,
    ConfigError,
    SpecConfig,
    SpecMethod,
    StepCost,
    StepTimeModel,
    TunerSettings,
    TunerState,
    prior_curves,
)
from specpilot.tuner.policy.settings import Objective

OBJECTIVES: tuple[str, ...] = get_args(Objective)


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("run", help="tune one local engine: observe, decide, restart")
    parser.add_argument("--engine", default="vllm", choices=["vllm", "sglang"], help="engine")
    parser.add_argument("--model", required=True, help="the served model's path or hub name")
    parser.add_argument("--served-model-name", help="name clients ask for (default: --model)")
    parser.add_argument("--host", default="127.0.0.1", help="address the engine binds")
    parser.add_argument("--port", type=int, default=8000, help="port the engine binds")
    parser.add_argument(
        "--candidate",
        action="append",
        default=[],
        help="METHOD:K1,K2,... (repeatable); speculation off is always allowed",
    )
    parser.add_argument("--draft-model", action="append", default=[], help="METHOD=PATH")
    parser.add_argument("--initial", default="none", help="none or METHOD:K")
    parser.add_argument("--emulate", action="store_true", help="run the emulator, not an engine")
    parser.add_argument("--python", default=sys.executable, help="interpreter of a real engine")
    parser.add_argument("--gpu", default="H100", help="the physics prior (and the emulator)")
    parser.add_argument("--model-profile", default="llama-3.1-8b", help="model of the prior")
    parser.add_argument("--task", default="chat", help="acceptance prior per method")
    parser.add_argument("--window", type=float, default=10.0, help="seconds per observation")
    parser.add_argument("--ticks", type=int, default=0, help="stop after N ticks (0: never)")
    parser.add_argument(
        "--min-dwell", type=float, default=300.0, help="seconds a config runs before a switch"
    )
    parser.add_argument("--restart-budget", type=int, default=4, help="restarts per hour")
    parser.add_argument(
        "--restart-downtime", type=float, default=60.0, help="seconds a restart costs"
    )
    parser.add_argument(
        "--objective",
        default="latency",
        choices=OBJECTIVES,
        help="what the tuner optimises (the CRD's tuning.objective): latency at the offered "
        "load (open-loop traffic), throughput at the current batch (a fixed set of clients, a "
        "batch job), goodput (throughput among configs meeting --slo-tpot-p95-ms)",
    )
    parser.add_argument("--slo-tpot-p95-ms", type=float, help="TPOT p95 target, ms (none: off)")
    parser.add_argument(
        "--step-time-fit",
        metavar="FILE",
        help="JSON step-time fit (fixed_s, per_token_s, per_kv_token_s, as `specpilot probe "
        "--json FILE` writes; optionally per_extra_token_s, the price of each token a sequence "
        "adds to a step beyond its first) for the tuner instead of the --gpu roofline, e.g. on "
        "a CPU",
    )
    parser.add_argument("extra_args", nargs=argparse.REMAINDER, help="after --: engine flags")
    parser.set_defaults(run=run)


def _candidates(ns: argparse.Namespace) -> tuple[SpecConfig, ...]:
    drafts = dict(item.split("=", 1) for item in ns.draft_model if "=" in item)
    configs = [SpecConfig()]
    for item in ns.candidate:
        method, _, ks = item.partition(":")
        if not ks:
            raise ConfigError("--candidate", item, "METHOD:K1,K2 such as eagle3:1,3,5")
        draft = drafts.get(method)
        if draft is None and method in DRAFT_WEIGHT_METHODS and method != "mtp":
            draft = f"emulated-{method}-draft" if ns.emulate else None
        for k in ks.split(","):
            if not k.strip().isdigit():
                raise ConfigError("--candidate", item, "METHOD:K1,K2 with integer Ks")
            configs.append(
                SpecConfig(
                    method=cast(SpecMethod, method),
                    num_speculative_tokens=int(k),
                    draft_model=draft,
                )
            )
    adapter = get_adapter(ns.engine)
    for config in configs:
        adapter.check(config)
    return tuple(configs)


def _check_numbers(ns: argparse.Namespace) -> None:
    """Numbers no run could use, refused before the engine starts."""
    check_port("--port", ns.port)
    check_seconds("--window", ns.window)
    check_seconds("--min-dwell", ns.min_dwell, zero=True)
    check_seconds("--restart-downtime", ns.restart_downtime, zero=True)
    check_count("--ticks", ns.ticks)
    check_count("--restart-budget", ns.restart_budget)
    slo = ns.slo_tpot_p95_ms
    if slo is not None and not (math.isfinite(slo) and slo > 0):
        raise ConfigError("--slo-tpot-p95-ms", slo, "a finite number of milliseconds above 0")
    if ns.objective == "goodput" and slo is None:
        raise ConfigError("--slo-tpot-p95-ms", slo, "a target with --objective goodput")


def run(ns: argparse.Namespace) -> int:
    _check_numbers(ns)
    candidates = _candidates(ns)
    initial = SpecConfig()
    if ns.initial != "none":
        method, _, k = ns.initial.partition(":")
        matches = [c for c in candidates if c.method == method and str(c.max_k) == k]
        if not matches:
            raise ConfigError("--initial", ns.initial, "none or one of the --candidate configs")
        initial = matches[0]
    extra = tuple(ns.extra_args[1:] if ns.extra_args[:1] == ["--"] else ns.extra_args)
    launch = LaunchSettings(
        model=ns.model,
        served_model_name=ns.served_model_name,
        host=ns.host,
        port=ns.port,
        extra_args=extra,
        sidecar_dir=f"/tmp/specpilot-{ns.port}",
    )
    if ns.emulate:
        program = [
            sys.executable,
            "-m",
            "specpilot.operator.app.cli",
            "emulate",
            "--engine",
            ns.engine,
            "--gpu",
            ns.gpu,
            "--model-profile",
            ns.model_profile,
            "--load-delay",
            "1",
            "--task",
            ns.task,
        ]
    else:
        program = get_adapter(ns.engine).program(ns.python)
    priors = prior_curves(candidates, ns.task)
    slo = ns.slo_tpot_p95_ms / 1e3 if ns.slo_tpot_p95_ms else None
    cost = _step_cost(ns)
    settings = TunerSettings(
        candidates=candidates,
        min_dwell_s=ns.min_dwell,
        restart_budget_per_hour=ns.restart_budget,
        restart_downtime_s=ns.restart_downtime,
        objective=ns.objective,
        slo_tpot_p95_s=slo,
        max_batch=max_batch_from_args(get_adapter(ns.engine), extra) or DEFAULT_MAX_BATCH,
        # a catalog GPU's KV capacity is known; a measured fit (e.g. a CPU) says nothing of it
        kv_capacity_tokens=cost.kv_capacity_tokens() if ns.step_time_fit is None else None,
    )
    engine = LocalEngine(engine=ns.engine, program=program, launch=launch)
    loop = ControlLoop(
        actuator=engine,
        settings=settings,
        cost=cost,
        state=TunerState.initial(initial, time.time(), priors),
        window_s=ns.window,
        on_tick=_print_tick,
    )
    try:
        loop.start()
        tick = 0
        while ns.ticks == 0 or tick < ns.ticks:
            loop.tick(time.time())
            tick += 1
    finally:
        engine.stop()
    return 0


def _step_cost(ns: argparse.Namespace) -> StepCost:
    if ns.step_time_fit is None:
        return StepCost.for_hardware(ns.gpu, ns.model_profile)
    path = Path(ns.step_time_fit)
    allowed = (
        "a JSON object with fixed_s, per_token_s, per_kv_token_s (`probe --json FILE`), "
        "optionally per_extra_token_s"
    )
    try:
        body = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError("--step-time-fit", str(path), "a readable file", str(exc)) from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError("--step-time-fit", str(path), allowed, str(exc)) from None
    if not isinstance(body, dict):
        raise ConfigError("--step-time-fit", str(path), allowed, "not a JSON object")
    try:
        model = StepTimeModel.from_fit_json(body, source=f"fit {path}")
    except ConfigError as exc:  # named by the flag and the file the user gave
        raise ConfigError("--step-time-fit", str(path), allowed, str(exc)) from None
    coefficients = (
        model.fixed_s,
        model.per_token_s,
        model.per_kv_token_s,
        0.0 if model.per_extra_token_s is None else model.per_extra_token_s,
    )
    if not all(math.isfinite(c) for c in coefficients):
        raise ConfigError("--step-time-fit", str(path), allowed, "a coefficient is not finite")
    return StepCost.from_fit(model, ns.gpu, ns.model_profile)


def _print_tick(record: TickRecord) -> None:
    obs = record.observation
    print(
        json.dumps(
            {
                "t": round(record.now, 1),
                "action": record.decision.action,
                "config": record.decision.config.describe(),
                "regime": record.decision.regime,
                "batch": obs.running_requests,
                "acceptance_length": obs.acceptance_length,
                "tokens_per_s": obs.generation_tokens_per_s,
                "applied": record.applied,
                "error": record.error,
                "reason": record.decision.reason,
            }
        ),
        flush=True,
    )
