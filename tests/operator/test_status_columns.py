"""The status a user scans (issue 12 item 5): `status.readyReplicas` and `status.url` from the
engine Deployment and Service, and the Ready printer column reading the Ready condition, through
the same JSONPath kubectl's Table shows (tests/operator/test_kubectl_examples.py prints it with
the real kubectl)."""

from __future__ import annotations

from typing import Any

from crd_validation import load_crd
from kube.objects import get_path

from specpilot.operator.api.spec import decode_spec
from specpilot.operator.kube.status import running_status

SPEC = decode_spec({"engine": "vllm", "model": "org/m", "port": 8080})


def _deployment(ready: int, wanted: int = 2) -> dict[str, Any]:
    return {
        "metadata": {"name": "llama", "namespace": "llm", "generation": 1},
        "spec": {"replicas": wanted},
        "status": {
            "observedGeneration": 1, "replicas": wanted, "updatedReplicas": wanted,
            "availableReplicas": ready, "readyReplicas": ready,
        },
    }  # fmt: skip


def _column(name: str) -> str:
    columns = load_crd()["spec"]["versions"][0]["additionalPrinterColumns"]
    (path,) = [c["jsonPath"] for c in columns if c["name"] == name]
    return str(path)


def test_ready_replicas_url_and_the_ready_column() -> None:
    status = running_status({}, SPEC, _deployment(ready=1), 1, "llama")
    assert status["readyReplicas"] == 1 and status["replicas"] == 2
    assert status["url"] == "http://llama.llm.svc:8080"
    obj = {"status": status}
    assert get_path(obj, _column("Ready")) == "False"
    assert get_path(obj, _column("Replicas")) == 2
    assert get_path(obj, _column("URL")) == "http://llama.llm.svc:8080"
    ready = running_status(status, SPEC, _deployment(ready=2), 1, "llama")
    assert ready["readyReplicas"] == 2
    assert get_path({"status": ready}, _column("Ready")) == "True"


def test_no_deployment_yet_means_no_url_and_nothing_ready() -> None:
    status = running_status({}, SPEC, {}, 1, "llama")
    assert status["readyReplicas"] == 0 and "url" not in status
