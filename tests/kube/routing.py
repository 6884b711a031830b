"""Reading a request to the mock API server: its route, body, headers, selectors and patches.

Contract: `parse_route` maps a resource URL (`/api/v1/...`, `/apis/g/v/...`, namespaced or
not, with a subresource) to a `Route`, telling a Namespace's own URLs from a namespace's
resources; every failure is a `kmock.KubernetesError` carrying a standard Status reason
(`error()`), which KMock renders as the Status body a client expects.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import kmock

from kube import objects

Obj = dict[str, Any]


def error(code: int, reason: str, message: str, **details: Any) -> kmock.KubernetesError:
    return kmock.KubernetesError(status=code, reason=reason, message=message, details=details)


@dataclass(frozen=True, slots=True)
class Route:
    group: str
    version: str
    plural: str
    namespace: str | None
    name: str | None
    sub: str | None


def parse_route(path: str) -> Route | None:
    parts = path.strip("/").split("/")
    if parts[:1] == ["api"] and len(parts) >= 3:
        group, version, rest = "", parts[1], parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 4:
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return None
    namespace = None
    # /namespaces/{ns}/{plural}...; but /namespaces/{name}[/status] is a Namespace itself.
    if rest[0] == "namespaces" and len(rest) >= 3 and rest[2] not in ("status", "finalize"):
        namespace, rest = rest[1], rest[2:]
    rest += [None, None]  # type: ignore[list-item]
    return Route(group, version, rest[0], namespace, rest[1], rest[2])


def selector_filter(
    namespace: str | None, params: Mapping[str, str], name: str | None = None
) -> Callable[[Obj], bool]:
    labels, fields = params.get("labelSelector"), params.get("fieldSelector")
    try:  # parse once, now, so a bad selector is a 400 and not a broken stream
        objects.match_labels(labels, {})
        objects.match_fields(fields, {})
    except objects.SelectorError as exc:
        raise error(400, "BadRequest", str(exc)) from None

    def accepts(obj: Obj) -> bool:
        meta = obj.get("metadata", {})
        return (
            (namespace is None or meta.get("namespace") == namespace)
            and (name is None or meta.get("name") == name)
            and objects.match_labels(labels, meta.get("labels"))
            and objects.match_fields(fields, obj)
        )

    return accepts


def json_patch(old: Obj, ops: Any) -> Obj:
    if not isinstance(ops, list):
        raise error(400, "BadRequest", "a JSON patch must be a list of operations")
    try:
        return objects.json_patch(old, ops)
    except objects.PatchTestFailed as exc:  # kopf reads 422 as "retry on the next cycle"
        raise error(422, "Invalid", f"the server rejected our request: {exc}") from None
    except ValueError as exc:
        raise error(422, "Invalid", f"the server rejected our request: {exc}") from None


def body_json(request: kmock.Request, default: Any = None) -> Any:
    if not request.body:
        if default is not None:
            return default
        raise error(400, "BadRequest", "the request has no body")
    try:
        return json.loads(request.body)
    except ValueError as exc:
        raise error(400, "BadRequest", f"the body is not JSON: {exc}") from None


def header(request: kmock.Request, name: str) -> str:
    return next((v for k, v in request.headers.items() if k.lower() == name.lower()), "")
