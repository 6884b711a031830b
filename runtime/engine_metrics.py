"""From engine metrics to one `Observation` per time window, per pod and across pods.

Contract: two readers (direct /metrics scraping in `specpilot.runtime.scrape`, PromQL in
`specpilot.runtime.promql`) reduce their inputs to `WindowStats`: for one pod, the window's
counter increases (counter resets already handled), gauge means and histogram bucket
increases. `observe()` turns any set of `WindowStats` into an `Observation` with the same
arithmetic whichever reader produced them; `consecutive()` joins one pod's back-to-back
windows into one. A quantity that cannot be computed (series missing,
NaN, no drafts in the window) is `None` and listed in `Observation.unknown`: never an exception,
never an invented number.

Semantics (vLLM 0.32 and SGLang 0.5.23 sources, see REFERENCE.md):
- vLLM acceptance length = 1 + d(accepted tokens) / d(drafts), the bonus token included;
  acceptance rate = d(accepted) / d(draft tokens); per position = d(accepted at i) / d(drafts).
- SGLang exposes acceptance only as windowed gauges; across pods they are weighted by each
  pod's verify calls in the window.
- Per-token latency comes from request_time_per_output_token on both engines (vLLM's
  inter-token latency is per engine step, SGLang's per token: not comparable). SGLang drops a
  non-streamed request's TPOT once the host's wall clock has stepped since the server started
  (tests/contract/sglang_live.py, `generate`, says why); the figure then speaks for the
  streamed requests alone, or is missing. The tuner predicts TPOT and does not read this one.
- Load (running, waiting, KV usage) is per engine: the mean over pods of each pod's mean.
  Throughput is the sum over pods.
- Running requests (the batch the tuner reads) is a time integral, not a gauge sampled at
  scrape instants: a busy CPU engine answers a scrape between its steps, and two instants can
  both catch an emptied batch (0 and 0 where vLLM's own integrals said 3.3). See
  `running_estimate` for the per-engine rules; the sampled gauge stays as
  `Observation.running_requests_gauge`, the cross-check.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal

from specpilot.tuner import ConfigError, Observation

MetricKind = Literal["counter", "gauge", "histogram"]


@dataclass(frozen=True, slots=True)
class MetricSpec:
    key: str
    """SpecPilot's name for the quantity."""
    name: str
    """Exposed series name (counters with their `_total`, histograms without `_bucket`)."""
    kind: MetricKind
    combine: Literal["sum", "mean"] = "sum"
    """How one pod's label sets (e.g. vLLM's per-engine-core series) combine: counts add up,
    ratios average."""
    zero_is_unknown: bool = False
    """A 0 sample means "not measured yet" (SGLang's acceptance gauges read 0 from startup
    until a first 40-decode-batch window completes) and is left out of the window's mean."""
    buckets: bool = True
    """Histograms: whether readers fetch the buckets (for quantiles). Every histogram's `_sum`
    and `_count` increases are read; integrals need only those."""


