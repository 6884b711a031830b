"""A rate curve's requests: Poisson arrivals at the trace's rate, each with a task and lengths.

Contract: `draw_arrival(trace, after, rng)` is the next arrival after `after` (or None past the
trace's end), `draw_request(trace, arrival, number, rng)` the request arriving then: its task
drawn from the trace's mix at that moment, its prompt and output lengths within +-50% of the
task's shape (`fast_sweep.TASK_SHAPES`). Both draw from `rng` in a fixed order, so callers that
alternate them from one seed see one request sequence: the demo's load generator
(operator/app/demo/load.py, real HTTP requests) and the bench's traffic
(operator/app/bench/traffic.py, fast mode) serve the very same requests for a seed.
"""

from __future__ import annotations

import random

from specpilot.runtime.emulator.core import Request
from specpilot.runtime.emulator.fast_sweep import TASK_SHAPES
from specpilot.runtime.traces import Trace


def draw_arrival(trace: Trace, after: float, rng: random.Random) -> float | None:
    """The first Poisson arrival after `after` at the trace's rate (seconds), or None past its
    end. Memoryless across rows: past a row boundary the draw restarts there at the new rate."""
    t = after
    while t < trace.duration_s:
        row = trace.row_at(t)
        next_row_t = next((r.t for r in trace.rows if r.t > t), trace.duration_s)
        if row.rps > 0:
            candidate = t + rng.expovariate(row.rps)
            if candidate < next_row_t:
                return candidate
        t = next_row_t  # memoryless: redraw from the row boundary at the new rate
    return None


def draw_request(trace: Trace, arrival: float, number: int, rng: random.Random) -> Request:
    """Request number `number` (id `r<number>`) arriving at `arrival`: its task drawn from the
    trace's mix there, its prompt and output lengths within +-50% of the task's shape."""
    tasks, weights = zip(*trace.row_at(arrival).mix, strict=True)
    task = rng.choices(tasks, weights)[0]
    prompt, output = TASK_SHAPES[task]
    return Request(
        request_id=f"r{number}",
        task=task,
        prompt_tokens=max(1, round(prompt * rng.uniform(0.5, 1.5))),
        max_tokens=max(2, round(output * rng.uniform(0.5, 1.5))),
        arrival_s=arrival,
    )
