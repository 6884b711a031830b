"""Load shaping, as pure functions over both kinds of trace, and generated Poisson load.

Contract:
- `time_scale(trace, factor)` compresses time: every arrival (or rate-curve row time) is divided
  by `factor`, so a rate curve's rates are multiplied by it. `factor` > 1 makes a trace busier
  and shorter, < 1 calmer and longer.
- `scale_to_peak_load(trace, peak, capacity_rps)` makes the busiest minute offer `peak` x the
  capacity the caller measured (requests/s without speculation on that setup). It compresses
  time by `peak_load_factor(...)` rather than thinning: thinning can only lower a rate, and a
  public trace is usually below one engine's capacity (Azure conversation: ~5.4 req/s at its
  busiest minute, an 8B model on an H100 serves far more), so reaching 1.2 x capacity needs a
  denser trace; compressing also keeps every request and its lengths, is exact and needs no
  seed, and keeps the trace's shape over time (bursts, lulls) at a uniform scale. The cost is a
  shorter replay. "The busiest minute" is the sliding 60 s window holding the most arrivals
  (request traces) or expected arrivals (rate curves); for request traces the result's busiest
  minute holds round(peak x capacity x 60) requests, so its rate is within 1/120 req/s of the
  target.
- `amplify_to_peak_load(trace, peak, capacity_rps, seed)` reaches the same busiest minute while
  keeping the trace's clock (duplicating or thinning requests; rate curves scaled): what the
  bench's `--peak-load` uses, so a trace's load moves as fast as it did when recorded.
- `poisson_requests(rate_rps, duration_s, shape, seed)` generates Poisson arrivals with tasks
  and lengths from a `RequestShape`; the same seed gives the same trace, and traces at
  different rates with one seed share their random numbers (request i has the same task and
  lengths, its arrival scaled), so a latency-vs-rate curve compares like with like.
- `parse_poisson_sweep("0.1:1.3:8")` -> 8 evenly spaced fractions of capacity from 0.1 to 1.3.
- No shaping makes a runaway: a factor that would push times past what a float counts in
  (`MAX_TRACE_S`) or requests past `MAX_REQUESTS` is a `ConfigError` naming the flag and its
  bound, before anything is generated.
"""

from __future__ import annotations

import math
import random
from bisect import bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Protocol, overload

from specpilot.runtime.request_traces import RequestTrace, TraceRequest, normalise_mix
from specpilot.runtime.traces import Trace, TraceRow
from specpilot.tuner import ConfigError

MINUTE_S = 60.0
MAX_REQUESTS = 10_000_000
"""The most requests shaping or generation may produce: a guard against a factor or a rate that
would loop or fill memory for hours (a week of a busy trace is well under it)."""
MAX_TRACE_S = 1e9
"""The longest trace in seconds (about 31 years); past it, adding a second to a float time
no longer moves it reliably."""


def _check_positive(name: str, value: float) -> float:
    if isinstance(value, bool) or not math.isfinite(value) or value <= 0:
        raise ConfigError(name, value, "a positive number")
    return float(value)


@overload
def time_scale(trace: RequestTrace, factor: float) -> RequestTrace: ...
@overload
def time_scale(trace: Trace, factor: float) -> Trace: ...
def time_scale(trace: RequestTrace | Trace, factor: float) -> RequestTrace | Trace:
    """`--time-scale F`: arrivals (row times) divided by F; a rate curve's rates times F."""
    factor = _check_positive("--time-scale", factor)
    if trace.duration_s / factor > MAX_TRACE_S:
        allowed = f"at least {trace.duration_s / MAX_TRACE_S:g}"
        raise ConfigError("--time-scale", factor, allowed, f"traces up to {MAX_TRACE_S:g} s")
    if isinstance(trace, Trace):
        rows = tuple(TraceRow(r.t / factor, r.rps * factor, r.mix) for r in trace.rows)
        return Trace(trace.name, rows)
    requests = tuple(replace(r, arrival_s=r.arrival_s / factor) for r in trace.requests)
    return replace(trace, requests=requests)


