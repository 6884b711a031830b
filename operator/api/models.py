"""The SpecDeployment spec as typed models: the one source of the API's rules.

Contract: `Spec.model_validate(data)` accepts what the CRD (generated from these models by
`specpilot.operator.api.crd`) accepts, and refuses what it refuses, with the same bounds, enums
and CEL rules; a field's docstring is its description in the CRD, its default the CRD's
`default:`. Enums come from the code that gives them meaning: engines from the adapters
(runtime), GPU types and model profiles from the tuner's catalog. The `speculative` section's
models live in operator/api/speculative.py. The three engine-dependent rules on `Spec` are
enforced in Python by the engine adapters' own capability checks (operator/api/candidates.py).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Annotated, Literal, Self

from pydantic import Field, field_validator, model_validator

from specpilot.operator.api.base import (
    MODEL_REF_PATTERN,
    NO_NUL_PATTERN,
    QUANTITY_PATTERN,
    ApiModel,
    Violation,
    cel,
    dump,
    rules,
    validations,
)
from specpilot.operator.api.flags import (
    LAUNCH_FLAGS,
    SPECULATIVE_FLAG_PREFIXES,
    cel_refusing,
    owned_flag,
)
from specpilot.operator.api.pod import QUALIFIED_NAME, PodSettings
from specpilot.operator.api.speculative import CANDIDATE_METHODS, Speculative
from specpilot.runtime.engines import ADAPTERS, EngineName
from specpilot.tuner import GPUS, PROFILES

__all__ = [
    "CANDIDATE_METHODS",
    "DEFAULT_IMAGES",
    "SPECULATIVE_FLAG_PREFIXES",
    "ConfigMapKeyRef",
    "EnvVar",
    "EnvVarSource",
    "Metrics",
    "MetricsSource",
    "Objective",
    "PodSettings",
    "Resources",
    "SecretKeyRef",
    "Slo",
    "Spec",
    "Speculative",
    "Tuning",
    "TuningMode",
]

OWNED_RESOURCES = ("nvidia.com/gpu", "cpu", "memory")
"""Resources set by resources.gpus, cpu and memory (not by resources.extra)."""
_SPECULATIVE_OWNED = (
    "speculative decoding flags (--speculative*, --spec-*, -sc, or an abbreviation) belong to"
    " SpecPilot: declare them under spec.speculative.candidates"
)
_LAUNCH_OWNED = (
    "--model, --model-path, --served-model-name, --host and --port (or an abbreviation) belong"
    " to SpecPilot: set spec.model, spec.servedModelName and spec.port instead"
)
# Images pinned to the engine versions the adapters target; the tags move with the adapters.
DEFAULT_IMAGES: Mapping[str, str] = {
    "vllm": f"vllm/vllm-openai:v{ADAPTERS['vllm'].version}",
    "sglang": f"lmsysorg/sglang:v{ADAPTERS['sglang'].version}",
}

if TYPE_CHECKING:
    GpuType = str
    ModelProfile = str
else:  # Literals built from the catalog, so the CRD's enums follow it.
    GpuType = Literal[tuple(GPUS)]
    ModelProfile = Literal[tuple(PROFILES)]
TuningMode = Literal["auto", "recommend", "off"]
Objective = Literal["latency", "throughput", "goodput"]
MetricsSource = Literal["scrape", "prometheus"]


class SecretKeyRef(ApiModel):
    """A key of a Secret in the same namespace."""

    name: str = Field(min_length=1, max_length=253)
    """Secret name."""
    key: str = Field(min_length=1, max_length=253)
    """Key in the Secret."""


class ConfigMapKeyRef(ApiModel):
    """A key of a ConfigMap in the same namespace."""

    name: str = Field(min_length=1, max_length=253)
    """ConfigMap name."""
    key: str = Field(min_length=1, max_length=253)
    """Key in the ConfigMap."""


class EnvVarSource(ApiModel):
    """Value read from a Secret or a ConfigMap key."""

    model_config = rules(
        cel(
            "has(self.secretKeyRef) != has(self.configMapKeyRef)",
            "set exactly one of secretKeyRef and configMapKeyRef",
        )
    )

    secret_key_ref: SecretKeyRef | None = None
    config_map_key_ref: ConfigMapKeyRef | None = None

    @model_validator(mode="after")
    def _one_source(self) -> Self:
        if (self.secret_key_ref is None) == (self.config_map_key_ref is None):
            raise Violation("", dump(self), "exactly one of secretKeyRef and configMapKeyRef")
        return self


class EnvVar(ApiModel):
    """One environment variable; set value or valueFrom."""

    model_config = rules(
        cel("has(self.value) != has(self.valueFrom)", "set exactly one of value and valueFrom")
    )

    name: str = Field(min_length=1, max_length=256, pattern=r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
    """Variable name."""
    value: str | None = Field(default=None, max_length=32768)
    """Literal value."""
    value_from: EnvVarSource | None = None

    @model_validator(mode="after")
    def _one_value(self) -> Self:
        if (self.value is None) == (self.value_from is None):
            raise Violation("", dump(self), "exactly one of value and valueFrom")
        return self


class Resources(ApiModel):
    """GPUs and other resources of each engine pod."""

    gpus: int = Field(default=1, ge=0, le=16)
    """nvidia.com/gpu requested (and limited) per pod."""
    gpu_type: GpuType = "H100"
    """GPU model, the catalog entry the tuner's roofline prior uses. It does not schedule pods:
    put the node label in nodeSelector."""
    model_profile: ModelProfile | None = None
    """Model shape for the tuner's prior (tuner/_model/hardware.py profiles); unset, the tuner
    learns the step time from measurements only."""
    cpu: str | None = Field(default=None, max_length=32, pattern=r"^[0-9]+(\.[0-9]+)?m?$")
    """CPU requested per pod (a Kubernetes quantity such as "8" or "500m")."""
    memory: str | None = Field(
        default=None, max_length=32, pattern=r"^[0-9]+(\.[0-9]+)?([EPTGMK]i?|[numk])?$"
    )
    """Memory requested and limited per pod (a quantity such as "64Gi")."""
    node_selector: dict[
        str, Annotated[str, Field(max_length=256, description="Required value of the node label.")]
    ] = Field(default_factory=dict, max_length=16)
    """Node labels the pods require, e.g. nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3."""
    extra: dict[
        str,
        Annotated[
            str,
            Field(max_length=32, pattern=QUANTITY_PATTERN, description="Quantity per pod."),
        ],
    ] = Field(
        default_factory=dict,
        max_length=16,
        json_schema_extra=validations(
            cel(
                f"self.all(k, !(k in {list(OWNED_RESOURCES)!r}))",
                "nvidia.com/gpu, cpu and memory are set by resources.gpus, resources.cpu and"
                " resources.memory, not by resources.extra",
            ),
            cel(
                f"self.all(k, size(k) <= 316 && k.matches('{QUALIFIED_NAME}'))",
                "resource names are qualified names such as rdma/ib or ephemeral-storage",
            ),
        ),
    )
    """Further resources per pod, requested and limited alike (extended resources need
    requests equal to limits), e.g. rdma/ib: "1" or ephemeral-storage: 100Gi."""

    @field_validator("extra")
    @classmethod
    def _extra_resources(cls, extra: dict[str, str]) -> dict[str, str]:
        for name in extra:
            if name in OWNED_RESOURCES:
                raise Violation(
                    name, name, "a resource other than nvidia.com/gpu, cpu and memory",
                    "set it with resources.gpus, resources.cpu or resources.memory",
                )  # fmt: skip
            if len(name) > 316 or not re.fullmatch(QUALIFIED_NAME, name):
                raise Violation(name, name, f"a resource name matching {QUALIFIED_NAME}")
        return extra


class Slo(ApiModel):
    """Latency targets, used with objectives latency and goodput (throughput ignores them).
    Configurations predicted to break tpotP95Ms are skipped; a switch is charged for the
    requests its restart would push past either target."""

    tpot_p95_ms: float | None = Field(default=None, ge=1, le=100000)
    """95th percentile time per output token, milliseconds. At least 1: the fastest decode step
    in SpecPilot's GPU catalog (H200 with qwen3-30b-a3b, one token, by the roofline) takes 2.5
    ms, so under 1 ms every step would have to yield 2.5 tokens or more; a smaller value is taken
    for a unit slip (seconds or nanoseconds for milliseconds) that no configuration could meet."""
    ttft_p95_ms: float | None = Field(default=None, ge=10, le=3600000)
    """95th percentile time to first token, milliseconds. At least 10: a first token needs a
    prefill step and the HTTP round trip (the fastest decode step alone is 2.5 ms, see
    tpotP95Ms); a smaller value is taken for a unit slip no configuration could meet."""


class Metrics(ApiModel):
    """Where observations come from."""

    model_config = rules(
        cel(
            "self.source != 'prometheus' || has(self.prometheusUrl)",
            "source prometheus needs prometheusUrl",
            ".prometheusUrl",
        )
    )

    source: MetricsSource = "scrape"
    """scrape reads the pods' /metrics directly; prometheus queries PromQL."""
    prometheus_url: str | None = Field(
        default=None, max_length=2048, pattern="^https?://[^\\s/?#@]+([/?#][^\\s]*)?$"
    )
    """Prometheus base URL with a host, e.g. http://prometheus.monitoring:9090 (no credentials
    in it: they would show in the object and in logs)."""

    @model_validator(mode="after")
    def _url_for_prometheus(self) -> Self:
        if self.source == "prometheus" and self.prometheus_url is None:
            raise Violation("prometheusUrl", None, "a Prometheus base URL (http://...)")
        return self


