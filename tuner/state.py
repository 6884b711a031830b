"""Tuner state: what the tuner has learned, as bounded JSON an operator can persist and resume.

Contract: `TunerState` is frozen; learning returns a new state. It holds the running config and
since when, recent restart times (the last hour's), per-method acceptance estimates, a global
step-time factor (hardware model vs measurement) and per-(config, batch bucket) residual
summaries, at most MAX_RESIDUALS of them (the least-supported are dropped first), so its JSON
stays small whatever the history length.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from specpilot.tuner.acceptance import AcceptanceCurve
from specpilot.tuner.observation import Observation
from specpilot.tuner.spec_config import SpecConfig
from specpilot.tuner.surrogate import ResidualPoint

MAX_RESIDUALS = 128
LEARNING_RATE = 0.3
"""Weight of a new window in the moving estimates (acceptance, step factor)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TunerState:
    current: SpecConfig
    since_s: float
    restarts: tuple[float, ...] = ()
    acceptance: tuple[tuple[str, float, float], ...] = ()
    """(method, p, r) per method: the prior until the method has run, then learned."""
    step_factor: float = 1.0
    residuals: tuple[ResidualPoint, ...] = ()

    @classmethod
    def initial(
        cls, current: SpecConfig, now: float, priors: Mapping[str, AcceptanceCurve]
    ) -> TunerState:
        return cls(
            current=current,
            since_s=now,
            acceptance=tuple(sorted((m, c.p, c.r) for m, c in priors.items())),
        )

    def acceptance_curves(self) -> dict[str, AcceptanceCurve]:
        return {method: AcceptanceCurve(p, r) for method, p, r in self.acceptance}

    def learn_acceptance(self, config: SpecConfig, obs: Observation, now: float) -> TunerState:
        """Blend the observed acceptance of the running method into its estimate."""
        length = obs.acceptance_length
        batch = obs.running_requests
        if not config.speculative or length is None or batch is None:
            return self
        k = config.k_for_batch(max(1, round(batch)))
        curves = self.acceptance_curves()
        prior = curves.get(config.method)
        if k == 0 or prior is None:
            return self
        observed_p = _solve_p(length, k, prior.r)
        p = (1 - LEARNING_RATE) * prior.p + LEARNING_RATE * observed_p
        curves[config.method] = AcceptanceCurve(p, prior.r)
        return replace(self, acceptance=tuple(sorted((m, c.p, c.r) for m, c in curves.items())))

    def learn_throughput(self, config: SpecConfig, batch: float, ratio: float) -> TunerState:
        """`ratio` is measured over prior throughput (prior at step factor 1)."""
        if ratio <= 0 or not math.isfinite(ratio):
            return self
        factor = math.exp(
            (1 - LEARNING_RATE) * math.log(self.step_factor) + LEARNING_RATE * math.log(1 / ratio)
        )
        bucket = round(math.log2(max(batch, 1.0)))
        residual = math.log(ratio) + math.log(factor)  # what the global factor does not explain
        kept = [r for r in self.residuals if (r.config, r.log2_batch) != (config, bucket)]
        old = next(
            (r for r in self.residuals if (r.config, r.log2_batch) == (config, bucket)), None
        )
        if old is None:
            point = ResidualPoint(config, bucket, residual, 1.0)
        else:
            weight = old.weight + 1.0
            point = ResidualPoint(
                config, bucket, old.mean + (residual - old.mean) / weight, min(weight, 50.0)
            )
        kept.append(point)
        if len(kept) > MAX_RESIDUALS:
            kept.sort(key=lambda r: r.weight, reverse=True)
            kept = kept[:MAX_RESIDUALS]
        return replace(self, step_factor=factor, residuals=tuple(kept))

    def to_json(self) -> str:
        body: dict[str, Any] = {
            "current": self.current.to_dict(),
            "since_s": self.since_s,
            "restarts": list(self.restarts),
            "acceptance": [list(a) for a in self.acceptance],
            "step_factor": self.step_factor,
            "residuals": [
                [r.config.to_dict(), r.log2_batch, r.mean, r.weight] for r in self.residuals
            ],
        }
        return json.dumps(body, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> TunerState:
        body = json.loads(text)
        return cls(
            current=SpecConfig.from_dict(body["current"]),
            since_s=float(body["since_s"]),
            restarts=tuple(float(t) for t in body["restarts"]),
            acceptance=tuple((str(m), float(p), float(r)) for m, p, r in body["acceptance"]),
            step_factor=float(body["step_factor"]),
            residuals=tuple(
                ResidualPoint(SpecConfig.from_dict(c), int(b), float(m), float(w))
                for c, b, m, w in body["residuals"]
            ),
        )


def _solve_p(length: float, k: int, r: float) -> float:
    """The p whose chain with decay r gives this acceptance length at K (bisection)."""
    low, high = 0.0, 1.0
    target = min(max(length, 1.0), 1.0 + k)
    for _ in range(40):
        middle = (low + high) / 2
        if AcceptanceCurve(middle, r).expected_length(k) < target:
            low = middle
        else:
            high = middle
    return (low + high) / 2
