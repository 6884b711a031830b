"""The control loop: observe -> decide -> act, the same for a laptop and for a cluster.

Contract: `ControlLoop.tick(now)` observes one window through the actuator, asks the tuner
for a decision, applies a switch through the actuator and records what happened; a switch the
engine cannot start is rolled back to the previous config and that config is not tried again
for `failed_backoff_s`. The tuner explores only where a trial costs a share of the traffic:
through `TrialActuator.apply_trial` while the actuator has a canary to run it on
(`canary_share`, which the tuner's `trial_share` prices the trial at); elsewhere its
exploration weight is 0 (a trial on all of the traffic paid for itself in none of the bench's
90 world runs: `git show d04e071:bench/results/ablations.md`; on a canary, in none of 50:
`git show 480abcd:bench/results/ablations.md`, so the operator asks for trials only with
`tuning.explore`). What a trial's canary served
(`trial_observation`) is folded into the state whether or not it was promoted
(`tuner.learn_trial`), and the decision's reason says what it taught; a canary is promoted
only if, that learned, the tuner would move to its config (`tuner.judge_trial`); when it would
move to another config of the canary's method instead, the loop makes that move in the same
tick (the trial's restart is its restart), its reason saying what the canary taught. Only an
`Exception` from `apply` counts as a refusal: a BaseException (the operator stopping mid-rollout)
passes through untouched, the switch left in flight and nothing rolled back or backed off. The loop
owns no clock: `now` comes from the caller.

With `probe_first_window` set, a fresh deployment's first window (the tuner has read none) is
looked at after `FIRST_PROBE_SHARE` of it (when that is at least `MIN_PROBE_S`): with requests
waiting there and the tuner leaving the running config for capacity on what it saw, the move is
made then; otherwise the rest of the window is observed and the two read as one
(`tuner.joined`).

With `goodput_tolerance` set, a switch is also checked on the first window after it: when the
measured per-sequence speed (tokens/s over running requests) falls short of the prediction (the
pre-switch speed x (1 + predicted gain)) by more than that fraction, the loop rolls back the
same way and backs the config off. Per-sequence speed, not tokens/s: with open-loop traffic
below saturation tokens/s is the offered load whatever the config. When the batch moved by more
than `comparable_batch_ratio` the two windows do not compare and the check is skipped.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Protocol, runtime_checkable

from specpilot.tuner import (
    Decision,
    Observation,
    SpecConfig,
    StepCost,
    TunerSettings,
    TunerState,
    decide,
    joined,
    judge_trial,
    learn_trial,
)

FIRST_PROBE_SHARE = 1.0 / 3.0
"""Share of its first window after which a fresh deployment is looked at early."""
MIN_PROBE_S = 20.0
"""A probe shorter than this is not made: a Prometheus rate over fewer than two 15 s scrapes
(the common interval) reads nothing, and the engine is barely past its first requests."""
QUEUE_AT_PROBE = 0.5
"""Waiting requests at the probe above which the deployment's config may already be short of
its load: the tuner is asked then whether to leave it for capacity."""


class Actuator(Protocol):
    def apply(self, config: SpecConfig) -> None:
        """Run `config`; raise if the engine cannot start it."""

    def observe(self, window_s: float) -> Observation: ...


TrialJudge = Callable[[Observation], str | None]
"""What a trial's canary served -> why not to promote it (None: promote)."""


@runtime_checkable
class TrialActuator(Protocol):
    """An actuator that can measure a trial at less risk than a switch (the Kubernetes one and
    the bench's emulated Deployment: a one-replica canary, in one main replica's place or
    beside them); the loop applies the tuner's trials through it."""

    def apply_trial(self, config: SpecConfig, judge: TrialJudge | None = None) -> None:
        """Run `config` as a trial; raise, leaving the running config, if it disappoints: if
        its canary is slower than the main replicas, or `judge` (given what the canary served)
        says why not to promote it."""

    def canary_share(self) -> float | None:
        """The share of the traffic a trial would run on now (a one-replica canary in one of N
        main replicas' place: 1/N; beside them: 1/(N+1)); None where there is no canary."""

    def trial_observation(self) -> Observation | None:
        """What the last trial's canary served over its comparison window (None: no canary
        ran, or it measured nothing)."""


