"""The one window reader (runtime/window.py) and its edge rules, on a fake clock and an httpx
MockTransport: two snapshots make a window, slow scrapes scrape again (a bounded number of
times), a target that stops answering keeps what it gave. Its three users (the `specpilot
observe` command, LocalEngine, the Kubernetes ScrapeSource) read through it."""

from __future__ import annotations

from dataclasses import dataclass, field

import httpx
import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from specpilot.operator.kube.pod_metrics import PodTarget, ScrapeSource
from specpilot.runtime.engine_metrics import observe
from specpilot.runtime.engines import LaunchSettings
from specpilot.runtime.local_engine import LocalEngine
from specpilot.runtime.scrape import ScrapeError
from specpilot.runtime.window import MAX_LATE_ROUNDS, Window, WindowReader


class FakeEngine:
    """A vLLM-named registry that drafts 10 and accepts 20 tokens on each scrape it answers."""

    def __init__(self, answers: int) -> None:
        self.answers = answers
        self.registry = CollectorRegistry()
        self.drafts = Counter("vllm:spec_decode_num_drafts", "", registry=self.registry)
        self.accepted = Counter("vllm:spec_decode_num_accepted_tokens", "", registry=self.registry)
        self.running = Gauge("vllm:num_requests_running", "", registry=self.registry)

    def answer(self) -> httpx.Response:
        if self.answers <= 0:
            return httpx.Response(503)
        self.answers -= 1
        self.drafts.inc(10)
        self.accepted.inc(20)
        self.running.set(4)
        return httpx.Response(200, text=generate_latest(self.registry).decode())


@dataclass
class FakeNetwork:
    """Engines by host on one fake clock; each scrape takes `scrape_s`, each sleep its time."""

    scrape_s: float = 0.0
    engines: dict[str, FakeEngine] = field(default_factory=dict)
    now: float = 0.0
    scrapes: list[tuple[str, float]] = field(default_factory=list)

    def handle(self, request: httpx.Request) -> httpx.Response:
        self.scrapes.append((request.url.host, self.now))
        self.now += self.scrape_s
        engine = self.engines.get(request.url.host)
        return engine.answer() if engine else httpx.Response(404)

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    def reader(self, interval_s: float = 1.0) -> WindowReader:
        return WindowReader(
            interval_s=interval_s,
            clock=lambda: self.now,
            sleep=self.sleep,
            transport=httpx.MockTransport(self.handle),
        )


def urls(*hosts: str) -> dict[str, str]:
    return {host: f"http://{host}/metrics" for host in hosts}


def test_scrapes_slower_than_the_window_still_measure_a_window() -> None:
    net = FakeNetwork(scrape_s=12.0, engines={"a": FakeEngine(answers=10)})
    window = net.reader().read("vllm", urls("a"), window_s=8.0)
    (stats,) = window.stats
    assert window.missing == {}
    assert stats.window_s == pytest.approx(12.0)  # two snapshots, stamped as each request starts
    assert observe("vllm", [stats]).acceptance_length == pytest.approx(3.0)


def test_a_target_with_one_snapshot_gets_bounded_extra_rounds_then_is_left_out() -> None:
    net = FakeNetwork(scrape_s=12.0, engines={"a": FakeEngine(answers=1)})
    window = net.reader().read("vllm", urls("a"), window_s=8.0)
    assert window.stats == []
    assert net.now == pytest.approx(12.0 * (1 + MAX_LATE_ROUNDS))  # bounded retries, then gives up
    assert "one snapshot" in window.missing["a"] and "503" in window.missing["a"]


def test_a_target_that_stops_answering_mid_window_keeps_what_it_gave() -> None:
    net = FakeNetwork(engines={"a": FakeEngine(answers=3)})
    window = net.reader(interval_s=1.0).read("vllm", urls("a"), window_s=5.0)
    (stats,) = window.stats
    assert stats.pod == "a" and stats.window_s == pytest.approx(2.0)  # answered at 0, 1, 2
    assert stats.counters["drafts"] == pytest.approx(20.0)
    assert window.missing == {}
    assert [t for _, t in net.scrapes] == pytest.approx([0, 1, 2, 3, 4, 5])  # no extra rounds


