"""A small, stable YAML writer for Kubernetes manifests such as the generated CRD.

Contract: `dump_yaml(document)` writes dicts (in their key order), lists, strings, numbers and
booleans as block YAML that `yaml.safe_load` reads back equal, two spaces per level. Short
lists of scalars go on one line (`[vllm, sglang]`); a `description` or `message` too long for
the line is folded (`>-`) at word boundaries; a CEL `rule` is double-quoted on its line; every
other string stays on its line, plain when YAML reads it back as the same string and
double-quoted (JSON escapes) otherwise.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

import yaml

__all__ = ["dump_yaml"]

WIDTH = 100
FOLDED_KEYS = frozenset({"description", "message"})
QUOTED_KEYS = frozenset({"rule"})
"""CEL rules read best double-quoted whatever their characters."""


def dump_yaml(document: Mapping[str, Any]) -> str:
    return "".join(line + "\n" for line in _mapping(document, 0))


def _mapping(node: Mapping[str, Any], indent: int) -> Iterator[str]:
    for key, value in node.items():
        yield from _entry(f"{' ' * indent}{_scalar(key)}:", str(key), value, indent)


def _entry(head: str, key: str, value: Any, indent: int) -> Iterator[str]:
    if isinstance(value, Mapping) and value:
        yield head
        yield from _mapping(value, indent + 2)
    elif isinstance(value, list) and value and _flow(value) is None:
        yield head
        for item in value:
            yield from _item(item, indent + 2)
    elif isinstance(value, list):
        yield f"{head} {_flow(value)}"
    elif isinstance(value, str) and key in FOLDED_KEYS and _foldable(head, value):
        yield f"{head} >-"
        yield from _fold(value, indent + 2)
    elif isinstance(value, str) and key in QUOTED_KEYS:
        yield f"{head} {json.dumps(value, ensure_ascii=False)}"
    else:
        yield f"{head} {'{}' if isinstance(value, Mapping) else _scalar(value)}"


def _item(item: Any, indent: int) -> Iterator[str]:
    if isinstance(item, Mapping) and item:
        lines = list(_mapping(item, indent + 2))
        lines[0] = f"{' ' * indent}- {lines[0][indent + 2 :]}"
        yield from lines
    elif isinstance(item, list | Mapping):
        raise ValueError(f"no YAML form here for the list item {item!r}")
    else:
        yield f"{' ' * indent}- {_scalar(item)}"


def _flow(items: list[Any]) -> str | None:
    """`[a, b]` for a short list of scalars, else None (a block list)."""
    if any(isinstance(i, list | Mapping) for i in items):
        return None
    text = "[" + ", ".join(_scalar(i, flow=True) for i in items) + "]"
    return text if len(text) <= 60 else None


def _foldable(head: str, text: str) -> bool:
    """Too long for its line, and single-spaced on one line (folding keeps exactly that)."""
    return len(head) + 1 + len(text) > WIDTH and text == " ".join(text.split())


def _fold(text: str, indent: int) -> Iterator[str]:
    line = ""
    for word in text.split(" "):
        if line and indent + len(line) + 1 + len(word) > WIDTH:
            yield " " * indent + line
            line = word
        else:
            line = f"{line} {word}" if line else word
    yield " " * indent + line


def _scalar(value: Any, flow: bool = False) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    text = str(value)
    probe = f"k: [{text}]" if flow else f"k: {text}"
    try:
        plain = bool(text) and yaml.safe_load(probe) == {"k": [text] if flow else text}
    except yaml.YAMLError:
        plain = False
    return text if plain else json.dumps(text, ensure_ascii=False)
