"""Metrics reader on exposition text produced by a real prometheus_client registry, named and
labelled as vLLM 0.32 and SGLang 0.5.23 expose them."""

from __future__ import annotations

import math

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from specpilot.runtime.engine_metrics import (
    WindowStats,
    consecutive,
    histogram_quantile,
    observe,
    observe_per_pod,
)
from specpilot.runtime.scrape import ScrapeError, parse_snapshot, window_stats

LABELS = {"model_name": "m", "engine": "0"}
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5)


class FakeVllm:
    """A prometheus_client registry holding vLLM's speculative, load and latency series."""

    def __init__(self, k: int = 3) -> None:
        self.registry = CollectorRegistry()
        names = list(LABELS)
        self.drafts = Counter("vllm:spec_decode_num_drafts", "", names, registry=self.registry)
        self.draft_tokens = Counter(
            "vllm:spec_decode_num_draft_tokens", "", names, registry=self.registry
        )
        self.accepted = Counter(
            "vllm:spec_decode_num_accepted_tokens", "", names, registry=self.registry
        )
        self.per_pos = Counter(
            "vllm:spec_decode_num_accepted_tokens_per_pos",
            "",
            [*names, "position"],
            registry=self.registry,
        )
        self.generated = Counter("vllm:generation_tokens", "", names, registry=self.registry)
        self.running = Gauge("vllm:num_requests_running", "", names, registry=self.registry)
        self.waiting = Gauge("vllm:num_requests_waiting", "", names, registry=self.registry)
        self.kv = Gauge("vllm:kv_cache_usage_perc", "", names, registry=self.registry)
        self.prompt = Counter("vllm:prompt_tokens", "", names, registry=self.registry)
        self.tpot = Histogram(
            "vllm:request_time_per_output_token_seconds",
            "",
            names,
            buckets=TPOT_BUCKETS,
            registry=self.registry,
        )
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "",
            names,
            buckets=(0.1, 0.5, 1.0),
            registry=self.registry,
        )
        self.k = k

    def step(self, drafts: int, accepted_per_pos: list[int], running: int, tokens: int) -> None:
        self.drafts.labels(**LABELS).inc(drafts)
        self.draft_tokens.labels(**LABELS).inc(drafts * self.k)
        self.accepted.labels(**LABELS).inc(sum(accepted_per_pos))
        for position, count in enumerate(accepted_per_pos):
            self.per_pos.labels(**LABELS, position=str(position)).inc(count)
        self.generated.labels(**LABELS).inc(tokens)
        self.prompt.labels(**LABELS).inc(2 * tokens)
        self.running.labels(**LABELS).set(running)
        self.waiting.labels(**LABELS).set(0)
        self.kv.labels(**LABELS).set(0.25)

    def text(self) -> str:
        return generate_latest(self.registry).decode()


def test_vllm_window_matches_hand_computation() -> None:
    engine = FakeVllm()
    engine.step(drafts=0, accepted_per_pos=[0, 0, 0], running=0, tokens=0)
    first = parse_snapshot(engine.text(), 100.0)
    engine.step(drafts=100, accepted_per_pos=[90, 70, 40], running=8, tokens=500)
    for value in (0.02, 0.02, 0.03, 0.2):
        engine.tpot.labels(**LABELS).observe(value)
    engine.ttft.labels(**LABELS).observe(0.3)
    second = parse_snapshot(engine.text(), 110.0)
    obs = observe("vllm", [window_stats("vllm", "pod-a", [first, second])])
    assert obs.acceptance_length == pytest.approx(1 + 200 / 100)
    assert obs.acceptance_rate == pytest.approx(200 / 300)
    assert obs.acceptance_per_position == pytest.approx((0.9, 0.7, 0.4))
    assert obs.generation_tokens_per_s == pytest.approx(50.0)
    assert obs.prompt_tokens_per_s == pytest.approx(100.0)
    assert obs.running_requests == pytest.approx(4.0)  # mean of 0 and 8
    assert obs.kv_cache_usage == pytest.approx(0.25)
    # rank 2 of 4 reaches the (0.01, 0.025] bucket, which holds 2: its upper edge
    assert obs.tpot_p50_s == pytest.approx(0.025)
    assert obs.tpot_p95_s is not None and 0.1 < obs.tpot_p95_s <= 0.25
    assert obs.ttft_p95_s is not None and 0.1 < obs.ttft_p95_s <= 0.5
    # this fake finishes no request (no per-request histogram): the mean prompt stays unknown
    assert obs.unknown == ("requests_per_s",) and obs.engines == 1 and obs.counter_resets == 0


