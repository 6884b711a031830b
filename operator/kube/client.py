"""The operator's one Kubernetes client layer: plain dicts over REST.

Contract: `KubeRest` reads, lists, creates, patches (merge or JSON patch, main object or a
subresource) and deletes any object by apiVersion and plural, asks discovery whether a
resource is served, and posts Events aggregated the way client-go does (the same reason and
message on the same object bump `count` and `lastTimestamp` instead of piling up). On top of
those it has the few Deployment-level calls the actuator makes (its `DeploymentApi`
interface, operator/kube/actuator.py): read, create, template-replace, scale and delete a
Deployment, create a content-named ConfigMap when missing, list pods by label. The pod
template is replaced with a JSON patch (`replace /spec/template`), so a field the new template
drops is really gone (a merge patch would keep it) and `spec.replicas` is not written with it;
`set_replicas` writes it only for a canary taking one replica's place, where the
SpecDeployment sets the count (never where an autoscaler owns it).

It is the official `kubernetes` client's ApiClient used for transport and authentication only
(raw JSON, no model classes). A missing object reads as None and deleting one is not an error;
a write that lost a race (409, 422 from a JSON-patch `test`) is `KubeConflict`; a transient one
(429, 5xx, a timeout or a broken connection) is `KubeTransient`; every other failure is
`KubeApiError`; each names the call and the server's message.
"""

from __future__ import annotations

import builtins
import datetime
import hashlib
import json
from collections.abc import Mapping
from typing import Any, Literal

import urllib3
from kubernetes import client, config

from specpilot.operator.api.names import CANARY_SLOT_ANNOTATION, COMPONENT, KIND, PLURAL

Obj = dict[str, Any]
PatchKind = Literal["merge", "json"]

PLURALS: Mapping[str, str] = {
    "ClusterKopfPeering": "clusterkopfpeerings",
    "KopfPeering": "kopfpeerings",
    "ConfigMap": "configmaps",
    "Deployment": "deployments",
    "Event": "events",
    "PodMonitor": "podmonitors",
    "Service": "services",
    "ServiceMonitor": "servicemonitors",
    KIND: PLURAL,
}


class KubeApiError(RuntimeError):
    """A Kubernetes API call failed."""


class KubeConflict(KubeApiError):
    """The object changed under us (409 Conflict, or a JSON-patch test failed: 422)."""


class KubeTransient(KubeApiError):
    """A failure that says nothing about the request: 429, a 5xx, a timeout, a connection
    refused or reset. The same call may well succeed a moment later (operator/kube/retry.py)."""


TRANSIENT_STATUSES = frozenset({429, 500, 502, 503, 504})


def plural_of(obj: Mapping[str, Any]) -> str:
    return PLURALS[str(obj["kind"])]


def label_selector(labels: Mapping[str, str]) -> str:
    return ",".join(f"{key}={value}" for key, value in sorted(labels.items()))