class Tuning(ApiModel):
    """How SpecPilot tunes the running configuration."""

    model_config = rules(
        cel(
            "self.objective != 'goodput'"
            " || (has(self.slo) && (has(self.slo.tpotP95Ms) || has(self.slo.ttftP95Ms)))",
            "objective goodput needs an SLO (slo.tpotP95Ms or slo.ttftP95Ms)",
            ".slo",
        ),
        cel(
            "self.maxSurge > 0 || self.maxUnavailable > 0",
            "maxSurge and maxUnavailable cannot both be 0 (the rollout could not progress)",
            ".maxSurge",
        ),
    )

    mode: TuningMode = "auto"
    """auto applies decisions; recommend only writes status.recommendation and an Event; off pins
    the initial configuration."""
    objective: Objective = "latency"
    """latency minimises the mean end-to-end latency users wait (per-token latency at the load,
    and capacity kept above the forecast arrival rate so no queue builds), within the SLO when
    one is set; throughput maximises generated tokens/s whatever the latency; goodput maximises
    the tokens/s of requests that meet the SLO (slo)."""
    slo: Slo | None = None
    interval_seconds: int = Field(default=30, ge=5, le=3600)
    """Seconds between tuner ticks (one observation window each). From 75 s, a new
    deployment's first window is also looked at after a third of it, and a config already
    short of its load is left then."""
    min_dwell_seconds: int = Field(default=300, ge=0, le=86400)
    """Least seconds a configuration runs before another restart."""
    restart_budget_per_hour: int = Field(default=4, ge=0, le=60)
    """Most restarts (switches) per hour; 0 never restarts."""
    rollout_timeout_seconds: int = Field(default=900, ge=30, le=7200)
    """Seconds new pods have to become Ready (model load included) before the switch is rolled
    back."""
    canary: bool = False
    """With at least 2 replicas, or 1 and maxSurge above 0, run a candidate first as a 1-replica
    canary behind the same Service and promote it only if it measures as predicted. With
    spec.replicas at 2 or more it takes one main replica's place (main scaled to N-1 while it
    runs, on the spare GPU first when maxSurge is above 0); beside a single replica it runs on
    the spare GPU at all of the load (the Service routed to it, the replica idle and warm as
    the way back, stopped as soon as it congests, promoted only if requests stay 10% less
    long, then serving on while the replica is replaced); where an autoscaler owns the count
    it runs beside the main pods."""
    explore: bool = False
    """With at least 2 replicas, or 1 and maxSurge above 0, let the tuner try a candidate it has
    not measured, or is unsure of, as a trial on a 1-replica canary (taking 1/N of the traffic;
    beside a single replica, all of it, with the replica as the way back), when the trial's
    expected improvement outweighs its expected loss. Off by default: in the bench's 4-replica
    ablations (bench/results/ablations.md) trials paid for themselves in 1 of 50 world runs
    and cost in 17; beside one replica they paid where a trial moved it in 6 of 7 Poisson
    cells and 1 of 4 Azure worlds (costing in the other 3), and most other gains there were
    the spare GPU's capacity while a rejected canary served, not what the trials taught;
    started on EAGLE-3 K=3, the default start, they paid in 4 of 70 Poisson cells and cost
    in one."""
    max_surge: int = Field(default=1, ge=0, le=1024)
    """Extra pods a switch may start before old ones stop (the Deployment's rolling update). 1
    keeps full capacity during a switch but needs a spare GPU; with no spare GPU, set 0 and
    maxUnavailable 1."""
    max_unavailable: int = Field(default=0, ge=0, le=1024)
    """Pods a switch may stop before their replacements are Ready (capacity dips while a new pod
    loads the model)."""
    metrics: Metrics = Field(default_factory=Metrics, json_schema_extra={"default": {}})

    @model_validator(mode="after")
    def _cross_field(self) -> Self:
        slo = self.slo
        if self.objective == "goodput" and (
            slo is None or (slo.tpot_p95_ms is None and slo.ttft_p95_ms is None)
        ):
            raise Violation("slo", dump(slo), "tpotP95Ms and/or ttftP95Ms with objective goodput")
        if self.max_surge == 0 and self.max_unavailable == 0:
            raise Violation(
                "maxSurge", 0, "maxSurge > 0 or maxUnavailable > 0 (else no rollout can move)"
            )
        return self


