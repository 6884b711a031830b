"""`specpilot operator` (a subprocess) with more SpecDeployments than kopf has workers, against
the mock API server (tests/kube, a MOCK): every object gets its Deployment, every daemon ticks,
a later create and a spec edit reach every object; and the operator's --prometheus-url-allow
flag reaches the tuner: a URL outside it is refused in status, naming the allowed prefix.

kopf runs synchronous handlers on 16 workers (handlers.configure); 20 objects is more."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from kube.apiserver import ApiServer, running_apiserver
from kube.chart import operator_rules
from kube.operator_process import Operator, running_operator, wait_for

GROUP = "specpilot.io"
SPD_PATH = "/apis/specpilot.io/v1alpha1/namespaces/default/specdeployments"
MERGE = {"Content-Type": "application/merge-patch+json"}
ALLOWED = "http://prometheus.monitoring:9090"
MANY = 20


def spd(name: str, **tuning: Any) -> dict[str, Any]:
    return {
        "apiVersion": "specpilot.io/v1alpha1",
        "kind": "SpecDeployment",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "engine": "vllm",
            "model": "m",
            "speculative": {"candidates": [{"method": "ngram", "maxK": 4}]},
            "tuning": {"intervalSeconds": 5, **tuning},
        },
    }


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ApiServer, Operator]]:
    workdir = tmp_path_factory.mktemp("many")
    flags = ("--standalone", "--prometheus-url-allow", ALLOWED)
    with (
        running_apiserver(workdir, operator_rules=operator_rules(workdir)) as api,
        running_operator(api, workdir / "operator.log", *flags) as operator,
    ):
        yield api, operator
        assert api.denials() == [], operator.text()[-3000:]


def _status(api: ApiServer, name: str) -> dict[str, Any]:
    found = api.get(GROUP, "specdeployments", "default", name) or {}
    status: dict[str, Any] = found.get("status") or {}
    return status


def _args(api: ApiServer, name: str) -> list[str]:
    deployment = api.get("apps", "deployments", "default", name)
    args: list[str] = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    return args


def _missing(names: list[str], present: Any) -> list[str]:
    return [n for n in names if not present(n)]


def test_more_objects_than_kopf_workers_all_tick_and_take_edits(
    cluster: tuple[ApiServer, Operator],
) -> None:
    api, operator = cluster
    names = [f"many-{i:02d}" for i in range(MANY)]
    with httpx.Client(base_url=api.url, timeout=10) as http:
        for name in names:
            assert http.post(SPD_PATH, json=spd(name)).status_code == 201

        def deployment(name: str) -> Any:
            return api.get("apps", "deployments", "default", name)

        wait_for(lambda: not _missing(names, deployment), 30, 1.0, "every Deployment")
        # every daemon runs at once: each has ticked (a tick always writes lastDecision)
        ticked = lambda n: "lastDecision" in _status(api, n)  # noqa: E731
        wait_for(lambda: not _missing(names, ticked), 40, 1.0, "a tick on every object")
        # with all the daemons running, a new object is still handled
        assert http.post(SPD_PATH, json=spd("many-late")).status_code == 201
        wait_for(lambda: deployment("many-late"), 30, 1.0, "the Deployment of a later create")
        names.append("many-late")
        edit = {"spec": {"extraArgs": ["--max-model-len", "4096"]}}
        for name in names:
            assert http.patch(f"{SPD_PATH}/{name}", json=edit, headers=MERGE).status_code == 200
        edited = lambda n: "4096" in _args(api, n)  # noqa: E731
        wait_for(lambda: not _missing(names, edited), 40, 1.0, "the edit on every Deployment")
    assert operator.process.poll() is None


def test_a_prometheus_url_outside_the_flag_is_refused_in_status(
    cluster: tuple[ApiServer, Operator],
) -> None:
    api, operator = cluster
    nosy = spd("nosy", metrics={"source": "prometheus", "prometheusUrl": "http://10.0.0.1:9090"})
    assert httpx.post(api.url + SPD_PATH, json=nosy, timeout=10).status_code == 201

    def refused() -> dict[str, Any] | None:
        conditions = _status(api, "nosy").get("conditions") or []
        return next((c for c in conditions if c["reason"] == "PrometheusUrlNotAllowed"), None)

    condition = wait_for(refused, 40, 1.0, "the PrometheusUrlNotAllowed condition")
    assert condition["type"] == "MetricsAvailable" and condition["status"] == "False"
    assert "spec.tuning.metrics.prometheusUrl" in condition["message"]
    assert ALLOWED in condition["message"] and "http://10.0.0.1:9090" in condition["message"]
    assert "Traceback" not in operator.text()
