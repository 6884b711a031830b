"""Tuner state persisted in the SpecDeployment's own status (`status.tunerState`, compact JSON).

Contract: `load_state(status, spec, now)` restores what the tuner learned, so an operator
restart (kopf resume) or a fail-over to the standby replica continues where the last one
stopped; without a stored state, or with one that no longer parses, it starts from the spec's
initial config and the tuner's published per-method acceptance priors. A stored running config the
spec no longer allows (candidates edited) is replaced by the spec's initial config, keeping the
learned estimates; so is any other than the initial config in modes off and recommend, which
run what the spec says (an edit of `initial` takes effect there). `failed` (configs that
failed to roll out, with when) rides in the same JSON object under its own key, which
`TunerState.from_json` ignores; so does `rollout`, the switch in flight (`InFlight`: the config
rolling out, the one it replaces, whether it is a rollback or a trial, since when), written
before the template is patched and gone once the tick that made it ends, so a tick that finds it
knows the operator that started it never saw it through (operator/kube/resume.py); `load_rollout`
reads it. `dump_state` is the inverse.
Status is the right home: it is per object, written with the rest of the status, and goes away
with the object.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from specpilot.operator.api.spec import SpecDeploymentSpec
from specpilot.tuner import AcceptanceCurve, ConfigError, SpecConfig, TunerState, prior_curves

logger = logging.getLogger(__name__)
PRIOR_TASK = "chat"
"""Acceptance priors per method until the method has run (the tuner's published priors)."""


@dataclass(frozen=True, slots=True)
class InFlight:
    """A rollout started and not yet seen through."""

    config: SpecConfig
    """What the Deployment rolls out to."""
    previous: SpecConfig
    """What it ran before (what a failed rollout goes back to)."""
    rolling_back: bool
    since_s: float
    trial: bool = False
    """A trial: `config` runs on a canary with the main pods, which keep `previous` until
    the canary is judged (a new operator abandons it: operator/kube/resume.py)."""

    @property
    def main_config(self) -> SpecConfig:
        """What the main pods are to run meanwhile (what a reconcile renders)."""
        return self.previous if self.trial else self.config

    def to_dict(self) -> dict[str, Any]:
        body = {"config": self.config.to_dict(), "previous": self.previous.to_dict(),
                "rollingBack": self.rolling_back, "since": self.since_s}  # fmt: skip
        return {**body, "trial": True} if self.trial else body


def priors(spec: SpecDeploymentSpec) -> dict[str, AcceptanceCurve]:
    return prior_curves(spec.candidates, PRIOR_TASK)


def allowed(spec: SpecDeploymentSpec, config: SpecConfig) -> bool:
    """Whether `config` is one of the spec's candidates or a schedule over one of them."""
    if config in spec.candidates:
        return True
    same = [c for c in spec.candidates if c.method == config.method and c.speculative]
    return any(c.draft_model == config.draft_model and config.max_k <= c.max_k for c in same) and (
        config.schedule is not None
    )


def load_state(
    status: Mapping[str, Any], spec: SpecDeploymentSpec, now: float
) -> tuple[TunerState, dict[SpecConfig, float]]:
    """The tuner state and the failed configs (config -> unix time it failed)."""
    raw = status.get("tunerState")
    state: TunerState | None = None
    failed: dict[SpecConfig, float] = {}
    if isinstance(raw, str) and raw:
        try:
            state = TunerState.from_json(raw)
            body = json.loads(raw)
            failed = {SpecConfig.from_dict(c): float(t) for c, t in body.get("failed", [])}
        except (ValueError, KeyError, TypeError, ConfigError) as exc:
            logger.warning("status.tunerState does not parse (%s); starting afresh", exc)
            state, failed = None, {}
    if state is None:
        return TunerState.initial(spec.initial, now, priors(spec)), {}
    known = state.acceptance_curves()
    missing = {m: c for m, c in priors(spec).items() if m not in known}
    if missing:  # a method added to the candidates since: start it from its prior
        merged = {**missing, **known}
        state = replace(state, acceptance=tuple(sorted((m, c.p, c.r) for m, c in merged.items())))
    # off and recommend run what the user wrote; auto keeps its choice while it is allowed
    pinned = spec.tuning.mode != "auto" and state.current != spec.initial
    if pinned or not allowed(spec, state.current):
        state = replace(state, current=spec.initial, since_s=now)
    return state, {c: t for c, t in failed.items() if allowed(spec, c)}


def load_rollout(status: Mapping[str, Any]) -> InFlight | None:
    """The rollout in flight stored in status.tunerState, or None (none, or unreadable)."""
    raw = status.get("tunerState")
    try:
        found = json.loads(raw).get("rollout") if isinstance(raw, str) and raw else None
        if found is None:
            return None
        return InFlight(
            config=SpecConfig.from_dict(found["config"]),
            previous=SpecConfig.from_dict(found["previous"]),
            rolling_back=bool(found["rollingBack"]),
            since_s=float(found["since"]),
            trial=bool(found.get("trial", False)),
        )
    except (ValueError, KeyError, TypeError, AttributeError, ConfigError) as exc:
        logger.warning("status.tunerState's rollout does not parse (%s); not resumed", exc)
        return None


def dump_state(
    state: TunerState,
    failed: Mapping[SpecConfig, float] | None = None,
    rollout: InFlight | None = None,
) -> str:
    body = json.loads(state.to_json())
    if failed:
        body["failed"] = [[c.to_dict(), t] for c, t in failed.items()]
    if rollout is not None:
        body["rollout"] = rollout.to_dict()
    return json.dumps(body, separators=(",", ":"))
