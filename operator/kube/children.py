"""The objects a SpecDeployment owns, as plain dicts: Deployment(s), Service, ConfigMap, monitor.

Contract: every function here is pure and deterministic (same input -> equal dicts, built in
the same key order, so their JSON is byte-identical): reconciles compare desired with live and
patch only a difference. Nothing here talks to the API or imports kopf; the handlers adopt the
dicts (`kopf.adopt`) and apply them.

- The engine container runs exactly what a user would type: `adapter.program("python3")` (or
  `spec.command`) plus `adapter.render(config, launch)`; the running `SpecConfig` is also
  written as JSON in the pod-template annotation `CONFIG_ANNOTATION` so the actuator, tests
  and humans read what runs without parsing arguments.
- Rollouts drop no request: a terminating engine serves through `PRE_STOP_SLEEP_S` (the
  endpoints drop it meanwhile), then finishes what it holds for up to `DRAIN_S` (vLLM told by
  `--shutdown-timeout`, whose default 0 aborts every request in flight; SGLang drains by
  itself) within the pod's grace period (`termination_grace_s`).
- Replicas: the main Deployment carries `spec.replicas` only when the SpecDeployment sets it.
  The scale subresource makes replicas the user's, an HPA's or KEDA's; SpecPilot never writes
  a count of its own, so it never fights them. A canary always has 1 replica.
- Sidecar files (SGLang's adaptive config) go into an immutable ConfigMap named by a hash of
  its content and mounted at `LaunchSettings.sidecar_dir`: pods of the old template keep
  their file during a rollout. Unreferenced ones are for the reconciler to delete (they carry
  `SIDECAR_LABEL`).
"""

from __future__ import annotations

import hashlib
import json
import math
import posixpath
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, Literal

from specpilot.operator.api.names import (
    APP_NAME,
    CONFIG_ANNOTATION,
    ENGINE_LABEL,
    INSTANCE_LABEL,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    NAME_LABEL,
    ROLE_LABEL,
    SHM_PATH,
    SHM_VOLUME,
    SIDECAR_LABEL,
    SIDECAR_VOLUME,
)
from specpilot.operator.api.spec import SpecDeploymentSpec
from specpilot.operator.kube.engine_pod import apply_pod_settings, extra_resources
from specpilot.operator.kube.monitor_labels import configured_monitor_labels
from specpilot.runtime.engines import get_adapter
from specpilot.tuner import SpecConfig

Role = Literal["main", "canary"]
MonitorKind = Literal["PodMonitor", "ServiceMonitor"]

CONTAINER_NAME = "engine"
PORT_NAME = "http"
CONTAINER_PYTHON = "python3"
"""Interpreter in the engine images (vllm/vllm-openai and lmsysorg/sglang)."""
HEALTH_PATH = "/health"
METRICS_PATH = "/metrics"
SCRAPE_INTERVAL = "15s"
STARTUP_PROBE_PERIOD_S = 10
PRE_STOP_SLEEP_S = 10
"""Seconds a terminating engine keeps serving before SIGTERM; within the pod's grace period."""
DRAIN_S = 45
"""Seconds a terminating engine may spend finishing the requests it holds once SIGTERM has come,
unless spec.extraArgs set the engine's own drain flag: a switch rolls pods over, and an engine
that aborted its requests would fail every stream in flight at each switch."""
SHUTDOWN_SLACK_S = 5
"""Grace beyond the pre-stop sleep and the drain, for the engine to release the GPU and exit."""


def deployment_name(name: str, role: Role = "main") -> str:
    """`<name>` for main, `<name>-canary` for the canary."""
    return name if role == "main" else f"{name}-canary"


def service_name(name: str) -> str:
    return name


def service_url(name: str, namespace: str, spec: SpecDeploymentSpec) -> str:
    """The engine's endpoint inside the cluster (`status.url`): the Service's DNS name."""
    return f"http://{service_name(name)}.{namespace}.svc:{spec.port}"


