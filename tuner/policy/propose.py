"""Propose: which config would be best now, and why, before asking whether to act.

Contract: `propose(belief, settings, cost, waiting)` hands the latency objective to
`latency_proposal`; for throughput and goodput it scores the space (the candidates plus, per method,
its largest K with a synthesised schedule) with the belief's surrogate at the window's load,
keeps those predicted to meet the per-token SLO (all of them when none does), and, when the
load is moving, rescales each by its merit over the dwell ahead (`plan.plan_ahead`). It returns
the running config's prediction (planned the same way) and a `Proposal`: the best config when
it is not the running one, or else the trial with the largest expected improvement whose
downside is bounded; None when neither exists; and, with None, why a config predicted faster
was passed over (the latency objective's; None for the others). Pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from specpilot.tuner._model.acceptance import AcceptanceCurve
from specpilot.tuner._model.schedule import synthesize_schedule
from specpilot.tuner._model.step_cost import StepCost
from specpilot.tuner._model.surrogate import Prediction, Surrogate
from specpilot.tuner.policy.latency_proposal import propose_for_latency
from specpilot.tuner.policy.learn import Belief
from specpilot.tuner.policy.plan import forecast_batch, plan_ahead
from specpilot.tuner.policy.proposal import Proposal, explore, outweighs, trial_proposal
from specpilot.tuner.policy.settings import TunerSettings
from specpilot.tuner.spec_config import SpecConfig
from specpilot.tuner.state import TunerState


def propose(
    belief: Belief, settings: TunerSettings, cost: StepCost, waiting: float = 0.0
) -> tuple[Prediction, Proposal | None, str | None]:
    """`waiting`: the window's mean queued requests (the latency objective reads the demand
    the served rate hides from it). The third element, with no proposal, says why a config
    predicted faster per token is not it (the latency objective's `passed_over` or
    `doubted_over`)."""
    state, surrogate, batch, context = belief.state, belief.surrogate, belief.batch, belief.context
    current = state.current
    space = _space(settings, belief.acceptance, cost, state.prefill_ratio, context)
    if settings.objective == "latency":
        return propose_for_latency(belief, space, settings, waiting)
    scored = _score(surrogate, space, batch, context, settings)
    running = surrogate.predict(current, batch, context)
    forecast = forecast_batch(state.recent_batches, settings)
    if forecast is not None:
        scored, current_merit = plan_ahead(
            scored, surrogate, current, running, forecast, context, cost, settings
        )
        # The running config is judged by the same plan: it too may face a restart ahead.
        running = replace(running, tokens_per_s=running.tokens_per_s * current_merit)
    best_config, best = max(scored, key=lambda item: item[1].tokens_per_s)
    trial = explore(scored, current, running, settings)
    if best_config != current and not outweighs(trial, best.tokens_per_s - running.tokens_per_s):
        why = "predicted faster"
        if forecast is not None:
            why += f" (load heading to batch {forecast:.0f})"
        return (
            running,
            Proposal(
                config=best_config,
                prediction=best,
                improvement=best.tokens_per_s - running.tokens_per_s,
                gain=best.tokens_per_s / running.tokens_per_s - 1.0,
                why=why,
            ),
            None,
        )
    if trial is None:
        return running, None, None
    return running, trial_proposal(trial, running.tokens_per_s, settings), None


def acceptance_note(
    config: SpecConfig, k: int, state: TunerState, acceptance: dict[str, AcceptanceCurve]
) -> str:
    """', acceptance 3.10+-0.42 (prior)': the length the prediction assumed at this K, its
    spread (p one sd either way) and whether it was measured."""
    curve = acceptance.get(config.method)
    if curve is None or k <= 0:
        return ""
    sd = state.acceptance_sd().get(config.method, 0.0)
    low, high = curve.length_range(k, sd)
    source = "measured" if config.method in dict(state.acceptance_support) else "prior"
    if state.drafted_nothing_since(config.method) is not None:
        source = "drafted nothing"
    return f", acceptance {curve.expected_length(k):.2f}+-{(high - low) / 2:.2f} ({source})"


def _space(
    settings: TunerSettings,
    acceptance: dict[str, AcceptanceCurve],
    cost: StepCost,
    prefill_ratio: float,
    context: float,
) -> list[SpecConfig]:
    space = list(settings.candidates)
    if settings.synthesize_schedules:
        by_method: dict[str, SpecConfig] = {}
        for config in settings.candidates:
            if config.speculative and config.max_k > by_method.get(config.method, config).max_k:
                by_method[config.method] = config
            by_method.setdefault(config.method, config)
        for config in by_method.values():
            curve = acceptance.get(config.method)
            if not config.speculative or curve is None or config.schedule is not None:
                continue
            schedule = synthesize_schedule(config, curve, cost, context, prefill_ratio)
            if schedule is None:
                continue
            top = max(k for _, _, k in schedule)
            static = replace(config, num_speculative_tokens=top, schedule=None)
            if static in space and all(k == top for _, _, k in schedule):
                # one K at every batch is that static config: as a config of its own it would
                # lack what the static one measured, and look better for it
                continue
            space.append(replace(config, num_speculative_tokens=top, schedule=schedule))
    return [c for c in space if c not in settings.excluded]


def _score(
    surrogate: Surrogate,
    space: Sequence[SpecConfig],
    batch: float,
    context: float,
    settings: TunerSettings,
) -> list[tuple[SpecConfig, Prediction]]:
    scored = list(zip(space, surrogate.predict_many(space, batch, context), strict=True))
    if settings.slo_tpot_p95_s is not None:
        within = [(c, p) for c, p in scored if p.tpot_s <= settings.slo_tpot_p95_s]
        scored = within or scored  # nothing meets the SLO: keep the fastest, and say so later
    return scored
