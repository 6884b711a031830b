"""The yardstick's serving metrics, defined as `vllm bench serve` defines them.

Pure: no clock, no I/O. A producer (the emulator's bench, a replay against a real engine)
records one `RequestRecord` per request; `summarize` reduces records to a `ServingSummary`
for a whole trace, `per_window` for each arrival window. Times are seconds on the trace's clock,
which starts at 0.

Definitions (vLLM 0.32.0, vllm/benchmarks/serve.py `calculate_metrics`, and
vllm/benchmarks/lib/endpoint_request_func.py for what the client stamps; SGLang's
sglang/benchmark/serving.py `calculate_metrics` computes the same TTFT, TPOT and E2EL):
- TTFT = first token - arrival; E2EL = last token (finished) - arrival.
- TPOT = (E2EL - TTFT) / (output tokens - 1), defined only for more than one output token:
  the TPOT mean/median/p99 cover completed requests with at least two tokens (vLLM's `tpots`).
  For goodput and attainment a 1-token request's TPOT is 0 (vLLM's `all_tpots`: "if
  output_len <= 1, we regard tpot as 0 for goodput"), so such a request is judged on TTFT only.
- ITL = every gap between two streamed chunks of a request, pooled over requests (vLLM appends
  `timestamp - most_recent_timestamp` per chunk after the first). In an emulator a chunk is one
  engine step's tokens for that request, so a step that accepts 4 tokens is one gap, not four
  (SGLang's `sglang-oai` backend instead spreads a chunk's gap over its tokens; we follow vLLM).
  ITL is kept in a fixed log-spaced histogram (`ItlHistogram`, resolution below), not as a list.
- Request throughput = completed requests / duration; output tok/s = output tokens of completed
  requests / duration (a failed request's tokens count 0, as in vLLM).
- Percentiles: numpy's `percentile` with its default linear interpolation, median `np.median`,
  as vLLM reports them. An empty population reports 0 (vLLM's `np.mean(x or 0)`).
- Goodput (vLLM `--goodput ttft:X tpot:Y`, after DistServe): a request is good when it completed
  and its TTFT and TPOT are each at or under the tier's target. Request goodput = good requests /
  duration (req/s); token goodput = output tokens of good requests / duration (a secondary
  figure). SLO attainment (DistServe, OSDI'24) = good requests / ALL requests: a failed request
  is a miss. Tiers (`TIERS`): tight 450 ms / 25 ms, standard 1 s / 50 ms, relaxed 2 s / 100 ms
  (MLPerf Inference v5.0 Interactive, llm-d WVA service classes, DistServe).

Where we depart from vLLM, on purpose: vLLM drops failed requests from every latency figure,
since there a failure means a misconfigured benchmark. Here a failure is the policy's doing (a
restart dropped the request, or it was still waiting when the trace ended), and leaving it out
would make dropping requests look fast. So a failed request is a miss at every tier and counts
with its wait: its E2EL is (the time it was given up, else the trace end) - arrival, its TTFT
is its real one if a token came and that same wait if none did (both lower bounds on what it
would have taken), and the gaps it streamed are pooled into ITL. It has no TPOT.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

# --- ITL histogram -------------------------------------------------------------------------

ITL_BINS_PER_DECADE = 100
"""Log-spaced bins per factor of ten."""
ITL_LOW_S = 1e-5
"""Lower edge of the first regular bin (10 us); smaller gaps share one underflow bin."""
ITL_HIGH_S = 1e3
"""Upper edge of the last regular bin (1000 s); larger gaps share one overflow bin."""
ITL_RELATIVE_ERROR = 10 ** (1 / (2 * ITL_BINS_PER_DECADE)) - 1
"""The histogram's resolution, about 1.16 %: a bin spans a factor r = 10**(1/100) and reports
its geometric middle, so for gaps in [ITL_LOW_S, ITL_HIGH_S) every percentile is within this
fraction of numpy's percentile of the raw gaps (a linear interpolation of two order statistics,
each within it, stays within it). The mean is exact to 1 ns per gap (sums are kept in integer
nanoseconds, so merging is exact and order-free). The smallest and largest gaps are kept
exactly (p0 and p100 are exact); other order statistics in the underflow bin report the smallest
gap (under 10 us off), in the overflow bin the largest."""

_DECADES = round(math.log10(ITL_HIGH_S / ITL_LOW_S))
_EDGES: npt.NDArray[np.float64] = ITL_LOW_S * 10.0 ** (
    np.arange(_DECADES * ITL_BINS_PER_DECADE + 1, dtype=np.float64) / ITL_BINS_PER_DECADE
)
ITL_BIN_COUNT = len(_EDGES) + 1
"""Bins in all: 0 is the underflow [0, 10 us), i in 1..800 is [edge[i-1], edge[i]), 801 is the
overflow [1000 s, inf)."""
# What each bin reports before clamping to the [smallest, largest] gap seen: the geometric
# middle of a regular bin; 0 and inf for under- and overflow, so those clamp to min and max.
_REPRESENTATIVE: npt.NDArray[np.float64] = np.concatenate(
    ([0.0], np.sqrt(_EDGES[:-1] * _EDGES[1:]), [math.inf])
)


def _gap_arrays(
    gaps_s: npt.ArrayLike, counts: npt.ArrayLike | None
) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.int64] | None, int, float, float]:
    """Bin indices, counts (None: one each), total in ns, min and max of the gaps with a
    positive count. Kept to a few numpy passes: a producer calls it once per request."""
    gaps = np.asarray(gaps_s, dtype=np.float64).ravel()
    weights: npt.NDArray[np.int64] | None = None
    if counts is not None:
        raw = np.asarray(counts).ravel()
        if raw.shape != gaps.shape:
            raise ValueError(f"{raw.size} counts for {gaps.size} gaps")
        weights = raw.astype(np.int64)
        if np.any(weights != raw):
            raise ValueError("ITL counts must be whole numbers")
        if np.any(weights < 0):
            raise ValueError("ITL counts must be >= 0")
        keep = weights > 0
        gaps, weights = gaps[keep], weights[keep]
    if gaps.size == 0:
        return np.empty(0, dtype=np.intp), weights, 0, math.inf, -math.inf
    low, high = float(gaps.min()), float(gaps.max())
    if not (low >= 0 and math.isfinite(high)):  # also catches NaN
        raise ValueError("inter-token gaps must be finite and >= 0 seconds")
    bins = np.searchsorted(_EDGES, gaps, side="right")
    nanoseconds = np.rint(gaps * 1e9).astype(np.int64)
    total_ns = int(nanoseconds.sum() if weights is None else (nanoseconds * weights).sum())
    return bins, weights, total_ns, low, high


def _percentile(counts: npt.NDArray[np.int64], n: int, p: float, low: float, high: float) -> float:
    """numpy's linear percentile, order statistics read from the bins (reported, clamped)."""
    if not 0 <= p <= 100:
        raise ValueError(f"percentile {p} outside 0..100")
    if n == 0:
        return 0.0
    rank = p / 100 * (n - 1)
    below = math.floor(rank)
    above = min(below + 1, n - 1)
    frac = rank - below
    cumulative = np.cumsum(counts)
    bins = np.searchsorted(cumulative, [below, above], side="right")

    def order_statistic(k: int, bin_index: int) -> float:
        # The smallest and largest gaps are kept exactly; the rest report their bin.
        if k == 0:
            return low
        if k == n - 1:
            return high
        return min(max(float(_REPRESENTATIVE[bin_index]), low), high)

    lo_value = order_statistic(below, int(bins[0]))
    hi_value = order_statistic(above, int(bins[1]))
    return lo_value + frac * (hi_value - lo_value)


