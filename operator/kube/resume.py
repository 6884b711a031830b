"""Seeing a rollout through that an earlier operator left in flight.

Contract: a tick that finds `rollout` in status.tunerState (persisted_state.InFlight) knows
that the operator which patched the template was killed, stopped or failed over before the
rollout ended, since a tick that sees its rollout through writes status without it. It then
follows that rollout instead of deciding anything (`resume`): `actuator.apply(config)` patches
the template if it still differs (a kill between the announcement and the patch) and follows
the rollout to its end. One that completes is the switch that was decided, whose restart and
dwell were counted when it was announced. One that fails is rolled back as the loop would
have done: the rollback is announced first (so a second kill resumes the rollback), the
previous config applied and followed, the failed one backed off. A rollback that was in flight
is followed again; if it fails too, the error goes up and the next tick tries again. A trial
(its config on a canary with the main pods) is abandoned, not judged or promoted: the main
pods keep the previous config (put back if its promotion had begun), the canary is deleted
and the slot it held given back to the main pods, nothing is backed off. No window
is observed meanwhile, so the old pods' metrics are never credited to the new config.
Stops (a BaseException) pass through untouched, as in the loop.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from specpilot.operator.kube.persisted_state import InFlight
from specpilot.operator.loop import Actuator
from specpilot.tuner import SpecConfig, TunerState

Announce = Callable[[InFlight, TunerState, Mapping[SpecConfig, float]], None]
"""Persist (rollout in flight, intended state, failed configs) before a rollback starts."""


@dataclass(frozen=True, slots=True)
class Resumed:
    action: str
    """"switch" (the rollout completed), "rollback" (a rollback completed) or "error" (the
    rollout failed and was rolled back)."""
    reason: str
    event_type: str
    state: TunerState
    failed: dict[SpecConfig, float]


def resume(
    actuator: Actuator,
    inflight: InFlight,
    state: TunerState,
    failed: Mapping[SpecConfig, float],
    now: float,
    announce: Announce,
) -> Resumed:
    target, before = inflight.config.describe(), inflight.previous.describe()
    what = "rollback to" if inflight.rolling_back else "rollout of"
    if inflight.trial:  # never judged: the main pods keep (or go back to) what they ran
        actuator.apply(inflight.previous)  # which deletes the canary too
        reason = (
            f"abandoned the trial of {target} that an earlier operator left in flight: "
            f"the main pods run {before}"
        )
        back = replace(state, current=inflight.previous)
        return Resumed("rollback", reason, "Normal", back, dict(failed))
    try:
        actuator.apply(inflight.config)
    except Exception as exc:
        if inflight.rolling_back:
            raise  # nothing to go back to but this: the next tick follows it again
        backed_off = {**failed, inflight.config: now}
        back = replace(state, current=inflight.previous, since_s=now)
        announce(InFlight(inflight.previous, inflight.config, True, now), back, backed_off)
        actuator.apply(inflight.previous)
        reason = (
            f"resumed the rollout of {target} that an earlier operator left in flight: it "
            f"failed and was rolled back to {before}: {type(exc).__name__}: {exc}"
        )
        return Resumed("error", reason[:1024], "Warning", back, backed_off)
    reason = f"resumed the {what} {target} that an earlier operator left in flight: done"
    action, event_type = ("rollback", "Warning") if inflight.rolling_back else ("switch", "Normal")
    return Resumed(
        action, reason, event_type, replace(state, current=inflight.config), dict(failed)
    )
