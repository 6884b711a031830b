"""The tuner's surrogate: physics prior x learned correction, per config and load.

Contract: `Surrogate.predict(config, batch, context_tokens)` returns the predicted decode
throughput, per-token latency and regime for `config` serving `batch` concurrent requests of
`context_tokens` each. The prior is the speculative arithmetic: expected tokens per step from
the method's acceptance estimate and the K the schedule gives at that batch, over the step
time (verification of batch x (K+1) tokens plus drafting, from `StepCost`). The correction is
learned from what was measured: a Gaussian process (scikit-optimize) on the log ratio of
measured to prior throughput over (method, K, log batch), with its uncertainty; a step-time
factor learned from every observation corrects the hardware model for all configs at once.
Prefill is not in the prior (decode-bound serving); the correction absorbs what it costs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from specpilot.tuner.acceptance import AcceptanceCurve
from specpilot.tuner.spec_config import SPEC_METHODS, SpecConfig
from specpilot.tuner.step_cost import StepCost

Regime = Literal["memory-bound", "transition", "compute-bound"]


def regime_of(tokens_per_step: float, knee_tokens: float) -> Regime:
    """Memory-bound well below the knee, compute-bound well above, a transition between."""
    if tokens_per_step < 0.5 * knee_tokens:
        return "memory-bound"
    if tokens_per_step > 1.5 * knee_tokens:
        return "compute-bound"
    return "transition"


@dataclass(frozen=True, slots=True)
class Prediction:
    tokens_per_s: float
    tpot_s: float
    """Per-token latency of one request: step time over tokens per step."""
    step_s: float
    k: int
    tokens_per_step: float
    regime: Regime
    uncertainty: float
    """Std of the log-throughput correction (0 where nothing was learned, prior only)."""


@dataclass(frozen=True, slots=True)
class ResidualPoint:
    """Mean log(measured / prior) for one config at one load bucket, and its weight."""

    config: SpecConfig
    log2_batch: int
    mean: float
    weight: float


class Surrogate:
    """Prior from physics, residual from a GP fitted to the bounded residual summaries."""

    def __init__(
        self,
        cost: StepCost,
        acceptance: Mapping[str, AcceptanceCurve],
        *,
        step_factor: float = 1.0,
        residuals: tuple[ResidualPoint, ...] = (),
    ) -> None:
        self.cost = cost
        self.acceptance = acceptance
        self.step_factor = step_factor
        self._gp = _fit_gp(residuals)

    def prior(self, config: SpecConfig, batch: float, context_tokens: float) -> Prediction:
        batch_n = max(1, round(batch))
        k = config.k_for_batch(batch_n)
        curve = self.acceptance.get(config.method)
        length = curve.expected_length(k) if (curve is not None and k > 0) else 1.0
        step = self.step_factor * self.cost.step_time(
            method=config.method if k > 0 else "none",
            decode_batch=batch_n,
            k=k,
            prefill_tokens=0,
            kv_tokens=round(batch_n * context_tokens),
        )
        tokens_per_step = batch_n * (k + 1)
        return Prediction(
            tokens_per_s=batch_n * length / step,
            tpot_s=step / length,
            step_s=step,
            k=k,
            tokens_per_step=tokens_per_step,
            regime=regime_of(tokens_per_step, self.cost.step_model.knee_tokens),
            uncertainty=0.0,
        )

    def predict(self, config: SpecConfig, batch: float, context_tokens: float) -> Prediction:
        prior = self.prior(config, batch, context_tokens)
        if self._gp is None:
            return prior
        mean, std = self._gp.predict([_features(config, batch)], return_std=True)
        factor = math.exp(float(mean[0]))
        return Prediction(
            tokens_per_s=prior.tokens_per_s * factor,
            tpot_s=prior.tpot_s / factor,
            step_s=prior.step_s / factor,
            k=prior.k,
            tokens_per_step=prior.tokens_per_step,
            regime=prior.regime,
            uncertainty=float(std[0]),
        )


def _features(config: SpecConfig, batch: float) -> list[float]:
    method_index = [1.0 if config.method == m else 0.0 for m in SPEC_METHODS]
    scheduled = 1.0 if config.schedule is not None else 0.0
    return [*method_index, config.max_k / 4.0, math.log2(max(batch, 1.0)) / 4.0, scheduled]


def _fit_gp(points: tuple[ResidualPoint, ...]):  # type: ignore[no-untyped-def]
    if not points:
        return None
    from skopt.learning import GaussianProcessRegressor
    from skopt.learning.gaussian_process.kernels import RBF, ConstantKernel

    # Fixed hyperparameters: a few dozen noisy summaries do not support fitting them, and a
    # fixed kernel keeps each decision cheap. Noise shrinks with a summary's support.
    kernel = ConstantKernel(0.05, "fixed") * RBF(1.0, "fixed")
    import numpy as np

    noise = np.array([0.01 / p.weight for p in points])
    gp = GaussianProcessRegressor(kernel=kernel, alpha=noise, normalize_y=False, random_state=0)
    x = [_features(p.config, 2.0**p.log2_batch) for p in points]
    y = [p.mean for p in points]
    gp.fit(x, y)
    return gp
