"""Observation: what an engine (or a set of pods) did over one window, as the tuner reads it.

Contract: every quantity is a number or None (unknown: missing series, no drafts in the
window); `unknown` lists the None ones. Produced by `specpilot.runtime.engine_metrics` from engine
/metrics or PromQL; consumed by the tuner, which never learns where the numbers came from.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any


@dataclass(frozen=True, slots=True, kw_only=True)
class Observation:
    """What one engine (or a set of pods) did over one window. None means unknown."""

    engine: str
    window_s: float
    pods: tuple[str, ...]
    acceptance_length: float | None
    acceptance_rate: float | None
    acceptance_per_position: tuple[float, ...] | None
    running_requests: float | None
    """Mean number of running requests (the batch) over the window, per engine: a time
    integral of the engine's own request-phase histograms where they allow."""
    waiting_requests: float | None
    kv_cache_usage: float | None
    generation_tokens_per_s: float | None
    tpot_p50_s: float | None
    tpot_p95_s: float | None
    ttft_p95_s: float | None
    counter_resets: int = 0
    prompt_tokens_per_s: float | None = None
    """Prefill tokens processed per second; with generation, how prefill-heavy the traffic is."""
    requests_per_s: float | None = None
    """Requests finished per second (the count of a per-request histogram); with the prompt
    tokens, the mean prompt: how lumpy the prefill steps are."""
    running_requests_gauge: float | None = None
    """The engine's running-requests gauge averaged over the window's scrape instants: the
    cross-check of `running_requests`, which is a time integral where the engine's histograms
    allow (specpilot.runtime.engine_metrics.running_estimate). A busy engine answers a scrape
    between its steps, so a few instants can all catch an emptied batch."""
    drafts: float | None = None
    """Drafts verified in the window, summed over pods (vLLM's drafts counter, SGLang's verify
    calls): how much evidence the acceptance figures carry. None: the engine does not say."""

    @property
    def engines(self) -> int:
        """How many pods / engine processes this observation covers."""
        return len(self.pods)

    @property
    def tokens_per_engine_s(self) -> float | None:
        """Output tokens/s per engine: `generation_tokens_per_s` is summed over the pods while
        `running_requests` is a per-engine mean, and the tuner models one engine (its step
        cost and batch), so it reads throughput in this unit."""
        total = self.generation_tokens_per_s
        return None if total is None else total / max(1, self.engines)

    @property
    def unknown(self) -> tuple[str, ...]:
        """Names of the quantities that could not be computed for this window."""
        return tuple(f.name for f in fields(self) if getattr(self, f.name) is None)

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["pods"] = list(self.pods)
        if self.acceptance_per_position is not None:
            out["acceptance_per_position"] = list(self.acceptance_per_position)
        out["engines"] = self.engines
        out["unknown"] = list(self.unknown)
        return out
