"""The resource kinds the mock API server knows, built-in and from CustomResourceDefinitions.

Contract: `Kind` is everything the server needs about one resource (discovery names, scope,
subresources, printer columns, schema); `BUILTIN_KINDS` are the built-ins SpecPilot, kopf and
kubectl touch; `kinds_from_crd` reads a CRD object the way the real apiextensions server does
(every served version); `apply_builtin_defaults` fills the defaults a real server writes into
Deployments and Services, so clients that diff desired against live objects meet them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class Kind:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    singular: str = ""
    short_names: tuple[str, ...] = ()
    status: bool = False
    """Has the /status subresource: the main endpoint ignores status, /status ignores the rest."""
    scale: Mapping[str, str] | None = None
    """The /scale subresource's paths (specReplicasPath, statusReplicasPath, labelSelectorPath)."""
    columns: tuple[Mapping[str, Any], ...] = ()
    schema: Mapping[str, Any] | None = field(default=None, compare=False)
    custom: bool = False

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def qualified(self) -> str:
        """`deployments.apps`, `configmaps`: how the server names the resource in messages."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def tracks_generation(self) -> bool:
        # Only kinds whose controllers read metadata.generation have it (not ConfigMaps, ...).
        return self.custom or self.group == "apps"


_DEPLOYMENT_SCALE = {
    "specReplicasPath": ".spec.replicas",
    "statusReplicasPath": ".status.replicas",
    "labelSelectorPath": ".spec.selector",
}

BUILTIN_KINDS: tuple[Kind, ...] = (
    Kind("", "v1", "namespaces", "Namespace", False, "namespace", ("ns",), status=True),
    Kind("", "v1", "pods", "Pod", True, "pod", ("po",), status=True),
    Kind("", "v1", "services", "Service", True, "service", ("svc",), status=True),
    Kind("", "v1", "configmaps", "ConfigMap", True, "configmap", ("cm",)),
    Kind("", "v1", "secrets", "Secret", True, "secret"),
    Kind("", "v1", "events", "Event", True, "event", ("ev",)),
    Kind(
        "apps",
        "v1",
        "deployments",
        "Deployment",
        True,
        "deployment",
        ("deploy",),
        True,
        _DEPLOYMENT_SCALE,
    ),
    Kind("events.k8s.io", "v1", "events", "Event", True, "event", ("ev",)),
    Kind("coordination.k8s.io", "v1", "leases", "Lease", True, "lease"),
    Kind(
        "apiextensions.k8s.io",
        "v1",
        "customresourcedefinitions",
        "CustomResourceDefinition",
        False,
        "customresourcedefinition",
        ("crd", "crds"),
        status=True,
    ),
    # kopf's peering resources, as its own peering CRDs declare them (no status subresource).
    Kind("kopf.dev", "v1", "kopfpeerings", "KopfPeering", True, "kopfpeering", custom=True),
    Kind(
        "kopf.dev",
        "v1",
        "clusterkopfpeerings",
        "ClusterKopfPeering",
        False,
        "clusterkopfpeering",
        custom=True,
    ),
)


def kinds_from_crd(crd: Mapping[str, Any]) -> list[Kind]:
    spec = crd["spec"]
    names = spec["names"]
    kinds = []
    for version in spec.get("versions", []):
        if not version.get("served", True):
            continue
        sub = version.get("subresources") or {}
        kinds.append(
            Kind(
                group=spec["group"],
                version=version["name"],
                plural=names["plural"],
                kind=names["kind"],
                namespaced=spec.get("scope", "Namespaced") == "Namespaced",
                singular=names.get("singular", names["kind"].lower()),
                short_names=tuple(names.get("shortNames", ())),
                status="status" in sub,
                scale=sub.get("scale"),
                columns=tuple(version.get("additionalPrinterColumns", ())),
                schema=(version.get("schema") or {}).get("openAPIV3Schema"),
                custom=True,
            )
        )
    return kinds


def apply_builtin_defaults(kind: Kind, obj: dict[str, Any]) -> None:
    spec = obj.setdefault("spec", {}) if kind.kind in ("Deployment", "Service") else None
    if kind.kind == "Deployment" and spec is not None:
        spec.setdefault("replicas", 1)
        spec.setdefault("revisionHistoryLimit", 10)
        spec.setdefault("progressDeadlineSeconds", 600)
        strategy = spec.setdefault("strategy", {"type": "RollingUpdate"})
        if strategy.get("type", "RollingUpdate") == "RollingUpdate":
            rolling = strategy.setdefault("rollingUpdate", {})
            rolling.setdefault("maxSurge", "25%")
            rolling.setdefault("maxUnavailable", "25%")
        pod = spec.setdefault("template", {}).setdefault("spec", {})
        pod.setdefault("restartPolicy", "Always")
        pod.setdefault("dnsPolicy", "ClusterFirst")
        pod.setdefault("terminationGracePeriodSeconds", 30)
        for container in pod.get("containers", []):
            container.setdefault("imagePullPolicy", "IfNotPresent")
            container.setdefault("terminationMessagePath", "/dev/termination-log")
    elif kind.kind == "Service" and spec is not None:
        spec.setdefault("type", "ClusterIP")
        spec.setdefault("sessionAffinity", "None")
        for port in spec.get("ports", []):
            port.setdefault("protocol", "TCP")
            port.setdefault("targetPort", port.get("port"))
