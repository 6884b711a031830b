"""Direct scraping: engine /metrics text -> snapshots -> one pod's `WindowStats`.

Contract: `parse_snapshot` reads Prometheus text exposition with prometheus_client's parser (no
regexes) and keeps every sample; `window_stats` takes a pod's snapshots in time order and
computes counter increases the way Prometheus' `increase()` does without extrapolation (a drop
is a counter reset: the new process counted from zero), gauge means, histogram bucket
increases and the increases of each histogram's `_sum` and `_count` (the integrals behind the
running batch, `engine_metrics.running_estimate`), under the same reset rule. A counter that
appears mid-window counts from zero.

Hostile or broken exposition never raises past `ScrapeError` and never passes a non-finite
number on: a NaN or infinite sample is dropped at parse time (kept in `Snapshot.dropped`, so a
series whose first sample was dropped is not mistaken for one created inside the window), a
histogram bucket whose `le` is not a number or a per-position series whose `position` is not a
whole number is left out, and an increase or mean that overflows is absent. An absent quantity
becomes None in the `Observation` and is listed in its `unknown`.

`parse_snapshot(text, t, keep=window_samples(engine))` keeps only the samples `window_stats`
reads for that engine, and skips the other series' sample lines before parsing: an engine's
/metrics is mostly histograms no window reads (about 25 kB for vLLM), and a window holds a
snapshot per scrape, so an operator scraping hundreds of pods kept megabytes per window and
spent most of its parse time on lines it threw away (bench/operator_load.py). `# HELP` and
`# TYPE` lines and lines whose name cannot be read are always parsed, so a broken line among
the kept series fails the scrape as before.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from itertools import pairwise

import httpx
from prometheus_client.parser import text_string_to_metric_families

from specpilot.runtime.engine_metrics import (
    VLLM_PER_POSITION,
    MetricSpec,
    WindowStats,
    engine_metrics,
)

Labels = tuple[tuple[str, str], ...]
_LabelFilter = Callable[[Labels], bool]


class ScrapeError(RuntimeError):
    """A /metrics endpoint could not be read or parsed."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Every sample of one scrape, with the time it was taken (seconds, any epoch)."""

    timestamp: float
    samples: Mapping[str, Mapping[Labels, float]] = field(default_factory=dict)
    dropped: Mapping[str, frozenset[Labels]] = field(default_factory=dict)
    """Series that were exposed with a NaN or infinite value in this scrape."""

    def series(self, name: str) -> Mapping[Labels, float]:
        return self.samples.get(name, {})

    def was_dropped(self, name: str, labels: Labels) -> bool:
        return labels in self.dropped.get(name, frozenset())


@cache
def window_samples(engine: str) -> frozenset[str]:
    """Every sample name `window_stats` reads for `engine` (a ConfigError for an unknown one)."""
    names: set[str] = {VLLM_PER_POSITION} if engine == "vllm" else set()
    for spec in engine_metrics(engine):
        if spec.kind != "histogram":
            names.add(spec.name)
            continue
        names.update((spec.name + "_sum", spec.name + "_count"))
        if spec.buckets:
            names.add(spec.name + "_bucket")
    return frozenset(names)


def _sample_name(line: str) -> str | None:
    """The metric name a sample line starts with; None for comments and unreadable lines."""
    if not line or line[0] in "# \t":
        return None
    end = len(line)
    for stop in ("{", " ", "\t"):
        found = line.find(stop)
        if found != -1:
            end = min(end, found)
    return line[:end] or None


def _kept_lines(text: str, keep: Collection[str]) -> str:
    return "\n".join(
        line for line in text.split("\n") if (name := _sample_name(line)) is None or name in keep
    )


def parse_snapshot(text: str, timestamp: float, keep: Collection[str] | None = None) -> Snapshot:
    """Every finite sample of `text`, or only those named in `keep` (module docstring)."""
    samples: dict[str, dict[Labels, float]] = {}
    dropped: dict[str, set[Labels]] = {}
    if keep is not None:
        text = _kept_lines(text, keep) + "\n"
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if keep is not None and sample.name not in keep:
                    continue
                labels = tuple(sorted(sample.labels.items()))
                value = float(sample.value)
                if math.isfinite(value):
                    samples.setdefault(sample.name, {})[labels] = value
                else:
                    dropped.setdefault(sample.name, set()).add(labels)
    except ValueError as exc:
        raise ScrapeError(f"metrics text is not Prometheus exposition format: {exc}") from exc
    return Snapshot(timestamp, samples, {name: frozenset(keys) for name, keys in dropped.items()})


def fetch_snapshot(
    client: httpx.Client, url: str, timestamp: float, keep: Collection[str] | None = None
) -> Snapshot:
    """GET a /metrics URL; transport and HTTP errors, and a URL httpx refuses (a control
    character, a bad port), become `ScrapeError`."""
    try:
        response = client.get(url)
        response.raise_for_status()
    except (httpx.HTTPError, httpx.InvalidURL) as exc:
        raise ScrapeError(f"cannot scrape {url!r}: {exc}") from exc
    return parse_snapshot(response.text, timestamp, keep)


