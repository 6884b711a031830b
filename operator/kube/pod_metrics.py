"""Engine metrics of a set of pods over one window: scraped directly or read from Prometheus.

Contract: `pod_target(pod)` turns a Ready pod with an IP into a `PodTarget` (its /metrics
URL and the config it runs); the port is the pod's `prometheus.io/port` annotation, else the
container port named `http` or `metrics`, else the first container port. A `PodWindowSource`
returns one `WindowStats` per pod for a window of `window_s` seconds that ends when the call
returns:
- `ScrapeSource` scrapes every target's /metrics every `interval_s` (or a quarter of a longer
  window) across the window with the runtime's window reader (`specpilot.runtime.window`,
  whose edge rules apply: a pod that stops answering mid-window keeps the snapshots it gave;
  one with fewer than two is left out);
- `PrometheusSource` waits the window, then reads it with PromQL, keeping the targets' pods
  (Prometheus' pod label must carry the pod name, as Kubernetes service discovery sets it).
Clock and sleep are injected, so tests run without real time.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from specpilot.operator.kube.rollout import pod_config, pod_ready
from specpilot.runtime.engine_metrics import WindowStats
from specpilot.runtime.promql import PromQLReader
from specpilot.runtime.window import WindowReader, round_interval

Obj = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class PodTarget:
    name: str
    url: str
    """The pod's /metrics URL."""
    config: Any
    """The config the pod runs, as parsed JSON from its annotation (None when unknown)."""


def pod_target(pod: Obj) -> PodTarget | None:
    """The scrape target of a Ready pod; None while it is not Ready or has no IP or port."""
    meta: Obj = pod.get("metadata") or {}
    ip = (pod.get("status") or {}).get("podIP")
    if not ip or not pod_ready(pod) or meta.get("deletionTimestamp"):
        return None
    annotations: Obj = meta.get("annotations") or {}
    port = annotations.get("prometheus.io/port") or _container_port(pod)
    if port is None:
        return None
    path = annotations.get("prometheus.io/path", "/metrics")
    return PodTarget(str(meta.get("name")), f"http://{ip}:{port}{path}", pod_config(pod))


def _container_port(pod: Obj) -> int | None:
    ports = [
        port
        for container in (pod.get("spec") or {}).get("containers") or []
        for port in container.get("ports") or []
    ]
    for wanted in ("http", "metrics"):
        for port in ports:
            if port.get("name") == wanted:
                return int(port["containerPort"])
    return int(ports[0]["containerPort"]) if ports else None


class PodWindowSource(Protocol):
    def window(
        self, engine: str, targets: Sequence[PodTarget], window_s: float
    ) -> list[WindowStats]: ...


@dataclass(kw_only=True)
class ScrapeSource(WindowReader):
    """The runtime's one window reader over the pods' /metrics URLs, named by pod. Rounds are
    `interval_s` apart, or a `rounds_per_window`-th of a longer window (`round_interval`): at
    200 SpecDeployments with 30 s intervals, 10014 scrapes in a load run against 21581 with a
    round every 2 s (bench/results/operator_load.md)."""

    interval_s: float = 2.0
    rounds_per_window: int = 4

    def window(
        self, engine: str, targets: Sequence[PodTarget], window_s: float
    ) -> list[WindowStats]:
        interval = round_interval(window_s, self.rounds_per_window, self.interval_s)
        return self.read(engine, {t.name: t.url for t in targets}, window_s, interval).stats


@dataclass(kw_only=True)
class PrometheusSource:
    reader: PromQLReader
    wall_clock: Callable[[], float] = time.time
    sleep: Callable[[float], None] = time.sleep
    settle_s: float = 0.0
    """Extra wait after the window so the last scrape lands (about one scrape interval)."""
    keep_only_targets: bool = True

    def window(
        self, engine: str, targets: Sequence[PodTarget], window_s: float
    ) -> list[WindowStats]:
        self.sleep(window_s + self.settle_s)
        stats = self.reader.window_stats(engine, window_s, self.wall_clock() - self.settle_s)
        if not self.keep_only_targets:
            return stats
        names = {t.name for t in targets}
        return [s for s in stats if s.pod in names]
