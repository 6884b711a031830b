"""The operator's tick-duration histogram leaves a tick's waits out (exported_metrics.TickTimer)."""

from __future__ import annotations

import time

import pytest

from specpilot.operator.kube import exported_metrics


def _count() -> float:
    value = exported_metrics.REGISTRY.get_sample_value("specpilot_tick_duration_seconds_count")
    return value or 0.0


def test_a_tick_that_mostly_waits_is_observed_by_its_work_alone() -> None:
    before = _count()
    timer = exported_metrics.TickTimer(time.sleep)
    timer.sleep(0.3)  # the observation window's pause: not work
    worked = timer.observe()
    assert worked < 0.2
    assert _count() == before + 1


def test_a_wait_that_raises_still_counts_as_waiting() -> None:
    def stopping(seconds: float) -> None:
        time.sleep(seconds)
        raise KeyboardInterrupt

    timer = exported_metrics.TickTimer(stopping)
    with pytest.raises(KeyboardInterrupt):
        timer.sleep(0.3)
    assert timer.observe() < 0.2
