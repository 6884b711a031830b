"""The bench's traffic as a fixed list of requests, the same for every policy and world.

Contract: `requests_from_rates(trace, seed)` draws a rate curve's Poisson arrivals, tasks and
lengths (runtime/emulator/arrivals.py's draws, so a seed gives one sequence);
`requests_from_trace(trace)` replays a per-request trace (Azure, Mooncake) as it is.
`no_spec_capacity_rps(cost, shapes)` is the request rate one replica without speculation
serves at max-num-seqs on the nominal world (closed loop, fast mode, the traffic's own request
shapes), which `--peak-load` and `--poisson` are fractions of. Every policy and world of one
bench replays the same templates, so their differences are theirs, not the traffic's.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from specpilot.runtime.emulator.arrivals import draw_arrival, draw_request
from specpilot.runtime.emulator.core import DEFAULT_MAX_NUM_SEQS, EngineCore, Request
from specpilot.runtime.load_shaping import MAX_REQUESTS, MAX_TRACE_S, expected_arrivals
from specpilot.runtime.request_traces import RequestTrace
from specpilot.runtime.traces import Trace
from specpilot.tuner import ConfigError, SpecConfig, StepCost


@dataclass(frozen=True, slots=True)
class RequestTemplate:
    arrival_s: float
    task: str
    prompt_tokens: int
    output_tokens: int


def requests_from_rates(trace: Trace, seed: int) -> tuple[RequestTemplate, ...]:
    """The curve's requests; a curve offering more than MAX_REQUESTS (or whose times are too
    far out for a float to step through) is a ConfigError, not a run that never ends."""
    expected = expected_arrivals(trace)
    if expected > MAX_REQUESTS or trace.duration_s > MAX_TRACE_S:
        raise ConfigError(
            "trace",
            trace.name,
            f"at most {MAX_REQUESTS:,} requests over at most {MAX_TRACE_S:g} s",
            f"it offers {expected:.3g} requests over {trace.duration_s:.3g} s",
        )
    rng = random.Random(seed)
    out: list[RequestTemplate] = []
    arrival = draw_arrival(trace, 0.0, rng)
    while arrival is not None:
        if len(out) >= MAX_REQUESTS:  # a Poisson draw far above its expectation
            raise ConfigError("trace", trace.name, f"at most {MAX_REQUESTS:,} requests")
        request = draw_request(trace, arrival, len(out) + 1, rng)
        out.append(
            RequestTemplate(arrival, request.task, request.prompt_tokens, request.max_tokens)
        )
        arrival = draw_arrival(trace, arrival, rng)
    return tuple(out)


def requests_from_trace(trace: RequestTrace) -> tuple[RequestTemplate, ...]:
    return tuple(
        RequestTemplate(r.arrival_s, r.task, max(1, r.prompt_tokens), max(2, r.output_tokens))
        for r in trace.requests
    )


def no_spec_capacity_rps(
    cost: StepCost,
    shapes: tuple[RequestTemplate, ...],
    *,
    duration_s: float = 90.0,
    warmup_s: float = 30.0,
) -> float:
    """Requests/s one replica without speculation completes when max-num-seqs requests are
    always in flight (closed loop), on `cost` (the nominal world), with request shapes taken
    in turn from `shapes` (the traffic's own)."""
    core = EngineCore(config=SpecConfig(), performance=cost, seed=0)
    taken = 0

    def next_request(at: float) -> Request:
        nonlocal taken
        shape = shapes[taken % len(shapes)]
        taken += 1
        return Request(
            request_id=f"c{taken}",
            task=shape.task,
            prompt_tokens=shape.prompt_tokens,
            max_tokens=shape.output_tokens,
            arrival_s=at,
        )

    for _ in range(DEFAULT_MAX_NUM_SEQS):
        core.add_request(next_request(0.0))
    now, completed = 0.0, 0
    while now < duration_s:
        outcome = core.step(now)
        if outcome is None:
            break
        now += outcome.duration_s
        for _ in outcome.finished:
            completed += now >= warmup_s
            core.add_request(next_request(now))
    return completed / max(now - warmup_s, 1e-9)
