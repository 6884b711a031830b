"""The demo's two rows of SpecPilot: one emulator driven two ways, or two runs of the tuner?

Run: .venv/bin/python bench/demo_drivers.py [--seed S] [--skip-real-time]
`specpilot demo` sets SpecPilot's real-time run (the emulator as a process, requests over HTTP,
the tuner reading /metrics) beside fast-mode runs of the same requests (`EngineCore.advance` in
simulated time), and the two SpecPilot rows can differ by a quarter. This asks which part
differs, on the demo's own day, seed and defaults:
1. The drivers: each static config in `STATICS` served in real time (the demo's emulator
   process, its load generator, no switch) and in fast mode. If the physics agree, the mean
   E2E latencies agree.
2. The timing: fast mode driven through fixed switch schedules (`bench.run.run_schedule`):
   EAGLE-3 K=5 (where the tuner goes in the quiet start) and off at each time of `OFF_AT_S`, with
   the demo's surge rollout (the old engine finishes its queue, up to the local engine's drain,
   beside the new one) and with a restart (the engine stops first). The mean E2E against the
   switch time shows what a decision's timing alone is worth.
Writes bench/results/demo_drivers.json (commit, command, seed) and demo_drivers.md: 370.8 s
at ff3a4b6, nearly all of it the two real-time runs of 180 s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from specpilot.operator.app.bench.policies import StaticPolicy, space_for
from specpilot.operator.app.bench.run import PolicyRun, Setup, run_policy, run_schedule
from specpilot.operator.app.demo import command as demo
from specpilot.operator.app.demo.actuator import LatencyHistogram
from specpilot.operator.app.demo.load import LoadGenerator, plan_requests
from specpilot.operator.app.demo.report import NOMINAL_WORLD, fast_row, realtime_row
from specpilot.runtime.engines import LaunchSettings
from specpilot.runtime.local_engine import LocalEngine
from specpilot.runtime.traces import Trace, parse_trace
from specpilot.tuner import SpecConfig

BENCH = str(Path(__file__).resolve().parent)
if BENCH not in sys.path:  # imported by path (the tests): the shared harness lives beside it
    sys.path.insert(0, BENCH)

from real_engine import git_commit  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
OUT = RESULTS / "demo_drivers"
STATICS = ("no speculation", "eagle3 K=3")
ENTERED = "eagle3 K=5"
"""Where the tuner goes in the demo's quiet start (its first decision, both drivers)."""
OFF_AT_S = (20.0, 25.0, 30.0, 35.0, 40.0, 45.0, 50.0, 55.0, 60.0, 70.0, 80.0)
BY_ARRIVAL_S = 20.0
"""Width of the per-arrival-time buckets of the latency profile."""


def config_named(name: str) -> SpecConfig:
    found = [c for c in (SpecConfig(), *space_for("vllm")) if c.describe() == name]
    if not found:
        raise SystemExit(f"no config named {name!r} in the vLLM bench space")
    return found[0]


def demo_args(seed: int, rollout: str) -> argparse.Namespace:
    """The demo's own defaults, as `specpilot demo --seed S --rollout R` parses them."""
    parser = argparse.ArgumentParser()
    demo.add_parser(parser.add_subparsers())
    return parser.parse_args(["demo", "--seed", str(seed), "--rollout", rollout])


def demo_trace(ns: argparse.Namespace) -> Trace:
    return demo.stretch(parse_trace(demo.DEMO_DAY, "demo-day"), ns.duration)


def local_engine(ns: argparse.Namespace) -> LocalEngine:
    port, surge_port = demo.free_ports(2)
    return LocalEngine(
        engine="vllm",
        program=demo.emulator_program(ns),
        launch=LaunchSettings(
            model="/models/llama-3.1-8b",
            served_model_name=demo.SERVED,
            host="127.0.0.1",
            port=port,
            sidecar_dir=tempfile.mkdtemp(prefix="specpilot-drivers-"),
        ),
        start_timeout_s=60,
        surge_port=surge_port if ns.rollout == "surge" else None,
    )


def fast_setup(ns: argparse.Namespace) -> Setup:
    return demo.fast_mode_setup(ns, demo_trace(ns), local_engine(ns))


