"""Pydantic's JSON Schema made into a structural Kubernetes OpenAPI v3 schema.

Contract: `structural_schema(model)` is the schema of `model` as a CRD's `openAPIV3Schema` needs
it: every `$ref` inlined (no `$defs`), `Optional[X]` as plain X (absent means unset; nothing is
`nullable`), no `title`, no `default: null`, no `additionalProperties: false` (a structural schema
prunes unknown fields instead, or keeps them where a node says
`x-kubernetes-preserve-unknown-fields`: the deep parts of Kubernetes core types), the JSON Schema
2020-12 `exclusiveMinimum: n` as OpenAPI 3.0's `minimum: n, exclusiveMinimum: true`, and
descriptions on one line. Keys come in a fixed order (type first, then description, bounds,
default, rules, children), so the output, and the YAML written from it, is stable. `describe(node)`
says in words what a node allows, for errors.
"""

from __future__ import annotations

import copy
import functools
from typing import Any

from pydantic import BaseModel

__all__ = ["describe", "structural_schema"]

Schema = dict[str, Any]

KEY_ORDER = (
    "type",
    "format",
    "description",
    "enum",
    "minimum",
    "exclusiveMinimum",
    "maximum",
    "minLength",
    "maxLength",
    "pattern",
    "minItems",
    "maxItems",
    "maxProperties",
    "default",
    "required",
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
    "x-kubernetes-preserve-unknown-fields",
    "x-kubernetes-validations",
    "properties",
    "items",
    "additionalProperties",
)
_RULE_ORDER = ("rule", "fieldPath", "message", "messageExpression", "reason", "optionalOldSelf")
_DROPPED = ("title", "$defs")


@functools.cache
def _cached(model: type[BaseModel]) -> Schema:
    raw = model.model_json_schema(by_alias=True, mode="validation")
    return _convert(raw, raw.get("$defs", {}))


def structural_schema(model: type[BaseModel]) -> Schema:
    """The structural schema of `model` (a fresh copy each call)."""
    return copy.deepcopy(_cached(model))


def _convert(node: Schema, defs: Schema) -> Schema:
    node = _flatten(node, defs)
    out: Schema = {}
    for key, value in node.items():
        if key in _DROPPED or (key == "default" and value is None):
            continue
        if key == "additionalProperties" and isinstance(value, bool):
            continue
        if key == "exclusiveMinimum" and not isinstance(value, bool):
            out["minimum"], out["exclusiveMinimum"] = value, True
        elif key == "description":
            out[key] = " ".join(str(value).split())
        elif key == "properties":
            out[key] = {name: _convert(sub, defs) for name, sub in value.items()}
        elif key in ("items", "additionalProperties"):
            out[key] = _convert(value, defs)
        elif key == "x-kubernetes-validations":  # pydantic sorts the keys: put rule first
            out[key] = [{k: r[k] for k in _RULE_ORDER if k in r} for r in value]
        else:
            out[key] = copy.deepcopy(value)
    unknown = set(out) - set(KEY_ORDER)
    if unknown:
        raise ValueError(f"schema keys with no place in a structural schema: {sorted(unknown)}")
    return {key: out[key] for key in KEY_ORDER if key in out}


def _flatten(node: Schema, defs: Schema) -> Schema:
    """`$ref` and `anyOf [X, null]` replaced by X, with the node's own keys (a field's
    description, default, rules) laid over it."""
    own = {k: v for k, v in node.items() if k not in ("$ref", "anyOf")}
    if "$ref" in node:
        target = defs[node["$ref"].rsplit("/", 1)[-1]]
        return {**_flatten(target, defs), **own}
    if "anyOf" in node:
        branches = [b for b in node["anyOf"] if b != {"type": "null"}]
        if len(branches) != 1:
            raise ValueError(f"a union other than Optional has no structural schema: {node}")
        return {**_flatten(branches[0], defs), **own}
    return node


def describe(node: Schema) -> str:
    """What a schema node allows, in words: "vllm | sglang", "an integer in 1..16"."""
    if "enum" in node:
        return " | ".join(str(v) for v in node["enum"])
    kind = node.get("type")
    if kind == "boolean":
        return "true | false"
    if kind in ("integer", "number"):
        low, high = node.get("minimum"), node.get("maximum")
        noun = "an integer" if kind == "integer" else "a number"
        if low is None and high is None:
            return noun
        opening = "(" if node.get("exclusiveMinimum") else "["
        if kind == "integer" and low is not None and high is not None:
            return f"{noun} in {low}..{high}"
        return f"{noun} in {opening}{'-inf' if low is None else low}, {high or 'inf'}]"
    if kind == "string":
        text = f"a string of {_count(node.get('minLength'), node.get('maxLength'))} characters"
        if "pattern" in node:
            text += f" matching {node['pattern']}"
        return text
    if kind == "array":
        item = node.get("items", {})
        plurals = {"string": "strings", "integer": "integers", "object": "objects"}
        count = _count(node.get("minItems"), node.get("maxItems"))
        return f"a list of {count} {plurals.get(item.get('type'), 'items')}"
    if kind == "object":
        if "properties" in node:
            return "an object with fields " + ", ".join(node["properties"])
        if isinstance(node.get("additionalProperties"), dict):
            value = describe(node["additionalProperties"])
            count = _count(None, node.get("maxProperties"))
            return f"a map of {count} names to {value}"
        return "an object"
    return "a value of this field's type"


def _count(low: int | None, high: int | None) -> str:
    if high is None:
        return f"at least {low or 0}"
    return f"at most {high}" if not low else f"{low}..{high}"
