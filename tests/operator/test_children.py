"""The child objects a SpecDeployment owns: what the engine container runs, how it rolls out,
and that every object is a valid Kubernetes 1.35 object."""

from __future__ import annotations

import json
import posixpath
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from crd_validation import ROOT

from specpilot.operator.api.names import (
    CONFIG_ANNOTATION,
    INSTANCE_LABEL,
    MANAGED_BY_LABEL,
    NAME_LABEL,
    ROLE_LABEL,
)
from specpilot.operator.api.spec import SpecDeploymentSpec, SpecError, decode_spec
from specpilot.operator.kube.children import (
    DRAIN_S,
    PRE_STOP_SLEEP_S,
    deployment_name,
    desired_children,
    desired_config_map,
    desired_deployment,
    desired_monitor,
    desired_service,
    pod_selector,
    selector_labels,
)
from specpilot.runtime.engines import get_adapter
from specpilot.tuner import SpecConfig

K8S_VERSION = "1.35.0"
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))


def _example(path: Path) -> tuple[str, SpecDeploymentSpec]:
    obj = yaml.safe_load(path.read_text(encoding="utf-8"))
    return obj["metadata"]["name"], decode_spec(obj["spec"])


def _spec(**spec: Any) -> SpecDeploymentSpec:
    return decode_spec({"engine": "vllm", "model": "org/model", **spec})