@dataclass(frozen=True, slots=True)
class ItlCounts:
    """One request's inter-token gaps, compact and immutable: the non-empty bins of the
    `ItlHistogram` layout (`bins` ascending, `counts` > 0), the exact total in nanoseconds and
    the smallest and largest gap. Build it with `ItlCounts.from_gaps`; pool many with
    `ItlHistogram.merge`."""

    bins: tuple[int, ...] = ()
    counts: tuple[int, ...] = ()
    total_ns: int = 0
    min_s: float = math.inf
    max_s: float = -math.inf

    @classmethod
    def from_gaps(cls, gaps_s: npt.ArrayLike, counts: npt.ArrayLike | None = None) -> ItlCounts:
        """The gaps (seconds, >= 0), each seen `counts[i]` times (default once)."""
        bins, weights, total_ns, low, high = _gap_arrays(gaps_s, counts)
        if bins.size == 0:
            return NO_GAPS
        first = int(bins.min())
        # Weights as float are exact: counts stay far below 2**53.
        dense = np.bincount(bins - first, weights=weights)
        present = np.flatnonzero(dense)
        return cls(
            tuple((present + first).tolist()),
            tuple(dense[present].astype(np.int64).tolist()),
            total_ns,
            low,
            high,
        )

    @property
    def count(self) -> int:
        """Number of gaps."""
        return sum(self.counts)


