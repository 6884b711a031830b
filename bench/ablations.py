"""Ablations: SpecPilot against itself with one component removed, in the same hidden worlds.

Run: .venv/bin/python bench/ablations.py [--only NAME ...] [--worlds N] [--render-only]
Each run is one `specpilot bench --policies ...` command over the yardstick's traffic (the
Azure conversation trace at peak 1.2 and the Poisson sweep, vLLM dialect, surge rollout) and
over bench/traces/taskmix.csv (the task mix moving at a steady 6 req/s): no
speculation, the full tuner and each ablation (operator/app/bench/policies.py, `ABLATIONS`):
- specpilot:no-gp: the residual GP and its per-method levels off, the shared offset kept (every
  config corrected alike);
- specpilot:moving-average: acceptance as the running method's length averaged at rate 0.3
  (tuner/policy/ablation.py), no (p, r) posterior and no task mix;
- specpilot:no-schedules: no synthesised per-batch K schedules;
- specpilot:averaged-prefill: prefill spread over every step, not priced in lumps of the
  measured mean prompt (`TunerSettings.lumpy_prefill`);
- specpilot:exploration: trials, which the default leaves off (the operator's
  `tuning.explore`) since the ablation of them (`specpilot:no-exploration`, at 1f4dd35) found
  they paid for themselves in none of 50 four-replica world runs and cost in 12
  (`git show 480abcd:bench/results/ablations.md`). The control loop lets the tuner explore
  only where a trial runs on a canary (operator/loop.py), so this is run with 4 replicas
  (`poisson-vllm-4x-one-at-a-time`, the sweep at four rates, and `azure-vllm-4x-surge`) and
  with one replica and a surge rollout, whose spare GPU holds a canary beside the replica that
  takes all of the load for its trial, the replica idle and warm as the way back
  (`poisson-vllm-exploration`, `azure-vllm-surge-exploration`, and with SGLang
  `azure-sglang-surge-exploration`; runtime/full_load_trial.py), and so again started on
  EAGLE-3 K=3, the SpecDeployment's default start (`poisson-vllm-start-eagle3-exploration`,
  `azure-vllm-surge-start-eagle3-exploration`), each time alone beside the tuner and no
  speculation; with trials on all of the traffic and
  no replica held back it paid for itself in none of 90 one-replica world runs
  (`git show d04e071:bench/results/ablations.md`), at half the traffic its gains were the
  spare GPU's (`git show 243d7a9:bench/results/ablations.md`).
Writes bench/results/ablations-NAME.json (the bench's report: commit, command, seeds) and
ablations.md: per run, each policy's median-world figures and, per world, the mean E2E latency
of the tuner without each component over with it (above 1: the component paid for itself in
that world); for a removed component that is the ablation over the tuner, for an added one
the tuner over the ablation.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from specpilot.operator.app.bench.policies import ABLATIONS, ADDED, NO_SPEC, SPECPILOT
from specpilot.operator.app.bench.report import markdown
from specpilot.operator.app.cli import main as specpilot

RESULTS = Path(__file__).resolve().parent / "results"
AZURE = "bench/traces/azure_conv_2023.csv"
VLLM = ["--gpu", "H100", "--model-profile", "llama-3.1-8b", "--engine", "vllm"]
SGLANG = ["--gpu", "H200", "--model-profile", "qwen3-8b", "--engine", "sglang"]
POLICIES = ",".join([NO_SPEC, SPECPILOT, *(a for a in ABLATIONS if a not in ADDED)])
"""One replica: every ablation but the added trials, which need a canary to run at all."""
RUNS: dict[str, list[str]] = {
    "azure-vllm-surge": ["--trace", AZURE, "--peak-load", "1.2", *VLLM, "--rollout", "surge"],
    "poisson-vllm": ["--trace", AZURE, "--poisson", "0.1:1.3:7", *VLLM, "--rollout", "surge"],
    # The Azure trace is chat alone: the task mix moving (chat -> code -> summarize -> chat at
    # 6 req/s) is what exercises what the posterior adds over a moving average.
    "taskmix-vllm": ["--trace", "bench/traces/taskmix.csv", *VLLM, "--rollout", "surge"],
    # Four replicas: a trial runs on a canary in one replica's place, at a quarter of the
    # traffic. Four rates, not seven, and only the ablation that differs there: each cell
    # simulates four engines.
    "poisson-vllm-4x-one-at-a-time": [
        "--trace", AZURE, "--poisson", "0.1:1.3:4", *VLLM, "--replicas", "4",
        "--rollout", "one-at-a-time",
    ],
    # The real trace with a spare GPU: the canary starts beside the replicas, so a trial's
    # start takes no capacity from them.
    "azure-vllm-4x-surge": [
        "--trace", AZURE, "--peak-load", "1.2", *VLLM, "--replicas", "4", "--rollout", "surge",
    ],
    # One replica with a surge rollout's spare GPU: a trial's canary runs beside it.
    "poisson-vllm-exploration": [
        "--trace", AZURE, "--poisson", "0.1:1.3:7", *VLLM, "--rollout", "surge",
    ],
    "azure-vllm-surge-exploration": [
        "--trace", AZURE, "--peak-load", "1.2", *VLLM, "--rollout", "surge",
    ],
    "azure-sglang-surge-exploration": [
        "--trace", AZURE, "--peak-load", "1.2", *SGLANG, "--rollout", "surge",
    ],
    # The same, started on speculation as a SpecDeployment is by default: what a trial can
    # teach there is a K or a way off, not a way in.
    "poisson-vllm-start-eagle3-exploration": [
        "--trace", AZURE, "--poisson", "0.1:1.3:7", *VLLM, "--rollout", "surge",
        "--initial", "static:eagle3 K=3",
    ],
    "azure-vllm-surge-start-eagle3-exploration": [
        "--trace", AZURE, "--peak-load", "1.2", *VLLM, "--rollout", "surge",
        "--initial", "static:eagle3 K=3",
    ],
}  # fmt: skip
EXPLORATION = "specpilot:exploration"
EXPLORATION_ONLY = ",".join([NO_SPEC, SPECPILOT, EXPLORATION])
RUN_POLICIES = {
    "poisson-vllm-4x-one-at-a-time": EXPLORATION_ONLY,
    "azure-vllm-4x-surge": EXPLORATION_ONLY,
    "poisson-vllm-exploration": EXPLORATION_ONLY,
    "azure-vllm-surge-exploration": EXPLORATION_ONLY,
    "azure-sglang-surge-exploration": EXPLORATION_ONLY,
    "poisson-vllm-start-eagle3-exploration": EXPLORATION_ONLY,
    "azure-vllm-surge-start-eagle3-exploration": EXPLORATION_ONLY,
}
"""Runs that compare fewer policies than `POLICIES`."""


def per_world_ratios(report: dict[str, Any]) -> dict[str, list[float]]:
    """Per ablation the report ran, the mean E2E latency without its component over with it
    in each (traffic, world): the ablation's over the tuner's for a removed component, the
    tuner's over the ablation's for an added one (`ADDED`)."""
    ran = {p["policy"] for p in report["summary"]}
    ratios: dict[str, list[float]] = {name: [] for name in ABLATIONS if name in ran}
    for traffic in report["traffics"]:
        for world in traffic["worlds"]:
            full = world["policies"][SPECPILOT]["e2el_ms_mean"]
            for name in ratios:
                ablated = world["policies"][name]["e2el_ms_mean"]
                without, with_ = (full, ablated) if name in ADDED else (ablated, full)
                ratios[name].append(round(without / with_, 4) if with_ > 0 else float("nan"))
    return ratios


def section(name: str, report: dict[str, Any]) -> list[str]:
    ratios = per_world_ratios(report)
    lines = [
        f"## {name}\n",
        f"Command: `{report['command']}`  ",
        f"Commit: {report['commit']}; seeds {report['seeds']}; wall {report['wall_s']} s.\n",
        "Medians over worlds (and, for the Poisson sweep, over its rates):\n",
        markdown(report["summary"]),
        "\nMean E2E latency without each component over with it, per world"
        + (" and rate" if len(report["traffics"]) > 1 else "")
        + " (above 1: the component paid for itself there):\n",
        "| ablation | worlds where it paid (> 1.005) | worlds where it cost (< 0.995) | "
        "worst | best |",
        "|---|---|---|---|---|",
    ]
    for ablation, values in ratios.items():
        paid = sum(v > 1.005 for v in values)
        cost = sum(v < 0.995 for v in values)
        lines.append(
            f"| {ablation} | {paid} of {len(values)} | {cost} of {len(values)} | "
            f"{min(values):.3f} | {max(values):.3f} |"
        )
    if EXPLORATION in ratios:
        lines += ["", *trial_lines(report, ratios[EXPLORATION])]
    return [*lines, ""]


def trial_outcome(decisions: list[str]) -> str:
    """What a run's trials came to: "none", "rejected" (every trial's canary turned down) or
    "moved" (a trial's canary promoted, or the move the judge made instead)."""
    trials = [d for d in decisions if "exploring" in d or "the canary of" in d]
    if not trials:
        return "none"
    return "rejected" if all("CanaryRejected" in d for d in trials) else "moved"


def trial_lines(report: dict[str, Any], ratios: list[float]) -> list[str]:
    """The exploration ablation's cells by what their trials came to, each with where the
    trials paid and cost: a cell whose every trial was rejected gained or lost by the
    canary's window alone, not by what it taught."""
    outcomes = [
        trial_outcome(world["policies"][EXPLORATION]["decisions"])
        for traffic in report["traffics"]
        for world in traffic["worlds"]
    ]
    lines = ["| trials came to | cells | paid (> 1.005) | cost (< 0.995) |", "|---|---|---|---|"]
    for outcome, label in (
        ("moved", "a move (canary promoted, or the judge's move instead)"),
        ("rejected", "every canary rejected"),
        ("none", "no trial"),
    ):
        values = [v for v, o in zip(ratios, outcomes, strict=True) if o == outcome]
        lines.append(
            f"| {label} | {len(values)} | {sum(v > 1.005 for v in values)} | "
            f"{sum(v < 0.995 for v in values)} |"
        )
    if report["setup"]["replicas"] == 1:
        lines.append(
            "\nBeside one replica the canary runs on the surge's spare GPU, which no static "
            "config has: at the balancer's share while it warms up, and finishing what it "
            "holds while the replica takes the load back, two GPUs serve. A cell whose every "
            "canary was rejected gained that GPU's capacity then, not anything the trial "
            "taught."
        )
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--only", nargs="*", choices=sorted(RUNS), help="runs to redo")
    parser.add_argument("--worlds", type=int, default=10)
    parser.add_argument(
        "--render-only", action="store_true", help="rewrite ablations.md from the JSON (no run)"
    )
    ns = parser.parse_args(argv)
    RESULTS.mkdir(exist_ok=True)
    for name in [] if ns.render_only else ns.only or RUNS:
        out = RESULTS / f"ablations-{name}.json"
        policies = RUN_POLICIES.get(name, POLICIES)
        args = [*RUNS[name], "--policies", policies, "--worlds", str(ns.worlds)]
        code = specpilot(["bench", *args, "--json", os.path.relpath(out)])
        if code != 0:
            raise SystemExit(f"{name}: specpilot bench exited {code}")
    text = ["# Ablations\n", __doc__.split("\n\n", 1)[1].strip(), ""]
    for name in RUNS:
        out = RESULTS / f"ablations-{name}.json"
        if out.exists():
            text += section(name, json.loads(out.read_text(encoding="utf-8")))
    (RESULTS / "ablations.md").write_text("\n".join(text) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
