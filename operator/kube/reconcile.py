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

Then status (computed and written by status.py): phase, currentConfig, replicas/selector (the
scale subresource), printer-column fields, observedGeneration and Conditions. An invalid spec
writes phase Degraded and a Degraded=True condition with the message, then raises the
`SpecError` (the kopf handler makes it permanent). A child the API server refuses (a value
under spec.pod kept as written that Kubernetes rejects, a forbidden write) writes Degraded with
reason ChildRejected and the server's message, then raises its `KubeApiError` (retried).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from specpilot.operator.api.names import API_VERSION, INSTANCE_LABEL, PLURAL, SIDECAR_LABEL
from specpilot.operator.api.spec import SpecDeploymentSpec, SpecError, config_to_status, decode_spec
from specpilot.operator.kube import children as ch
from specpilot.operator.kube.client import (
    KubeApiError,
    KubeConflict,
    KubeRest,
    KubeTransient,
    plural_of,
)
from specpilot.operator.kube.persisted_state import dump_state, load_rollout, load_state
from specpilot.operator.kube.status import degraded_status, running_status, write_status
from specpilot.tuner import SpecConfig

Obj = dict[str, Any]


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
    `KubeConflict`; the caller retries the whole reconcile, which is safe. A patch the server
    refuses on an object nobody changed meanwhile raises `KubeApiError`."""
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
    try:
        rest.patch(
            desired["apiVersion"],
            plural,
            meta.get("namespace"),
            meta["name"],
            [guard, *ops],
            kind="json",
        )
    except KubeConflict as exc:
        # A 422 is a failed `test` (someone wrote first) or a refused value; unchanged since
        # we read it, the object was not raced: the server refused what we wrote.
        again = rest.get(desired["apiVersion"], plural, meta.get("namespace"), meta["name"])
        if again is not None and again["metadata"]["resourceVersion"] == guard["value"]:
            raise KubeApiError(f"{exc} (the object did not change meanwhile)") from exc
        raise
    return "patched"


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
    inflight = load_rollout(status)
    # a trial in flight runs on a canary only: the main pods keep what they ran until it is judged
    running = inflight.main_config if inflight is not None else state.current
    actions = {}
    for child in desired_objects(rest, fresh, spec, running):
        key = f"{child['kind']}/{child['metadata']['name']}"
        try:
            actions[key] = apply_child(rest, child)
        except (KubeConflict, KubeTransient):
            raise  # a lost race or a hiccup: retried, nothing to tell
        except KubeApiError as exc:  # refused (invalid, forbidden): say so, then retry
            message = f"the API server refused {key}, rendered from this spec: {exc}"
            write_status(rest, fresh, degraded_status(status, message, generation,
                                                      reason="ChildRejected"))  # fmt: skip
            raise
    _prune_sidecars(rest, name, namespace, actions)
    deployment = rest.get("apps/v1", "deployments", namespace, ch.deployment_name(name)) or {}
    new_status = running_status(status, spec, deployment, generation, name)
    new_status["currentConfig"] = config_to_status(state.current)
    # a rollout in flight stays recorded: the next tick follows it (operator/kube/resume.py)
    new_status["tunerState"] = dump_state(state, failed, inflight)
    write_status(rest, fresh, new_status)
    return new_status


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
    selector = f"{SIDECAR_LABEL}=true,{INSTANCE_LABEL}={name}"
    for cm in rest.list("v1", "configmaps", namespace, selector):
        cm_name = cm["metadata"]["name"]
        if cm_name not in wanted:
            rest.delete("v1", "configmaps", namespace, cm_name)