NO_GAPS = ItlCounts()
"""A request that streamed at most one chunk."""


class ItlHistogram:
    """Inter-token gaps pooled over requests in fixed log-spaced bins (`ITL_BINS_PER_DECADE` per
    decade from `ITL_LOW_S` to `ITL_HIGH_S`, plus under- and overflow); deterministic and
    mergeable: the same gaps give the same histogram in any order. Resolution:
    `ITL_RELATIVE_ERROR` (about 1.16 %) on every percentile, the mean exact to 1 ns per gap.

    A producer fills it cheaply with `add(gap_s, count)` or `add_many(gaps_s, counts)` (numpy
    arrays), or `merge`s other histograms and per-request `ItlCounts`."""

    __slots__ = ("_counts", "_max_s", "_min_s", "_total_ns")

    def __init__(self) -> None:
        self._counts: npt.NDArray[np.int64] = np.zeros(ITL_BIN_COUNT, dtype=np.int64)
        self._total_ns = 0
        self._min_s = math.inf
        self._max_s = -math.inf

    @classmethod
    def from_gaps(cls, gaps_s: npt.ArrayLike, counts: npt.ArrayLike | None = None) -> ItlHistogram:
        histogram = cls()
        histogram.add_many(gaps_s, counts)
        return histogram

    def add(self, gap_s: float, count: int = 1) -> None:
        """`count` gaps of `gap_s` seconds."""
        if not math.isfinite(gap_s) or gap_s < 0:
            raise ValueError(f"inter-token gap {gap_s} must be finite and >= 0 seconds")
        if count < 0:
            raise ValueError(f"ITL count {count} must be >= 0")
        if count == 0:
            return
        self._counts[int(np.searchsorted(_EDGES, gap_s, side="right"))] += count
        self._total_ns += round(gap_s * 1e9) * count
        self._min_s = min(self._min_s, gap_s)
        self._max_s = max(self._max_s, gap_s)

    def add_many(self, gaps_s: npt.ArrayLike, counts: npt.ArrayLike | None = None) -> None:
        """Every gap in `gaps_s` (seconds), each `counts[i]` times (default once)."""
        bins, weights, total_ns, low, high = _gap_arrays(gaps_s, counts)
        if bins.size == 0:
            return
        np.add.at(self._counts, bins, 1 if weights is None else weights)
        self._total_ns += total_ns
        self._min_s = min(self._min_s, low)
        self._max_s = max(self._max_s, high)

    def merge(self, other: ItlHistogram | ItlCounts) -> None:
        """Add another histogram's or one request's gaps to this one."""
        if isinstance(other, ItlHistogram):
            self._counts += other._counts
            total_ns, low, high = other._total_ns, other._min_s, other._max_s
        else:
            if not other.bins:
                return
            self._counts[list(other.bins)] += other.counts
            total_ns, low, high = other.total_ns, other.min_s, other.max_s
        self._total_ns += total_ns
        self._min_s = min(self._min_s, low)
        self._max_s = max(self._max_s, high)

    def merge_many(self, items: Iterable[ItlCounts]) -> None:
        """`merge` every request's gaps, in one numpy pass."""
        bins: list[int] = []
        counts: list[int] = []
        for item in items:
            if item.bins:
                bins.extend(item.bins)
                counts.extend(item.counts)
                self._total_ns += item.total_ns
                self._min_s = min(self._min_s, item.min_s)
                self._max_s = max(self._max_s, item.max_s)
        if bins:
            np.add.at(self._counts, np.asarray(bins, dtype=np.intp), np.asarray(counts, np.int64))

    def compact(self) -> ItlCounts:
        """The same gaps as an immutable `ItlCounts`."""
        nonzero = np.flatnonzero(self._counts)
        if nonzero.size == 0:
            return NO_GAPS
        return ItlCounts(
            tuple(int(b) for b in nonzero),
            tuple(int(c) for c in self._counts[nonzero]),
            self._total_ns,
            self._min_s,
            self._max_s,
        )

    @property
    def count(self) -> int:
        """Number of gaps."""
        return int(self._counts.sum())

    def mean_s(self) -> float:
        """Mean gap in seconds (0 when empty, as vLLM reports an empty list)."""
        n = self.count
        return self._total_ns / n / 1e9 if n else 0.0

    def percentile_s(self, p: float) -> float:
        """numpy's linear `percentile(gaps, p)` in seconds, within `ITL_RELATIVE_ERROR`."""
        return _percentile(self._counts, self.count, p, self._min_s, self._max_s)

    def median_s(self) -> float:
        return self.percentile_s(50)


