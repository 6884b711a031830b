"""Reconcile one SpecDeployment: owned children from (spec, tuner state), applied idempotently.

Contract: `reconcile(rest, body)` is level-triggered: it reads the object fresh (the tuning
timer may have written a newer tuner state than the event carried), decodes the spec, renders
the children for the config the tuner state says runs (children.desired_children), and for each
one creates it when missing or patches exactly the keys that differ, comparing desired as a
subset of live (fields the server defaulted are not differences). Nothing else is written, so
a second call changes nothing. A Deployment's `spec.replicas` is written only when the
SpecDeployment sets it (children.py): otherwise an HPA, KEDA or a user owns it. Children carry a
controller ownerReference, so the API server's garbage collector deletes them with the object.
Sidecar ConfigMaps no Deployment refers to any more are deleted.

Then status: phase, currentConfig, replicas/selector (the scale subresource), printer-column
fields, observedGeneration and metav1.Condition entries whose lastTransitionTime changes only
when their status does. An invalid spec writes phase Degraded and a Degraded=True condition
with the message, then raises the `SpecError` (the kopf handler makes it permanent).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from specpilot.operator.api.spec import SpecDeploymentSpec, SpecError, config_to_status, decode_spec
from specpilot.operator.kube import children as ch
from specpilot.operator.kube.client import KubeRest, now_iso, plural_of
from specpilot.operator.kube.persisted_state import dump_state, load_state
from specpilot.tuner import SpecConfig

Obj = dict[str, Any]
API_VERSION = "specpilot.io/v1alpha1"
PLURAL = "specdeployments"
TUNING_REASONS = {"auto": "Auto", "recommend": "RecommendOnly", "off": "Pinned"}


def owner_reference(owner: Mapping[str, Any]) -> Obj:
    return {
        "apiVersion": owner.get("apiVersion", API_VERSION),
        "kind": owner.get("kind", "SpecDeployment"),
        "name": owner["metadata"]["name"],
        "uid": owner["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def adopt(child: Obj, owner: Mapping[str, Any]) -> Obj:
    child["metadata"]["ownerReferences"] = [owner_reference(owner)]
    return child


def contains(live: Any, desired: Any) -> bool:
    """`desired` is a subset of `live` (dicts by key, lists element-wise, the rest equal)."""
    if isinstance(desired, Mapping):
        return isinstance(live, Mapping) and all(
            k in live and contains(live[k], v) for k, v in desired.items()
        )
    if isinstance(desired, list):
        return (
            isinstance(live, list)
            and len(live) == len(desired)
            and all(contains(a, b) for a, b in zip(live, desired, strict=True))
        )
    return bool(live == desired)


def apply_child(rest: KubeRest, desired: Obj) -> str:
    """'created', 'patched' or 'unchanged'. A conflict (someone wrote in between) raises
    `KubeConflict`; the caller retries the whole reconcile, which is safe."""
    meta = desired["metadata"]
    plural = plural_of(desired)
    live = rest.get(desired["apiVersion"], plural, meta.get("namespace"), meta["name"])
    if live is None:
        rest.create(desired)
        return "created"
    ops: list[Obj] = []
    for key in ("labels", "annotations", "ownerReferences"):
        if key in meta and not contains(live["metadata"].get(key), meta[key]):
            value = (
                meta[key]
                if key == "ownerReferences"
                else {**live["metadata"].get(key, {}), **meta[key]}
            )
            ops.append({"op": "add", "path": f"/metadata/{key}", "value": value})
    for key, value in desired.items():
        if key in ("apiVersion", "kind", "metadata", "status"):
            continue
        if key == "spec" and isinstance(value, Mapping):  # per field: never the whole spec
            for field, wanted in value.items():
                if not contains((live.get("spec") or {}).get(field), wanted):
                    ops.append({"op": "add", "path": f"/spec/{field}", "value": wanted})
        elif not contains(live.get(key), value):
            ops.append({"op": "add", "path": f"/{key}", "value": value})
    if not ops:
        return "unchanged"
    if "spec" not in live and any(op["path"].startswith("/spec/") for op in ops):
        ops.insert(0, {"op": "add", "path": "/spec", "value": {}})
    guard = {
        "op": "test",
        "path": "/metadata/resourceVersion",
        "value": live["metadata"]["resourceVersion"],
    }
    rest.patch(
        desired["apiVersion"],
        plural,
        meta.get("namespace"),
        meta["name"],
        [guard, *ops],
        kind="json",
    )
    return "patched"


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


def monitor_kind(rest: KubeRest) -> ch.MonitorKind | None:
    """A PodMonitor (per-pod series, which the tuner reads) where the Prometheus Operator's
    CRDs are installed, else a ServiceMonitor, else none."""
    if rest.serves("monitoring.coreos.com/v1", "podmonitors"):
        return "PodMonitor"
    if rest.serves("monitoring.coreos.com/v1", "servicemonitors"):
        return "ServiceMonitor"
    return None


def desired_objects(
    rest: KubeRest, body: Mapping[str, Any], spec: SpecDeploymentSpec, config: SpecConfig
) -> list[Obj]:
    meta = body["metadata"]
    found = ch.desired_children(
        name=meta["name"], namespace=meta["namespace"], spec=spec, config=config,
        monitor_kind=monitor_kind(rest),
    )  # fmt: skip
    return [adopt(child, body) for child in found]


def reconcile(rest: KubeRest, body: Mapping[str, Any]) -> Obj:
    """Apply the children and write status; returns the status written."""
    meta = body["metadata"]
    name, namespace = meta["name"], meta["namespace"]
    fresh = rest.get(API_VERSION, PLURAL, namespace, name) or dict(body)
    status: Obj = dict(fresh.get("status") or {})
    generation = fresh["metadata"].get("generation")
    try:
        spec = decode_spec(fresh.get("spec") or {})
    except SpecError as exc:
        write_status(rest, fresh, degraded_status(status, str(exc), generation))
        raise
    state, failed = load_state(status, spec, now=time.time())
    actions = {}
    for child in desired_objects(rest, fresh, spec, state.current):
        actions[f"{child['kind']}/{child['metadata']['name']}"] = apply_child(rest, child)
    _prune_sidecars(rest, name, namespace, actions)
    deployment = rest.get("apps/v1", "deployments", namespace, ch.deployment_name(name)) or {}
    new_status = running_status(status, spec, deployment, generation, name)
    new_status["currentConfig"] = config_to_status(state.current)
    new_status["tunerState"] = dump_state(state, failed)
    write_status(rest, fresh, new_status)
    return new_status


def degraded_status(status: Obj, message: str, generation: int | None) -> Obj:
    conditions = set_condition(
        status.get("conditions", []), type_="Degraded", status=True, reason="InvalidSpec",
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
    return {
        **status, "phase": phase, "observedGeneration": generation, "conditions": conditions,
        "replicas": total, "selector": ch.pod_selector(name),
    }  # fmt: skip


def write_status(rest: KubeRest, body: Mapping[str, Any], status: Obj) -> None:
    meta = body["metadata"]
    if status == (body.get("status") or {}):
        return  # nothing changed: no write, no new resourceVersion, no watch event
    rest.patch(
        API_VERSION, PLURAL, meta["namespace"], meta["name"], {"status": status}, sub="status"
    )


def _prune_sidecars(rest: KubeRest, name: str, namespace: str, actions: Mapping[str, str]) -> None:
    """Delete sidecar ConfigMaps neither desired nor mounted by a live main or canary template
    (pods of a rollout under way still mount the old one)."""
    wanted = {key.split("/", 1)[1] for key in actions if key.startswith("ConfigMap/")}
    for role in ("main", "canary"):
        live = rest.get("apps/v1", "deployments", namespace, ch.deployment_name(name, role)) or {}
        volumes = (((live.get("spec") or {}).get("template") or {}).get("spec") or {}).get(
            "volumes"
        )
        wanted |= {v["configMap"]["name"] for v in volumes or [] if "configMap" in v}
    selector = f"{ch.SIDECAR_LABEL}=true,{ch.INSTANCE_LABEL}={name}"
    for cm in rest.list("v1", "configmaps", namespace, selector):
        cm_name = cm["metadata"]["name"]
        if cm_name not in wanted:
            rest.delete("v1", "configmaps", namespace, cm_name)