ENGINE_METRICS: Mapping[str, tuple[MetricSpec, ...]] = {
    "vllm": (
        MetricSpec("accepted", "vllm:spec_decode_num_accepted_tokens_total", "counter"),
        MetricSpec("drafts", "vllm:spec_decode_num_drafts_total", "counter"),
        MetricSpec("draft_tokens", "vllm:spec_decode_num_draft_tokens_total", "counter"),
        MetricSpec("generation_tokens", "vllm:generation_tokens_total", "counter"),
        MetricSpec("prompt_tokens", "vllm:prompt_tokens_total", "counter"),
        MetricSpec("running", "vllm:num_requests_running", "gauge"),
        MetricSpec("waiting", "vllm:num_requests_waiting", "gauge"),
        MetricSpec("kv_usage", "vllm:kv_cache_usage_perc", "gauge", "mean"),
        MetricSpec("tpot", "vllm:request_time_per_output_token_seconds", "histogram"),
        MetricSpec("ttft", "vllm:time_to_first_token_seconds", "histogram"),
        # integrals for the running batch (`running_estimate`): seconds of requests in decode,
        # accumulated step by step, and in prefill / running, counted when a request finishes
        MetricSpec("decode_s", "vllm:inter_token_latency_seconds", "histogram", buckets=False),
        MetricSpec("prefill_s", "vllm:request_prefill_time_seconds", "histogram", buckets=False),
        MetricSpec(
            "inference_s", "vllm:request_inference_time_seconds", "histogram", buckets=False
        ),
    ),
    "sglang": (
        MetricSpec("accept_length_gauge", "sglang:spec_accept_length", "gauge", "mean", True),
        MetricSpec("accept_rate_gauge", "sglang:spec_accept_rate", "gauge", "mean", True),
        MetricSpec("verify_calls", "sglang:spec_verify_calls_total", "counter"),
        MetricSpec("generation_tokens", "sglang:generation_tokens_total", "counter"),
        MetricSpec("prompt_tokens", "sglang:prompt_tokens_total", "counter"),
        MetricSpec("running", "sglang:num_running_reqs", "gauge"),
        MetricSpec("waiting", "sglang:num_queue_reqs", "gauge"),
        MetricSpec("kv_usage", "sglang:token_usage", "gauge", "mean"),
        MetricSpec("tpot", "sglang:request_time_per_output_token_seconds", "histogram"),
        MetricSpec("ttft", "sglang:time_to_first_token_seconds", "histogram"),
        # integrals for the running batch (`running_estimate`), both per request: in the server
        # (counted when it finishes) and in the waiting queue (counted when first scheduled)
        MetricSpec("e2e_s", "sglang:e2e_request_latency_seconds", "histogram", buckets=False),
        MetricSpec("queue_s", "sglang:queue_time_seconds", "histogram", buckets=False),
    ),
}
VLLM_PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
ENGINES: tuple[str, ...] = tuple(ENGINE_METRICS)


def engine_metrics(engine: str) -> tuple[MetricSpec, ...]:
    try:
        return ENGINE_METRICS[engine]
    except KeyError:
        raise ConfigError("engine", engine, " | ".join(ENGINES)) from None


@dataclass(frozen=True, slots=True, kw_only=True)
class WindowStats:
    """One pod's raw window: what every reader produces, before any ratio is taken."""

    pod: str
    window_s: float
    counters: Mapping[str, float] = field(default_factory=dict)
    """Key -> increase over the window (resets handled); absent when the series is missing."""
    gauges: Mapping[str, float] = field(default_factory=dict)
    """Key -> mean over the window."""
    histograms: Mapping[str, Mapping[float, float]] = field(default_factory=dict)
    """Key -> cumulative bucket upper bound (`le`, +inf included) -> increase."""
    histogram_sums: Mapping[str, float] = field(default_factory=dict)
    """Key -> increase of the histogram's `_sum` (resets handled); absent when missing."""
    histogram_counts: Mapping[str, float] = field(default_factory=dict)
    """Key -> increase of the histogram's `_count` (observations in the window)."""
    accepted_per_position: Mapping[int, float] = field(default_factory=dict)
    counter_resets: int = 0


def consecutive(windows: Sequence[WindowStats]) -> WindowStats:
    """One pod's back-to-back windows as one: increases added, gauge means weighed by each
    window's length (a trial read in short probes is judged, and learned, over its whole
    span). A series missing from some windows counts what the others saw."""
    if not windows:
        raise ValueError("no windows to join")
    span = sum(w.window_s for w in windows)

    def added(get: Any) -> dict[Any, float]:
        total: dict[Any, float] = {}
        for w in windows:
            for key, value in get(w).items():
                total[key] = total.get(key, 0.0) + value
        return total

    gauges: dict[str, float] = {}
    for key in {k for w in windows for k in w.gauges}:
        seen = [(w.gauges[key], w.window_s) for w in windows if key in w.gauges]
        weight = sum(t for _, t in seen)
        gauges[key] = sum(v * t for v, t in seen) / weight if weight else seen[0][0]
    return WindowStats(
        pod=windows[0].pod,
        window_s=span,
        counters=added(lambda w: w.counters),
        gauges=gauges,
        histograms={
            key: _merged_buckets(windows, key) for key in {k for w in windows for k in w.histograms}
        },
        histogram_sums=added(lambda w: w.histogram_sums),
        histogram_counts=added(lambda w: w.histogram_counts),
        accepted_per_position=added(lambda w: w.accepted_per_position),
        counter_resets=sum(w.counter_resets for w in windows),
    )


