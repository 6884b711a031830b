"""`decide`: one tick of the policy, composed of learn, propose and gate.

Contract: `decide(observation, state, settings, cost, now)` returns a `Decision` and the next
`TunerState`; pure, `now` is the only clock. It holds (regime "unknown") when `learn` says the
window lacks what it needs, stays when `propose` finds nothing better (saying so, or which
faster config it passed over and why) or `gate` says not now, and otherwise switches (or
turns speculation off), restarting the dwell and spending a restart; leaving a speculative
method for capacity, it records what that method served. A move for capacity only the forecast
load needs (`Proposal.on_forecast`) waits for a second window in a row that proposes one with
the batch still moving with its trend (`plan.trend_holds`). A move that re-tests a method which
drafted nothing (`Belief.retested`) is a trial where a canary can run it
(`TunerSettings.trial_share` below 1). A trial the gate holds gives way to what the tuner
decides without exploring (`_without_the_trial`), its reason saying the trial waits.
`judge_trial(main, canary, config, state, settings, cost, now)` says whether a trial's canary
earns its promotion once what it served is learned, or which config of its method the tuner
would move to instead (`TrialVerdict`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from specpilot.tuner._model.step_cost import StepCost
from specpilot.tuner._model.surrogate import Prediction
from specpilot.tuner.observation import Observation
from specpilot.tuner.policy.gate import gate, recent_restarts
from specpilot.tuner.policy.learn import Belief, learn, learn_trial
from specpilot.tuner.policy.plan import trend_holds
from specpilot.tuner.policy.proposal import Proposal
from specpilot.tuner.policy.propose import acceptance_note, propose
from specpilot.tuner.policy.settings import TunerSettings
from specpilot.tuner.spec_config import SpecConfig
from specpilot.tuner.state import TunerState

Action = Literal["stay", "switch", "off"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Decision:
    action: Action
    config: SpecConfig
    reason: str
    predicted_gain: float
    """Relative per-sequence speed (throughput at the batch) gain predicted for `config` over
    the running one (0 when staying): what the control loop checks after the switch."""
    regime: str
    predicted_tokens_per_s: float | None = None
    speed_checked: bool = True
    """Whether the first window after the switch should show `predicted_gain` in per-sequence
    speed (False for a move made for capacity: under a queue the batch grows whatever runs)."""
    trial: bool = False
    """A move made to learn (exploring): an actuator with replicas to spare measures it on a
    one-replica canary first, at that replica's share of the traffic's risk."""


def decide(
    observation: Observation,
    state: TunerState,
    settings: TunerSettings,
    cost: StepCost,
    now: float,
) -> tuple[Decision, TunerState]:
    belief = learn(observation, state, settings, cost, now)
    if isinstance(belief, str):
        return _stay(state.current, belief, regime="unknown"), state
    return _decide_on(belief, observation, settings, cost, now)


def _decide_on(
    belief: Belief,
    observation: Observation,
    settings: TunerSettings,
    cost: StepCost,
    now: float,
) -> tuple[Decision, TunerState]:
    """`decide` once the window is learned."""
    state, current, batch = belief.state, belief.state.current, belief.batch
    running, proposal, passed_over = propose(
        belief, settings, cost, observation.waiting_requests or 0.0
    )
    on_forecast = proposal is not None and proposal.on_forecast
    confirmed = state.forecast_shortfall and trend_holds(state.recent_batches)
    state = replace(state, forecast_shortfall=on_forecast)
    if proposal is not None and on_forecast and not confirmed:
        # A real vLLM run left n-gram K=5 at concurrency 32 on one window whose batch trend
        # (0.8 -> 4.2, a phase change) forecast 1335 tok/s against K=5's modeled 1068; the
        # closed-loop load never grew, and the static K=5 server made 1509 tok/s over the phase
        # (bench/results/real_vllm.md at 0d7095d). A load on its way shows in the next window,
        # still moving with the trend; a step to a new phase holds.
        return _stay(
            current,
            f"{current.describe()} keeps up with the load seen; it is left for the load ahead "
            f"only if the next window's batch still moves with the trend ({proposal.detail})",
            running.regime,
            running,
        ), state
    if proposal is None:
        at = f"at batch {batch:.1f} ({running.regime})"
        best = f"{current.describe()} is predicted best {at}"
        if passed_over is not None:
            # "predicted best" would hide that a faster config was ruled out (on capacity, or
            # read one sd slower for never having run)
            best = f"{current.describe()} stays {at}: {passed_over}"
        return _stay(current, best, running.regime, running), state
    held = gate(proposal, running, belief, settings, cost, now)
    if held is not None and proposal.trial and settings.exploration > 0.0:
        return _without_the_trial(belief, observation, held, settings, cost, now)
    if held is not None:
        return _stay(current, held, running.regime, running), state
    target, predicted = proposal.config, proposal.prediction
    compared = proposal.detail or (
        f"{predicted.tokens_per_s:.0f} vs {running.tokens_per_s:.0f} tok/s predicted"
    )
    reason = (
        f"{proposal.why}: {target.describe()} {proposal.gain:+.1%} over {current.describe()} at "
        f"batch {batch:.1f} ({running.regime}, {compared}"
        f"{acceptance_note(target, predicted.k, state, belief.acceptance)})"
    )
    silent_since = dict(belief.retested).get(target.method)
    # A re-test bets on traffic nothing in the windows shows (a method that drafted nothing
    # gives no signal while off): where a canary can run it, it is a trial at the canary's
    # share of the risk, promoted only if it drafts again, not a move of every replica. A move
    # for capacity is not delayed by a canary's window (and a canary under a queue measures
    # the backlog, not the config).
    retest_on_canary = (
        silent_since is not None and settings.trial_share < 1.0 and not proposal.for_capacity
    )
    if silent_since is not None:
        wait = belief.retest_waits.get(target.method)
        reason += (
            f"; re-testing {target.method}, which drafted nothing {now - silent_since:.0f}s "
            "ago, on what it accepted before"
            + (f" ({wait.describe()})" if wait is not None else "")
            + (" (on a canary)" if retest_on_canary and not proposal.trial else "")
        )
    speed_gain = proposal.gain if proposal.speed_gain is None else proposal.speed_gain
    restarts = (*recent_restarts(state, now), now)
    if proposal.for_capacity and current.speculative and target.method != current.method:
        shown = max(belief.throughput, state.served_peak)
        state = state.left_for_capacity(
            current.method, exit_ceiling(proposal, shown), proposal.baseline_capacity or 0.0
        )
    return Decision(
        action="switch" if target.speculative else "off",
        config=target,
        reason=reason,
        predicted_gain=speed_gain,
        regime=running.regime,
        predicted_tokens_per_s=predicted.tokens_per_s,
        speed_checked=not proposal.for_capacity,
        trial=proposal.trial or retest_on_canary,
    ), replace(
        state,
        current=target,
        since_s=now,
        restarts=restarts,
        forecast_shortfall=False,
        served_peak=0.0,
    )


def exit_ceiling(proposal: Proposal, shown: float) -> float:
    """What a method left for capacity is held to (`TunerState.capacity_exits`): the most it
    served in a window since it started (`shown`; under a queue, what it serves is its
    capacity), and where it kept up with today's demand, at least the capacity the tuner read
    for it when it left (what it served then was only the load). Held to its exit window's
    figure alone, EAGLE-3 never came back after a peak: Azure at peak 1.2, one replica, world
    3, left at 1309 s behind a backlog while serving 3650 tok/s, having served 4087 earlier in
    that run, it was held out to the trace's end although the load ahead with the margin fell
    to 3774; held to 4087 it came back at 2618 s (1.121 to 1.070 of the best fixed policy's
    mean E2E, `yardstick-azure-vllm-surge` at d2c1750 and 2cb92ae)."""
    if proposal.running_capacity is not None:
        return max(shown, proposal.running_capacity)
    return shown


def _without_the_trial(
    belief: Belief,
    observation: Observation,
    held: str,
    settings: TunerSettings,
    cost: StepCost,
    now: float,
) -> tuple[Decision, TunerState]:
    """A trial the gate holds does not hold back the move the tuner would make without
    exploring: a trial is proposed over a move only when it is worth more, and one that cannot
    run now is worth nothing now. A fresh deployment's first move may come before the minimum
    dwell and a trial's may not (`gate.early_first_move`): started on EAGLE-3 K=3 at 0.1 of
    capacity, world 1, a trial of K=5's schedule waited 120 s where the move to K=5 was made at
    once without trials."""
    decision, state = _decide_on(belief, observation, replace(settings, exploration=0.0), cost, now)
    note = f"; exploring, the trial it preferred waits: {held}"
    return replace(decision, reason=decision.reason + note), state


@dataclass(frozen=True, slots=True)
class TrialVerdict:
    """The tuner's verdict on a trial's canary."""

    rejection: str | None
    """None to promote the canary's config; else why not."""
    instead: Decision | None = None
    """With the canary rejected: the move to another config of the canary's method the tuner
    makes instead, on what the canary taught (the canary measured a K the tuner would not
    run: promoting it anyway put EAGLE-3 K=5 on every replica in a world where K=5 overloads
    and K=3 does not)."""


