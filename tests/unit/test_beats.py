"""The tuning daemon's beats (operator/kube/beat.py): each runs on the tick pool, not on the
event loop's thread; a stop cuts short a beat waiting in `sleep` and ends run_beats quietly;
an error from a beat goes up to kopf. kopf's stop flag is played by a stand-in with the same
surface as an async daemon's (is_set, reason, an awaitable wait)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from typing import Any

import pytest

from specpilot.operator.kube.beat import run_beats, tick_phase, tick_pool

GENEROUS_S = 30.0
"""A bound on waits that end at once when things work; only a hang reaches it."""
Beat = Callable[[Callable[[float], None]], None]


class StopFlag:
    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.reason = "operator exit"

    def is_set(self) -> bool:
        return self.event.is_set()

    async def wait(self, timeout: float | None = None) -> StopFlag:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.event.wait(), timeout)
        return self


def drive(beat: Beat, stop_when: threading.Event | None = None, first_after_s: float = 0.0) -> None:
    """run_beats over `beat`; with `stop_when`, the stop flag is set once that is set."""

    async def main() -> None:
        flag, pool = StopFlag(), tick_pool(2)
        beats = asyncio.create_task(
            run_beats(flag, beat, pool=pool, every_s=0.01, first_after_s=first_after_s)  # type: ignore[arg-type]
        )
        try:
            if stop_when is not None:
                assert await asyncio.to_thread(stop_when.wait, GENEROUS_S)
                flag.event.set()
            await asyncio.wait_for(beats, GENEROUS_S)
        finally:
            pool.shutdown(wait=True)

    asyncio.run(main())


def test_a_stop_cuts_a_waiting_beat_short_and_ends_the_daemon_quietly() -> None:
    waiting, seen = threading.Event(), dict[str, Any]()

    def beat(sleep: Callable[[float], None]) -> None:
        seen["thread"] = threading.current_thread().name
        waiting.set()
        sleep(3600.0)  # an observation window: the stop must cut it short
        seen["woke"] = True

    drive(beat, stop_when=waiting)  # returns: no Stopping escapes run_beats
    assert seen["thread"].startswith("specpilot-tick")  # not the event loop's thread
    assert "woke" not in seen  # sleep raised instead of returning


def test_beats_repeat_until_an_error_which_goes_up() -> None:
    beats: list[int] = []

    def beat(sleep: Callable[[float], None]) -> None:
        beats.append(1)
        if len(beats) == 3:
            raise RuntimeError("a bug in a tick")

    with pytest.raises(RuntimeError, match="a bug in a tick"):
        drive(beat)
    assert len(beats) == 3


def test_objects_made_together_tick_spread_over_the_interval() -> None:
    """200 names as `kubectl apply -f dir/` would make them: their phases cover the interval
    (every tenth of it holds some, none holds a third), and each is the same on every call,
    so a restarted operator spreads them the same way."""
    phases = [tick_phase("default", f"load-{i:04d}") for i in range(200)]
    assert all(0.0 <= p < 1.0 for p in phases)
    tenths = [sum(1 for p in phases if i / 10 <= p < (i + 1) / 10) for i in range(10)]
    assert min(tenths) > 0 and max(tenths) < 200 / 3
    assert phases == [tick_phase("default", f"load-{i:04d}") for i in range(200)]
    assert tick_phase("a", "b") != tick_phase("b", "a")


def test_the_first_beat_waits_its_phase_and_a_stop_cuts_that_wait() -> None:
    beats: list[int] = []
    never = threading.Event()

    def beat(sleep: Callable[[float], None]) -> None:
        beats.append(1)

    started = threading.Event()

    def stop_soon() -> None:
        started.wait(GENEROUS_S)
        never.set()

    stopper = threading.Thread(target=stop_soon)
    stopper.start()
    started.set()
    drive(beat, stop_when=never, first_after_s=3600.0)  # returns at the stop, not in an hour
    stopper.join()
    assert beats == []  # stopped while waiting for its first beat