def monitor_name(name: str) -> str:
    return name


def sidecar_config_map_name(name: str, role: Role, files: dict[str, str]) -> str:
    """`<deployment>-sidecar-<8 hex of the content>`: a new content is a new, immutable map."""
    digest = hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()[:8]
    return f"{deployment_name(name, role)}-sidecar-{digest}"


def selector_labels(name: str, role: Role | None = None) -> dict[str, str]:
    """Pods of one SpecDeployment (both roles when `role` is None: the Service's selector).
    Stable for the object's life, since a Deployment's selector is immutable."""
    labels = {NAME_LABEL: APP_NAME, INSTANCE_LABEL: name}
    if role is not None:
        labels[ROLE_LABEL] = role
    return labels


def pod_selector(name: str) -> str:
    """`status.selector` for the scale subresource: the main Deployment's pods."""
    return ",".join(f"{k}={v}" for k, v in selector_labels(name, "main").items())


def _labels(name: str, spec: SpecDeploymentSpec, role: Role | None = None) -> dict[str, str]:
    return {**selector_labels(name, role), MANAGED_BY_LABEL: MANAGED_BY, ENGINE_LABEL: spec.engine}


def _meta(
    name: str, namespace: str, labels: dict[str, str], annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": labels}
    if annotations:
        meta["annotations"] = annotations
    return meta


def sidecar_files(spec: SpecDeploymentSpec, config: SpecConfig) -> dict[str, str]:
    """File name (inside the sidecar dir) -> content for this config; empty for most."""
    launch = spec.launch_settings()
    files = get_adapter(spec.engine).sidecar_files(config, launch)
    out: dict[str, str] = {}
    for path, content in sorted(files.items()):
        # A ConfigMap mounted as a directory holds flat file names only.
        if posixpath.dirname(path) != launch.sidecar_dir:
            raise ValueError(f"sidecar file {path} is not directly in {launch.sidecar_dir}")
        out[posixpath.basename(path)] = content
    return out


def desired_config_map(
    *, name: str, namespace: str, spec: SpecDeploymentSpec, config: SpecConfig, role: Role = "main"
) -> dict[str, Any] | None:
    """The sidecar ConfigMap for this config, or None when the command line refers to no file."""
    files = sidecar_files(spec, config)
    if not files:
        return None
    labels = {**_labels(name, spec, role), SIDECAR_LABEL: "true"}
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(sidecar_config_map_name(name, role, files), namespace, labels),
        "immutable": True,
        "data": files,
    }


def container_command(spec: SpecDeploymentSpec) -> list[str]:
    if spec.command is not None:
        return list(spec.command)
    return get_adapter(spec.engine).program(CONTAINER_PYTHON)


def container_args(spec: SpecDeploymentSpec, config: SpecConfig) -> list[str]:
    adapter = get_adapter(spec.engine)
    launch = spec.launch_settings()
    if adapter.drain_flags and spec.drain_s is None:
        drain = (adapter.drain_flags[0], str(DRAIN_S))
        launch = replace(launch, extra_args=(*drain, *launch.extra_args))
    return adapter.render(config, launch)


def termination_grace_s(spec: SpecDeploymentSpec) -> int:
    """The pod's grace period: the pre-stop sleep, the engine's drain, and the slack to exit."""
    drain_s = DRAIN_S if spec.drain_s is None else spec.drain_s
    return PRE_STOP_SLEEP_S + drain_s + SHUTDOWN_SLACK_S


def _resources(spec: SpecDeploymentSpec) -> dict[str, Any]:
    requests: dict[str, str] = {}
    limits: dict[str, str] = {}
    if spec.gpu.count:
        # Extended resources must have requests == limits.
        requests["nvidia.com/gpu"] = limits["nvidia.com/gpu"] = str(spec.gpu.count)
    if spec.gpu.cpu is not None:
        requests["cpu"] = spec.gpu.cpu
    if spec.gpu.memory is not None:
        requests["memory"] = limits["memory"] = spec.gpu.memory
    out: dict[str, Any] = {}
    if requests:
        out["requests"] = requests
    if limits:
        out["limits"] = limits
    return extra_resources(out, dict(spec.gpu.extra))


