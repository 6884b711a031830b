"""What a real API server does with a custom resource's openAPIV3Schema, for the mock server.

Contract: `admit(kind, name, schema, obj)` returns the object as a server would store it:
unknown fields pruned (unless `x-kubernetes-preserve-unknown-fields`), defaults applied
(also inside new objects and array items), then validated with openapi-schema-validator;
violations raise `Invalid` with one `path: message` cause per error, in the shape of the
server's 422 `Invalid` Status. `metadata` and `apiVersion`/`kind` are never pruned. CEL rules
(`x-kubernetes-validations`) are NOT evaluated here: a real server would.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from openapi_schema_validator import OAS30Validator

Schema = Mapping[str, Any]


class Invalid(ValueError):
    def __init__(self, message: str, causes: list[dict[str, str]]) -> None:
        super().__init__(message)
        self.causes = causes


def prune_and_default(value: Any, schema: Schema) -> Any:
    if isinstance(value, dict) and schema.get("type") == "object":
        props: Mapping[str, Schema] = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        keep_unknown = schema.get("x-kubernetes-preserve-unknown-fields", False)
        out: dict[str, Any] = {}
        for key, item in value.items():
            if key in props:
                out[key] = prune_and_default(item, props[key])
            elif isinstance(extra, Mapping):
                out[key] = prune_and_default(item, extra)
            elif keep_unknown or extra is True:
                out[key] = item
        for key, sub in props.items():
            if key not in out and "default" in sub:
                out[key] = prune_and_default(copy.deepcopy(sub["default"]), sub)
        return out
    if isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        return [prune_and_default(item, schema["items"]) for item in value]
    return value


def admit(kind: str, name: str, schema: Schema, obj: dict[str, Any]) -> dict[str, Any]:
    body = {k: v for k, v in obj.items() if k not in ("metadata", "apiVersion", "kind")}
    top = dict(schema)
    top_props = {k: v for k, v in schema.get("properties", {}).items() if k != "metadata"}
    top["properties"] = top_props
    body = prune_and_default(body, top)
    errors = sorted(OAS30Validator(top).iter_errors(body), key=lambda e: list(e.absolute_path))
    if errors:
        causes = [
            {
                "reason": "FieldValueInvalid",
                "field": ".".join(str(p) for p in error.absolute_path) or "<root>",
                "message": error.message,
            }
            for error in errors
        ]
        listed = ", ".join(f"{c['field']}: {c['message']}" for c in causes)
        raise Invalid(f'{kind} "{name}" is invalid: [{listed}]', causes)
    return {**{k: obj[k] for k in ("apiVersion", "kind", "metadata") if k in obj}, **body}