def observe(engine: str, stats: Sequence[WindowStats]) -> Observation:
    """Aggregate any number of pods' windows (one pod gives the per-pod view)."""
    engine_metrics(engine)
    window = max((s.window_s for s in stats), default=0.0)
    length, rate, per_position = _acceptance(engine, stats)
    tpot = _merged_buckets(stats, "tpot")
    observation = Observation(
        engine=engine,
        window_s=window,
        pods=tuple(s.pod for s in stats),
        acceptance_length=length,
        acceptance_rate=rate,
        acceptance_per_position=per_position,
        running_requests=_mean_of(running_estimate(engine, s) for s in stats),
        running_requests_gauge=_mean_gauge(stats, "running"),
        waiting_requests=_mean_gauge(stats, "waiting"),
        kv_cache_usage=_mean_gauge(stats, "kv_usage"),
        generation_tokens_per_s=_rate(stats, "generation_tokens"),
        tpot_p50_s=histogram_quantile(0.5, tpot),
        tpot_p95_s=histogram_quantile(0.95, tpot),
        ttft_p95_s=histogram_quantile(0.95, _merged_buckets(stats, "ttft")),
        counter_resets=sum(s.counter_resets for s in stats),
        prompt_tokens_per_s=_rate(stats, "prompt_tokens"),
        requests_per_s=_finished_per_s(engine, stats),
        drafts=_sum_counter(stats, "drafts" if engine == "vllm" else "verify_calls"),
    )
    return _finite_only(observation)


def _finite_only(observation: Observation) -> Observation:
    """The same observation with every NaN or infinite quantity made unknown (None): the last
    guard between a reader's numbers and the tuner, whichever reader produced them (a
    Prometheus answering "+Inf", a ratio of two huge counters)."""
    unknown: dict[str, Any] = {}
    for quantity in fields(observation):
        value = getattr(observation, quantity.name)
        if quantity.name != "window_s" and isinstance(value, float) and not math.isfinite(value):
            unknown[quantity.name] = None
    per_position = observation.acceptance_per_position
    if per_position is not None and not all(math.isfinite(p) for p in per_position):
        unknown["acceptance_per_position"] = None
    return replace(observation, **unknown) if unknown else observation


def observe_per_pod(engine: str, stats: Iterable[WindowStats]) -> dict[str, Observation]:
    """One Observation per pod, for comparing pods that run different configs."""
    return {s.pod: observe(engine, [s]) for s in stats}


SGLANG_MIN_REQUESTS = 8
"""Requests through a window (mean of starts and completions) below which SGLang's batch is
read from its gauge."""


