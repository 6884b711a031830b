"""kopf over real HTTP: `specpilot operator` (a subprocess) against the mock API server.

One server and one standalone operator serve the module; each test uses its own object names.
The tests drive the cluster the way users and controllers do (HTTP writes to the API) and
read the results back from the server's store.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from kube.apiserver import ApiServer, running_apiserver
from kube.chart import operator_rules
from kube.operator_process import Operator, running_operator, wait_for

GROUP = "specpilot.io"
SPD_PATH = "/apis/specpilot.io/v1alpha1/namespaces/default/specdeployments"
MERGE = {"Content-Type": "application/merge-patch+json"}


def spd(name: str, **spec: Any) -> dict[str, Any]:
    body = {
        "engine": "vllm",
        "model": "meta-llama/Llama-3.1-8B-Instruct",
        "speculative": {"candidates": [{"method": "ngram", "maxK": 4}]},
        "tuning": {"intervalSeconds": 5},
    }
    body.update(spec)
    return {
        "apiVersion": "specpilot.io/v1alpha1",
        "kind": "SpecDeployment",
        "metadata": {"name": name, "namespace": "default"},
        "spec": body,
    }


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ApiServer, Operator]]:
    workdir = tmp_path_factory.mktemp("kopf")
    with (
        running_apiserver(workdir, operator_rules=operator_rules(workdir)) as api,
        running_operator(api, workdir / "operator.log", "--standalone") as operator,
    ):
        yield api, operator
        # everything the operator did in this module, the chart's ClusterRole allows
        assert api.denials() == [], operator.text()[-3000:]


@pytest.fixture
def http(cluster: tuple[ApiServer, Operator]) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=cluster[0].url, timeout=10) as client:
        yield client


def _deployment(api: ApiServer, name: str) -> Any:
    return api.get("apps", "deployments", "default", name)


def _status(api: ApiServer, name: str) -> dict[str, Any]:
    found = api.get(GROUP, "specdeployments", "default", name) or {}
    status: dict[str, Any] = found.get("status") or {}
    return status


def _condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(c for c in status.get("conditions", []) if c["type"] == kind)


def test_create_renders_owned_children_and_status(
    cluster: tuple[ApiServer, Operator], http: httpx.Client
) -> None:
    api, operator = cluster
    created = http.post(SPD_PATH, json=spd("alpha", replicas=2))
    assert created.status_code == 201, created.text
    uid = created.json()["metadata"]["uid"]
    deployment = wait_for(lambda: _deployment(api, "alpha"), 30)
    service = wait_for(lambda: api.get("", "services", "default", "alpha"))
    for child in (deployment, service):
        (owner,) = child["metadata"]["ownerReferences"]
        assert owner["uid"] == uid and owner["controller"] is True
    template = deployment["spec"]["template"]
    assert json.loads(template["metadata"]["annotations"]["specpilot.io/config"])["method"] == (
        "ngram"
    )
    assert deployment["spec"]["replicas"] == 2
    status = wait_for(lambda: _status(api, "alpha").get("conditions") and _status(api, "alpha"))
    assert status["observedGeneration"] == 1
    assert status["phase"] == "Deploying"  # no kubelet here: no pod ever becomes ready
    assert status["currentConfig"]["method"] == "ngram"
    assert _condition(status, "Degraded")["status"] == "False"
    assert _condition(status, "Ready")["observedGeneration"] == 1
    assert status["selector"].endswith("specpilot.io/role=main")
    assert operator.process.poll() is None


def test_update_patches_children_and_keeps_transition_times(
    cluster: tuple[ApiServer, Operator], http: httpx.Client
) -> None:
    api, _ = cluster
    assert http.post(SPD_PATH, json=spd("beta")).status_code == 201
    wait_for(lambda: _status(api, "beta").get("observedGeneration") == 1)
    before = _condition(_status(api, "beta"), "Degraded")
    first_rv = _deployment(api, "beta")["metadata"]["resourceVersion"]
    patch = {"spec": {"extraArgs": ["--max-model-len", "4096"]}}
    assert http.patch(f"{SPD_PATH}/beta", json=patch, headers=MERGE).status_code == 200
    args = lambda: _deployment(api, "beta")["spec"]["template"]["spec"]["containers"][0]["args"]  # noqa: E731
    wait_for(lambda: "4096" in args())
    status = wait_for(
        lambda: _status(api, "beta").get("observedGeneration") == 2 and _status(api, "beta")
    )
    assert _condition(status, "Degraded")["lastTransitionTime"] == before["lastTransitionTime"]
    assert _deployment(api, "beta")["metadata"]["resourceVersion"] != first_rv
    assert "replicas" not in (api.get(GROUP, "specdeployments", "default", "beta")["spec"])


def test_replicas_belong_to_the_autoscaler_unless_the_spec_sets_them(
    cluster: tuple[ApiServer, Operator], http: httpx.Client
) -> None:
    api, _ = cluster
    assert http.post(SPD_PATH, json=spd("gamma")).status_code == 201
    wait_for(lambda: _deployment(api, "gamma"))
    # An HPA scales the Deployment; a later reconcile (spec edit) must leave it alone.
    scale = "/apis/apps/v1/namespaces/default/deployments/gamma/scale"
    assert http.patch(scale, json={"spec": {"replicas": 3}}, headers=MERGE).status_code == 200
    http.patch(f"{SPD_PATH}/gamma", json={"spec": {"servedModelName": "g"}}, headers=MERGE)
    wait_for(
        lambda: (
            "g" in _deployment(api, "gamma")["spec"]["template"]["spec"]["containers"][0]["args"]
        )
    )
    assert _deployment(api, "gamma")["spec"]["replicas"] == 3
    # Scaling the SpecDeployment through its own scale subresource reaches the Deployment.
    spd_scale = f"{SPD_PATH}/gamma/scale"
    assert http.get(spd_scale).json()["status"]["selector"].endswith("role=main")
    assert http.patch(spd_scale, json={"spec": {"replicas": 4}}, headers=MERGE).status_code == 200
    wait_for(lambda: _deployment(api, "gamma")["spec"]["replicas"] == 4)


def test_invalid_spec_is_degraded_with_a_readable_message_and_no_crash(
    cluster: tuple[ApiServer, Operator], http: httpx.Client
) -> None:
    api, operator = cluster
    # Passes the CRD's OpenAPI schema (CEL would refuse it on a real server; the mock does
    # not evaluate CEL), so the operator's own check is what catches it.
    bad = spd("delta", extraArgs=["--speculative-config", "{}"])
    assert http.post(SPD_PATH, json=bad).status_code == 201
    status = wait_for(
        lambda: _status(api, "delta").get("phase") == "Degraded" and _status(api, "delta")
    )
    degraded = _condition(status, "Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "InvalidSpec"
    assert "spec.extraArgs[0]" in degraded["message"]
    assert "speculative flags belong to SpecPilot" in degraded["message"]
    assert _deployment(api, "delta") is None
    assert "Traceback" not in operator.text()
    fixed = {"spec": {"extraArgs": ["--max-model-len", "4096"]}}
    http.patch(f"{SPD_PATH}/delta", json=fixed, headers=MERGE)
    wait_for(lambda: _deployment(api, "delta"))
    wait_for(lambda: _condition(_status(api, "delta"), "Degraded")["status"] == "False")
    assert operator.process.poll() is None


def test_schema_violation_is_refused_by_the_api_server(http: httpx.Client) -> None:
    refused = http.post(SPD_PATH, json=spd("epsilon", engine="tgi"))
    assert refused.status_code == 422
    assert refused.json()["reason"] == "Invalid"
    assert "spec.engine" in refused.json()["message"]


def test_tuning_tick_writes_last_decision_and_an_event(
    cluster: tuple[ApiServer, Operator], http: httpx.Client
) -> None:
    api, _ = cluster
    assert http.post(SPD_PATH, json=spd("zeta")).status_code == 201
    status = wait_for(lambda: _status(api, "zeta").get("lastDecision") and _status(api, "zeta"), 40)
    # No engine runs here (no kubelet): the tuner holds and says why.
    assert status["lastDecision"]["action"] == "stay"
    assert status["lastDecision"]["reason"].startswith("holding")
    assert _condition(status, "MetricsAvailable")["status"] == "False"
    # The Event is posted right after the status write, so it may land a moment later.
    wait_for(
        lambda: any(
            e["reason"] == "TunerStayed" and e["involvedObject"]["name"] == "zeta"
            for e in api.list("", "events", "default")
        )
    )


def test_delete_collects_the_children(
    cluster: tuple[ApiServer, Operator], http: httpx.Client
) -> None:
    api, _ = cluster
    assert http.post(SPD_PATH, json=spd("eta")).status_code == 201
    wait_for(lambda: _deployment(api, "eta") and api.get("", "services", "default", "eta"))
    assert http.delete(f"{SPD_PATH}/eta").status_code == 200
    wait_for(lambda: api.get(GROUP, "specdeployments", "default", "eta") is None, 30)
    wait_for(
        lambda: _deployment(api, "eta") is None and not api.get("", "services", "default", "eta")
    )


def _healthy(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code == 200
    except httpx.TransportError:  # not listening yet
        return False


def test_liveness_and_operator_metrics(
    cluster: tuple[ApiServer, Operator], http: httpx.Client
) -> None:
    _, operator = cluster
    # as a kubelet's probe would: the endpoint answers once kopf is up, retried until then
    # (run alone, this test comes before the operator has started serving it)
    wait_for(lambda: _healthy(operator.liveness_port), 30, what="/healthz answering 200")
    # a SpecDeployment of its own, so that a decision is counted however the module is run
    # (a labelled counter is exported once it has counted)
    assert http.post(SPD_PATH, json=spd("iota")).status_code == 201
    metrics = wait_for(
        lambda: (
            (text := httpx.get(f"http://127.0.0.1:{operator.metrics_port}/metrics").text)
            and "specpilot_decisions_total" in text
            and text
        ),
        40,
    )
    assert "specpilot_current_config_info" in metrics
    assert "specpilot_observation_age_seconds" in metrics


def test_state_survives_an_operator_restart(tmp_path: Path) -> None:
    with running_apiserver(tmp_path) as api, httpx.Client(base_url=api.url) as http:
        assert http.post(SPD_PATH, json=spd("theta")).status_code == 201  # n-gram K in 1..4
        with running_operator(api, tmp_path / "first.log", "--standalone"):
            wait_for(lambda: _status(api, "theta").get("tunerState"), 30)
        stored = json.loads(_status(api, "theta")["tunerState"])
        # What the tuner learned while the operator was away (or in another replica): it now
        # runs n-gram K=2, with a learned acceptance estimate.
        stored["current"] = {"method": "ngram", "num_speculative_tokens": 2}
        stored["acceptance"] = [["ngram", 0.5, 0.9]]
        status_path = f"{SPD_PATH}/theta/status"
        write = {"status": {"tunerState": json.dumps(stored)}}
        assert http.patch(status_path, json=write, headers=MERGE).status_code == 200
        with running_operator(api, tmp_path / "second.log", "--standalone"):
            annotation = lambda: json.loads(  # noqa: E731
                _deployment(api, "theta")["spec"]["template"]["metadata"]["annotations"][
                    "specpilot.io/config"
                ]
            )
            wait_for(lambda: annotation().get("num_speculative_tokens") == 2, 30)
            current = lambda: _status(api, "theta")["currentConfig"]["numSpeculativeTokens"]  # noqa: E731
            wait_for(lambda: current() == 2)
            restored = json.loads(_status(api, "theta")["tunerState"])
            assert restored["acceptance"] == [["ngram", 0.5, 0.9]]
        assert len(api.list("apps", "deployments", "default")) == 1