def judge_trial(
    main: Observation,
    canary: Observation,
    config: SpecConfig,
    state: TunerState,
    settings: TunerSettings,
    cost: StepCost,
    now: float,
) -> TrialVerdict:
    """Whether a trial's canary earns its promotion: with what the canary served folded into
    `state` (the state before the tick that proposed the trial; `learn_trial`), the tuner, no
    longer exploring, would move the main replicas to `config` on their window `main`. When it
    would move to another config of the same method instead, that move is the verdict's
    `instead`. A canary's own speed says little about capacity (it ran at a share of the
    traffic); the tuner's model, corrected by what the canary measured, reads it at the load
    ahead, its capacity one sd down (`TunerSettings.unproven`) as for a config that never
    ran on the main replicas."""
    learned, _ = learn_trial(canary, config, state, settings, cost, now)
    judging = replace(settings, exploration=0.0, unproven=(*settings.unproven, config))
    decision, _ = decide(main, learned, judging, cost, now)
    if decision.config == config:
        return TrialVerdict(None)
    if decision.action == "stay":
        return TrialVerdict(f"with what the canary taught, the tuner stays: {decision.reason}")
    prefers = (
        f"with what the canary taught, the tuner prefers {decision.config.describe()}: "
        f"{decision.reason}"
    )
    same_method = decision.config.method == config.method
    return TrialVerdict(prefers, instead=decision if same_method else None)


def _stay(
    current: SpecConfig, reason: str, regime: str, running: Prediction | None = None
) -> Decision:
    return Decision(
        action="stay",
        config=current,
        reason=reason,
        predicted_gain=0.0,
        regime=regime,
        predicted_tokens_per_s=None if running is None else running.tokens_per_s,
    )
