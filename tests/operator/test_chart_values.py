"""The chart's values as a user sets them, with the real helm: every tested values file passes
`helm lint --strict` and renders objects valid for the oldest Kubernetes the chart supports and
the newest kubernetes-validate knows; values.schema.json refuses bad values with a message
naming them; namespaced mode, the aggregated roles, the CRD upgrade path and NOTES.txt do what
they say."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from crd_validation import admit
from kube.chart import CHART, HELM, allowed_verbs, find, helm

VALUES_FILES = sorted((CHART / "ci").glob("*-values.yaml"))
OLDEST, NEWEST = "1.30.0", kubernetes_validate.utils.latest_version()
CUSTOM_GROUPS = ("kopf.dev/", "monitoring.coreos.com/")
"""Custom resources: the chart's CRDs (kopf.dev) and the Prometheus Operator's, which
test_monitoring_schemas.py validates against that operator's CRD schemas (and promtool checks
the rules in test_monitoring.py)."""

Obj = dict[str, Any]


def render_with(workdir: Path, *args: str) -> list[Obj]:
    out = helm(workdir, "template", "rel", str(CHART), "-n", "specpilot", *args)
    return [doc for doc in yaml.safe_load_all(out) if doc]


def refused(workdir: Path, *sets: str) -> str:
    """helm template's error for values it must refuse."""
    env = {**os.environ, "HOME": str(workdir), "XDG_CACHE_HOME": str(workdir / "cache")}
    args = [arg for value in sets for arg in ("--set", value)]
    done = subprocess.run(
        [str(HELM), "template", "rel", str(CHART), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert done.returncode != 0, f"accepted {sets}"
    return done.stderr


def test_there_are_values_files_for_each_setup() -> None:
    names = {path.name for path in VALUES_FILES}
    assert {"namespaced-values.yaml", "monitoring-values.yaml"} <= names
    assert {"emulator-values.yaml", "gpu-pool-values.yaml"} <= names


@pytest.mark.parametrize("values", VALUES_FILES, ids=lambda v: v.stem)
def test_helm_lint_strict_with_each_values_file(tmp_path: Path, values: Path) -> None:
    out = helm(tmp_path, "lint", "--strict", str(CHART), "-f", str(values))
    assert "0 chart(s) failed" in out


@pytest.mark.parametrize("values", [None, *VALUES_FILES], ids=lambda v: v.stem if v else "default")
def test_rendered_objects_are_valid_for_oldest_and_newest_kubernetes(
    tmp_path: Path, values: Path | None
) -> None:
    docs = render_with(tmp_path, *(["-f", str(values)] if values else []))
    checked = 0
    for doc in docs:
        if doc["apiVersion"].startswith(CUSTOM_GROUPS):
            continue
        for version in (OLDEST, NEWEST):
            kubernetes_validate.validate(doc, version, strict=True)
        checked += 1
    assert checked >= 8


@pytest.mark.parametrize(
    ("value", "named"),
    [
        ("replicaCount=two", "/replicaCount"),
        ("replicaCount=0", "/replicaCount"),
        ("image.pullPolicy=Sometimes", "/image/pullPolicy"),
        ("operator.allNamespaces=false", "/operator/namespaces"),
        ("operator.namespaces={Bad_Name}", "/operator/namespaces/0"),
        ("metrics.port=70000", "/metrics/port"),
        ("prometheus.url=ftp://prometheus", "/prometheus/url"),
        ("prometheus.url=http://user@prometheus", "/prometheus/url"),
        ("prometheus.allowedUrls={http://prom:9090@evil.example}", "/prometheus/allowedUrls/0"),
        ("monitoring.serviceMonitor.interval=often", "/monitoring/serviceMonitor/interval"),
        ("monitoring.rules.realisedGainFraction=2", "/monitoring/rules/realisedGainFraction"),
        # --set passes decimals as strings: those are checked too
        ("monitoring.rules.realisedGainFraction=1.5", "/monitoring/rules/realisedGainFraction"),
        ("monitoring.rules.acceptanceLengthFloor=0.9", "/monitoring/rules/acceptanceLengthFloor"),
        ("monitoring.rules.metricsStaleSeconds=0.0", "/monitoring/rules/metricsStaleSeconds"),
        ("podDisruptionBudget.maxUnavailable=half", "/podDisruptionBudget/maxUnavailable"),
        ("resources.limits.cpu=lots", "/resources/limits/cpu"),
        ("resources.requests.memory=-1Gi", "/resources/requests/memory"),
        ("securityContext.runAsUser=-1", "/securityContext/runAsUser"),
        ("podSecurityContext.runAsNonroot=true", "runAsNonroot"),
        ("podSecurityContext.seccompProfile.type=Off", "/podSecurityContext/seccompProfile/type"),
        ("tolerations[0].operator=Maybe", "/tolerations/0/operator"),
        ("replicaCont=2", "replicaCont"),
    ],
)
def test_schema_refuses_bad_values_naming_them(tmp_path: Path, value: str, named: str) -> None:
    error = refused(tmp_path, value)
    assert "values don't meet the specifications of the schema" in error
    assert named in error, error


def test_security_contexts_and_tolerations_know_every_kubernetes_field() -> None:
    """The schema closes these objects (a misspelt field fails at `helm template`), so it must
    admit every field of the Kubernetes versions the chart supports, no more."""
    schema = json.loads((CHART / "values.schema.json").read_text(encoding="utf-8"))["properties"]
    root = Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema"
    for values_key, kind in [
        ("podSecurityContext", "podsecuritycontext"),
        ("securityContext", "securitycontext"),
    ]:
        known: set[str] = set()
        for version in (OLDEST, NEWEST):
            path = root / f"v{version}-local-strict" / f"{kind}-v1.json"
            known |= set(json.loads(path.read_text(encoding="utf-8"))["properties"])
        assert schema[values_key]["additionalProperties"] is False
        assert set(schema[values_key]["properties"]) == known, values_key
    toleration = schema["tolerations"]["items"]
    path = root / f"v{NEWEST}-local-strict" / "toleration-v1.json"
    newest = json.loads(path.read_text(encoding="utf-8"))["properties"]
    assert set(toleration["properties"]) == set(newest)


def test_namespaced_mode_grants_rights_only_in_its_namespaces(tmp_path: Path) -> None:
    docs = render_with(tmp_path, "-f", str(CHART / "ci" / "namespaced-values.yaml"))
    namespaces = {"llm-prod", "llm-staging"}
    roles = [d for d in docs if d["kind"] == "Role"]
    bindings = [d for d in docs if d["kind"] == "RoleBinding"]
    peerings = [d for d in docs if d["kind"] == "KopfPeering"]
    for objects in (roles, bindings, peerings):
        assert {d["metadata"]["namespace"] for d in objects} == namespaces
        assert len(objects) == len(namespaces)
    assert {d["metadata"]["name"] for d in peerings} == {"specpilot-llm"}
    assert not [d for d in docs if d["kind"] == "ClusterKopfPeering"]
    for role in roles:
        rules = role["rules"]
        assert allowed_verbs(rules, "apps", "deployments") >= {"create", "patch", "delete"}
        assert "create" in allowed_verbs(rules, "kopf.dev", "kopfpeerings")
    # cluster-wide, the operator may only read CRDs (kopf's discovery) and namespaces (kopf
    # matches its --namespace names against them)
    cluster = find(docs, "ClusterRole", "rel-specpilot")["rules"]
    assert [(r["apiGroups"], r["resources"], r["verbs"]) for r in cluster] == [
        (["apiextensions.k8s.io"], ["customresourcedefinitions"], ["list", "watch"]),
        ([""], ["namespaces"], ["list", "watch"]),
    ]
    args = find(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--namespace=llm-prod" in args and "--namespace=llm-staging" in args
    assert "--peering=specpilot-llm" in args


def test_aggregated_roles_give_view_and_edit_users_specdeployments(tmp_path: Path) -> None:
    docs = render_with(tmp_path)
    view = find(docs, "ClusterRole", "rel-specpilot-view")
    edit = find(docs, "ClusterRole", "rel-specpilot-edit")
    assert view["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"] == "true"
    assert edit["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-edit"] == "true"
    assert allowed_verbs(view["rules"], "specpilot.io", "specdeployments") == {
        "get",
        "list",
        "watch",
    }
    assert "delete" in allowed_verbs(edit["rules"], "specpilot.io", "specdeployments")
    assert "patch" in allowed_verbs(edit["rules"], "specpilot.io", "specdeployments/scale")
    # the status is the operator's
    assert not allowed_verbs(edit["rules"], "specpilot.io", "specdeployments/status")
    off = render_with(tmp_path, "--set", "rbac.aggregateRoles=false")
    assert [d["metadata"]["name"] for d in off if d["kind"] == "ClusterRole"] == ["rel-specpilot"]


def test_crds_upgrade_with_the_chart_and_stay_on_uninstall(tmp_path: Path) -> None:
    crds = [d for d in render_with(tmp_path) if d["kind"] == "CustomResourceDefinition"]
    assert {d["metadata"]["name"] for d in crds} == {
        "specdeployments.specpilot.io",
        "clusterkopfpeerings.kopf.dev",
        "kopfpeerings.kopf.dev",
    }
    for crd in crds:
        assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    # templates, not Helm's install-once crds/ folder (which the chart ignores)
    assert "/crds/" in (CHART / ".helmignore").read_text(encoding="utf-8").split()
    off = render_with(tmp_path, "--set", "crds.enabled=false", "--include-crds")
    assert not [d for d in off if d["kind"] == "CustomResourceDefinition"]


def test_peering_objects_are_a_post_install_hook(tmp_path: Path) -> None:
    # on a fresh cluster their CRD comes with the same release: only a hook is created after it
    peering = find(render_with(tmp_path), "ClusterKopfPeering")
    assert peering["metadata"]["annotations"]["helm.sh/hook"] == "post-install"


def test_pod_disruption_budget_keeps_one_operator_up(tmp_path: Path) -> None:
    docs = render_with(tmp_path)
    pdb = find(docs, "PodDisruptionBudget")
    selector = find(docs, "Deployment")["spec"]["selector"]["matchLabels"]
    assert pdb["spec"] == {"maxUnavailable": 1, "selector": {"matchLabels": selector}}
    off = render_with(tmp_path, "--set", "podDisruptionBudget.enabled=false")
    assert not [d for d in off if d["kind"] == "PodDisruptionBudget"]


def test_prometheus_allow_list_defaults_to_the_chart_prometheus(tmp_path: Path) -> None:
    def env(*sets: str) -> dict[str, str]:
        args = [arg for value in sets for arg in ("--set", value)]
        container = find(render_with(tmp_path, *args), "Deployment")["spec"]["template"]["spec"]
        return {e["name"]: e.get("value", "") for e in container["containers"][0]["env"]}

    assert "SPECPILOT_PROMETHEUS_URL_ALLOW" not in env()
    url = "http://prometheus.monitoring.svc:9090"
    assert env(f"prometheus.url={url}")["SPECPILOT_PROMETHEUS_URL_ALLOW"] == url
    allowed = env(f"prometheus.url={url}", "prometheus.allowedUrls={http://a:9090,http://b}")
    assert allowed["SPECPILOT_PROMETHEUS_URL_ALLOW"] == "http://a:9090,http://b"


def test_gpu_pool_values_reach_the_operator_pod(tmp_path: Path) -> None:
    docs = render_with(tmp_path, "-f", str(CHART / "ci" / "gpu-pool-values.yaml"))
    pod = find(docs, "Deployment")["spec"]["template"]["spec"]
    assert pod["priorityClassName"] == "system-cluster-critical"
    assert pod["nodeSelector"] == {"node-pool": "system"}
    assert pod["tolerations"][0]["key"] == "CriticalAddonsOnly"
    assert "nodeAffinity" in pod["affinity"]
    assert pod["topologySpreadConstraints"][0]["topologyKey"] == "topology.kubernetes.io/zone"
    assert pod["imagePullSecrets"] == [{"name": "registry-credentials"}]


def test_notes_are_for_a_chart_user(tmp_path: Path) -> None:
    for args in ([], ["-f", str(CHART / "ci" / "namespaced-values.yaml")]):
        out = helm(tmp_path, "install", "rel", str(CHART), "-n", "llm", "--dry-run=client", *args)
        notes = out.split("NOTES:", 1)[1]
        # nothing from a clone of the repository: the user has only the chart
        for repo_path in ("examples/", "helm/", "crds/", ".yaml"):
            assert repo_path not in notes, repo_path
        assert "kubectl apply -f - <<'YAML'" in notes and "kind: SpecDeployment" in notes
        assert "helm uninstall rel -n llm" in notes
    # the SpecDeployment in the notes is one the chart's CRD accepts
    manifest = notes.split("<<'YAML'\n", 1)[1].split("  YAML\n", 1)[0]
    spd = yaml.safe_load("\n".join(line[2:] for line in manifest.splitlines()))
    _, failures = admit(spd)
    assert failures == []
