"""The bench's report: every policy's serving metrics per world, and the summary over worlds.

Contract: `world_report(runs, setup)` turns one world's `PolicyRun`s into per-policy serving
summaries (runtime/serving_metrics.py: TTFT, TPOT, ITL, E2EL, attainment at three tiers,
goodput) plus per-window ones, and adds the hindsight reference: in each window (by arrival),
the requests of the static config whose mean E2E latency was lowest there, switched for free
(a reference, not an upper bound: it ignores what a switch costs and what a window inherits).
`summary(world_reports)` is the top-level list, one entry per policy, each figure the median
over worlds, plus `worst_world_e2el_ratio_vs_no_spec` (the largest, over worlds, of the
policy's mean E2E latency over no speculation's in the same world). `against_fixed` counts
the worlds where SpecPilot's mean E2E latency is below every fixed policy's (and, for
hindsight, where switching at all could have paid); `settled_against_static` compares a
policy with the best static config over the later half of each run (`settled_mean`).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from specpilot.operator.app.bench.policies import HINDSIGHT, NO_SPEC, SPECPILOT, TUNED
from specpilot.operator.app.bench.run import PolicyRun
from specpilot.runtime.serving_metrics import (
    ItlHistogram,
    RequestRecord,
    ServingSummary,
    per_window,
    summarize,
)

NOT_STATIC = (SPECPILOT, *TUNED, "vllm-eagle3-table", "sglang-adaptive", "tuned-schedule")
"""Policies that are not one static config of the space: hindsight picks among the others."""


def world_report(
    runs: Sequence[PolicyRun], *, duration_s: float, window_s: float
) -> dict[str, Any]:
    policies: dict[str, Any] = {}
    windows: dict[str, list[ServingSummary]] = {}
    for run in runs:
        itl = ItlHistogram()
        itl.merge(run.itl)
        overall = summarize(run.records, duration_s, itl=itl, trace_end_s=duration_s)
        windows[run.policy] = per_window(run.records, window_s, duration_s)
        policies[run.policy] = {
            **overall.to_dict(),
            "restarts": run.restarts,
            "configs_by_window": run.configs_by_window,
            "decisions": run.decisions,
            "windows": [_window_brief(w) for w in windows[run.policy]],
        }
    statics = [r for r in runs if r.policy not in NOT_STATIC]
    if statics:
        hindsight_records, chosen = _hindsight(statics, windows, window_s)
        overall = summarize(hindsight_records, duration_s, trace_end_s=duration_s)
        policies[HINDSIGHT] = {
            **overall.to_dict(),
            "restarts": 0,
            "configs_by_window": chosen,
            "decisions": [],
            "windows": [
                _window_brief(w) for w in per_window(hindsight_records, window_s, duration_s)
            ],
            "note": "reference, not an upper bound: free switches, best static per window",
        }
    return policies


def summary(world_reports: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    names = list(world_reports[0]) if world_reports else []
    out: list[dict[str, Any]] = []
    for name in names:
        rows = [w[name] for w in world_reports if name in w]

        def median(key: str, rows: list[Any] = rows) -> float:
            return round(statistics.median(float(r[key]) for r in rows), 3)

        def median_tier(key: str, rows: list[Any] = rows) -> dict[str, float]:
            tiers = rows[0][key]
            return {t: round(statistics.median(float(r[key][t]) for r in rows), 4) for t in tiers}

        ratios = [
            w[name]["e2el_ms_mean"] / w[NO_SPEC]["e2el_ms_mean"]
            for w in world_reports
            if name in w and NO_SPEC in w and w[NO_SPEC]["e2el_ms_mean"] > 0
        ]
        out.append(
            {
                "policy": name,
                "e2el_ms_mean": median("e2el_ms_mean"),
                "e2el_ms_p99": median("e2el_ms_p99"),
                "tpot_ms_mean": median("tpot_ms_mean"),
                "ttft_ms_p99": median("ttft_ms_p99"),
                "slo_attainment": median_tier("slo_attainment"),
                "restarts": statistics.median(r["restarts"] for r in rows),
                "worst_world_e2el_ratio_vs_no_spec": round(max(ratios), 4) if ratios else None,
            }
        )
    return out


def against_fixed(
    world_reports: Sequence[Mapping[str, Any]], policy: str = SPECPILOT, below: float = 1.0
) -> dict[str, Any] | None:
    """How `policy`'s mean E2E latency compares, world by world, with every fixed policy (each
    static config and each engine baseline; not the tuner's variants, not hindsight): in how
    many worlds its ratio to the best of them is under `below` (1: below all of them, the
    yardstick's "in at least 8 of 10 worlds"), and that ratio's spread over the worlds. None
    without such worlds."""
    ratios = []
    for policies in world_reports:
        fixed = [
            float(v["e2el_ms_mean"])
            for name, v in policies.items()
            if name not in (SPECPILOT, *TUNED, HINDSIGHT) and float(v["e2el_ms_mean"]) > 0
        ]
        if policy in policies and fixed:
            ratios.append(float(policies[policy]["e2el_ms_mean"]) / min(fixed))
    if not ratios:
        return None
    return {
        "worlds": len(ratios),
        "below_every_fixed": sum(r < below for r in ratios),
        "ratio_to_best_fixed": {
            "min": round(min(ratios), 3),
            "median": round(statistics.median(ratios), 3),
            "max": round(max(ratios), 3),
        },
    }


def settled_mean(policy: Mapping[str, Any], key: str) -> float | None:
    """`key` (a per-request mean) over the later half of a policy's windows by arrival,
    weighed by their requests: what the policy settled on, once a tuner's start and first
    moves are behind it. None without requests there."""
    windows = policy.get("windows") or []
    later = [w for w in windows[len(windows) // 2 :] if w["requests"]]
    requests = sum(w["requests"] for w in later)
    return sum(float(w[key]) * w["requests"] for w in later) / requests if requests else None


def settled_against_static(
    world_reports: Sequence[Mapping[str, Any]],
    key: str,
    policy: str = SPECPILOT,
    within: float = 0.05,
) -> dict[str, Any] | None:
    """`policy`'s settled `key` (`settled_mean`) over the lowest settled `key` of any static
    config (speculation off included; no engine baseline, no tuner variant), world by world:
    in how many worlds it is within `within` of it (the yardstick's "below 30% of capacity,
    mean TPOT within 5% of the best static config"), and that ratio's spread. None without
    such worlds."""
    ratios = []
    for policies in world_reports:
        statics = [
            settled_mean(v, key)
            for name, v in policies.items()
            if name not in (*NOT_STATIC, HINDSIGHT)
        ]
        best = min((v for v in statics if v), default=None)
        mine = settled_mean(policies[policy], key) if policy in policies else None
        if best and mine is not None:
            ratios.append(mine / best)
    if not ratios:
        return None
    return {
        "worlds": len(ratios),
        "within": sum(r <= 1.0 + within for r in ratios),
        "ratio_to_best_static": {
            "median": round(statistics.median(ratios), 3),
            "max": round(max(ratios), 3),
        },
    }


def markdown(entries: Sequence[Mapping[str, Any]]) -> str:
    lines = [
        "| policy | E2EL mean ms | E2EL p99 ms | TPOT mean ms | TTFT p99 ms "
        "| attain tight | standard | relaxed | restarts | worst world E2EL / no-spec |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for e in entries:
        a = e["slo_attainment"]
        worst = e["worst_world_e2el_ratio_vs_no_spec"]
        lines.append(
            f"| {e['policy']} | {e['e2el_ms_mean']:.0f} | {e['e2el_ms_p99']:.0f} "
            f"| {e['tpot_ms_mean']:.2f} | {e['ttft_ms_p99']:.0f} | {a['tight']:.3f} "
            f"| {a['standard']:.3f} | {a['relaxed']:.3f} | {e['restarts']:g} "
            f"| {'-' if worst is None else f'{worst:.3f}'} |"
        )
    return "\n".join(lines) + "\n"


def _window_brief(window: ServingSummary) -> dict[str, Any]:
    d = window.to_dict()
    return {
        key: d[key]
        for key in (
            "requests",
            "output_tok_s",
            "e2el_ms_mean",
            "tpot_ms_mean",
            "ttft_ms_p99",
            "slo_attainment",
        )
    }


def _hindsight(
    statics: Sequence[PolicyRun],
    windows: Mapping[str, Sequence[ServingSummary]],
    window_s: float,
) -> tuple[list[RequestRecord], list[str]]:
    count = max(len(windows[r.policy]) for r in statics)
    chosen: list[str] = []
    records: list[RequestRecord] = []
    for index in range(count):

        def latency(run: PolicyRun, index: int = index) -> float:
            ws = windows[run.policy]
            if index >= len(ws) or ws[index].requests == 0:
                return 0.0
            return ws[index].e2el_ms_mean

        best = min(statics, key=latency)
        chosen.append(best.policy)
        low, high = index * window_s, (index + 1) * window_s
        records += [r for r in best.records if low <= r.arrival_s < high]
    return records, chosen
