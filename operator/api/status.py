"""The SpecDeployment status as typed models, and the whole object (`SpecDeployment`).

Contract: these models describe what SpecPilot writes under `.status` (the CRD's status schema
is generated from them); field names equal `SpecConfig`'s where they carry one of its fields, so
`config_to_status` reads its camelCase keys from here. `SpecDeployment` is the object the CRD's
`openAPIV3Schema` describes: apiVersion, kind, metadata, spec (operator/api/models.py) and
status, with the rule on metadata.name.
"""

from __future__ import annotations

import re
from typing import Any, Literal, Self

from pydantic import Field, model_validator
from pydantic.config import JsonDict

from specpilot.operator.api.base import ApiModel, Violation, cel, rules
from specpilot.operator.api.models import Spec
from specpilot.operator.api.names import API_VERSION, KIND

Phase = Literal["Pending", "Deploying", "Running", "Switching", "RollingBack", "Degraded", "Failed"]
Regime = Literal["memory-bound", "transition", "compute-bound", "unknown"]
ConditionStatus = Literal["True", "False", "Unknown"]

_INT32: JsonDict = {"format": "int32"}
_INT64: JsonDict = {"format": "int64"}
_DATE_TIME: JsonDict = {"format": "date-time"}
MAX_NAME_LENGTH = 56
"""metadata.name names the Service and, with "-canary", a Deployment (63 characters at most)."""
_NAME_PATTERN = "^[a-z]([-a-z0-9]*[a-z0-9])?$"


class ScheduleEntry(ApiModel):
    """One batch-size range and its K."""

    first_batch: int | None = None
    """First batch size of the range."""
    last_batch: int | None = None
    """Last batch size of the range (inclusive)."""
    k: int | None = None
    """K in this range (0 drafts nothing)."""


class ConfigStatus(ApiModel):
    """A speculative configuration as status shows it (a SpecConfig in camelCase)."""

    method: str | None = None
    """Speculative method ('none' is a plain server)."""
    num_speculative_tokens: int | None = None
    """K, speculative tokens per step (the maximum with a schedule)."""
    draft_model: str | None = None
    """Draft model or head."""
    prompt_lookup_min: int | None = None
    """n-gram smallest window."""
    prompt_lookup_max: int | None = None
    """n-gram largest window."""
    eagle_topk: int | None = None
    """Tree branches per step."""
    num_draft_tokens: int | None = None
    """Tree size verified per step."""
    engine_adaptive: bool | None = None
    """The engine adapts K per batch itself."""
    schedule: list[ScheduleEntry] | None = None
    """K per batch-size range."""
    description: str | None = None
    """Human label, e.g. "eagle3 K=3"."""


class Observed(ApiModel):
    """The last observation window."""

    acceptance_length: float | None = None
    """Mean acceptance length (tokens per verify step, bonus included)."""
    batch: float | None = None
    """Mean running requests per replica."""
    tokens_per_second: float | None = None
    """Generated tokens per second, all replicas."""
    tpot_p95_ms: float | None = None
    """95th percentile time per output token, milliseconds."""
    ttft_p95_ms: float | None = None
    """95th percentile time to first token, milliseconds."""
    time: str | None = Field(default=None, json_schema_extra=_DATE_TIME)
    """End of the observation window."""


class LastDecision(ApiModel):
    """The tuner's last decision."""

    action: str | None = None
    """stay, switch, off, or rollback."""
    reason: str | None = None
    """Why, in one line."""
    predicted_gain: float | None = None
    """Relative throughput gain predicted (0.12 is +12%)."""
    config: str | None = None
    """The configuration decided on (human label)."""
    time: str | None = Field(default=None, json_schema_extra=_DATE_TIME)
    """When it was decided."""


class Recommendation(ApiModel):
    """In recommend mode, the configuration SpecPilot would switch to."""

    config: ConfigStatus | None = None
    """The recommended configuration."""
    reason: str | None = None
    """Why, in one line."""
    predicted_gain: float | None = None
    """Relative throughput gain predicted."""
    time: str | None = Field(default=None, json_schema_extra=_DATE_TIME)
    """When it was recommended."""


class Condition(ApiModel):
    """One condition (metav1.Condition)."""

    type: str = Field(max_length=316)
    """Ready, MetricsAvailable, Tuning, Progressing or Degraded."""
    status: ConditionStatus
    """Whether the condition holds."""
    reason: str = Field(max_length=1024)
    """CamelCase reason for the last transition."""
    message: str = Field(max_length=32768)
    """Human-readable details."""
    last_transition_time: str = Field(json_schema_extra=_DATE_TIME)
    """When the status last changed."""
    observed_generation: int | None = Field(default=None, ge=0, json_schema_extra=_INT64)
    """The spec generation the condition was set for."""


class Status(ApiModel):
    """What runs and what SpecPilot observed and decided (written by SpecPilot)."""

    observed_generation: int | None = Field(default=None, json_schema_extra=_INT64)
    """The spec generation this status reflects."""
    phase: Phase | None = None
    """Lifecycle phase."""
    replicas: int | None = Field(default=None, json_schema_extra=_INT32)
    """Engine pods (scale subresource)."""
    ready_replicas: int | None = Field(default=None, ge=0, json_schema_extra=_INT32)
    """Engine pods of the main Deployment that are Ready (serving)."""
    url: str | None = Field(default=None, max_length=512)
    """The engine's OpenAI-compatible endpoint inside the cluster: the Service, as
    http://<name>.<namespace>.svc:<port>."""
    selector: str | None = None
    """Label selector of the engine pods (scale subresource, for HPA)."""
    regime: Regime | None = None
    """Load regime the tuner sees."""
    current_config: ConfigStatus | None = None
    """The speculative configuration running now."""
    observed: Observed | None = None
    last_decision: LastDecision | None = None
    recommendation: Recommendation | None = None
    tuner_state: str | None = Field(default=None, max_length=262144)
    """The tuner's state as compact JSON (persists across operator restarts)."""
    conditions: list[Condition] | None = Field(
        default=None,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    """Ready, MetricsAvailable, Tuning, Progressing and Degraded conditions."""


class SpecDeployment(ApiModel):
    """SpecDeployment runs an LLM with vLLM or SGLang and speculative decoding, and keeps the
    speculative method and the number of speculative tokens tuned to the traffic."""

    model_config = rules(
        cel(
            f"self.metadata.name.matches('{_NAME_PATTERN}')"
            f" && size(self.metadata.name) <= {MAX_NAME_LENGTH}",
            f"metadata.name must be a DNS-1035 label of at most {MAX_NAME_LENGTH} characters (it"
            ' names the Service and, with "-canary", a Deployment)',
        )
    )

    api_version: str | None = Field(
        default=None, description=f"Versioned schema of this object ({API_VERSION})."
    )
    kind: str | None = Field(default=None, description=f"Kind of this object ({KIND}).")
    metadata: dict[str, Any] | None = None
    """Standard object metadata."""
    spec: Spec
    """What to run and how SpecPilot may tune it."""
    status: Status | None = None

    @model_validator(mode="after")
    def _name(self) -> Self:
        name = (self.metadata or {}).get("name")
        if name is not None and (
            not isinstance(name, str)
            or not re.fullmatch(_NAME_PATTERN, name)
            or len(name) > MAX_NAME_LENGTH
        ):
            raise Violation(
                "metadata.name",
                name,
                f"a DNS-1035 label of at most {MAX_NAME_LENGTH} characters",
                'it names the Service and, with "-canary", a Deployment',
            )
        return self
