"""The operator's tick-duration histogram leaves a tick's waits out (exported_metrics.TickTimer),
on a fake clock: the figures are exact whatever the host's load."""

from __future__ import annotations

import pytest

from specpilot.operator.kube import exported_metrics


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def _count() -> float:
    value = exported_metrics.REGISTRY.get_sample_value("specpilot_tick_duration_seconds_count")
    return value or 0.0


def test_a_tick_that_mostly_waits_is_observed_by_its_work_alone() -> None:
    clock, before = FakeClock(), _count()
    timer = exported_metrics.TickTimer(clock.sleep, clock)
    clock.now += 0.25  # scraping, deciding, writing status: work
    timer.sleep(24.0)  # the observation window's pauses: not work
    clock.now += 0.5
    assert timer.observe() == pytest.approx(0.75)
    assert _count() == before + 1


def test_a_wait_that_raises_still_counts_as_waiting() -> None:
    clock = FakeClock()

    def stopping(seconds: float) -> None:
        clock.sleep(seconds)
        raise KeyboardInterrupt  # as the daemon's Stopping does

    timer = exported_metrics.TickTimer(stopping, clock)
    with pytest.raises(KeyboardInterrupt):
        timer.sleep(30.0)
    assert timer.observe() == pytest.approx(0.0)
