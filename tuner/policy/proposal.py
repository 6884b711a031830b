"""A proposal: a config the tuner would move to, and the trial most worth making.

Contract: `Proposal` is what propose hands the gate; `explore(scored, current, running,
settings)` picks, among scored predictions (in the objective's tokens/s units), the trial with
the largest expected improvement whose downside is bounded, or None. Pure.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from specpilot.tuner._model.acquisition import expected_improvement, probability_of_improvement
from specpilot.tuner._model.surrogate import Prediction
from specpilot.tuner.policy.settings import TunerSettings
from specpilot.tuner.spec_config import SpecConfig


@dataclass(frozen=True, slots=True, kw_only=True)
class Proposal:
    """A config the tuner would move to, with what it expects from the move."""

    config: SpecConfig
    prediction: Prediction
    """Its (planned) prediction at the window's load."""
    improvement: float
    """Tokens/s over the running config: predicted, or a trial's weighted expected improvement."""
    gain: float
    """`improvement` relative to the running config's rate."""
    trial_failure: float = 0.0
    """Chance a trial turns out slower (0 when the config is predicted faster on the mean)."""
    why: str
    """The reason's opening: predicted faster, or exploring."""
    speed_gain: float | None = None
    """Per-sequence speed (1 / per-token latency) gain predicted at the offered load, where the
    objective's `gain` is something else (latency: it prices overload); None: `gain` is it."""
    for_capacity: bool = False
    """Made because the running config cannot keep up with the load ahead: per-sequence speed
    is not what it promises (under a queue the batch grows whatever the config)."""
    detail: str | None = None
    """What the objective compared, for the decision's reason (None: tokens/s at the batch)."""


def explore(
    scored: Sequence[tuple[SpecConfig, Prediction]],
    current: SpecConfig,
    now_pred: Prediction,
    settings: TunerSettings,
) -> tuple[SpecConfig, Prediction, float, float] | None:
    """The trial most worth making when no config is predicted better on the mean.

    A candidate's log rate is taken as normal around its prediction with the surrogate's
    uncertainty; its expected improvement over the running config's (scikit-optimize's
    `gaussian_ei`, in log units: about the relative gain a trial buys), times the running rate
    and `exploration`, is what a trial buys in tokens/s. Only candidates whose pessimistic
    prediction (one sd down) is within `max_downside` of the running config are tried. Returns
    the config, its prediction, the weighted expected improvement and the chance it turns out
    slower.
    """
    if settings.exploration <= 0:
        return None
    floor = (1 - settings.max_downside) * now_pred.tokens_per_s
    trials = [
        (config, pred)
        for config, pred in scored
        if config != current
        and pred.uncertainty > 0
        and pred.tokens_per_s * math.exp(-pred.uncertainty) >= floor
    ]
    if not trials:
        return None
    means = [math.log(pred.tokens_per_s) for _, pred in trials]
    stds = [pred.uncertainty for _, pred in trials]
    running = math.log(now_pred.tokens_per_s)
    gains = expected_improvement(means, stds, running, xi=0.0)
    wins = probability_of_improvement(means, stds, running, xi=0.0)
    best = max(range(len(trials)), key=lambda i: float(gains[i]))  # the first, on a tie
    config, pred = trials[best]
    improvement = settings.exploration * now_pred.tokens_per_s * float(gains[best])
    return config, pred, improvement, 1.0 - float(wins[best])
