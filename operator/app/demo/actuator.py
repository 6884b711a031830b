"""The demo's actuator: the local engine, recording every switch and the per-token latency.

Contract: `RecordingActuator` is an `Actuator` for `ControlLoop` that delegates to a
`LocalEngine` and keeps, in demo seconds (`clock()`), when each config started and became
ready. Before a process is stopped (a switch, or `close()`) it reads that process's
`request_time_per_output_token` histogram once and adds it to a run-wide total, so the
per-token latency of the whole real-time run survives the restarts (each new process counts
from zero). Requests that finish between that last read and the kill are not counted (with a
surge, those the old process finishes after the load moved).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

from specpilot.runtime.engine_metrics import histogram_quantile
from specpilot.runtime.local_engine import LocalEngine
from specpilot.runtime.scrape import ScrapeError, fetch_snapshot
from specpilot.tuner import Observation, SpecConfig

TPOT_SERIES = {
    "vllm": "vllm:request_time_per_output_token_seconds",
    "sglang": "sglang:request_time_per_output_token_seconds",
}


@dataclass(frozen=True, slots=True)
class Switch:
    started_s: float
    """When the switch began (the old process was still serving until then)."""
    ready_s: float
    """When the new process took the load (it answered /health; with a surge, the old one
    then finishes what it holds)."""
    config: SpecConfig


@dataclass
class LatencyHistogram:
    """Cumulative buckets (upper bound -> count), sum and count, added across processes."""

    buckets: dict[float, float] = field(default_factory=dict)
    total_s: float = 0.0
    count: float = 0.0

    @property
    def mean_s(self) -> float | None:
        return self.total_s / self.count if self.count else None

    def quantile(self, q: float) -> float | None:
        return histogram_quantile(q, self.buckets)


@dataclass(kw_only=True)
class RecordingActuator:
    engine: LocalEngine
    clock: Callable[[], float]
    """Seconds since the demo started."""
    switches: list[Switch] = field(default_factory=list)
    tpot: LatencyHistogram = field(default_factory=LatencyHistogram)
    restarting: bool = False
    """True while a switch is under way (read by the live view from another thread)."""

    def apply(self, config: SpecConfig) -> None:
        started = self.clock()
        self.restarting = True
        try:
            self._harvest_latency()
            self.engine.apply(config)
        finally:
            self.restarting = False
        ready = self.clock()
        if self.engine.serving_since is not None:  # a surge returns after the old one drains
            ready -= time.monotonic() - self.engine.serving_since
        self.switches.append(Switch(started, ready, config))

    def observe(self, window_s: float) -> Observation:
        return self.engine.observe(window_s)

    def close(self) -> None:
        self._harvest_latency()
        self.engine.stop()

    def _harvest_latency(self) -> None:
        if self.engine.config is None:
            return  # nothing has run yet
        name = TPOT_SERIES[self.engine.engine]
        try:
            with httpx.Client(timeout=5) as client:
                snapshot = fetch_snapshot(client, f"{self.engine.url}/metrics", time.time())
        except ScrapeError:
            return  # the process already died: its numbers are lost, the run goes on
        for labels, value in snapshot.series(f"{name}_bucket").items():
            bound = float(dict(labels)["le"])
            self.tpot.buckets[bound] = self.tpot.buckets.get(bound, 0.0) + value
        self.tpot.total_s += sum(snapshot.series(f"{name}_sum").values())
        self.tpot.count += sum(snapshot.series(f"{name}_count").values())
