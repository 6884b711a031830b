"""Hidden worlds: each world's parameters and where EAGLE-3 K=3 stops paying in it.

Run: .venv/bin/python bench/worlds.py [--worlds 20] [--world-seed 0] [--jobs 2]
Writes bench/results/worlds.md and worlds.json: per world (`runtime/emulator/world.py`) its
hidden factors and the crossover, the closed-loop concurrency where EAGLE-3 K=3's throughput
over no speculation drops below 1 on H100 x Llama-3.1-8B, chat (fast mode, fixed seeds).

The crossover is read off a grid of concurrencies (CONCURRENCIES), interpolated in log
concurrency between the last point that pays and the first that does not. The engine admits up
to 1024 sequences (vLLM's default of 256 would cap the batch, and with it the crossover); the
grid stops at 512 because past ~600 concurrent chat requests the H100's KV cache is full and
preemption, not step time, decides the throughput. A world where speculation still pays at 512
is reported as beyond the grid (null in JSON, ">512" in the table).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import shlex
import statistics
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from specpilot.runtime.emulator.fast_sweep import simulate
from specpilot.runtime.emulator.world import World, draw_world
from specpilot.tuner import SpecConfig

RESULTS = Path(__file__).resolve().parent / "results"
GPU, PROFILE, TASK = "H100", "llama-3.1-8b", "chat"
EAGLE3_K3 = SpecConfig(method="eagle3", num_speculative_tokens=3, draft_model="draft")
CONCURRENCIES = (16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
DURATION_S, WARMUP_S, SIM_SEED, MAX_NUM_SEQS = 60.0, 10.0, 11, 1024


def speedup(world: World, concurrency: int) -> float:
    """EAGLE-3 K=3 over no speculation in `world` (same requests for both: one seed)."""
    common: dict[str, Any] = {
        "performance": world.step_cost(GPU, PROFILE),
        "acceptance": world.acceptance_curve,
        "task": TASK,
        "concurrency": concurrency,
        "duration_s": DURATION_S,
        "warmup_s": WARMUP_S,
        "seed": SIM_SEED,
        "max_num_seqs": MAX_NUM_SEQS,
    }
    spec = simulate(config=EAGLE3_K3, **common).tokens_per_s
    return spec / simulate(config=SpecConfig(), **common).tokens_per_s


def measure(seed: int) -> dict[str, Any]:
    """One world: its hidden parameters, the speedup per concurrency up to the first that
    does not pay (and at the grid's end), and the interpolated crossover (None: still pays at
    the grid's end)."""
    world = draw_world(seed)
    curve: list[tuple[int, float]] = []
    crossover: float | None = None
    for concurrency in CONCURRENCIES:
        value = speedup(world, concurrency)
        curve.append((concurrency, value))
        if value < 1.0:
            crossover = float(concurrency)
            if len(curve) > 1:
                (low_c, low_s), (high_c, high_s) = curve[-2], curve[-1]
                share = (low_s - 1.0) / (low_s - high_s)
                crossover = math.exp(math.log(low_c) + share * (math.log(high_c) - math.log(low_c)))
            break
    if curve[-1][0] != CONCURRENCIES[-1]:  # how much it loses at the grid's end, too
        curve.append((CONCURRENCIES[-1], speedup(world, CONCURRENCIES[-1])))
    return {
        "world_seed": seed,
        "crossover": None if crossover is None else round(crossover, 1),
        "below_grid": bool(curve) and curve[0][1] < 1.0,
        "speedup": [{"concurrency": c, "speedup": round(s, 4)} for c, s in curve],
        "eagle3_chat_length_k3": round(
            world.acceptance_curve("eagle3", TASK).expected_length(3), 4
        ),
        "world": world.describe(),
    }


def _cell(crossover: float | None) -> str:
    return f">{CONCURRENCIES[-1]}" if crossover is None else f"{crossover:.0f}"


def _speedup_cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    values = sorted(math.inf if r["crossover"] is None else r["crossover"] for r in rows)
    median = statistics.median(values)
    return {
        "min": values[0],
        "median": None if math.isinf(median) else round(median, 1),
        "max": None if math.isinf(values[-1]) else values[-1],
        "beyond_grid": sum(math.isinf(v) for v in values),
        "nominal": next((r["crossover"] for r in rows if r["world_seed"] == 0), None),
    }


def markdown(report: dict[str, Any]) -> str:
    s = report["summary"]
    lines = [
        "# Hidden worlds and the EAGLE-3 crossover",
        "",
        f"Produced by `{report['command']}` at commit `{report['commit']}`"
        f"{' (with uncommitted changes)' if report['uncommitted_changes'] else ''} "
        f"(world seeds {report['world_seeds'][0]}..{report['world_seeds'][-1]}, "
        f"{report['wall_s']} s on {report['machine']}).",
        "",
        f"Crossover: the closed-loop concurrency where EAGLE-3 K=3 stops paying (speedup over "
        f"no speculation below 1), {GPU} x {PROFILE}, {TASK}, fast mode ({DURATION_S:.0f} s, "
        f"{WARMUP_S:.0f} s warm-up, seed {SIM_SEED}, max_num_seqs {MAX_NUM_SEQS}), interpolated "
        f"in log concurrency on {', '.join(map(str, CONCURRENCIES))}.",
        "",
        f"Over these worlds: min {_cell(s['min'])}, median {_cell(s['median'])}, max "
        f"{_cell(s['max'])} ({s['beyond_grid']} beyond the grid); nominal world "
        f"{_cell(s['nominal'])}.",
        "",
        "Factors multiply the nominal (priors and catalog); ranges and reasons are in "
        "`runtime/emulator/world.py`. `eagle3 chat` is the acceptance factor (on accepted "
        "tokens at K=3) and the resulting length at K=3 (prior 2.79).",
        "",
        "| world | crossover | compute | bandwidth | step overhead | spec path | drafter "
        f"| start time | eagle3 chat | speedup c=64 | speedup c={CONCURRENCIES[-1]} |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in report["worlds"]:
        w = row["world"]
        factor = w["acceptance"].get("eagle3", {}).get(TASK, {}).get("factor", 1.0)
        at = {p["concurrency"]: p["speedup"] for p in row["speedup"]}
        lines.append(
            f"| {row['world_seed']} | {_cell(row['crossover'])} | {w['compute_efficiency']:.3f} "
            f"| {w['bandwidth']:.3f} | {w['step_overhead']:.3f} | {w['spec_path_overhead']:.3f} "
            f"| {w['drafter_cost']:.3f} | {w['start_time']:.3f} "
            f"| x{factor:.3f} -> {row['eagle3_chat_length_k3']:.2f} "
            f"| {_speedup_cell(at.get(64))} | {_speedup_cell(at.get(CONCURRENCIES[-1]))} |"
        )
    return "\n".join(lines) + "\n"


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(
            ["git", *args],
            capture_output=True,
            text=True,
            check=True,
            cwd=Path(__file__).resolve().parent,
        )
    except (OSError, subprocess.CalledProcessError):
        return None
    return out.stdout.strip()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worlds", type=int, default=20, help="how many worlds")
    parser.add_argument("--world-seed", type=int, default=0, help="first world seed")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for the results")
    ns = parser.parse_args(argv)
    seeds = list(range(ns.world_seed, ns.world_seed + ns.worlds))
    started = time.perf_counter()
    with ProcessPoolExecutor(max_workers=max(ns.jobs, 1)) as pool:
        rows = list(pool.map(measure, seeds))
    report = {
        "what": "hidden worlds: parameters and the EAGLE-3 K=3 crossover per world",
        "commit": _git("rev-parse", "HEAD") or "unknown",
        "uncommitted_changes": bool(_git("--no-optional-locks", "status", "--porcelain")),
        "command": shlex.join(
            [".venv/bin/python", "bench/worlds.py", *(sys.argv[1:] if argv is None else argv)]
        ),
        "world_seeds": seeds,
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "wall_s": round(time.perf_counter() - started, 1),
        "setup": {
            "gpu": GPU,
            "model_profile": PROFILE,
            "task": TASK,
            "config": EAGLE3_K3.to_dict(),
            "concurrencies": list(CONCURRENCIES),
            "duration_s": DURATION_S,
            "warmup_s": WARMUP_S,
            "sim_seed": SIM_SEED,
            "max_num_seqs": MAX_NUM_SEQS,
        },
        "summary": summary(rows),
        "worlds": rows,
    }
    ns.out.mkdir(parents=True, exist_ok=True)
    (ns.out / "worlds.json").write_text(json.dumps(report, indent=2) + "\n")
    (ns.out / "worlds.md").write_text(markdown(report))
    print(markdown(report))


if __name__ == "__main__":
    main()
