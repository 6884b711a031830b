"""The tuner's surrogate: physics prior x learned correction, per config and load.

Contract: `Surrogate.predict(config, batch, context_tokens)` returns the predicted decode
throughput, per-token latency and regime for `config` serving `batch` concurrent requests of
`context_tokens` each. The prior is the speculative arithmetic: expected tokens per step from
the method's acceptance estimate and the K the schedule gives at that batch, over the step
time (verification of batch x (K+1) tokens plus drafting, from `StepCost`). The correction is
learned from what was measured: the log ratio of measured to prior throughput, summarised per
(config, batch bucket), is split into a shared offset (the support-weighted mean: how far the
hardware model is off for every config at once), a level per method (how far its own summaries
sit from the offset: the GP's mean for it, so far from where it was measured a method keeps
its level) and a Gaussian process (scikit-optimize) over (method, K, log batch, scheduled,
log context) on what those leave, its kernel's
hyperparameters fitted by marginal likelihood and the fit cached by its data
(`residual_gp`). With no residuals the prediction is the prior, with the prior's uncertainty.
The acceptance estimate's own uncertainty (`acceptance_sd`, per method) adds to it: a method
that has never run is uncertain even where the GP has data at that load.
Prefill is in the prior: each step also prefills the prompt tokens that arrive per output
token (`prefill_ratio`, measured), which is what makes verification compute-bound early under
prompt-heavy traffic; with the mean prompt measured (`prompt_tokens`), in lumps of a prompt.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from specpilot.tuner._model.acceptance import AcceptanceCurve
from specpilot.tuner._model.residual_gp import (
    ResidualFit,
    ResidualPoint,
    fit_residuals,
    shared_offset,
)
from specpilot.tuner._model.step_cost import StepCost
from specpilot.tuner.spec_config import SpecConfig

__all__ = ["Prediction", "Regime", "ResidualPoint", "Surrogate", "regime_of"]

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
    """Std of log throughput: the GP's, combined with the acceptance estimate's (0 for a
    config with nothing uncertain, e.g. no speculation before anything was learned)."""


class Surrogate:
    """Prior from physics, residual from a GP fitted to the bounded residual summaries."""

    def __init__(
        self,
        cost: StepCost,
        acceptance: Mapping[str, AcceptanceCurve],
        *,
        residuals: tuple[ResidualPoint, ...] = (),
        prefill_ratio: float = 0.0,
        prompt_tokens: float = 0.0,
        acceptance_sd: Mapping[str, float] | None = None,
        residual_gp: bool = True,
    ) -> None:
        """`residual_gp` False keeps the shared offset alone (an ablation of the GP);
        `prompt_tokens` (the traffic's mean prompt; 0: unknown) makes the prefill lumpy."""
        self.cost = cost
        self.acceptance = acceptance
        self.acceptance_sd = acceptance_sd or {}
        self.prefill_ratio = prefill_ratio
        self.prompt_tokens = prompt_tokens
        self.residual_fit: ResidualFit | None = fit_residuals(residuals) if residual_gp else None
        """The fitted correction (None: nothing measured yet, or the GP ablated); cached by its
        data."""
        self.offset = (
            self.residual_fit.offset if self.residual_fit is not None else shared_offset(residuals)
        )

    def prior(self, config: SpecConfig, batch: float, context_tokens: float) -> Prediction:
        batch_n = max(1, round(batch))
        k = config.k_for_batch(batch_n)
        curve = self.acceptance.get(config.method)
        length = curve.expected_length(k) if (curve is not None and k > 0) else 1.0
        step = self.cost.serving_step_time(
            method=config.method,  # a K=0 tier still pays the speculative path overhead
            decode_batch=batch_n,
            k=k,
            tokens_per_request=length,
            prefill_per_output_token=self.prefill_ratio,
            kv_tokens=round(batch_n * context_tokens),
            prompt_tokens=self.prompt_tokens,
        )
        tokens_per_step = batch_n * (k + 1)
        return Prediction(
            # A fractional mean batch is part-time idling: the engine steps at batch_n, less often.
            tokens_per_s=max(batch, 1e-3) * length / step,
            tpot_s=step / length,
            step_s=step,
            k=k,
            tokens_per_step=tokens_per_step,
            regime=regime_of(tokens_per_step, self.cost.step_model.knee_tokens),
            uncertainty=self._acceptance_uncertainty(config.method, k),
        )

    def _acceptance_uncertainty(self, method: str, k: int) -> float:
        """Half the log-length spread between p one sd up and one sd down: how much the
        throughput could move on what the acceptance estimate does not know."""
        curve = self.acceptance.get(method)
        sd = self.acceptance_sd.get(method, 0.0)
        if curve is None or k <= 0 or sd <= 0:
            return 0.0
        low, high = curve.length_range(k, sd)
        return math.log(high / low) / 2

    def predict(self, config: SpecConfig, batch: float, context_tokens: float) -> Prediction:
        return self.predict_many([config], batch, context_tokens)[0]

    def predict_many(
        self, configs: Sequence[SpecConfig], batch: float, context_tokens: float
    ) -> list[Prediction]:
        """`predict` for several configs at one load, with one pass through the GP."""
        priors = [self.prior(c, batch, context_tokens) for c in configs]
        if not configs or (self.residual_fit is None and not self.offset):
            return priors
        if self.residual_fit is not None:
            means, stds = self.residual_fit.predict(configs, batch, context_tokens)
        else:  # the GP ablated: every config corrected by the shared offset alone
            means, stds = [self.offset] * len(configs), [0.0] * len(configs)
        predictions = []
        for prior, mean, std in zip(priors, means, stds, strict=True):
            factor = math.exp(mean)  # the offset is in the mean
            predictions.append(
                Prediction(
                    tokens_per_s=prior.tokens_per_s * factor,
                    tpot_s=prior.tpot_s / factor,
                    step_s=prior.step_s / factor,
                    k=prior.k,
                    tokens_per_step=prior.tokens_per_step,
                    regime=prior.regime,
                    uncertainty=math.hypot(std, prior.uncertainty),
                )
            )
        return predictions