@dataclass(frozen=True, slots=True)
class TickRecord:
    now: float
    observation: Observation
    decision: Decision
    applied: bool
    error: str | None = None
    rolled_back: bool = False
    """The goodput check undid the previous switch in this tick (`decision` says back to what)."""

    @property
    def explanation(self) -> str:
        """The decision's reason and, for a move the actuator refused, why (each at most 500
        characters then, as `error` is: both fit a status field of 1024)."""
        if self.error is None or self.rolled_back:
            return self.error or self.decision.reason
        return f"{self.decision.reason[:500]}; not applied: {self.error}"


@dataclass(frozen=True, slots=True)
class _PendingCheck:
    """A switch whose first window has not been measured yet."""

    config: SpecConfig
    previous: SpecConfig
    tokens_per_s_before: float
    batch_before: float
    predicted_gain: float


@dataclass(kw_only=True)
class ControlLoop:
    actuator: Actuator
    settings: TunerSettings
    cost: StepCost
    state: TunerState
    window_s: float = 10.0
    failed_backoff_s: float = 3600.0
    on_tick: Callable[[TickRecord], None] | None = None
    goodput_tolerance: float | None = None
    """Roll a switch back when its first window's per-sequence speed is more than this fraction
    below the predicted one; None disables the check."""
    comparable_batch_ratio: float = 1.5
    """The goodput check only judges when the batch moved by at most this factor."""
    probe_first_window: bool = False
    """Look at a fresh deployment's first window early (`FIRST_PROBE_SHARE` of it, at least
    `MIN_PROBE_S`) and leave the running config then for capacity if requests already wait
    (`_early`)."""
    history: list[TickRecord] = field(default_factory=list)
    rolling_back: bool = False
    """True while the loop applies a rollback (an actuator wrapper may label it so)."""
    _failed: dict[SpecConfig, float] = field(default_factory=dict)
    _pending: _PendingCheck | None = None
    _instead: Decision | None = None
    """The move the last trial's judge would make instead of promoting its canary."""

    def start(self) -> None:
        self.actuator.apply(self.state.current)

    def tick(self, now: float) -> TickRecord:
        probe = self._probe() if self._probing() else None
        record = None if probe is None else self._early(probe, now)
        if record is None:
            if probe is None:
                observation = self.actuator.observe(self.window_s)
            else:  # the rest of the window, joined to the probe: the window the tuner always read
                observation = joined(probe, self.actuator.observe(self.window_s - probe.window_s))
            record = self._check_goodput(observation, now)
            if record is None:
                record = self._decide_and_act(observation, now)
        self.history.append(record)
        if self.on_tick is not None:
            self.on_tick(record)
        return record

    def _probing(self) -> bool:
        """Whether this tick looks at a fresh deployment's first window early: a config that
        starts short of its load (started on EAGLE-3 in an overloaded world) builds a queue
        from its first seconds, and all it builds before the switch is done waits behind it
        (bench/results/yardstick-poisson-vllm-start-eagle3.md)."""
        return (
            self.probe_first_window
            and self.state.last_window_s is None
            and self.window_s * FIRST_PROBE_SHARE >= MIN_PROBE_S
        )

    def _probe(self) -> Observation:
        return self.actuator.observe(self.window_s * FIRST_PROBE_SHARE)

    def _early(self, probe: Observation, now: float) -> TickRecord | None:
        """Under a queue at the probe, the tick's record if the tuner leaves the running config
        for capacity on it. Any other decision waits for the whole window: a probe this early
        also sees an engine still filling (or requests waiting for it to start): a variant
        that acted on any decision there moved a deployment to EAGLE-3 on a batch of 3
        (Azure at peak 1.2, 4 replicas one at a time, world 1: 3.65x no speculation's mean
        E2E, against 1.000; SpecPilot only, from an uncommitted worktree on 165628f)."""
        if (probe.waiting_requests or 0.0) <= QUEUE_AT_PROBE:
            return None
        settings = self._tick_settings(now)
        decided = decide(probe, self.state, settings, self.cost, now)
        decision = decided[0]
        if decision.config == self.state.current or decision.speed_checked:
            return None  # nothing it learned is kept: the whole window is read
        return self._decide_and_act(probe, now, (settings, decided))

    def _tick_settings(self, now: float) -> TunerSettings:
        """The tuner's settings for this tick: configs backed off left out, trials priced at
        the canary's share (none without a canary), canary-only configs named unproven."""
        settings = self._without_failed(now)
        share = self._canary_share()
        settings = (
            replace(settings, exploration=0.0)
            if share is None
            else replace(settings, trial_share=share)
        )
        if self.state.canary_only:
            settings = replace(settings, unproven=tuple(sorted(self.state.canary_only, key=str)))
        return settings

    def _decide_and_act(
        self,
        observation: Observation,
        now: float,
        decided: tuple[TunerSettings, tuple[Decision, TunerState]] | None = None,
    ) -> TickRecord:
        """Decide on `observation` and act; `decided`: the tick's settings and the decision
        already made on it (the probe's)."""
        if decided is None:
            settings = self._tick_settings(now)
            decided = settings, decide(observation, self.state, settings, self.cost, now)
        settings, (decision, state) = decided
        previous = self.state
        record = TickRecord(now, observation, decision, applied=False)
        if decision.config != previous.current:
            self._instead = None
            served: Observation | None = None
            try:
                if decision.trial and isinstance(self.actuator, TrialActuator):
                    judge = self._trial_judge(observation, previous, settings, decision.config, now)
                    try:
                        self.actuator.apply_trial(decision.config, judge)
                    finally:
                        # read before a rollback: that is an apply, and an actuator forgets
                        # its last canary at each apply
                        served = self.actuator.trial_observation()
                else:
                    self.actuator.apply(decision.config)
                self.state = state
                record = replace(record, applied=True)
                self._pending = self._pending_check(observation, decision, previous.current)
            except Exception as exc:  # the engine refused: roll back, remember, back off
                self._failed[decision.config] = now
                self._roll_back_to(previous.current)
                self.state = replace(state, current=previous.current)
                record = replace(record, error=f"{type(exc).__name__}: {exc}"[:500])
            if served is not None:
                record, learned = self._learn_from_trial(record, served, settings, now)
                if record.error is not None:
                    self.state = self.state.measured_on_canary(decision.config)
                    if self._instead is not None:
                        record = self._move_instead(record, self._instead, learned, now)
            if record.applied:
                self.state = self.state.ran_on_main(record.decision.config)
        else:
            self.state = state
        return record

    def _trial_judge(
        self,
        observation: Observation,
        before: TunerState,
        settings: TunerSettings,
        config: SpecConfig,
        now: float,
    ) -> TrialJudge:
        """The tuner's verdict on a canary: would it, having learned what the canary served,
        move the main replicas to `config` on this tick's window (`tuner.judge_trial`)."""

        def judge(served: Observation) -> str | None:
            verdict = judge_trial(observation, served, config, before, settings, self.cost, now)
            self._instead = verdict.instead
            return verdict.rejection

        return judge

    def _learn_from_trial(
        self, record: TickRecord, served: Observation, settings: TunerSettings, now: float
    ) -> tuple[TickRecord, str]:
        """Fold what the trial's canary served into the state (promoted or not, it measured
        the config) and say so in the decision's reason; also returns what it taught."""
        config = record.decision.config
        self.state, learned = learn_trial(served, config, self.state, settings, self.cost, now)
        decision = replace(record.decision, reason=f"{record.decision.reason}; {learned}")
        return replace(record, decision=decision), learned

    def _move_instead(
        self, record: TickRecord, instead: Decision, learned: str, now: float
    ) -> TickRecord:
        """The judge turned a trial's canary down for another config of its method: move the
        main replicas there now. The trial's restart (already in the state) is this move's."""
        tried = record.decision.config
        try:
            self.actuator.apply(instead.config)
        except Exception as exc:  # the engine refused: as any switch, roll back and back off
            self._failed[instead.config] = now
            self._roll_back_to(self.state.current)
            why = f"{type(exc).__name__}: {exc}"[:250]
            return replace(record, error=f"{(record.error or '')[:250]}; then instead: {why}")
        previous = self.state.current
        self.state = replace(self.state, current=instead.config, since_s=now)
        self._pending = self._pending_check(record.observation, instead, previous)
        reason = f"{instead.reason[:600]}; the canary of {tried.describe()} taught: {learned}"
        reason = reason[:1000]
        return replace(record, decision=replace(instead, reason=reason), applied=True, error=None)

    def _pending_check(
        self, before: Observation, decision: Decision, previous: SpecConfig
    ) -> _PendingCheck | None:
        tokens_per_s, batch = before.tokens_per_engine_s, before.running_requests
        if self.goodput_tolerance is None or not tokens_per_s or not batch:
            return None
        if not decision.speed_checked:
            return None  # a move for capacity: under a queue the batch grows whatever runs
        gain = decision.predicted_gain
        return _PendingCheck(decision.config, previous, tokens_per_s, batch, gain)

    def _check_goodput(self, observation: Observation, now: float) -> TickRecord | None:
        """The rollback record when the last switch fell short of its prediction, else None."""
        pending, self._pending = self._pending, None
        if pending is None or self.goodput_tolerance is None:
            return None
        if pending.config != self.state.current:
            return None
        tokens_per_s, batch = observation.tokens_per_engine_s, observation.running_requests
        if tokens_per_s is None or not batch:
            return None
        moved = max(batch, pending.batch_before) / min(batch, pending.batch_before)
        if moved > self.comparable_batch_ratio:
            return None  # the load moved: the windows before and after do not compare
        before = pending.tokens_per_s_before / pending.batch_before
        predicted = before * (1.0 + pending.predicted_gain)
        measured = tokens_per_s / batch
        if measured >= predicted * (1.0 - self.goodput_tolerance):
            return None
        reason = (
            f"rolled back {pending.config.describe()}: measured {measured:.1f} tok/s per "
            f"sequence, predicted {predicted:.1f} (gain {pending.predicted_gain:+.1%} over "
            f"{before:.1f}), short by more than {self.goodput_tolerance:.0%}"
        )
        self._failed[pending.config] = now
        self._roll_back_to(pending.previous)
        # a rollback restarts the engine as a switch does: it spends the tuner's restart budget
        restarts = (*self.state.restarts, now)
        self.state = replace(self.state, current=pending.previous, since_s=now, restarts=restarts)
        decision = Decision(
            action="switch" if pending.previous.speculative else "off",
            config=pending.previous,
            reason=reason,
            predicted_gain=0.0,
            regime="unknown",
        )
        return TickRecord(now, observation, decision, applied=True, error=reason, rolled_back=True)

    def _roll_back_to(self, config: SpecConfig) -> None:
        self.rolling_back = True
        try:
            self.actuator.apply(config)
        finally:
            self.rolling_back = False

    def _canary_share(self) -> float | None:
        return self.actuator.canary_share() if isinstance(self.actuator, TrialActuator) else None

    def _without_failed(self, now: float) -> TunerSettings:
        blocked = {c for c, t in self._failed.items() if now - t < self.failed_backoff_s}
        if not blocked:
            return self.settings
        allowed = tuple(c for c in self.settings.candidates if c not in blocked)
        return replace(
            self.settings,
            candidates=allowed or self.settings.candidates,
            excluded=tuple(sorted(blocked, key=str)),
        )
