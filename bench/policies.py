"""Every policy on every shipped trace (fast mode); writes bench/results/policies.{json,md,png}.

Run: .venv/bin/python bench/policies.py
Setups: H100 x llama-3.1-8b in the vLLM dialect, H200 x qwen3-8b in the SGLang dialect; seed 0,
60 s windows, per-token latency SLO 50 ms, restart downtime 30 s. One PNG per setup and trace
(goodput per window of SpecPilot against no speculation, the best static config and the
engine's own per-batch baseline).
"""

from __future__ import annotations

import json
from itertools import pairwise
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from specpilot.operator.app.bench_command import bench
from specpilot.runtime.traces import load_trace

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
SETUPS = (("H100", "llama-3.1-8b", "vllm"), ("H200", "qwen3-8b", "sglang"))
WINDOW_S = 60.0


def main() -> None:
    reports: list[dict[str, Any]] = []
    for gpu, profile, engine in SETUPS:
        for path in sorted((HERE / "traces").glob("*.csv")):
            report = bench(
                load_trace(path),
                gpu=gpu,
                profile=profile,
                engine=engine,
                window_s=WINDOW_S,
                slo_s=0.05,
                downtime_s=30.0,
                seed=0,
            )
            reports.append(report)
            plot(report, RESULTS / f"policies-{gpu}-{profile}-{engine}-{path.stem}.png")
            print(
                f"{gpu} {profile} {engine} {path.stem}: specpilot/oracle "
                f"{report['specpilot_vs_oracle']}, specpilot/best static "
                f"{report['specpilot_vs_best_static']}",
                flush=True,
            )
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "policies.json").write_text(json.dumps(reports, indent=2) + "\n")
    (RESULTS / "policies.md").write_text(markdown(reports))


def plot(report: dict[str, Any], out: Path) -> None:
    policies = {p["policy"]: p for p in report["policies"]}
    baseline = "vllm-eagle3-table" if report["engine"] == "vllm" else "sglang-default-adaptive"
    shown = dict.fromkeys(["no speculation", report["best_static"], baseline, "specpilot"])
    figure, axis = plt.subplots(figsize=(9, 4))
    for name in shown:
        windows = policies[name]["window_goodput_tok_s"]
        minutes = [(i + 1) * WINDOW_S / 60 for i in range(len(windows))]
        axis.plot(minutes, windows, label=name, linewidth=2.2 if name == "specpilot" else 1.2)
    axis.set_xlabel("trace time (min)")
    axis.set_ylabel("SLO-goodput per window (tok/s)")
    axis.set_title(
        f"{report['trace']}: {report['gpu']} x {report['model_profile']}, {report['engine']} "
        f"(SpecPilot/oracle {report['specpilot_vs_oracle']})"
    )
    axis.legend(fontsize=8)
    axis.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(out, dpi=100)
    plt.close(figure)


def markdown(reports: list[dict[str, Any]]) -> str:
    lines = [
        "# Policies on the shipped traces (fast mode)",
        "",
        "Produced by `.venv/bin/python bench/policies.py`: seed 0, SLO per-token latency 50 ms, "
        "restart downtime 30 s (a restart pauses serving and recomputes what was running), "
        "60 s windows. Goodput counts the output tokens of requests whose per-token latency "
        "met the SLO. The oracle switches for free (no downtime, the KV cache kept) to each "
        "window's best static config in hindsight. Saturation: the windows where the plain "
        "engine ran at 90% of max-num-seqs or more.",
        "",
        "| setup | trace | SpecPilot / oracle | SpecPilot / best static | SpecPilot / engine "
        "baseline | oracle / best static | saturation windows | SpecPilot / no spec there "
        "(worst window) | SpecPilot restarts (most in any hour) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for report in reports:
        policies = {p["policy"]: p for p in report["policies"]}
        baseline = policies.get("vllm-eagle3-table") or policies["sglang-default-adaptive"]
        pilot = policies["specpilot"]
        saturation = report["saturation"]
        switches = [
            i
            for i, (a, b) in enumerate(pairwise(report["specpilot_configs_by_window"]), 1)
            if a != b
        ]
        hour = round(3600 / WINDOW_S)
        most_in_an_hour = max(
            (sum(s <= t < s + hour for t in switches) for s in switches), default=0
        )
        lines.append(
            f"| {report['gpu']} x {report['model_profile']}, {report['engine']} | "
            f"{report['trace']} | {report['specpilot_vs_oracle']} | "
            f"{report['specpilot_vs_best_static']} | "
            f"{pilot['goodput_tok_s'] / baseline['goodput_tok_s']:.4f} | "
            f"{report['oracle_vs_best_static']} | {saturation['windows']} | "
            f"{saturation['specpilot_vs_no_speculation']} ({saturation['worst_window']}) | "
            f"{pilot['restarts']} ({most_in_an_hour}) |"
        )
    lines.append("")
    for report in reports:
        lines += [
            f"## {report['trace']}: {report['gpu']} x {report['model_profile']}, "
            f"{report['engine']} dialect",
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
        lines += ["", "SpecPilot's switches:", ""]
        lines += [f"- {reason}" for reason in report["specpilot_decisions"]] or ["- none"]
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
