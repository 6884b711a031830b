"""The control loop: observe -> decide -> act, the same for a laptop and for a cluster.

Contract: `ControlLoop.tick(now)` observes one window through the actuator, asks the tuner
for a decision, applies a switch through the actuator and records what happened; a switch the
engine cannot start is rolled back to the previous config and that config is not tried again
for `failed_backoff_s`. The loop owns no clock: `now` comes from the caller.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Protocol

from specpilot.tuner.observation import Observation
from specpilot.tuner.policy import Decision, TunerSettings, decide
from specpilot.tuner.spec_config import SpecConfig
from specpilot.tuner.state import TunerState
from specpilot.tuner.step_cost import StepCost


class Actuator(Protocol):
    def apply(self, config: SpecConfig) -> None:
        """Run `config`; raise if the engine cannot start it."""

    def observe(self, window_s: float) -> Observation: ...


@dataclass(frozen=True, slots=True)
class TickRecord:
    now: float
    observation: Observation
    decision: Decision
    applied: bool
    error: str | None = None


@dataclass(kw_only=True)
class ControlLoop:
    actuator: Actuator
    settings: TunerSettings
    cost: StepCost
    state: TunerState
    window_s: float = 10.0
    failed_backoff_s: float = 3600.0
    on_tick: Callable[[TickRecord], None] | None = None
    history: list[TickRecord] = field(default_factory=list)
    _failed: dict[SpecConfig, float] = field(default_factory=dict)

    def start(self) -> None:
        self.actuator.apply(self.state.current)

    def tick(self, now: float) -> TickRecord:
        observation = self.actuator.observe(self.window_s)
        settings = self._without_failed(now)
        previous = self.state
        decision, state = decide(observation, self.state, settings, self.cost, now)
        record = TickRecord(now, observation, decision, applied=False)
        if decision.config != previous.current:
            try:
                self.actuator.apply(decision.config)
                self.state = state
                record = replace(record, applied=True)
            except Exception as exc:  # the engine refused: roll back, remember, back off
                self._failed[decision.config] = now
                self.actuator.apply(previous.current)
                self.state = replace(state, current=previous.current)
                record = replace(record, error=f"{type(exc).__name__}: {exc}"[:500])
        else:
            self.state = state
        self.history.append(record)
        if self.on_tick is not None:
            self.on_tick(record)
        return record

    def _without_failed(self, now: float) -> TunerSettings:
        blocked = {c for c, t in self._failed.items() if now - t < self.failed_backoff_s}
        if not blocked:
            return self.settings
        allowed = tuple(c for c in self.settings.candidates if c not in blocked)
        return replace(self.settings, candidates=allowed or self.settings.candidates)
