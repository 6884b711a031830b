"""PromQL reader: a Prometheus server -> one `WindowStats` per pod.

Contract: for a window of `window_s` seconds ending at `end` (unix seconds), counters are read
with `increase()` and `resets()`, gauges with `avg_over_time()`, histograms with `increase()` of
their buckets, `_sum` and `_count` (the integrals behind the running batch: the same numbers
`specpilot.runtime.scrape.window_stats` reads from two snapshots), all grouped by the pod label
(default `pod`; `instance` for static scrape configs). Prometheus handles counter resets in
`increase()`.

Each pod's `WindowStats.window_s` is the span its `increase()` figures speak for, not the window
asked: Prometheus extrapolates a counter's samples to the window's edges only where they reach
within 1.1 average sample spacings of an edge, and by half a spacing where they do not. A
Prometheus that scraped late or missed scrapes returns the increase over fewer seconds than the
window, and dividing it by the whole window read every rate low (beside stress-ng, a contract
test read the running batch through Prometheus at 1.25 where the direct two scrapes read 3.89).
The span comes from the raw samples of one counter every engine exports (all of a pod's series
are scraped together); where a pod has fewer than two, the window asked is used. Prometheus'
clamp at a counter's zero point (a pod started inside the window) is not modelled.

Transport and query errors become `PromQLError`; a query that times out is not asked again (a
server that is slow now stays slow: a tick waits one `timeout_s`, not one per retry), while
refused connections and 5xx answers are retried as the client does; series
that are missing, NaN, infinite or malformed (a value that is not a number, a bucket `le` that
is not a number, a `position` that is not a whole number) are simply absent from the stats,
never raised.
"""

from __future__ import annotations

import math
from typing import Any

from prometheus_api_client import PrometheusConnect
from prometheus_api_client.exceptions import PrometheusApiClientException
from urllib3.util.retry import Retry

from specpilot.runtime.engine_metrics import VLLM_PER_POSITION, WindowStats, engine_metrics


class PromQLError(RuntimeError):
    """A Prometheus server could not be queried."""


class PromQLReader:
    """Reads engine windows from one Prometheus server."""

    def __init__(
        self, url: str, *, pod_label: str = "pod", selector: str = "", timeout_s: float = 10.0
    ) -> None:
        """`selector` is a label matcher list without braces, e.g. `namespace="llm"`."""
        # the client's own retries, less read timeouts (it retried each slow read 3 times)
        retry = Retry(
            total=3, read=0, backoff_factor=1, status_forcelist=(408, 429, 500, 502, 503, 504)
        )
        self._prom = PrometheusConnect(url=url, disable_ssl=True, timeout=timeout_s, retry=retry)
        self._pod_label = pod_label
        self._selector = selector

    def query(self, promql: str, at: float) -> list[tuple[dict[str, str], float]]:
        """Instant query at `at`; (labels, value) for every finite, well-formed result."""
        try:
            raw: list[dict[str, Any]] = self._prom.custom_query(promql, params={"time": at})
        except (PrometheusApiClientException, OSError) as exc:
            # requests' errors derive from OSError
            raise PromQLError(f"PromQL query failed: {promql}: {exc}") from exc
        out = []
        for item in raw:
            found = _sample(item)
            if found is not None:
                out.append(found)
        return out

    def samples(self, selector: str, at: float) -> list[tuple[dict[str, str], list[float]]]:
        """The raw samples' times of a range selector (`series[10s]`) evaluated at `at`: (labels,
        times) for every well-formed series."""
        try:
            raw: Any = self._prom.custom_query(selector, params={"time": at})
        except (PrometheusApiClientException, OSError) as exc:
            raise PromQLError(f"PromQL query failed: {selector}: {exc}") from exc
        found = (_timestamps(item) for item in (raw if isinstance(raw, list) else []))
        return [item for item in found if item is not None]

    def window_stats(self, engine: str, window_s: float, end: float) -> list[WindowStats]:
        """Every pod's stats for the window ending at `end`."""
        window = f"{max(1, round(window_s))}s"
        spans = self._extrapolated_spans(engine, window, end)
        pod = self._pod_label
        counters: dict[str, dict[str, float]] = {}
        gauges: dict[str, dict[str, float]] = {}
        histograms: dict[str, dict[str, dict[float, float]]] = {}
        sums: dict[str, dict[str, float]] = {}
        counts: dict[str, dict[str, float]] = {}
        resets: dict[str, float] = {}
        for spec in engine_metrics(engine):
            series = self._series(spec.name if spec.kind != "histogram" else spec.name + "_bucket")
            if spec.kind == "counter":
                for labels, value in self.query(
                    f"sum by ({pod}) (increase({series}[{window}]))", end
                ):
                    counters.setdefault(labels.get(pod, ""), {})[spec.key] = value
                for labels, value in self.query(
                    f"sum by ({pod}) (resets({series}[{window}]))", end
                ):
                    key = labels.get(pod, "")
                    resets[key] = resets.get(key, 0.0) + value
            elif spec.kind == "gauge":
                reduce = "avg" if spec.combine == "mean" else "sum"
                ranged = f"{series}[{window}]"
                if spec.zero_is_unknown:  # a subquery keeps only the non-zero samples
                    ranged = f"({series} > 0)[{window}:]"
                query = f"{reduce} by ({pod}) (avg_over_time({ranged}))"
                for labels, value in self.query(query, end):
                    gauges.setdefault(labels.get(pod, ""), {})[spec.key] = value
            else:
                if spec.buckets:
                    query = f"sum by ({pod}, le) (increase({series}[{window}]))"
                    for labels, value in self.query(query, end):
                        bound = _number(labels.get("le"))
                        if bound is None or bound == -math.inf:
                            continue
                        per_pod = histograms.setdefault(labels.get(pod, ""), {})
                        per_pod.setdefault(spec.key, {})[bound] = value
                for suffix, into in (("_sum", sums), ("_count", counts)):
                    part = self._series(spec.name + suffix)
                    query = f"sum by ({pod}) (increase({part}[{window}]))"
                    for labels, value in self.query(query, end):
                        into.setdefault(labels.get(pod, ""), {})[spec.key] = value
        positions: dict[str, dict[int, float]] = {}
        if engine == "vllm":
            query = (
                f"sum by ({pod}, position) (increase({self._series(VLLM_PER_POSITION)}[{window}]))"
            )
            for labels, value in self.query(query, end):
                position = labels.get("position", "")
                if position.isascii() and position.isdigit():
                    positions.setdefault(labels.get(pod, ""), {})[int(position)] = value
        pods = sorted(set(counters) | set(gauges) | set(histograms) | set(sums))
        return [
            WindowStats(
                pod=name,
                window_s=spans.get(name, window_s),
                counters=counters.get(name, {}),
                gauges=gauges.get(name, {}),
                histograms=histograms.get(name, {}),
                histogram_sums=sums.get(name, {}),
                histogram_counts=counts.get(name, {}),
                accepted_per_position=positions.get(name, {}),
                counter_resets=int(resets.get(name, 0)),
            )
            for name in pods
        ]

    def _extrapolated_spans(self, engine: str, window: str, end: float) -> dict[str, float]:
        """Per pod, the seconds `increase()` over `window` ending at `end` extrapolates to."""
        reference = next(s for s in engine_metrics(engine) if s.key == "generation_tokens")
        found = self.samples(f"{self._series(reference.name)}[{window}]", end)
        seconds = float(window.removesuffix("s"))
        stamps: dict[str, list[float]] = {}
        for labels, times in found:
            pod = labels.get(self._pod_label, "")
            if len(times) > len(stamps.get(pod, [])):  # one pod's series share scrape instants
                stamps[pod] = times
        spans = {}
        for pod, times in stamps.items():
            span = extrapolated_span(times, end - seconds, end)
            if span is not None:
                spans[pod] = span
        return spans

    def _series(self, name: str) -> str:
        """Both spellings of a name: Prometheus 2.x negotiates OpenMetrics, and prometheus_client
        (SGLang's /metrics) then escapes ':' to '_' in sample names."""
        matchers = [f'__name__=~"{name.replace(":", "[:_]")}"']
        if self._selector:
            matchers.append(self._selector)
        return "{" + ", ".join(matchers) + "}"


