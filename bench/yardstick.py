"""The yardstick's regenerated results: every policy, in hidden worlds, on real and synthetic
traffic, both engine dialects and two rollout strategies; writes bench/results/yardstick-*.

Run: .venv/bin/python bench/yardstick.py [--only NAME ...] [--worlds N]
Each run is one `specpilot bench` command (recorded in its JSON with the commit, seeds and wall
time); the Markdown beside it is the summary table (medians over worlds).
`poisson-vllm-start-eagle3` is the Poisson sweep with SpecPilot started on EAGLE-3 K=3 (the
SpecDeployment's default start) instead of the bench's speculation off.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from specpilot.operator.app.bench.report import markdown
from specpilot.operator.app.cli import main as specpilot

RESULTS = Path(__file__).resolve().parent / "results"
AZURE = "bench/traces/azure_conv_2023.csv"
VLLM = ["--gpu", "H100", "--model-profile", "llama-3.1-8b", "--engine", "vllm"]
SGLANG = ["--gpu", "H200", "--model-profile", "qwen3-8b", "--engine", "sglang"]
RUNS: dict[str, list[str]] = {
    "azure-vllm-surge": ["--trace", AZURE, "--peak-load", "1.2", *VLLM, "--rollout", "surge"],
    "azure-sglang-surge": ["--trace", AZURE, "--peak-load", "1.2", *SGLANG, "--rollout", "surge"],
    "azure-vllm-4x-one-at-a-time": [
        "--trace", AZURE, "--peak-load", "1.2", *VLLM, "--replicas", "4",
        "--rollout", "one-at-a-time",
    ],
    "azure-vllm-4x-surge": [
        "--trace", AZURE, "--peak-load", "1.2", *VLLM, "--replicas", "4", "--rollout", "surge",
    ],
    "poisson-vllm": ["--trace", AZURE, "--poisson", "0.1:1.3:7", *VLLM, "--rollout", "surge"],
    "poisson-vllm-start-eagle3": [
        "--trace", AZURE, "--poisson", "0.1:1.3:7", *VLLM, "--rollout", "surge",
        "--initial", "static:eagle3 K=3",
    ],
}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--only", nargs="*", choices=sorted(RUNS), help="runs to redo")
    parser.add_argument("--worlds", type=int, default=10)
    ns = parser.parse_args()
    RESULTS.mkdir(exist_ok=True)
    for name in ns.only or RUNS:
        out = RESULTS / f"yardstick-{name}.json"
        code = specpilot(["bench", *RUNS[name], "--worlds", str(ns.worlds), "--json", str(out)])
        if code != 0:
            raise SystemExit(f"{name}: specpilot bench exited {code}")
        report = json.loads(out.read_text(encoding="utf-8"))
        text = [
            f"# {name}\n",
            f"Command: `{report['command']}`  ",
            f"Commit: {report['commit']}; seeds {report['seeds']}; wall {report['wall_s']} s; "
            f"no-speculation capacity {report['setup']['no_spec_capacity_rps']} req/s per "
            f"deployment (nominal world).\n",
            "Medians over worlds (the tuner is told none of them); hindsight is a reference "
            "(free switches, best static per window), not an upper bound.\n",
            markdown(report["summary"]),
        ]
        if "capacity_at_90pct_attainment" in report:
            text.append("\nCapacity at 90% standard-tier attainment (req/s):\n")
            for policy, rate in report["capacity_at_90pct_attainment"].items():
                text.append(f"- {policy}: {rate}")
        (RESULTS / f"yardstick-{name}.md").write_text("\n".join(text) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