def test_counter_reset_counts_from_zero() -> None:
    before = FakeVllm()
    before.step(drafts=1000, accepted_per_pos=[900, 800, 700], running=4, tokens=5000)
    old = parse_snapshot(before.text(), 0.0)
    restarted = FakeVllm()  # the pod restarted: counters start again from zero
    restarted.step(drafts=10, accepted_per_pos=[5, 3, 2], running=1, tokens=40)
    new = parse_snapshot(restarted.text(), 5.0)
    stats = window_stats("vllm", "pod", [old, new])
    assert stats.counter_resets > 0
    obs = observe("vllm", [stats])
    assert obs.acceptance_length == pytest.approx(1 + 10 / 10)
    assert obs.generation_tokens_per_s == pytest.approx(40 / 5)


def test_no_drafts_and_missing_series_are_unknown_not_errors() -> None:
    engine = FakeVllm()
    engine.step(drafts=0, accepted_per_pos=[0, 0, 0], running=2, tokens=0)
    a = parse_snapshot(engine.text(), 0.0)
    b = parse_snapshot(engine.text(), 1.0)
    obs = observe("vllm", [window_stats("vllm", "p", [a, b])])
    assert obs.acceptance_length is None and obs.acceptance_rate is None
    assert obs.tpot_p50_s is None and obs.ttft_p95_s is None
    assert {"acceptance_length", "acceptance_rate", "tpot_p50_s"} <= set(obs.unknown)
    assert obs.running_requests == 2.0
    empty = observe(
        "vllm", [window_stats("vllm", "p", [parse_snapshot("", 0.0), parse_snapshot("", 1.0)])]
    )
    assert set(empty.unknown) >= {
        "acceptance_length",
        "running_requests",
        "generation_tokens_per_s",
    }
    assert observe("vllm", []).unknown  # no pods at all: everything unknown, no exception


def test_nan_samples_are_skipped() -> None:
    text = "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running NaN\n"
    obs = observe(
        "vllm", [window_stats("vllm", "p", [parse_snapshot(text, 0.0), parse_snapshot(text, 1.0)])]
    )
    assert obs.running_requests is None and "running_requests" in obs.unknown


def test_garbage_text_is_a_scrape_error() -> None:
    with pytest.raises(ScrapeError):
        parse_snapshot("vllm:num_requests_running{engine=} x y z\n", 0.0)


def test_pods_pool_counts_and_average_load() -> None:
    a = WindowStats(
        pod="a",
        window_s=10,
        counters={"accepted": 300, "drafts": 100, "generation_tokens": 100},
        gauges={"running": 2.0},
    )
    b = WindowStats(
        pod="b",
        window_s=10,
        counters={"accepted": 100, "drafts": 100, "generation_tokens": 300},
        gauges={"running": 30.0},
    )
    total = observe("vllm", [a, b])
    assert total.acceptance_length == pytest.approx(1 + 400 / 200)
    assert total.generation_tokens_per_s == pytest.approx(40.0)
    assert total.running_requests == pytest.approx(16.0)
    per_pod = observe_per_pod("vllm", [a, b])
    assert per_pod["a"].acceptance_length == pytest.approx(4.0)
    assert per_pod["b"].acceptance_length == pytest.approx(2.0)