def _container(deployment: dict[str, Any]) -> dict[str, Any]:
    containers = deployment["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    container: dict[str, Any] = containers[0]
    return container


def _mounted_files(
    spec: SpecDeploymentSpec, config: SpecConfig, deployment: dict[str, Any]
) -> dict[str, str]:
    """The sidecar files as the container sees them: mount path + ConfigMap key."""
    cm = desired_config_map(name="x", namespace="ns", spec=spec, config=config)
    if cm is None:
        return {}
    mounts = _container(deployment)["volumeMounts"]
    (mount,) = [m for m in mounts if m["name"] == "specpilot-sidecar"]
    volumes = deployment["spec"]["template"]["spec"]["volumes"]
    (volume,) = [v for v in volumes if v["name"] == "specpilot-sidecar"]
    assert volume["configMap"]["name"] == cm["metadata"]["name"]
    return {posixpath.join(mount["mountPath"], k): v for k, v in cm["data"].items()}


SCHEDULED = [
    (
        "vllm",
        SpecConfig(method="ngram", num_speculative_tokens=4, schedule=((1, 8, 4), (9, 64, 1))),
    ),
    (
        "sglang",
        SpecConfig(
            method="eagle3",
            num_speculative_tokens=3,
            draft_model="d",
            schedule=((1, 8, 3), (9, 32, 1), (33, 256, 0)),
        ),
    ),
    (
        "sglang",
        SpecConfig(
            method="eagle3", num_speculative_tokens=3, draft_model="d", engine_adaptive=True
        ),
    ),
    (
        "sglang",
        SpecConfig(
            method="eagle",
            num_speculative_tokens=3,
            draft_model="d",
            eagle_topk=4,
            num_draft_tokens=8,
        ),
    ),
]


def _round_trip_cases() -> list[tuple[str, SpecDeploymentSpec, SpecConfig]]:
    cases = []
    for path in EXAMPLES:
        _, spec = _example(path)
        cases += [(f"{path.stem}:{c.describe()}", spec, c) for c in spec.candidates]
    for engine, config in SCHEDULED:
        cases.append((f"{engine}:{config.describe()}", _spec(engine=engine), config))
    return cases


ROUND_TRIP = _round_trip_cases()


@pytest.mark.parametrize(
    ("spec", "config"), [c[1:] for c in ROUND_TRIP], ids=[c[0] for c in ROUND_TRIP]
)
def test_container_args_parse_back_to_the_config(
    spec: SpecDeploymentSpec, config: SpecConfig
) -> None:
    deployment = desired_deployment(name="x", namespace="ns", spec=spec, config=config)
    container = _container(deployment)
    adapter = get_adapter(spec.engine)
    # the engine's launcher, or the spec's command (the emulator example's) in its place
    expected = adapter.program("python3") if spec.command is None else list(spec.command)
    assert container["command"] == expected
    files = _mounted_files(spec, config, deployment)
    assert adapter.parse(container["args"], files=files) == config
    annotation = deployment["spec"]["template"]["metadata"]["annotations"][CONFIG_ANNOTATION]
    assert SpecConfig.from_json(annotation) == config


def test_rolling_update_surges_one_and_never_drops_capacity() -> None:
    spec = _spec()
    deployment = desired_deployment(name="x", namespace="ns", spec=spec, config=SpecConfig())
    assert deployment["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    assert deployment["spec"]["progressDeadlineSeconds"] == spec.tuning.rollout_timeout_s
    # no spare GPU: replace one pod at a time instead
    tight = _spec(tuning={"maxSurge": 0, "maxUnavailable": 1})
    replace_in_place = desired_deployment(name="x", namespace="ns", spec=tight, config=SpecConfig())
    assert replace_in_place["spec"]["strategy"]["rollingUpdate"] == {
        "maxSurge": 0,
        "maxUnavailable": 1,
    }


def test_gpu_and_memory_requests_and_limits() -> None:
    spec = _spec(resources={"gpus": 2, "memory": "64Gi", "cpu": "8"})
    resources = _container(
        desired_deployment(name="x", namespace="ns", spec=spec, config=SpecConfig())
    )["resources"]
    assert resources["requests"] == {"nvidia.com/gpu": "2", "cpu": "8", "memory": "64Gi"}
    assert resources["limits"] == {"nvidia.com/gpu": "2", "memory": "64Gi"}
    no_gpu = _container(
        desired_deployment(
            name="x", namespace="ns", spec=_spec(resources={"gpus": 0}), config=SpecConfig()
        )
    )
    assert "resources" not in no_gpu


def test_probes_cover_model_loading() -> None:
    spec = _spec(tuning={"rolloutTimeoutSeconds": 1200})
    container = _container(
        desired_deployment(name="x", namespace="ns", spec=spec, config=SpecConfig())
    )
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/health", "port": "http"}
    # a crashed engine's last log lines become the termination message the rollback quotes
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 1200


def _grace_and_args(spec: SpecDeploymentSpec) -> tuple[int, list[str], list[str]]:
    deployment = desired_deployment(name="x", namespace="ns", spec=spec, config=SpecConfig())
    container = _container(deployment)
    grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    return grace, container["lifecycle"]["preStop"]["exec"]["command"], container["args"]


def _flag_values(args: list[str], flag: str) -> list[str]:
    return [args[i + 1] for i, token in enumerate(args) if token == flag]


def test_a_terminating_vllm_serves_then_drains_within_the_grace_period() -> None:
    grace, pre_stop, args = _grace_and_args(_spec())
    assert pre_stop == ["sleep", str(PRE_STOP_SLEEP_S)] and PRE_STOP_SLEEP_S >= 5
    # vLLM's own default (0) aborts every request in flight on SIGTERM
    assert _flag_values(args, "--shutdown-timeout") == [str(DRAIN_S)] and DRAIN_S >= 30
    assert grace > PRE_STOP_SLEEP_S + DRAIN_S


def test_a_users_own_vllm_drain_is_kept_and_the_grace_period_follows_it() -> None:
    spec = _spec(extraArgs=["--shutdown-timeout", "300", "--max-num-seqs", "64"])
    grace, _, args = _grace_and_args(spec)
    assert _flag_values(args, "--shutdown-timeout") == ["300"]
    assert grace > PRE_STOP_SLEEP_S + 300
    abort = _spec(extraArgs=["--shutdown-timeout=0"])
    grace, _, args = _grace_and_args(abort)
    assert "--shutdown-timeout" not in args and "--shutdown-timeout=0" in args
    assert PRE_STOP_SLEEP_S < grace < PRE_STOP_SLEEP_S + DRAIN_S


def test_sglang_drains_by_itself_within_the_grace_period() -> None:
    grace, pre_stop, args = _grace_and_args(_spec(engine="sglang"))
    assert pre_stop == ["sleep", str(PRE_STOP_SLEEP_S)]
    assert not any(token.startswith("--shutdown") for token in args)
    assert grace > PRE_STOP_SLEEP_S + DRAIN_S


@pytest.mark.parametrize("value", ["-1", "soon", ""])
def test_a_drain_that_is_not_seconds_names_the_flag(value: str) -> None:
    with pytest.raises(SpecError) as err:
        _spec(extraArgs=["--shutdown-timeout", value])
    assert err.value.field == "spec.extraArgs"
    assert "--shutdown-timeout" in str(err.value) and "integer" in str(err.value)


def test_replicas_belong_to_the_user_or_the_autoscaler() -> None:
    unset = desired_deployment(name="x", namespace="ns", spec=_spec(), config=SpecConfig())
    assert "replicas" not in unset["spec"]
    pinned = desired_deployment(
        name="x", namespace="ns", spec=_spec(replicas=3), config=SpecConfig()
    )
    assert pinned["spec"]["replicas"] == 3
    canary = desired_deployment(
        name="x", namespace="ns", spec=_spec(replicas=3), config=SpecConfig(), role="canary"
    )
    assert canary["spec"]["replicas"] == 1
    assert canary["metadata"]["name"] == deployment_name("x", "canary") == "x-canary"


def test_labels_selectors_and_naming() -> None:
    spec = _spec()
    main = desired_deployment(name="x", namespace="ns", spec=spec, config=SpecConfig())
    canary = desired_deployment(
        name="x", namespace="ns", spec=spec, config=SpecConfig(), role="canary"
    )
    service = desired_service(name="x", namespace="ns", spec=spec)
    for deployment, role in ((main, "main"), (canary, "canary")):
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert labels[MANAGED_BY_LABEL] == "specpilot"
        assert labels[INSTANCE_LABEL] == "x" and labels[ROLE_LABEL] == role and NAME_LABEL in labels
        selector = deployment["spec"]["selector"]["matchLabels"]
        assert selector.items() <= labels.items()
        # The Service reaches both roles: the canary serves its share of real traffic.
        assert service["spec"]["selector"].items() <= labels.items()
    # Main and canary selectors are disjoint, so neither Deployment adopts the other's pods.
    assert main["spec"]["selector"]["matchLabels"] != canary["spec"]["selector"]["matchLabels"]
    assert pod_selector("x") == ",".join(
        f"{k}={v}" for k, v in selector_labels("x", "main").items()
    )
    annotations = main["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == "8000"


def test_sidecar_config_map_is_immutable_and_named_by_content() -> None:
    spec = _spec(engine="sglang")
    first, second = (
        SCHEDULED[1][1],
        SpecConfig(
            method="eagle3",
            num_speculative_tokens=3,
            draft_model="d",
            schedule=((1, 4, 3), (5, 9, 1)),
        ),
    )
    a = desired_config_map(name="x", namespace="ns", spec=spec, config=first)
    b = desired_config_map(name="x", namespace="ns", spec=spec, config=second)
    assert a is not None and b is not None
    assert a["immutable"] is True
    assert a["metadata"]["name"] != b["metadata"]["name"]
    assert a["metadata"]["name"].startswith("x-sidecar-")
    plain = SpecConfig(method="eagle3", num_speculative_tokens=3, draft_model="d")
    assert desired_config_map(name="x", namespace="ns", spec=spec, config=plain) is None


def test_command_override_keeps_speculative_args() -> None:
    spec = _spec(command=["specpilot", "emulate", "--engine", "vllm"])
    config = SpecConfig(method="ngram", num_speculative_tokens=3)
    container = _container(desired_deployment(name="x", namespace="ns", spec=spec, config=config))
    assert container["command"] == ["specpilot", "emulate", "--engine", "vllm"]
    assert get_adapter("vllm").parse(container["args"]) == config


def test_children_are_deterministic() -> None:
    name, spec = _example(ROOT / "examples" / "sglang-dflash.yaml")
    config = spec.candidates[-1]

    def render() -> str:
        again = decode_spec(
            yaml.safe_load((ROOT / "examples" / "sglang-dflash.yaml").read_text())["spec"]
        )
        children = desired_children(
            name=name,
            namespace="ns",
            spec=again,
            config=config,
            canary_config=spec.initial,
            monitor_kind="PodMonitor",
        )
        return json.dumps(children)

    assert render() == render()


def test_children_order_and_canary() -> None:
    spec = _spec(engine="sglang")
    children = desired_children(
        name="x",
        namespace="ns",
        spec=spec,
        config=SCHEDULED[1][1],
        canary_config=SCHEDULED[2][1],
        monitor_kind="ServiceMonitor",
    )
    kinds = [(c["kind"], c["metadata"]["name"]) for c in children]
    assert [k for k, _ in kinds] == [
        "ConfigMap",
        "Deployment",
        "Deployment",
        "Service",
        "ServiceMonitor",
    ]
    assert kinds[1][1] == "x" and kinds[2][1] == "x-canary"
    for child in children:
        assert child["metadata"]["namespace"] == "ns"


@pytest.mark.parametrize("kind", ["PodMonitor", "ServiceMonitor"])
def test_monitor_selects_the_engine_pods(kind: str) -> None:
    spec = _spec()
    monitor = desired_monitor(name="x", namespace="ns", spec=spec, kind=kind)  # type: ignore[arg-type]
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["spec"]["selector"]["matchLabels"] == selector_labels("x")
    endpoints = monitor["spec"]["podMetricsEndpoints" if kind == "PodMonitor" else "endpoints"]
    assert endpoints[0]["port"] == "http" and endpoints[0]["path"] == "/metrics"


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: Path(p).name)
def test_children_are_valid_kubernetes_objects(path: Path) -> None:
    name, spec = _example(path)
    sglang = spec.engine == "sglang"
    config = SCHEDULED[1][1] if sglang else spec.initial
    children = desired_children(
        name=name, namespace="ns", spec=spec, config=config, canary_config=spec.initial
    )
    assert any(c["kind"] == "ConfigMap" for c in children) == sglang
    for child in children:
        kubernetes_validate.validate(child, K8S_VERSION, strict=True)
