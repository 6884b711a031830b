"""One scrape window over the /metrics of one engine or many: the only window loop there is.

Contract: `WindowReader.read(engine, targets, window_s)` scrapes every target's /metrics URL
every `interval_s` until `window_s` seconds have passed on `clock`, then reduces each target's
snapshots to its `WindowStats` (`specpilot.runtime.scrape.window_stats`). The `specpilot
observe` command, the local actuator (`LocalEngine.observe`) and the Kubernetes actuator
(`ScrapeSource`) all read their windows here, under one set of edge rules:
- a window holds at least two snapshots: a target with fewer is left out of `Window.stats` and
  named in `Window.missing` with the reason (one snapshot would hide every counter);
- a scrape slower than the window (a busy CPU engine) does not end it with one snapshot: after
  the window, while some target has exactly one, every target is scraped again, at most
  `max_late_rounds` (MAX_LATE_ROUNDS) times, without sleeping;
- a target that stops answering keeps the snapshots it gave (a pod going away mid-window);
  scrape errors never escape `read`, they become the reason in `missing` — unless the reader
  is `fail_fast`, for one engine a person or the local actuator is waiting on, where the first
  scrape error is raised at once (an unreachable URL should not cost a whole window).
Snapshots are stamped with `clock()` as their request starts. Clock, sleep and the HTTP
transport are injected, so tests run without real time or a network. Every window's client
shares one TLS context (`tls_context`): building one loads the CA bundle, about 28 ms of CPU,
which once per window was a quarter of a busy operator's CPU (bench/operator_load.py).
"""

from __future__ import annotations

import functools
import ssl
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import httpx

from specpilot.runtime.engine_metrics import WindowStats
from specpilot.runtime.scrape import (
    ScrapeError,
    Snapshot,
    fetch_snapshot,
    window_samples,
    window_stats,
)

MAX_LATE_ROUNDS = 3
"""Extra scrape rounds after the window while a target has given only one snapshot."""


def round_interval(window_s: float, rounds: int, floor_s: float = 0.0) -> float:
    """Seconds between scrape rounds that put `rounds` intervals in a window, never under
    `floor_s`. The batch, tokens and acceptance come from counters and histogram sums, which
    the window's two end snapshots already bound (engine_metrics.running_estimate); the rounds
    between keep a restart mid-window visible and the sampled gauges their cross-check, and
    every round costs the scraper CPU and the engine a /metrics render on the cores that
    serve (bench/results/operator_load.md, bench/results/scrape_cost.md)."""
    return max(floor_s, window_s / rounds)


@functools.cache
def tls_context() -> ssl.SSLContext:
    """httpx's default verifying context, built once per process and shared by every window."""
    return httpx.create_ssl_context()


@dataclass(frozen=True, slots=True)
class Window:
    """What one window read: a `WindowStats` per target that gave two or more snapshots, in
    the order of the targets, and why each other target has none."""

    stats: list[WindowStats] = field(default_factory=list)
    missing: Mapping[str, str] = field(default_factory=dict)
    """Target name -> reason (its last scrape error, or too few snapshots)."""

    def complete(self) -> list[WindowStats]:
        """Every target's stats; `ScrapeError` naming the first target without a window."""
        if self.missing:
            name, reason = next(iter(self.missing.items()))
            raise ScrapeError(f"no window for {name}: {reason}")
        return self.stats


@dataclass(kw_only=True)
class WindowReader:
    interval_s: float = 1.0
    """Seconds between the starts of two scrape rounds inside the window."""
    timeout_s: float = 5.0
    """HTTP timeout of one scrape."""
    max_late_rounds: int = MAX_LATE_ROUNDS
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    transport: httpx.BaseTransport | None = None
    """A test transport (httpx.MockTransport) instead of the network."""
    fail_fast: bool = False
    """Raise the first `ScrapeError` instead of keeping what the target gave."""

    def read(
        self,
        engine: str,
        targets: Mapping[str, str],
        window_s: float,
        interval_s: float | None = None,
    ) -> Window:
        """One window of `window_s` seconds over `targets` (name -> /metrics URL); the name
        becomes `WindowStats.pod`. `interval_s` overrides the reader's for this window."""
        interval = self.interval_s if interval_s is None else interval_s
        snapshots: dict[str, list[Snapshot]] = {name: [] for name in targets}
        errors: dict[str, str] = {}
        deadline = self.clock() + window_s
        late_rounds = 0
        keep = window_samples(engine)  # only what window_stats reads (runtime/scrape.py)
        with httpx.Client(
            timeout=self.timeout_s, transport=self.transport, verify=tls_context()
        ) as client:
            while True:
                for name, url in targets.items():
                    try:
                        taken = fetch_snapshot(client, url, self.clock(), keep)
                        snapshots[name].append(taken)
                    except ScrapeError as exc:
                        if self.fail_fast:
                            raise
                        errors[name] = str(exc)  # it keeps what it gave
                left = deadline - self.clock()
                if left > 0:
                    self.sleep(min(interval, left))
                    continue
                short = any(len(taken) == 1 for taken in snapshots.values())
                if not short or late_rounds >= self.max_late_rounds:
                    break
                late_rounds += 1
        stats = [
            window_stats(engine, name, taken)
            for name, taken in snapshots.items()
            if len(taken) >= 2
        ]
        missing = {
            name: _reason(len(taken), errors.get(name), late_rounds)
            for name, taken in snapshots.items()
            if len(taken) < 2
        }
        return Window(stats=stats, missing=missing)


def _reason(taken: int, error: str | None, late_rounds: int) -> str:
    count = "no snapshot" if taken == 0 else "one snapshot"
    after = f" after {late_rounds} extra rounds" if late_rounds else ""
    return f"{error} ({count}{after})" if error else f"{count}{after}"
