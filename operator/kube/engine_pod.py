"""The SpecDeployment's `pod` settings and extra resources, applied to an engine pod template.

Contract: `apply_pod_settings(settings, template, pod, container)` mutates the three dicts
`children.desired_deployment` is building (the template's metadata, the pod spec and the engine
container), deterministically and in a fixed key order. SpecPilot's own labels, annotations,
volumes and mounts come first and win: the API models (operator/api/pod.py) already refuse a
user key, volume name or mount path SpecPilot uses, so nothing a user wrote is silently lost.

- Scheduling and identity (tolerations, affinity, runtimeClassName, priorityClassName,
  serviceAccountName, imagePullSecrets) and both security contexts go to the pod as written.
- The model cache is the volume `MODEL_CACHE_VOLUME`: the claim, or an emptyDir (sizeLimit),
  mounted at its path, with HF_HOME pointing there unless the spec's env sets HF_HOME.
- shmSize limits the /dev/shm emptyDir children.py always mounts.
- Extra resources are requested and limited alike (extended resources must be).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from specpilot.operator.api.names import MODEL_CACHE_VOLUME, SHM_VOLUME
from specpilot.operator.api.pod import MODEL_CACHE_ENV, PodSettings

Obj = dict[str, Any]

POD_FIELDS = (
    "serviceAccountName",
    "runtimeClassName",
    "priorityClassName",
    "imagePullSecrets",
    "tolerations",
    "affinity",
)
"""Pod spec fields taken from the settings as written (same names in core/v1 PodSpec)."""


def apply_pod_settings(settings: PodSettings, template: Obj, pod: Obj, container: Obj) -> None:
    written = settings.as_dict()
    metadata = template["metadata"]
    metadata["labels"] = {**settings.labels, **metadata["labels"]}
    if settings.annotations or "annotations" in metadata:
        metadata["annotations"] = {**settings.annotations, **metadata.get("annotations", {})}
    for name in POD_FIELDS:
        if written.get(name):
            pod[name] = written[name]
    if "securityContext" in written:
        pod["securityContext"] = written["securityContext"]
    if "containerSecurityContext" in written:
        container["securityContext"] = written["containerSecurityContext"]
    if settings.shm_size is not None:
        shm = next(v for v in pod["volumes"] if v["name"] == SHM_VOLUME)
        shm["emptyDir"]["sizeLimit"] = settings.shm_size
    _model_cache(settings, pod, container)
    pod["volumes"] += written.get("volumes", [])
    container["volumeMounts"] += written.get("volumeMounts", [])


def _model_cache(settings: PodSettings, pod: Obj, container: Obj) -> None:
    cache = settings.model_cache
    if cache is None:
        return
    mount: Obj = {"name": MODEL_CACHE_VOLUME, "mountPath": cache.path}
    if cache.claim_name is not None:
        claim: Obj = {"claimName": cache.claim_name}
        if cache.read_only:
            claim["readOnly"] = mount["readOnly"] = True
        pod["volumes"].append({"name": MODEL_CACHE_VOLUME, "persistentVolumeClaim": claim})
    else:
        empty_dir = {} if cache.size_limit is None else {"sizeLimit": cache.size_limit}
        pod["volumes"].append({"name": MODEL_CACHE_VOLUME, "emptyDir": empty_dir})
    container["volumeMounts"].append(mount)
    env: list[Obj] = container.setdefault("env", [])
    # the user's own HF_HOME (a subdirectory of the cache, say) is theirs to set
    if not any(var["name"] == MODEL_CACHE_ENV for var in env):
        env.append({"name": MODEL_CACHE_ENV, "value": cache.path})


def extra_resources(resources: Obj, extra: Mapping[str, str]) -> Obj:
    """`resources` (requests/limits) with the spec's extra resources in both."""
    if not extra:
        return resources
    out = {key: dict(value) for key, value in resources.items()}
    for kind in ("requests", "limits"):
        out.setdefault(kind, {}).update(sorted(extra.items()))
    return {kind: out[kind] for kind in ("requests", "limits")}
