"""The ablations' stand-ins: what the tuner did before a component was there to learn.

Contract: `average_acceptance(state, config, observation)` is the acceptance model the posterior
replaced, kept so the bench can measure what the posterior buys (`TunerSettings.
acceptance_model = "moving-average"`): the running method's acceptance length, moved towards
the window's by a fixed rate (AVERAGE_RATE) and turned back into p at the method's prior r
(the chain's decay is never learned); a method that does not run keeps its estimate whatever
the traffic does. `average_curves(state)` and `average_sd(state)` are what it predicts with:
the curves as stored, and the prior's spread narrowed by the windows measured. Pure.
"""

from __future__ import annotations

import math
from dataclasses import replace

from specpilot.tuner._model.acceptance import AcceptanceCurve, p_for_length
from specpilot.tuner.observation import Observation
from specpilot.tuner.spec_config import SpecConfig
from specpilot.tuner.state import MAX_ACCEPTANCE_SUPPORT, TunerState

AVERAGE_RATE = 0.3
"""The moving average's weight on the newest window (the tuner's before the posterior)."""


def average_acceptance(state: TunerState, config: SpecConfig, obs: Observation) -> TunerState:
    length = obs.acceptance_length
    batch = obs.running_requests
    if not config.speculative or length is None or not math.isfinite(length) or length < 1.0:
        return state
    k = config.k_for_batch(max(1, round(batch))) if batch and math.isfinite(batch) else 0
    if k <= 0:
        return state
    curves = dict(average_curves(state))
    curve = curves.get(config.method)
    if curve is None:
        return state
    blended = (1 - AVERAGE_RATE) * curve.expected_length(k) + AVERAGE_RATE * min(length, k + 1.0)
    curves[config.method] = AcceptanceCurve(p_for_length(blended, k, curve.r), curve.r)
    support = dict(state.acceptance_support)
    support[config.method] = min(support.get(config.method, 0.0) + 1, MAX_ACCEPTANCE_SUPPORT)
    return replace(
        state,
        acceptance=tuple(sorted((m, c.p, c.r) for m, c in curves.items())),
        acceptance_support=tuple(sorted(support.items())),
    )


def average_curves(state: TunerState) -> dict[str, AcceptanceCurve]:
    return {m: AcceptanceCurve(p, r) for m, p, r in state.acceptance}


def average_sd(state: TunerState) -> dict[str, float]:
    """The prior's spread of p (this model never holds counts), over the square root of one
    plus the windows measured."""
    prior_sd = state.acceptance_sd()
    windows = dict(state.acceptance_support)
    return {m: sd / math.sqrt(1.0 + windows.get(m, 0.0)) for m, sd in prior_sd.items()}
