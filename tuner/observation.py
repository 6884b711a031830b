"""Observation: what an engine (or a set of pods) did over one window, as the tuner reads it.

Contract: every quantity is a number or None (unknown: missing series, no drafts in the
window); `unknown` lists the None ones. Produced by `specpilot.runtime.engine_metrics` from engine
/metrics or PromQL; consumed by the tuner, which never learns where the numbers came from.
`joined(first, then)` reads two consecutive windows of the same engines as one.
"""

from __future__ import annotations

from collections.abc import Callable
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
    load_rise: float | None = None
    """Over a window joined from two (`joined`): the later part's output tokens/s over the
    earlier part's, how far the load moved inside the window. None: one window, or a part
    that served nothing."""

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
        """Names of the quantities that could not be computed for this window (`load_rise`
        is not measured but derived, and only for a joined window)."""
        return tuple(
            f.name for f in fields(self) if f.name != "load_rise" and getattr(self, f.name) is None
        )

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["pods"] = list(self.pods)
        if self.acceptance_per_position is not None:
            out["acceptance_per_position"] = list(self.acceptance_per_position)
        out["engines"] = self.engines
        out["unknown"] = list(self.unknown)
        return out


def joined(first: Observation, then: Observation) -> Observation:
    """Two consecutive windows of the same engines read as one: the batch and the rates
    weighted by each window's length, acceptance by each window's drafts (by its output tokens
    where the engine does not count drafts), counts summed. The queue and the KV cache's
    usage are the later window's: the tuner reads them as the state the window leaves (the
    emulator reports them at the window's end, as one scrape would). Percentiles do not join
    either: the later window's are kept (the tuner reads none of them). A quantity one window
    does not know is the other's alone."""
    length = first.window_s + then.window_s
    if length <= 0:
        return then

    def by_time(a: float | None, b: float | None) -> float | None:
        return _weighted(a, first.window_s, b, then.window_s)

    def by_drafts(get: Callable[[Observation], float | None]) -> float | None:
        return _weighted(get(first), _evidence(first), get(then), _evidence(then))

    per_position = then.acceptance_per_position
    a, b = first.acceptance_per_position, then.acceptance_per_position
    if a is not None and b is not None and len(a) == len(b):
        per_position = tuple(
            _weighted(x, _evidence(first), y, _evidence(then)) or 0.0
            for x, y in zip(a, b, strict=True)
        )
    elif b is None:
        per_position = a
    return Observation(
        engine=then.engine,
        window_s=length,
        pods=tuple(dict.fromkeys((*first.pods, *then.pods))),
        acceptance_length=by_drafts(lambda o: o.acceptance_length),
        acceptance_rate=by_drafts(lambda o: o.acceptance_rate),
        acceptance_per_position=per_position,
        running_requests=by_time(first.running_requests, then.running_requests),
        waiting_requests=_either(then.waiting_requests, first.waiting_requests),
        kv_cache_usage=_either(then.kv_cache_usage, first.kv_cache_usage),
        generation_tokens_per_s=by_time(
            first.generation_tokens_per_s, then.generation_tokens_per_s
        ),
        tpot_p50_s=_either(then.tpot_p50_s, first.tpot_p50_s),
        tpot_p95_s=_either(then.tpot_p95_s, first.tpot_p95_s),
        ttft_p95_s=_either(then.ttft_p95_s, first.ttft_p95_s),
        counter_resets=first.counter_resets + then.counter_resets,
        prompt_tokens_per_s=by_time(first.prompt_tokens_per_s, then.prompt_tokens_per_s),
        requests_per_s=by_time(first.requests_per_s, then.requests_per_s),
        running_requests_gauge=by_time(first.running_requests_gauge, then.running_requests_gauge),
        drafts=None
        if first.drafts is None and then.drafts is None
        else (first.drafts or 0.0) + (then.drafts or 0.0),
        load_rise=_ratio(then.generation_tokens_per_s, first.generation_tokens_per_s),
    )


def _ratio(later: float | None, earlier: float | None) -> float | None:
    if later is None or earlier is None or earlier <= 0:
        return None
    return later / earlier


def _evidence(observation: Observation) -> float:
    """What an acceptance figure of `observation` is weighted by: its drafts, else its output
    tokens."""
    if observation.drafts is not None:
        return observation.drafts
    return (observation.generation_tokens_per_s or 0.0) * observation.window_s


def _weighted(a: float | None, weight_a: float, b: float | None, weight_b: float) -> float | None:
    if a is None or weight_a <= 0:
        return b if b is not None else a
    if b is None or weight_b <= 0:
        return a
    return (a * weight_a + b * weight_b) / (weight_a + weight_b)


def _either(preferred: float | None, other: float | None) -> float | None:
    return other if preferred is None else preferred
