"""Entry caution: what reading a never-run speculative config's capacity half an sd down buys.

Run: .venv/bin/python bench/entry_caution.py [--worlds N] [--rates A:B:N]
One `specpilot bench` over the yardstick's Poisson traffic (Azure conversation shapes, vLLM
dialect, H100 x llama-3.1-8b, one replica, surge rollout) at the loads where the caution
decides (0.5, 0.7 and 0.9 of the nominal world's no-speculation capacity), in 10 hidden
worlds: no speculation, static EAGLE-3 K=4 (the sweep's best static in the median world), the
tuner as shipped (`TunerSettings.entry_caution_sd` 0.5) and its variants at 1 and 0 sds
(operator/app/bench/policies.py, the `VARIANTS` that set it; under an overload every one reads
at least one sd down, `latency_proposal.OVERLOAD_ENTRY_CAUTION_SD`). Writes
bench/results/entry_caution.json (the bench's report: commit, command, seeds) and
entry_caution.md: per rate and world, each policy's mean E2E latency, and per variant the
worlds where it beat the shipped tuner, where it lost, and its worst world against no
speculation (the yardstick's bound: 1.05).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from specpilot.operator.app.bench.policies import NO_SPEC, SPECPILOT, VARIANTS
from specpilot.operator.app.cli import main as specpilot

RESULTS = Path(__file__).resolve().parent / "results"
OUT = RESULTS / "entry_caution.json"
EAGLE3_K4 = "static:eagle3 K=4"
CAUTIONS = [name for name, overrides in VARIANTS.items() if "entry_caution_sd" in overrides]
"""The variants that set the entry caution otherwise (the others answer another question)."""
POLICIES = [NO_SPEC, EAGLE3_K4, SPECPILOT, *CAUTIONS]
WORST_ALLOWED = 1.05
"""The yardstick's bound: in no world worse than no speculation by more than 5% mean E2E."""
SAME = 0.005
"""Ratios within this of 1 count as a tie."""


def rows(report: dict[str, Any]) -> list[str]:
    lines = [
        "| rate | world | " + " | ".join(POLICIES) + " |",
        "|---|---|" + "---|" * len(POLICIES),
    ]
    for traffic in report["traffics"]:
        for world in traffic["worlds"]:
            cells = [f"{world['policies'][p]['e2el_ms_mean']:.0f}" for p in POLICIES]
            head = f"| {traffic['name']} | {world['world_seed']} | "
            lines.append(head + " | ".join(cells) + " |")
    return lines


def verdicts(report: dict[str, Any]) -> list[str]:
    lines = [
        "| variant | cells better than the tuner (< 0.995) | cells worse (> 1.005) | "
        "best / tuner | worst / tuner | worst / no speculation |",
        "|---|---|---|---|---|---|",
    ]
    for variant in CAUTIONS:
        against_tuner, against_none = [], []
        for traffic in report["traffics"]:
            for world in traffic["worlds"]:
                p = world["policies"]
                mine = p[variant]["e2el_ms_mean"]
                against_tuner.append(mine / p[SPECPILOT]["e2el_ms_mean"])
                against_none.append(mine / p[NO_SPEC]["e2el_ms_mean"])
        worst_none = max(against_none)
        flag = "" if worst_none <= WORST_ALLOWED else f" (over the {WORST_ALLOWED} bound)"
        lines.append(
            f"| {variant} | {sum(r < 1 - SAME for r in against_tuner)} of {len(against_tuner)} "
            f"| {sum(r > 1 + SAME for r in against_tuner)} | {min(against_tuner):.3f} | "
            f"{max(against_tuner):.3f} | {worst_none:.3f}{flag} |"
        )
    return lines


def markdown(report: dict[str, Any]) -> str:
    return "\n".join(
        [
            "# Entry caution: a never-run speculative config's capacity, how many sds down\n",
            f"Command: `{report['command']}` (from `.venv/bin/python bench/entry_caution.py`)  ",
            f"Commit: {report['commit']}; seeds {report['seeds']}; wall {report['wall_s']} s.\n",
            "Mean E2E latency, ms, per rate (fraction of the nominal world's no-speculation "
            "capacity) and hidden world:\n",
            *rows(report),
            "\nEach variant against the shipped tuner (half an sd down; one under an overload) "
            "and against no speculation, over every (rate, world) cell:\n",
            *verdicts(report),
            "",
        ]
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--worlds", type=int, default=10)
    parser.add_argument("--rates", default="0.5:0.9:3", help="A:B:N, as `specpilot bench`")
    ns = parser.parse_args(argv)
    RESULTS.mkdir(exist_ok=True)
    args = [
        "bench", "--trace", "bench/traces/azure_conv_2023.csv", "--poisson", ns.rates,
        "--gpu", "H100", "--model-profile", "llama-3.1-8b", "--engine", "vllm",
        "--rollout", "surge", "--worlds", str(ns.worlds), "--policies", ",".join(POLICIES),
        "--json", os.path.relpath(OUT),
    ]  # fmt: skip
    code = specpilot(args)
    if code != 0:
        raise SystemExit(f"specpilot bench exited {code}")
    report = json.loads(OUT.read_text(encoding="utf-8"))
    (RESULTS / "entry_caution.md").write_text(markdown(report), encoding="utf-8")


if __name__ == "__main__":
    main()