def extrapolated_span(times: list[float], start: float, end: float) -> float | None:
    """The seconds Prometheus' `increase()` over (`start`, `end`] speaks for, given the sample
    times it holds there (Prometheus' documented extrapolation: to an edge when the samples
    reach within 1.1 average spacings of it, else half a spacing past the outermost sample).
    None below two samples, where `increase()` returns nothing."""
    ordered = sorted(times)
    if len(ordered) < 2 or ordered[-1] <= ordered[0]:
        return None
    sampled = ordered[-1] - ordered[0]
    spacing = sampled / (len(ordered) - 1)
    to_start, to_end = max(ordered[0] - start, 0.0), max(end - ordered[-1], 0.0)
    if to_start >= 1.1 * spacing:
        to_start = spacing / 2
    if to_end >= 1.1 * spacing:
        to_end = spacing / 2
    return sampled + to_start + to_end


def _timestamps(item: Any) -> tuple[dict[str, str], list[float]] | None:
    """One range-vector result as (labels, sample times); None when it is not one."""
    try:
        metric = item.get("metric", {})
        times = [float(pair[0]) for pair in item["values"]]
    except (KeyError, IndexError, TypeError, AttributeError, ValueError):
        return None
    if not isinstance(metric, dict) or not all(math.isfinite(t) for t in times):
        return None
    return {str(key): str(text) for key, text in metric.items()}, times


def _sample(item: Any) -> tuple[dict[str, str], float] | None:
    """One instant-vector result as (labels, value); None when it is not a finite number with
    string labels (a Prometheus, or something posing as one, may answer anything)."""
    try:
        value = _number(item["value"][1])
        metric = item.get("metric", {})
    except (KeyError, IndexError, TypeError, AttributeError):
        return None
    if value is None or not math.isfinite(value) or not isinstance(metric, dict):
        return None
    labels = {str(key): str(text) for key, text in metric.items()}
    return labels, value


def _number(text: object) -> float | None:
    """A Prometheus number (a string such as "1.5" or "+Inf"); None when it is not one."""
    if not isinstance(text, str | int | float):
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    return None if math.isnan(value) else value
