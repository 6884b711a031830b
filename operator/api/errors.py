"""`SpecError`, and pydantic's validation errors translated into it at the API's edge.

Contract: `validate(model, data, root)` returns `model.model_validate(data)` for `data` as the
API server stores it or as a user wrote it (mappings of any kind; null fields count as unset, as
the API server prunes them), or raises `SpecError` for the outermost invalid field: its path from
`root` ("spec.speculative.candidates[1].method"), the value, and what is allowed, in words taken
from the same structural schema the CRD publishes (an enum's values, a bound, the fields of an
object). A model rule's `Violation` keeps its own value and allowed values. An env value is
never repeated (it may be a credential written inline): its type and length stand for it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from specpilot.operator.api.base import Violation
from specpilot.operator.api.schema import Schema, describe, structural_schema
from specpilot.tuner import ConfigError

__all__ = ["SpecError", "validate"]

M = TypeVar("M", bound=BaseModel)


class SpecError(ConfigError):
    """A SpecDeployment spec is invalid; `field` is a path such as "spec.replicas"."""


def validate(model: type[M], data: object, root: str) -> M:
    """`data` validated as `model`, or `SpecError` at the first invalid field below `root`."""
    if not isinstance(data, Mapping):
        raise SpecError(root, data, describe(structural_schema(model)))
    try:
        return model.model_validate(_plain(data))
    except ValidationError as exc:
        raise _translate(
            _first(exc.errors(include_url=False)), structural_schema(model), root
        ) from exc


def _first(errors: list[ErrorDetails]) -> ErrorDetails:
    """The outermost error; at one depth an unknown field first (a typo explains the rest)."""
    return min(errors, key=lambda e: (len(e["loc"]), e["type"] != "extra_forbidden"))


def _plain(value: Any) -> Any:
    """Dicts and lists all the way down, null fields dropped (the API server prunes them)."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items() if v is not None}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


class _NotShown:
    """Stands for an env value in a message: it may be a credential written inline, and the
    message goes to status, an Event and the operator's log."""

    def __init__(self, value: object) -> None:
        self.kind = type(value).__name__
        self.size = len(value) if isinstance(value, str | list | dict) else None

    def __repr__(self) -> str:
        unit = "characters" if self.kind == "str" else "entries"
        size = "" if self.size is None else f" of {self.size} {unit}"
        return f"<{self.kind}{size}, not shown: an env value may be a secret>"


_ENV_VALUE = re.compile(r"\.env(\[\d+\](\.value)?)?$")
"""An env value, or an entry or list holding env values."""


def _translate(error: ErrorDetails, schema: Schema, root: str) -> SpecError:
    found = _translate_shown(error, schema, root)
    if _ENV_VALUE.search(found.field):
        hint = str(found).partition(f"allowed {found.allowed}")[2].strip().strip("()")
        return SpecError(found.field, _NotShown(found.value), found.allowed, hint)
    return found


def _translate_shown(error: ErrorDetails, schema: Schema, root: str) -> SpecError:
    loc = error["loc"]
    path = _path(root, loc)
    violation = (error.get("ctx") or {}).get("error")
    if isinstance(violation, Violation):
        where = path if not violation.at else _join(path, violation.at)
        return SpecError(where, violation.value, violation.allowed, violation.hint)
    node = _node(schema, loc) or {}
    if error["type"] == "extra_forbidden":
        fields = (_node(schema, loc[:-1]) or {}).get("properties", {})
        return SpecError(path, error["input"], "one of " + ", ".join(fields), "unknown field")
    if error["type"] == "missing":
        return SpecError(path, None, describe(node), f"required: {node.get('description', '')}")
    return SpecError(path, error["input"], describe(node))


def _join(path: str, at: str) -> str:
    return path + at if at.startswith("[") else f"{path}.{at}"


def _path(root: str, loc: Sequence[int | str]) -> str:
    path = root
    for part in loc:
        path = f"{path}[{part}]" if isinstance(part, int) else _join(path, part)
    return path


def _node(schema: Schema, loc: Sequence[int | str]) -> Schema | None:
    """The schema node at `loc` (None when the path leaves the schema)."""
    node: Schema | None = schema
    for part in loc:
        if node is None:
            return None
        if isinstance(part, int):
            node = node.get("items")
        elif part in node.get("properties", {}):
            node = node["properties"][part]
        else:
            extra = node.get("additionalProperties")
            node = extra if isinstance(extra, dict) else None
    return node