def _env(spec: SpecDeploymentSpec) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for var in spec.env:
        if var.value is not None:
            out.append({"name": var.name, "value": var.value})
        elif var.secret_key_ref is not None:
            ref = {"name": var.secret_key_ref[0], "key": var.secret_key_ref[1]}
            out.append({"name": var.name, "valueFrom": {"secretKeyRef": ref}})
        elif var.config_map_key_ref is not None:
            ref = {"name": var.config_map_key_ref[0], "key": var.config_map_key_ref[1]}
            out.append({"name": var.name, "valueFrom": {"configMapKeyRef": ref}})
    return out


def _probe(period_s: int, failures: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": HEALTH_PATH, "port": PORT_NAME},
        "periodSeconds": period_s,
        "timeoutSeconds": 5,
        "failureThreshold": failures,
    }


def _pod_spec(
    spec: SpecDeploymentSpec, config: SpecConfig, config_map: dict[str, Any] | None
) -> dict[str, Any]:
    launch = spec.launch_settings()
    # The startup probe gives model loading the whole rollout timeout; past it the actuator
    # rolls back anyway.
    startup_failures = max(1, math.ceil(spec.tuning.rollout_timeout_s / STARTUP_PROBE_PERIOD_S))
    container: dict[str, Any] = {
        "name": CONTAINER_NAME,
        "image": spec.image,
        "command": container_command(spec),
        "args": container_args(spec, config),
        "ports": [{"name": PORT_NAME, "containerPort": spec.port, "protocol": "TCP"}],
        # an engine that dies writes no termination message: its last log lines become it,
        # and the rollback reason quotes them (operator/kube/rollout.py)
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    env = _env(spec)
    if env:
        container["env"] = env
    resources = _resources(spec)
    if resources:
        container["resources"] = resources
    container["startupProbe"] = _probe(STARTUP_PROBE_PERIOD_S, startup_failures)
    container["readinessProbe"] = _probe(5, 3)
    container["livenessProbe"] = _probe(10, 6)
    # A terminating pod leaves the Service's endpoints while its container gets SIGTERM, and
    # proxies keep routing to it until they hear: the engine serves through that gap instead of
    # refusing connections mid-rollout. The engines' images ship coreutils' sleep.
    container["lifecycle"] = {"preStop": {"exec": {"command": ["sleep", str(PRE_STOP_SLEEP_S)]}}}
    # Engines share tensors between processes through /dev/shm; the container default is 64 MiB.
    mounts: list[dict[str, Any]] = [{"name": SHM_VOLUME, "mountPath": SHM_PATH}]
    volumes: list[dict[str, Any]] = [{"name": SHM_VOLUME, "emptyDir": {"medium": "Memory"}}]
    if config_map is not None:
        mounts.append({"name": SIDECAR_VOLUME, "mountPath": launch.sidecar_dir, "readOnly": True})
        volumes.append(
            {"name": SIDECAR_VOLUME, "configMap": {"name": config_map["metadata"]["name"]}}
        )
    container["volumeMounts"] = mounts
    pod: dict[str, Any] = {"containers": [container], "volumes": volumes}
    if spec.gpu.node_selector:
        pod["nodeSelector"] = dict(spec.gpu.node_selector)
    pod["terminationGracePeriodSeconds"] = termination_grace_s(spec)
    return pod


def desired_deployment(
    *, name: str, namespace: str, spec: SpecDeploymentSpec, config: SpecConfig, role: Role = "main"
) -> dict[str, Any]:
    """The engine Deployment running `config` (rolling update as the spec says: by default
    surge 1, unavailable 0)."""
    config_map = desired_config_map(
        name=name, namespace=namespace, spec=spec, config=config, role=role
    )
    labels = _labels(name, spec, role)
    annotations = {
        CONFIG_ANNOTATION: config.to_json(),
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(spec.port),
        "prometheus.io/path": METRICS_PATH,
    }
    body: dict[str, Any] = {"selector": {"matchLabels": selector_labels(name, role)}}
    if role == "canary":
        body["replicas"] = 1
    elif spec.replicas is not None:
        body["replicas"] = spec.replicas
    body["strategy"] = {
        "type": "RollingUpdate",
        "rollingUpdate": {
            "maxSurge": spec.tuning.max_surge,
            "maxUnavailable": spec.tuning.max_unavailable,
        },
    }
    # The Deployment controller marks the rollout failed (Progressing=False,
    # ProgressDeadlineExceeded) at the same deadline the actuator rolls back on.
    body["progressDeadlineSeconds"] = spec.tuning.rollout_timeout_s
    body["revisionHistoryLimit"] = 5
    pod = _pod_spec(spec, config, config_map)
    template = {"metadata": {"labels": labels, "annotations": annotations}, "spec": pod}
    apply_pod_settings(spec.pod, template, pod, pod["containers"][0])
    body["template"] = template
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(deployment_name(name, role), namespace, labels),
        "spec": body,
    }


