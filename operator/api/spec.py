"""A SpecDeployment's spec, decoded into frozen, typed values.

Contract: `decode_spec(spec)` takes the `spec` mapping of a SpecDeployment as the API server
stores it (defaults applied, unknown fields pruned) or as a user wrote it (defaults missing) and
returns a `SpecDeploymentSpec`, or raises `SpecError` naming the field as a path
("spec.speculative.candidates[1].method"), the value and what is allowed. It enforces the
CRD's rules (crds/specdeployment.yaml) and runs the engine adapter's capability checks, so an
engine/method mismatch is a `SpecError` too, never a traceback. Defaults live here once, as the
dataclass defaults, and equal the CRD's `default:` values (tests/operator/test_crd_schema.py).

Candidates expand into the configurations the tuner may choose from: each method's `maxK`
becomes minK..maxK (or its explicit `k` list), and speculation off (`method: none`) comes first
when `allowOff` is true. `config_to_status` / `config_from_status` translate a `SpecConfig` to
and from the camelCase shape of `status.currentConfig`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, cast, get_args

from specpilot.operator.api.candidates import (
    ALLOW_OFF_DEFAULT,
    CANDIDATE_METHODS,
    DEFAULT_INITIAL_K,
    decode_speculative,
)
from specpilot.operator.api.fields import SpecError, SpecReader, or_default
from specpilot.runtime.engines import ADAPTERS, LaunchSettings
from specpilot.tuner import GPUS, PROFILES, ConfigError, SpecConfig

__all__ = [
    "CANDIDATE_METHODS",
    "DEFAULT_IMAGES",
    "DEFAULT_INITIAL_K",
    "EnvVar",
    "GpuSpec",
    "SpecDeploymentSpec",
    "SpecError",
    "TuningSpec",
    "config_from_status",
    "config_to_status",
    "decode_spec",
]

EngineName = Literal["vllm", "sglang"]
TuningMode = Literal["auto", "recommend", "off"]
Objective = Literal["throughput", "goodput"]
MetricsSource = Literal["scrape", "prometheus"]

TUNING_MODES: tuple[str, ...] = get_args(TuningMode)
OBJECTIVES: tuple[str, ...] = get_args(Objective)
METRICS_SOURCES: tuple[str, ...] = get_args(MetricsSource)
# Images pinned to the engine versions the adapters target (runtime/engines: vLLM 0.32.0,
# SGLang 0.5.23); the tags move only together with the adapters.
DEFAULT_IMAGES: Mapping[str, str] = {
    "vllm": f"vllm/vllm-openai:v{ADAPTERS['vllm'].version}",
    "sglang": f"lmsysorg/sglang:v{ADAPTERS['sglang'].version}",
}

# Engine flags that select or shape speculative decoding, for either engine. SpecPilot owns
# them; the CRD's CEL rule on extraArgs refuses the same prefixes.
SPECULATIVE_FLAG_PREFIXES: tuple[str, ...] = ("--speculative", "--spec-", "-sc")


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuSpec:
    count: int = 1
    """nvidia.com/gpu per pod (CRD spec.resources.gpus)."""
    type: str = "H100"
    """GPU catalog name for the tuner's prior (tuner/_model/hardware.py GPUS)."""
    model_profile: str | None = None
    """Model profile for the tuner's prior (tuner/_model/hardware.py PROFILES); None: measure
    only."""
    cpu: str | None = None
    memory: str | None = None
    node_selector: tuple[tuple[str, str], ...] = ()
    """Sorted (label, value) pairs."""


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
    mode: TuningMode = "auto"
    objective: Objective = "throughput"
    slo_tpot_p95_ms: float | None = None
    slo_ttft_p95_ms: float | None = None
    interval_s: int = 30
    min_dwell_s: int = 300
    restart_budget_per_hour: int = 4
    rollout_timeout_s: int = 900
    canary: bool = False
    max_surge: int = 1
    max_unavailable: int = 0
    metrics_source: MetricsSource = "scrape"
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
    port: int = 8000
    replicas: int | None = None
    """None: the Deployment's replicas are left to whoever owns them (HPA, KEDA, a user)."""
    gpu: GpuSpec = field(default_factory=GpuSpec)
    extra_args: tuple[str, ...] = ()
    env: tuple[EnvVar, ...] = ()
    allow_off: bool = ALLOW_OFF_DEFAULT
    candidates: tuple[SpecConfig, ...] = (SpecConfig(),)
    """Every configuration the tuner may choose, each checked against the engine."""
    initial: SpecConfig = field(default_factory=SpecConfig)
    tuning: TuningSpec = field(default_factory=TuningSpec)

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
    r = SpecReader(spec, "spec")
    r.known(
        "engine", "image", "command", "model", "servedModelName", "port", "replicas",
        "resources", "extraArgs", "env", "speculative", "tuning",
    )  # fmt: skip
    engine = r.str_("engine", choices=tuple(ADAPTERS))
    if engine is None:
        raise SpecError("spec.engine", None, " | ".join(ADAPTERS))
    model = r.str_("model", max_len=1024)
    if model is None:
        raise SpecError("spec.model", None, "a model repo id or path")
    defaults = SpecDeploymentSpec(engine="vllm", model="-", image="-")
    extra_args = _extra_args(r)
    candidates, allow_off, initial = decode_speculative(r.sub("speculative"), engine)
    decoded = SpecDeploymentSpec(
        engine=cast(EngineName, engine),
        model=model,
        image=r.str_("image", max_len=512) or DEFAULT_IMAGES[engine],
        command=r.strings("command", 32),
        served_model_name=r.str_("servedModelName", max_len=256),
        port=or_default(r.int_("port", 1, 65535), defaults.port),
        replicas=r.int_("replicas", 0, 1024),
        gpu=_gpu(r.sub("resources")),
        extra_args=extra_args,
        env=tuple(_env(e) for e in r.items("env", 64)),
        allow_off=allow_off,
        candidates=candidates,
        initial=initial,
        tuning=_tuning(r.sub("tuning")),
    )
    if len({e.name for e in decoded.env}) != len(decoded.env):
        raise SpecError("spec.env", [e.name for e in decoded.env], "unique variable names")
    adapter = ADAPTERS[engine]
    try:
        adapter.render(initial, decoded.launch_settings())
    except ConfigError as exc:
        raise SpecError("spec.extraArgs", exc.value, exc.allowed, str(exc)) from exc
    return decoded