def running_estimate(engine: str, s: WindowStats) -> float | None:
    """One pod's mean number of running requests over its window, by Little's law: the
    request-seconds the engine accumulated in the window divided by the window's length.

    vLLM 0.32 (vllm/v1/metrics/stats.py, loggers.py). A request runs from its first SCHEDULED
    event to its last token: prefill (to the first token) then decode (to the last).
    - Decode: the sum of `vllm:inter_token_latency_seconds`. The frontend observes, for every
      request that got tokens in an engine step, the time since its previous tokens; these
      gaps tile the request's decode phase exactly (their sum per request is its
      `request_decode_time`), and they are recorded step by step, not when the request
      finishes. Edge bias: the gap straddling each window edge counts wholly on the side where
      its step ended: at most one step per running request per edge (step / window: 0.4% for
      a 35 ms step in an 8 s window); no completion is needed.
    - Prefill: the sum of `vllm:request_prefill_time_seconds`, which counts a request's whole
      prefill when the request finishes: a request that prefilled in the window and finishes
      after it is missed, one that prefilled before it and finishes in it counted. These cancel
      on average in steady traffic; a window with no completion counts no prefill (prefill is
      one step per request unless chunked, a few % of the running time).
    - A window with no decode step (idle, or every request still in prefill or the frontend
      stalled) falls back to the sampled `vllm:num_requests_running` gauge (0 when idle).
    - Without the per-step series (an engine or Prometheus that lacks it): the sum of
      `vllm:request_inference_time_seconds` (scheduled to last token, counted when a request
      finishes) if the window saw a completion. Its edge bias is a request's whole running
      time per request in flight at each edge, zero on average in steady traffic; with no
      completion, the gauge.
    SGLang 0.5.23 (srt/observability/metrics_collector.py, req_time_stats.py): no per-step
    series covers non-streamed requests (its inter-token latency is observed only as streamed
    chunks reach the tokenizer; its realtime token counters move every 40 decode batches), so
    Little's law per request: mean running time per request D = the mean of
    `sglang:e2e_request_latency_seconds` over the window's completions (tokenizer receipt to
    finish, observed when a request finishes) minus the mean of `sglang:queue_time_seconds`
    over its starts (the wait before a request's first forward, observed then), times the rate
    of requests through the window, taken as the mean of its starts (queue-time count) and
    completions (e2e count): running = D x (starts + completions) / 2 / window. Counting
    completions alone would credit a request's whole time to the window it finishes in: off by
    up to one request's duration per request in flight at each edge, and lagging a load that
    grows or shrinks across the window (started requests not yet finished); averaging with the
    starts cancels that to first order (a request in flight at an edge has on average half its
    time on each side). What remains: the tokenizer's and detokenizer's own milliseconds per
    request, and whole requests' worth of rounding when the window holds few of them. With no
    completion in the window, or no queue-time series (queueing would count as running), the
    scheduler's `sglang:num_running_reqs` gauge, refreshed every prefill batch and every 40
    decode batches; the gauge too when fewer than SGLANG_MIN_REQUESTS requests passed through
    the window (one long request in a 12 s window read 0.56 for one user; the gauge, which
    SGLang holds between refreshes rather than dropping between steps as vLLM's does, read 1).
    A zero-length window reads the gauge; a counter reset (a restarted engine) counts the new
    process from zero, so a window spanning a restart reads what ran after it."""
    gauge = s.gauges.get("running")
    window = s.window_s
    if window <= 0:
        return gauge
    sums, counts = s.histogram_sums, s.histogram_counts
    if engine == "vllm":
        if "decode_s" in sums:
            if counts.get("decode_s", 0.0) > 0:
                return (sums["decode_s"] + sums.get("prefill_s", 0.0)) / window
            return gauge if gauge is not None else sums.get("prefill_s", 0.0) / window
        if counts.get("inference_s", 0.0) > 0:
            return sums["inference_s"] / window
        return gauge
    finished, started = counts.get("e2e_s", 0.0), counts.get("queue_s")
    if finished <= 0 or started is None:
        return gauge
    if gauge is not None and (started + finished) / 2 < SGLANG_MIN_REQUESTS:
        return gauge  # too few requests through the window for their mean time to mean much
    queued = sums.get("queue_s", 0.0) / started if started > 0 else 0.0
    per_request = max(0.0, sums.get("e2e_s", 0.0) / finished - queued)
    return per_request * (started + finished) / 2 / window


