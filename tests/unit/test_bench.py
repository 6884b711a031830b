"""Fast mode over a rate curve through the bench's `run_policy` (operator/app/bench/run.py), and
the demo's summary built on it: a static policy serves a quiet trace whole, speculation at low
load gives faster tokens, a restart's downtime shows as latency for the requests that waited,
the demo's load generator and the bench draw the same requests, the real-time row reports
what a non-streaming client measured and nothing else, a fixed schedule switches where it says,
and SpecPilot counted without a surge's drain runs by default with a surge (and is SpecPilot
itself without one). Simulated time only."""

from __future__ import annotations

import pytest

from specpilot.operator.app.bench.command import _policies
from specpilot.operator.app.bench.policies import HANDOVER, SPECPILOT, StaticPolicy
from specpilot.operator.app.bench.run import (
    PolicyRun,
    Setup,
    Tuning,
    run_policy,
    run_schedule,
    scored_at_end,
)
from specpilot.operator.app.bench.traffic import requests_from_rates
from specpilot.operator.app.demo.actuator import LatencyHistogram, Switch
from specpilot.operator.app.demo.load import Completed, LoadStats, plan_requests
from specpilot.operator.app.demo.report import (
    FAST,
    NOT_SEEN,
    REAL_TIME,
    build_summary,
    fast_row,
    realtime_row,
    summary_markdown,
)
from specpilot.operator.kube.children import DRAIN_S, PRE_STOP_SLEEP_S
from specpilot.runtime.emulator.core import Request
from specpilot.runtime.serving_metrics import summarize
from specpilot.runtime.traces import parse_trace
from specpilot.tuner import SpecConfig

# Chat at 4 req/s for four minutes, then a quiet minute for the last requests to finish.
QUIET = parse_trace("t,rps,chat\n0,4,1\n240,0,1\n300,0,1\n", "quiet")
SETUP = Setup(
    gpu="H100",
    profile="llama-3.1-8b",
    engine="vllm",
    requests=requests_from_rates(QUIET, seed=1),
    duration_s=QUIET.duration_s,
    window_s=30.0,
    rollout="restart",  # one engine, down while it restarts
    tuning=Tuning(start_s=20.0, min_dwell_s=30.0),
)
NO_SPEC = StaticPolicy("no-spec", SpecConfig())
EAGLE3 = StaticPolicy(
    "static:eagle3 K=3", SpecConfig(method="eagle3", num_speculative_tokens=3, draft_model="d")
)


@pytest.fixture(scope="module")
def runs() -> dict[str, PolicyRun]:
    policies: list[StaticPolicy | str] = [NO_SPEC, EAGLE3, SPECPILOT]
    return {p if isinstance(p, str) else p.name: run_policy(SETUP, 0, p) for p in policies}


def test_a_static_policy_serves_every_request_of_a_quiet_trace(runs: dict[str, PolicyRun]) -> None:
    plain = runs["no-spec"]
    assert len(plain.records) == len(SETUP.requests) > 800  # ~4 req/s for 240 s
    assert not any(r.failed for r in plain.records)
    assert plain.restarts == 0
    assert plain.configs_by_window == ["no speculation"] * 10  # 300 s in 30 s windows
    overall = summarize(plain.records, SETUP.duration_s)
    assert overall.slo_attainment["relaxed"] == 1.0 and overall.completed == overall.requests


def test_speculation_at_low_load_gives_faster_tokens(runs: dict[str, PolicyRun]) -> None:
    plain = summarize(runs["no-spec"].records, SETUP.duration_s)
    eagle = summarize(runs["static:eagle3 K=3"].records, SETUP.duration_s)
    assert eagle.tpot_ms_mean < plain.tpot_ms_mean
    assert eagle.e2el_ms_mean < plain.e2el_ms_mean