_NO_TREE_ON_VLLM = "(!has(c.options.eagleTopk) && !has(c.options.numDraftTokens))"
_NO_LOOKUP_ON_SGLANG = "(!has(c.options.promptLookupMin) && !has(c.options.promptLookupMax))"


class Spec(ApiModel):
    """What to run and how SpecPilot may tune it."""

    # Engine capabilities; in Python the adapters check them (candidates.py), with the same
    # tables that render the engines' command lines.
    model_config = rules(
        cel(
            "self.engine != 'sglang' || !has(self.speculative)"
            " || self.speculative.candidates.all(c, c.method != 'suffix')",
            "engine sglang has no method suffix; allowed methods for sglang: ngram, draft_model,"
            " eagle, eagle3, mtp, dflash",
            ".speculative.candidates",
        ),
        cel(
            "self.engine != 'vllm' || !has(self.speculative)"
            f" || self.speculative.candidates.all(c, !has(c.options) || {_NO_TREE_ON_VLLM})",
            "options.eagleTopk and options.numDraftTokens (tree drafting) are allowed with engine"
            " sglang only; vllm drafts chains",
            ".speculative.candidates",
        ),
        cel(
            "self.engine != 'sglang' || !has(self.speculative)"
            f" || self.speculative.candidates.all(c, !has(c.options) || {_NO_LOOKUP_ON_SGLANG})",
            "options.promptLookupMin and options.promptLookupMax are allowed with engine vllm"
            " only; sglang has no prompt-lookup window setting",
            ".speculative.candidates",
        ),
    )

    engine: EngineName
    """Inference engine to run."""
    image: str | None = Field(
        default=None,
        min_length=1,
        max_length=512,
        pattern="^[^\\s]+$",
        description="Engine container image. Default per engine, pinned to the version"
        " SpecPilot's adapters target: " + " or ".join(DEFAULT_IMAGES.values()) + ".",
    )
    command: (
        list[
            Annotated[
                str,
                Field(
                    max_length=1024,
                    pattern=NO_NUL_PATTERN,
                    description="One element of the command.",
                ),
            ]
        ]
        | None
    ) = Field(
        default=None,
        min_length=1,
        max_length=32,
        json_schema_extra=validations(
            cel_refusing("speculative", _SPECULATIVE_OWNED),
            cel_refusing("launch", _LAUNCH_OWNED),
        ),
    )
    """Container command replacing the engine's own launcher (python3 -m the engine's OpenAI
    server); SpecPilot still writes the arguments. For example [specpilot, emulate, --engine,
    vllm] runs the SpecPilot emulator on nodes without GPUs. Run without a shell: each element is
    one argv entry. Flags SpecPilot writes are refused here as in extraArgs."""
    model: str = Field(min_length=1, max_length=1024, pattern=MODEL_REF_PATTERN)
    """Target model, a Hugging Face repo id or a path inside the container (no control
    characters, no leading dash)."""
    served_model_name: str | None = Field(
        default=None, min_length=1, max_length=256, pattern=MODEL_REF_PATTERN
    )
    """Model name clients use in the OpenAI API; default the model."""
    port: int = Field(default=8000, ge=1, le=65535)
    """Port the engine serves HTTP (OpenAI API, /health, /metrics) on."""
    replicas: int | None = Field(default=None, ge=0, le=1024)
    """Engine replicas. Owned by you, an HPA or KEDA (through the scale subresource); SpecPilot
    copies it to its Deployment only when it is set and never changes it. Unset leaves the
    Deployment's replicas alone."""
    resources: Resources = Field(default_factory=Resources, json_schema_extra={"default": {}})
    extra_args: list[
        Annotated[
            str, Field(max_length=4096, pattern=NO_NUL_PATTERN, description="One engine argument.")
        ]
    ] = Field(
        default_factory=list,
        max_length=64,
        json_schema_extra=validations(
            cel_refusing("speculative", _SPECULATIVE_OWNED),
            cel_refusing("launch", _LAUNCH_OWNED),
        ),
    )
    """Further engine flags, passed through unchanged after SpecPilot's own, each one argv entry
    (no shell). Refused: speculative flags and --model, --model-path, --served-model-name,
    --host, --port (or their abbreviations), which SpecPilot writes. The engine's cap on
    concurrent requests (vLLM --max-num-seqs, SGLang --max-running-requests) also tells the
    tuner the batch each config's capacity is read at (unset: 256)."""
    env: list[EnvVar] = Field(
        default_factory=list,
        max_length=64,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    """Environment variables of the engine container."""
    speculative: Speculative | None = None
    tuning: Tuning = Field(default_factory=Tuning, json_schema_extra={"default": {}})
    pod: PodSettings = Field(default_factory=PodSettings)

    @field_validator("extra_args", "command")
    @classmethod
    def _no_owned_flags(cls, args: list[str] | None) -> list[str] | None:
        for index, arg in enumerate(args or ()):
            family = owned_flag(arg)
            if family == "speculative":
                raise Violation(
                    f"[{index}]", arg, "engine flags other than speculative decoding",
                    "speculative flags belong to SpecPilot: declare them under "
                    "spec.speculative.candidates",
                )  # fmt: skip
            if family == "launch":
                raise Violation(
                    f"[{index}]", arg, f"engine flags other than {', '.join(LAUNCH_FLAGS)}",
                    "SpecPilot writes them from spec.model, spec.servedModelName and spec.port",
                )  # fmt: skip
        return args