def busiest_minute_rps(trace: RequestTrace | Trace) -> float:
    """The arrival rate of the busiest sliding minute: the most arrivals in any [t, t + 60 s)
    (request traces), or the most expected arrivals in any 60 s (rate curves), over 60."""
    if isinstance(trace, Trace):
        return _curve_busiest(trace, MINUTE_S) / MINUTE_S
    arrivals = [r.arrival_s for r in trace.requests]
    best, first = 0, 0
    for last, t in enumerate(arrivals):
        while t - arrivals[first] >= MINUTE_S:
            first += 1
        best = max(best, last - first + 1)
    return best / MINUTE_S


def peak_load_factor(trace: RequestTrace | Trace, peak: float, capacity_rps: float) -> float:
    """The time-scale factor that makes the busiest minute offer `peak` x `capacity_rps`."""
    peak = _check_positive("--peak-load", peak)
    capacity_rps = _check_positive("capacity (requests/s)", capacity_rps)
    target = peak * capacity_rps * MINUTE_S  # arrivals in the busiest minute
    if isinstance(trace, Trace):
        return _curve_window_for(trace, target, peak) / MINUTE_S
    arrivals = [r.arrival_s for r in trace.requests]
    k = max(1, round(target))
    if k > len(arrivals):
        hint = f"the trace has {len(arrivals)} requests; a minute cannot hold {k}"
        raise ConfigError("--peak-load", peak, f"at most {len(arrivals) / target * peak:g}", hint)
    # The busiest window of width w holds k arrivals exactly when the tightest k consecutive
    # arrivals span less than w and the tightest k + 1 do not: pick w between the two spans.
    low = _tightest_span(arrivals, k)
    high = _tightest_span(arrivals, k + 1) if k < len(arrivals) else math.inf
    if math.isinf(high):
        window = max(2 * low, MINUTE_S)
    elif high > low:
        window = (low + high) / 2
    else:  # ties in the trace: k + 1 arrivals at once, the nearest reachable is above k
        window = low * (1 + 1e-9) + 1e-9
    return window / MINUTE_S


@overload
def scale_to_peak_load(trace: RequestTrace, peak: float, capacity_rps: float) -> RequestTrace: ...
@overload
def scale_to_peak_load(trace: Trace, peak: float, capacity_rps: float) -> Trace: ...
def scale_to_peak_load(
    trace: RequestTrace | Trace, peak: float, capacity_rps: float
) -> RequestTrace | Trace:
    """`--peak-load F`: the trace with time compressed so its busiest minute offers F x capacity."""
    factor = peak_load_factor(trace, peak, capacity_rps)
    if isinstance(trace, Trace):
        return time_scale(trace, factor)
    return time_scale(trace, factor)


