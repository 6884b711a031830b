"""Does the client's concurrency reach the engine? Real vLLM (CPU build) at concurrency 1 and 32:
the client's tokens/s beside the batch the engine itself ran, per server variant.

Contract: per `--variant` (`mp-auto`: vLLM's CPU default, a worker process whose threads
`VLLM_CPU_OMP_THREADS_BIND=auto` puts on one core, the other reserved for the API server, and an
engine core that busy-waits on the worker; `mp-nobind`: the same, placement left to the OS; `uni`:
bench/real_vllm.py's default `--executor`, the model run inside the engine-core process on one
thread; `uni-ngram5`: the same serving ngram K=5, whose drafter runs on numba, and `-numba2` the
same with numba's default two threads), one run starts one vLLM server with bench/real_vllm.py's
launch, warms it up and runs `--rounds` slots per concurrency of bench/real_engine.py's closed-loop
streamed load. During each slot `LocalEngine.observe` reads one window, as SpecPilot's loop does:
the engine's mean batch from its own inter-token-latency sums (`running_requests`) and the sampled
running gauge. At concurrency 32 a batch far below 32 means the requests wait in front of the
engine (the API server), not in it: a phase at that concurrency then measures the frontend as much
as the engine. The batch/concurrency ratio per slot is the result; tokens/s are context.

Run: HF_HUB_OFFLINE=1 .venv/bin/python bench/engine_batch.py   (~10 min on 2 cores, on a quiet
host). Writes bench/results/engine_batch.json and .md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from specpilot.tuner import Observation, SpecConfig

BENCH = str(Path(__file__).resolve().parent)
if BENCH not in sys.path:
    sys.path.insert(0, BENCH)

from real_engine import (  # noqa: E402
    RESULTS,
    Phase,
    TimedEngine,
    add_variant_probe_arguments,
    check_variant_probe_arguments,
    probe_head,
    probe_markdown_head,
    probe_variant,
    slot,
    write,
)
from real_vllm import make_engine  # noqa: E402

NGRAM_K5 = SpecConfig(method="ngram", num_speculative_tokens=5)
VARIANTS: dict[str, tuple[str, dict[str, str], SpecConfig]] = {
    "mp-auto": ("mp", {"VLLM_CPU_OMP_THREADS_BIND": "auto"}, SpecConfig()),
    "mp-nobind": ("mp", {"VLLM_CPU_OMP_THREADS_BIND": "nobind"}, SpecConfig()),
    "uni": ("uni", {}, SpecConfig()),
    "uni-ngram5": ("uni", {}, NGRAM_K5),
    "uni-ngram5-numba2": ("uni", {"NUMBA_NUM_THREADS": "2"}, NGRAM_K5),
}
"""Variant: (bench/real_vllm.py's executor, environment on top of it, the config served)."""


def observed_slot(engine: TimedEngine, phase: Phase, seconds: float) -> dict[str, Any]:
    """One load slot with one observed window inside it (1 s after the load starts)."""
    seen: list[Observation] = []

    def watch() -> None:
        time.sleep(1.0)
        seen.append(engine.observe(seconds - 2.0))

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    counts, wall = slot(engine, phase, seconds)
    thread.join(timeout=30.0)
    batch = seen[0].running_requests if seen else None
    return {
        "tokens_per_s": round(counts["tokens"] / wall, 1),
        "engine_batch": None if batch is None else round(batch, 2),
        "running_gauge": None if not seen else seen[0].running_requests_gauge,
        "batch_per_user": None if batch is None else round(batch / phase.concurrency, 3),
    }


def median_batch_per_user(slots: list[dict[str, Any]]) -> dict[str, Any]:
    ratios = [s["batch_per_user"] for s in slots if s["batch_per_user"] is not None]
    return {"median_batch_per_user": round(statistics.median(ratios), 3) if ratios else None}


def markdown(report: dict[str, Any]) -> str:
    lines = [
        *probe_markdown_head(report, "Does the client's concurrency reach the engine? (real vLLM)"),
        "Engine batch: the mean running requests over one window inside each slot, from vLLM's "
        "own inter-token-latency sums (what SpecPilot's loop reads); batch per user = that over "
        "the client's concurrency (1 = every request the client holds is in the engine).",
        "",
        "| server | concurrency | tokens/s per slot | engine batch per slot "
        "| batch per user, median |",
        "|---|---|---|---|---|",
    ]
    for row in report["variants"]:
        for block in row["concurrencies"]:
            slots = block["slots"]
            lines.append(
                f"| {row['variant']} | {block['concurrency']} | "
                + ", ".join(f"{s['tokens_per_s']:.0f}" for s in slots)
                + " | "
                + ", ".join(str(s["engine_batch"]) for s in slots)
                + f" | {block['median_batch_per_user']} |"
            )
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    add_variant_probe_arguments(
        parser,
        variants=list(VARIANTS),
        rounds=4,
        concurrency=[1, 32],
        port=8391,
        out=RESULTS / "engine_batch.json",
    )
    ns = parser.parse_args()
    check_variant_probe_arguments(parser, ns)
    started = time.time()
    report: dict[str, Any] = {
        **probe_head("bench/engine_batch.py", started, ns.rounds, ns.slot_seconds),
        "variants": [],
    }

    def save() -> None:
        report["wall_min"] = (time.time() - started) / 60
        write(report, ns.out, markdown)

    for variant in ns.variant:
        executor, env, config = VARIANTS[variant]
        logs = Path(tempfile.mkdtemp(prefix="engine-batch-"))
        engine = make_engine(ns.port, logs, executor=executor)
        engine.env.update(env)
        row: dict[str, Any] = {"variant": variant, "concurrencies": []}
        report["variants"].append(row)
        probe_variant(engine, config, ns, row, observed_slot, median_batch_per_user, save)
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
