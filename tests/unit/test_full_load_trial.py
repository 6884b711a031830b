"""A trial at all of the load (runtime/full_load_trial.py): Little's law on a window, the probe
that stops a congested canary, and the verdict on its time in system. Pure: no clock."""

from __future__ import annotations

import pytest

from specpilot.runtime.full_load_trial import (
    OVERLOAD_TOLERANCE,
    REQUIRED_GAIN,
    SETTLE_S,
    FullLoadTrial,
    time_in_system,
)
from specpilot.tuner import Observation


def window(
    running: float | None, waiting: float | None, finished_per_s: float | None
) -> Observation:
    return Observation(
        engine="vllm",
        window_s=60.0,
        pods=("llm-0",),
        acceptance_length=None,
        acceptance_rate=None,
        acceptance_per_position=None,
        running_requests=running,
        waiting_requests=waiting,
        kv_cache_usage=None,
        generation_tokens_per_s=None,
        tpot_p50_s=None,
        tpot_p95_s=None,
        ttft_p95_s=None,
        requests_per_s=finished_per_s,
    )


def test_time_in_system_is_requests_in_flight_over_requests_finished_per_second() -> None:
    assert time_in_system(window(30.0, 10.0, 20.0)) == pytest.approx(2.0)
    assert time_in_system(window(30.0, None, 20.0)) == pytest.approx(1.5)
    assert time_in_system(window(30.0, 0.0, None)) is None
    assert time_in_system(window(None, 0.0, 20.0)) is None


def test_a_canary_is_stopped_only_after_two_probes_running_above_the_replica() -> None:
    trial = FullLoadTrial(window(50.0, 0.0, 10.0))  # 5 s in system
    over = window(50.0 * (1 + OVERLOAD_TOLERANCE) + 1, 0.0, 10.0)
    # the first seconds are the switch itself: not read
    assert trial.overloaded(window(500.0, 0.0, 10.0), SETTLE_S - 1) is None
    assert trial.overloaded(over, SETTLE_S) is None  # one probe above is a burst
    assert trial.overloaded(window(40.0, 0.0, 10.0), SETTLE_S + 5) is None  # and it came back
    # twice the requests in flight at twice the arrivals: the same stay, not congestion
    assert trial.overloaded(window(100.0, 0.0, 20.0), SETTLE_S + 10) is None
    assert trial.overloaded(over, SETTLE_S + 15) is None
    why = trial.overloaded(over, SETTLE_S + 20)
    assert why is not None and "stayed 6.10 s against 5.00 s" in why and "+22%" in why
    # a probe with nothing finished, or no reference load: nothing to compare, never stopped
    assert trial.overloaded(window(500.0, 0.0, None), 1e6) is None
    assert FullLoadTrial(window(0.0, 0.0, 0.0)).overloaded(over, 1e6) is None


def test_the_verdict_asks_for_a_shorter_stay_than_the_replicas_by_the_required_gain() -> None:
    replica = window(60.0, 0.0, 15.0)  # 4 s in system
    trial = FullLoadTrial(replica)
    assert trial.verdict(window(30.0, 0.0, 15.0)) is None  # 2 s: promoted
    just_short = 60.0 * (1 - REQUIRED_GAIN) + 0.5
    why = trial.verdict(window(just_short, 0.0, 15.0))
    assert why is not None and "3.63 s against 4.00 s" in why and "10% less needed" in why
    assert "no load to compare" in (trial.verdict(window(30.0, 0.0, 0.0)) or "")
