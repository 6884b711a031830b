"""A SpecDeployment's spec, decoded into frozen, typed values.

Contract: `decode_spec(spec)` takes the `spec` mapping of a SpecDeployment as the API server
stores it (defaults applied, unknown fields pruned) or as a user wrote it (defaults missing) and
returns a `SpecDeploymentSpec`, or raises `SpecError` naming the field as a path
("spec.speculative.candidates[1].method"), the value and what is allowed. The rules are the API
models' (operator/api/models.py), the same the generated CRD states, so the decoder refuses what
the API server refuses, at the same field; then the engine adapter's capability checks run, so an
engine/method mismatch is a `SpecError` too, never a traceback. Defaults are the models' too:
the dataclasses below take theirs from the models (tests/operator/test_crd_schema.py).

Candidates expand into the configurations the tuner may choose from (operator/api/candidates.py).
`config_to_status` / `config_from_status` translate a `SpecConfig` to and from the camelCase
shape of `status.currentConfig` (operator/api/status.py `ConfigStatus`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, get_args

from specpilot.operator.api import models as api
from specpilot.operator.api.base import field_default
from specpilot.operator.api.candidates import DEFAULT_INITIAL_K, decode_speculative
from specpilot.operator.api.errors import SpecError, validate
from specpilot.operator.api.models import (
    CANDIDATE_METHODS,
    DEFAULT_IMAGES,
    SPECULATIVE_FLAG_PREFIXES,
    MetricsSource,
    Objective,
    TuningMode,
)
from specpilot.operator.api.pod import PodSettings
from specpilot.operator.api.status import ConfigStatus
from specpilot.runtime.engines import (
    ADAPTERS,
    EngineName,
    LaunchSettings,
    drain_from_args,
    max_batch_from_args,
)
from specpilot.tuner import ConfigError, SpecConfig

__all__ = [
    "CANDIDATE_METHODS",
    "DEFAULT_IMAGES",
    "DEFAULT_INITIAL_K",
    "METRICS_SOURCES",
    "OBJECTIVES",
    "SPECULATIVE_FLAG_PREFIXES",
    "TUNING_MODES",
    "EngineName",
    "EnvVar",
    "GpuSpec",
    "MetricsSource",
    "Objective",
    "SpecDeploymentSpec",
    "SpecError",
    "TuningMode",
    "TuningSpec",
    "config_from_status",
    "config_to_status",
    "decode_spec",
]

TUNING_MODES: tuple[str, ...] = get_args(TuningMode)
OBJECTIVES: tuple[str, ...] = get_args(Objective)
METRICS_SOURCES: tuple[str, ...] = get_args(MetricsSource)
# The dataclasses' defaults are the models' (the CRD's `default:`), read once here.
_MODE: TuningMode = field_default(api.Tuning, "mode")
_OBJECTIVE: Objective = field_default(api.Tuning, "objective")
_SOURCE: MetricsSource = field_default(api.Metrics, "source")


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuSpec:
    count: int = field_default(api.Resources, "gpus")
    """nvidia.com/gpu per pod (CRD spec.resources.gpus)."""
    type: str = field_default(api.Resources, "gpu_type")
    """GPU catalog name for the tuner's prior (tuner/_model/hardware.py GPUS)."""
    model_profile: str | None = None
    """Model profile for the tuner's prior (tuner/_model/hardware.py PROFILES); None: measure
    only."""
    cpu: str | None = None
    memory: str | None = None
    node_selector: tuple[tuple[str, str], ...] = ()
    """Sorted (label, value) pairs."""
    extra: tuple[tuple[str, str], ...] = ()
    """Further resources (CRD spec.resources.extra), sorted (name, quantity) pairs."""


@dataclass(frozen=True, slots=True, kw_only=True)
class EnvVar:
    name: str
    value: str | None = None
    secret_key_ref: tuple[str, str] | None = None
    """(secret name, key)."""
    config_map_key_ref: tuple[str, str] | None = None
    """(config map name, key)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TuningSpec:
    mode: TuningMode = _MODE
    objective: Objective = _OBJECTIVE
    slo_tpot_p95_ms: float | None = None
    slo_ttft_p95_ms: float | None = None
    interval_s: int = field_default(api.Tuning, "interval_seconds")
    min_dwell_s: int = field_default(api.Tuning, "min_dwell_seconds")
    restart_budget_per_hour: int = field_default(api.Tuning, "restart_budget_per_hour")
    rollout_timeout_s: int = field_default(api.Tuning, "rollout_timeout_seconds")
    canary: bool = field_default(api.Tuning, "canary")
    explore: bool = field_default(api.Tuning, "explore")
    max_surge: int = field_default(api.Tuning, "max_surge")
    max_unavailable: int = field_default(api.Tuning, "max_unavailable")
    metrics_source: MetricsSource = _SOURCE
    prometheus_url: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class SpecDeploymentSpec:
    engine: EngineName
    model: str
    image: str
    """Resolved: the spec's image or the engine's pinned default."""
    command: tuple[str, ...] | None = None
    """Container command replacing the engine's launcher; None: `adapter.program("python3")`."""
    served_model_name: str | None = None
    port: int = field_default(api.Spec, "port")
    replicas: int | None = None
    """None: the Deployment's replicas are left to whoever owns them (HPA, KEDA, a user)."""
    gpu: GpuSpec = field(default_factory=GpuSpec)
    extra_args: tuple[str, ...] = ()
    max_batch: int | None = None
    """The engine's cap on concurrent requests as extra_args set it (None: its default)."""
    drain_s: int | None = None
    """Seconds extra_args let a terminating engine finish its requests (vLLM's
    --shutdown-timeout); None: not set there, and SpecPilot sets it (operator/kube/children)."""
    env: tuple[EnvVar, ...] = ()
    allow_off: bool = field_default(api.Speculative, "allow_off")
    candidates: tuple[SpecConfig, ...] = (SpecConfig(),)
    """Every configuration the tuner may choose, each checked against the engine."""
    initial: SpecConfig = field(default_factory=SpecConfig)
    tuning: TuningSpec = field(default_factory=TuningSpec)
    pod: PodSettings = field(default_factory=PodSettings)
    """Engine pod settings (CRD spec.pod), validated and frozen; operator/kube/engine_pod.py
    applies them to the pod template."""

    def launch_settings(self) -> LaunchSettings:
        """The non-speculative part of the engine command line."""
        return LaunchSettings(
            model=self.model,
            served_model_name=self.served_model_name,
            port=self.port,
            extra_args=self.extra_args,
        )