def test_sglang_gauges_weighted_by_verify_calls() -> None:
    registry = CollectorRegistry()
    accept = Gauge("sglang:spec_accept_length", "", ["model_name"], registry=registry)
    verify = Counter("sglang:spec_verify_calls", "", ["model_name"], registry=registry)
    running = Gauge("sglang:num_running_reqs", "", ["model_name"], registry=registry)
    accept.labels("m").set(3.0)
    running.labels("m").set(4)
    first = parse_snapshot(generate_latest(registry).decode(), 0.0)
    verify.labels("m").inc(30)
    second = parse_snapshot(generate_latest(registry).decode(), 2.0)
    pod_a = window_stats("sglang", "a", [first, second])
    pod_b = WindowStats(
        pod="b", window_s=2.0, counters={"verify_calls": 10}, gauges={"accept_length_gauge": 2.0}
    )
    obs = observe("sglang", [pod_a, pod_b])
    assert obs.acceptance_length == pytest.approx((3.0 * 30 + 2.0 * 10) / 40)
    assert obs.acceptance_per_position is None and obs.running_requests == pytest.approx(4.0)


def test_histogram_quantile_edges() -> None:
    assert histogram_quantile(0.5, {}) is None
    assert histogram_quantile(0.5, {1.0: 0.0, math.inf: 0.0}) is None
    assert histogram_quantile(0.5, {1.0: 4.0}) is None  # no +Inf bucket: not a histogram
    assert histogram_quantile(0.99, {1.0: 1.0, math.inf: 10.0}) == 1.0  # lands in +Inf bucket
    assert histogram_quantile(0.5, {1.0: 10.0, 2.0: 10.0, math.inf: 10.0}) == pytest.approx(0.5)


@pytest.mark.parametrize(("engine", "key"), [("vllm", "inference_s"), ("sglang", "e2e_s")])
def test_finished_requests_are_read_from_a_per_request_histograms_count(
    engine: str, key: str
) -> None:
    """Each engine's histogram that counts a request as it finishes gives the request rate,
    summed over pods like the token rates: with the prompt rate, the mean prompt."""
    pods = [
        WindowStats(
            pod=f"pod-{i}",
            window_s=10.0,
            counters={"prompt_tokens": 3000.0 * (i + 1), "generation_tokens": 500.0},
            histogram_counts={key: 3.0 * (i + 1)},
            histogram_sums={key: 1.0},
        )
        for i in range(2)
    ]
    obs = observe(engine, pods)
    assert obs.requests_per_s == pytest.approx(0.3 + 0.6)
    assert obs.prompt_tokens_per_s is not None
    assert obs.prompt_tokens_per_s / obs.requests_per_s == pytest.approx(1000.0)
    idle = observe(engine, [WindowStats(pod="pod-0", window_s=10.0, counters={})])
    assert idle.requests_per_s is None


def test_back_to_back_windows_join_into_one_that_reads_the_same() -> None:
    def probe(running: float, finished: float, accepted: float) -> WindowStats:
        return WindowStats(
            pod="p", window_s=5.0,
            counters={"generation_tokens": 500.0, "accepted": accepted, "drafts": 100.0},
            gauges={"running": running, "waiting": 0.0},
            histograms={"tpot": {0.01: finished, math.inf: finished}},
            histogram_sums={"inference_s": running * 5.0},
            histogram_counts={"inference_s": finished},
            accepted_per_position={0: accepted},
        )  # fmt: skip

    first, second = probe(10.0, 20.0, 150.0), probe(30.0, 40.0, 250.0)
    joined = consecutive([first, second])
    assert joined.window_s == 10.0 and joined.counters["generation_tokens"] == 1000.0
    assert joined.gauges["running"] == pytest.approx(20.0)  # each probe's mean, 5 s each
    assert joined.histograms["tpot"][math.inf] == 60.0
    seen = observe("vllm", [joined])
    # requests in flight by Little's law over the whole span; 60 finished in 10 s
    assert seen.running_requests == pytest.approx(20.0)
    assert seen.requests_per_s == pytest.approx(6.0)
    assert seen.acceptance_length == pytest.approx(1 + 400.0 / 200.0)
    with pytest.raises(ValueError, match="no windows"):
        consecutive([])
