"""How the mock API server presents objects besides as themselves: discovery lists, the
autoscaling/v1 Scale of a scale subresource, the server-side Table kubectl prints, and the
OpenAPI v3 documents of custom resources (what `kubectl explain` reads).

Contract: pure functions over `catalog.Kind` values and stored objects, shaped as a real API
server answers (kubectl reads printer columns only from a server-side Table: a CRD's
additionalPrinterColumns, else Name and Age; date columns come as kubectl's short ages).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from kube import objects
from kube.catalog import Kind

Obj = dict[str, Any]
VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
AGE = {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}


def api_resource_list(kinds: Sequence[Kind]) -> Obj:
    """One group/version's APIResourceList: subresources carry no short names (KMock's do,
    and kubectl then refuses the short names as ambiguous)."""
    resources: list[Obj] = []
    for kind in sorted(kinds, key=lambda k: k.plural):
        resources.append(
            {"name": kind.plural, "singularName": kind.singular, "namespaced": kind.namespaced,
             "kind": kind.kind, "shortNames": list(kind.short_names), "verbs": VERBS}
        )  # fmt: skip
        for sub, on in (("status", kind.status), ("scale", kind.scale)):
            if on:
                entry: Obj = {"name": f"{kind.plural}/{sub}", "singularName": "",
                              "namespaced": kind.namespaced, "verbs": ["get", "patch", "update"],
                              "kind": kind.kind}  # fmt: skip
                if sub == "scale":
                    entry.update(kind="Scale", group="autoscaling", version="v1")
                resources.append(entry)
    return {"apiVersion": "v1", "kind": "APIResourceList",
            "groupVersion": kinds[0].api_version, "resources": resources}  # fmt: skip


def scale(paths: Mapping[str, str], obj: Obj) -> Obj:
    selector = objects.get_path(obj, paths.get("labelSelectorPath", "")) or ""
    if isinstance(selector, Mapping):  # a Deployment's spec.selector, rendered as a string
        selector = ",".join(f"{k}={v}" for k, v in selector.get("matchLabels", {}).items())
    kept = ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
    meta = {k: obj["metadata"][k] for k in kept if k in obj["metadata"]}
    return {
        "apiVersion": "autoscaling/v1", "kind": "Scale", "metadata": meta,
        "spec": {"replicas": objects.get_path(obj, paths["specReplicasPath"]) or 0},
        "status": {"replicas": objects.get_path(obj, paths["statusReplicasPath"]) or 0,
                   "selector": selector},
    }  # fmt: skip


def table(columns: Sequence[Mapping[str, Any]], items: Sequence[Obj], resource_version: int) -> Obj:
    shown = list(columns) or [AGE]
    name = {"name": "Name", "type": "string", "format": "name", "priority": 0,
            "description": "Name must be unique within a namespace."}  # fmt: skip
    definitions: list[Obj] = [name]
    definitions += [
        {"name": c["name"], "type": c.get("type", "string"), "format": c.get("format", ""),
         "description": c.get("description", ""), "priority": c.get("priority", 0)}
        for c in shown
    ]  # fmt: skip
    rows = []
    for obj in items:
        cells: list[Any] = [obj["metadata"]["name"]]
        for column in shown:
            value = objects.get_path(obj, column["jsonPath"])
            cells.append(objects.human_age(value) if column.get("type") == "date" else value)
        partial = {"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
                   "metadata": obj["metadata"]}  # fmt: skip
        rows.append({"cells": cells, "object": partial})
    return {"apiVersion": "meta.k8s.io/v1", "kind": "Table",
            "metadata": {"resourceVersion": str(resource_version)},
            "columnDefinitions": definitions, "rows": rows}  # fmt: skip


def openapi_v3_index(kinds: list[Kind]) -> Obj:
    """`/openapi/v3`: one path per group/version that has custom resources (built-in kinds
    carry no schema here), each with a content hash, as kubectl's OpenAPI v3 client expects."""
    paths: Obj = {}
    for group, version in sorted({(k.group, k.version) for k in kinds if k.schema}):
        document = openapi_v3_document(
            [k for k in kinds if (k.group, k.version) == (group, version)]
        )
        digest = hashlib.sha256(json.dumps(document, sort_keys=True).encode()).hexdigest()
        paths[f"apis/{group}/{version}"] = {
            "serverRelativeURL": f"/openapi/v3/apis/{group}/{version}?hash={digest[:32]}"
        }
    return {"paths": paths}


def openapi_v3_document(kinds: list[Kind]) -> Obj:
    """One group/version's OpenAPI v3 document: each kind's CRD schema under the name a real
    server gives it (reversed group, version, kind), tagged with its group-version-kind, which
    is how `kubectl explain` finds it."""
    schemas: Obj = {}
    paths: Obj = {}
    for kind in kinds:
        if not kind.schema:
            continue
        gvk = {"group": kind.group, "version": kind.version, "kind": kind.kind}
        reversed_group = ".".join(reversed(kind.group.split(".")))
        name = f"{reversed_group}.{kind.version}.{kind.kind}"
        schemas[name] = {**kind.schema, "x-kubernetes-group-version-kind": [gvk]}
        # kubectl explain maps the resource to its kind through the read operation's path
        scope = "namespaces/{namespace}/" if kind.namespaced else ""
        content = {"application/json": {"schema": {"$ref": f"#/components/schemas/{name}"}}}
        paths[f"/apis/{kind.group}/{kind.version}/{scope}{kind.plural}/{{name}}"] = {
            "get": {
                "x-kubernetes-group-version-kind": gvk,
                "responses": {"200": {"description": "OK", "content": content}},
            }
        }
    return {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.35.0-kmock"},
        "paths": paths,
        "components": {"schemas": schemas},
    }
