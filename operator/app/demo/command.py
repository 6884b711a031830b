"""`specpilot demo` (and `make demo`): the whole loop on a laptop, in a few minutes.

Contract: runs the emulator (H100 x Llama-3.1-8B, vLLM dialect, default) in real time as a
process behind the local actuator, the full `ControlLoop` with the tuner from speculation off,
and a load generator that replays a compressed day (quiet -> busy past saturation -> chat ->
code -> RAG -> quiet; or `--trace FILE`, stretched to `--duration`) as real HTTP requests. A live
view shows every tick. Meanwhile (at the lowest CPU priority) the same requests run in fast
mode through the bench's `run_policy` on the nominal world with the demo's timings: every static
config, vLLM's EAGLE-3 table and SpecPilot through the same `ControlLoop` (demo/report.py). At
the end it writes `summary.md`, `summary.json` and `plot.png` to `--out`, and prints the
summary. The engine process is stopped on every exit path (SIGTERM included).

Rollout (`--rollout`): `surge` (the default, as a SpecDeployment's: maxSurge 1, maxUnavailable
0, a spare GPU) starts the new config's emulator beside the serving one and moves the load
generator to it once it is healthy; the old one finishes what it holds and stops
(`LocalEngine.surge_port`). `restart` stops the engine, dropping its requests in flight (the
load generator sends them again), and starts the new one: one GPU, no spare. Fast mode rolls
the same way: a local process has no preStop sleep, and a restart drops what it holds.

Timing: the traffic is compressed (a day's shape in ~3 minutes), and so is the tuner's timing:
production-like defaults (10 s windows, 300 s minimum dwell, 60 s restarts, 900 s expected
dwell) become 5 s, 15 s, ~3 s and 45 s here. The physics (step times, acceptance) is not
compressed. The restart budget counts per hour, longer than the demo: it caps the whole run.
The real-time loop and the fast-mode SpecPilot are built by the same `control_loop(setup, ...)`
(operator/app/bench/run.py), so they run the same settings (the operator's goodput rollback
included); the fast-mode engine starts in the nominal restart time (load delay + ~1 s).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import multiprocessing
import os
import signal
import socket
import sys
import tempfile
import time
from pathlib import Path
from types import FrameType
from typing import Any

from specpilot.operator.app.bench.run import Setup, Tuning, control_loop
from specpilot.operator.app.bench.traffic import requests_from_rates
from specpilot.operator.app.cli_conventions import check_count, check_seconds
from specpilot.operator.app.demo.actuator import RecordingActuator, Switch
from specpilot.operator.app.demo.live_view import Frame, LiveView
from specpilot.operator.app.demo.load import LoadGenerator, plan_requests
from specpilot.operator.app.demo.plot import plot_run
from specpilot.operator.app.demo.report import (
    build_summary,
    fast_mode_results,
    realtime_row,
    summary_markdown,
)
from specpilot.operator.loop import ControlLoop, TickRecord
from specpilot.runtime.emulator.core import Request
from specpilot.runtime.engines import LaunchSettings
from specpilot.runtime.local_engine import LocalEngine
from specpilot.runtime.traces import Trace, TraceRow, load_trace, parse_trace
from specpilot.tuner import ConfigError, SpecConfig, get_gpu, get_profile

# A day's shape in 180 s: night, morning ramp, a busy peak past saturation (~50 req/s of chat
# saturates the emulated H100 with this model), then a moderate afternoon whose task mix moves
# chat -> code -> RAG (summarize: long prompts), and a quiet evening. The peak is also what two
# shared CPU cores sustain for the load generator and the emulator together (measured).
DEMO_DAY = """t,rps,chat,code,summarize
0,2,1,0,0
20,12,1,0,0
30,30,0.8,0.1,0.1
40,50,0.8,0.1,0.1
70,25,0.8,0.1,0.1
80,8,1,0,0
105,8,0.1,0.9,0
130,6,0.1,0,0.9
155,2,1,0,0
180,0,1,0,0
"""
SERVED = "llama"
DEMO_ROLLOUTS = ("surge", "restart")
"""The local actuator's two ways to switch (`LocalEngine`): beside the serving engine, or in
its place. One-at-a-time needs replicas; the demo runs one engine."""


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("demo", help="the emulator, the tuner and a compressed day, live")
    parser.add_argument("--duration", type=float, default=180.0, help="trace seconds (real time)")
    parser.add_argument("--trace", help="CSV t,rps,<task>,... (default: the built-in day)")
    parser.add_argument("--out", default="demo-output", help="folder for summary and plot")
    parser.add_argument("--window", type=float, default=5.0, help="seconds per tick")
    parser.add_argument(
        "--min-dwell", type=float, default=15.0, help="seconds a config runs before a switch"
    )
    parser.add_argument("--restart-budget", type=int, default=6, help="restarts in the run")
    parser.add_argument("--load-delay", type=float, default=2.0, help="emulated model load, s")
    parser.add_argument("--slo-tpot-ms", type=float, default=50.0, help="TPOT p95 target, ms")
    parser.add_argument("--seed", type=int, default=0, help="arrivals and acceptance draws")
    parser.add_argument("--gpu", default="H100", help="GPU class emulated and priced")
    parser.add_argument("--model-profile", default="llama-3.1-8b", help="model emulated")
    parser.add_argument(
        "--rollout",
        default="surge",
        choices=DEMO_ROLLOUTS,
        help="surge: the new engine starts beside the serving one (a spare GPU); restart: "
        "the engine stops, then the new one starts",
    )
    parser.set_defaults(run=run)


def stretch(trace: Trace, duration_s: float) -> Trace:
    """The same shape over `duration_s` seconds; rates are kept (they are physics)."""
    if not (math.isfinite(duration_s) and duration_s > 0):
        raise ConfigError("--duration", duration_s, "a positive number of seconds")
    scale = duration_s / trace.duration_s
    return Trace(trace.name, tuple(TraceRow(r.t * scale, r.rps, r.mix) for r in trace.rows))


def phase_of(row: TraceRow) -> str:
    load = "quiet" if row.rps < 5 else "moderate" if row.rps < 20 else "busy"
    task, share = max(row.mix, key=lambda item: item[1])
    label = "RAG" if task == "summarize" else task
    return f"{load}, {label}" if share >= 0.75 else f"{load}, mixed"


def free_ports(count: int) -> list[int]:
    """`count` distinct ports free now (each socket held until all are picked)."""
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket())
            sock.bind(("127.0.0.1", 0))
            ports.append(int(sock.getsockname()[1]))
        return ports


def fast_mode_setup(ns: argparse.Namespace, trace: Trace, engine: LocalEngine) -> Setup:
    """The real-time run's requests, timings and switches, for the fast-mode runs: the same
    sequence the load generator sends (`plan_requests` draws it), and stopped engines that roll
    as the local engine's processes do (no preStop sleep; a restart drops what it holds, a
    surge's old engine finishes it within `LocalEngine.drain_s`)."""
    return Setup(
        gpu=ns.gpu,
        profile=ns.model_profile,
        engine="vllm",
        requests=requests_from_rates(trace, ns.seed),
        duration_s=trace.duration_s,
        window_s=ns.window,
        replicas=1,
        rollout=ns.rollout,
        seed=ns.seed,
        tuning=Tuning(
            start_s=ns.load_delay + 1.0,  # the load delay plus ~1 s of process start
            min_dwell_s=ns.min_dwell,
            restart_budget_per_hour=ns.restart_budget,
            expected_dwell_s=3 * ns.min_dwell,
            slo_tpot_p95_s=ns.slo_tpot_ms / 1e3,
        ),
        pre_stop_s=0.0,
        drain_s=engine.drain_s if engine.surge_port is not None else 0.0,
    )


