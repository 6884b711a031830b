"""`specpilot bench`: every policy on one trace in fast mode, and the oracle.

Policies, all on the same trace and seed: no speculation; every static config in the space;
vLLM's documented EAGLE-3 per-batch table ([1-16]:5, [17-32]:4, [33-64]:3, [65-128]:1,
[129+]:0); SpecPilot (the tuner with the emulator's restart cost); and the oracle: a replay
that switches, free and ahead of time, to the config whose static run had the best goodput in
each window (hindsight per window; a window's goodput counts the requests that finished in
it); its switches keep the running requests' KV cache, so they cost nothing. With the SGLang
dialect, SGLang's default adaptive buckets (EAGLE-3 starting at K=3) replace vLLM's table.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from specpilot.runtime.emulator.core import DEFAULT_MAX_NUM_SEQS
from specpilot.runtime.emulator.fast_replay import Policy, TraceResult, run_trace, static
from specpilot.runtime.engines import get_adapter
from specpilot.runtime.traces import Trace, load_trace
from specpilot.tuner import (
    Observation,
    SpecConfig,
    StepCost,
    TunerSettings,
    TunerState,
    decide,
    prior_curves,
)

DRAFT = "emulated-eagle3-draft"
VLLM_EAGLE3_TABLE = SpecConfig(
    method="eagle3",
    num_speculative_tokens=5,
    draft_model=DRAFT,
    schedule=((1, 16, 5), (17, 32, 4), (33, 64, 3), (65, 128, 1), (129, 1024, 0)),
)
SGLANG_DEFAULT_ADAPTIVE = SpecConfig(
    method="eagle3", num_speculative_tokens=3, draft_model=DRAFT, engine_adaptive=True
)
SPACE = (
    SpecConfig(),
    *(
        SpecConfig(method="eagle3", num_speculative_tokens=k, draft_model=DRAFT)
        for k in range(1, 6)
    ),
    SpecConfig(method="ngram", num_speculative_tokens=3),
)


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("bench", help="every policy and the oracle on a trace (fast mode)")
    parser.add_argument("--trace", required=True, help="CSV: t,rps,<task>,...")
    parser.add_argument("--gpu", default="H100")
    parser.add_argument("--model-profile", default="llama-3.1-8b")
    parser.add_argument("--engine", default="vllm", choices=["vllm", "sglang"])
    parser.add_argument("--window", type=float, default=60.0, help="seconds per decision")
    parser.add_argument("--slo-tpot-ms", type=float, default=50.0)
    parser.add_argument("--restart-downtime", type=float, default=30.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", dest="json_out", help="write the report to this file")
    parser.set_defaults(run=run)


def tuner_policy(
    cost: StepCost, space: tuple[SpecConfig, ...], downtime_s: float, slo_s: float
) -> tuple[Policy, list[str]]:
    priors = prior_curves(space)
    settings = TunerSettings(
        candidates=space,
        min_dwell_s=120.0,
        restart_budget_per_hour=4,
        restart_downtime_s=downtime_s,
        expected_dwell_s=600.0,
        slo_tpot_p95_s=slo_s,
        kv_capacity_tokens=cost.kv_capacity_tokens(),
    )
    holder = {"state": TunerState.initial(SpecConfig(), 0.0, priors)}
    reasons: list[str] = []

    def policy(obs: Observation, _current: SpecConfig, now: float) -> SpecConfig:
        decision, holder["state"] = decide(obs, holder["state"], settings, cost, now)
        if decision.action != "stay":
            reasons.append(f"t={now:.0f}s {decision.reason}")
        return decision.config

    return policy, reasons


def bench(
    trace: Trace,
    *,
    gpu: str,
    profile: str,
    engine: str,
    window_s: float,
    slo_s: float,
    downtime_s: float,
    seed: int,
) -> dict[str, object]:
    cost = StepCost.for_hardware(gpu, profile)
    adapter = get_adapter(engine)
    space = tuple(c for c in SPACE if _runs_on(adapter, c))

    def replay(
        policy: Policy, initial: SpecConfig, name: str, downtime: float, *, free: bool = False
    ) -> TraceResult:
        return run_trace(
            trace,
            policy,
            initial,
            cost,
            name=name,
            engine=engine,
            window_s=window_s,
            restart_downtime_s=downtime,
            slo_tpot_s=slo_s,
            seed=seed,
            free_switches=free,
        )

    results: list[TraceResult] = []
    engine_baseline = VLLM_EAGLE3_TABLE if engine == "vllm" else SGLANG_DEFAULT_ADAPTIVE
    statics = [*space, engine_baseline]
    for config in statics:
        label = {
            VLLM_EAGLE3_TABLE: "vllm-eagle3-table",
            SGLANG_DEFAULT_ADAPTIVE: "sglang-default-adaptive",
        }.get(config, config.describe())
        results.append(replay(static(config), config, label, downtime_s))
    policy, reasons = tuner_policy(cost, space, downtime_s, slo_s)
    pilot = replay(policy, SpecConfig(), "specpilot", downtime_s)
    # The oracle replays the trace switching, for free and ahead of time, to the config whose
    # static run had the best goodput in each window.
    best_by_window = [
        statics[_best_in_window(results, i)] for i in range(len(pilot.window_goodput) + 1)
    ]

    def oracle_policy(_obs: Observation, _current: SpecConfig, now: float) -> SpecConfig:
        return best_by_window[min(round(now / window_s), len(best_by_window) - 1)]

    oracle = replay(oracle_policy, best_by_window[0], "oracle", 0.0, free=True).goodput_tok_s
    best_static = max(results, key=lambda r: r.goodput_tok_s)
    plain = results[0]  # the space starts with no speculation
    return {
        "trace": trace.name,
        "gpu": gpu,
        "model_profile": profile,
        "engine": engine,
        "slo_tpot_ms": slo_s * 1e3,
        "duration_s": trace.duration_s,
        "policies": [r.to_dict() for r in [*results, pilot]],
        "oracle_goodput_tok_s": round(oracle, 2),
        "best_static": best_static.name,
        "specpilot_vs_oracle": round(pilot.goodput_tok_s / oracle, 4) if oracle else None,
        "specpilot_vs_best_static": round(pilot.goodput_tok_s / best_static.goodput_tok_s, 4),
        # How far any policy could get ahead of the best static config on this trace.
        "oracle_vs_best_static": round(oracle / best_static.goodput_tok_s, 4),
        "saturation": _at_saturation(pilot, plain),
        "specpilot_decisions": reasons,
        "specpilot_configs_by_window": pilot.configs,
    }


def _at_saturation(pilot: TraceResult, plain: TraceResult) -> dict[str, object]:
    """SpecPilot against no speculation in the windows where the plain engine ran full
    (mean running requests at 90% of max-num-seqs or more): the aggregate goodput ratio there
    and the worst single window's."""
    full = [
        i
        for i, batch in enumerate(plain.window_batch)
        if batch >= 0.9 * DEFAULT_MAX_NUM_SEQS and i < len(pilot.window_goodput)
    ]
    plain_good = sum(plain.window_goodput[i] for i in full)
    pilot_good = sum(pilot.window_goodput[i] for i in full)
    ratios = [
        pilot.window_goodput[i] / plain.window_goodput[i] for i in full if plain.window_goodput[i]
    ]
    return {
        "windows": len(full),
        "specpilot_vs_no_speculation": (round(pilot_good / plain_good, 4) if plain_good else None),
        "worst_window": round(min(ratios), 4) if ratios else None,
    }


def _best_in_window(results: list[TraceResult], index: int) -> int:
    def goodput(j: int) -> float:
        windows = results[j].window_goodput
        return windows[index] if index < len(windows) else 0.0

    return max(range(len(results)), key=goodput)


def _runs_on(adapter: object, config: SpecConfig) -> bool:
    try:
        adapter.check(config)  # type: ignore[attr-defined]
    except ValueError:
        return False
    return True


def run(ns: argparse.Namespace) -> int:
    report = bench(
        load_trace(ns.trace),
        gpu=ns.gpu,
        profile=ns.model_profile,
        engine=ns.engine,
        window_s=ns.window,
        slo_s=ns.slo_tpot_ms / 1e3,
        downtime_s=ns.restart_downtime,
        seed=ns.seed,
    )
    text = json.dumps(report, indent=2)
    if ns.json_out:
        Path(ns.json_out).write_text(text + "\n", encoding="utf-8")
    print(text)
    return 0
