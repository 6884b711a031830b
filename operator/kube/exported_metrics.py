"""The operator's own Prometheus metrics, per SpecDeployment, served by prometheus_client.

Contract: one private registry (tests and a second operator in the same process never clash)
with, labelled by namespace and name:
- `specpilot_decisions_total{action}`: tuning decisions by kind (stay, switch, off, rollback,
  recommend, error);
- `specpilot_current_config_info{method,k,description}`: the running config;
- `specpilot_predicted_gain_ratio` / `specpilot_realized_gain_ratio`: the last switch's
  predicted relative gain, and what the first window after it measured (tokens/s after over
  tokens/s before, minus 1);
- `specpilot_regime{regime}`: 1 for the current regime, 0 for the others;
- `specpilot_observation_age_seconds`: seconds since the last observation with data,
  computed at scrape time;
- `specpilot_tick_duration_seconds` (a histogram over all objects, no labels): a tuning tick's
  own work, observe -> decide -> write, with the waits it spends in `sleep` (the observation
  window's pauses, rollout polling) left out, so it reads how busy the operator is, not how
  long a window is (`TickTimer`).
`serve(port)` starts the HTTP endpoint (0: none); `forget(namespace, name)` drops an object's
series when it is deleted.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    start_http_server,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from specpilot.tuner import SpecConfig

REGISTRY = CollectorRegistry(auto_describe=True)
KEYS = ("namespace", "name")
REGIMES = ("memory-bound", "transition", "compute-bound", "unknown")

DECISIONS = Counter(
    "specpilot_decisions", "Tuning decisions by kind.", [*KEYS, "action"], registry=REGISTRY
)
CONFIG = Info(
    "specpilot_current_config", "The speculative config running.", KEYS, registry=REGISTRY
)
PREDICTED = Gauge(
    "specpilot_predicted_gain_ratio",
    "Relative throughput gain the tuner predicted for its last switch.",
    KEYS,
    registry=REGISTRY,
)
REALIZED = Gauge(
    "specpilot_realized_gain_ratio",
    "Relative throughput gain measured in the first window after the last switch.",
    KEYS,
    registry=REGISTRY,
)
REGIME = Gauge(
    "specpilot_regime", "Load regime (1 = current).", [*KEYS, "regime"], registry=REGISTRY
)

TICK_SECONDS = Histogram(
    "specpilot_tick_duration_seconds",
    "A tuning tick's work (observe, decide, write), its sleeps left out.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.5, 5.0, 10.0, 30.0),
    registry=REGISTRY,
)

_lock = threading.Lock()
_last_observation: dict[tuple[str, str], float] = {}
_before_switch: dict[tuple[str, str], float] = {}


class _AgeCollector(Collector):
    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "specpilot_observation_age_seconds",
            "Seconds since the last observation with data.",
            labels=list(KEYS),
        )
        now = time.time()
        with _lock:
            for (namespace, name), when in _last_observation.items():
                family.add_metric([namespace, name], now - when)
        yield family


REGISTRY.register(_AgeCollector())


def record_config(namespace: str, name: str, config: SpecConfig) -> None:
    k = str(config.max_k) if config.speculative else "0"
    CONFIG.labels(namespace, name).info(
        {"method": config.method, "k": k, "description": config.describe()}
    )


def record_tick(
    namespace: str,
    name: str,
    *,
    action: str,
    regime: str,
    tokens_per_s: float | None,
    switched: bool,
    predicted_gain: float,
) -> None:
    """One tuning tick. A switch remembers tokens/s before it; the next tick with data sets
    the realized gain against it."""
    key = (namespace, name)
    DECISIONS.labels(namespace, name, action).inc()
    for known in REGIMES:
        REGIME.labels(namespace, name, known).set(1.0 if known == regime else 0.0)
    with _lock:
        if tokens_per_s is not None:
            _last_observation[key] = time.time()
            before = _before_switch.pop(key, None)
            if before:
                REALIZED.labels(namespace, name).set(tokens_per_s / before - 1.0)
        if switched:
            PREDICTED.labels(namespace, name).set(predicted_gain)
            if tokens_per_s:
                _before_switch[key] = tokens_per_s


class TickTimer:
    """Times one tick: pass `timer.sleep` as the tick's only wait, then `observe()` once the
    tick ran; the time spent waiting in `sleep` is left out of the observed duration."""

    def __init__(
        self, sleep: Callable[[float], None], clock: Callable[[], float] = time.perf_counter
    ) -> None:
        self._sleep, self._clock = sleep, clock
        self._started, self._waited = clock(), 0.0

    def sleep(self, seconds: float) -> None:
        began = self._clock()
        try:
            self._sleep(seconds)
        finally:
            self._waited += self._clock() - began

    def observe(self) -> float:
        worked = max(0.0, self._clock() - self._started - self._waited)
        TICK_SECONDS.observe(worked)
        return worked


def forget(namespace: str, name: str) -> None:
    for metric in (CONFIG, PREDICTED, REALIZED):
        with contextlib.suppress(KeyError):  # never recorded
            metric.remove(namespace, name)
    for labelled in (DECISIONS, REGIME):
        for labels in _series(labelled):
            if labels[:2] == (namespace, name):
                labelled.remove(*labels)
    with _lock:
        _last_observation.pop((namespace, name), None)
        _before_switch.pop((namespace, name), None)


def _series(metric: Counter | Gauge) -> set[tuple[str, ...]]:
    return {tuple(labels) for labels in metric._metrics}


def serve(port: int, addr: str = "0.0.0.0") -> None:
    if port:
        start_http_server(port, addr=addr, registry=REGISTRY)
