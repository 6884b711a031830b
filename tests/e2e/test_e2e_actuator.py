"""The Kubernetes actuator against the mock API server and the kubelet double, without kopf:
real pod processes (the emulator), real rollouts (surge 1, unavailable 0), real scrapes of the
pods' /metrics, a config that crashes at start failing fast, and the rollback that follows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kube.apiserver import ApiServer

from e2e.conftest import NAMESPACE, ServiceLoad, emulator_command, wait_for
from e2e.kubelet import Kubelet
from specpilot.operator.api.spec import decode_spec
from specpilot.operator.kube.actuator import KubeActuator, RolloutError, for_spec
from specpilot.operator.kube.client import KubeRest
from specpilot.operator.kube.pod_metrics import ScrapeSource
from specpilot.tuner import SpecConfig


def actuator_for(apiserver: ApiServer, models: Path, engine: str, replicas: int) -> KubeActuator:
    spec = decode_spec(
        {
            "engine": engine,
            "model": str(models / "llama"),
            "servedModelName": "llama",
            "command": emulator_command(engine),
            "replicas": replicas,
            "resources": {"gpus": 0, "gpuType": "A100", "modelProfile": "llama-3.1-8b"},
            "speculative": {
                "candidates": [
                    {"method": "eagle3", "maxK": 3, "draftModel": str(models / "eagle3")}
                ],
                "initial": {"method": "none"},
            },
            "tuning": {"rolloutTimeoutSeconds": 60},
        }
    )
    rest = KubeRest.from_config(str(apiserver.operator_kubeconfig))  # the operator's account
    return for_spec(
        api=rest,
        name="llm",
        namespace=NAMESPACE,
        spec=spec,
        metrics=ScrapeSource(interval_s=0.5),
        poll_s=0.25,
    )


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_rollout_observe_crash_and_rollback(
    engine: str, apiserver: ApiServer, kubelet: Kubelet, models: Path, load_factory
) -> None:
    actuator = actuator_for(apiserver, models, engine, replicas=2)
    actuator.apply(SpecConfig())  # creates the Deployment and waits for 2 Ready pods
    first = set(kubelet.started_pods)
    assert len(first) == 2
    load: ServiceLoad = load_factory(kubelet, "llm", users=4, max_tokens=64)

    plain = actuator.observe(2.0)
    assert plain.engines == 2 and plain.generation_tokens_per_s
    assert plain.acceptance_length is None  # no speculation yet

    # With a per-batch schedule: inline JSON for vLLM; for SGLang an adaptive-config file in a
    # ConfigMap the pod mounts (the kubelet double materialises the volume).
    eagle = SpecConfig(
        method="eagle3",
        num_speculative_tokens=3,
        draft_model=str(models / "eagle3"),
        schedule=((1, 4, 3), (5, 256, 1)),
    )
    actuator.apply(eagle)
    pods = kubelet.pods_of("llm")
    assert len(pods) == 2 and not first & {p.name for p in pods}  # both replaced
    live = apiserver.get("apps", "deployments", NAMESPACE, "llm")
    annotation = live["spec"]["template"]["metadata"]["annotations"]["specpilot.io/config"]
    assert SpecConfig.from_dict(json.loads(annotation)) == eagle
    if engine == "sglang":
        mounted = pods[0].folder / "volumes/specpilot-sidecar/sglang-speculative-adaptive.json"
        assert mounted.exists() and str(mounted) in pods[0].argv
    speculating = wait_for(
        "acceptance from the new pods",
        lambda: (o := actuator.observe(2.0)).acceptance_length and o,
        timeout_s=20,
    )
    assert speculating.acceptance_length > 1.5
    assert load.completed > 0

    # Draft weights that are not there: the engine exits at start, the pod crash-loops, and
    # the actuator says so at once instead of waiting out the rollout timeout.
    missing = SpecConfig(method="eagle3", num_speculative_tokens=2, draft_model="/nonexistent")
    with pytest.raises(RolloutError, match="no weights there"):
        actuator.apply(missing)
    running = {p.name for p in kubelet.pods_of("llm") if p.ready}
    assert len(running) == 2  # maxUnavailable 0: the old pods kept serving
    actuator.apply(eagle)  # what the loop does next: the rollback, followed the same way
    assert {p.name for p in kubelet.pods_of("llm")} == running
    load.stop()
    assert load.completed > 0


def test_canary_runs_beside_the_main_pods_then_is_promoted(
    apiserver: ApiServer, kubelet: Kubelet, models: Path, load_factory
) -> None:
    actuator = actuator_for(apiserver, models, "vllm", replicas=2)
    actuator.canary, actuator.canary_window_s, actuator.canary_warmup_s = True, 3.0, 1.0
    # Which pods are faster is left to tests/unit/test_kube_actuator.py, on a fake clock: here
    # real-time engines run as fast as a shared CPU lets them, and a loaded 2-core host once
    # measured the speculating canary below the plain pods (128.3 vs 129.4 tok/s per sequence).
    # Any measured speed passes, so this test checks the mechanics, never a race of speeds.
    actuator.canary_tolerance = 1.0
    actuator.apply(SpecConfig())
    load_factory(kubelet, "llm", users=3, max_tokens=64)  # one user per pod, canary included
    eagle = SpecConfig(
        method="eagle3", num_speculative_tokens=3, draft_model=str(models / "eagle3")
    )
    actuator.apply(eagle)
    result = actuator.last_canary
    assert result is not None and result.promoted, result
    # both sides were measured in the one comparison window: canary and main pods served load
    assert result.canary_speed and result.canary_speed > 0
    assert result.main_speed and result.main_speed > 0
    started = kubelet.started_pods
    assert any(name.startswith("llm-canary-") for name in started)
    assert apiserver.get("apps", "deployments", NAMESPACE, "llm-canary") is None  # deleted
    wait_for("the canary pod stopped", lambda: not kubelet.pods_of("llm-canary"), 10)
    assert len(kubelet.pods_of("llm")) == 2 and len(started) == 5  # 2 + canary + 2 promoted
