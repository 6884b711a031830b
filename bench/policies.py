"""Every policy on every shipped rate trace, both dialects: `specpilot bench`, run six times.

Run: .venv/bin/python bench/policies.py [--worlds N] [--workers N]
Setups: H100 x llama-3.1-8b in the vLLM dialect, H200 x qwen3-8b in the SGLang dialect; traces
bench/traces/{diurnal,step,taskmix}.csv; `--worlds` hidden worlds from seed 0 (the nominal
world), one replica, the bench's defaults otherwise (60 s windows, surge rollout, seed 0).
Writes bench/results/policies-<gpu>-<profile>-<engine>-<trace>.json (the full report of each
run: per world, per policy, per window; the commit, the command, the seeds, the wall time) and
bench/results/policies.md (each run's summary table: medians over worlds). The metrics, the
worlds and the policies are `specpilot bench`'s (operator/app/bench/); this only picks the
arguments.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from specpilot.operator.app.bench.report import markdown
from specpilot.operator.app.cli import main as specpilot

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
SETUPS = (("H100", "llama-3.1-8b", "vllm"), ("H200", "qwen3-8b", "sglang"))
TRACES = ("diurnal", "step", "taskmix")
WORLDS = 10


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worlds", type=int, default=WORLDS)
    parser.add_argument("--workers", type=int, help="processes (default: every CPU)")
    args = parser.parse_args()
    RESULTS.mkdir(exist_ok=True)
    sections = [
        "# Policies on the shipped rate traces (fast mode)",
        "",
        f"Produced by `.venv/bin/python bench/policies.py --worlds {args.worlds}`: each table is "
        "one `specpilot bench` run (its command is in the JSON beside it), each figure the "
        "median over the worlds. Metrics and tiers: bench/README.md.",
        "",
    ]
    for gpu, profile, engine in SETUPS:
        for trace in TRACES:
            out = RESULTS / f"policies-{gpu}-{profile}-{engine}-{trace}.json"
            command = [
                "bench",
                "--trace", os.path.relpath(HERE / "traces" / f"{trace}.csv"),
                "--gpu", gpu,
                "--model-profile", profile,
                "--engine", engine,
                "--worlds", str(args.worlds),
                "--json", os.path.relpath(out),
            ]  # fmt: skip
            if args.workers:
                command += ["--workers", str(args.workers)]
            print(f"{gpu} x {profile}, {engine}, {trace}:", flush=True)
            if specpilot(command) != 0:
                raise SystemExit(f"specpilot {' '.join(command)} failed")
            report = json.loads(out.read_text(encoding="utf-8"))
            sections += [
                f"## {trace}: {gpu} x {profile}, {engine} dialect",
                "",
                f"`{report['command']}` ({report['wall_s']} s)",
                "",
                markdown(report["summary"]),
            ]
    (RESULTS / "policies.md").write_text("\n".join(sections), encoding="utf-8")


if __name__ == "__main__":
    main()
