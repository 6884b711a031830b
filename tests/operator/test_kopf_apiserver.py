"""The mock API server's realism layer (tests/kube): the behaviours kopf and kubectl rely on."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from kube.apiserver import ApiServer, running_apiserver

CM = "/api/v1/namespaces/default/configmaps"
DEPLOY = "/apis/apps/v1/namespaces/default/deployments"
SPD = "/apis/specpilot.io/v1alpha1/namespaces/default/specdeployments"
MERGE = {"Content-Type": "application/merge-patch+json"}
JSON_PATCH = {"Content-Type": "application/json-patch+json"}


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    with running_apiserver(tmp_path_factory.mktemp("api")) as server:
        yield server


@pytest.fixture
def http(api: ApiServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=api.url, timeout=10) as client:
        yield client


def deployment(name: str, **meta: Any) -> dict[str, Any]:
    labels = {"app": name}
    pod = {"metadata": {"labels": labels}, "spec": {"containers": [{"name": "c", "image": "i"}]}}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, **meta},
        "spec": {"selector": {"matchLabels": labels}, "template": pod},
    }


def test_server_sets_metadata_and_generation_tracks_spec_only(http: httpx.Client) -> None:
    created = http.post(DEPLOY, json=deployment("meta")).json()
    meta = created["metadata"]
    assert meta["uid"] and meta["creationTimestamp"].endswith("Z") and meta["generation"] == 1
    assert created["spec"]["replicas"] == 1  # a server default
    status = {"status": {"replicas": 1}, "spec": {"replicas": 5}}
    after = http.patch(f"{DEPLOY}/meta/status", json=status, headers=MERGE).json()
    assert after["metadata"]["generation"] == 1 and after["spec"]["replicas"] == 1
    assert after["status"] == {"replicas": 1}
    assert int(after["metadata"]["resourceVersion"]) > int(meta["resourceVersion"])
    main = {"spec": {"replicas": 2}, "status": {"replicas": 9}}
    after = http.patch(f"{DEPLOY}/meta", json=main, headers=MERGE).json()
    assert after["metadata"]["generation"] == 2 and after["status"] == {"replicas": 1}
    same = http.patch(f"{DEPLOY}/meta", json={"spec": {"replicas": 2}}, headers=MERGE).json()
    assert same["metadata"]["resourceVersion"] == after["metadata"]["resourceVersion"]


def test_standard_errors(http: httpx.Client) -> None:
    http.post(CM, json={"metadata": {"name": "dup"}})
    cases = [
        (http.post(CM, json={"metadata": {"name": "dup"}}), 409, "AlreadyExists"),
        (http.get(f"{CM}/nothing"), 404, "NotFound"),
        (http.get("/apis/nowhere.io/v1/things"), 404, "NotFound"),
        (http.post("/api/v1/namespaces/absent/configmaps", json={"metadata": {"name": "x"}}),
         404, "NotFound"),
        (http.patch(f"{CM}/dup", content=json.dumps([{"op": "test", "path": "/metadata/name",
                                                        "value": "other"}]), headers=JSON_PATCH),
         422, "Invalid"),
        (http.put(f"{CM}/dup", json={"metadata": {"name": "dup", "resourceVersion": "1"}}),
         409, "Conflict"),
        (http.get(CM, params={"labelSelector": "a in (b"}), 400, "BadRequest"),
    ]  # fmt: skip
    for response, code, reason in cases:
        assert (response.status_code, response.json()["reason"]) == (code, reason), response.text
        assert response.json()["kind"] == "Status"


def test_label_and_field_selectors(http: httpx.Client) -> None:
    for name, tier in (("sel-a", "web"), ("sel-b", "db"), ("sel-c", None)):
        labels = {"tier": tier} if tier else {}
        http.post(CM, json={"metadata": {"name": name, "labels": {"sel": "yes", **labels}}})

    def names(**params: str) -> list[str]:
        items = http.get(CM, params=params).json()["items"]
        return [i["metadata"]["name"] for i in items]

    assert names(labelSelector="sel=yes,tier in (web,db)") == ["sel-a", "sel-b"]
    assert names(labelSelector="sel,!tier") == ["sel-c"]
    assert names(labelSelector="sel=yes,tier!=web") == ["sel-b", "sel-c"]
    assert names(fieldSelector="metadata.name=sel-b") == ["sel-b"]


def test_watch_resumes_from_a_resource_version_and_expires(http: httpx.Client) -> None:
    listed = http.get(CM)
    since = listed.json()["metadata"]["resourceVersion"]
    http.post(CM, json={"metadata": {"name": "w1", "labels": {"w": "1"}}})
    http.delete(f"{CM}/w1")
    params = {"watch": "true", "resourceVersion": since, "timeoutSeconds": "1"}
    watched = http.get(CM, params={**params, "labelSelector": "w=1"})
    assert watched.headers["content-type"].startswith("application/json")
    events = [json.loads(line) for line in watched.text.splitlines() if line.strip()]
    assert [e["type"] for e in events] == ["ADDED", "DELETED"]
    gone = http.get(CM, params={**params, "resourceVersion": "1"}).text.splitlines()
    assert json.loads(gone[0])["object"]["code"] == 410


def test_namespaces_and_discovery(http: httpx.Client) -> None:
    names = [n["metadata"]["name"] for n in http.get("/api/v1/namespaces").json()["items"]]
    assert "default" in names
    assert http.post("/api/v1/namespaces", json={"metadata": {"name": "extra"}}).status_code == 201
    assert http.get("/api/v1/namespaces/extra").json()["status"]["phase"] == "Active"
    core = {r["name"] for r in http.get("/api/v1").json()["resources"]}
    assert {"namespaces", "services", "configmaps", "events", "pods"} <= core
    groups = {g["name"] for g in http.get("/apis").json()["groups"]}
    assert {"apps", "coordination.k8s.io", "apiextensions.k8s.io", "kopf.dev"} <= groups
    spd = {r["name"]: r for r in http.get("/apis/specpilot.io/v1alpha1").json()["resources"]}
    assert spd["specdeployments"]["shortNames"] == ["spd"]
    assert {"specdeployments/status", "specdeployments/scale"} <= set(spd)


def test_owner_references_cascade_and_finalizers_hold(http: httpx.Client) -> None:
    owner = http.post(CM, json={"metadata": {"name": "owner", "finalizers": ["x/y"]}}).json()
    ref = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "name": "owner",
        "uid": owner["metadata"]["uid"],
    }
    http.post(CM, json={"metadata": {"name": "child", "ownerReferences": [ref]}})
    held = http.delete(f"{CM}/owner").json()
    assert held["metadata"]["deletionTimestamp"]
    assert http.get(f"{CM}/child").status_code == 200
    http.patch(f"{CM}/owner", json={"metadata": {"finalizers": None}}, headers=MERGE)
    assert http.get(f"{CM}/owner").status_code == 404
    assert http.get(f"{CM}/child").status_code == 404


def test_custom_resources_are_defaulted_pruned_and_validated(http: httpx.Client) -> None:
    body = {
        "apiVersion": "specpilot.io/v1alpha1",
        "kind": "SpecDeployment",
        "metadata": {"name": "schema"},
        "spec": {"engine": "vllm", "model": "m", "unknownField": 1},
        "status": {"phase": "Running"},
    }
    created = http.post(SPD, json=body).json()
    assert "unknownField" not in created["spec"]
    assert created["spec"]["tuning"]["mode"] == "auto"  # the CRD's default
    assert "status" not in created  # status is its subresource's business
    bad = http.patch(f"{SPD}/schema", json={"spec": {"replicas": -1}}, headers=MERGE)
    assert bad.status_code == 422 and "spec.replicas" in bad.json()["message"]
    scale = http.patch(f"{SPD}/schema/scale", json={"spec": {"replicas": 2}}, headers=MERGE)
    assert scale.json()["kind"] == "Scale" and scale.json()["spec"]["replicas"] == 2
    assert http.get(f"{SPD}/schema").json()["metadata"]["generation"] == 2


def test_server_side_table_for_printer_columns(http: httpx.Client, api: ApiServer) -> None:
    accept = {"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"}
    table = http.get(SPD, headers=accept).json()
    assert table["kind"] == "Table"
    columns = [c["name"] for c in table["columnDefinitions"]]
    assert columns[:3] == ["Name", "Engine", "Method"] and "Age" in columns
    # the server sends every column; kubectl shows those of priority 0 unless -o wide
    priority = {c["name"]: c.get("priority", 0) for c in table["columnDefinitions"]}
    assert priority["URL"] == 1 and priority["Age"] == priority["Ready"] == 0


def test_kubeconfig_is_usable(api: ApiServer) -> None:
    assert Path(api.kubeconfig).read_text().count(api.url) == 1
