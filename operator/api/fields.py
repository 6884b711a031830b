"""Reading a SpecDeployment spec field by field, with the field's path in every error.

Contract: `SpecReader` wraps one mapping of the spec and its path ("spec.tuning"); each typed
getter returns None for an absent (or null) field and raises `SpecError` naming the path, the
value and what is allowed for a present one of the wrong type or out of bounds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from specpilot.tuner import ConfigError

T = TypeVar("T")


class SpecError(ConfigError):
    """A SpecDeployment spec is invalid; `field` is a path such as "spec.replicas"."""


def or_default(value: T | None, default: T) -> T:
    return default if value is None else value


class SpecReader:
    """Typed access to one mapping of the spec, tracking its path for error messages."""

    def __init__(self, data: object, path: str) -> None:
        if not isinstance(data, Mapping):
            raise SpecError(path, data, "an object")
        self.data: Mapping[str, Any] = data
        self.path = path

    def known(self, *names: str) -> None:
        for key in self.data:
            if key not in names:
                raise SpecError(f"{self.path}.{key}", self.data[key], "one of " + ", ".join(names))

    def has(self, name: str) -> bool:
        return self.data.get(name) is not None

    def sub(self, name: str) -> SpecReader:
        value = self.data.get(name)
        return SpecReader({} if value is None else value, f"{self.path}.{name}")

    def str_(self, name: str, *, choices: Sequence[str] = (), max_len: int = 4096) -> str | None:
        value = self.data.get(name)
        if value is None:
            return None
        if choices and value not in choices:
            raise SpecError(f"{self.path}.{name}", value, " | ".join(choices))
        if not isinstance(value, str) or not value or len(value) > max_len:
            raise SpecError(f"{self.path}.{name}", value, f"a string of 1..{max_len} characters")
        return value

    def int_(self, name: str, low: int, high: int) -> int | None:
        value = self.data.get(name)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise SpecError(f"{self.path}.{name}", value, f"an integer in {low}..{high}")
        return value

    def num(self, name: str, high: float) -> float | None:
        value = self.data.get(name)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= high:
            raise SpecError(f"{self.path}.{name}", value, f"a number in (0, {high}]")
        return float(value)

    def bool_(self, name: str) -> bool | None:
        value = self.data.get(name)
        if value is not None and not isinstance(value, bool):
            raise SpecError(f"{self.path}.{name}", value, "true | false")
        return value

    def strings(self, name: str, max_items: int) -> tuple[str, ...] | None:
        value = self.data.get(name)
        if value is None:
            return None
        if (
            not isinstance(value, list)
            or len(value) > max_items
            or not all(isinstance(v, str) for v in value)
        ):
            raise SpecError(f"{self.path}.{name}", value, f"a list of at most {max_items} strings")
        return tuple(value)

    def items(self, name: str, max_items: int) -> list[SpecReader]:
        value = self.data.get(name)
        if value is None:
            return []
        if not isinstance(value, list) or len(value) > max_items:
            raise SpecError(f"{self.path}.{name}", value, f"a list of at most {max_items} objects")
        return [SpecReader(v, f"{self.path}.{name}[{i}]") for i, v in enumerate(value)]
