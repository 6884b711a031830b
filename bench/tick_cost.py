"""What SpecPilot's tick costs its own slot: one real server's tokens/s (vLLM or SGLang) in a
static policy's slot and in a SpecPilot slot, on the same server and config.

Contract: one run starts one real server of `--engine` on ngram `--k` (the `make_engine` of
bench/real_vllm.py or bench/real_sglang.py, the real benches' launch), warms it up, then per
concurrency runs `--rounds` rounds of one slot per arm at `--temperature`, the order
alternating each round so the host's drift lands on both arms alike. Arm "static" is a static
policy's slot (`real_engine.slot`); arm "tick" is a SpecPilot slot (`real_engine.pilot_slot`:
1 s in, the loop observes a window of the slot less 1 s, parsing its scrapes, and decides, in
the clients' process) under the settings the real bench's `--switch shared` gives it. Every
candidate maps to this one server (`SharedServers`), so whatever the tuner decides the load
stays on the same server and config: the ratio is the tick's cost alone. The tuner's step cost
is the H100 catalog's (what it decides does not matter here; that it decides does). Each slot
records its tokens/s and the tick's CPU milliseconds in its thread (`time.thread_time`).

Run: HF_HUB_OFFLINE=1 .venv/bin/python bench/tick_cost.py   (~5 min on 2 cores; a quiet host)
Writes bench/results/tick_cost.json and .md. SGLang (real_sglang.py's servers, its temperature
phases): `--engine sglang --concurrency 8 1 --temperature 0.7 --out
bench/results/tick_cost-sglang-temp0.7.json`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from specpilot.operator.loop import ControlLoop
from specpilot.tuner import SpecConfig, StepCost, TunerSettings, TunerState, acceptance_curve

BENCH = str(Path(__file__).resolve().parent)
if BENCH not in sys.path:
    sys.path.insert(0, BENCH)

import real_sglang  # noqa: E402
import real_vllm  # noqa: E402
from real_engine import (  # noqa: E402
    RESULTS,
    Phase,
    SharedServers,
    TimedEngine,
    arm_rounds,
    pilot_slot,
    probe_head,
    probe_markdown_head,
    slot,
    warm_up,
)

ARMS = ("static", "tick")
LEAD_S = 1.0
"""As the real bench: the loop's window starts 1 s into SpecPilot's slot."""
ENGINES: dict[str, tuple[str, Callable[[int, Path], TimedEngine], dict[str, Any]]] = {
    "vllm": ("vLLM", real_vllm.make_engine, {"max_batch": real_vllm.MAX_NUM_SEQS}),
    # SGLang refuses a per-batch K schedule for NGRAM, as in bench/real_sglang.py
    "sglang": ("SGLang", real_sglang.make_engine, {"synthesize_schedules": False}),
}
"""Engine: (label, its real bench's launch, the tuner settings its real bench overrides)."""


def pilot_loop(
    engine: TimedEngine, config: SpecConfig, window_s: float, engine_overrides: dict[str, Any]
) -> ControlLoop:
    """SpecPilot's loop as the real bench's `--switch shared` runs it, every candidate on
    `engine`."""
    candidates = (
        SpecConfig(),
        *(SpecConfig(method="ngram", num_speculative_tokens=k) for k in (1, 3, 5)),
    )
    overrides = {"synthesize_schedules": False, "warm_switches": True, **engine_overrides}
    settings = TunerSettings(
        candidates=candidates,
        min_dwell_s=20.0,
        restart_budget_per_hour=12,
        restart_downtime_s=0.0,
        objective="throughput",
        **overrides,
    )
    loop = ControlLoop(
        actuator=SharedServers(servers={c: engine for c in candidates}),
        settings=settings,
        cost=StepCost.for_hardware("H100", "llama-3.1-8b"),
        state=TunerState.initial(config, time.time(), {"ngram": acceptance_curve("ngram", "chat")}),
        window_s=window_s,
    )
    loop.start()
    return loop


def run_arm(
    arm: str, engine: TimedEngine, loop: ControlLoop, phase: Phase, seconds: float
) -> dict[str, Any]:
    if arm == "static":
        counts, wall = slot(engine, phase, seconds)
        cpu_ms = None
    else:
        counts, wall, _, _ = pilot_slot(engine, loop, phase, LEAD_S)
        cpu_ms = counts.get("tick_cpu_ms")
    return {
        "tokens_per_s": round(counts["tokens"] / wall, 1),
        "wall_s": round(wall, 2),
        "tick_cpu_ms": cpu_ms,
    }


def summarize(rounds: list[dict[str, dict[str, Any]]]) -> dict[str, Any]:
    ratios = [r["tick"]["tokens_per_s"] / r["static"]["tokens_per_s"] for r in rounds]
    cpu = [r["tick"]["tick_cpu_ms"] for r in rounds if r["tick"]["tick_cpu_ms"] is not None]
    return {
        "ratios_tick_to_static": [round(x, 3) for x in ratios],
        "median_ratio": round(statistics.median(ratios), 3),
        "rounds_below_static": sum(x < 1.0 for x in ratios),
        "median_tick_cpu_ms": statistics.median(cpu) if cpu else None,
        "median_wall_s": {
            arm: round(statistics.median(r[arm]["wall_s"] for r in rounds), 2) for arm in ARMS
        },
    }


def sampled(report: dict[str, Any]) -> str:
    """How the clients sampled, where not greedily."""
    temperature = report.get("temperature", 0.0)
    return f", clients at temperature {temperature:g}" if temperature else ""


def markdown(report: dict[str, Any]) -> str:
    lines = [
        *probe_markdown_head(
            report, f"What SpecPilot's tick costs its slot (real {report.get('engine', 'vLLM')})"
        ),
        f"One server on {report['config']}{sampled(report)}; {report['rounds']} rounds of one "
        f"{report['slot_seconds']:g} s slot per arm, order alternating; ratio = the tick "
        "slot's tokens/s over the static slot's in the same round.",
        "",
        "| concurrency | static tokens/s | tick tokens/s | ratio per round | median ratio "
        "| tick CPU ms (median) | slot wall s static / tick |",
        "|---|---|---|---|---|---|---|",
    ]
    for block in report["concurrencies"]:
        s = block["summary"]
        speeds = {
            arm: ", ".join(f"{r[arm]['tokens_per_s']:.0f}" for r in block["rounds"]) for arm in ARMS
        }
        lines.append(
            f"| {block['concurrency']} | {speeds['static']} | {speeds['tick']} "
            f"| {', '.join(f'{x:.3f}' for x in s['ratios_tick_to_static'])} "
            f"| {s['median_ratio']:.3f} | {s['median_tick_cpu_ms']} "
            f"| {s['median_wall_s']['static']} / {s['median_wall_s']['tick']} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--slot-seconds", type=float, default=11.0)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[32, 1])
    parser.add_argument("--k", type=int, default=5, help="the server's ngram K (0: none)")
    parser.add_argument("--engine", choices=sorted(ENGINES), default="vllm")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--port", type=int, default=8395)
    parser.add_argument("--out", type=Path, default=RESULTS / "tick_cost.json")
    ns = parser.parse_args()
    if (
        ns.rounds < 1
        or ns.slot_seconds < 4.0
        or min(ns.concurrency) < 1
        or ns.k < 0
        or ns.temperature < 0
    ):
        parser.error(
            "--rounds must be >= 1, --slot-seconds >= 4, every --concurrency >= 1, --k >= 0, "
            "--temperature >= 0"
        )
    label, make_engine, engine_overrides = ENGINES[ns.engine]
    config = SpecConfig(method="ngram", num_speculative_tokens=ns.k) if ns.k else SpecConfig()
    started = time.time()
    report: dict[str, Any] = {
        **probe_head("bench/tick_cost.py", started, ns.rounds, ns.slot_seconds),
        **(
            {
                "seeds": f"none drawn by the clients (fixed prompts, temperature "
                f"{ns.temperature:g}); the server samples with "
                + (
                    f"--random-seed {real_sglang.SERVER_SEED}"
                    if ns.engine == "sglang"
                    else "vLLM's default --seed 0"
                )
            }
            if ns.temperature
            else {}
        ),
        "engine": label,
        "config": config.describe(),
        "temperature": ns.temperature,
        **({"kv_cache_gib": real_vllm.KV_CACHE_GIB} if ns.engine == "vllm" else {}),
        "concurrencies": [],
    }
    engine = make_engine(ns.port, Path(tempfile.mkdtemp(prefix="tick-cost-")))
    try:
        engine.apply(config)
        warm_up(engine.url)
        loop = pilot_loop(engine, config, ns.slot_seconds - LEAD_S, engine_overrides)
        arm_rounds(
            ns,
            report,
            started,
            lambda r: ARMS if r % 2 == 0 else ARMS[::-1],
            lambda arm, phase: run_arm(arm, engine, loop, phase, ns.slot_seconds),
            summarize,
            markdown,
            temperature=ns.temperature,
        )
    finally:
        engine.stop()
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
