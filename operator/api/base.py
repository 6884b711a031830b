"""The base every SpecDeployment API model shares, and the CEL rules they carry.

Contract: an API model subclasses `ApiModel`: strict (no "3" for 3, no "yes" for true), frozen,
unknown fields refused, camelCase on the wire (`max_k` is `maxK`), and each field's docstring is
its description in the CRD. A model's cross-field rules are declared twice, side by side: as CEL
for the API server (`model_config = rules(cel(...), ...)`, or `json_schema_extra=rules(...)` on a
field) and in Python in the model's one `@model_validator`, which raises `Violation` naming the
field below the model, the value and what is allowed. `x-kubernetes-list-type` map and set
uniqueness is checked here for every model, from the field's own schema extras.
"""

from __future__ import annotations

from typing import Any, Self

from pydantic import BaseModel, ConfigDict, JsonValue, model_validator
from pydantic.alias_generators import to_camel
from pydantic.config import JsonDict

__all__ = [
    "MODEL_REF_PATTERN",
    "NO_NUL_PATTERN",
    "QUANTITY_PATTERN",
    "ApiModel",
    "Violation",
    "cel",
    "dump",
    "field_default",
    "rules",
    "validations",
]

MODEL_REF_PATTERN = r"^[^-\x00-\x1f\x7f][^\x00-\x1f\x7f]*$"
"""A model reference (repo id or path) that is one argument: no control characters (a newline
would split a log line or a YAML scalar), no leading dash (the engine would read a flag)."""
NO_NUL_PATTERN = r"^[^\x00]*$"
"""Strings that reach a process's argv or environment: a NUL byte would silently cut them
(execve reads C strings); newlines are kept (a chat template spans lines)."""
QUANTITY_PATTERN = r"^[0-9]+(\.[0-9]+)?([EPTGMK]i?|[numk])?$"
"""A non-negative Kubernetes quantity ("8", "500m", "64Gi")."""


class Violation(ValueError):
    """A rule of the model broke; `at` is the field below the model ("maxK", "initial.k", "")."""

    def __init__(self, at: str, value: object, allowed: str, hint: str = "") -> None:
        super().__init__(f"{at}={value!r}: allowed {allowed}")
        self.at = at
        self.value = value
        self.allowed = allowed
        self.hint = hint


def cel(rule: str, message: str, field_path: str | None = None) -> JsonDict:
    """One `x-kubernetes-validations` entry; the server reports it at `field_path` (".maxK")."""
    entry: JsonDict = {"rule": rule}
    if field_path is not None:
        entry["fieldPath"] = field_path
    entry["message"] = message
    return entry


def validations(*entries: JsonDict) -> JsonDict:
    """CEL rules as a field's `json_schema_extra`."""
    listed: list[JsonValue] = [*entries]
    return {"x-kubernetes-validations": listed}


def rules(*entries: JsonDict) -> ConfigDict:
    """A model's CEL rules as its config (merged with `ApiModel`'s)."""
    return ConfigDict(json_schema_extra=validations(*entries))


class ApiModel(BaseModel):
    """A part of the SpecDeployment API, validated as strictly as the API server does."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        extra="forbid",
        frozen=True,
        strict=True,
        use_attribute_docstrings=True,
    )

    @model_validator(mode="after")
    def _list_types(self) -> Self:
        """Entries of a list-type map differ in their keys; items of a set differ."""
        for name, info in type(self).model_fields.items():
            extra = info.json_schema_extra
            items = getattr(self, name)
            if not isinstance(extra, dict) or not items:
                continue
            alias = info.alias or name
            kind = extra.get("x-kubernetes-list-type")
            if kind == "set" and len(set(items)) != len(items):
                raise Violation(alias, list(items), "distinct values (a list-type set)")
            if kind == "map":
                named = extra.get("x-kubernetes-list-map-keys")
                keys = [str(k) for k in named] if isinstance(named, list) else []
                seen: set[tuple[Any, ...]] = set()
                for index, item in enumerate(items):
                    key = tuple(item.model_dump(by_alias=True).get(k) for k in keys)
                    if key in seen:
                        raise Violation(
                            f"{alias}[{index}].{keys[0]}",
                            key[0] if len(key) == 1 else key,
                            f"a {'/'.join(keys)} no other entry of {alias} has",
                        )
                    seen.add(key)
        return self


def dump(model: BaseModel | None) -> dict[str, Any] | None:
    """A model as the user wrote it (camelCase, unset fields left out), for error messages."""
    return None if model is None else model.model_dump(by_alias=True, exclude_none=True)


def field_default(model: type[BaseModel], name: str) -> Any:
    """The declared default of `model.name` (a fresh instance for a default factory)."""
    return model.model_fields[name].get_default(call_default_factory=True)