def emulator_program(ns: argparse.Namespace) -> list[str]:
    """The emulator's command line before the engine arguments the adapter renders."""
    return [
        sys.executable, "-m", "specpilot.operator.app.cli", "emulate", "--engine", "vllm",
        "--gpu", ns.gpu, "--model-profile", ns.model_profile,
        "--load-delay", str(ns.load_delay), "--seed", str(ns.seed),
    ]  # fmt: skip


def _tick_dict(record: TickRecord, trace: Trace, config: SpecConfig) -> dict[str, Any]:
    obs = record.observation
    row = trace.row_at(record.now)
    return {
        "t": round(record.now, 2),
        "phase": phase_of(row),
        "offered_rps": row.rps,
        "action": record.decision.action,
        "config": config.describe(),
        "regime": record.decision.regime,
        "batch": obs.running_requests and round(obs.running_requests, 2),
        "waiting": obs.waiting_requests and round(obs.waiting_requests, 2),
        "acceptance_length": obs.acceptance_length and round(obs.acceptance_length, 3),
        "tokens_per_s": obs.generation_tokens_per_s and round(obs.generation_tokens_per_s, 1),
        "predicted_gain": round(record.decision.predicted_gain, 4),
        "applied": record.applied,
        "rolled_back": record.rolled_back,
        "error": record.error,
        "reason": record.decision.reason,
    }


