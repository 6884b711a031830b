"""The running batch over a window from integrals (engine_metrics.running_estimate), not from a
gauge sampled at scrape instants: hand-made vLLM 0.32 and SGLang 0.5.23 snapshots with known
phase-time sums; the PromQL reader computing the same thing from the same samples; and the
emulator's dialects, whose phase histograms must give the batch the emulated core really ran."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from specpilot.runtime.emulator.core import EngineCore, Request
from specpilot.runtime.emulator.exposition import SglangExposition, VllmExposition
from specpilot.runtime.engine_metrics import WindowStats, observe, running_estimate
from specpilot.runtime.promql import PromQLReader, extrapolated_span
from specpilot.runtime.scrape import Snapshot, parse_snapshot, window_stats
from specpilot.tuner import SpecConfig, StepCost

LABELS = {"model_name": "m", "engine": "0"}
BUCKETS = (0.1, 1.0, 10.0)


class FakeVllm:
    """vLLM's running gauge and the histograms the estimate integrates, in vLLM's names."""

    def __init__(self, per_step: bool = True) -> None:
        self.registry = r = CollectorRegistry()
        names = list(LABELS)
        self.running = Gauge("vllm:num_requests_running", "", names, registry=r)
        self.generated = Counter("vllm:generation_tokens", "", names, registry=r)
        self.itl = (
            Histogram("vllm:inter_token_latency_seconds", "", names, buckets=BUCKETS, registry=r)
            if per_step
            else None
        )
        self.phases = {
            phase: Histogram(
                f"vllm:request_{phase}_time_seconds", "", names, buckets=BUCKETS, registry=r
            )
            for phase in ("prefill", "decode", "inference")
        }
        for metric in (self.running, self.generated, *self.phases.values()):
            metric.labels(**LABELS)
        if self.itl is not None:
            self.itl.labels(**LABELS)

    def decode(self, steps: int, batch: int, step_s: float) -> None:
        """`steps` engine steps of `batch` decoding requests, `step_s` apart."""
        assert self.itl is not None
        for _ in range(steps * batch):
            self.itl.labels(**LABELS).observe(step_s)
        self.generated.labels(**LABELS).inc(steps * batch)

    def finish(self, prefill_s: float, decode_s: float) -> None:
        self.phases["prefill"].labels(**LABELS).observe(prefill_s)
        self.phases["decode"].labels(**LABELS).observe(decode_s)
        self.phases["inference"].labels(**LABELS).observe(prefill_s + decode_s)

    def snapshot(self, at: float, running: int) -> Snapshot:
        self.running.labels(**LABELS).set(running)
        return parse_snapshot(generate_latest(self.registry).decode(), at)


def vllm_window(snapshots: Sequence[Snapshot]) -> WindowStats:
    return window_stats("vllm", "pod", snapshots)


def test_known_decode_and_prefill_sums_give_the_batch_whatever_the_instants_say() -> None:
    engine = FakeVllm()
    first = engine.snapshot(100.0, running=0)  # both scrapes land between batches
    engine.decode(steps=500, batch=8, step_s=0.01)  # 40 request-seconds of decode
    for _ in range(4):
        engine.finish(prefill_s=0.5, decode_s=10.0)  # 2 request-seconds of prefill
    last = engine.snapshot(110.0, running=0)
    stats = vllm_window([first, last])
    assert stats.histogram_sums["decode_s"] == pytest.approx(40.0)
    assert stats.histogram_counts["decode_s"] == 4000
    obs = observe("vllm", [stats])
    assert obs.running_requests == pytest.approx((40.0 + 2.0) / 10.0)
    assert obs.running_requests_gauge == 0.0  # the cross-check the tuner used to read


def test_a_window_without_completion_still_reads_its_decode_steps() -> None:
    engine = FakeVllm()
    first = engine.snapshot(0.0, running=32)
    engine.decode(steps=100, batch=32, step_s=0.05)  # long requests: none finishes in 5 s
    last = engine.snapshot(5.0, running=32)
    stats = vllm_window([first, last])
    assert stats.histogram_counts["prefill_s"] == 0
    assert running_estimate("vllm", stats) == pytest.approx(32.0)


def test_a_window_without_decode_step_reads_the_gauge_and_idle_is_zero() -> None:
    engine = FakeVllm()
    first = engine.snapshot(0.0, running=3)  # three requests in one long chunked prefill
    last = engine.snapshot(4.0, running=3)
    assert observe("vllm", [vllm_window([first, last])]).running_requests == pytest.approx(3.0)
    idle = FakeVllm()
    quiet = [idle.snapshot(0.0, running=0), idle.snapshot(0.001, running=0)]
    assert observe("vllm", [vllm_window(quiet)]).running_requests == 0.0


def test_without_the_per_step_series_completions_are_integrated_else_the_gauge() -> None:
    engine = FakeVllm(per_step=False)
    first = engine.snapshot(0.0, running=0)
    for _ in range(6):
        engine.finish(prefill_s=0.25, decode_s=4.75)  # 30 request-seconds running
    last = engine.snapshot(10.0, running=0)
    assert running_estimate("vllm", vllm_window([first, last])) == pytest.approx(3.0)
    unfinished = engine.snapshot(20.0, running=5)  # nothing finished in (10, 20]
    assert running_estimate("vllm", vllm_window([last, unfinished])) == pytest.approx(2.5)


def test_a_counter_reset_counts_the_new_process_from_zero() -> None:
    before = FakeVllm()
    before.decode(steps=1000, batch=16, step_s=0.02)
    old = before.snapshot(0.0, running=16)
    restarted = FakeVllm()  # a new process: every sum starts again from zero
    restarted.decode(steps=100, batch=4, step_s=0.02)  # 8 request-seconds since it started
    new = restarted.snapshot(4.0, running=4)
    stats = vllm_window([old, new])
    assert stats.histogram_sums["decode_s"] == pytest.approx(8.0)
    assert running_estimate("vllm", stats) == pytest.approx(2.0)


def test_zero_length_window_and_pods_without_any_load_series() -> None:
    flat = WindowStats(pod="p", window_s=0.0, gauges={"running": 2.0})
    assert running_estimate("vllm", flat) == 2.0
    assert running_estimate("vllm", WindowStats(pod="q", window_s=5.0)) is None
    pods = [
        WindowStats(
            pod="a",
            window_s=10.0,
            histogram_sums={"decode_s": 20.0},
            histogram_counts={"decode_s": 100.0},
        ),
        WindowStats(pod="b", window_s=10.0, gauges={"running": 6.0}),
        WindowStats(pod="c", window_s=10.0),  # nothing known: left out of the mean
    ]
    obs = observe("vllm", pods)
    assert obs.running_requests == pytest.approx((2.0 + 6.0) / 2)
    assert obs.running_requests_gauge == pytest.approx(6.0)


# --------------------------------------------------------------------------- SGLang


class FakeSglang:
    def __init__(self, queue: bool = True) -> None:
        self.registry = r = CollectorRegistry()
        self.running = Gauge("sglang:num_running_reqs", "", ["model_name"], registry=r)
        self.e2e = Histogram(
            "sglang:e2e_request_latency_seconds",
            "",
            ["model_name", "is_streaming"],
            buckets=BUCKETS,
            registry=r,
        )
        self.queue = (
            Histogram("sglang:queue_time_seconds", "", ["model_name"], buckets=BUCKETS, registry=r)
            if queue
            else None
        )

    def request(self, queued_s: float, e2e_s: float, finished: bool = True) -> None:
        if self.queue is not None:
            self.queue.labels("m").observe(queued_s)  # at its first forward
        if finished:
            self.e2e.labels("m", "false").observe(e2e_s)

    def snapshot(self, at: float, running: int) -> Snapshot:
        self.running.labels("m").set(running)
        return parse_snapshot(generate_latest(self.registry).decode(), at)


def test_sglang_batch_is_server_time_minus_queueing() -> None:
    engine = FakeSglang()
    first = engine.snapshot(0.0, running=0)
    for _ in range(10):
        engine.request(queued_s=0.5, e2e_s=4.5)  # 10 x 4 s running
    last = engine.snapshot(10.0, running=1)
    obs = observe("sglang", [window_stats("sglang", "p", [first, last])])
    assert obs.running_requests == pytest.approx(4.0)
    assert obs.running_requests_gauge == pytest.approx(0.5)


def test_sglang_rate_is_the_mean_of_starts_and_completions() -> None:
    engine = FakeSglang()
    first = engine.snapshot(0.0, running=2)
    for _ in range(6):
        engine.request(queued_s=0.0, e2e_s=3.0)
    for _ in range(4):  # a load growing across the window: started, not finished
        engine.request(queued_s=0.0, e2e_s=0.0, finished=False)
    last = engine.snapshot(10.0, running=6)
    stats = window_stats("sglang", "p", [first, last])
    assert (stats.histogram_counts["queue_s"], stats.histogram_counts["e2e_s"]) == (10, 6)
    # completions alone would say 1.8: each in-flight request has on average half its time
    # inside the window
    assert running_estimate("sglang", stats) == pytest.approx(3.0 * (10 + 6) / 2 / 10)


def test_sglang_without_completion_or_queue_series_reads_the_gauge() -> None:
    engine = FakeSglang()
    first = engine.snapshot(0.0, running=8)
    engine.request(queued_s=0.1, e2e_s=0.0, finished=False)
    last = engine.snapshot(10.0, running=6)
    assert running_estimate("sglang", window_stats("sglang", "p", [first, last])) == 7.0
    no_queue = FakeSglang(queue=False)
    first = no_queue.snapshot(0.0, running=2)
    no_queue.request(queued_s=3.0, e2e_s=5.0)  # queueing would count as running
    last = no_queue.snapshot(5.0, running=2)
    assert running_estimate("sglang", window_stats("sglang", "p", [first, last])) == 2.0


# --------------------------------------------------------------------------- PromQL


class FakePrometheus:
    """Answers the reader's queries from two snapshots the way Prometheus would: increase() is
    last minus first, scaled by Prometheus' extrapolation to the window it was asked for
    (`window`, ending at the last snapshot; none when the snapshots are its edges),
    avg_over_time() the mean of the two, resets() zero; the raw samples are the snapshots' and
    `between` more at even spacing."""

    QUERY = re.compile(
        r"^(?P<agg>sum|avg) by \((?P<by>[^)]*)\) \((?P<fn>increase|resets|avg_over_time)\("
        r'\(?\{__name__=~"(?P<name>[^"]+)"\}'
    )

    def __init__(
        self,
        pod: str,
        first: Snapshot,
        last: Snapshot,
        window: float | None = None,
        between: int = 0,
    ) -> None:
        self.pod, self.first, self.last = pod, first, last
        self.asked: list[str] = []
        sampled = last.timestamp - first.timestamp
        self.times = [first.timestamp + sampled * i / (between + 1) for i in range(between + 2)]
        start = last.timestamp - (window if window is not None else sampled)
        extrapolated = extrapolated_span(self.times, start, last.timestamp)
        assert extrapolated is not None
        self.scale = extrapolated / sampled

    def samples(self, selector: str, at: float) -> list[tuple[dict[str, str], list[float]]]:
        self.asked.append(selector)
        return [({"pod": self.pod, **LABELS}, self.times)]

    def query(self, promql: str, at: float) -> list[tuple[dict[str, str], float]]:
        self.asked.append(promql)
        match = self.QUERY.match(promql)
        assert match, promql
        pattern = re.compile(match["name"])
        by = [b.strip() for b in match["by"].split(",") if b.strip() != "pod"]
        groups: dict[tuple[str, ...], list[float]] = {}
        for name in self.last.samples:
            if not pattern.fullmatch(name):
                continue
            for labels, value in self.last.series(name).items():
                key = tuple(dict(labels).get(b, "") for b in by)
                before = self.first.series(name).get(labels, 0.0)
                if match["fn"] == "increase":
                    groups.setdefault(key, []).append((value - before) * self.scale)
                elif match["fn"] == "resets":
                    groups.setdefault(key, []).append(0.0)
                else:
                    groups.setdefault(key, []).append((value + before) / 2)
        return [
            ({"pod": self.pod, **dict(zip(by, key, strict=True))}, sum(values))
            for key, values in groups.items()
        ]


def test_promql_reader_computes_the_same_batch_as_the_direct_scrape() -> None:
    engine = FakeVllm()
    first = engine.snapshot(0.0, running=1)
    engine.decode(steps=300, batch=12, step_s=0.03)  # 108 request-seconds
    for _ in range(5):
        engine.finish(prefill_s=0.4, decode_s=3.0)
    last = engine.snapshot(12.0, running=0)
    reader = PromQLReader("http://prometheus.invalid")
    fake = FakePrometheus("pod-a", first, last)
    reader.query = fake.query  # type: ignore[method-assign]
    reader.samples = fake.samples  # type: ignore[method-assign]
    [through_prometheus] = reader.window_stats("vllm", 12.0, end=12.0)
    direct = window_stats("vllm", "pod-a", [first, last])
    assert through_prometheus.histogram_sums == pytest.approx(dict(direct.histogram_sums))
    assert through_prometheus.histogram_counts == pytest.approx(dict(direct.histogram_counts))
    a, b = observe("vllm", [through_prometheus]), observe("vllm", [direct])
    assert a.running_requests == pytest.approx(b.running_requests) == pytest.approx((108 + 2) / 12)
    assert a.running_requests_gauge == pytest.approx(b.running_requests_gauge) == 0.5
    assert any("inter_token_latency_seconds_sum" in q for q in fake.asked)
    # a totals-only histogram asks for no buckets
    assert not any("inter_token_latency_seconds_bucket" in q for q in fake.asked)


def test_a_late_prometheus_reads_the_batch_over_the_span_its_samples_cover() -> None:
    # a Prometheus that scraped late holds 3 samples over the last 2.6 s of an 8 s window:
    # increase() speaks for 3.25 s (half a spacing before the first sample, none after the
    # last), and dividing by the whole 8 s would read 41% of the batch
    engine = FakeVllm()
    first = engine.snapshot(5.4, running=4)
    engine.decode(steps=100, batch=4, step_s=0.026)  # 10.4 request-seconds in 2.6 s
    last = engine.snapshot(8.0, running=4)
    reader = PromQLReader("http://prometheus.invalid")
    fake = FakePrometheus("pod-a", first, last, window=8.0, between=1)
    reader.query = fake.query  # type: ignore[method-assign]
    reader.samples = fake.samples  # type: ignore[method-assign]
    [late] = reader.window_stats("vllm", 8.0, end=8.0)
    assert late.window_s == pytest.approx(2.6 + 1.3 / 2)
    direct = window_stats("vllm", "pod-a", [first, last])
    batch = observe("vllm", [late]).running_requests
    assert batch == pytest.approx(observe("vllm", [direct]).running_requests) == pytest.approx(4.0)


@pytest.mark.parametrize(
    ("times", "expected"),
    [
        ([1.0, 2.0, 3.0, 4.0], 4.0),  # edges within 1.1 spacings: extrapolated to both
        ([0.0, 4.0], 4.0),  # the samples are the edges
        ([2.5, 3.0, 3.5, 4.0], 1.5 + 0.25),  # a gap of 5 spacings at the start: half a spacing
        ([0.5, 1.0, 1.5], 1.0 + 0.5 + 0.25),  # and at the end
        ([3.0], None),  # one sample: increase() gives nothing
        ([3.0, 3.0], None),
    ],
)
def test_extrapolated_span_follows_prometheus(times: list[float], expected: float | None) -> None:
    assert extrapolated_span(times, 0.0, 4.0) == (
        None if expected is None else pytest.approx(expected)
    )


# --------------------------------------------------------------------------- the emulator


H100_8B = StepCost.for_hardware("H100", "llama-3.1-8b")


def drive(exposition: VllmExposition | SglangExposition, users: int) -> tuple[float, float]:
    """A closed loop of `users` (a finished request is replaced at once, lengths varied) on an
    emulated core; snapshots only at the window's two edges, mid-flight. Returns (the batch
    SpecPilot reads, the time-averaged batch the core ran) over the window."""
    core = EngineCore(config=SpecConfig(), performance=H100_8B, seed=1)
    now, made = 0.0, 0

    def add() -> None:
        nonlocal made
        made += 1
        max_tokens = 40 + (made * 37) % 80
        core.add_request(
            Request(
                request_id=f"r{made}",
                task="chat",
                prompt_tokens=64,
                max_tokens=max_tokens,
                arrival_s=now,
            )
        )

    for _ in range(users):
        add()
    edges: list[Snapshot] = []
    busy_s = 0.0
    start = None
    while len(edges) < 2:
        outcome = core.step(now)
        assert outcome is not None
        end = outcome.start_s + outcome.duration_s
        if start is not None:
            busy_s += outcome.duration_s * (len(core.running) + len(outcome.finished))
        now = end
        exposition.record_step(outcome, core)
        for request in outcome.finished:
            exposition.record_finished(request, False)
            add()
        if start is None and now > 2.0:  # warmed up: the window opens mid-flight
            start = now
            edges.append(parse_snapshot(exposition.render().decode(), now))
        elif start is not None and now - start > 8.0:
            edges.append(parse_snapshot(exposition.render().decode(), now))
    engine = "vllm" if isinstance(exposition, VllmExposition) else "sglang"
    obs = observe(engine, [window_stats(engine, "emulated", edges)])
    assert obs.running_requests is not None
    return obs.running_requests, busy_s / (edges[1].timestamp - edges[0].timestamp)


@pytest.mark.parametrize("users", [1, 16])
def test_emulated_vllm_reads_the_batch_its_core_ran(users: int) -> None:
    read, truth = drive(VllmExposition("m"), users)
    assert read == pytest.approx(truth, rel=0.03)
    assert truth == pytest.approx(users, rel=0.05)  # a closed loop keeps its users running


@pytest.mark.parametrize("users", [1, 16])
def test_emulated_sglang_reads_the_batch_its_core_ran(users: int) -> None:
    read, truth = drive(SglangExposition("m"), users)
    assert read == pytest.approx(truth, rel=0.05)  # counted per finished request: edge bias


def test_emulated_vllm_phase_times_add_up() -> None:
    exposition = VllmExposition("m")
    drive(exposition, 4)
    snapshot = parse_snapshot(exposition.render().decode(), 0.0)

    def total(name: str) -> float:
        return sum(snapshot.series(name).values())

    inference = total("vllm:request_inference_time_seconds_sum")
    prefill = total("vllm:request_prefill_time_seconds_sum")
    decode = total("vllm:request_decode_time_seconds_sum")
    assert inference == pytest.approx(prefill + decode) and decode > 0 and prefill > 0
    finished = total("vllm:request_inference_time_seconds_count")
    assert total("vllm:request_queue_time_seconds_count") == finished > 0
    assert not math.isnan(total("vllm:inter_token_latency_seconds_sum"))