def decode_spec(spec: Mapping[str, Any]) -> SpecDeploymentSpec:
    """The typed spec; `SpecError` names the first invalid field, its value and what is allowed."""
    model = validate(api.Spec, spec, "spec")
    candidates, allow_off, initial = decode_speculative(model.speculative, model.engine)
    decoded = SpecDeploymentSpec(
        engine=model.engine,
        model=model.model,
        # The CRD admits empty strings here; empty reads as unset.
        image=model.image or DEFAULT_IMAGES[model.engine],
        command=None if model.command is None else tuple(model.command),
        served_model_name=model.served_model_name or None,
        port=model.port,
        replicas=model.replicas,
        gpu=_gpu(model.resources),
        extra_args=tuple(model.extra_args),
        env=tuple(_env(e) for e in model.env),
        allow_off=allow_off,
        candidates=candidates,
        initial=initial,
        tuning=_tuning(model.tuning),
        pod=model.pod,
    )
    adapter = ADAPTERS[decoded.engine]
    try:
        adapter.render(initial, decoded.launch_settings())
        max_batch = max_batch_from_args(adapter, decoded.extra_args)
        drain_s = drain_from_args(adapter, decoded.extra_args)
    except ConfigError as exc:
        raise SpecError("spec.extraArgs", exc.value, exc.allowed, str(exc)) from exc
    return replace(decoded, max_batch=max_batch, drain_s=drain_s)


def _gpu(resources: api.Resources) -> GpuSpec:
    return GpuSpec(
        count=resources.gpus,
        type=resources.gpu_type,
        model_profile=resources.model_profile,
        cpu=resources.cpu,
        memory=resources.memory,
        node_selector=tuple(sorted(resources.node_selector.items())),
        extra=tuple(sorted(resources.extra.items())),
    )


def _env(var: api.EnvVar) -> EnvVar:
    source = var.value_from
    if source is None:
        return EnvVar(name=var.name, value=var.value)
    if source.secret_key_ref is not None:
        secret = source.secret_key_ref
        return EnvVar(name=var.name, secret_key_ref=(secret.name, secret.key))
    config_map = source.config_map_key_ref
    assert config_map is not None  # EnvVarSource holds exactly one
    return EnvVar(name=var.name, config_map_key_ref=(config_map.name, config_map.key))


def _tuning(tuning: api.Tuning) -> TuningSpec:
    slo = tuning.slo or api.Slo()
    return TuningSpec(
        mode=tuning.mode,
        objective=tuning.objective,
        slo_tpot_p95_ms=slo.tpot_p95_ms,
        slo_ttft_p95_ms=slo.ttft_p95_ms,
        interval_s=tuning.interval_seconds,
        min_dwell_s=tuning.min_dwell_seconds,
        restart_budget_per_hour=tuning.restart_budget_per_hour,
        rollout_timeout_s=tuning.rollout_timeout_seconds,
        canary=tuning.canary,
        explore=tuning.explore,
        max_surge=tuning.max_surge,
        max_unavailable=tuning.max_unavailable,
        metrics_source=tuning.metrics.source,
        prometheus_url=tuning.metrics.prometheus_url,
    )


def _status_key(name: str) -> str:
    return ConfigStatus.model_fields[name].alias or name


def config_to_status(config: SpecConfig) -> dict[str, Any]:
    """The camelCase `status.currentConfig` shape (with a human `description`)."""
    out: dict[str, Any] = {"method": config.method}
    for key, value in config.to_dict().items():
        if key == "schedule":
            out["schedule"] = [{"firstBatch": s, "lastBatch": e, "k": k} for s, e, k in value]
        elif key != "method":
            out[_status_key(key)] = value
    out["description"] = config.describe()
    return out


def config_from_status(data: Mapping[str, Any]) -> SpecConfig:
    """Inverse of `config_to_status` (the description is ignored)."""
    back = {_status_key(name): name for name in ConfigStatus.model_fields}
    values: dict[str, Any] = {}
    for key, value in data.items():
        if key == "schedule":
            values["schedule"] = [(t["firstBatch"], t["lastBatch"], t["k"]) for t in value]
        elif key == "method":
            values["method"] = value
        elif key != "description":
            values[back.get(key, key)] = value
    return SpecConfig.from_dict(values)