def test_many_targets_share_one_window_and_a_silent_one_is_named_not_fatal() -> None:
    net = FakeNetwork(engines={"a": FakeEngine(answers=99), "c": FakeEngine(answers=99)})
    window = net.reader(interval_s=2.0).read("vllm", urls("a", "b", "c"), window_s=4.0)
    assert [s.pod for s in window.stats] == ["a", "c"]  # in the targets' order
    assert all(s.window_s == pytest.approx(4.0) for s in window.stats)
    assert set(window.missing) == {"b"} and "no snapshot" in window.missing["b"]
    assert net.now == pytest.approx(4.0)  # a target that never answered asks for no extra round
    with pytest.raises(ScrapeError, match="no window for b"):
        window.complete()


def test_complete_returns_every_stats_when_nothing_is_missing() -> None:
    assert Window().complete() == []


def test_scrape_source_reads_pods_through_the_reader() -> None:
    net = FakeNetwork(scrape_s=12.0, engines={"pod-a": FakeEngine(answers=10)})
    source = ScrapeSource(
        clock=lambda: net.now, sleep=net.sleep, transport=httpx.MockTransport(net.handle)
    )
    assert source.interval_s == 2.0 and source.max_late_rounds == MAX_LATE_ROUNDS
    target = PodTarget(name="pod-a", url="http://pod-a/metrics", config=None)
    (stats,) = source.window("vllm", [target], window_s=8.0)
    assert stats.pod == "pod-a" and stats.window_s == pytest.approx(12.0)
    gone = PodTarget(name="pod-b", url="http://pod-b/metrics", config=None)
    assert source.window("vllm", [gone], window_s=1.0) == []  # left out, no exception


def test_scrape_source_spreads_a_long_windows_rounds_to_a_quarter_of_it() -> None:
    """Counters bound the window with two snapshots; a round every 2 s through a 24 s window
    was most of an operator's CPU at 200 SpecDeployments (bench/results/operator_load.md)."""
    target = PodTarget(name="pod-a", url="http://pod-a/metrics", config=None)
    for window_s, rounds_at in ((24.0, [0.0, 6.0, 12.0, 18.0, 24.0]), (6.0, [0.0, 2.0, 4.0, 6.0])):
        net = FakeNetwork(engines={"pod-a": FakeEngine(answers=100)})
        source = ScrapeSource(
            clock=lambda n=net: n.now, sleep=net.sleep, transport=httpx.MockTransport(net.handle)
        )
        (stats,) = source.window("vllm", [target], window_s=window_s)
        assert [t for _, t in net.scrapes] == pytest.approx(rounds_at)
        assert stats.window_s == pytest.approx(window_s)
        assert source.interval_s == 2.0  # the reader's own interval is left as it was


def test_local_engine_without_a_window_raises_scrape_error() -> None:
    engine = LocalEngine(
        engine="vllm", program=[], launch=LaunchSettings(model="m", host="127.0.0.1", port=9)
    )
    with pytest.raises(ScrapeError, match="cannot scrape"):
        engine.observe(0.0)


def test_fail_fast_raises_the_first_scrape_error_without_waiting_out_the_window() -> None:
    net = FakeNetwork(engines={"a": FakeEngine(answers=1)})
    reader = net.reader(interval_s=1.0)
    reader.fail_fast = True
    with pytest.raises(ScrapeError):
        reader.read("vllm", urls("a"), window_s=30.0)
    assert net.now == pytest.approx(1.0)  # answered at 0, refused at 1: no 30 s wait
    unknown_host = WindowReader(fail_fast=True, transport=httpx.MockTransport(net.handle))
    with pytest.raises(ScrapeError):  # the first scrape's 404, on a real clock, at once
        unknown_host.read("vllm", urls("nobody"), window_s=600.0)
