"""How many threads should a CPU SGLang server run its model on? Real SGLang (CPU, the bench's
stand-in kernels) at concurrency 8 and 1: the client's tokens/s beside the CPU time each of the
server's processes used, per thread setting and config.

Contract: per `--variant` (`default`: SGLang's CPU default, an OpenMP thread per core of the NUMA
node; `one`: bench/real_sglang.py's default `--threads`, OMP_NUM_THREADS=1; each serving no
speculation and ngram K=5), one run starts one SGLang server with bench/real_sglang.py's launch,
warms it up and runs `--rounds` slots per concurrency of bench/real_engine.py's closed-loop
streamed load, reading from /proc the CPU seconds each of the server's processes (the API
server and tokenizer manager, the scheduler that runs the model, the detokenizer) and the client
used in the slot. On 2 cores a scheduler that takes most of both leaves the rest of the server
and the clients waiting: a phase then measures the contention, not the config.

Run: HF_HUB_OFFLINE=1 .venv/bin/python bench/sglang_threads.py   (~5 min on 2 cores, on a quiet
host). Writes bench/results/sglang_threads.json and .md.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from specpilot.tuner import SpecConfig

BENCH = str(Path(__file__).resolve().parent)
if BENCH not in sys.path:
    sys.path.insert(0, BENCH)

from real_engine import (  # noqa: E402
    RESULTS,
    Phase,
    TimedEngine,
    add_variant_probe_arguments,
    check_variant_probe_arguments,
    cpu_seconds_by_process,
    probe_head,
    probe_markdown_head,
    probe_variant,
    slot,
    write,
)
from real_sglang import THREADS, make_engine  # noqa: E402

NGRAM_K5 = SpecConfig(method="ngram", num_speculative_tokens=5)
VARIANTS: dict[str, tuple[str, SpecConfig]] = {
    "default": ("default", SpecConfig()),
    "one": ("one", SpecConfig()),
    "default-ngram5": ("default", NGRAM_K5),
    "one-ngram5": ("one", NGRAM_K5),
}
"""Variant: (bench/real_sglang.py's --threads, the config served)."""


def client_cpu_s() -> float:
    used = resource.getrusage(resource.RUSAGE_SELF)
    return used.ru_utime + used.ru_stime


def measured_slot(engine: TimedEngine, phase: Phase, seconds: float) -> dict[str, Any]:
    """One load slot: tokens/s and the CPU seconds per server process (by name) and client."""
    groups = set(engine.process_groups)
    before, client = cpu_seconds_by_process(groups), client_cpu_s()
    counts, wall = slot(engine, phase, seconds)
    after, client_after = cpu_seconds_by_process(groups), client_cpu_s()
    by_name: dict[str, float] = {}
    for key, used in after.items():
        name = key.rsplit(":", 1)[0]
        by_name[name] = by_name.get(name, 0.0) + used - before.get(key, 0.0)
    return {
        "tokens_per_s": round(counts["tokens"] / wall, 1),
        "wall_s": round(wall, 2),
        "server_cpu_s": {name: round(used, 2) for name, used in sorted(by_name.items())},
        "client_cpu_s": round(client_after - client, 2),
    }


def median_tokens_per_s(slots: list[dict[str, Any]]) -> dict[str, Any]:
    return {"median_tokens_per_s": round(statistics.median(s["tokens_per_s"] for s in slots), 1)}


def markdown(report: dict[str, Any]) -> str:
    lines = [
        *probe_markdown_head(report, "SGLang CPU server: threads against tokens/s"),
        "Per slot of closed-loop streamed load on one server: tokens/s, then CPU seconds used "
        "in the slot by the server's processes (scheduler: the model; python: the API server "
        "and tokenizer manager; detokenizer) and by the client. Two cores: "
        f"{report['slot_seconds']:.0f} s slots hold {2 * report['slot_seconds']:.0f} CPU s.",
        "",
        "| variant | threads | config | concurrency | tokens/s per slot | median tokens/s "
        "| scheduler CPU s | other server CPU s | client CPU s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in report["variants"]:
        for block in row["concurrencies"]:
            slots = block["slots"]
            scheduler = [
                sum(v for k, v in s["server_cpu_s"].items() if "schedul" in k) for s in slots
            ]
            others = [
                sum(v for k, v in s["server_cpu_s"].items() if "schedul" not in k) for s in slots
            ]
            lines.append(
                f"| {row['variant']} | {row['threads']} | {row['config']} | "
                f"{block['concurrency']} | "
                + ", ".join(str(s["tokens_per_s"]) for s in slots)
                + f" | {block['median_tokens_per_s']} | "
                + ", ".join(f"{v:.1f}" for v in scheduler)
                + " | "
                + ", ".join(f"{v:.1f}" for v in others)
                + " | "
                + ", ".join(f"{s['client_cpu_s']:.1f}" for s in slots)
                + " |"
            )
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    add_variant_probe_arguments(
        parser,
        variants=list(VARIANTS),
        rounds=2,
        concurrency=[8, 1],
        port=8491,
        out=RESULTS / "sglang_threads.json",
    )
    ns = parser.parse_args()
    check_variant_probe_arguments(parser, ns)
    started = time.time()
    report: dict[str, Any] = {
        **probe_head("bench/sglang_threads.py", started, ns.rounds, ns.slot_seconds),
        "variants": [],
    }

    def save() -> None:
        report["wall_min"] = (time.time() - started) / 60
        write(report, ns.out, markdown)

    for variant in ns.variant:
        threads, config = VARIANTS[variant]
        engine = make_engine(ns.port, Path(tempfile.mkdtemp(prefix="sglang-threads-")), threads)
        row: dict[str, Any] = {
            "variant": variant,
            "threads": threads,
            "environment": THREADS[threads],
            "config": config.describe(),
            "concurrencies": [],
        }
        report["variants"].append(row)
        probe_variant(engine, config, ns, row, measured_slot, median_tokens_per_s, save)
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