def _raise_exit(signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)  # unwinds through the finally that stops the engine


def _check(ns: argparse.Namespace) -> None:
    """What no demo could use, refused before the emulator starts (one error line each)."""
    check_seconds("--window", ns.window)
    check_seconds("--min-dwell", ns.min_dwell, zero=True)
    check_seconds("--load-delay", ns.load_delay, zero=True)
    check_count("--restart-budget", ns.restart_budget)
    if not (math.isfinite(ns.slo_tpot_ms) and ns.slo_tpot_ms > 0):
        allowed = "a finite number of milliseconds above 0"
        raise ConfigError("--slo-tpot-ms", ns.slo_tpot_ms, allowed)
    get_gpu(ns.gpu)
    get_profile(ns.model_profile)
    out = Path(ns.out)
    if out.exists() and not out.is_dir():
        raise ConfigError("--out", ns.out, "a folder (or a path where one can be made)", "a file")


def run(ns: argparse.Namespace) -> int:
    _check(ns)
    trace = load_trace(ns.trace) if ns.trace else parse_trace(DEMO_DAY, "demo-day")
    trace = stretch(trace, ns.duration)
    port, surge_port = free_ports(2)
    engine = LocalEngine(
        engine="vllm",
        program=emulator_program(ns),
        launch=LaunchSettings(
            model="/models/llama-3.1-8b",
            served_model_name=SERVED,
            host="127.0.0.1",
            port=port,
            sidecar_dir=tempfile.mkdtemp(prefix="specpilot-demo-"),
        ),
        start_timeout_s=60,
        surge_port=surge_port if ns.rollout == "surge" else None,
    )
    bench_setup = fast_mode_setup(ns, trace, engine)
    out = Path(ns.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError("--out", ns.out, "a folder that can be made", str(exc)) from None
    view = LiveView()
    origin = [time.monotonic()]  # reset when the trace starts

    def clock() -> float:
        return time.monotonic() - origin[0]

    actuator = RecordingActuator(engine=engine, clock=clock)
    # The fast-mode runs go on in a separate process at the lowest CPU priority while
    # the real-time run goes on: they use the cores the run leaves idle, not its share.
    pool = multiprocessing.get_context("spawn").Pool(1, initializer=os.nice, initargs=(19,))
    baselines = pool.apply_async(fast_mode_results, (bench_setup,))
    previous = signal.signal(signal.SIGTERM, _raise_exit)
    try:
        view.message(f"starting the emulator ({ns.gpu} x {ns.model_profile}, vLLM) ...")
        loop = control_loop(bench_setup, actuator)
        loop.start()
        origin[0] = time.monotonic()  # the trace starts once the first engine serves
        actuator.switches[:] = [Switch(0.0, 0.0, loop.state.current)]
        # a surge moves the engine's port with each switch: the generator reads it per request
        generator = LoadGenerator(url=lambda: engine.url, model=SERVED)
        planned = plan_requests(trace, ns.seed)
        ticks = asyncio.run(_live(loop, generator, planned, trace, view, actuator, origin[0]))
        actuator.close()
        view.close()
        view.message("real-time run done; collecting the fast-mode runs ...")
        fast = baselines.get()
    except KeyboardInterrupt:
        view.message("interrupted")
        return 130
    finally:
        actuator.close()
        pool.terminate()
        signal.signal(signal.SIGTERM, previous)
    tuning = bench_setup.tuning
    setup = {
        "gpu": ns.gpu,
        "model_profile": ns.model_profile,
        "engine": "vllm",
        "trace": trace.name,
        "duration_s": trace.duration_s,
        "seed": ns.seed,
        "slo_tpot_ms": ns.slo_tpot_ms,
        "window_s": ns.window,
        "min_dwell_s": tuning.min_dwell_s,
        "expected_dwell_s": tuning.expected_dwell_s,
        "rollout": ns.rollout,
        "drain_s": bench_setup.drain_s,
        "restart_downtime_s": tuning.start_s,
        "restart_budget": tuning.restart_budget_per_hour,
        "load_delay_s": ns.load_delay,
        # The real-time emulator sleeps through each step: on an oversubscribed host it wakes
        # late and falls behind its physics, so the host's load is part of the result.
        "host_cpus": os.cpu_count(),
        "host_load_avg_1m_end": round(os.getloadavg()[0], 2),
    }
    realtime = realtime_row(
        generator.stats, planned, actuator.tpot, actuator.switches, trace.duration_s
    )
    summary = build_summary(
        setup=setup,
        fast=fast,
        realtime=realtime,
        ticks=ticks,
        switches=actuator.switches,
        load=generator.stats,
    )
    nospec = next(r for r in fast if r["policy"] == SpecConfig().describe())
    plot_run(
        out / "plot.png",
        trace=trace,
        ticks=ticks,
        switches=actuator.switches,
        reference=("no speculation", nospec["window_goodput_tok_s"], ns.window),
    )
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    markdown = summary_markdown(summary)
    (out / "summary.md").write_text(markdown, encoding="utf-8")
    print(markdown)
    print(f"wrote {out / 'summary.md'}, {out / 'summary.json'}, {out / 'plot.png'}")
    return 0


async def _live(
    loop: ControlLoop,
    generator: LoadGenerator,
    planned: list[Request],
    trace: Trace,
    view: LiveView,
    actuator: RecordingActuator,
    origin: float,
) -> list[dict[str, Any]]:
    """Load and ticks side by side until the trace ends; returns every tick as a dict."""
    duration = trace.duration_s

    def clock() -> float:
        return time.monotonic() - origin

    load = asyncio.create_task(generator.run(planned, origin, duration))
    ticks: list[dict[str, Any]] = []
    last: dict[str, Any] = {
        "action": "start",
        "reason": "speculation off until the first window is measured",
        "config": loop.state.current.describe(),
        "regime": "unknown",
    }

    def frame() -> Frame:
        row = trace.row_at(min(clock(), duration))
        stats = generator.stats
        return Frame(
            elapsed_s=min(clock(), duration),
            duration_s=duration,
            phase=phase_of(row),
            offered_rps=row.rps,
            config=loop.state.current.describe(),
            regime=str(last["regime"]),
            acceptance_length=last.get("acceptance_length"),
            batch=last.get("batch"),
            waiting=last.get("waiting"),
            tokens_per_s=last.get("tokens_per_s"),
            last_action=str(last["action"]),
            last_reason=str(last["reason"]),
            restarts=max(0, len(actuator.switches) - 1),
            ticks=len(ticks),
            in_flight=stats.in_flight,
            completed=len(stats.completed),
            resent=stats.resent,
            switching=actuator.restarting,
        )

    async def refresh() -> None:
        while True:
            await asyncio.sleep(1.0)
            view.update(frame(), tick=False)

    refresher = asyncio.create_task(refresh()) if view.tty else None
    view.update(frame())
    try:
        while clock() + loop.window_s <= duration:
            # The decision is taken when the window closes: that is the tick's time.
            record = await asyncio.to_thread(loop.tick, clock() + loop.window_s)
            last = _tick_dict(record, trace, loop.state.current)
            ticks.append(last)
            view.update(frame())
        await load
    finally:
        if refresher is not None:
            refresher.cancel()
        load.cancel()
    view.update(frame(), tick=False)
    return ticks
