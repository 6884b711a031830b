"""Tuner state: what the tuner has learned, as bounded JSON an operator can persist and resume.

Contract: `TunerState` is frozen; learning returns a new state. It holds the running config and
since when, recent restart times (the last hour's), per-method acceptance estimates with the
number of windows behind each (their uncertainty), the
traffic's prompt/output token ratio and context per request, the last few windows' batch (the
load's trend) and per-(config, batch bucket) residual summaries (log of measured over prior
throughput, recent windows weighted most), at most MAX_RESIDUALS of them (the least-supported
are dropped first), so its JSON stays small whatever the history length.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from specpilot.tuner._model.acceptance import AcceptanceCurve, p_for_length
from specpilot.tuner._model.surrogate import ResidualPoint
from specpilot.tuner.observation import Observation
from specpilot.tuner.spec_config import SpecConfig

MAX_RESIDUALS = 128
LEARNING_RATE = 0.3
"""Weight of a new window in the moving estimates (acceptance, traffic)."""
RECENT_WINDOWS = 4
MAX_RESIDUAL_WEIGHT = 8.0
"""A residual summary averages about this many recent windows, so it follows drift."""
MAX_ACCEPTANCE_SUPPORT = 2 / LEARNING_RATE - 1
"""The moving estimate's effective sample size: its uncertainty stops shrinking there."""
PRIOR_P_SD: dict[str, float] = {"ngram": 0.25, "suffix": 0.25}
"""How far a method's true p may sit from its prior before it has run. Copying drafters
depend on the traffic most: n-gram's published K=3 lengths span 1.16 (math) to 2.03 (code),
and repetitive greedy traffic on the CPU bench gave 3.6 (REFERENCE.md sections 5-6)."""
LEARNED_DRAFTER_P_SD = 0.08
"""Model-based drafters (EAGLE, MTP, draft models, DFlash) move less with the task: MTP's
published per-token rates span 0.83 to 0.95 across tasks (REFERENCE.md section 5)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TunerState:
    current: SpecConfig
    since_s: float
    restarts: tuple[float, ...] = ()
    acceptance: tuple[tuple[str, float, float], ...] = ()
    """(method, p, r) per method: the prior until the method has run, then learned."""
    acceptance_support: tuple[tuple[str, float], ...] = ()
    """(method, windows) behind each estimate; a method absent here has not run."""
    residuals: tuple[ResidualPoint, ...] = ()
    prefill_ratio: float = 0.0
    """Prompt tokens prefilled per output token, a moving estimate from the traffic."""
    context_tokens: float = 0.0
    """Mean KV tokens per running request, a moving estimate (0 until the engine reports)."""
    recent_batches: tuple[float, ...] = ()
    """The last RECENT_WINDOWS windows' mean batch, oldest first: the load's trend."""

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

    def acceptance_sd(self) -> dict[str, float]:
        """Standard deviation of each method's p: the prior's spread, shrinking with the
        windows observed like a mean's (down to the moving estimate's effective size)."""
        support = dict(self.acceptance_support)
        return {
            method: PRIOR_P_SD.get(method, LEARNED_DRAFTER_P_SD)
            / math.sqrt(1.0 + support.get(method, 0.0))
            for method, _, _ in self.acceptance
        }

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
        observed_p = p_for_length(length, k, prior.r)
        p = (1 - LEARNING_RATE) * prior.p + LEARNING_RATE * observed_p
        curves[config.method] = AcceptanceCurve(p, prior.r)
        support = dict(self.acceptance_support)
        support[config.method] = min(support.get(config.method, 0.0) + 1, MAX_ACCEPTANCE_SUPPORT)
        return replace(
            self,
            acceptance=tuple(sorted((m, c.p, c.r) for m, c in curves.items())),
            acceptance_support=tuple(sorted(support.items())),
        )

    def learn_traffic(self, obs: Observation, kv_capacity_tokens: int | None) -> TunerState:
        """Blend the window's prompt/output ratio and context per request into the estimates."""
        state = self
        prompt, output = obs.prompt_tokens_per_s, obs.generation_tokens_per_s
        if prompt is not None and output is not None and output > 0:
            state = replace(state, prefill_ratio=_blend(state.prefill_ratio, prompt / output))
        usage, batch = obs.kv_cache_usage, obs.running_requests
        if kv_capacity_tokens and usage and batch is not None and batch >= 1:
            # Bounded: the capacity is the catalog's estimate, not the engine's own figure.
            context = min(max(usage * kv_capacity_tokens / batch, 64.0), 65536.0)
            state = replace(state, context_tokens=_blend(state.context_tokens, context))
        return state

    def remember_batch(self, batch: float) -> TunerState:
        return replace(self, recent_batches=(*self.recent_batches, batch)[-RECENT_WINDOWS:])

    def learn_throughput(self, config: SpecConfig, batch: float, ratio: float) -> TunerState:
        """`ratio` is measured over prior throughput for `config` at `batch`."""
        if ratio <= 0 or not math.isfinite(ratio):
            return self
        bucket = round(math.log2(max(batch, 1.0)))
        residual = math.log(ratio)
        kept = [r for r in self.residuals if (r.config, r.log2_batch) != (config, bucket)]
        old = next(
            (r for r in self.residuals if (r.config, r.log2_batch) == (config, bucket)), None
        )
        if old is None:
            point = ResidualPoint(config, bucket, residual, 1.0)
        else:
            weight = old.weight + 1.0
            point = ResidualPoint(
                config,
                bucket,
                old.mean + (residual - old.mean) / weight,
                min(weight, MAX_RESIDUAL_WEIGHT),
            )
        kept.append(point)
        if len(kept) > MAX_RESIDUALS:
            kept.sort(key=lambda r: r.weight, reverse=True)
            kept = kept[:MAX_RESIDUALS]
        return replace(self, residuals=tuple(kept))

    def to_json(self) -> str:
        body: dict[str, Any] = {
            "current": self.current.to_dict(),
            "since_s": self.since_s,
            "restarts": list(self.restarts),
            "acceptance": [list(a) for a in self.acceptance],
            "acceptance_support": [list(a) for a in self.acceptance_support],
            "prefill_ratio": round(self.prefill_ratio, 4),
            "context_tokens": round(self.context_tokens, 1),
            "recent_batches": [round(b, 2) for b in self.recent_batches],
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
            acceptance_support=tuple(
                (str(m), float(n)) for m, n in body.get("acceptance_support", [])
            ),
            prefill_ratio=float(body.get("prefill_ratio", 0.0)),
            context_tokens=float(body.get("context_tokens", 0.0)),
            recent_batches=tuple(float(b) for b in body.get("recent_batches", [])),
            residuals=tuple(
                ResidualPoint(SpecConfig.from_dict(c), int(b), float(m), float(w))
                for c, b, m, w in body["residuals"]
            ),
        )


def _blend(estimate: float, observed: float) -> float:
    """Moving estimate; the first observation (estimate 0: none yet) is taken as it is."""
    if estimate == 0.0:
        return observed
    return (1 - LEARNING_RATE) * estimate + LEARNING_RATE * observed
