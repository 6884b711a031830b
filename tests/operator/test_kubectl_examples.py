"""Real kubectl 1.35 against the mock API server: apply the CRD and every example, read them
back with the printer columns, scale through the scale subresource, delete with cascade."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from kube.apiserver import REPO, ApiServer, running_apiserver
from kube.operator_process import running_operator, wait_for

KUBECTL = REPO / ".tools" / "kube" / "kubectl" / "kubectl"
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))
COLUMNS = ["NAME", "ENGINE", "METHOD", "K", "REGIME", "ACCLEN", "BATCH", "READY", "REPLICAS"]
COLUMNS += ["PHASE", "AGE"]

pytestmark = pytest.mark.skipif(not KUBECTL.exists(), reason="make builds .tools/kube (kubectl)")


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    # No CRD preloaded: kubectl installs it, as a user would.
    with running_apiserver(tmp_path_factory.mktemp("kubectl"), crds=[]) as server:
        yield server


def kubectl(api: ApiServer, *args: str) -> str:
    done = subprocess.run(
        [str(KUBECTL), *args], env=api.env(), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, f"kubectl {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_examples_apply_and_show_printer_columns(api: ApiServer, tmp_path: Path) -> None:
    assert len(EXAMPLES) >= 4
    out = kubectl(
        api, "apply", "--validate=false", "-f", str(REPO / "crds" / "specdeployment.yaml")
    )
    assert "customresourcedefinition.apiextensions.k8s.io/specdeployments.specpilot.io" in out
    kubectl(api, "wait", "--for=condition=Established", "crd/specdeployments.specpilot.io")
    out = kubectl(api, "apply", "--validate=false", "-f", str(REPO / "examples"))
    names = [yaml.safe_load(p.read_text())["metadata"]["name"] for p in EXAMPLES]
    for name in names:
        assert f"specdeployment.specpilot.io/{name} created" in out
    # Applying again changes nothing (client-side apply computes an empty patch).
    again = kubectl(api, "apply", "--validate=false", "-f", str(REPO / "examples"))
    assert again.count("unchanged") == len(names)

    with running_operator(api, tmp_path / "operator.log", "--standalone"):
        wait_for(lambda: all(_phase(api, n) for n in names), 30)
        table = kubectl(api, "get", "spd")
        wide = kubectl(api, "get", "spd", "-o", "wide")
    header, *rows = table.strip().splitlines()
    assert header.split() == COLUMNS
    by_name = {row.split()[0]: row.split() for row in rows}
    assert set(by_name) == set(names)
    for name, cells in by_name.items():
        engine = yaml.safe_load((REPO / "examples" / f"{_file(name)}").read_text())["spec"]
        assert cells[1] == engine["engine"]
        assert cells[2] != "<none>" and cells[3].isdigit()  # method and K from status
        assert "Deploying" in cells  # phase: no kubelet here, so no pod is ever ready
        # the Ready column is the Ready condition's status (counted from the right: the
        # columns no tick has filled yet are blank)
        assert cells[-4:-2] == ["False", "0"], cells
    # -o wide adds the engine's endpoint, the Service's name in the cluster
    wide_header, *wide_rows = wide.strip().splitlines()
    assert wide_header.split()[-1] == "URL"
    for row in wide_rows:
        name = row.split()[0]
        assert row.split()[-1] == f"http://{name}.default.svc:8000"


def test_get_by_short_name_yaml_scale_and_delete(api: ApiServer) -> None:
    names = [yaml.safe_load(p.read_text())["metadata"]["name"] for p in EXAMPLES]
    name = names[0]
    body = json.loads(kubectl(api, "get", "spd", name, "-o", "json"))
    assert body["metadata"]["generation"] == 1 and body["metadata"]["uid"]
    assert body["spec"]["tuning"]["intervalSeconds"] >= 5  # the CRD's defaults were applied
    kubectl(api, "scale", "spd", name, "--replicas=3")
    assert json.loads(kubectl(api, "get", "spd", name, "-o", "json"))["spec"]["replicas"] == 3
    assert kubectl(api, "get", "deploy", "-o", "name").count("deployment.apps/") == len(names)
    kubectl(api, "delete", "spd", name, "--wait=false")
    # No operator runs now to remove its finalizer: the object waits, marked for deletion.
    marked = json.loads(kubectl(api, "get", "spd", name, "-o", "json"))
    assert marked["metadata"]["deletionTimestamp"]
    kubectl(api, "patch", "spd", name, "--type=merge", "-p", '{"metadata":{"finalizers":null}}')
    wait_for(lambda: api.get("specpilot.io", "specdeployments", "default", name) is None)
    assert api.get("apps", "deployments", "default", name) is None  # cascaded


def _phase(api: ApiServer, name: str) -> str | None:
    found = api.get("specpilot.io", "specdeployments", "default", name) or {}
    phase: str | None = (found.get("status") or {}).get("phase")
    return phase


def _file(name: str) -> str:
    for path in EXAMPLES:
        if yaml.safe_load(path.read_text())["metadata"]["name"] == name:
            return path.name
    raise KeyError(name)


def test_kubectl_explain_teaches_the_api(api: ApiServer) -> None:
    kubectl(api, "apply", "--validate=false", "-f", str(REPO / "crds" / "specdeployment.yaml"))
    kubectl(api, "wait", "--for=condition=Established", "crd/specdeployments.specpilot.io")
    kubectl(api, "api-resources")  # refreshes kubectl's discovery cache, which predates the CRD
    top = kubectl(api, "explain", "spd")
    assert "KIND:       SpecDeployment" in top and "VERSION:    v1alpha1" in top
    field = kubectl(api, "explain", "spd.spec.tuning.objective")
    assert "FIELD: objective <string>" in field and "goodput" in field and "throughput" in field
    # every field the schema has, kubectl lists, and none without its description
    listing = kubectl(api, "explain", "spd.spec", "--recursive")
    for name in ("speculative", "candidates", "draftModel", "tuning", "tpotP95Ms", "canary"):
        assert f"{name}\t<" in listing, name
    assert "<no description>" not in kubectl(api, "explain", "spd.spec.tuning.slo")


POD_FIELDS = (
    "labels", "annotations", "tolerations", "affinity", "runtimeClassName", "priorityClassName",
    "serviceAccountName", "imagePullSecrets", "securityContext", "containerSecurityContext",
    "volumes", "volumeMounts", "modelCache", "shmSize",
)  # fmt: skip


def test_kubectl_explain_documents_every_engine_pod_setting(api: ApiServer) -> None:
    kubectl(api, "apply", "--validate=false", "-f", str(REPO / "crds" / "specdeployment.yaml"))
    kubectl(api, "wait", "--for=condition=Established", "crd/specdeployments.specpilot.io")
    kubectl(api, "api-resources")  # refreshes kubectl's discovery cache, which predates the CRD
    pod = kubectl(api, "explain", "spd.spec.pod")
    for name in POD_FIELDS:
        assert f"  {name}\t<" in pod, name
        field = kubectl(api, "explain", f"spd.spec.pod.{name}")
        assert "<no description>" not in field.split("DESCRIPTION:", 1)[1].split("FIELDS:")[0], name
    cache = kubectl(api, "explain", "spd.spec.pod.modelCache")
    assert "claimName\t<string>" in cache and "HF_HOME" in cache
    assert "rdma/ib" in kubectl(api, "explain", "spd.spec.resources.extra")
