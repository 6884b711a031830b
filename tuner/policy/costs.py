"""What a restart costs, in output tokens, and where the saturation tolerance applies.

Contract: pure functions of the settings, the step-cost model and predictions. `switch_cost` is
the serving a restart loses (downtime plus recomputing the running context); `backlog_cost` is
what the backlog it leaves costs under the latency SLOs (zero without them); `saturating` tells
whether a load is at max-num-seqs, where a shortfall is a growing queue rather than a slowdown.
"""

from __future__ import annotations

from specpilot.tuner._model.step_cost import StepCost
from specpilot.tuner._model.surrogate import Surrogate
from specpilot.tuner.policy.settings import TunerSettings
from specpilot.tuner.spec_config import SpecConfig


def saturating(batch: float, settings: TunerSettings) -> bool:
    """At (or within 10% of) max-num-seqs, where the saturation tolerance applies."""
    return batch >= 0.9 * settings.max_batch


def switch_cost(
    tokens_per_s: float, batch: float, context: float, cost: StepCost, settings: TunerSettings
) -> float:
    """Tokens a restart loses: its downtime at the current rate, plus the time the new engine
    spends recomputing the running requests' context before it serves again."""
    recompute_s = batch * context * cost.step_model.per_token_s
    return (settings.restart_downtime_s + recompute_s) * tokens_per_s


def backlog_cost(
    config: SpecConfig,
    tokens_per_s: float,
    now_tpot_s: float,
    surrogate: Surrogate,
    context: float,
    settings: TunerSettings,
) -> float:
    """Tokens a restart's backlog costs under the latency SLOs (goodput counts only the
    requests that meet them); zero without SLOs.

    Requests keep arriving while the engine is down. The first ones wait the whole downtime
    for their first token: with a TTFT target shorter than the downtime, the requests that
    arrive during (downtime - target) miss it. Afterwards the engine serves the backlog at
    once, up to max-num-seqs, and it drains over downtime x rate / (capacity - rate): with a
    per-token target the engine meets now but `config` breaks at that batch, nothing served
    while it drains counts (near capacity, far longer than the downtime). A request that misses
    both targets is lost once: the larger of the two spans counts.
    """
    lost_s = 0.0
    tpot = settings.slo_tpot_p95_s
    if tpot is not None and now_tpot_s <= tpot:
        full = surrogate.predict(config, float(settings.max_batch), context)
        if full.tpot_s > tpot:
            spare = full.tokens_per_s - tokens_per_s
            lost_s = (
                settings.expected_dwell_s
                if spare <= 0
                else settings.restart_downtime_s * tokens_per_s / spare
            )
    ttft = settings.slo_ttft_p95_s
    if ttft is not None:
        lost_s = max(lost_s, settings.restart_downtime_s - ttft)
    return min(lost_s, settings.expected_dwell_s) * tokens_per_s
