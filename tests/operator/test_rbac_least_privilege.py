"""RBAC least privilege, derived: every verb the Helm chart's roles grant the operator is one
the operator uses, and it uses none they do not grant.

What the operator uses is recorded, not listed by hand: the mock API server (tests/kube, a
MOCK) logs every request the operator's account makes (`api.grants()`) while the real
`specpilot operator` process (kopf with peering, the handlers) serves a SpecDeployment through
its life (create, an edit that patches every child and prunes a stale sidecar ConfigMap,
deletion), and while the tuning daemon's `tune()` switches a config through the real
`KubeActuator` and posts a repeated Event, on that same account. Both install modes are
checked: cluster-wide (one ClusterRole) and namespaced (a Role per namespace plus the
cluster-wide reading of CRDs). A verb granted and never used fails, as does one used and not
granted (a 403 the mock answers, listed in `api.denials()`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import yaml
from kube.apiserver import REPO, ApiServer, default_crds, running_apiserver
from kube.chart import render
from kube.operator_process import running_operator, wait_for
from tuning_helpers import Controller, busy, create, later, real_rollouts
from tuning_helpers import spd as spd_of

from specpilot.operator.api.names import INSTANCE_LABEL, SIDECAR_LABEL
from specpilot.operator.kube.client import KubeRest
from specpilot.operator.kube.reconcile import reconcile
from specpilot.operator.kube.status import post_event
from specpilot.operator.kube.tuning_daemon import tune
from specpilot.tuner import SpecConfig

Grant = tuple[str, str, str]  # (verb, group, resource)
SPD = "/apis/specpilot.io/v1alpha1/namespaces/default/specdeployments"
MONITORS = REPO / "tests" / "kube" / "crds" / "prometheus-operator-monitors.yaml"
MERGE = {"Content-Type": "application/merge-patch+json"}


def granted(rules: list[dict[str, Any]]) -> set[Grant]:
    return {
        (verb, group, resource)
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def used(api: ApiServer) -> set[Grant]:
    out: set[Grant] = set()
    for line in api.grants():
        verb, _, where = line.partition(" ")
        group, _, resource = where.partition("/")
        out.add((verb, group, resource))
    return out


def operator_roles(workdir: Path, *values: str) -> list[dict[str, Any]]:
    """The rules of the chart's ClusterRole and Roles bound to the operator (not the
    aggregated view/edit roles it renders for users)."""
    docs = render(workdir, *values)
    roles = [
        d
        for d in docs
        if d["kind"] in ("ClusterRole", "Role")
        and not d["metadata"]["name"].endswith(("-view", "-edit"))
    ]
    return [rule for role in roles for rule in role.get("rules") or []]


INLINE = "inline-s3cr3t-written-in-the-spec"
"""An env value written in the spec: it reaches the engine pod, and no log or annotation."""


def spd_body(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "specpilot.io/v1alpha1",
        "kind": "SpecDeployment",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "engine": "vllm",
            "model": "m",
            "env": [{"name": "HF_TOKEN", "value": INLINE}],
            "speculative": {"candidates": [{"method": "ngram", "maxK": 3}]},
        },
    }


def serve_one_through_its_life(api: ApiServer, workdir: Path, *flags: str) -> None:
    """The operator process creates, edits and lets go of one SpecDeployment."""
    with (
        httpx.Client(base_url=api.url, timeout=10) as http,
        running_operator(api, workdir / "operator.log", *flags) as operator,
    ):
        assert http.post(SPD, json=spd_body("life")).status_code == 201
        wait_for(lambda: api.get("apps", "deployments", "default", "life"), 60)
        wait_for(lambda: (spd_of(api, "life").get("status") or {}).get("phase"), 60)
        (engine,) = api.get("apps", "deployments", "default", "life")["spec"]["template"]["spec"][
            "containers"
        ]
        assert {"name": "HF_TOKEN", "value": INLINE} in engine["env"]
        assert INLINE not in json.dumps(spd_of(api, "life")["metadata"])  # kopf's annotations
        # a sidecar ConfigMap no Deployment mounts any more: the next reconcile prunes it
        labels = {SIDECAR_LABEL: "true", INSTANCE_LABEL: "life"}
        stale = {"apiVersion": "v1", "kind": "ConfigMap",
                 "metadata": {"name": "life-stale", "labels": labels}}  # fmt: skip
        assert http.post("/api/v1/namespaces/default/configmaps", json=stale).status_code == 201
        # an edit every child follows: the engine label changes on each, the port on some
        edit = {"spec": {"engine": "sglang", "port": 9000}}
        assert http.patch(f"{SPD}/life", json=edit, headers=MERGE).status_code == 200
        wait_for(lambda: api.get("", "configmaps", "default", "life-stale") is None, 60)
        service = lambda: api.get("", "services", "default", "life") or {}  # noqa: E731
        wait_for(lambda: service()["spec"]["ports"][0]["port"] == 9000, 60)
        assert http.delete(f"{SPD}/life").status_code == 200
        wait_for(lambda: api.get("specpilot.io", "specdeployments", "default", "life") is None, 60)
        assert operator.process.poll() is None, operator.text()[-3000:]
        assert INLINE not in operator.text()  # kopf's debug log (--verbose) prints its patches


def switch_and_repeat_an_event(api: ApiServer) -> None:
    """The tuning daemon's part, on the operator's account: a switch followed to its end by
    the real actuator, and the same Event twice (counted, not duplicated)."""
    rest = KubeRest.from_config(str(api.operator_kubeconfig))
    reconcile(rest, create(api, "tuned"))
    make = real_rollouts(busy(), Controller(api, "tuned").sleep)
    outcome = tune(rest, spd_of(api, "tuned"), now=later(), make_actuator=make)
    assert outcome is not None and outcome.applied, outcome
    for _ in range(2):
        post_event(rest, spd_of(api, "tuned"), "Normal", "Checked", "the same message")


def service_monitors_only(workdir: Path, rules: list[dict[str, Any]]) -> set[Grant]:
    """Where only ServiceMonitors are served, the operator makes one of those instead: what
    reconciling a SpecDeployment there uses."""
    (crd,) = [
        doc
        for doc in yaml.safe_load_all(MONITORS.read_text(encoding="utf-8"))
        if doc and doc["spec"]["names"]["kind"] == "ServiceMonitor"
    ]
    workdir.mkdir()
    only = workdir / "servicemonitor-crd.yaml"
    only.write_text(yaml.safe_dump(crd), encoding="utf-8")
    with running_apiserver(workdir, crds=[*default_crds(), only], operator_rules=rules) as api:
        rest = KubeRest.from_config(str(api.operator_kubeconfig))
        reconcile(rest, create(api, "scraped"))
        assert api.get("monitoring.coreos.com", "servicemonitors", "default", "scraped")
        edit = {"spec": {"engine": "sglang"}}  # the monitor's engine label follows
        httpx.patch(f"{api.url}{SPD}/scraped", json=edit, headers=MERGE).raise_for_status()
        reconcile(rest, spd_of(api, "scraped"))
        assert api.denials() == [], f"used and not granted: {api.denials()}"
        return used(api)


def a_sidecar_written_and_repaired(api: ApiServer) -> None:
    """SGLang runs a schedule from a sidecar ConfigMap: reconcile writes it, and puts back a
    label someone removed (drift repair), on the operator's account."""
    rest = KubeRest.from_config(str(api.operator_kubeconfig))
    body = spd_body("sidecar")
    body["spec"] |= {"engine": "sglang", "speculative": {
        "candidates": [{"method": "eagle3", "maxK": 3, "draftModel": "d"}],
        "initial": {"method": "eagle3", "k": 3}}}  # fmt: skip
    httpx.post(f"{api.url}{SPD}", json=body).raise_for_status()
    reconcile(rest, spd_of(api, "sidecar"))
    state = json.loads(spd_of(api, "sidecar")["status"]["tunerState"])
    scheduled = SpecConfig(
        method="eagle3", num_speculative_tokens=3, draft_model="d", schedule=((1, 8, 3), (9, 64, 1))
    )
    state["current"] = scheduled.to_dict()  # the tuner chose a schedule
    status = {"status": {"tunerState": json.dumps(state)}}
    httpx.patch(f"{api.url}{SPD}/sidecar/status", json=status, headers=MERGE).raise_for_status()
    reconcile(rest, spd_of(api, "sidecar"))
    (sidecar,) = [
        cm for cm in api.list("", "configmaps", "default") if cm["metadata"]["name"] != "life-stale"
    ]
    name = sidecar["metadata"]["name"]
    unlabel = {"metadata": {"labels": {SIDECAR_LABEL: None}}}
    path = f"{api.url}/api/v1/namespaces/default/configmaps/{name}"
    httpx.patch(path, json=unlabel, headers=MERGE).raise_for_status()
    reconcile(rest, spd_of(api, "sidecar"))
    assert api.get("", "configmaps", "default", name)["metadata"]["labels"][SIDECAR_LABEL]


