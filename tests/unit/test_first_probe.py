"""A fresh deployment's first window, looked at early: two consecutive windows read as one
(`joined`), and the control loop's probe. Under a queue, a move for capacity is made at the
probe; anything else waits for the whole window, which the tuner then reads as it always did.
The actuator here is a script of observations (no engine: the loop's timing is the subject)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest
from test_latency_objective import COST, EAGLE, NO_SPEC, PRIORS, settings, window

from specpilot.operator.loop import FIRST_PROBE_SHARE, MIN_PROBE_S, QUEUE_AT_PROBE, ControlLoop
from specpilot.tuner import Observation, SpecConfig, TunerState, joined

LIMIT = 256.0
"""The bench's max-num-seqs (`TunerSettings.max_batch`): a batch there with a queue is a config
short of its load."""


@dataclass
class ScriptedActuator:
    """Returns the observations it was given, one per `observe`, scaled to the window asked."""

    script: list[Observation]
    asked: list[float] = field(default_factory=list)
    applied: list[SpecConfig] = field(default_factory=list)

    def apply(self, config: SpecConfig) -> None:
        self.applied.append(config)

    def observe(self, window_s: float) -> Observation:
        self.asked.append(window_s)
        return replace(self.script.pop(0), window_s=window_s)


def loop_on(config: SpecConfig, script: list[Observation], window_s: float = 60.0) -> ControlLoop:
    return ControlLoop(
        actuator=ScriptedActuator(script),
        # a fast restart, as in test_first_move: a move for capacity is not held back by it
        settings=settings("latency", windows=5, restart_s=5.0),
        cost=COST,
        state=TunerState.initial(config, 0.0, PRIORS),
        window_s=window_s,
        probe_first_window=True,
    )


def test_two_consecutive_windows_join_into_the_window_they_span() -> None:
    first = replace(
        window(EAGLE, 40.0, waiting=3.0),
        window_s=20.0,
        running_requests=30.0,
        generation_tokens_per_s=1000.0,
        acceptance_length=2.0,
        acceptance_per_position=(0.8, 0.4),
        drafts=100.0,
        kv_cache_usage=0.2,
    )
    then = replace(
        first,
        window_s=40.0,
        running_requests=60.0,
        generation_tokens_per_s=2500.0,
        acceptance_length=3.0,
        acceptance_per_position=(0.9, 0.6),
        drafts=300.0,
        waiting_requests=0.0,
        kv_cache_usage=0.5,
        tpot_p95_s=0.02,
    )
    both = joined(first, then)
    assert both.window_s == 60.0
    assert both.running_requests == pytest.approx(50.0)  # by time: (30 x 20 + 60 x 40) / 60
    assert both.generation_tokens_per_s == pytest.approx(2000.0)
    assert both.acceptance_length == pytest.approx(2.75)  # by drafts: (2 x 100 + 3 x 300) / 400
    assert both.acceptance_per_position == pytest.approx((0.875, 0.55))
    assert both.drafts == 400.0
    assert both.load_rise == pytest.approx(2.5)  # the later part's tokens/s over the earlier's
    assert first.load_rise is None  # one window does not say how the load moved inside it
    # the state the window leaves, and the later percentile
    assert both.waiting_requests == 0.0 and both.kv_cache_usage == 0.5
    assert both.tpot_p95_s == 0.02
    unknown_first = joined(replace(first, acceptance_length=None, drafts=None), then)
    assert unknown_first.acceptance_length == 3.0 and unknown_first.drafts == 300.0


def test_without_a_queue_at_the_probe_the_tuner_reads_the_whole_window() -> None:
    loop = loop_on(NO_SPEC, [window(NO_SPEC, 2.0), window(NO_SPEC, 2.0)])
    record = loop.tick(0.0)
    assert loop.actuator.asked == [20.0, 40.0]  # type: ignore[attr-defined]
    assert record.observation.window_s == 60.0
    # what a fresh deployment at low load does after a whole window (test_first_move)
    assert record.decision.config == EAGLE and record.applied


def test_a_config_short_of_its_load_is_left_at_the_probe() -> None:
    queue = window(EAGLE, LIMIT, waiting=400.0)
    loop = loop_on(EAGLE, [queue, queue])
    record = loop.tick(0.0)
    assert loop.actuator.asked == [60.0 * FIRST_PROBE_SHARE]  # type: ignore[attr-defined]
    assert record.applied and record.decision.config == NO_SPEC, record.decision.reason
    assert not record.decision.speed_checked  # a move for capacity
    assert loop.actuator.applied == [NO_SPEC]  # type: ignore[attr-defined]


def test_a_queue_at_the_probe_that_moves_nothing_for_capacity_waits_for_the_window() -> None:
    """Requests wait at the probe (an engine still filling), but the tuner would stay, or move
    for speed: the rest of the window is observed and the decision made on all of it."""
    filling = window(NO_SPEC, 2.0, waiting=QUEUE_AT_PROBE + 2.0)
    loop = loop_on(NO_SPEC, [filling, window(NO_SPEC, 2.0)])
    record = loop.tick(0.0)
    assert loop.actuator.asked == [20.0, 40.0]  # type: ignore[attr-defined]
    assert record.observation.window_s == 60.0
    assert record.observation.waiting_requests == 0.0


def test_only_a_fresh_deployment_with_a_long_enough_window_is_probed() -> None:
    queue = window(EAGLE, LIMIT, waiting=400.0)
    measured = loop_on(EAGLE, [queue])
    measured.state = replace(measured.state, last_window_s=0.0)
    measured.tick(60.0)
    assert measured.actuator.asked == [60.0]  # type: ignore[attr-defined]
    short = MIN_PROBE_S / FIRST_PROBE_SHARE - 1.0
    brief = loop_on(EAGLE, [queue], window_s=short)
    brief.tick(0.0)
    assert brief.actuator.asked == [short]  # type: ignore[attr-defined]
    off = loop_on(EAGLE, [queue])
    off.probe_first_window = False
    off.tick(0.0)
    assert off.actuator.asked == [60.0]  # type: ignore[attr-defined]
