"""Offline stand-in for the API server's handling of a SpecDeployment: defaulting, pruning,
OpenAPI validation, list-type uniqueness and CEL rules, all from crds/specdeployment.yaml (the
committed CRD, generated from the API models in operator/api/).

`admit(obj)` does what the API server does on create, in its order (prune unknown fields,
apply defaults, validate the schema, then the CEL `x-kubernetes-validations`), and returns the
stored object and the errors as `Failure(path, message)` with paths like
"spec.speculative.candidates[0].draftModel". CEL rules run with cel-python (`celpy`); a rule's
`fieldPath` is appended to the path of the node that holds it, as the API server reports it.
"""

from __future__ import annotations

import copy
import functools
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import celpy
import yaml
from jsonschema import validators
from jsonschema.exceptions import ValidationError
from openapi_schema_validator import OAS30Validator

ROOT = Path(__file__).resolve().parents[2]
CRD_PATH = ROOT / "crds" / "specdeployment.yaml"

Schema = dict[str, Any]


@dataclass(frozen=True)
class Failure:
    path: str
    message: str
    cel: bool = False


@functools.cache
def load_crd() -> dict[str, Any]:
    crd: dict[str, Any] = yaml.safe_load(CRD_PATH.read_text(encoding="utf-8"))
    return crd


def root_schema() -> Schema:
    schema: Schema = load_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def prune_unknown_fields(obj: Any, schema: Schema, path: str = "") -> Any:
    """Drop fields the schema does not declare, and nulls of fields it does not declare
    nullable, like the API server's pruning. `metadata` is ObjectMeta (the server keeps its
    known fields; this copy keeps it whole)."""
    if isinstance(obj, dict) and schema.get("type") == "object":
        if path.endswith("metadata"):
            return obj
        props = schema.get("properties")
        if schema.get("x-kubernetes-preserve-unknown-fields"):
            # unknown fields kept; the declared ones pruned inside, nulls dropped (the server)
            known = props or {}
            return {
                k: prune_unknown_fields(v, known[k], _join(path, k)) if k in known else v
                for k, v in obj.items()
                if v is not None or k not in known or known[k].get("nullable")
            }
        extra = schema.get("additionalProperties")
        if props is None and isinstance(extra, dict):
            return {
                k: prune_unknown_fields(v, extra, _join(path, k))
                for k, v in obj.items()
                if v is not None or extra.get("nullable")
            }
        props = props or {}
        # A null where the schema does not say nullable is dropped before defaulting, as the
        # API server does ("Defaulting and Nullable" in the CRD docs; map values too: its
        # PruneNonNullableNullsWithoutDefaults reads a map's additionalProperties schema; a
        # dropped null with a default is then defaulted, as there).
        return {
            k: prune_unknown_fields(v, props[k], _join(path, k))
            for k, v in obj.items()
            if k in props and (v is not None or props[k].get("nullable"))
        }
    if isinstance(obj, list) and schema.get("type") == "array":
        return [prune_unknown_fields(v, schema["items"], f"{path}[{i}]") for i, v in enumerate(obj)]
    return obj


def apply_defaults(obj: Any, schema: Schema) -> Any:
    """Fill `default:` values of absent properties, then default inside them (the server's
    order: a defaulted `{}` gets its own children's defaults)."""
    if isinstance(obj, dict) and schema.get("type") == "object":
        out = dict(obj)
        for key, sub in (schema.get("properties") or {}).items():
            if key not in out and "default" in sub:
                out[key] = copy.deepcopy(sub["default"])
            if key in out:
                out[key] = apply_defaults(out[key], sub)
        return out
    if isinstance(obj, list) and schema.get("type") == "array":
        return [apply_defaults(v, schema["items"]) for v in obj]
    return obj


def _json_path(parts: Iterator[Any]) -> str:
    path = ""
    for part in parts:
        path = f"{path}[{part}]" if isinstance(part, int) else _join(path, str(part))
    return path


def _go_pattern(validator: Any, pattern: str, instance: Any, schema: Schema) -> Iterator[Any]:
    """`pattern` as the API server matches it: Go's RE2, where `$` ends the text. Python's `$`
    also matches before a final newline, which admitted "http://h/\n" the server refuses."""
    if isinstance(instance, str) and not _go_regex(pattern).search(instance):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