def now_iso() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class KubeRest:
    def __init__(self, api_client: client.ApiClient, *, timeout_s: float = 30.0) -> None:
        self._client = api_client
        self._timeout = timeout_s

    @classmethod
    def from_config(cls, kubeconfig: str | None = None) -> KubeRest:
        if kubeconfig is None:
            try:
                config.load_incluster_config()  # type: ignore[no-untyped-call]
                return cls(client.ApiClient())
            except config.ConfigException:
                pass  # not in a pod: the kubeconfig, as kubectl does
        return cls(config.new_client_from_config(config_file=kubeconfig))  # type: ignore[no-untyped-call]

    @staticmethod
    def path(
        api_version: str,
        plural: str,
        namespace: str | None,
        name: str | None = None,
        sub: str | None = None,
    ) -> str:
        prefix = f"/apis/{api_version}" if "/" in api_version else f"/api/{api_version}"
        parts = [prefix]
        if namespace:
            parts.append(f"namespaces/{namespace}")
        parts.append(plural)
        parts += [p for p in (name, sub) if p]
        return "/".join(parts)

    def get(self, api_version: str, plural: str, namespace: str | None, name: str) -> Obj | None:
        return self._call("GET", self.path(api_version, plural, namespace, name), missing_ok=True)

    def list(
        self, api_version: str, plural: str, namespace: str | None, selector: str = ""
    ) -> builtins.list[Obj]:
        query = [("labelSelector", selector)] if selector else []
        found = self._call("GET", self.path(api_version, plural, namespace), query=query)
        items: list[Obj] = (found or {}).get("items") or []
        return items

    def create(self, obj: Mapping[str, Any]) -> Obj:
        namespace = obj["metadata"].get("namespace")
        created = self._call("POST", self.path(obj["apiVersion"], plural_of(obj), namespace), obj)
        return created or {}

    def patch(
        self,
        api_version: str,
        plural: str,
        namespace: str | None,
        name: str,
        patch: Any,
        *,
        kind: PatchKind = "merge",
        sub: str | None = None,
    ) -> Obj | None:
        content_type = f"application/{'merge-patch' if kind == 'merge' else 'json-patch'}+json"
        path = self.path(api_version, plural, namespace, name, sub)
        return self._call("PATCH", path, patch, content_type=content_type, missing_ok=True)

    def delete(self, api_version: str, plural: str, namespace: str | None, name: str) -> None:
        self._call("DELETE", self.path(api_version, plural, namespace, name), missing_ok=True)

    def serves(self, api_version: str, plural: str) -> bool:
        prefix = f"/apis/{api_version}" if "/" in api_version else f"/api/{api_version}"
        found = self._call("GET", prefix, missing_ok=True) or {}
        return any(r.get("name") == plural for r in found.get("resources", []))

    def post_event(
        self, involved: Mapping[str, Any], event_type: str, reason: str, message: str
    ) -> None:
        """A core/v1 Event on `involved`; a repeat of the same one is counted, not duplicated
        (create; on AlreadyExists, read the count and patch it: RBAC create, get, patch)."""
        meta = involved["metadata"]
        namespace = meta.get("namespace") or "default"
        digest = hashlib.sha256(f"{meta.get('uid')}/{reason}/{message}".encode()).hexdigest()
        name = f"{meta['name']}.{digest[:12]}"
        now = now_iso()
        ref = {
            "apiVersion": involved.get("apiVersion"),
            "kind": involved.get("kind"),
            "name": meta["name"],
            "namespace": namespace,
            "uid": meta.get("uid"),
        }
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": namespace},
            "involvedObject": ref,
            "type": event_type,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": COMPONENT},
            "reportingComponent": COMPONENT,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            self.create(event)
        except KubeConflict:  # the same Event before: count it
            live = self.get("v1", "events", namespace, name) or {}
            bump = {"count": int(live.get("count", 1)) + 1, "lastTimestamp": now}
            self.patch("v1", "events", namespace, name, bump)

    # The actuator's Deployment-level calls (actuator.DeploymentApi).

    def read_deployment(self, namespace: str, name: str) -> Obj | None:
        return self.get("apps/v1", "deployments", namespace, name)

    def create_deployment(self, namespace: str, body: Obj) -> Obj:
        return self.create({**body, "metadata": {**body["metadata"], "namespace": namespace}})

    def replace_template(self, namespace: str, name: str, template: Obj) -> Obj:
        patch = [{"op": "replace", "path": "/spec/template", "value": template}]
        patched = self.patch("apps/v1", "deployments", namespace, name, patch, kind="json")
        if patched is None:
            raise KubeApiError(f"patch Deployment {namespace}/{name}: not found")
        return patched

    def delete_deployment(self, namespace: str, name: str) -> None:
        self.delete("apps/v1", "deployments", namespace, name)

    def set_replicas(self, namespace: str, name: str, replicas: int, held: int | None) -> None:
        held_value = None if held is None else str(held)  # None deletes it (merge patch)
        patch = {
            "metadata": {"annotations": {CANARY_SLOT_ANNOTATION: held_value}},
            "spec": {"replicas": replicas},
        }
        if self.patch("apps/v1", "deployments", namespace, name, patch) is None:
            raise KubeApiError(f"scale Deployment {namespace}/{name}: not found")

    def ensure_config_map(self, namespace: str, body: Obj) -> None:
        name = body["metadata"]["name"]
        if self.get("v1", "configmaps", namespace, name) is None:
            self.create({**body, "metadata": {**body["metadata"], "namespace": namespace}})

    def list_pods(self, namespace: str, selector: Mapping[str, str]) -> builtins.list[Obj]:
        return self.list("v1", "pods", namespace, label_selector(selector))

    def service_selector(self, namespace: str, name: str) -> dict[str, str] | None:
        live = self.get("v1", "services", namespace, name)
        return None if live is None else dict((live.get("spec") or {}).get("selector") or {})

    def set_service_selector(self, namespace: str, name: str, selector: Mapping[str, str]) -> None:
        # replaced whole: a merge patch would keep a key the new selector drops
        patch = [{"op": "replace", "path": "/spec/selector", "value": dict(selector)}]
        if self.patch("v1", "services", namespace, name, patch, kind="json") is None:
            raise KubeApiError(f"route Service {namespace}/{name}: not found")

    def _call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        query: builtins.list[tuple[str, str]] | None = None,
        content_type: str = "application/json",
        missing_ok: bool = False,
    ) -> Obj | None:
        what = f"{method} {path}"
        headers = {"Accept": "application/json", "Content-Type": content_type}
        try:
            request = self._client.param_serialize(
                method, path, query_params=query or [], header_params=headers, body=body,
                auth_settings=["BearerToken"],
            )  # fmt: skip
            response = self._client.call_api(*request, _request_timeout=self._timeout)
            data = response.read()  # type: ignore[no-untyped-call]
        except (OSError, urllib3.exceptions.HTTPError) as exc:
            raise KubeTransient(f"{what}: {exc}") from exc
        if response.status == 404 and missing_ok:
            return None
        if response.status == 409 or (response.status == 422 and method == "PATCH"):
            raise KubeConflict(f"{what}: HTTP {response.status}: {_message(data)}")
        if response.status in TRANSIENT_STATUSES:
            raise KubeTransient(f"{what}: HTTP {response.status}: {_message(data)}")
        if not 200 <= response.status < 300:
            raise KubeApiError(f"{what}: HTTP {response.status}: {_message(data)}")
        if not data:
            return {}
        decoded: Obj = json.loads(data)
        return decoded


def _message(data: bytes | None) -> str:
    try:
        return str(json.loads(data or b"{}").get("message", data))
    except ValueError:
        return repr(data)[:300]
