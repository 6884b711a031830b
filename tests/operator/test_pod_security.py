"""Pod Security Standards, checked on what SpecPilot renders: the operator's own pod meets the
restricted level; an engine pod meets it wherever the engine allows (the GPU-less emulator
example does), and what keeps the official GPU engine images from it is exactly what the
chart's README says (they run as root), no more.

`violations(pod_spec)` is the restricted profile's rules (which include the baseline's) as
Kubernetes documents them for pod templates: no host namespaces, ports or paths, no privileged
containers, only the restricted volume types, runAsNonRoot true and no UID 0, no privilege
escalation, every capability dropped (NET_BIND_SERVICE alone may be added), a RuntimeDefault or
Localhost seccomp profile, procMount Default.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from crd_validation import ROOT
from kube.chart import CHART, find, render

from specpilot.operator.api.spec import decode_spec
from specpilot.operator.kube.children import desired_children, desired_deployment
from specpilot.tuner import SpecConfig

Obj = dict[str, Any]
RESTRICTED_VOLUMES = {
    "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
    "projected", "secret",
}  # fmt: skip


def _level(pod: Obj, container: Obj, key: str) -> Any:
    """A security setting as it applies to the container (its own, else the pod's)."""
    own = (container.get("securityContext") or {}).get(key)
    return own if own is not None else (pod.get("securityContext") or {}).get(key)


def violations(pod: Obj) -> list[str]:
    found = [f"spec.{k}" for k in ("hostNetwork", "hostPID", "hostIPC") if pod.get(k)]
    for volume in pod.get("volumes", []):
        kinds = set(volume) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            found.append(f"volume {volume['name']}: {sorted(kinds - RESTRICTED_VOLUMES)}")
    containers = [*pod.get("initContainers", []), *pod["containers"]]
    for container in containers:
        name, context = container["name"], container.get("securityContext") or {}
        if context.get("privileged"):
            found.append(f"{name}: privileged")
        if context.get("allowPrivilegeEscalation") is not False:
            found.append(f"{name}: allowPrivilegeEscalation not false")
        if _level(pod, container, "runAsNonRoot") is not True:
            found.append(f"{name}: runAsNonRoot not true")
        if _level(pod, container, "runAsUser") == 0:
            found.append(f"{name}: runAsUser 0")
        seccomp = (_level(pod, container, "seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            found.append(f"{name}: seccompProfile {seccomp}")
        capabilities = context.get("capabilities") or {}
        if "ALL" not in (capabilities.get("drop") or []):
            found.append(f"{name}: capabilities not dropping ALL")
        if set(capabilities.get("add") or []) - {"NET_BIND_SERVICE"}:
            found.append(f"{name}: capabilities added {capabilities['add']}")
        if context.get("procMount", "Default") != "Default":
            found.append(f"{name}: procMount {context['procMount']}")
        if any(port.get("hostPort") for port in container.get("ports", [])):
            found.append(f"{name}: hostPort")
    return found


def _engine_pod(spec: Obj) -> Obj:
    decoded = decode_spec(spec)
    deployment = desired_deployment(name="x", namespace="ns", spec=decoded, config=decoded.initial)
    pod: Obj = deployment["spec"]["template"]["spec"]
    return pod


def _example(name: str) -> Obj:
    spec: Obj = yaml.safe_load((ROOT / "examples" / name).read_text(encoding="utf-8"))["spec"]
    return spec


def test_the_checker_catches_each_rule() -> None:
    good = _engine_pod(_example("emulator.yaml"))
    assert violations(good) == []
    context = good["containers"][0]["securityContext"]
    for key, value in [("privileged", True), ("allowPrivilegeEscalation", True),
                       ("runAsNonRoot", False), ("runAsUser", 0), ("procMount", "Unmasked"),
                       ("capabilities", {"drop": ["ALL"], "add": ["SYS_ADMIN"]}),
                       ("capabilities", {"drop": ["NET_RAW"]}),
                       ("seccompProfile", {"type": "Unconfined"})]:  # fmt: skip
        container = {**good["containers"][0], "securityContext": {**context, key: value}}
        assert violations({**good, "containers": [container]}), key
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        assert violations({**good, key: True}) == [f"spec.{key}"]
    host = {**good, "volumes": [*good["volumes"], {"name": "h", "hostPath": {"path": "/"}}]}
    assert violations(host) == ["volume h: ['hostPath']"]


def test_the_operator_pod_is_restricted(tmp_path: Path) -> None:
    deployment = find(render(tmp_path), "Deployment")
    assert violations(deployment["spec"]["template"]["spec"]) == []


def test_the_gpu_less_emulator_example_is_restricted() -> None:
    assert violations(_engine_pod(_example("emulator.yaml"))) == []


def test_a_gpu_engine_pod_misses_restricted_only_by_running_as_root() -> None:
    """The GPU pool example sets every restricted setting a GPU engine allows (a GPU comes
    from the device plugin: no privilege, capability or host path); only runAsNonRoot is left,
    because the official vLLM and SGLang images run as root, as the chart's README says."""
    assert violations(_engine_pod(_example("vllm-gpu-pool.yaml"))) == [
        "engine: runAsNonRoot not true"
    ]
    readme = " ".join((CHART / "README.md").read_text(encoding="utf-8").split())
    assert "restricted" in readme and "run as root" in readme and "runAsNonRoot" in readme


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_a_non_root_engine_image_can_meet_restricted(engine: str) -> None:
    """With an image that runs as a user, the settings the README lists make an engine pod
    restricted: the model cache and /dev/shm are emptyDirs (allowed), no host path is needed."""
    pod = {
        "securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "fsGroup": 1000,
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "containerSecurityContext": {"allowPrivilegeEscalation": False,
                                     "capabilities": {"drop": ["ALL"]}},
        "modelCache": {"mountPath": "/cache/huggingface"},
    }  # fmt: skip
    spec = {"engine": engine, "model": "org/m", "image": "registry.example/engine:nonroot"}
    assert violations(_engine_pod({**spec, "pod": pod})) == []


def test_the_default_engine_pod_sets_nothing_it_is_not_given() -> None:
    """Without pod settings the engine pod has no security context (the official images need
    root); what restricted asks is then missing, and the README names each of these."""
    found = violations(_engine_pod({"engine": "vllm", "model": "org/m"}))
    assert found == [
        "engine: allowPrivilegeEscalation not false",
        "engine: runAsNonRoot not true",
        "engine: seccompProfile None",
        "engine: capabilities not dropping ALL",
    ]
    readme = " ".join((CHART / "README.md").read_text(encoding="utf-8").split())
    for setting in ("allowPrivilegeEscalation", "seccompProfile", "capabilities"):
        assert setting in readme, setting


def test_a_gated_models_token_reaches_the_engine_as_a_secret_reference_only() -> None:
    """A gated model's Hugging Face token: the spec names a Secret's key, the engine container
    gets that reference (the kubelet resolves it in the pod), and SpecPilot renders no Secret
    and no value: it never reads one (its RBAC grants no Secrets: test_rbac_least_privilege)."""
    token = {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}
    spec = {"engine": "vllm", "model": "meta-llama/Llama-3.1-8B-Instruct", "env": [token]}
    decoded = decode_spec(spec)
    children = desired_children(
        name="x", namespace="ns", spec=decoded, config=decoded.initial, canary_config=SpecConfig()
    )
    assert not [c for c in children if c["kind"] == "Secret"]
    for deployment in (c for c in children if c["kind"] == "Deployment"):
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        assert [e for e in container["env"] if e["name"] == "HF_TOKEN"] == [token]
