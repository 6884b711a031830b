"""Gate: whether a proposal is worth acting on now.

Contract: `gate(proposal, running, belief, settings, cost, now)` returns the reason to stay, or
None to act. A move waits out the minimum dwell (from the tuner's last switch, or from the
start: one window of a fresh deployment does not tell the load ahead, unless the target holds
`FIRST_MOVE_HEADROOM` times it, one sd down or, over a steady window, at the mean; or the move
is for capacity to no speculation) and the restart
budget (restarts in the last hour; a move into speculation leaves the last one for a move for
capacity, `keeps_the_reserve`), and must clear the hurdle (hysteresis, or the smaller saturation
tolerance at max-num-seqs) and pay, over the expected dwell, for the restart: its lost serving
(`restarts_expected`: a trial on all of the traffic may be undone, one on a canary costs the main
replicas a restart only when promoted) plus the SLO backlog
it leaves.
Pure: `now` is the only clock.
"""

from __future__ import annotations

from specpilot.tuner._model.step_cost import StepCost
from specpilot.tuner._model.surrogate import Prediction
from specpilot.tuner.policy.costs import backlog_cost, saturating, switch_cost
from specpilot.tuner.policy.learn import Belief
from specpilot.tuner.policy.proposal import Proposal
from specpilot.tuner.policy.settings import TunerSettings
from specpilot.tuner.state import TunerState

FIRST_MOVE_HEADROOM = 2.0
"""A fresh deployment (no switch yet) may move before its minimum dwell when the target's
capacity, one sd down, is at least this many times the demand ahead: one window cannot tell
where the load is going, but at half the capacity a rise would have to double to hurt."""
STEADY_RISE = 1.3
"""A window whose later part served at most this many times its earlier part's output tokens/s
held a steady load (`Observation.load_rise`; only a window joined from the first-window probe
has one). The first window of a Poisson sweep read 1.09-1.12 (0.3 and 0.5 of capacity: the
engine filling in the probe's first seconds); Azure's at peak 1.2 read 7.3 (417 then 3028
tok/s: the trace ramps in its first minute), where an early move into EAGLE-3 met the load
(worlds 3 and 9 of the 1-replica surge run: 1.210 and 1.281x the best fixed policy, against
1.162 and 0.969, with the headroom read at the mean whatever the window held)."""
RESTART_BUDGET_WINDOW_S = 3600.0
"""The restart budget counts restarts over this last span (per hour)."""


def recent_restarts(state: TunerState, now: float) -> list[float]:
    """The restarts that count against the budget now."""
    return [t for t in state.restarts if now - t < RESTART_BUDGET_WINDOW_S]


def early_first_move(proposal: Proposal, state: TunerState, load_rise: float | None = None) -> bool:
    """Whether a fresh deployment may make its first move before the minimum dwell: a move
    predicted better on the mean (not a trial) to a config with `FIRST_MOVE_HEADROOM`, or a
    move for capacity to no speculation. The headroom is read one sd down, or at the mean when
    the window held a steady load (`load_rise`, `STEADY_RISE`): the sd is the doubt in a
    config never run, and the rule's doubt is where the load goes; a steady window answers the
    second, so the doubling already asked for covers the first.

    A move for capacity into speculation waits: in a world slower than its prior, a config
    never run at a large batch may hold less than the prior says, and only a dwell's windows
    tell. No speculation is the roofline's own baseline, with no drafter to overrate, and a
    deployment started on speculation short of its load builds a queue for the whole dwell
    (Poisson at 0.9, started on EAGLE-3 K=3: 38318 ms mean E2E in the median world against
    11726 for no speculation, `bench/results/yardstick-poisson-vllm-start-eagle3.json` at
    6dc8f8d)."""
    if state.restarts or proposal.trial:
        return False
    if proposal.for_capacity and not proposal.config.speculative:
        return True
    steady = load_rise is not None and load_rise <= STEADY_RISE
    room = proposal.mean_headroom if steady else proposal.headroom
    return room is not None and room >= FIRST_MOVE_HEADROOM


def keeps_the_reserve(proposal: Proposal) -> bool:
    """Whether a move must leave the budget's last restart unspent: a trial, or a move into
    speculation that is not for capacity. The way back from speculation, should the load rise
    past its capacity, is a move for capacity; with the budget spent on the way in, the tuner
    would watch the queue grow (Azure at peak 1.2, 4 replicas one at a time, world 3: three
    canaries, each a pod start the budget counts, and a move to EAGLE-3 spent it; the backlog
    then held for 17 minutes at 30-100 s mean E2E, 6.6x no speculation's over the trace). A
    trial is only ever worth what it might teach: a canary of no speculation that spent the
    last restart left EAGLE-3 with none for the surge that followed (Azure, 4 replicas with a
    surge rollout, world 9: 1.26x no speculation's mean E2E)."""
    return proposal.trial or (proposal.config.speculative and not proposal.for_capacity)


def restarts_expected(proposal: Proposal, settings: TunerSettings) -> float:
    """Restarts of the main replicas a move is expected to cost: one for a move; for a trial
    on all of the traffic one, plus the one undoing it when it disappoints; for a trial on a
    canary (`settings.trial_share` below 1) only the promotion, when it does not."""
    if not proposal.trial:
        return 1.0
    if settings.trial_share < 1.0:
        return 1.0 - proposal.trial_failure
    return 1.0 + proposal.trial_failure


def gate(
    proposal: Proposal,
    running: Prediction,
    belief: Belief,
    settings: TunerSettings,
    cost: StepCost,
    now: float,
) -> str | None:
    target, gain = proposal.config.describe(), proposal.gain
    dwell = now - belief.state.since_s
    if dwell < settings.min_dwell_s and not early_first_move(
        proposal, belief.state, belief.load_rise
    ):
        return (
            f"{target} predicted {gain:+.1%} but dwell {dwell:.0f}s < "
            f"minimum {settings.min_dwell_s:.0f}s"
        )
    budget, spent = settings.restart_budget_per_hour, len(recent_restarts(belief.state, now))
    if spent >= budget:
        return f"{target} predicted {gain:+.1%} but the restart budget ({budget}/h) is spent"
    if spent == budget - 1 and budget > 1 and keeps_the_reserve(proposal):
        return (
            f"{target} predicted {gain:+.1%} but the last restart of the budget ({budget}/h) "
            "is kept for a move for capacity"
        )
    restart = switch_cost(
        running.tokens_per_s, belief.batch, belief.context, cost, settings
    ) * restarts_expected(proposal, settings)
    restart += backlog_cost(
        proposal.config,
        belief.throughput,
        running.tpot_s,
        belief.surrogate,
        belief.context,
        settings,
    )
    payoff = proposal.improvement * settings.expected_dwell_s
    # At max-num-seqs a shortfall is a queue that grows for as long as it lasts, not a
    # slowdown: the smaller saturation tolerance applies there.
    hurdle = (
        settings.saturation_tolerance if saturating(belief.batch, settings) else settings.hysteresis
    )
    if gain < hurdle or payoff <= restart:
        return (
            f"{target} predicted {gain:+.1%}: below hysteresis "
            f"{hurdle:.0%} or not worth a restart "
            f"({payoff:.0f} tokens gained vs {restart:.0f} lost)"
        )
    return None
