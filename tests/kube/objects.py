"""Pure helpers of the mock API server: selectors, patches, paths, ages. No I/O, no state.

Contract: the semantics follow the Kubernetes API conventions closely enough for clients
(kopf, kubectl, the kubernetes client) to behave as against a real server:
- label selectors: `k=v`, `k==v`, `k!=v`, `k`, `!k`, `k in (a,b)`, `k notin (a,b)`;
- field selectors: `path=v`, `path==v`, `path!=v` over dotted paths (metadata.name, ...);
- merge patch is RFC 7386 (null deletes); strategic merge patch is approximated by it
  (lists are replaced, not merged by key: the one known difference);
- JSON patch is RFC 6902 (a failed `test` is a `PatchTestFailed`).
"""

from __future__ import annotations

import copy
import datetime
import re
from collections.abc import Mapping
from typing import Any

import jsonpatch  # kopf's and kmock's own dependency

_TERM = re.compile(
    r"\s*(?P<neg>!)?\s*(?P<key>[A-Za-z0-9._/-]+)\s*"
    r"(?:(?P<op>==|!=|=)\s*(?P<value>[A-Za-z0-9._-]*)"
    r"|\s+(?P<setop>in|notin)\s*\((?P<values>[^)]*)\))?\s*"
)


class SelectorError(ValueError):
    """A label or field selector that does not parse."""


class PatchTestFailed(ValueError):
    """A JSON-patch `test` operation did not hold."""


def _split_terms(selector: str) -> list[str]:
    # Commas separate terms except inside the parentheses of `in (a,b)`.
    terms, depth, current = [], 0, ""
    for char in selector:
        depth += char == "("
        depth -= char == ")"
        if char == "," and depth == 0:
            terms.append(current)
            current = ""
        else:
            current += char
    terms.append(current)
    return [t for t in terms if t.strip()]


def match_labels(selector: str | None, labels: Mapping[str, str] | None) -> bool:
    labels = labels or {}
    for term in _split_terms(selector or ""):
        found = _TERM.fullmatch(term)
        if found is None:
            raise SelectorError(f"unable to parse requirement: {term!r}")
        key, neg = found["key"], bool(found["neg"])
        if found["op"]:
            equal = labels.get(key) == found["value"]
            if equal == (found["op"] == "!="):
                return False
        elif found["setop"]:
            values = {v.strip() for v in found["values"].split(",")}
            inside = key in labels and labels[key] in values
            if inside != (found["setop"] == "in"):
                return False
        elif (key in labels) == neg:
            return False
    return True


def match_fields(selector: str | None, obj: Mapping[str, Any]) -> bool:
    for term in _split_terms(selector or ""):
        found = re.fullmatch(r"\s*([A-Za-z0-9_.]+)\s*(==|!=|=)\s*(.*?)\s*", term)
        if found is None:
            raise SelectorError(f"invalid field selector: {term!r}")
        path, op, value = found.groups()
        actual = get_path(obj, path)
        if (str(actual) if actual is not None else "") == value and op == "!=":
            return False
        if (str(actual) if actual is not None else "") != value and op != "!=":
            return False
    return True


_PATH_PART = re.compile(r'\[\?\(@\.(\w+)=="([^"]*)"\)\]|\[\d+\]|[^.\[\]]+')


def get_path(obj: Any, path: str) -> Any:
    """A dotted path (`.spec.replicas`, `status.conditions[0].type`), or a JSONPath filter as
    printer columns use one (`.status.conditions[?(@.type=="Ready")].status`: the first match,
    as the API server's Table shows it); None where absent."""
    for found in _PATH_PART.finditer(path):
        part = found.group()
        if found.group(1) is not None:
            key, value = found.group(1), found.group(2)
            matches = [i for i in obj if isinstance(i, Mapping) and i.get(key) == value]
            obj = matches[0] if isinstance(obj, list) and matches else None
        elif part.startswith("["):
            index = int(part[1:-1])
            obj = obj[index] if isinstance(obj, list) and index < len(obj) else None
        else:
            obj = obj.get(part) if isinstance(obj, Mapping) else None
        if obj is None:
            return None
    return obj


def set_path(obj: dict[str, Any], path: str, value: Any) -> None:
    parts = [p for p in path.split(".") if p]
    for part in parts[:-1]:
        obj = obj.setdefault(part, {})
    obj[parts[-1]] = value


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge recursively, null deletes, everything else replaces."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def json_patch(target: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    try:
        patched: dict[str, Any] = jsonpatch.apply_patch(target, ops)
    except jsonpatch.JsonPatchTestFailed as exc:
        raise PatchTestFailed(str(exc)) from exc
    except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as exc:
        raise ValueError(str(exc)) from exc
    return patched


def now_rfc3339() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def human_age(timestamp: str | None) -> str:
    """kubectl's short duration (`45s`, `3m`, `2h`, `4d`) since an RFC 3339 time."""
    if not timestamp:
        return "<unknown>"
    then = datetime.datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    seconds = max(0, int((datetime.datetime.now(datetime.UTC) - then).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= 2 * size or (unit == "m" and seconds >= 120):
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def rolling_update_counts(spec: Mapping[str, Any], replicas: int) -> tuple[int, int]:
    """A Deployment's (maxSurge, maxUnavailable) as pod counts, rounding percentages as
    Kubernetes does (surge up, unavailable down); both zero reads as a surge of one (the API
    server refuses both zero: the doubles are lenient)."""
    rolling = (spec.get("strategy") or {}).get("rollingUpdate") or {}

    def count(value: Any, default: str, up: bool) -> int:
        value = default if value is None else value
        if isinstance(value, str) and value.endswith("%"):
            exact = replicas * int(value[:-1]) / 100
            return int(-(-exact // 1)) if up else int(exact)
        return int(value)

    surge = count(rolling.get("maxSurge"), "25%", up=True)
    unavailable = count(rolling.get("maxUnavailable"), "25%", up=False)
    return (1, unavailable) if surge == unavailable == 0 else (surge, unavailable)
