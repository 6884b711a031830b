"""The demo's load generator: a trace's Poisson arrivals as real OpenAI /v1/completions requests.

Contract: `plan_requests(trace, seed)` draws the request sequence (arrival time, task, prompt and
output lengths) with the very draws and call order of the bench's fast-mode traffic
(`runtime/emulator/arrivals.py`, as operator/app/bench/traffic.py uses them), so a real-time run
and a fast-mode run with the same seed serve the same requests. `LoadGenerator.run(...)` sends
each request at its arrival time (seconds after `start`, a `time.monotonic()` value) and waits
for the whole answer (no streaming: one response per request keeps the client cheap on two
cores). The client is aiohttp's, not httpx's: at 50 requests/s here httpx's AsyncClient spent
~12 ms of CPU per request against ~1.6 ms for aiohttp, and fell behind the schedule. A request
that fails in transport (the engine is restarting: refused or reset connections) is sent
again until it succeeds or the trace ends, as a client behind a load balancer would; its
latency counts from the first arrival. Requests unfinished at the end are cancelled; the
demo's report counts them as misses that waited until the end, as fast mode does
(runtime/serving_metrics.py).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp

# The fast-mode traffic's own arrival and request draws: reusing them (rather than a copy) is
# what makes both modes see the identical request sequence for a seed.
from specpilot.runtime.emulator.arrivals import draw_arrival, draw_request
from specpilot.runtime.emulator.core import Request
from specpilot.runtime.traces import Trace

RETRY_DELAY_S = 0.25
"""Pause before resending a request the engine dropped (it is restarting)."""


def plan_requests(trace: Trace, seed: int) -> list[Request]:
    rng = random.Random(seed)
    planned: list[Request] = []
    arrival = draw_arrival(trace, 0.0, rng)
    while arrival is not None:
        planned.append(draw_request(trace, arrival, len(planned) + 1, rng))
        arrival = draw_arrival(trace, arrival, rng)
    return planned


@dataclass(frozen=True, slots=True)
class Completed:
    arrival_s: float
    """Seconds after start, as planned."""
    finished_s: float
    task: str
    tokens: int
    attempts: int


@dataclass
class LoadStats:
    sent: int = 0
    in_flight: int = 0
    resent: int = 0
    """Requests sent more than once because a restart dropped them."""
    errors: int = 0
    """Requests answered with an HTTP error status (not retried)."""
    completed: list[Completed] = field(default_factory=list)


@dataclass(kw_only=True)
class LoadGenerator:
    url: Callable[[], str]
    """The engine's base URL now, e.g. http://127.0.0.1:8000, read per request (a surge moves
    it to the new engine's port)."""
    model: str
    stats: LoadStats = field(default_factory=LoadStats)

    async def run(self, planned: list[Request], start: float, end_s: float) -> LoadStats:
        """Send `planned` on schedule until `end_s` seconds after `start`."""
        # No pool limit: at saturation hundreds of requests wait inside the engine at once, as
        # they would from many clients; a client-side cap would queue them here instead.
        connector = aiohttp.TCPConnector(limit=0)
        timeout = aiohttp.ClientTimeout(total=None)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as client:
            tasks: set[asyncio.Task[None]] = set()
            for request in planned:
                if request.arrival_s >= end_s:
                    break
                delay = start + request.arrival_s - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                task = asyncio.create_task(self._send(client, request, start, end_s))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            remaining = start + end_s - time.monotonic()
            if tasks and remaining > 0:
                await asyncio.wait(tasks, timeout=remaining)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        return self.stats

    async def _send(
        self, client: aiohttp.ClientSession, request: Request, start: float, end_s: float
    ) -> None:
        body = {
            "model": self.model,
            # The emulator counts whitespace-separated words as prompt tokens.
            "prompt": " ".join(["tok"] * request.prompt_tokens),
            "max_tokens": request.max_tokens,
            "task": request.task,
        }
        self.stats.sent += 1
        self.stats.in_flight += 1
        attempts = 0
        try:
            while time.monotonic() - start < end_s:
                attempts += 1
                try:
                    async with client.post(f"{self.url()}/v1/completions", json=body) as response:
                        if response.status != 200:
                            self.stats.errors += 1
                            return
                        answer = await response.json()
                except aiohttp.ClientConnectionError:
                    if attempts == 1:
                        self.stats.resent += 1
                    await asyncio.sleep(RETRY_DELAY_S)
                    continue
                tokens = int(answer["usage"]["completion_tokens"])
                self.stats.completed.append(
                    Completed(
                        arrival_s=request.arrival_s,
                        finished_s=time.monotonic() - start,
                        task=request.task,
                        tokens=tokens,
                        attempts=attempts,
                    )
                )
                return
        finally:
            self.stats.in_flight -= 1
