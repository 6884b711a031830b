"""Hostile /metrics and hostile Prometheus answers: a NaN, an infinity or a label that is not a
number is dropped at the reading layer and becomes an unknown quantity, never an exception and
never a non-finite number in the Observation, the status it is written to, or the tuner."""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specpilot.runtime.engine_metrics import WindowStats, observe
from specpilot.runtime.promql import PromQLReader
from specpilot.runtime.scrape import parse_snapshot, window_stats
from specpilot.runtime.window import WindowReader
from specpilot.tuner import (
    AcceptanceCurve,
    Observation,
    SpecConfig,
    StepCost,
    TunerSettings,
    TunerState,
    decide,
)

VLLM = """\
# TYPE vllm:spec_decode_num_accepted_tokens counter
vllm:spec_decode_num_accepted_tokens_total {accepted}
# TYPE vllm:spec_decode_num_drafts counter
vllm:spec_decode_num_drafts_total {drafts}
# TYPE vllm:spec_decode_num_draft_tokens counter
vllm:spec_decode_num_draft_tokens_total {drafts}
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{{position="0"}} {accepted}
vllm:spec_decode_num_accepted_tokens_per_pos_total{{position="{position}"}} 1
# TYPE vllm:generation_tokens counter
vllm:generation_tokens_total {tokens}
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running {running}
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{{le="0.5"}} {ttft_low}
vllm:time_to_first_token_seconds_bucket{{le="{le}"}} {ttft_low}
vllm:time_to_first_token_seconds_bucket{{le="+Inf"}} {ttft_all}
vllm:time_to_first_token_seconds_sum {ttft_all}
vllm:time_to_first_token_seconds_count {ttft_all}
"""
HEALTHY = {
    "accepted": "0",
    "drafts": "0",
    "tokens": "0",
    "running": "4",
    "le": "1.0",
    "position": "1",
    "ttft_low": "0",
    "ttft_all": "0",
}
LATER = {**HEALTHY, "accepted": "150", "drafts": "100", "tokens": "500"}
LATER.update(ttft_low="8", ttft_all="10")


def observed(first: dict[str, str], *later: dict[str, str]) -> Observation:
    snapshots = [
        parse_snapshot(VLLM.format(**values), float(at))
        for at, values in enumerate((first, *later))
    ]
    return observe("vllm", [window_stats("vllm", "pod", snapshots)])


def assert_finite(obs: Observation) -> None:
    """Every quantity is a finite number or None, and the status patch serialises as JSON."""
    for name, value in obs.to_dict().items():
        if isinstance(value, float):
            assert math.isfinite(value), (name, value)
    json.dumps(obs.to_dict(), allow_nan=False)


def test_the_healthy_fixture_measures_everything_the_hostile_ones_break() -> None:
    obs = observed(HEALTHY, LATER)
    assert obs.acceptance_length == pytest.approx(2.5)
    assert obs.running_requests == 4.0
    assert obs.ttft_p95_s is not None
    assert obs.acceptance_per_position == pytest.approx((1.5, 0.0))


def test_an_infinite_counter_makes_acceptance_unknown_not_nan() -> None:
    obs = observed(HEALTHY, {**LATER, "accepted": "+Inf"})
    assert obs.acceptance_length is None and obs.acceptance_rate is None
    assert "acceptance_length" in obs.unknown
    assert_finite(obs)


def test_a_counter_whose_first_sample_was_dropped_is_not_counted_from_zero() -> None:
    # 1000 -> 1150 is an increase of 150; counting the series from zero would read 1150.
    obs = observed(
        {**HEALTHY, "accepted": "+Inf", "drafts": "1000"},
        {**LATER, "accepted": "1000", "drafts": "1000"},
        {**LATER, "accepted": "1150", "drafts": "1100"},
    )
    assert obs.acceptance_length == pytest.approx(1 + 150 / 100)


def test_nan_and_infinite_gauges_make_the_batch_unknown() -> None:
    for bad in ("+Inf", "-Inf", "NaN"):
        obs = observed({**HEALTHY, "running": bad}, {**LATER, "running": bad})
        assert obs.running_requests is None and "running_requests" in obs.unknown
        assert_finite(obs)


def test_a_bucket_bound_that_is_not_a_number_is_left_out() -> None:
    obs = observed({**HEALTHY, "le": "fast"}, {**LATER, "le": "fast"})
    assert obs.ttft_p95_s is not None  # the other buckets still answer
    assert obs.acceptance_length == pytest.approx(2.5)


def test_a_position_that_is_not_a_whole_number_is_left_out() -> None:
    obs = observed({**HEALTHY, "position": "x"}, {**LATER, "position": "x"})
    assert obs.acceptance_per_position == pytest.approx((1.5,))


def test_counters_going_backwards_are_a_reset_not_a_negative_increase() -> None:
    obs = observed(LATER, {**LATER, "accepted": "30", "drafts": "20"})
    assert obs.acceptance_length == pytest.approx(1 + 30 / 20)
    assert obs.counter_resets > 0


def test_an_infinite_batch_reaches_the_tuner_as_unknown_and_it_holds() -> None:
    obs = observed({**HEALTHY, "running": "+Inf"}, {**LATER, "running": "+Inf"})
    config = SpecConfig(method="ngram", num_speculative_tokens=3)
    state = TunerState.initial(config, 0.0, {"ngram": AcceptanceCurve(0.2853, 1.0)})
    tuning = TunerSettings(candidates=(SpecConfig(), config), min_dwell_s=0)
    cost = StepCost.for_hardware("H100", "llama-3.1-8b")
    decision, after = decide(obs, state, tuning, cost, 1000.0)
    assert decision.action == "stay" and "holding" in decision.reason and after == state