def amplify_to_peak_load(
    trace: RequestTrace | Trace, peak: float, capacity_rps: float, seed: int = 0
) -> RequestTrace | Trace:
    """`--peak-load F` keeping the trace's clock: its busiest minute offers F x capacity while an
    hour stays an hour, so load moves as fast as it did when it was recorded (compressing time
    would make a tuner with minute-long windows and restarts chase load that moves F-fold
    faster than any real one). A rate curve's rates are multiplied by the factor. A request
    trace is amplified: each request is kept `floor(m)` times and once more with probability
    `m - floor(m)` (m < 1 thins it), the copies spread uniformly between the request's arrival
    and the next one's, with the original's lengths and task, seeded. The busiest minute then
    offers F x capacity in expectation (a draw moves it by a few percent)."""
    peak = _check_positive("--peak-load", peak)
    capacity_rps = _check_positive("capacity (requests/s)", capacity_rps)
    busiest = busiest_minute_rps(trace)
    if busiest <= 0:
        raise ConfigError("--peak-load", peak, "a trace with some traffic", "it offers none")
    factor = peak * capacity_rps / busiest
    size = expected_arrivals(trace) if isinstance(trace, Trace) else len(trace.requests)
    if size * factor > MAX_REQUESTS:
        allowed = f"at most {peak * MAX_REQUESTS / (size * factor):.3g}"
        raise ConfigError("--peak-load", peak, allowed, f"{MAX_REQUESTS:,} requests at most")
    if isinstance(trace, Trace):
        rows = tuple(replace(row, rps=row.rps * factor) for row in trace.rows)
        return Trace(trace.name, rows)
    rng = random.Random(seed)
    requests = trace.requests
    mean_gap = trace.duration_s / max(1, len(requests))
    out: list[TraceRequest] = []
    for i, request in enumerate(requests):
        gap = requests[i + 1].arrival_s - request.arrival_s if i + 1 < len(requests) else mean_gap
        copies = math.floor(factor) + (rng.random() < factor - math.floor(factor))
        for j in range(copies):
            arrival = request.arrival_s + (rng.uniform(0.0, gap) if j else 0.0)
            out.append(replace(request, arrival_s=arrival))
    out.sort(key=lambda r: r.arrival_s)
    return replace(trace, requests=tuple(out))


def expected_arrivals(trace: Trace) -> float:
    """The requests a rate curve offers over its whole length, in expectation."""
    return sum(
        row.rps * (end.t - row.t) for row, end in zip(trace.rows, trace.rows[1:], strict=False)
    )


def _tightest_span(arrivals: Sequence[float], k: int) -> float:
    return min(arrivals[i + k - 1] - arrivals[i] for i in range(len(arrivals) - k + 1))


def _curve_busiest(trace: Trace, width: float) -> float:
    """The most expected arrivals a rate curve offers in any window of `width` seconds."""
    times = [r.t for r in trace.rows]
    cumulative = [0.0]
    for row, end in zip(trace.rows, times[1:], strict=False):
        cumulative.append(cumulative[-1] + row.rps * (end - row.t))

    def arrivals_by(t: float) -> float:  # expected arrivals in [0, t]
        t = min(max(t, 0.0), times[-1])
        i = min(bisect_right(times, t) - 1, len(times) - 2)
        return cumulative[i] + trace.rows[i].rps * (t - times[i])

    # The integral over a sliding window is piecewise linear in its start, so its maximum is
    # where the start or the end meets a row boundary.
    starts = set(times) | {t - width for t in times}
    return max(arrivals_by(s + width) - arrivals_by(s) for s in starts)


def _curve_window_for(trace: Trace, target: float, peak: float) -> float:
    """The narrowest window (original seconds) over which the curve offers `target` arrivals."""
    total = _curve_busiest(trace, trace.duration_s)
    if target > total:
        hint = f"the curve offers {total:.0f} requests in all; a minute cannot hold {target:.0f}"
        raise ConfigError("--peak-load", peak, f"at most {total / target * peak:g}", hint)
    low, high = 0.0, trace.duration_s
    for _ in range(200):
        middle = (low + high) / 2
        if _curve_busiest(trace, middle) >= target:
            high = middle
        else:
            low = middle
        if high - low <= 1e-12 * high:
            break
    return high


class RequestShape(Protocol):
    """Where a generated request's task and lengths come from."""

    @property
    def task_mix(self) -> tuple[tuple[str, float], ...]: ...

    def draw(self, rng: random.Random) -> tuple[str, int, int]:
        """(task, prompt tokens, output tokens)."""
        ...


