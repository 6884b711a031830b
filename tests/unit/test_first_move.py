"""A fresh deployment's first move: before the minimum dwell only when it is safe (the target
holds twice the demand ahead, one sd down, or at the mean over a window whose load held steady)
or a move for capacity to no speculation; never for capacity into speculation (a slow world's
prior overrates what a config never run at a large batch holds); after the first switch the
dwell holds whatever the load."""

from __future__ import annotations

from dataclasses import replace

from test_latency_objective import COST, EAGLE, NO_SPEC, PRIORS, settings, window

from specpilot.tuner import Decision, SpecConfig, TunerState, decide
from specpilot.tuner.policy.gate import FIRST_MOVE_HEADROOM, STEADY_RISE, early_first_move
from specpilot.tuner.policy.proposal import Proposal

DWELL_WINDOWS = 5
"""The minimum dwell spans this many windows: the first window is well inside it."""


def first_decision(
    config: SpecConfig, batch: float, waiting: float = 0.0, restarted: bool = False
) -> Decision:
    # a fast restart: under overload a slow one adds its downtime to the queue
    chosen = settings("latency", windows=DWELL_WINDOWS, restart_s=5.0)
    state = TunerState.initial(config, 0.0, PRIORS)
    if restarted:
        state = replace(state, restarts=(0.0,))
    decision, _ = decide(window(config, batch, waiting), state, chosen, COST, 60.0)
    return decision


def test_a_fresh_deployment_at_low_load_moves_after_its_first_window() -> None:
    decision = first_decision(NO_SPEC, 2.0)
    assert decision.action == "switch" and decision.config == EAGLE, decision.reason


def test_after_a_switch_the_dwell_holds_even_at_low_load() -> None:
    decision = first_decision(NO_SPEC, 2.0, restarted=True)
    assert decision.action == "stay" and "dwell" in decision.reason, decision.reason


def test_a_fresh_deployment_on_speculation_short_of_its_load_leaves_it_at_once() -> None:
    # no speculation is the roofline's baseline: no drafter for the prior to overrate
    batch = float(settings().max_batch)
    moved = first_decision(EAGLE, batch, waiting=400.0)
    assert moved.action == "off" and moved.config == NO_SPEC, moved.reason


def test_after_a_switch_a_move_for_capacity_waits_out_the_dwell() -> None:
    batch = float(settings().max_batch)
    held = first_decision(EAGLE, batch, waiting=400.0, restarted=True)
    assert held.action == "stay" and "dwell" in held.reason, held.reason


def proposal(
    *,
    headroom: float | None,
    mean_headroom: float | None = None,
    trial: bool = False,
    for_capacity: bool = False,
    config: SpecConfig = EAGLE,
) -> Proposal:
    return Proposal(
        config=config,
        prediction=None,  # type: ignore[arg-type]  # the rule reads none of it
        improvement=1.0,
        gain=0.5,
        why="test",
        headroom=headroom,
        mean_headroom=mean_headroom,
        trial=trial,
        for_capacity=for_capacity,
    )


def test_the_early_move_needs_headroom_or_is_for_capacity_to_the_baseline_never_a_trial() -> None:
    fresh = TunerState.initial(NO_SPEC, 0.0, PRIORS)
    assert early_first_move(proposal(headroom=FIRST_MOVE_HEADROOM), fresh)
    assert not early_first_move(proposal(headroom=FIRST_MOVE_HEADROOM * 0.99), fresh)
    assert not early_first_move(proposal(headroom=None), fresh)  # objective without capacity
    assert not early_first_move(proposal(headroom=10.0, trial=True), fresh)
    assert not early_first_move(proposal(headroom=1.0, for_capacity=True), fresh)
    to_baseline = proposal(headroom=1.0, for_capacity=True, config=NO_SPEC)
    assert early_first_move(to_baseline, fresh)
    assert not early_first_move(replace(to_baseline, trial=True), fresh)
    moved = replace(fresh, restarts=(0.0,))
    assert not early_first_move(proposal(headroom=10.0), moved)
    assert not early_first_move(to_baseline, moved)


def test_over_a_steady_window_the_headroom_is_read_at_the_mean() -> None:
    """A config never run has its capacity doubted (one sd down); over a window whose load held
    steady the doubling asked of it is margin enough: a window whose load rose does not say
    where it stops."""
    fresh = TunerState.initial(NO_SPEC, 0.0, PRIORS)
    doubted = proposal(headroom=FIRST_MOVE_HEADROOM * 0.8, mean_headroom=FIRST_MOVE_HEADROOM)
    assert early_first_move(doubted, fresh, load_rise=1.1)
    assert early_first_move(doubted, fresh, load_rise=STEADY_RISE)
    assert not early_first_move(doubted, fresh, load_rise=STEADY_RISE * 1.01)
    assert early_first_move(doubted, fresh, load_rise=0.5)  # a falling load needs no more room
    assert not early_first_move(doubted, fresh)  # one window: how the load moved is unknown
    short = replace(doubted, mean_headroom=FIRST_MOVE_HEADROOM * 0.99)
    assert not early_first_move(short, fresh, load_rise=1.0)
    moved = replace(fresh, restarts=(0.0,))
    assert not early_first_move(doubted, moved, load_rise=1.0)
    assert not early_first_move(replace(doubted, trial=True), fresh, load_rise=1.0)


def test_a_trial_that_must_wait_out_the_dwell_does_not_hold_back_the_first_move() -> None:
    # exploring beside a canary, a fresh deployment on EAGLE-3 K=3 at batch 2 prefers a trial
    # of K=5; a trial never moves before the dwell, the plain move to K=5 may (it holds twice
    # the demand): the move is made, and its reason says the trial waits
    eagle3_k3 = replace(EAGLE, num_speculative_tokens=3)
    plain = replace(
        settings("latency", windows=DWELL_WINDOWS, restart_s=5.0),
        candidates=(NO_SPEC, eagle3_k3, EAGLE),
    )
    exploring = replace(plain, exploration=1.0, trial_share=0.5)
    state = TunerState.initial(eagle3_k3, 0.0, PRIORS)
    observed = window(eagle3_k3, 2.0)
    moved, after = decide(observed, state, exploring, COST, 60.0)
    assert moved.action == "switch" and moved.config == EAGLE and not moved.trial, moved.reason
    assert "the trial it preferred waits: eagle3 K=5" in moved.reason
    assert "dwell 60s < minimum" in moved.reason
    # exactly the move the tuner makes without exploring
    without, after_without = decide(observed, state, plain, COST, 60.0)
    assert moved.reason.startswith(without.reason)
    assert replace(moved, reason=without.reason) == without and after == after_without
