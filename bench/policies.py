"""Every policy on every shipped trace (fast mode); writes bench/results/policies.{json,md}.

Run: .venv/bin/python bench/policies.py   (H100 x llama-3.1-8b, vLLM dialect, seed 0)
"""

from __future__ import annotations

import json
from pathlib import Path

from specpilot.operator.bench_command import bench
from specpilot.runtime.traces import load_trace

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"


def main() -> None:
    reports = []
    for path in sorted((HERE / "traces").glob("*.csv")):
        report = bench(
            load_trace(path),
            gpu="H100",
            profile="llama-3.1-8b",
            engine="vllm",
            window_s=60.0,
            slo_s=0.05,
            downtime_s=30.0,
            seed=0,
        )
        reports.append(report)
        print(
            f"{path.stem}: specpilot/oracle {report['specpilot_vs_oracle']}, "
            f"specpilot/best static {report['specpilot_vs_best_static']}",
            flush=True,
        )
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "policies.json").write_text(json.dumps(reports, indent=2) + "\n")
    lines = [
        "# Policies on the shipped traces (fast mode)",
        "",
        "Produced by `.venv/bin/python bench/policies.py`: H100 x llama-3.1-8b, vLLM "
        "dialect, SLO per-token latency 50 ms, restart downtime 30 s, 60 s windows.",
        "",
    ]
    for report in reports:
        lines += [
            f"## {report['trace']}",
            "",
            f"oracle goodput {report['oracle_goodput_tok_s']} tok/s; best static "
            f"{report['best_static']}; SpecPilot/oracle {report['specpilot_vs_oracle']}; "
            f"SpecPilot/best static {report['specpilot_vs_best_static']}",
            "",
            "| policy | SLO-goodput tok/s | tok/s | TPOT mean ms | TPOT p95 ms | "
            "e2e mean s | restarts |",
            "|---|---|---|---|---|---|---|",
        ]
        for p in report["policies"]:
            lines.append(
                f"| {p['policy']} | {p['goodput_tok_s']} | {p['tokens_per_s']} | "
                f"{p['tpot_ms_mean']} | {p['tpot_ms_p95']} | {p['e2e_s_mean']} | "
                f"{p['restarts']} |"
            )
        lines.append("")
    (RESULTS / "policies.md").write_text("\n".join(lines))


if __name__ == "__main__":
    main()