def _extra_args(r: SpecReader) -> tuple[str, ...]:
    args = r.strings("extraArgs", 64) or ()
    for index, arg in enumerate(args):
        if arg.startswith(SPECULATIVE_FLAG_PREFIXES):
            raise SpecError(
                f"spec.extraArgs[{index}]",
                arg,
                "engine flags other than speculative decoding",
                "speculative flags belong to SpecPilot: declare them under "
                "spec.speculative.candidates",
            )
    return args


def _gpu(r: SpecReader) -> GpuSpec:
    r.known("gpus", "gpuType", "modelProfile", "cpu", "memory", "nodeSelector")
    defaults = GpuSpec()
    selector = r.data.get("nodeSelector") or {}
    if not isinstance(selector, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in selector.items()
    ):
        raise SpecError(f"{r.path}.nodeSelector", selector, "a map of label names to values")
    return GpuSpec(
        count=or_default(r.int_("gpus", 0, 16), defaults.count),
        type=or_default(r.str_("gpuType", choices=tuple(GPUS)), defaults.type),
        model_profile=r.str_("modelProfile", choices=tuple(PROFILES)),
        cpu=r.str_("cpu", max_len=32),
        memory=r.str_("memory", max_len=32),
        node_selector=tuple(sorted(selector.items())),
    )


def _env(r: SpecReader) -> EnvVar:
    r.known("name", "value", "valueFrom")
    name = r.str_("name", max_len=256)
    if name is None:
        raise SpecError(f"{r.path}.name", None, "a variable name")
    if r.has("value") == r.has("valueFrom"):
        raise SpecError(r.path, dict(r.data), "exactly one of value and valueFrom")
    value = r.data.get("value")
    if value is not None:
        if not isinstance(value, str):
            raise SpecError(f"{r.path}.value", value, "a string")
        return EnvVar(name=name, value=value)
    source = r.sub("valueFrom")
    source.known("secretKeyRef", "configMapKeyRef")
    if source.has("secretKeyRef") == source.has("configMapKeyRef"):
        raise SpecError(
            source.path, dict(source.data), "exactly one of secretKeyRef and configMapKeyRef"
        )
    kind = "secretKeyRef" if source.has("secretKeyRef") else "configMapKeyRef"
    ref = source.sub(kind)
    ref.known("name", "key")
    pair = (ref.str_("name", max_len=253), ref.str_("key", max_len=253))
    if pair[0] is None or pair[1] is None:
        raise SpecError(ref.path, dict(ref.data), "an object with name and key")
    typed = (pair[0], pair[1])
    if kind == "secretKeyRef":
        return EnvVar(name=name, secret_key_ref=typed)
    return EnvVar(name=name, config_map_key_ref=typed)


