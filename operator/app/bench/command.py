"""`specpilot bench`: every policy, in hidden worlds, on one traffic, scored as users feel it.

Contract: `specpilot bench --trace FILE [--worlds N --world-seed S] [--replicas N --rollout R]
[--peak-load F | --time-scale F] [--poisson A:B:N] --json OUT` runs the matrix worlds x
traffics x policies in fast mode on `--workers` processes and writes one JSON report: per
world and policy the serving metrics (runtime/serving_metrics.py) and per-window figures, and a
top-level `summary` (one entry per policy, medians over worlds; operator/app/bench/report.py).
Policies: `no-spec`, `static:<config>`, the engine's baseline (`vllm-eagle3-table` or
`sglang-adaptive`), `tuned-schedule`, `hindsight` (a reference) and `specpilot` (the operator's
control loop and tuner, told nothing of the world; it starts from `--initial`, a static
policy's name, speculation off by default). The report records the commit, the exact
command, the seeds and the wall time. A bad argument or trace is one `error:` line (the CLI's
ConfigError handling), never a traceback.

Traffic: a rate curve (`t,rps,<task>...`) or a per-request trace (Azure, Mooncake;
`--task-mix` sets the tasks, which no trace carries). `--peak-load F` amplifies (or thins) the
requests, keeping the trace's clock, so the busiest minute offers F x the no-speculation
capacity of the deployment (measured here on the
nominal world with the traffic's own request shapes, times the replicas); `--poisson A:B:N`
replaces the trace by N Poisson runs at fractions A..B of that capacity, and adds each
policy's capacity at 90% standard-tier attainment (DistServe's goodput).
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import shlex
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

from specpilot.operator.app.bench.policies import (
    ABLATIONS,
    HANDOVER,
    NO_SPEC,
    SPECPILOT,
    TUNED,
    VARIANTS,
    StaticPolicy,
    baselines,
    space_for,
)
from specpilot.operator.app.bench.report import markdown, summary, world_report
from specpilot.operator.app.bench.run import PolicyRun, Setup, Tuning, run_policy
from specpilot.operator.app.bench.traffic import (
    RequestTemplate,
    no_spec_capacity_rps,
    requests_from_rates,
    requests_from_trace,
)
from specpilot.operator.app.cli_conventions import STDOUT, add_json_option, progress, write_json
from specpilot.runtime.emulator.deployment import ROLLOUTS
from specpilot.runtime.emulator.fast_sweep import TASK_SHAPES
from specpilot.runtime.emulator.world import draw_world
from specpilot.runtime.load_shaping import (
    MAX_REQUESTS,
    RequestShape,
    TaskShapes,
    TraceShapes,
    amplify_to_peak_load,
    parse_poisson_sweep,
    poisson_requests,
    time_scale,
)
from specpilot.runtime.request_traces import RequestTrace, load_any_trace, parse_task_mix
from specpilot.runtime.traces import Trace
from specpilot.tuner import GPUS, PROFILES, ConfigError, SpecConfig, StepCost

POISSON_DURATION_S = 900.0
"""Each Poisson rate runs this long: long enough that a tuner's first windows, its minimum dwell
and one restart are a small part of the run, as they are of a real deployment's steady load."""
ATTAINMENT_TARGET = 0.9


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "bench",
        help="every policy in hidden worlds on a trace, scored by latency and SLO attainment",
    )
    p.add_argument("--trace", required=True, help="rate CSV (t,rps,<task>...), Azure CSV or "
                   "Mooncake JSONL")  # fmt: skip
    p.add_argument("--task-mix", default="chat=1", help="tasks for a per-request trace")
    p.add_argument("--gpu", default="H100", choices=sorted(GPUS), help="GPU class")
    p.add_argument(
        "--model-profile", default="llama-3.1-8b", choices=sorted(PROFILES), help="model served"
    )
    p.add_argument("--engine", default="vllm", choices=["vllm", "sglang"], help="dialect")
    p.add_argument("--window", type=float, default=60.0, help="seconds per decision / report")
    p.add_argument("--worlds", type=int, default=1, help="hidden worlds to run")
    p.add_argument("--world-seed", type=int, default=0, help="first world (0 is nominal)")
    p.add_argument("--replicas", type=int, default=1, help="engine replicas behind a balancer")
    p.add_argument("--rollout", default="surge", choices=ROLLOUTS, help="how a switch rolls")
    p.add_argument("--peak-load", type=float, help="busiest minute as a multiple of capacity")
    p.add_argument("--time-scale", type=float, help="compress the trace's time by this factor")
    p.add_argument("--poisson", help="A:B:N Poisson rates as fractions of capacity")
    p.add_argument(
        "--policies",
        help="comma-separated policies to run (default: every baseline and specpilot, and "
        f"with a surge {HANDOVER}: its switches counted without the spare GPU's drain; "
        f"ablations: {', '.join(ABLATIONS)}; variants: {', '.join(VARIANTS)})",
    )
    p.add_argument(
        "--initial",
        default=NO_SPEC,
        help="the static config SpecPilot's deployment starts with, by policy name "
        f"(default {NO_SPEC}: speculation off)",
    )
    p.add_argument("--seed", type=int, default=0, help="traffic and engine seed")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="processes")
    add_json_option(p, "the full report")
    p.set_defaults(run=run)