def test_a_restart_downtime_shows_as_latency_for_the_requests_that_waited(
    runs: dict[str, PolicyRun],
) -> None:
    pilot, static = runs[SPECPILOT], runs["static:eagle3 K=3"]
    assert pilot.restarts >= 1, "at 4 req/s of chat SpecPilot turns speculation on"
    first = next(i for i, c in enumerate(pilot.configs_by_window) if c != "no speculation")
    # The switch is applied when its tick's window closes. The only engine stops then: it
    # finishes what it holds (short chat requests, done within its pre-stop sleep) and frees
    # its GPU after the sleep; the new one starts on it.
    down_from = pilot.observations[first][0] + SETUP.window_s
    up_at = down_from + PRE_STOP_SLEEP_S + SETUP.tuning.start_s
    waited = [i for i, r in enumerate(pilot.records) if down_from <= r.arrival_s < up_at]
    assert len(waited) > 100  # ~4 req/s for 30 s
    for i in waited:
        record = pilot.records[i]
        assert not record.failed and record.first_token_s is not None
        assert record.first_token_s >= up_at  # it waited for the restart
        static_ttft = static.records[i].ttft_s  # the same request, no restart
        assert static_ttft is not None and static_ttft < 1.0
    # the requests in flight when it went down finished on it, never sent again
    in_flight = [
        r
        for r in pilot.records
        if r.arrival_s < down_from and (r.finished_s is None or r.finished_s > down_from)
    ]
    assert in_flight
    for record in in_flight:
        assert record.first_token_s is not None and record.first_token_s < down_from + 1.0
        assert record.finished_s is not None
        assert record.finished_s <= down_from + PRE_STOP_SLEEP_S + DRAIN_S


def test_the_demo_load_generator_and_the_bench_draw_the_same_requests() -> None:
    planned = plan_requests(QUIET, 1)
    assert [(r.arrival_s, r.task, r.prompt_tokens, r.max_tokens) for r in planned] == [
        (t.arrival_s, t.task, t.prompt_tokens, t.output_tokens) for t in SETUP.requests
    ]


def _request(arrival: float, number: int) -> Request:
    return Request(
        request_id=f"r{number}", task="chat", prompt_tokens=8, max_tokens=4, arrival_s=arrival
    )


def test_the_real_time_row_is_what_a_non_streaming_client_measured() -> None:
    planned = [_request(0.0, 1), _request(1.0, 2), _request(2.0, 3), _request(11.0, 4)]
    load = LoadStats(sent=3)
    load.completed += [
        Completed(arrival_s=0.0, finished_s=2.0, task="chat", tokens=4, attempts=1),
        Completed(arrival_s=1.0, finished_s=10.5, task="chat", tokens=4, attempts=2),  # late
    ]
    histogram = LatencyHistogram(buckets={0.01: 1.0, 0.02: 2.0, float("inf"): 2.0})
    histogram.total_s, histogram.count = 0.03, 2.0
    switches = [Switch(0.0, 0.0, SpecConfig()), Switch(5.0, 6.0, EAGLE3.config)]
    row = realtime_row(load, planned, histogram, switches, duration_s=10.0)
    # three requests arrived before the end; one finished in time (2 s), the other two count
    # with their wait until the end (9 s and 8 s); the one arriving after the end is not sent
    assert row["requests"] == 3 and row["completed"] == 1
    assert row["e2el_ms_mean"] == pytest.approx((2.0 + 9.0 + 8.0) / 3 * 1e3, abs=0.1)
    assert row["tokens_per_s"] == 0.4 and row["restarts"] == 1
    assert row["ttft_ms_p99"] is row["tpot_ms_mean"] is row["slo_attainment"] is None
    assert row["engine_tpot_ms_mean"] == 15.0
    assert row["mode"] == REAL_TIME


def demo_setup(rollout: str, **extra: float) -> dict[str, object]:
    """The demo summary's setup for SETUP's run."""
    return {
        "gpu": "H100",
        "model_profile": "llama-3.1-8b",
        "engine": "vllm",
        "trace": "quiet",
        "duration_s": 300.0,
        "seed": 1,
        "window_s": 30.0,
        "min_dwell_s": 30.0,
        "restart_budget": 4,
        "restart_downtime_s": 20.0,
        "rollout": rollout,
        "slo_tpot_ms": 50.0,
        **extra,
    }


