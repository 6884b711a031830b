"""The `pod` section of the SpecDeployment spec: engine pod settings passed to the pod template.

Contract: `PodSettings.model_validate(data)` enforces the section's shapes, bounds and CEL rules
(declared here for the CRD and checked here in Python, side by side). Kubernetes core types a
GPU node pool needs (tolerations, image pull secrets, volume mounts, the model cache, /dev/shm)
and both security contexts are typed in full; the deep parts of affinity and volume sources are
typed at their top and otherwise kept as written (`x-kubernetes-preserve-unknown-fields`): they
reach the pod template unchanged and the API server validates them there, as it does for any
Deployment.
SpecPilot's own labels, annotations, volume names and mount paths cannot be overridden: a key or
name it uses is refused, naming the field (operator/api/names.py lists them).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, Self

from pydantic import ConfigDict, Field, field_validator, model_validator
from pydantic.config import JsonDict

from specpilot.operator.api.base import (
    QUANTITY_PATTERN,
    ApiModel,
    Violation,
    cel,
    dump,
    rules,
    validations,
)
from specpilot.operator.api.names import (
    OWNED_ANNOTATIONS,
    OWNED_KEY_PREFIX,
    OWNED_LABELS,
    OWNED_VOLUMES,
    SHM_PATH,
)
from specpilot.runtime.engines import LaunchSettings

__all__ = [
    "DEFAULT_MODEL_CACHE_PATH",
    "MODEL_CACHE_ENV",
    "RESERVED_MOUNT_PATHS",
    "Affinity",
    "AppArmorProfile",
    "Capabilities",
    "ContainerSecurityContext",
    "LocalObjectReference",
    "ModelCache",
    "PodSecurityContext",
    "PodSettings",
    "SELinuxOptions",
    "SeccompProfile",
    "Sysctl",
    "Toleration",
    "Volume",
    "VolumeMount",
    "WindowsOptions",
]

DEFAULT_MODEL_CACHE_PATH = "/root/.cache/huggingface"
"""Where vLLM's and SGLang's official images (root, HOME=/root) keep Hugging Face downloads:
huggingface_hub's default HF_HOME, ~/.cache/huggingface."""
MODEL_CACHE_ENV = "HF_HOME"
"""huggingface_hub's cache root; set to the cache's mount path, so any user finds it."""
SIDECAR_DIR = LaunchSettings.__dataclass_fields__["sidecar_dir"].default
RESERVED_MOUNT_PATHS: tuple[str, ...] = (SHM_PATH, str(SIDECAR_DIR))
"""Mount paths SpecPilot mounts itself (besides the model cache's)."""

