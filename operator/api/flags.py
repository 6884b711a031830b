"""Engine flags SpecPilot owns, as one regular expression per family, for CEL and for Python.

Contract: `owned_flag(token)` names the family of an engine command-line token SpecPilot writes
itself ("speculative" or "launch"), or None; `cel_refusing(family, message)` is the CEL rule
refusing such tokens in a list of strings. Both read the same patterns, so the CRD and the
decoder refuse the same tokens. vLLM and SGLang parse their flags with argparse, which accepts
any unambiguous abbreviation (`--por 9000` is `--port 9000`) and `--flag=value`; vLLM also
reads underscores as dashes. A token is owned when it is an owned flag, one of its
abbreviations (at least 3 characters) or one of its underscore spellings, alone or before `=`.
A token that abbreviates an owned flag and another one is ambiguous to argparse too, so no
flag the user may set is ever refused.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic.config import JsonDict

from specpilot.operator.api.base import cel

__all__ = [
    "LAUNCH_FLAGS",
    "LAUNCH_PATTERN",
    "SPECULATIVE_FLAG_PREFIXES",
    "SPECULATIVE_PATTERN",
    "FlagFamily",
    "cel_refusing",
    "owned_flag",
]

FlagFamily = Literal["speculative", "launch"]

SPECULATIVE_FLAG_PREFIXES: tuple[str, ...] = ("--speculative", "--spec-", "--spec_", "-sc")
"""Engine flags that select or shape speculative decoding, for either engine (any token that
starts with one)."""
LAUNCH_FLAGS: tuple[str, ...] = (
    "--model",
    "--model-path",
    "--model_path",
    "--served-model-name",
    "--served_model_name",
    "--host",
    "--port",
)
"""The flags SpecPilot writes from spec.model, spec.servedModelName and spec.port (and the
address the probes reach)."""


def _abbreviations(*flags: str) -> list[str]:
    """Every spelling argparse reads as one of `flags` (longest first, so the regex is exact)."""
    found = {flag[:end] for flag in flags for end in range(3, len(flag) + 1)}
    return sorted(found, key=lambda s: (-len(s), s))


def _alternatives(words: list[str]) -> str:
    # Flags are dashes, underscores and letters: nothing to escape, in RE2 or in Python.
    assert all(re.fullmatch("[-_a-z]+", w) for w in words), words
    return "|".join(words)


SPECULATIVE_PATTERN = (
    f"^(?:(?:{_alternatives(list(SPECULATIVE_FLAG_PREFIXES))})"
    f"|(?:{_alternatives(_abbreviations('--speculative'))})(?:=|$))"
)
LAUNCH_PATTERN = f"^(?:{_alternatives(_abbreviations(*LAUNCH_FLAGS))})(?:=|$)"
_PATTERNS: dict[FlagFamily, re.Pattern[str]] = {
    "speculative": re.compile(SPECULATIVE_PATTERN),
    "launch": re.compile(LAUNCH_PATTERN),
}
_CEL_PATTERNS: dict[FlagFamily, str] = {
    "speculative": SPECULATIVE_PATTERN,
    "launch": LAUNCH_PATTERN,
}


def owned_flag(token: str) -> FlagFamily | None:
    """The family of flags SpecPilot owns that `token` spells, or None."""
    for family, pattern in _PATTERNS.items():
        if pattern.search(token):
            return family
    return None


def cel_refusing(family: FlagFamily, message: str) -> JsonDict:
    """A CEL rule on a list of strings refusing the tokens of `family`."""
    return cel(f"self.all(a, !a.matches('{_CEL_PATTERNS[family]}'))", message)