def test_observe_makes_any_reader_s_non_finite_numbers_unknown() -> None:
    # the last guard, whatever reader built the stats (a huge but finite pair of counters
    # overflows the ratio; a reader that let an infinity through)
    stats = WindowStats(
        pod="p",
        window_s=10.0,
        counters={"accepted": math.inf, "drafts": 1e-320, "draft_tokens": 1e-320},
        gauges={"running": math.inf, "waiting": math.nan, "kv_usage": 0.5},
        accepted_per_position={0: math.inf},
    )
    obs = observe("vllm", [stats])
    assert obs.acceptance_length is None and obs.acceptance_rate is None
    assert obs.running_requests is None and obs.waiting_requests is None
    assert obs.acceptance_per_position is None and obs.kv_cache_usage == 0.5
    assert {"acceptance_length", "running_requests", "waiting_requests"} <= set(obs.unknown)
    assert_finite(obs)


SAMPLE_VALUES = st.sampled_from(["NaN", "+Inf", "-Inf", "1e308", "-1e308", "0", "-3", "7.5"])


@settings(max_examples=120, deadline=None)
@given(
    st.lists(
        st.fixed_dictionaries(
            {
                "accepted": SAMPLE_VALUES,
                "drafts": SAMPLE_VALUES,
                "tokens": SAMPLE_VALUES,
                "running": SAMPLE_VALUES,
                "le": st.sampled_from(["fast", "NaN", "-Inf", "1e400", "0.25", ""]),
                "position": st.sampled_from(["x", "-1", "1.5", "²", "2"]),
                "ttft_low": SAMPLE_VALUES,
                "ttft_all": SAMPLE_VALUES,
            }
        ),
        min_size=2,
        max_size=4,
    )
)
def test_any_mix_of_hostile_samples_gives_finite_or_unknown_quantities(
    windows: list[dict[str, str]],
) -> None:
    assert_finite(observed(windows[0], *windows[1:]))


def test_the_window_reader_survives_a_pod_serving_hostile_numbers() -> None:
    bodies = iter(
        [VLLM.format(**{**HEALTHY, "running": "+Inf"}), VLLM.format(**{**LATER, "le": "fast"})]
    )
    transport = httpx.MockTransport(lambda _: httpx.Response(200, text=next(bodies)))
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    reader = WindowReader(interval_s=1.0, clock=lambda: now[0], sleep=sleep, transport=transport)
    window = reader.read("vllm", {"pod": "http://pod/metrics"}, window_s=1.0)
    [stats] = window.complete()
    obs = observe("vllm", [stats])
    # the +Inf scrape's gauge is dropped; the batch is the other scrape's
    assert obs.acceptance_length == pytest.approx(2.5) and obs.running_requests == 4.0
    assert_finite(obs)


# --------------------------------------------------------------------------- PromQL


class HostilePrometheus(BaseHTTPRequestHandler):
    """A real HTTP endpoint speaking Prometheus' query API, answering with infinities, NaNs,
    labels that are not numbers and results that are not results."""

    def do_GET(self) -> None:
        query = parse_qs(urlparse(self.path).query).get("query", [""])[0]
        result: list[object] = []
        if "spec_decode_num_accepted_tokens_per_pos" in query:
            result = [
                {"metric": {"pod": "a", "position": "x"}, "value": [0, "3"]},
                {"metric": {"pod": "a", "position": "0"}, "value": [0, "5"]},
            ]
        elif "spec_decode_num_accepted_tokens" in query and "increase" in query:
            result = [{"metric": {"pod": "a"}, "value": [0, "+Inf"]}]
        elif "spec_decode_num_drafts" in query and "increase" in query:
            result = [{"metric": {"pod": "a"}, "value": [0, "10"]}]
        elif "generation_tokens" in query and "increase" in query:
            result = [{"metric": {"pod": "a"}, "value": [0, "NaN"]}, {"metric": {"pod": "a"}}]
        elif "num_requests_running" in query:
            result = [{"metric": {"pod": "a"}, "value": [0, "+Inf"]}]
        elif "time_to_first_token_seconds_bucket" in query:
            result = [
                {"metric": {"pod": "a", "le": "fast"}, "value": [0, "4"]},
                {"metric": {"pod": "a", "le": "0.5"}, "value": [0, "8"]},
                {"metric": {"pod": "a", "le": "+Inf"}, "value": [0, "10"]},
                {"metric": {"pod": "a"}, "value": [0, "10"]},
                {"metric": "garbage", "value": [0, "1"]},
                {"metric": {"pod": "a", "le": "1"}, "value": [0, "not a number"]},
            ]
        body = json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}})
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def hostile_prometheus() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), HostilePrometheus)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_promql_drops_infinities_nans_and_labels_that_are_not_numbers(
    hostile_prometheus: str,
) -> None:
    [stats] = PromQLReader(hostile_prometheus).window_stats("vllm", 10.0, end=100.0)
    assert stats.counters == {"drafts": 10.0}
    assert "running" not in stats.gauges
    assert stats.histograms["ttft"] == {0.5: 8.0, math.inf: 10.0}
    assert stats.accepted_per_position == {0: 5.0}
    obs = observe("vllm", [stats])
    assert obs.acceptance_length is None and obs.running_requests is None
    assert obs.ttft_p95_s is not None
    assert_finite(obs)