DNS_LABEL = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
# "[.]", not a backslash and a dot: these patterns also go into CEL string literals, where
# that is no escape.
DNS_SUBDOMAIN = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
QUALIFIED_NAME = (
    "^([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    "[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
"""A label or annotation key: an optional DNS subdomain prefix and a name."""
LABEL_VALUE = "^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
ABSOLUTE_PATH = "^/[^\\x00]*$"
_PRESERVE: JsonDict = {"x-kubernetes-preserve-unknown-fields": True}


def _cel_list(values: tuple[str, ...]) -> str:
    return "[" + ", ".join(f"'{v}'" for v in values) + "]"


def _owned_key_rule(owned: tuple[str, ...], what: str) -> JsonDict:
    listed = tuple(k for k in owned if not k.startswith(OWNED_KEY_PREFIX))
    return cel(
        f"self.all(k, !k.startsWith('{OWNED_KEY_PREFIX}') && !(k in {_cel_list(listed)}))",
        f"{what}: {', '.join(listed)} and every {OWNED_KEY_PREFIX}* key are SpecPilot's"
        " (it writes them on its pods); choose another key",
    )


def _key_shape_rule(what: str) -> JsonDict:
    return cel(
        f"self.all(k, size(k) <= 316 && k.matches('{QUALIFIED_NAME}'))",
        f"{what} keys are qualified names: an optional DNS subdomain prefix and '/', then"
        " letters, digits, '-', '_' or '.' (at most 63), starting and ending alphanumeric",
    )


def check_keys(keys: list[str], owned: tuple[str, ...]) -> None:
    """A key SpecPilot writes, or one Kubernetes refuses, is a Violation at that key."""
    for key in keys:
        if key.startswith(OWNED_KEY_PREFIX) or key in owned:
            raise Violation(
                key,
                key,
                f"a key other than {', '.join(owned)} and {OWNED_KEY_PREFIX}*",
                "SpecPilot writes that key itself",
            )
        if len(key) > 316 or not re.fullmatch(QUALIFIED_NAME, key):
            raise Violation(key, key, f"a qualified name matching {QUALIFIED_NAME}")


class Toleration(ApiModel):
    """A toleration of a node taint (core/v1 Toleration), e.g. nvidia.com/gpu:NoSchedule."""

    model_config = rules(
        cel(
            "!has(self.operator) || self.operator != 'Exists' || !has(self.value)",
            "operator Exists matches any value; remove value",
            ".value",
        ),
        cel(
            "has(self.key) || (has(self.operator) && self.operator == 'Exists')",
            "an empty key (every taint) needs operator Exists",
            ".key",
        ),
    )

    key: str | None = Field(default=None, max_length=316)
    """Taint key the toleration applies to; empty with operator Exists tolerates every taint."""
    operator: Literal["Exists", "Equal"] | None = None
    """Equal (the default) matches key and value; Exists matches the key alone."""
    value: str | None = Field(default=None, max_length=63)
    """Taint value to match with operator Equal."""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    """Taint effect to match; empty matches all effects."""
    toleration_seconds: int | None = Field(
        default=None, ge=0, le=31536000, json_schema_extra={"format": "int64"}
    )
    """With effect NoExecute, seconds the pod stays bound after the taint appears."""

    @model_validator(mode="after")
    def _cross_field(self) -> Self:
        if self.operator == "Exists" and self.value is not None:
            raise Violation("value", self.value, "unset with operator Exists")
        if self.key is None and self.operator != "Exists":
            raise Violation("key", None, "a taint key, or operator Exists to tolerate every taint")
        return self


def _open(description: str) -> Any:
    return Field(default=None, description=description, json_schema_extra=_PRESERVE)


class Affinity(ApiModel):
    """Scheduling constraints (core/v1 Affinity), passed to the pod unchanged; see `kubectl
    explain pod.spec.affinity` for the fields below each kind."""

    node_affinity: dict[str, Any] | None = _open(
        "Node affinity (core/v1 NodeAffinity): requiredDuringSchedulingIgnoredDuringExecution"
        " (nodeSelectorTerms) and preferredDuringSchedulingIgnoredDuringExecution (weight,"
        " preference), e.g. to require a GPU product label."
    )
    pod_affinity: dict[str, Any] | None = _open(
        "Pod affinity (core/v1 PodAffinity): schedule near pods matching a label selector."
    )
    pod_anti_affinity: dict[str, Any] | None = _open(
        "Pod anti-affinity (core/v1 PodAntiAffinity): e.g. spread replicas over nodes"
        " (topologyKey kubernetes.io/hostname)."
    )


class _Open(ApiModel):
    """A core type whose top-level fields are typed and the rest kept as written."""

    model_config = ConfigDict(extra="allow", json_schema_extra=_PRESERVE)


class SeccompProfile(ApiModel):
    """The seccomp profile (core/v1 SeccompProfile)."""

    type: Literal["RuntimeDefault", "Unconfined", "Localhost"]
    """RuntimeDefault (the container runtime's default profile), Unconfined or Localhost."""
    localhost_profile: str | None = Field(default=None, max_length=4096)
    """With type Localhost, the profile's path on the node."""


class AppArmorProfile(ApiModel):
    """The AppArmor profile (core/v1 AppArmorProfile)."""

    type: Literal["RuntimeDefault", "Unconfined", "Localhost"]
    """RuntimeDefault (the container runtime's default profile), Unconfined or Localhost."""
    localhost_profile: str | None = Field(default=None, max_length=4096)
    """With type Localhost, the name of a profile loaded on the node."""


class SELinuxOptions(ApiModel):
    """The SELinux context (core/v1 SELinuxOptions)."""

    level: str | None = Field(default=None, max_length=256)
    """SELinux level label."""
    role: str | None = Field(default=None, max_length=256)
    """SELinux role label."""
    type: str | None = Field(default=None, max_length=256)
    """SELinux type label."""
    user: str | None = Field(default=None, max_length=256)
    """SELinux user label."""


class WindowsOptions(ApiModel):
    """Windows-specific options (core/v1 WindowsSecurityContextOptions)."""

    gmsa_credential_spec_name: str | None = Field(default=None, max_length=253)
    """Name of the GMSA credential spec to use."""
    gmsa_credential_spec: str | None = Field(default=None, max_length=65536)
    """The GMSA credential spec's contents."""
    run_as_user_name: str | None = Field(default=None, max_length=256)
    """User name the entrypoint runs as."""
    host_process: bool | None = None
    """Run as a Windows host process."""


class Sysctl(ApiModel):
    """A namespaced kernel parameter (core/v1 Sysctl)."""

    name: str = Field(min_length=1, max_length=256)
    """Parameter name, e.g. net.ipv4.ip_local_port_range."""
    value: str = Field(max_length=256)
    """Parameter value."""


_INT64: JsonDict = {"format": "int64"}


class PodSecurityContext(ApiModel):
    """Pod-level security attributes (core/v1 PodSecurityContext), every field typed: a key
    Kubernetes does not know is pruned by the API server (and refused by the decoder), never
    passed to the pod template."""

    run_as_user: int | None = Field(default=None, ge=0, json_schema_extra=_INT64)
    """UID the containers run as."""
    run_as_group: int | None = Field(default=None, ge=0, json_schema_extra=_INT64)
    """GID the containers run as."""
    run_as_non_root: bool | None = None
    """Refuse to start a container whose image runs as root."""
    fs_group: int | None = Field(default=None, ge=0, json_schema_extra=_INT64)
    """GID owning mounted volumes (a model cache PVC written by a non-root engine needs it)."""
    fs_group_change_policy: Literal["OnRootMismatch", "Always"] | None = None
    """When to change volume ownership to fsGroup."""
    supplemental_groups: list[Annotated[int, Field(ge=0, json_schema_extra=_INT64)]] | None = Field(
        default=None, max_length=64
    )
    """Further GIDs of the containers' first process."""
    supplemental_groups_policy: Literal["Merge", "Strict"] | None = None
    """How supplementalGroups combine with the image's groups."""
    seccomp_profile: SeccompProfile | None = None
    app_armor_profile: AppArmorProfile | None = None
    se_linux_options: SELinuxOptions | None = None
    se_linux_change_policy: Literal["MountOption", "Recursive"] | None = None
    """How SELinux labels are applied to volumes."""
    sysctls: list[Sysctl] | None = Field(default=None, max_length=64)
    """Namespaced kernel parameters of the pod."""
    windows_options: WindowsOptions | None = None


class Capabilities(ApiModel):
    """Linux capabilities added to and dropped from the container runtime's default set."""

    add: list[str] | None = Field(default=None, max_length=64)
    """Capabilities to add, e.g. IPC_LOCK for RDMA."""
    drop: list[str] | None = Field(default=None, max_length=64)
    """Capabilities to drop, e.g. ALL (the restricted Pod Security level)."""


class ContainerSecurityContext(ApiModel):
    """Security attributes of the engine container (core/v1 SecurityContext), every field
    typed: a key Kubernetes does not know is pruned by the API server (and refused by the
    decoder), never passed to the pod template."""

    run_as_user: int | None = Field(default=None, ge=0, json_schema_extra=_INT64)
    """UID the engine runs as."""
    run_as_group: int | None = Field(default=None, ge=0, json_schema_extra=_INT64)
    """GID the engine runs as."""
    run_as_non_root: bool | None = None
    """Refuse to start the engine if its image runs as root."""
    allow_privilege_escalation: bool | None = None
    """Whether a process may gain more privileges than its parent (false for restricted)."""
    privileged: bool | None = None
    """Run the container privileged (host devices; rarely right for an engine)."""
    read_only_root_filesystem: bool | None = None
    """Mount the image read-only; the engine then writes only to volumes (model cache, shm)."""
    proc_mount: Literal["Default", "Unmasked"] | None = None
    """/proc mount type (Unmasked needs a user-namespaced pod)."""
    capabilities: Capabilities | None = None
    seccomp_profile: SeccompProfile | None = None
    app_armor_profile: AppArmorProfile | None = None
    se_linux_options: SELinuxOptions | None = None
    windows_options: WindowsOptions | None = None


class LocalObjectReference(ApiModel):
    """A Secret in the same namespace."""

    name: str = Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN)
    """Name of the Secret (type kubernetes.io/dockerconfigjson) holding registry credentials."""


class Volume(_Open):
    """An extra pod volume (core/v1 Volume): a name and one source (configMap, secret,
    persistentVolumeClaim, emptyDir, csi, ...), the source passed through as written."""

    model_config = ConfigDict(
        json_schema_extra={
            **_PRESERVE,
            **validations(
                cel(
                    f"!(self.name in {_cel_list(OWNED_VOLUMES)})",
                    f"volume names {', '.join(OWNED_VOLUMES)} are SpecPilot's; choose another",
                    ".name",
                )
            ),
        }
    )

    name: str = Field(min_length=1, max_length=63, pattern=DNS_LABEL)
    """Volume name, referred to by volumeMounts."""

    @field_validator("name")
    @classmethod
    def _not_owned(cls, name: str) -> str:
        if name in OWNED_VOLUMES:
            raise Violation("", name, f"a name other than {', '.join(OWNED_VOLUMES)}")
        return name


class VolumeMount(ApiModel):
    """Where the engine container mounts one of pod.volumes."""

    name: str = Field(min_length=1, max_length=63, pattern=DNS_LABEL)
    """Name of a volume in pod.volumes."""
    mount_path: str = Field(min_length=1, max_length=4096, pattern=ABSOLUTE_PATH)
    """Absolute path in the container."""
    sub_path: str | None = Field(default=None, max_length=4096, pattern="^[^/\\x00][^\\x00]*$")
    """Path inside the volume to mount instead of its root (relative)."""
    read_only: bool | None = None
    """Mount read-only."""


class ModelCache(ApiModel):
    """Where model weights are downloaded and kept. With claimName, an existing
    PersistentVolumeClaim: a switch's new pods find the weights already there and download
    nothing (several replicas need a ReadWriteMany claim, or a ReadOnlyMany one filled
    beforehand). Without it, an emptyDir: it outlives engine restarts inside a pod, but each new
    pod (every switch) downloads again. Mounted at mountPath, and HF_HOME is set to it (unless
    env sets HF_HOME), where vLLM and SGLang read and write Hugging Face downloads."""

    model_config = rules(
        cel(
            "!has(self.claimName) || !has(self.sizeLimit)",
            "sizeLimit sizes an emptyDir cache; with claimName the claim's own size applies",
            ".sizeLimit",
        ),
        cel("has(self.claimName) || !has(self.readOnly)", "readOnly needs claimName", ".readOnly"),
    )

    claim_name: str | None = Field(
        default=None, min_length=1, max_length=253, pattern=DNS_SUBDOMAIN
    )
    """An existing PersistentVolumeClaim in the same namespace; unset: an emptyDir."""
    read_only: bool | None = None
    """Mount the claim read-only (a cache filled beforehand); the engine must then not download:
    set HF_HUB_OFFLINE=1 in env."""
    size_limit: str | None = Field(default=None, max_length=32, pattern=QUANTITY_PATTERN)
    """Size limit of the emptyDir (a quantity such as "200Gi"); the kubelet evicts a pod past
    it."""
    mount_path: str | None = Field(default=None, max_length=4096, pattern=ABSOLUTE_PATH)
    """Mount path; default /root/.cache/huggingface (huggingface_hub's ~/.cache/huggingface for
    the official images' root user)."""

    @model_validator(mode="after")
    def _cross_field(self) -> Self:
        if self.claim_name is not None and self.size_limit is not None:
            raise Violation("sizeLimit", self.size_limit, "unset with claimName (an emptyDir's)")
        if self.claim_name is None and self.read_only is not None:
            raise Violation("readOnly", self.read_only, "unset without claimName")
        return self

    @property
    def path(self) -> str:
        return self.mount_path or DEFAULT_MODEL_CACHE_PATH


_CACHE_PATH_CEL = (
    f"(has(self.modelCache.mountPath) ? self.modelCache.mountPath : '{DEFAULT_MODEL_CACHE_PATH}')"
)
_LIST_MAP_BY_NAME: JsonDict = {
    "x-kubernetes-list-type": "map",
    "x-kubernetes-list-map-keys": ["name"],
}


class PodSettings(ApiModel):
    """Engine pod settings, passed to the pod template of every engine pod (main and canary):
    scheduling on a GPU node pool, identity, security, storage and metadata."""

    model_config = rules(
        cel(
            "!has(self.volumeMounts) || self.volumeMounts.all(m,"
            " has(self.volumes) && self.volumes.exists(v, v.name == m.name))",
            "every volumeMounts[].name must name a volume in pod.volumes",
            ".volumeMounts",
        ),
        cel(
            "!has(self.volumeMounts) || self.volumeMounts.all(m,"
            f" !(m.mountPath in {_cel_list(RESERVED_MOUNT_PATHS)})"
            f" && (!has(self.modelCache) || m.mountPath != {_CACHE_PATH_CEL}))",
            f"mount paths {', '.join(RESERVED_MOUNT_PATHS)} and the model cache's are"
            " SpecPilot's (set shmSize and modelCache instead)",
            ".volumeMounts",
        ),
        cel(
            "!has(self.modelCache) || !has(self.modelCache.mountPath)"
            f" || !(self.modelCache.mountPath in {_cel_list(RESERVED_MOUNT_PATHS)})",
            f"the model cache cannot be mounted at {' or '.join(RESERVED_MOUNT_PATHS)}",
            ".modelCache.mountPath",
        ),
    )

    labels: dict[
        str,
        Annotated[str, Field(max_length=63, pattern=LABEL_VALUE, description="Label value.")],
    ] = Field(
        default_factory=dict,
        max_length=32,
        json_schema_extra=validations(
            _owned_key_rule(OWNED_LABELS, "pod.labels"), _key_shape_rule("pod.labels")
        ),
    )
    """Labels of the engine pods (not the Deployment's). SpecPilot's own (app.kubernetes.io/name,
    instance, managed-by, specpilot.io/*) are refused: its selectors rely on them."""
    annotations: dict[
        str, Annotated[str, Field(max_length=4096, description="Annotation value.")]
    ] = Field(
        default_factory=dict,
        max_length=32,
        json_schema_extra=validations(
            _owned_key_rule(OWNED_ANNOTATIONS, "pod.annotations"),
            _key_shape_rule("pod.annotations"),
        ),
    )
    """Annotations of the engine pods. SpecPilot's own (specpilot.io/*, prometheus.io/scrape,
    port and path) are refused."""
    tolerations: list[Toleration] = Field(default_factory=list, max_length=32)
    """Taints the engine pods tolerate, e.g. {key: nvidia.com/gpu, operator: Exists, effect:
    NoSchedule} for a tainted GPU node pool."""
    affinity: Affinity | None = None
    runtime_class_name: str | None = Field(
        default=None, min_length=1, max_length=253, pattern=DNS_SUBDOMAIN
    )
    """RuntimeClass the pods run with, e.g. nvidia where the NVIDIA container runtime is not the
    node's default."""
    priority_class_name: str | None = Field(
        default=None, min_length=1, max_length=253, pattern=DNS_SUBDOMAIN
    )
    """PriorityClass of the pods (preemption order on a shared GPU pool)."""
    service_account_name: str | None = Field(
        default=None, min_length=1, max_length=253, pattern=DNS_SUBDOMAIN
    )
    """ServiceAccount the pods run as (e.g. one bound to a cloud identity that reads weights
    from a bucket); default the namespace's default account."""
    image_pull_secrets: list[LocalObjectReference] = Field(
        default_factory=list, max_length=16, json_schema_extra=_LIST_MAP_BY_NAME
    )
    """Secrets holding credentials for a private registry with the engine image."""
    security_context: PodSecurityContext | None = None
    container_security_context: ContainerSecurityContext | None = None
    volumes: list[Volume] = Field(
        default_factory=list, max_length=32, json_schema_extra=_LIST_MAP_BY_NAME
    )
    """Extra pod volumes; mount them with volumeMounts."""
    volume_mounts: list[VolumeMount] = Field(
        default_factory=list,
        max_length=32,
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["mountPath"],
        },
    )
    """Extra mounts of the engine container, each naming one of volumes."""
    model_cache: ModelCache | None = None
    shm_size: str | None = Field(default=None, max_length=32, pattern=QUANTITY_PATTERN)
    """Size limit of /dev/shm, a memory-backed emptyDir (engines pass tensors between
    processes through it; a container's default is 64Mi). It counts against the pod's memory.
    Unset: no limit but the node's memory."""

    @field_validator("labels")
    @classmethod
    def _labels(cls, labels: dict[str, str]) -> dict[str, str]:
        check_keys(list(labels), OWNED_LABELS)
        return labels

    @field_validator("annotations")
    @classmethod
    def _annotations(cls, annotations: dict[str, str]) -> dict[str, str]:
        check_keys(list(annotations), OWNED_ANNOTATIONS)
        return annotations

    @model_validator(mode="after")
    def _cross_field(self) -> Self:
        names = {v.name for v in self.volumes}
        cache = self.model_cache
        for index, mount in enumerate(self.volume_mounts):
            if mount.name not in names:
                raise Violation(
                    f"volumeMounts[{index}].name", mount.name, "the name of a volume in volumes"
                )
            reserved = (*RESERVED_MOUNT_PATHS, *(() if cache is None else (cache.path,)))
            if mount.mount_path in reserved:
                raise Violation(
                    f"volumeMounts[{index}].mountPath",
                    mount.mount_path,
                    f"a path other than {', '.join(reserved)}",
                    "SpecPilot mounts /dev/shm, its sidecar files and the model cache itself",
                )
        if cache is not None and cache.path in RESERVED_MOUNT_PATHS:
            raise Violation("modelCache.mountPath", cache.path, "a path of its own")
        return self

    def as_dict(self) -> dict[str, Any]:
        """The settings as written (camelCase, unset fields out), fresh containers each call."""
        out = dump(self)
        assert out is not None
        return out
