"""The few Kubernetes calls the actuator makes, as plain dicts, behind one small interface.

Contract: `KubeApi` is what `KubeActuator` needs from a cluster: read, create, template-patch
and delete a Deployment, create a (content-named, immutable) ConfigMap when missing, and list
pods by label. `RestKubeApi` implements it over `KubeRest` (operator/kube/client.py, the
official client used for transport and authentication only). A missing object reads as None
and deleting one is not an error; other API failures are `KubeApiError` naming the call. The
pod template is replaced with a JSON patch (`replace /spec/template`), so a field the new
template drops is really gone (a merge patch would keep it) and `spec.replicas`, owned by the
user or an autoscaler, is never written.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from specpilot.operator.kube.client import KubeRest

Obj = dict[str, Any]


class KubeApiError(RuntimeError):
    """A Kubernetes API call failed."""


class KubeApi(Protocol):
    def read_deployment(self, namespace: str, name: str) -> Obj | None: ...

    def create_deployment(self, namespace: str, body: Obj) -> Obj: ...

    def replace_template(self, namespace: str, name: str, template: Obj) -> Obj:
        """Replace `spec.template` only."""

    def delete_deployment(self, namespace: str, name: str) -> None: ...

    def ensure_config_map(self, namespace: str, body: Obj) -> None:
        """Create the ConfigMap unless one of that name exists (its name hashes its content)."""

    def list_pods(self, namespace: str, selector: Mapping[str, str]) -> list[Obj]: ...


def label_selector(labels: Mapping[str, str]) -> str:
    return ",".join(f"{key}={value}" for key, value in sorted(labels.items()))


class RestKubeApi:
    """`KubeApi` over `KubeRest`."""

    def __init__(self, rest: KubeRest) -> None:
        self._rest = rest

    def read_deployment(self, namespace: str, name: str) -> Obj | None:
        return self._rest.get("apps/v1", "deployments", namespace, name)

    def create_deployment(self, namespace: str, body: Obj) -> Obj:
        return self._rest.create({**body, "metadata": {**body["metadata"], "namespace": namespace}})

    def replace_template(self, namespace: str, name: str, template: Obj) -> Obj:
        patch = [{"op": "replace", "path": "/spec/template", "value": template}]
        patched = self._rest.patch("apps/v1", "deployments", namespace, name, patch, kind="json")
        if patched is None:
            raise KubeApiError(f"patch Deployment {namespace}/{name}: not found")
        return patched

    def delete_deployment(self, namespace: str, name: str) -> None:
        self._rest.delete("apps/v1", "deployments", namespace, name)

    def ensure_config_map(self, namespace: str, body: Obj) -> None:
        name = body["metadata"]["name"]
        if self._rest.get("v1", "configmaps", namespace, name) is None:
            self._rest.create({**body, "metadata": {**body["metadata"], "namespace": namespace}})

    def list_pods(self, namespace: str, selector: Mapping[str, str]) -> list[Obj]:
        return self._rest.list("v1", "pods", namespace, label_selector(selector))