@dataclass(frozen=True, slots=True)
class Traffic:
    name: str
    requests: tuple[RequestTemplate, ...]
    duration_s: float
    rate_fraction: float | None = None


def run(ns: argparse.Namespace) -> int:
    started = time.monotonic()
    commit = head_commit()  # the code that runs: a commit landing meanwhile is not it
    _check(ns)
    nominal = StepCost.for_hardware(ns.gpu, ns.model_profile)
    loaded = load_any_trace(ns.trace, mix=parse_task_mix(ns.task_mix), seed=ns.seed)
    base = _traffic(loaded, ns.seed)
    if not base.requests:
        raise ConfigError("--trace", ns.trace, "traffic with at least one request", "it has none")
    capacity = no_spec_capacity_rps(nominal, base.requests) * ns.replicas
    traffics = _shaped(ns, loaded, base, capacity)
    policies = _policies(ns.policies, baselines(ns.engine, nominal), ns.rollout)
    tuning = Tuning(initial=_initial(ns.initial, ns.engine))
    worlds = list(range(ns.world_seed, ns.world_seed + ns.worlds))
    setups = [
        Setup(
            gpu=ns.gpu,
            profile=ns.model_profile,
            engine=ns.engine,
            requests=t.requests,
            duration_s=t.duration_s,
            window_s=ns.window,
            replicas=ns.replicas,
            rollout=ns.rollout,
            seed=ns.seed,
            tuning=tuning,
        )
        for t in traffics
    ]
    jobs = [(i, w, p) for i in range(len(setups)) for w in worlds for p in policies]
    runs = _run_all(setups, jobs, ns.workers)
    wall_s = time.monotonic() - started
    report = _report(ns, traffics, setups, worlds, runs, capacity, wall_s, commit)
    if ns.json is not None:
        write_json(ns.json, report, indent=1)
    if ns.json != STDOUT:
        print(markdown(report["summary"]), end="")
    return 0


def _check(ns: argparse.Namespace) -> None:
    for flag, value in (("--worlds", ns.worlds), ("--replicas", ns.replicas)):
        if value < 1:
            raise ConfigError(flag, value, "an integer of 1 or more")
    if ns.workers < 1:
        raise ConfigError("--workers", ns.workers, "an integer of 1 or more")
    if not (math.isfinite(ns.window) and ns.window > 0):
        raise ConfigError("--window", ns.window, "a finite number of seconds > 0")
    if ns.peak_load is not None and ns.time_scale is not None:
        raise ConfigError("--peak-load", ns.peak_load, "either --peak-load or --time-scale")


def _policies(
    chosen: str | None, statics: list[StaticPolicy], rollout: str
) -> list[StaticPolicy | str]:
    every: list[StaticPolicy | str] = [*statics, SPECPILOT, *TUNED]
    if chosen is None:
        # a surge's drain lends SpecPilot a GPU the statics never get: count it both ways
        return [*statics, SPECPILOT, *([HANDOVER] if rollout == "surge" else [])]
    names = {p.name if isinstance(p, StaticPolicy) else p: p for p in every}
    wanted = [n.strip() for n in chosen.split(",") if n.strip()]
    unknown = [n for n in wanted if n not in names]
    if unknown or not wanted:
        raise ConfigError("--policies", chosen, ", ".join(names))
    return [names[n] for n in dict.fromkeys(wanted)]


def _initial(chosen: str, engine: str) -> SpecConfig:
    """The config of the engine's space whose static policy is named `chosen`."""
    space = {
        NO_SPEC if not c.speculative else f"static:{c.describe()}": c for c in space_for(engine)
    }
    if chosen not in space:
        raise ConfigError("--initial", chosen, ", ".join(space))
    return space[chosen]


def _traffic(loaded: RequestTrace | Trace, seed: int) -> Traffic:
    if isinstance(loaded, Trace):
        return Traffic(loaded.name, requests_from_rates(loaded, seed), loaded.duration_s)
    return Traffic(loaded.name, requests_from_trace(loaded), loaded.duration_s)


def _shaped(
    ns: argparse.Namespace, loaded: RequestTrace | Trace, base: Traffic, capacity: float
) -> list[Traffic]:
    if ns.poisson:
        shapes: RequestShape = (
            TraceShapes.of(loaded)
            if isinstance(loaded, RequestTrace)
            else TaskShapes.of(TASK_SHAPES, dict(loaded.rows[0].mix))
        )
        fractions = parse_poisson_sweep(ns.poisson)
        most = MAX_REQUESTS / (capacity * POISSON_DURATION_S)
        if max(fractions) > most:
            allowed = f"fractions of capacity up to {most:.3g}"
            raise ConfigError("--poisson", ns.poisson, allowed, f"{MAX_REQUESTS:,} requests a run")
        return [
            Traffic(
                f"poisson-{fraction:g}",
                _from_poisson(fraction * capacity, shapes, ns.seed),
                POISSON_DURATION_S,
                rate_fraction=fraction,
            )
            for fraction in fractions
        ]
    if ns.peak_load is not None:
        shaped = amplify_to_peak_load(loaded, ns.peak_load, capacity, seed=ns.seed)
    elif ns.time_scale is not None:
        shaped = time_scale(loaded, ns.time_scale)
    else:
        return [base]
    return [replace(_traffic(shaped, ns.seed), name=base.name)]


