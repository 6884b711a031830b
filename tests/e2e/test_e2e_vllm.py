"""End to end once with a real engine: `kubectl apply` -> operator -> Deployment -> the kubelet
double runs the pod's container command (`python3 -m vllm...`, mapped to the vLLM CPU
environment's interpreter) with exactly the rendered args -> real vLLM /metrics -> the tuner.

Recommend mode: the tuner reads the real engine and writes its recommendation without
restarting it (a vLLM start costs ~70-90 s here; the restart path is covered with the
emulator)."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
from kube.apiserver import ApiServer

from e2e.conftest import NAMESPACE, Operator, kubectl, wait_for
from e2e.kubelet import Kubelet
from e2e.node import VLLM_PYTHON
from specpilot.runtime.engines import get_adapter

MODEL = Path(__file__).resolve().parents[2] / ".cache/tiny-models/llama"
PROMPT = "the quick brown fox jumps over the lazy dog " * 4
LOOKUP = {"promptLookupMin": 2, "promptLookupMax": 4}
LOOKUP = {"promptLookupMin": 2, "promptLookupMax": 4}


def manifest() -> str:
    body = {
        "apiVersion": "specpilot.io/v1alpha1",
        "kind": "SpecDeployment",
        "metadata": {"name": "tiny", "namespace": NAMESPACE},
        "spec": {
            "engine": "vllm",
            "model": str(MODEL),
            "servedModelName": "tiny",
            "replicas": 1,
            "resources": {"gpus": 0, "gpuType": "H100", "modelProfile": "llama-3.1-8b"},
            "extraArgs": ["--max-model-len", "1024", "--max-num-seqs", "32"],
            "env": [{"name": "VLLM_CPU_KVCACHE_SPACE", "value": "1"}],
            "speculative": {
                "candidates": [{"method": "ngram", "k": [1, 3], "options": LOOKUP}],
                "initial": {"method": "ngram", "k": 3},
            },
            "tuning": {"mode": "recommend", "intervalSeconds": 10, "rolloutTimeoutSeconds": 300},
        },
    }
    return json.dumps(body)


@pytest.mark.engines
def test_real_vllm_pod_is_observed_by_the_operator(
    apiserver: ApiServer, kubelet: Kubelet, operator: Operator
) -> None:
    if not VLLM_PYTHON.exists() or not MODEL.exists():
        pytest.fail("the vLLM environment or the tiny model is missing: run `make engines`")
    kubectl(apiserver, "apply", "--validate=false", "-f", "-", stdin=manifest())
    pod = wait_for("the vLLM pod created", lambda: kubelet.pods_of("tiny"), 30)[0]
    container = apiserver.get("apps", "deployments", NAMESPACE, "tiny")["spec"]["template"]
    container = container["spec"]["containers"][0]
    assert container["command"] == get_adapter("vllm").program("python3")  # the image's python
    # exactly the container's command and args; only --host 0.0.0.0 became the pod's IP
    expected = [*container["command"][1:], *container["args"]]
    expected[expected.index("--host") + 1] = pod.ip
    assert pod.argv == [str(VLLM_PYTHON), *expected]
    # ~70-90 s on 2 idle cores; the contract tests allow 600 s on a busy machine as well
    wait_for("vLLM Ready", lambda: pod.ready, 600, every_s=1)

    stop = threading.Event()

    def user() -> None:
        port = container["ports"][0]["containerPort"]
        with httpx.Client(timeout=120) as client:
            while not stop.is_set():
                body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 48, "temperature": 0}
                client.post(f"http://{pod.ip}:{port}/v1/completions", json=body)

    users = [threading.Thread(target=user) for _ in range(2)]
    for thread in users:
        thread.start()
    try:
        observed = wait_for(
            "the operator's observation of the real engine in status",
            lambda: _observed_with_acceptance(apiserver),
            timeout_s=90,
            every_s=1,
        )
    finally:
        stop.set()
        for thread in users:
            thread.join(timeout=130)
    assert observed["tokensPerSecond"] > 0
    assert observed["acceptanceLength"] > 1.0  # n-gram drafts accepted on repetitive text
    status = apiserver.get("specpilot.io", "specdeployments", NAMESPACE, "tiny")["status"]
    assert status["lastDecision"]["action"] in ("stay", "recommend"), status["lastDecision"]
    assert len(kubelet.started_pods) == 1  # recommend mode never restarts the engine


def _observed_with_acceptance(apiserver: ApiServer) -> dict[str, Any] | None:
    found = apiserver.get("specpilot.io", "specdeployments", NAMESPACE, "tiny") or {}
    observed: dict[str, Any] = (found.get("status") or {}).get("observed") or {}
    return observed if observed.get("acceptanceLength") else None