@dataclass(frozen=True, slots=True)
class TaskShapes:
    """A task drawn from the mix, then its typical (prompt, output) lengths within +-spread,
    as the fast-mode replay draws them (pass the emulator's TASK_SHAPES)."""

    lengths: tuple[tuple[str, int, int], ...]
    task_mix: tuple[tuple[str, float], ...]
    spread: float = 0.5

    @classmethod
    def of(
        cls,
        shapes: Mapping[str, tuple[int, int]],
        mix: Mapping[str, float] | None = None,
        spread: float = 0.5,
    ) -> TaskShapes:
        pairs = normalise_mix(mix)
        for task, _ in pairs:
            if task not in shapes:
                raise ConfigError("task shape", task, " | ".join(shapes))
        if not 0 <= spread < 1:
            raise ConfigError("length spread", spread, "a number in [0, 1)")
        lengths = tuple((task, *shapes[task]) for task, _ in pairs)
        return cls(lengths, pairs, spread)

    def draw(self, rng: random.Random) -> tuple[str, int, int]:
        index = rng.choices(range(len(self.lengths)), [w for _, w in self.task_mix])[0]
        task, prompt, output = self.lengths[index]
        low, high = 1 - self.spread, 1 + self.spread
        prompt_tokens = max(1, round(prompt * rng.uniform(low, high)))
        return task, prompt_tokens, max(1, round(output * rng.uniform(low, high)))


@dataclass(frozen=True, slots=True)
class TraceShapes:
    """A request of a recorded trace drawn at random: its task and both lengths together
    (a real trace's length distribution, on Poisson arrivals)."""

    requests: tuple[TraceRequest, ...]
    task_mix: tuple[tuple[str, float], ...]

    @classmethod
    def of(cls, trace: RequestTrace) -> TraceShapes:
        if not trace.requests:
            raise ConfigError("trace shape", trace.name, "a trace with requests")
        return cls(trace.requests, trace.task_mix)

    def draw(self, rng: random.Random) -> tuple[str, int, int]:
        r = self.requests[rng.randrange(len(self.requests))]
        return r.task, r.prompt_tokens, r.output_tokens


def poisson_requests(
    rate_rps: float, duration_s: float, shape: RequestShape, seed: int
) -> RequestTrace:
    """Poisson arrivals at `rate_rps` over [0, `duration_s`), each request drawn from `shape`."""
    rate_rps = _check_positive("poisson rate (requests/s)", rate_rps)
    duration_s = _check_positive("poisson duration (s)", duration_s)
    if rate_rps * duration_s > MAX_REQUESTS:
        allowed = f"at most {MAX_REQUESTS / duration_s:g}"
        raise ConfigError("poisson rate (requests/s)", rate_rps, allowed, "too many requests")
    rng = random.Random(seed)
    requests: list[TraceRequest] = []
    t = rng.expovariate(rate_rps)
    while t < duration_s:
        task, prompt, output = shape.draw(rng)
        requests.append(TraceRequest(t, prompt, output, task))
        t += rng.expovariate(rate_rps)
    return RequestTrace(f"poisson-{rate_rps:g}rps", tuple(requests), "poisson", shape.task_mix)


_SWEEP_FORMAT = (
    "start:stop:count, fractions of the no-speculation capacity with 0 < start <= stop and an "
    "integer count >= 1 (1 only when start = stop), e.g. 0.1:1.3:8"
)


def parse_poisson_sweep(spec: str) -> tuple[float, ...]:
    """`--poisson start:stop:count` -> `count` evenly spaced fractions from start to stop."""
    parts = spec.split(":")
    if len(parts) != 3:
        raise ConfigError("--poisson", spec, _SWEEP_FORMAT, f"{len(parts)} fields, not 3")
    try:
        start, stop = float(parts[0]), float(parts[1])
        count = int(parts[2])
    except ValueError:
        raise ConfigError("--poisson", spec, _SWEEP_FORMAT, "not numbers") from None
    if not (math.isfinite(start) and math.isfinite(stop)) or not 0 < start <= stop:
        raise ConfigError("--poisson", spec, _SWEEP_FORMAT, "need 0 < start <= stop")
    if count < 1 or (count == 1 and start != stop):
        raise ConfigError("--poisson", spec, _SWEEP_FORMAT, "bad count")
    if count == 1:
        return (start,)
    step = (stop - start) / (count - 1)
    return tuple(stop if i == count - 1 else start + i * step for i in range(count))
