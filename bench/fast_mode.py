"""Fast-mode speed: one simulated hour of traffic at 20 requests/s on one core, both ways.

One EngineCore (H100 x llama-3.1-8b) serves Poisson arrivals of chat requests (prompt and output
within +-50% of 512 and 256 tokens), advanced from arrival to arrival the way the fast-mode
driver does it: `core.advance` (event to event, the default) and `advance_stepwise` (the
reference: `core.step` in a loop). The requests are drawn before the clock starts (the trace is
an input); the clock times the engine. Same seed, same requests for both paths; the fast path
is run twice to show that one seed gives one result. Writes bench/results/fast_mode.json with
the commit, the command, the seeds, wall and CPU seconds, and the speed in x real time.

Run: .venv/bin/python bench/fast_mode.py
"""

from __future__ import annotations

import json
import platform
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from specpilot.runtime.emulator.core import EngineCore, Progress, Request
from specpilot.runtime.emulator.fast_sweep import TASK_SHAPES
from specpilot.runtime.emulator.progress import advance_stepwise
from specpilot.tuner import SpecConfig, StepCost
from specpilot.tuner.priors import acceptance_table

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
DURATION_S = 3600.0
RPS = 20.0
GPU, PROFILE = "H100", "llama-3.1-8b"
TRAFFIC_SEED = 1
ENGINE_SEED = 0
CONFIGS = {
    "no-spec": SpecConfig(),
    "eagle3-k3": SpecConfig(method="eagle3", num_speculative_tokens=3, draft_model="d"),
}

Advance = Callable[[EngineCore, float, float], tuple[float, Progress]]
PATHS: dict[str, Advance] = {
    "event-driven": lambda core, now, until: core.advance(now, until),
    "stepwise": advance_stepwise,
}


def arrivals(seed: int) -> list[tuple[float, int, int]]:
    """(arrival s, prompt tokens, output tokens) of one hour of Poisson chat traffic."""
    rng = random.Random(seed)
    prompt, output = TASK_SHAPES["chat"]
    out, t = [], 0.0
    while True:
        t += rng.expovariate(RPS)
        if t >= DURATION_S:
            return out
        shape = (
            max(1, round(prompt * rng.uniform(0.5, 1.5))),
            max(2, round(output * rng.uniform(0.5, 1.5))),
        )
        out.append((t, *shape))


def serve(config: SpecConfig, advance: Advance, trace: list[tuple[float, int, int]]) -> dict:
    requests = [
        Request(request_id=f"r{i}", task="chat", prompt_tokens=p, max_tokens=o, arrival_s=t)
        for i, (t, p, o) in enumerate(trace)
    ]
    core = EngineCore(
        config=config, performance=StepCost.for_hardware(GPU, PROFILE), seed=ENGINE_SEED
    )
    totals = Progress()
    gaps = 0.0
    wall, cpu = time.perf_counter(), time.process_time()
    now = 0.0
    for request in requests:
        if now < request.arrival_s:
            now, progress = advance(core, now, request.arrival_s)
            _add(totals, progress)
            gaps += float(progress.itl_gaps @ progress.itl_weights)
        core.add_request(request)
    while not core.idle:  # drain what is left after the hour
        now, progress = advance(core, now, now + 60.0)
        _add(totals, progress)
        gaps += float(progress.itl_gaps @ progress.itl_weights)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    done = [r for r in requests if r.finished_s is not None and r.first_token_s is not None]
    tpots = [t for r in done if (t := r.time_per_output_token_s) is not None]
    return {
        "wall_s": round(wall, 3),
        "cpu_s": round(cpu, 3),
        "x_real_time_wall": round(DURATION_S / wall),
        "x_real_time_cpu": round(DURATION_S / cpu),
        "completed": len(done),
        "output_tokens": totals.tokens,
        "steps": totals.steps,
        "acceptance_length": totals.acceptance_length,
        "ttft_ms_mean": statistics.fmean(r.first_token_s - r.arrival_s for r in done) * 1e3,  # type: ignore[operator]
        "tpot_ms_mean": statistics.fmean(tpots) * 1e3,
        "e2el_s_mean": statistics.fmean(r.finished_s - r.arrival_s for r in done),  # type: ignore[operator]
        "itl_ms_mean": gaps / max(1, sum(r.max_tokens - 1 for r in done)) * 1e3,
        "mean_decode_batch": totals.batch_time / max(totals.busy_time, 1e-9),
        "preemptions": core.preemptions,
    }


def _add(totals: Progress, progress: Progress) -> None:
    totals.tokens += progress.tokens
    totals.drafts += progress.drafts
    totals.accepted += progress.accepted
    totals.steps += progress.steps
    totals.batch_time += progress.batch_time
    totals.busy_time += progress.busy_time


def _git(*args: str) -> str:
    done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)
    return done.stdout.strip()


def main() -> None:
    acceptance_table()  # built once per process (solving DFlash's p loads scipy): not timed
    trace = arrivals(TRAFFIC_SEED)
    runs = []
    for name, config in CONFIGS.items():
        for path, advance in PATHS.items():
            for repeat in range(2 if path == "event-driven" else 1):
                result = serve(config, advance, trace)
                runs.append({"config": name, "path": path, "repeat": repeat, **result})
                print(json.dumps(runs[-1]), file=sys.stderr)
    speedups = {}
    for name in CONFIGS:
        fast = min(r["wall_s"] for r in runs if r["config"] == name and r["path"] == "event-driven")
        slow = next(r["wall_s"] for r in runs if r["config"] == name and r["path"] == "stepwise")
        speedups[name] = round(slow / fast, 1)
    commit = _git("rev-parse", "HEAD")
    uncommitted = bool(_git("status", "--porcelain", "--untracked-files=no"))
    report = {
        "what": (
            f"1 simulated hour of Poisson chat traffic at {RPS:g} req/s into one EngineCore, "
            f"{GPU} x {PROFILE}, advanced arrival to arrival; requests drawn before the clock"
        ),
        "commit": commit,
        "uncommitted_changes": uncommitted,
        "command": ".venv/bin/python bench/fast_mode.py",
        "seeds": {"traffic": TRAFFIC_SEED, "engine": ENGINE_SEED},
        "simulated_s": DURATION_S,
        "requests": len(trace),
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "python": platform.python_version(),
        "note": (
            "x_real_time = simulated seconds / seconds taken; cpu_s is this process's CPU time "
            "(the machine is shared, so wall time can include waiting for a core)"
        ),
        "runs": runs,
        "speedup_event_driven_over_stepwise_wall": speedups,
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "fast_mode.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
