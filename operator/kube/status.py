"""A SpecDeployment's status, Conditions and Events: how they are computed and written.

Contract: every function that computes status is pure (old status and observations in, new
status out) and follows Kubernetes conventions: metav1.Condition entries (type, status,
reason, message, lastTransitionTime, observedGeneration) whose lastTransitionTime moves only
when their status does; phase, currentConfig, replicas and selector (the scale subresource).
`write_status` patches the /status subresource only when something changed (no write, no new
resourceVersion, no watch event otherwise), nulling what the new status dropped. `post_event`
is best effort: an Event that cannot be posted is logged and never fails the switch it
describes (status.lastDecision says the same).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from specpilot.operator.api.names import API_VERSION, PLURAL
from specpilot.operator.api.spec import SpecDeploymentSpec, config_to_status
from specpilot.operator.kube import children as ch
from specpilot.operator.kube.client import KubeRest, now_iso
from specpilot.operator.loop import TickRecord
from specpilot.tuner import TunerState

logger = logging.getLogger(__name__)
Obj = dict[str, Any]

TUNING_REASONS = {"auto": "Auto", "recommend": "RecommendOnly", "off": "Pinned"}


EVENT_REASONS = {
    "stay": "TunerStayed",
    "switch": "TunerSwitched",
    "off": "TunerSpeculationOff",
    "rollback": "TunerRolledBack",
    "error": "TunerSwitchFailed",
    "recommend": "TunerRecommends",
}


def set_condition(
    conditions: Sequence[Mapping[str, Any]],
    *,
    type_: str,
    status: bool,
    reason: str,
    message: str,
    generation: int | None,
) -> list[Obj]:
    """Conditions with one entry set; lastTransitionTime moves only when the status changes."""
    value = "True" if status else "False"
    out = [dict(c) for c in conditions if c.get("type") != type_]
    old = next((c for c in conditions if c.get("type") == type_), None)
    since = old["lastTransitionTime"] if old and old.get("status") == value else now_iso()
    entry: Obj = {"type": type_, "status": value, "reason": reason, "message": message[:1024],
                  "lastTransitionTime": since}  # fmt: skip
    if generation is not None:
        entry["observedGeneration"] = generation
    out.append(entry)
    return sorted(out, key=lambda c: str(c["type"]))


def degraded_status(
    status: Obj, message: str, generation: int | None, *, reason: str = "InvalidSpec"
) -> Obj:
    """Phase Degraded and Degraded=True: an invalid spec (InvalidSpec), or a child rendered
    from it that the API server refused (ChildRejected)."""
    conditions = set_condition(
        status.get("conditions", []), type_="Degraded", status=True, reason=reason,
        message=message, generation=generation,
    )  # fmt: skip
    return {
        **status,
        "phase": "Degraded",
        "observedGeneration": generation,
        "conditions": conditions,
    }


def running_status(
    status: Obj,
    spec: SpecDeploymentSpec,
    deployment: Mapping[str, Any],
    generation: int | None,
    name: str,
) -> Obj:
    dep_spec = deployment.get("spec") or {}
    dep_status = deployment.get("status") or {}
    wanted = int(dep_spec.get("replicas", 1))
    ready = int(dep_status.get("readyReplicas") or 0)
    updated = int(dep_status.get("updatedReplicas") or 0)
    available = int(dep_status.get("availableReplicas") or 0)
    total = int(dep_status.get("replicas") or 0)
    seen = dep_status.get("observedGeneration", 0) >= (deployment.get("metadata") or {}).get(
        "generation", 1
    )
    rolled = (
        bool(deployment) and seen and updated >= wanted and total == updated and available >= wanted
    )
    conditions = status.get("conditions", [])
    ready_reason = "ReplicasReady" if ready >= wanted else "ReplicasNotReady"
    for type_, value, reason, message in (
        ("Degraded", False, "SpecValid", "the spec decodes and every candidate runs on the engine"),
        ("Ready", ready >= wanted and rolled, ready_reason, f"{ready}/{wanted} replicas ready"),
        ("Progressing", not rolled, "RollingOut" if not rolled else "RolloutComplete",
         f"{updated}/{wanted} replicas updated, {available} available"),
        ("Tuning", spec.tuning.mode != "off", TUNING_REASONS[spec.tuning.mode],
         f"tuning mode {spec.tuning.mode}"),
    ):  # fmt: skip
        conditions = set_condition(
            conditions,
            type_=type_,
            status=value,
            reason=reason,
            message=message,
            generation=generation,
        )
    phase = "Running" if rolled else "Deploying"
    if status.get("phase") in ("Switching", "RollingBack") and not rolled:
        phase = status["phase"]  # the tuner's own phases while its rollout is under way
    out = {
        **status, "phase": phase, "observedGeneration": generation, "conditions": conditions,
        "replicas": total, "readyReplicas": ready, "selector": ch.pod_selector(name),
    }  # fmt: skip
    namespace = (deployment.get("metadata") or {}).get("namespace")
    if namespace:  # the Service is applied with the Deployment: its endpoint, for users
        out["url"] = ch.service_url(name, namespace, spec)
    return out


def tick_status(
    status: Obj,
    spec: SpecDeploymentSpec,
    record: TickRecord,
    state: TunerState,
    action: str,
    body: Mapping[str, Any],
) -> Obj:
    obs, decision = record.observation, record.decision
    when = now_iso()
    observed = {
        key: round(value, 4)
        for key, value in (
            ("acceptanceLength", obs.acceptance_length),
            ("batch", obs.running_requests),
            ("tokensPerSecond", obs.generation_tokens_per_s),
            ("tpotP95Ms", obs.tpot_p95_s * 1e3 if obs.tpot_p95_s is not None else None),
            ("ttftP95Ms", obs.ttft_p95_s * 1e3 if obs.ttft_p95_s is not None else None),
        )
        if value is not None
    }
    has_data = obs.generation_tokens_per_s is not None
    generation = body["metadata"].get("generation")
    conditions = set_condition(
        status.get("conditions", []), type_="MetricsAvailable", status=has_data,
        reason="Observed" if has_data else "NoMetrics",
        message=f"{len(obs.pods)} pod(s) observed" if has_data else
        "no throughput in the window: " + ", ".join(obs.unknown),
        generation=generation,
    )  # fmt: skip
    out: Obj = {
        "observed": {**observed, "time": when},
        "lastDecision": {
            "action": action,
            "reason": record.explanation[:1024],
            "predictedGain": round(decision.predicted_gain, 4),
            "config": decision.config.describe(),
            "time": when,
        },
        "currentConfig": config_to_status(state.current),
        "conditions": conditions,
    }
    if decision.regime in ("memory-bound", "transition", "compute-bound", "unknown"):
        out["regime"] = decision.regime
    if status.get("phase") in ("Switching", "RollingBack"):
        out["phase"] = "Running"  # the rollout (or its rollback) finished inside the tick
    if action != "recommend" and "recommendation" in status:
        out["recommendation"] = None  # stale: a merge patch with null removes it
    if action == "recommend":
        out["recommendation"] = {
            "config": config_to_status(decision.config),
            "reason": decision.reason[:1024],
            "predictedGain": round(decision.predicted_gain, 4),
            "time": when,
        }
    return out


def write_status(rest: KubeRest, body: Mapping[str, Any], status: Obj) -> None:
    """Make `body`'s status `status` (the whole of it, as computed from `body`'s): the merge
    patch nulls what `status` no longer has, at any depth (a config switched to no speculation
    keeps no `numSpeculativeTokens`); what others wrote since `body` was read is left alone."""
    meta = body["metadata"]
    old = body.get("status") or {}
    if status == old:
        return  # nothing changed: no write, no new resourceVersion, no watch event
    patch = merge_patch(old, status)
    rest.patch(
        API_VERSION, PLURAL, meta["namespace"], meta["name"], {"status": patch}, sub="status"
    )


def merge_patch(old: Mapping[str, Any], new: Mapping[str, Any]) -> Obj:
    """The JSON merge patch (RFC 7386) that turns `old` into `new`: a key `new` lacks is null;
    objects in both are diffed key by key; anything else is sent whole when it changed."""
    patch: Obj = {key: None for key in old if key not in new}
    for key, value in new.items():
        before = old.get(key)
        if isinstance(value, Mapping) and isinstance(before, Mapping):
            inner = merge_patch(before, value)
            if inner:
                patch[key] = inner
        elif key not in old or before != value:
            patch[key] = value
    return patch


def post_event(rest: KubeRest, body: Mapping[str, Any], type_: str, reason: str, text: str) -> None:
    """An Event, best effort: one that cannot be posted is logged and must not fail (or roll
    back) the switch it describes; status.lastDecision says the same."""
    try:
        rest.post_event(body, type_, reason, text)
    except Exception as exc:  # any API failure: RBAC, a conflict, the server away
        logger.warning("could not post Event %s on %s: %s", reason, body["metadata"]["name"], exc)