def _mean_of(values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def _acceptance(
    engine: str, stats: Sequence[WindowStats]
) -> tuple[float | None, float | None, tuple[float, ...] | None]:
    if engine == "vllm":
        accepted = _sum_counter(stats, "accepted")
        drafts = _sum_counter(stats, "drafts")
        draft_tokens = _sum_counter(stats, "draft_tokens")
        length = 1.0 + accepted / drafts if accepted is not None and drafts else None
        rate = accepted / draft_tokens if accepted is not None and draft_tokens else None
        positions: dict[int, float] = {}
        for s in stats:
            for position, value in s.accepted_per_position.items():
                positions[position] = positions.get(position, 0.0) + value
        per_position = None
        if positions and drafts:
            per_position = tuple(positions[p] / drafts for p in sorted(positions))
        return length, rate, per_position
    weights = [_verify_weight(s) for s in stats]
    return (
        _weighted_gauge(stats, weights, "accept_length_gauge"),
        _weighted_gauge(stats, weights, "accept_rate_gauge"),
        None,
    )


def _verify_weight(s: WindowStats) -> float:
    calls = s.counters.get("verify_calls")
    return calls if calls is not None and calls > 0 else 0.0


def _weighted_gauge(
    stats: Sequence[WindowStats], weights: Sequence[float], key: str
) -> float | None:
    # A zero gauge means the engine has not drafted in its window yet, not zero acceptance.
    pairs = [(s.gauges[key], w) for s, w in zip(stats, weights, strict=True) if s.gauges.get(key)]
    if not pairs:
        return None
    total_weight = sum(w for _, w in pairs)
    if total_weight <= 0:
        return sum(v for v, _ in pairs) / len(pairs)
    return sum(v * w for v, w in pairs) / total_weight


def _sum_counter(stats: Sequence[WindowStats], key: str) -> float | None:
    values = [s.counters[key] for s in stats if key in s.counters]
    return sum(values) if values else None


FINISHED_COUNT = {"vllm": "inference_s", "sglang": "e2e_s"}
"""The per-request histogram whose count grows by one as each request finishes."""


def _finished_per_s(engine: str, stats: Sequence[WindowStats]) -> float | None:
    """Requests finished per second, summed over pods; None when no pod saw one finish."""
    key = FINISHED_COUNT[engine]
    values = [
        s.histogram_counts[key] / s.window_s
        for s in stats
        if s.histogram_counts.get(key, 0.0) > 0 and s.window_s > 0
    ]
    return sum(values) if values else None


def _rate(stats: Sequence[WindowStats], key: str) -> float | None:
    values = [s.counters[key] / s.window_s for s in stats if key in s.counters and s.window_s > 0]
    return sum(values) if values else None


def _mean_gauge(stats: Sequence[WindowStats], key: str) -> float | None:
    values = [s.gauges[key] for s in stats if key in s.gauges]
    return sum(values) / len(values) if values else None


def _merged_buckets(stats: Sequence[WindowStats], key: str) -> dict[float, float]:
    merged: dict[float, float] = {}
    for s in stats:
        for bound, value in s.histograms.get(key, {}).items():
            merged[bound] = merged.get(bound, 0.0) + value
    return merged


def histogram_quantile(q: float, buckets: Mapping[float, float]) -> float | None:
    """Prometheus' histogram_quantile on cumulative bucket increases: linear interpolation
    inside the bucket; the +Inf bucket answers with the highest finite bound."""
    if not buckets or not 0.0 <= q <= 1.0:
        return None
    bounds = sorted(buckets)
    if not math.isinf(bounds[-1]):
        return None
    total = buckets[bounds[-1]]
    if not total or total <= 0 or math.isnan(total):
        return None
    rank = q * total
    previous_bound, previous_count = 0.0, 0.0
    for bound in bounds:
        count = buckets[bound]
        if count >= rank:
            if math.isinf(bound):
                return previous_bound if len(bounds) > 1 else None
            if count == previous_count:
                return bound
            return previous_bound + (bound - previous_bound) * (
                (rank - previous_count) / (count - previous_count)
            )
        previous_bound, previous_count = bound, count
    return None