def window_stats(engine: str, pod: str, snapshots: Sequence[Snapshot]) -> WindowStats:
    """One pod's window from its snapshots (time order; at least two make a window)."""
    ordered = sorted(snapshots, key=lambda s: s.timestamp)
    window = ordered[-1].timestamp - ordered[0].timestamp if len(ordered) > 1 else 0.0
    counters: dict[str, float] = {}
    gauges: dict[str, float] = {}
    histograms: dict[str, dict[float, float]] = {}
    sums: dict[str, float] = {}
    counts: dict[str, float] = {}
    resets = 0
    for spec in engine_metrics(engine):
        if spec.kind == "gauge":
            mean = _gauge_mean(spec, ordered)
            if mean is not None:
                gauges[spec.key] = mean
        elif spec.kind == "counter":
            increase = _increase(ordered, spec.name, _any_labels)
            if increase is not None:
                counters[spec.key], spec_resets = increase
                resets += spec_resets
        else:
            if spec.buckets:
                buckets = _bucket_increases(ordered, spec.name)
                if buckets:
                    histograms[spec.key] = buckets
            for suffix, into in (("_sum", sums), ("_count", counts)):
                found = _increase(ordered, spec.name + suffix, _any_labels)
                if found is not None:
                    into[spec.key] = found[0]
    per_position: dict[int, float] = {}
    if engine == "vllm":
        for position in _label_values(ordered, VLLM_PER_POSITION, "position"):
            index = _whole_number(position)
            found = _increase(ordered, VLLM_PER_POSITION, _with_label("position", position))
            if index is not None and found is not None:
                per_position[index] = found[0]
    return WindowStats(
        pod=pod,
        window_s=window,
        counters=counters,
        gauges=gauges,
        histograms=histograms,
        histogram_sums=sums,
        histogram_counts=counts,
        accepted_per_position=per_position,
        counter_resets=resets,
    )


def _gauge_mean(spec: MetricSpec, snapshots: Sequence[Snapshot]) -> float | None:
    values = []
    for snapshot in snapshots:
        series = list(snapshot.series(spec.name).values())
        if not series:
            continue
        total = sum(series)
        value = total / len(series) if spec.combine == "mean" else total
        if spec.zero_is_unknown and value == 0:
            continue
        values.append(value)
    return _finite(sum(values) / len(values)) if values else None


def _increase(
    snapshots: Sequence[Snapshot], name: str, keep: _LabelFilter
) -> tuple[float, int] | None:
    """Sum over the matching series of each series' increase, and the number of resets seen.

    A series that first appears after the window's first snapshot was created inside the
    window (engines create labelled children lazily, a new pod starts from zero), so it counts
    from 0, unless it was there with a dropped (non-finite) sample. None when no series spans
    the window or the increase overflows."""
    total, resets, seen = 0.0, 0, False
    if len(snapshots) < 2:
        return None
    keys = {labels for s in snapshots for labels in s.series(name) if keep(labels)}
    for labels in keys:
        points = [s.series(name)[labels] for s in snapshots if labels in s.series(name)]
        first = snapshots[0]
        if labels not in first.series(name) and not first.was_dropped(name, labels):
            points.insert(0, 0.0)
        if len(points) < 2:
            continue
        seen = True
        for before, after in pairwise(points):
            if after >= before:
                total += after - before
            else:
                total += after
                resets += 1
    if not seen or not math.isfinite(total):
        return None
    return total, resets


def _bucket_increases(snapshots: Sequence[Snapshot], name: str) -> dict[float, float]:
    bucket_name = name + "_bucket"
    out: dict[float, float] = {}
    for bound in _label_values(snapshots, bucket_name, "le"):
        upper = _bucket_bound(bound)
        found = _increase(snapshots, bucket_name, _with_label("le", bound))
        if upper is not None and found is not None:
            out[upper] = found[0]
    return out


def _bucket_bound(text: str) -> float | None:
    """A bucket's `le` as a number; None for anything else (`le="fast"`, `le="NaN"`)."""
    try:
        bound = float(text)
    except ValueError:
        return None
    return None if math.isnan(bound) or bound == -math.inf else bound


def _whole_number(text: str) -> int | None:
    """A `position` label as a non-negative index; None for anything else."""
    return int(text) if text.isascii() and text.isdigit() else None


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _label_values(snapshots: Sequence[Snapshot], name: str, label: str) -> list[str]:
    values = {
        value
        for s in snapshots
        for labels in s.series(name)
        for key, value in labels
        if key == label
    }
    return sorted(values)


def _any_labels(labels: Labels) -> bool:
    return True


def _with_label(key: str, value: str) -> _LabelFilter:
    def keep(labels: Labels) -> bool:
        return (key, value) in labels

    return keep