def test_the_demo_summary_shows_latency_attainment_and_restarts_side_by_side(
    runs: dict[str, PolicyRun],
) -> None:
    fast = [fast_row(runs[name], SETUP) for name in ("no-spec", "static:eagle3 K=3", SPECPILOT)]
    assert all(r["mode"] == FAST for r in fast)
    assert set(fast[0]["slo_attainment"]) == {"tight", "standard", "relaxed"}
    load = LoadStats()
    realtime = realtime_row(load, [], LatencyHistogram(), [Switch(0, 0, SpecConfig())], 300.0)
    summary = build_summary(
        setup=demo_setup("restart"), fast=fast, realtime=realtime, ticks=[], switches=[], load=load
    )
    assert summary["best_static_fast_mode"] == "static:eagle3 K=3"  # lower mean E2E latency
    text = summary_markdown(summary)
    assert "| E2E mean ms | TTFT p99 ms | TPOT mean ms | SLO tight | SLO standard" in text
    realtime_line = next(line for line in text.splitlines() if f"| {REAL_TIME} |" in line)
    assert realtime_line.count(NOT_SEEN) == 5  # TTFT, TPOT and the three tiers
    assert "non-streaming" in text
    assert "each switch stops the engine" in text  # the rollout is named


def test_the_demo_summary_never_ranks_the_handover_count_as_a_static_config(
    runs: dict[str, PolicyRun],
) -> None:
    handed = fast_row(run_policy(SETUP, 0, HANDOVER), SETUP)
    handed["e2el_ms_mean"] = 1.0  # below every static: still not one of them
    fast = [fast_row(runs["no-spec"], SETUP), fast_row(runs[SPECPILOT], SETUP), handed]
    load = LoadStats()
    realtime = realtime_row(load, [], LatencyHistogram(), [], 300.0)
    summary = build_summary(
        setup=demo_setup("surge", drain_s=30.0),
        fast=fast,
        realtime=realtime,
        ticks=[],
        switches=[],
        load=load,
    )
    assert summary["best_static_fast_mode"] == "no-spec"
    text = summary_markdown(summary)
    assert f"| {HANDOVER} | {FAST} |" in text
    assert "without the spare GPU's drain" in text and "up to 30 s" in text


def test_every_policy_is_scored_at_the_traces_end() -> None:
    """SpecPilot's loop may tick past the end (a rollout shifts its windows): a request it
    finished there failed as it would have under a static policy, and waited until the end."""
    shape = {"task": "chat", "prompt_tokens": 100, "max_tokens": 50, "arrival_s": 250.0}
    late = Request(request_id="late", **shape, first_token_s=280.0, finished_s=310.0)
    record = scored_at_end(late, SETUP.duration_s)
    assert record.failed and record.given_up_s == SETUP.duration_s
    assert record.first_token_s is None and record.output_tokens == 0
    served = Request(request_id="ok", **shape, generated=50, first_token_s=260.0, finished_s=290.0)
    assert not scored_at_end(served, SETUP.duration_s).failed


def test_handover_is_specpilot_itself_where_no_surge_rolls(runs: dict[str, PolicyRun]) -> None:
    handed = run_policy(SETUP, 0, HANDOVER)  # SETUP restarts: nothing to hand over
    pilot = runs[SPECPILOT]
    assert handed.decisions == pilot.decisions and handed.restarts == pilot.restarts >= 1
    assert [r.finished_s for r in handed.records] == [r.finished_s for r in pilot.records]


def test_the_bench_counts_a_surge_both_ways_by_default() -> None:
    statics = [NO_SPEC, EAGLE3]
    assert _policies(None, statics, "surge") == [*statics, SPECPILOT, HANDOVER]
    assert _policies(None, statics, "one-at-a-time") == [*statics, SPECPILOT]
    assert _policies(HANDOVER, statics, "restart") == [HANDOVER]


def test_a_schedule_switches_at_the_first_window_at_or_after_its_time() -> None:
    eagle = EAGLE3.config
    run = run_schedule(SETUP, 0, "on at 45 s", [(0.0, SpecConfig()), (45.0, eagle)])
    # 30 s windows: applied at 60 s, then a restart of 20 s (plus the pre-stop sleep)
    assert run.decisions == ["t=60s -> eagle3 K=3"] and run.restarts == 1
    assert run.configs_by_window[:2] == ["no speculation"] * 2
    assert run.configs_by_window[2:] == ["eagle3 K=3"] * (len(run.configs_by_window) - 2)
    static = run_policy(SETUP, 0, NO_SPEC)
    assert run.records[0].finished_s == static.records[0].finished_s  # same start, same physics
    with pytest.raises(ValueError, match="starts with its config at 0 s"):
        run_schedule(SETUP, 0, "late", [(10.0, eagle)])
