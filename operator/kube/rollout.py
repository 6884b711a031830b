"""Where a Deployment's rollout stands, read from the Deployment and its pods.

Contract: `rollout_status(deployment, pods, config_json)` is pure. It reads the Deployment the
way `kubectl rollout status` does (observedGeneration caught up with generation, every replica
updated, no old or surplus replica left, every updated replica available;
ProgressDeadlineExceeded is a failure) and, to fail fast instead of waiting out a timeout,
looks at the pods that run the target config (their `specpilot.io/config` annotation, copied
from the pod template, equals `config_json` as JSON): one that crash-loops, cannot pull its
image, or exited with an error fails the rollout, with the container's termination message
(the engine's last log lines under `terminationMessagePolicy: FallbackToLogsOnError`).

Objects are plain dicts as the API server returns them (camelCase keys).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from specpilot.operator.api.names import CONFIG_ANNOTATION

# Container waiting reasons after which the pod will not become Ready without a new template.
FATAL_WAITING_REASONS = frozenset(
    {
        "CrashLoopBackOff",
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "CreateContainerConfigError",
        "CreateContainerError",
        "RunContainerError",
    }
)

Obj = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class RolloutStatus:
    done: bool
    message: str
    failed: bool = False


def rollout_status(deployment: Obj, pods: Sequence[Obj], config_json: str) -> RolloutStatus:
    crashed = _crashed_pod(pods, config_json)
    if crashed is not None:
        return RolloutStatus(done=False, failed=True, message=crashed)
    meta: Obj = deployment.get("metadata") or {}
    spec: Obj = deployment.get("spec") or {}
    status: Obj = deployment.get("status") or {}
    generation = meta.get("generation")
    observed = status.get("observedGeneration")
    if generation is not None and (observed is None or observed < generation):
        return RolloutStatus(False, "waiting for the deployment controller to see the change")
    progressing = _condition(status, "Progressing")
    if progressing is not None and progressing.get("reason") == "ProgressDeadlineExceeded":
        return RolloutStatus(
            False, f"progress deadline exceeded: {progressing.get('message', '')}", failed=True
        )
    wanted = int(spec.get("replicas", 1))
    updated = int(status.get("updatedReplicas") or 0)
    total = int(status.get("replicas") or 0)
    available = int(status.get("availableReplicas") or 0)
    if updated < wanted:
        return RolloutStatus(False, f"{updated} of {wanted} new replicas updated")
    if total > updated:
        return RolloutStatus(False, f"{total - updated} old replicas pending termination")
    if updated > wanted:  # scaled down (a canary taking a replica's place)
        return RolloutStatus(False, f"{updated - wanted} surplus replicas pending termination")
    if available < updated:
        return RolloutStatus(False, f"{available} of {updated} updated replicas available")
    return RolloutStatus(True, f"{available} of {wanted} replicas updated and available")


def pod_config(pod: Obj) -> Any:
    """The config a pod runs, as parsed JSON (None when the annotation is missing or broken)."""
    raw = ((pod.get("metadata") or {}).get("annotations") or {}).get(CONFIG_ANNOTATION)
    if raw is None:
        return None
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return None


def pod_ready(pod: Obj) -> bool:
    ready = _condition(pod.get("status") or {}, "Ready")
    return ready is not None and ready.get("status") == "True"


def _crashed_pod(pods: Sequence[Obj], config_json: str) -> str | None:
    target = json.loads(config_json)
    for pod in pods:
        if pod_config(pod) != target or (pod.get("metadata") or {}).get("deletionTimestamp"):
            continue
        name = (pod.get("metadata") or {}).get("name", "?")
        for container in (pod.get("status") or {}).get("containerStatuses") or []:
            state: Obj = container.get("state") or {}
            last: Obj = (container.get("lastState") or {}).get("terminated") or {}
            waiting: Obj = state.get("waiting") or {}
            terminated: Obj = state.get("terminated") or {}
            if waiting.get("reason") in FATAL_WAITING_REASONS:
                detail = last.get("message") or waiting.get("message") or ""
                exit_code = last.get("exitCode")
                return (
                    f"pod {name} container {container.get('name')}: {waiting['reason']}"
                    + (f" (exit code {exit_code})" if exit_code is not None else "")
                    + (f": {detail.strip()}" if detail else "")
                )
            if terminated and terminated.get("exitCode", 0) != 0:
                detail = terminated.get("message") or terminated.get("reason") or ""
                return (
                    f"pod {name} container {container.get('name')} exited with "
                    f"{terminated.get('exitCode')}: {str(detail).strip()}"
                )
    return None


def _condition(status: Obj, kind: str) -> Obj | None:
    for condition in status.get("conditions") or []:
        if condition.get("type") == kind:
            found: Obj = condition
            return found
    return None