def _tuning(r: SpecReader) -> TuningSpec:
    r.known(
        "mode", "objective", "slo", "intervalSeconds", "minDwellSeconds",
        "restartBudgetPerHour", "rolloutTimeoutSeconds", "canary", "maxSurge", "maxUnavailable",
        "metrics",
    )  # fmt: skip
    d = TuningSpec()
    slo = r.sub("slo")
    slo.known("tpotP95Ms", "ttftP95Ms")
    metrics = r.sub("metrics")
    metrics.known("source", "prometheusUrl")
    tuning = TuningSpec(
        mode=cast(TuningMode, or_default(r.str_("mode", choices=TUNING_MODES), d.mode)),
        objective=cast(Objective, or_default(r.str_("objective", choices=OBJECTIVES), d.objective)),
        slo_tpot_p95_ms=slo.num("tpotP95Ms", 100000),
        slo_ttft_p95_ms=slo.num("ttftP95Ms", 3600000),
        interval_s=or_default(r.int_("intervalSeconds", 5, 3600), d.interval_s),
        min_dwell_s=or_default(r.int_("minDwellSeconds", 0, 86400), d.min_dwell_s),
        restart_budget_per_hour=or_default(
            r.int_("restartBudgetPerHour", 0, 60), d.restart_budget_per_hour
        ),
        rollout_timeout_s=or_default(
            r.int_("rolloutTimeoutSeconds", 30, 7200), d.rollout_timeout_s
        ),
        canary=or_default(r.bool_("canary"), d.canary),
        max_surge=or_default(r.int_("maxSurge", 0, 1024), d.max_surge),
        max_unavailable=or_default(r.int_("maxUnavailable", 0, 1024), d.max_unavailable),
        metrics_source=cast(
            MetricsSource,
            or_default(metrics.str_("source", choices=METRICS_SOURCES), d.metrics_source),
        ),
        prometheus_url=metrics.str_("prometheusUrl", max_len=2048),
    )
    if tuning.objective == "goodput" and (
        tuning.slo_tpot_p95_ms is None and tuning.slo_ttft_p95_ms is None
    ):
        raise SpecError(f"{r.path}.slo", None, "tpotP95Ms and/or ttftP95Ms with objective goodput")
    if tuning.max_surge == 0 and tuning.max_unavailable == 0:
        raise SpecError(
            f"{r.path}.maxSurge", 0, "maxSurge > 0 or maxUnavailable > 0 (else no rollout can move)"
        )
    if tuning.metrics_source == "prometheus" and tuning.prometheus_url is None:
        raise SpecError(f"{metrics.path}.prometheusUrl", None, "a Prometheus base URL (http://...)")
    url = tuning.prometheus_url
    if url is not None and not url.startswith(("http://", "https://")):
        raise SpecError(f"{metrics.path}.prometheusUrl", url, "a URL starting http:// or https://")
    return tuning


_STATUS_KEYS = {
    "num_speculative_tokens": "numSpeculativeTokens",
    "draft_model": "draftModel",
    "prompt_lookup_min": "promptLookupMin",
    "prompt_lookup_max": "promptLookupMax",
    "eagle_topk": "eagleTopk",
    "num_draft_tokens": "numDraftTokens",
    "engine_adaptive": "engineAdaptive",
}


def config_to_status(config: SpecConfig) -> dict[str, Any]:
    """The camelCase `status.currentConfig` shape (with a human `description`)."""
    out: dict[str, Any] = {"method": config.method}
    for key, value in config.to_dict().items():
        if key == "schedule":
            out["schedule"] = [{"firstBatch": s, "lastBatch": e, "k": k} for s, e, k in value]
        elif key != "method":
            out[_STATUS_KEYS[key]] = value
    out["description"] = config.describe()
    return out


def config_from_status(data: Mapping[str, Any]) -> SpecConfig:
    """Inverse of `config_to_status` (the description is ignored)."""
    back = {v: k for k, v in _STATUS_KEYS.items()}
    values: dict[str, Any] = {}
    for key, value in data.items():
        if key == "schedule":
            values["schedule"] = [(t["firstBatch"], t["lastBatch"], t["k"]) for t in value]
        elif key == "method":
            values["method"] = value
        elif key != "description":
            values[back.get(key, key)] = value
    return SpecConfig.from_dict(values)