def check_least_privilege(workdir: Path, rules: list[dict[str, Any]], *operator_flags: str) -> None:
    with running_apiserver(workdir, crds=[*default_crds(), MONITORS], operator_rules=rules) as api:
        serve_one_through_its_life(api, workdir, *operator_flags)
        switch_and_repeat_an_event(api)
        a_sidecar_written_and_repaired(api)
        assert api.denials() == [], f"used and not granted: {api.denials()}"
        seen = used(api)
    seen |= service_monitors_only(workdir / "servicemonitors", rules)
    unused = granted(rules) - seen
    assert not unused, f"granted and never used: {sorted(unused)}; used: {sorted(seen)}"
    # The operator never reads Secrets: a gated model's token is a secretKeyRef the kubelet
    # resolves in the engine pod (test_pod_security.py); no rule names them, nothing asked.
    assert not [g for g in granted(rules) | seen if g[2] in ("secrets", "*")]


def test_cluster_wide_roles_grant_exactly_what_the_operator_uses(tmp_path: Path) -> None:
    check_least_privilege(tmp_path, operator_roles(tmp_path))


def test_namespaced_roles_grant_exactly_what_the_operator_uses(tmp_path: Path) -> None:
    values = ("operator.allNamespaces=false", "operator.namespaces={default}")
    check_least_privilege(tmp_path, operator_roles(tmp_path, *values), "--namespace", "default")