# --- Requests, tiers, summaries ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """What one request went through, in seconds on the trace's clock.

    A completed request (`failed` False) has `first_token_s` and `finished_s` (its last token)
    and `output_tokens` >= 1. A failed one (dropped or failed by a restart, or not finished when
    the trace ended) has `finished_s` None, `first_token_s` if a token came, `output_tokens` it
    streamed (not counted in throughput), and `given_up_s`, when it was dropped (None: it was
    still waiting at the trace end, which `summarize` then uses). `itl`: the gaps between its
    streamed chunks."""

    arrival_s: float
    first_token_s: float | None
    finished_s: float | None
    output_tokens: int
    failed: bool = False
    given_up_s: float | None = None
    itl: ItlCounts = NO_GAPS

    def __post_init__(self) -> None:
        if not math.isfinite(self.arrival_s):
            raise ValueError(f"arrival {self.arrival_s} must be finite")
        if self.output_tokens < 0:
            raise ValueError(f"output_tokens {self.output_tokens} must be >= 0")
        if self.first_token_s is not None and not self.first_token_s >= self.arrival_s:
            raise ValueError(f"first token {self.first_token_s} before arrival {self.arrival_s}")
        if self.failed:
            if self.finished_s is not None:
                raise ValueError("a failed request has no finished_s (use given_up_s)")
            last_seen = self.first_token_s if self.first_token_s is not None else self.arrival_s
            if self.given_up_s is not None and not self.given_up_s >= last_seen:
                raise ValueError(f"given up at {self.given_up_s}, before {last_seen}")
            return
        if self.first_token_s is None or self.finished_s is None:
            raise ValueError("a completed request needs first_token_s and finished_s")
        if not self.finished_s >= self.first_token_s:
            raise ValueError(f"finished {self.finished_s} before first token {self.first_token_s}")
        if self.output_tokens < 1:
            raise ValueError("a completed request has at least one output token")
        if self.given_up_s is not None:
            raise ValueError("only a failed request has given_up_s")

    @property
    def ttft_s(self) -> float | None:
        """First token - arrival; None if no token came."""
        return None if self.first_token_s is None else self.first_token_s - self.arrival_s

    @property
    def e2el_s(self) -> float | None:
        """Last token - arrival for a completed request; None for a failed one (see `wait_s`)."""
        return None if self.finished_s is None else self.finished_s - self.arrival_s

    @property
    def tpot_s(self) -> float | None:
        """(E2EL - TTFT) / (output tokens - 1) for a completed request of >= 2 tokens."""
        if self.failed or self.output_tokens < 2:
            return None
        assert self.finished_s is not None and self.first_token_s is not None
        return (self.finished_s - self.first_token_s) / (self.output_tokens - 1)

    def wait_s(self, trace_end_s: float) -> float:
        """E2EL as the user lived it: for a failed request, (given up, else trace end) - arrival."""
        if self.finished_s is not None:
            return self.finished_s - self.arrival_s
        end = self.given_up_s if self.given_up_s is not None else trace_end_s
        if end < self.arrival_s:
            raise ValueError(f"trace end {end} before the arrival {self.arrival_s}")
        return end - self.arrival_s


@dataclass(frozen=True, slots=True)
class SloTier:
    """A request meets the tier when its TTFT <= ttft_s and its TPOT <= tpot_s (seconds)."""

    name: str
    ttft_s: float
    tpot_s: float


TIERS: tuple[SloTier, ...] = (
    SloTier("tight", 0.450, 0.025),
    SloTier("standard", 1.0, 0.050),
    SloTier("relaxed", 2.0, 0.100),
)
"""tight: MLPerf Inference v5.0 Interactive's 450 ms TTFT, llm-d WVA Premium's ~24 ms ITL;
standard: llm-d WVA Standard 1 s / 50 ms; relaxed: llm-d WVA Freemium 2 s / 100 ms, DistServe's
chatbot-scale SLOs."""


@dataclass(frozen=True, slots=True)
class ServingSummary:
    """One trace's or one window's figures; latencies in ms, rates per second of duration."""

    requests: int
    completed: int
    failed: int
    duration_s: float
    request_throughput: float
    output_tok_s: float
    ttft_ms_mean: float
    ttft_ms_median: float
    ttft_ms_p99: float
    tpot_ms_mean: float
    tpot_ms_median: float
    tpot_ms_p99: float
    itl_ms_mean: float
    itl_ms_median: float
    itl_ms_p99: float
    e2el_ms_mean: float
    e2el_ms_median: float
    e2el_ms_p99: float
    slo_attainment: Mapping[str, float] = field(default_factory=dict)
    """Tier name -> good requests / all requests (0..1; 0 when there are no requests)."""
    request_goodput: Mapping[str, float] = field(default_factory=dict)
    """Tier name -> good requests / duration (req/s)."""
    token_goodput_tok_s: Mapping[str, float] = field(default_factory=dict)
    """Tier name -> output tokens of good requests / duration (secondary)."""

    def to_dict(self) -> dict[str, object]:
        """Stable keys for result files (`duration_s` is left out: the caller knows it)."""
        return {
            "requests": self.requests,
            "completed": self.completed,
            "failed": self.failed,
            "request_throughput": self.request_throughput,
            "output_tok_s": self.output_tok_s,
            "ttft_ms_mean": self.ttft_ms_mean,
            "ttft_ms_median": self.ttft_ms_median,
            "ttft_ms_p99": self.ttft_ms_p99,
            "tpot_ms_mean": self.tpot_ms_mean,
            "tpot_ms_median": self.tpot_ms_median,
            "tpot_ms_p99": self.tpot_ms_p99,
            "itl_ms_mean": self.itl_ms_mean,
            "itl_ms_median": self.itl_ms_median,
            "itl_ms_p99": self.itl_ms_p99,
            "e2el_ms_mean": self.e2el_ms_mean,
            "e2el_ms_median": self.e2el_ms_median,
            "e2el_ms_p99": self.e2el_ms_p99,
            "slo_attainment": dict(self.slo_attainment),
            "request_goodput": dict(self.request_goodput),
            "token_goodput_tok_s": dict(self.token_goodput_tok_s),
        }


def _stats_ms(values: Sequence[float]) -> tuple[float, float, float]:
    """Mean, median, p99 in ms as vLLM computes them (linear percentile; 0 when empty)."""
    if not values:
        return 0.0, 0.0, 0.0
    array = np.asarray(values, dtype=np.float64)
    return (
        float(np.mean(array)) * 1000,
        float(np.median(array)) * 1000,
        float(np.percentile(array, 99)) * 1000,
    )


def summarize(
    records: Iterable[RequestRecord],
    duration_s: float,
    *,
    itl: ItlHistogram | None = None,
    tiers: Sequence[SloTier] = TIERS,
    trace_end_s: float | None = None,
) -> ServingSummary:
    """The figures of `records` over `duration_s` seconds (the module docstring defines each).

    `itl`: the pooled gaps when the producer filled one histogram itself; by default the
    records' own `itl` are pooled. `trace_end_s`: when a failed request without `given_up_s`
    stopped waiting (default `duration_s`, for a trace that starts at 0)."""
    if not duration_s > 0:
        raise ValueError(f"duration {duration_s} must be > 0")
    end_s = duration_s if trace_end_s is None else trace_end_s
    records = list(records)
    if itl is None:
        itl = ItlHistogram()
        itl.merge_many(record.itl for record in records)
    ttfts: list[float] = []
    tpots: list[float] = []
    e2els: list[float] = []
    good = {tier.name: 0 for tier in tiers}
    good_tokens = {tier.name: 0 for tier in tiers}
    requests = completed = output_tokens = 0
    for record in records:
        requests += 1
        wait = record.wait_s(end_s)
        e2els.append(wait)
        ttft = record.ttft_s
        ttfts.append(wait if ttft is None else ttft)
        if record.failed:
            continue
        assert ttft is not None
        completed += 1
        output_tokens += record.output_tokens
        tpot = record.tpot_s
        if tpot is not None:
            tpots.append(tpot)
        # vLLM's all_tpots: a 1-token request's TPOT is 0 for goodput.
        tpot_for_slo = 0.0 if tpot is None else tpot
        for tier in tiers:
            if ttft <= tier.ttft_s and tpot_for_slo <= tier.tpot_s:
                good[tier.name] += 1
                good_tokens[tier.name] += record.output_tokens
    ttft_ms = _stats_ms(ttfts)
    tpot_ms = _stats_ms(tpots)
    e2el_ms = _stats_ms(e2els)
    return ServingSummary(
        requests=requests,
        completed=completed,
        failed=requests - completed,
        duration_s=duration_s,
        request_throughput=completed / duration_s,
        output_tok_s=output_tokens / duration_s,
        ttft_ms_mean=ttft_ms[0],
        ttft_ms_median=ttft_ms[1],
        ttft_ms_p99=ttft_ms[2],
        tpot_ms_mean=tpot_ms[0],
        tpot_ms_median=tpot_ms[1],
        tpot_ms_p99=tpot_ms[2],
        itl_ms_mean=itl.mean_s() * 1000,
        itl_ms_median=itl.median_s() * 1000,
        itl_ms_p99=itl.percentile_s(99) * 1000,
        e2el_ms_mean=e2el_ms[0],
        e2el_ms_median=e2el_ms[1],
        e2el_ms_p99=e2el_ms[2],
        slo_attainment={name: (n / requests if requests else 0.0) for name, n in good.items()},
        request_goodput={name: n / duration_s for name, n in good.items()},
        token_goodput_tok_s={name: n / duration_s for name, n in good_tokens.items()},
    )


def per_window(
    records: Iterable[RequestRecord],
    window_s: float,
    duration_s: float,
    *,
    tiers: Sequence[SloTier] = TIERS,
) -> list[ServingSummary]:
    """One summary per window [k * window_s, (k + 1) * window_s) of a trace [0, duration_s],
    each request in the window it ARRIVED in; the last window may be shorter (its rates divide
    by its own length) and also takes an arrival at exactly `duration_s`.

    By arrival, not completion: a request belongs to the load it arrived in. Its latency is
    what that load (and the config serving it) did to it; filed by completion, the requests an
    overload delays would land in the calm window after it, crediting the overload with the
    few that got through fast and blaming the calm for the backlog. So a window's throughput is
    the completed share of its own arrivals per second, and a window's attainment is that of
    the users who arrived in it. Failed requests without `given_up_s` wait until
    `duration_s`; each window pools its own requests' ITL."""
    if not window_s > 0:
        raise ValueError(f"window {window_s} must be > 0")
    if not duration_s > 0:
        raise ValueError(f"duration {duration_s} must be > 0")
    # A hair under the ratio so float noise (0.7 / 0.1 = 6.999...) adds no sliver of a window.
    count = max(1, math.ceil(duration_s / window_s - 1e-9))
    buckets: list[list[RequestRecord]] = [[] for _ in range(count)]
    for record in records:
        if not 0 <= record.arrival_s <= duration_s:
            raise ValueError(f"arrival {record.arrival_s} outside the trace [0, {duration_s}]")
        buckets[min(int(record.arrival_s // window_s), count - 1)].append(record)
    return [
        summarize(
            bucket,
            min(window_s, duration_s - k * window_s),
            tiers=tiers,
            trace_end_s=duration_s,
        )
        for k, bucket in enumerate(buckets)
    ]
