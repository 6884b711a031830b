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
    """Made because the running config cannot keep up with the load ahead (a trial too, when
    it leaves such a config): per-sequence speed is not what it promises (under a queue the
    batch grows whatever the config)."""
    on_forecast: bool = False
    """Made for capacity that only the forecast load needs: the running config keeps up with
    every load seen (today's demand with its queue, the recent peak)."""
    detail: str | None = None
    """What the objective compared, for the decision's reason (None: tokens/s at the batch)."""
    trial: bool = False
    """Made to learn (an exploration), not because it is predicted better on the mean."""
    headroom: float | None = None
    """The config's capacity one sd down over the demand ahead (None: the objective does not
    price capacity): how far the load could rise before the move would need undoing."""
    mean_headroom: float | None = None
    """The same at the capacity's mean (`gate.early_first_move` reads it over a steady
    window)."""
    running_capacity: float | None = None
    """The running config's capacity as the objective read it, where it keeps up with today's
    demand (None under a queue, or where the objective does not price capacity): for a move
    made for the load ahead, what the tuner believed the config it leaves could serve
    (`decision.exit_ceiling`)."""
    baseline_capacity: float | None = None
    """No speculation's capacity as the objective read it in this window (None where the
    objective does not price capacity or the space has no plain server): a method left for
    capacity is held to what it showed relative to this (`TunerState.capacity_exits`)."""


Trial = tuple[SpecConfig, Prediction, float, float]
"""`explore`'s pick: the config, its prediction, its net value in tokens/s, its chance of
turning out slower."""


def explore(
    scored: Sequence[tuple[SpecConfig, Prediction]],
    current: SpecConfig,
    now_pred: Prediction,
    settings: TunerSettings,
) -> Trial | None:
    """The trial most worth making when no config is predicted better on the mean.

    A trial is bounded in time, not in how bad its config may turn out: the loop measures it
    in its first window and the tuner undoes it once the dwell allows (`trial_span_s`). So a
    candidate's log rate is taken as normal around its prediction with the surrogate's
    uncertainty, and a trial is worth what it is expected to gain over the expected dwell
    (scikit-optimize's `gaussian_ei`, in log units: about the relative gain) less what it is
    expected to lose while it runs (the same expectation of the shortfall, over the trial's
    span, times the share of the traffic the trial runs on: `settings.trial_share`):
    `net_trial_value`. Only candidates whose expected loss over the dwell stays within
    `max_downside` are tried (a config priced as overloaded by the latency objective never
    is). Returns the config, its prediction, the net value in tokens/s (times `exploration`)
    and the chance it turns out slower; None when no trial has a positive net value.
    """
    if settings.exploration <= 0 or settings.expected_dwell_s <= 0:
        return None  # nothing to learn for, or no horizon for a gain to count over
    trials = [
        (config, pred)
        for config, pred in scored
        if config != current and pred.uncertainty > 0 and pred.tokens_per_s > 0
    ]
    if not trials:
        return None
    means = [math.log(pred.tokens_per_s) for _, pred in trials]
    stds = [pred.uncertainty for _, pred in trials]
    running = math.log(now_pred.tokens_per_s)
    gains = expected_improvement(means, stds, running, xi=0.0)
    # the expected shortfall is the expected improvement of the running config over it
    losses = expected_improvement([-m for m in means], stds, -running, xi=0.0)
    wins = probability_of_improvement(means, stds, running, xi=0.0)
    # a trial on a canary risks only the canary's share of the traffic while it runs
    share = settings.trial_share * trial_span_s(settings) / settings.expected_dwell_s
    values = [
        net_trial_value(float(gain), float(loss), share, settings)
        for gain, loss in zip(gains, losses, strict=True)
    ]
    best = max(range(len(trials)), key=lambda i: values[i])  # the first, on a tie
    if values[best] <= 0:
        return None
    config, pred = trials[best]
    improvement = now_pred.tokens_per_s * values[best]
    return config, pred, improvement, 1.0 - float(wins[best])


def trial_span_s(settings: TunerSettings) -> float:
    """How long a disappointing trial runs before the tuner may undo it: the minimum dwell,
    and at least the window that measures it."""
    return max(settings.min_dwell_s, settings.window_s)


def net_trial_value(gain: float, loss: float, share: float, settings: TunerSettings) -> float:
    """A trial's expected relative gain over the dwell less its expected relative loss over its
    span (`share` of the dwell), times `exploration`; -inf when that loss exceeds
    `max_downside`."""
    if loss * share > settings.max_downside:
        return -math.inf
    return settings.exploration * gain - loss * share


def outweighs(trial: Trial | None, mean_improvement: float) -> bool:
    """Whether a trial is worth more than the move predicted better on the mean: a move too
    small to clear the gate may still be worth making for what it would teach."""
    return trial is not None and trial[2] > mean_improvement


def trial_proposal(
    trial: Trial,
    running_rate: float,
    settings: TunerSettings,
    *,
    speed_gain: float | None = None,
    detail: str | None = None,
    for_capacity: bool = False,
    baseline_capacity: float | None = None,
) -> Proposal:
    """The proposal of a trial, in the gate's units (`running_rate`: the running config's)."""
    config, prediction, improvement, trial_failure = trial
    return Proposal(
        config=config,
        prediction=prediction,
        improvement=improvement,
        gain=improvement / running_rate,
        trial_failure=trial_failure,
        trial=True,
        why=(
            f"exploring (expected improvement less the expected loss over a "
            f"{trial_span_s(settings):.0f}s trial, {trial_failure:.0%} chance it is slower)"
        ),
        speed_gain=speed_gain,
        detail=detail,
        for_capacity=for_capacity,
        baseline_capacity=baseline_capacity,
    )
