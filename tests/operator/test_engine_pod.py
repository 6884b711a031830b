"""Engine pod settings, from a SpecDeployment to the rendered pod: every field of the GPU node
pool example's `spec.pod` (and `spec.resources.extra`) reaches the engine pod template of the
main and the canary Deployment, the API server's schema admits the example (CRD, CEL) and the
rendered Deployments are valid Kubernetes objects for 1.30 and the newest kubernetes-validate
knows; the model cache is where the engines download to; SpecPilot's own names still win."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from crd_validation import ROOT, admit, strip_indexes

from specpilot.operator.api.names import INSTANCE_LABEL, MODEL_CACHE_VOLUME
from specpilot.operator.api.pod import DEFAULT_MODEL_CACHE_PATH
from specpilot.operator.api.spec import SpecError, decode_spec
from specpilot.operator.kube.children import desired_children, desired_deployment

EXAMPLE = ROOT / "examples" / "vllm-gpu-pool.yaml"
VERSIONS = ("1.30.0", kubernetes_validate.utils.latest_version())

Obj = dict[str, Any]


def _load(path: Path = EXAMPLE) -> Obj:
    obj: Obj = yaml.safe_load(path.read_text(encoding="utf-8"))
    return obj


def _deployments(obj: Obj) -> list[Obj]:
    spec = decode_spec(obj["spec"])
    children = desired_children(
        name=obj["metadata"]["name"], namespace="llm", spec=spec, config=spec.initial,
        canary_config=spec.candidates[-1],
    )  # fmt: skip
    deployments = [c for c in children if c["kind"] == "Deployment"]
    assert len(deployments) == 2  # main and canary
    return deployments


def _volume(pod: Obj, name: str) -> Obj:
    (found,) = [v for v in pod["volumes"] if v["name"] == name]
    return found


def _mount(container: Obj, name: str) -> Obj:
    (found,) = [m for m in container["volumeMounts"] if m["name"] == name]
    return found


def test_the_example_is_admitted_by_the_crd() -> None:
    _, failures = admit(_load())
    assert failures == []


def test_every_pod_setting_reaches_both_engine_pods() -> None:
    obj = _load()
    written = obj["spec"]["pod"]
    for deployment in _deployments(obj):
        template = deployment["spec"]["template"]
        pod = template["spec"]
        (container,) = pod["containers"]
        assert template["metadata"]["labels"].items() >= written["labels"].items()
        assert template["metadata"]["annotations"].items() >= written["annotations"].items()
        for field in ("tolerations", "affinity", "runtimeClassName", "priorityClassName"):
            assert pod[field] == written[field], field
        assert pod["serviceAccountName"] == written["serviceAccountName"]
        assert pod["imagePullSecrets"] == written["imagePullSecrets"]
        assert pod["securityContext"] == written["securityContext"]
        assert container["securityContext"] == written["containerSecurityContext"]
        assert pod["nodeSelector"] == obj["spec"]["resources"]["nodeSelector"]
        # the user's volume and mount, beside SpecPilot's own
        assert _volume(pod, "chat-templates") == written["volumes"][0]
        assert _mount(container, "chat-templates") == written["volumeMounts"][0]
        assert _volume(pod, "dshm")["emptyDir"] == {"medium": "Memory", "sizeLimit": "16Gi"}
        # the model cache: the claim, where the engines download (HF_HOME)
        claim = _volume(pod, MODEL_CACHE_VOLUME)["persistentVolumeClaim"]
        assert claim == {"claimName": "model-weights"}
        assert _mount(container, MODEL_CACHE_VOLUME)["mountPath"] == DEFAULT_MODEL_CACHE_PATH
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["HF_HOME"] == DEFAULT_MODEL_CACHE_PATH
        # extended resources are requested and limited alike, beside the GPU and memory
        for kind in ("requests", "limits"):
            assert container["resources"][kind]["ephemeral-storage"] == "50Gi"
            assert container["resources"][kind]["nvidia.com/gpu"] == "1"


def test_rendered_deployments_are_valid_for_oldest_and_newest_kubernetes() -> None:
    for deployment in _deployments(_load()):
        for version in VERSIONS:
            kubernetes_validate.validate(deployment, version, strict=True)


def test_specpilot_labels_win_and_the_deployment_keeps_its_own() -> None:
    obj = _load()
    main = _deployments(obj)[0]
    labels = main["spec"]["template"]["metadata"]["labels"]
    assert labels[INSTANCE_LABEL] == obj["metadata"]["name"]
    assert main["spec"]["selector"]["matchLabels"].items() <= labels.items()
    # the pod's labels are the pods', not the Deployment's
    assert "team" not in main["metadata"]["labels"]


def _rendered(pod: Obj, **spec: Any) -> Obj:
    decoded = decode_spec({"engine": "vllm", "model": "org/m", "pod": pod, **spec})
    deployment = desired_deployment(name="x", namespace="ns", spec=decoded, config=decoded.initial)
    template: Obj = deployment["spec"]["template"]
    return template


def test_an_empty_dir_cache_has_its_size_and_a_users_hf_home_is_kept() -> None:
    pod = _rendered(
        {"modelCache": {"sizeLimit": "200Gi", "mountPath": "/cache"}},
        env=[{"name": "HF_HOME", "value": "/cache/hf"}],
    )["spec"]
    assert _volume(pod, MODEL_CACHE_VOLUME)["emptyDir"] == {"sizeLimit": "200Gi"}
    (container,) = pod["containers"]
    assert _mount(container, MODEL_CACHE_VOLUME) == {
        "name": MODEL_CACHE_VOLUME,
        "mountPath": "/cache",
    }
    assert [e for e in container["env"] if e["name"] == "HF_HOME"] == [
        {"name": "HF_HOME", "value": "/cache/hf"}
    ]


def test_a_read_only_claim_is_mounted_read_only() -> None:
    pod = _rendered({"modelCache": {"claimName": "weights", "readOnly": True}})["spec"]
    claim = _volume(pod, MODEL_CACHE_VOLUME)["persistentVolumeClaim"]
    assert claim == {"claimName": "weights", "readOnly": True}
    assert _mount(pod["containers"][0], MODEL_CACHE_VOLUME)["readOnly"] is True


def test_without_pod_settings_the_pod_is_as_before() -> None:
    template = _rendered({})
    pod = template["spec"]
    assert {v["name"] for v in pod["volumes"]} == {"dshm"}
    for field in ("tolerations", "affinity", "securityContext", "imagePullSecrets"):
        assert field not in pod
    assert "env" not in pod["containers"][0]


@pytest.mark.parametrize(
    ("pod", "field"),
    [
        ({"labels": {"app.kubernetes.io/instance": "other"}}, "spec.pod.labels"),
        ({"volumes": [{"name": "dshm", "emptyDir": {}}]}, "spec.pod.volumes[0].name"),
        (
            {"volumeMounts": [{"name": "nope", "mountPath": "/x"}]},
            "spec.pod.volumeMounts[0].name",
        ),
        ({"tolerations": [{"operator": "Equal", "value": "x"}]}, "spec.pod.tolerations[0].key"),
        ({"modelCache": {"claimName": "w", "sizeLimit": "1Gi"}}, "spec.pod.modelCache.sizeLimit"),
        ({"shmSize": "lots"}, "spec.pod.shmSize"),
    ],
)
def test_bad_pod_settings_are_refused_naming_the_field(pod: Obj, field: str) -> None:
    spec = {"engine": "vllm", "model": "org/m", "pod": pod}
    # the API server (the CRD's schema and CEL rules) and the decoder, at the same field
    _, failures = admit({"apiVersion": "specpilot.io/v1alpha1", "kind": "SpecDeployment",
                         "metadata": {"name": "x", "namespace": "ns"}, "spec": spec})  # fmt: skip
    crd, decoded = [strip_indexes(f.path) for f in failures], strip_indexes(field)
    assert any(c.startswith(decoded) or decoded.startswith(c) for c in crd), failures
    with pytest.raises(SpecError) as raised:
        decode_spec(spec)
    assert field in str(raised.value), str(raised.value)
