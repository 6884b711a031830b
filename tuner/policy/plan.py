"""Plan ahead: where the load is heading, and each config's merit over the dwell if it moves.

Contract: `forecast_batch(recent, settings)` extrapolates the last windows' batch (None while
the load is steady); `trend_holds(recent)` says whether the last window still moved with that
trend; `plan_ahead(...)` rescales each scored prediction by its merit over the dwell, so a
config that will need a restart at the forecast load pays for it now. Pure.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from specpilot.tuner._model.step_cost import StepCost
from specpilot.tuner._model.surrogate import Prediction, Surrogate
from specpilot.tuner.policy.costs import saturating, switch_cost
from specpilot.tuner.policy.settings import TunerSettings
from specpilot.tuner.spec_config import SpecConfig


def forecast_batch(recent: Sequence[float], settings: TunerSettings) -> float | None:
    """Where the load is heading over the next half dwell, if it is clearly moving.

    The geometric trend of the last windows' batch, extrapolated and bounded (at most 16x either
    way, at most max-num-seqs); None when the load is steady (under 25% change forecast).
    """
    if len(recent) < 3 or min(recent) <= 0:
        return None
    steps = len(recent) - 1
    growth = math.pow(recent[-1] / recent[0], 1 / steps)
    horizon_windows = max(1.0, settings.expected_dwell_s / 2 / settings.window_s)
    forecast = recent[-1] * min(max(math.pow(growth, horizon_windows), 1 / 16), 16.0)
    forecast = min(forecast, float(settings.max_batch))
    if abs(math.log(forecast / recent[-1])) < math.log(1.25):
        return None
    return forecast


def trend_holds(recent: Sequence[float]) -> bool:
    """Whether the last window moved the batch with the trend: at least half the trend's mean
    step (in log), the same way. A ramp does; a step change (a new phase of the traffic) moves
    once and then holds, which the trend over the last windows alone cannot tell from a ramp."""
    if len(recent) < 3 or min(recent) <= 0:
        return False
    trend = math.log(recent[-1] / recent[0]) / (len(recent) - 1)
    last = math.log(recent[-1] / recent[-2])
    return trend != 0 and last / trend >= 0.5


def plan_ahead(
    scored: Sequence[tuple[SpecConfig, Prediction]],
    surrogate: Surrogate,
    current: SpecConfig,
    now_pred: Prediction,
    forecast: float,
    context: float,
    cost: StepCost,
    settings: TunerSettings,
) -> tuple[list[tuple[SpecConfig, Prediction]], float]:
    """Each config's merit over the dwell ahead when the load is moving, relative to now.

    The merit weighs the forecast load twice as much as the present (most of the dwell is
    spent there), and a config that will not be near-best at the forecast pays, spread over
    the dwell, the restart it will need then: switching at a high load costs most, so it is
    better to arrive there already on the right config. Returns the planned predictions (rates
    scaled by merit) and the running config's own merit.
    """
    configs = [c for c, _ in scored]
    predictions = surrogate.predict_many([*configs, current], forecast, context)
    ahead = {c: p.tokens_per_s for c, p in zip(configs, predictions, strict=False)}
    ahead_current = predictions[-1].tokens_per_s
    best_ahead = max(ahead.values())
    later_switch = switch_cost(best_ahead, forecast, context, cost, settings) / (
        now_pred.tokens_per_s * settings.expected_dwell_s
    )
    tolerance = (
        settings.saturation_tolerance if saturating(forecast, settings) else settings.hysteresis
    )

    def merit(now_rate: float, ahead_rate: float) -> float:
        value = (now_rate / now_pred.tokens_per_s + 2 * ahead_rate / ahead_current) / 3
        return value - later_switch if best_ahead > ahead_rate * (1 + tolerance) else value

    planned = [
        (c, replace(p, tokens_per_s=now_pred.tokens_per_s * merit(p.tokens_per_s, ahead[c])))
        for c, p in scored
    ]
    return planned, merit(now_pred.tokens_per_s, ahead_current)