def by_arrival(pairs: Sequence[tuple[float, float]]) -> list[float]:
    """Mean wait (ms) of the requests arriving in each `BY_ARRIVAL_S` bucket."""
    buckets: dict[int, list[float]] = {}
    for arrival_s, wait_s in pairs:
        buckets.setdefault(int(arrival_s // BY_ARRIVAL_S), []).append(wait_s)
    return [round(1e3 * sum(v) / len(v), 1) for _, v in sorted(buckets.items())]


def fast_profile(run: PolicyRun, end_s: float) -> list[float]:
    return by_arrival(
        [
            (r.arrival_s, (r.finished_s if r.finished_s is not None else end_s) - r.arrival_s)
            for r in run.records
        ]
    )


def real_time(ns: argparse.Namespace, config: SpecConfig) -> dict[str, Any]:
    """`config` served by the demo's emulator process for the demo's day, no switch."""
    trace = demo_trace(ns)
    engine = local_engine(ns)
    planned = plan_requests(trace, ns.seed)
    generator = LoadGenerator(url=lambda: engine.url, model=demo.SERVED)
    try:
        engine.apply(config)
        stats = asyncio.run(generator.run(planned, time.monotonic(), trace.duration_s))
    finally:
        engine.stop()
    row = realtime_row(stats, planned, LatencyHistogram(), [], trace.duration_s)
    end_s = trace.duration_s
    answered = {c.arrival_s: min(c.finished_s, end_s) for c in stats.completed}
    pairs = [
        (r.arrival_s, answered.get(r.arrival_s, end_s) - r.arrival_s)
        for r in planned
        if r.arrival_s < end_s
    ]
    return {
        "e2el_ms_mean": row["e2el_ms_mean"],
        "completed": row["completed"],
        "requests": row["requests"],
        "http_errors": stats.errors,
        "by_arrival_ms": by_arrival(pairs),
        "host_load_avg_1m_end": round(os.getloadavg()[0], 2),
    }


def drivers(seed: int, with_real_time: bool) -> list[dict[str, Any]]:
    # one engine, no switch: the rollout does not matter; restart keeps the engine on one port
    ns = demo_args(seed, "restart")
    setup = fast_setup(ns)
    rows = []
    for name in STATICS:
        config = config_named(name)
        run = run_policy(setup, NOMINAL_WORLD, StaticPolicy(name, config))
        row: dict[str, Any] = {
            "config": name,
            "fast": {
                "e2el_ms_mean": fast_row(run, setup)["e2el_ms_mean"],
                "by_arrival_ms": fast_profile(run, setup.duration_s),
            },
        }
        if with_real_time:
            row["real_time"] = real_time(ns, config)
            row["real_time_over_fast"] = round(
                row["real_time"]["e2el_ms_mean"] / row["fast"]["e2el_ms_mean"], 4
            )
        rows.append(row)
    return rows


ROLLOUTS = (("surge", False), ("surge", True), ("restart", False))
"""(rollout, surge_handover): the demo's two rollouts, and the surge without its drain."""


def timings(seed: int) -> list[dict[str, Any]]:
    entered, off = config_named(ENTERED), SpecConfig()
    schedules: list[tuple[str, list[tuple[float, SpecConfig]]]] = [
        ("no speculation throughout", [(0.0, off)]),
        (f"{ENTERED} throughout", [(0.0, entered)]),
    ]
    schedules += [(f"{ENTERED}, off at {t:.0f} s", [(0.0, entered), (t, off)]) for t in OFF_AT_S]
    rows = []
    for rollout, handover in ROLLOUTS:
        setup = fast_setup(demo_args(seed, rollout))
        for name, schedule in schedules:
            run = run_schedule(setup, NOMINAL_WORLD, name, schedule, surge_handover=handover)
            rows.append(
                {
                    "rollout": rollout + (" (handover)" if handover else ""),
                    "schedule": name,
                    "off_at_s": schedule[1][0] if len(schedule) > 1 else None,
                    "drain_s": setup.drain_s,
                    "e2el_ms_mean": fast_row(run, setup)["e2el_ms_mean"],
                    "by_arrival_ms": fast_profile(run, setup.duration_s),
                }
            )
    return rows


def markdown(report: dict[str, Any]) -> str:
    lines = [
        "# The demo's two drivers, and what a switch's timing is worth\n",
        f"Command: `{report['command']}`  ",
        f"Commit: `{report['commit']}`; seed {report['seed']} (arrivals, acceptance draws); "
        f"wall {report['wall_s']} s; {report['host_cpus']} CPUs.\n",
        "The demo's day (`specpilot demo`'s defaults: 180 s, H100 x llama-3.1-8b, vLLM "
        "dialect, nominal world). Mean E2E latency in ms; a request unfinished at the end "
        f"counts with its wait until then. Profiles: mean wait per {BY_ARRIVAL_S:.0f} s of "
        "arrival time.\n",
        "## 1. One config, two drivers\n",
        "| config | fast mode | real time | real time / fast | real-time profile | "
        "fast-mode profile |",
        "|---|---|---|---|---|---|",
    ]
    for row in report["drivers"]:
        real = row.get("real_time")
        lines.append(
            f"| {row['config']} | {row['fast']['e2el_ms_mean']:.1f} | "
            f"{real['e2el_ms_mean'] if real else 'not run'} | "
            f"{row.get('real_time_over_fast', '')} | "
            f"{real['by_arrival_ms'] if real else ''} | {row['fast']['by_arrival_ms']} |"
        )
    lines += [
        "",
        f"## 2. Fast mode through fixed schedules: {ENTERED}, then speculation off\n",
        "| rollout | schedule | mean E2E ms | profile |",
        "|---|---|---|---|",
    ]
    for row in report["timings"]:
        lines.append(
            f"| {row['rollout']}, drain {row['drain_s']:.0f} s | {row['schedule']} | "
            f"{row['e2el_ms_mean']:.1f} | {row['by_arrival_ms']} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--skip-real-time", action="store_true", help="fast mode only (seconds, not minutes)"
    )
    parser.add_argument("--out", default=str(OUT), help="path without extension")
    ns = parser.parse_args(argv)
    began = time.monotonic()
    report: dict[str, Any] = {
        "command": shlex.join(
            [".venv/bin/python", "bench/demo_drivers.py", *(argv or sys.argv[1:])]
        ),
        "commit": git_commit(),
        "seed": ns.seed,
        "host_cpus": os.cpu_count(),
        "drivers": drivers(ns.seed, not ns.skip_real_time),
        "timings": timings(ns.seed),
    }
    report["wall_s"] = round(time.monotonic() - began, 1)
    out = Path(ns.out)
    out.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    out.with_suffix(".md").write_text(markdown(report), encoding="utf-8")
    print(markdown(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