def desired_service(*, name: str, namespace: str, spec: SpecDeploymentSpec) -> dict[str, Any]:
    """One Service over main and canary pods (the canary takes its share of the traffic)."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(service_name(name), namespace, _labels(name, spec)),
        "spec": {
            "type": "ClusterIP",
            "selector": selector_labels(name),
            "ports": [
                {"name": PORT_NAME, "port": spec.port, "targetPort": PORT_NAME, "protocol": "TCP"}
            ],
        },
    }


def desired_monitor(
    *,
    name: str,
    namespace: str,
    spec: SpecDeploymentSpec,
    kind: MonitorKind,
    extra_labels: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A Prometheus Operator PodMonitor or ServiceMonitor for the engine's /metrics, with the
    installer's labels (None: `configured_monitor_labels()`) for Prometheus' monitor selector;
    SpecPilot's own labels win."""
    if extra_labels is None:
        extra_labels = configured_monitor_labels()
    endpoint = {"port": PORT_NAME, "path": METRICS_PATH, "interval": SCRAPE_INTERVAL}
    if kind == "PodMonitor":
        body: dict[str, Any] = {
            "selector": {"matchLabels": selector_labels(name)},
            "podMetricsEndpoints": [endpoint],
        }
    else:
        body = {
            "selector": {"matchLabels": selector_labels(name)},
            "endpoints": [endpoint],
        }
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": kind,
        "metadata": _meta(monitor_name(name), namespace, {**extra_labels, **_labels(name, spec)}),
        "spec": body,
    }


def desired_children(
    *,
    name: str,
    namespace: str,
    spec: SpecDeploymentSpec,
    config: SpecConfig,
    canary_config: SpecConfig | None = None,
    monitor_kind: MonitorKind | None = None,
) -> list[dict[str, Any]]:
    """Everything to apply, in apply order: ConfigMaps, Deployments, Service, monitor."""
    roles: list[tuple[Role, SpecConfig]] = [("main", config)]
    if canary_config is not None:
        roles.append(("canary", canary_config))
    children: list[dict[str, Any]] = []
    for role, cfg in roles:
        cm = desired_config_map(name=name, namespace=namespace, spec=spec, config=cfg, role=role)
        if cm is not None:
            children.append(cm)
    for role, cfg in roles:
        children.append(
            desired_deployment(name=name, namespace=namespace, spec=spec, config=cfg, role=role)
        )
    children.append(desired_service(name=name, namespace=namespace, spec=spec))
    if monitor_kind is not None:
        children.append(
            desired_monitor(name=name, namespace=namespace, spec=spec, kind=monitor_kind)
        )
    return children
