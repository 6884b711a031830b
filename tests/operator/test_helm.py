"""The Helm chart with the real helm (4.1, from `make`'s .tools/kube): lint, render, and the
rendered objects valid for Kubernetes 1.35; the CRD it ships is the repository's. Values files,
the schema, namespaced mode and RBAC: test_chart_values.py; monitoring: test_monitoring.py."""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from crd_validation import CRD_PATH
from kube.chart import CHART, allowed_verbs, find, helm, render

K8S_VERSION = "1.35.0"


def test_chart_crd_is_the_repository_crd() -> None:
    # templates/crds.yaml renders files/crds/, whose SpecDeployment CRD is the generated one
    assert (CHART / "files" / "crds" / "specdeployment.yaml").read_bytes() == CRD_PATH.read_bytes()


def test_helm_lint(tmp_path: Path) -> None:
    helm(tmp_path, "lint", "--strict", str(CHART))


def test_rendered_objects_are_valid_kubernetes_objects(tmp_path: Path) -> None:
    docs = render(tmp_path)
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == sorted(
        ["CustomResourceDefinition"] * 3
        + ["ClusterKopfPeering", "ClusterRole", "ClusterRoleBinding", "Deployment"]
        + ["Service", "ServiceAccount", "PodDisruptionBudget"]
        + ["ClusterRole"] * 2  # aggregated into view and edit
    )
    for doc in docs:
        if doc["apiVersion"].startswith("kopf.dev/"):
            continue  # a custom resource; its CRD is in the chart
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    crd = find(docs, "CustomResourceDefinition", "specdeployments.specpilot.io")
    generated = yaml.safe_load(CRD_PATH.read_text(encoding="utf-8"))
    # the chart adds its labels and keeps the CRD on uninstall; the rest is the generated CRD
    assert crd["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    assert crd["metadata"]["labels"].items() >= generated["metadata"]["labels"].items()
    assert {**crd, "metadata": generated["metadata"]} == generated


def test_operator_deployment(tmp_path: Path) -> None:
    docs = render(tmp_path)
    deployment = find(docs, "Deployment")
    assert deployment["spec"]["replicas"] == 2
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["command"] == ["specpilot", "operator"]
    assert "--liveness=http://0.0.0.0:8080/healthz" in container["args"]
    assert "--peering=specpilot" in container["args"] and "--all-namespaces" in container["args"]
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "health"}
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"health": 8080, "metrics": 9090}
    assert container["env"][0]["name"] == "POD_ID"
    assert pod["serviceAccountName"] == find(docs, "ServiceAccount")["metadata"]["name"]
    service = find(docs, "Service")
    assert (
        service["spec"]["selector"].items() <= deployment["spec"]["selector"]["matchLabels"].items()
    )
    assert find(docs, "ClusterKopfPeering")["metadata"]["name"] == "specpilot"


def test_cluster_role_grants_what_the_operator_does(tmp_path: Path) -> None:
    docs = render(tmp_path)
    rules = find(docs, "ClusterRole", "rel-specpilot")["rules"]
    # (test_rbac_least_privilege.py derives these from what the operator does)
    expected = {
        ("specpilot.io", "specdeployments"): {"get", "list", "watch", "patch"},
        ("specpilot.io", "specdeployments/status"): {"patch"},
        ("kopf.dev", "clusterkopfpeerings"): {"get", "list", "watch", "patch", "create"},
        ("kopf.dev", "kopfpeerings"): set(),
        ("apiextensions.k8s.io", "customresourcedefinitions"): {"list", "watch"},
        ("", "namespaces"): set(),
        ("", "events"): {"create", "get", "patch"},
        ("apps", "deployments"): {"get", "create", "patch", "delete"},
        ("", "services"): {"get", "create", "patch"},
        ("", "configmaps"): {"get", "list", "create", "patch", "delete"},
        ("", "pods"): {"list"},
        ("monitoring.coreos.com", "podmonitors"): {"get", "create", "patch"},
    }
    for (group, resource), verbs in expected.items():
        assert allowed_verbs(rules, group, resource) == verbs, (group, resource)
    assert all("*" not in r["verbs"] and "*" not in r["resources"] for r in rules)
    binding = find(docs, "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == "rel-specpilot"


@pytest.mark.parametrize("count", [1, 3])
def test_values_change_what_they_say(tmp_path: Path, count: int) -> None:
    docs = render(
        tmp_path,
        f"replicaCount={count}",
        "operator.allNamespaces=false",
        "operator.namespaces={llm,batch}",
    )
    deployment = find(docs, "Deployment")
    assert deployment["spec"]["replicas"] == count
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--namespace=llm" in args and "--namespace=batch" in args
    assert "--all-namespaces" not in args
    assert not [d for d in docs if d["kind"] == "ClusterKopfPeering"]