@functools.cache
def _go_regex(pattern: str) -> re.Pattern[str]:
    # an unescaped $ is RE2's end of text, Python's \Z (none of the CRD's patterns holds a $
    # inside a character class, where this would be wrong)
    return re.compile(re.sub(r"(?<!\\)\$", r"\\Z", pattern))


@functools.cache
def _validator() -> OAS30Validator:
    kubernetes_like = validators.extend(OAS30Validator, {"pattern": _go_pattern})
    return kubernetes_like(root_schema())  # type: ignore[no-any-return]


def schema_errors(obj: Any) -> list[Failure]:
    validator = _validator()
    return [
        Failure(_json_path(iter(e.absolute_path)), e.message)
        for e in sorted(validator.iter_errors(obj), key=lambda e: list(map(str, e.path)))
    ]


def list_type_errors(obj: Any, schema: Schema, path: str = "") -> list[Failure]:
    """x-kubernetes-list-type map (unique keys) and set (unique items)."""
    failures: list[Failure] = []
    if isinstance(obj, dict) and schema.get("type") == "object":
        for key, sub in (schema.get("properties") or {}).items():
            if key in obj:
                failures += list_type_errors(obj[key], sub, _join(path, key))
    elif isinstance(obj, list) and schema.get("type") == "array":
        kind = schema.get("x-kubernetes-list-type")
        if kind == "map":
            keys = [  # repr: a mistyped key (a list, a map) is a value like any other
                tuple(repr(item.get(k)) for k in schema["x-kubernetes-list-map-keys"])
                for item in obj
                if isinstance(item, dict)
            ]
            if len(set(keys)) != len(keys):
                failures.append(Failure(path, f"duplicate entries for keys {keys}"))
        elif kind == "set" and len({repr(v) for v in obj}) != len(obj):
            failures.append(Failure(path, "duplicate items in a set"))
        for index, item in enumerate(obj):
            failures += list_type_errors(item, schema["items"], f"{path}[{index}]")
    return failures


@functools.cache
def _program(rule: str) -> celpy.Runner:
    env = celpy.Environment()
    return env.program(env.compile(rule))


def cel_rules(schema: Schema) -> Iterator[str]:
    """Every CEL rule in the schema (to check each one compiles)."""
    for rule in schema.get("x-kubernetes-validations", []):
        yield rule["rule"]
    for sub in (schema.get("properties") or {}).values():
        yield from cel_rules(sub)
    if "items" in schema:
        yield from cel_rules(schema["items"])


def cel_errors(obj: Any, schema: Schema, path: str = "") -> list[Failure]:
    """Evaluate the rules bottom-up over the defaulted object, as the API server does."""
    failures: list[Failure] = []
    if isinstance(obj, dict) and schema.get("type") == "object":
        for key, sub in (schema.get("properties") or {}).items():
            if key in obj:
                failures += cel_errors(obj[key], sub, _join(path, key))
    elif isinstance(obj, list) and schema.get("type") == "array":
        for index, item in enumerate(obj):
            failures += cel_errors(item, schema["items"], f"{path}[{index}]")
    for rule in schema.get("x-kubernetes-validations", []):
        try:
            result = _program(rule["rule"]).evaluate({"self": celpy.json_to_cel(obj)})
        except celpy.CELEvalError as exc:
            # The API server reports a rule that errors at run time as a failed rule too.
            result = exc
        if isinstance(result, Exception) or not bool(result):
            where = path + rule.get("fieldPath", "")
            failures.append(Failure(where, " ".join(rule["message"].split()), cel=True))
    return failures


def admit(obj: dict[str, Any]) -> tuple[dict[str, Any], list[Failure]]:
    """(stored object, failures): prune, default, validate schema, list types, then CEL."""
    schema = root_schema()
    stored = apply_defaults(prune_unknown_fields(obj, schema), schema)
    failures = schema_errors(stored) + list_type_errors(stored, schema)
    if not failures:
        failures = cel_errors(stored, schema)
    return stored, failures


def strip_indexes(path: str) -> str:
    """ "spec.a[1].b" -> "spec.a.b", to compare paths from CEL (static) and decode_spec."""
    out, depth = [], 0
    for char in path:
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
        elif depth == 0:
            out.append(char)
    return "".join(out)


# Compile every rule now: celpy raises the interpreter's recursion limit on first use, which
# hypothesis reports as a warning when it happens inside a property test.
for _rule in cel_rules(root_schema()):
    _program(_rule)