def _from_poisson(rate: float, shapes: RequestShape, seed: int) -> tuple[RequestTemplate, ...]:
    drawn = poisson_requests(rate, POISSON_DURATION_S, shapes, seed)
    return requests_from_trace(drawn)


def _one(args: tuple[Setup, int, StaticPolicy | str]) -> PolicyRun:
    setup, world, policy = args
    return run_policy(setup, world, policy)


def _run_all(
    setups: list[Setup], jobs: list[tuple[int, int, StaticPolicy | str]], workers: int
) -> dict[tuple[int, int], list[PolicyRun]]:
    out: dict[tuple[int, int], list[PolicyRun]] = {}
    work = [(setups[i], w, p) for i, w, p in jobs]
    with progress("bench", len(work)) as bar:
        if workers == 1:
            results = []
            for item in work:
                results.append(_one(item))
                bar.advance()
        else:
            with ProcessPoolExecutor(max_workers=workers) as pool:
                results = []
                for result in pool.map(_one, work, chunksize=1):
                    results.append(result)
                    bar.advance()
    for (i, w, _), result in zip(jobs, results, strict=True):
        out.setdefault((i, w), []).append(result)
    return out


def _report(
    ns: argparse.Namespace,
    traffics: list[Traffic],
    setups: list[Setup],
    worlds: list[int],
    runs: dict[tuple[int, int], list[PolicyRun]],
    capacity: float,
    wall_s: float,
    commit: str | None,
) -> dict[str, Any]:
    per_traffic: list[dict[str, Any]] = []
    every_world: list[dict[str, Any]] = []
    for i, (traffic, setup) in enumerate(zip(traffics, setups, strict=True)):
        world_reports = []
        for w in worlds:
            policies = world_report(runs[(i, w)], duration_s=setup.duration_s, window_s=ns.window)
            world_reports.append(policies)
            every_world.append(policies)
        per_traffic.append(
            {
                "name": traffic.name,
                "rate_fraction_of_capacity": traffic.rate_fraction,
                "requests": len(traffic.requests),
                "duration_s": traffic.duration_s,
                "summary": summary(world_reports),
                "worlds": [
                    {"world_seed": w, "world": draw_world(w).describe(), "policies": p}
                    for w, p in zip(worlds, world_reports, strict=True)
                ],
            }
        )
    report: dict[str, Any] = {
        "commit": commit,
        "command": shlex.join(["specpilot", *getattr(ns, "argv", sys.argv[1:])]),
        "seeds": {"traffic": ns.seed, "worlds": worlds},
        "wall_s": round(wall_s, 1),
        "setup": {
            "trace": ns.trace,
            "gpu": ns.gpu,
            "model_profile": ns.model_profile,
            "engine": ns.engine,
            "replicas": ns.replicas,
            "rollout": ns.rollout,
            "initial": ns.initial,
            "window_s": ns.window,
            "peak_load": ns.peak_load,
            "time_scale": ns.time_scale,
            "no_spec_capacity_rps": round(capacity, 3),
        },
        "summary": summary(every_world),
        "traffics": per_traffic,
    }
    if ns.poisson:
        report["capacity_at_90pct_attainment"] = _capacity_at_target(per_traffic, capacity)
    return report


def _capacity_at_target(per_traffic: list[dict[str, Any]], capacity: float) -> dict[str, Any]:
    """Per policy, the highest request rate (req/s) whose median standard-tier attainment is at
    least 90%, interpolated linearly between the sweep's rates (DistServe)."""
    names = [e["policy"] for e in per_traffic[0]["summary"]]
    out: dict[str, Any] = {}
    for name in names:
        points = sorted(
            (
                t["rate_fraction_of_capacity"] * capacity,
                next(e for e in t["summary"] if e["policy"] == name)["slo_attainment"]["standard"],
            )
            for t in per_traffic
        )
        best: float | None = None
        for (r0, a0), (r1, a1) in itertools.pairwise(points):
            if a0 >= ATTAINMENT_TARGET:
                best = r0
                if a1 < ATTAINMENT_TARGET:
                    best = r0 + (r1 - r0) * (a0 - ATTAINMENT_TARGET) / (a0 - a1)
                    break
                best = r1
        out[name] = None if best is None else round(best, 3)
    return out


def head_commit() -> str | None:
    """HEAD's hash where the bench runs in a git checkout, else None."""
    try:
        done = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip()
