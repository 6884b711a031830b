"""What every engine adapter shares: launch settings, capability tables, errors, flag reading.

An adapter turns a `SpecConfig` into an engine's exact command-line arguments (`render`) and
back (`parse`). It refuses, before any process starts, what its engine cannot run: the
capability table below says which methods exist, which need draft weights, and which options
(per-batch schedule, tree drafting, n-gram lookup windows) each method accepts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from specpilot.tuner import ConfigError, SpecConfig

EngineName = Literal["vllm", "sglang"]
DraftNeed = Literal["required", "optional", "forbidden"]


class EngineCapabilityError(ConfigError):
    """The configuration is valid in general but this engine cannot run it."""


class EngineArgsError(ConfigError):
    """An engine command line is malformed or says something SpecPilot does not model."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LaunchSettings:
    """Everything on an engine's command line that is not speculative decoding."""

    model: str
    """Target model path or repo id."""
    served_model_name: str | None = None
    """Name clients use in the OpenAI API; the engine defaults it to `model`."""
    host: str = "0.0.0.0"
    port: int = 8000
    extra_args: tuple[str, ...] = ()
    """Further engine flags, passed through unchanged; speculative flags are refused here."""
    sidecar_dir: str = "/etc/specpilot"
    """Where files the command line refers to (SGLang's adaptive config) are written."""


@dataclass(frozen=True, slots=True)
class MethodSupport:
    """How one engine runs one SpecPilot method."""

    engine_name: str
    """The engine's own name for the method (vLLM `method`, SGLang `--speculative-algorithm`)."""
    draft: DraftNeed
    schedule: bool = False
    """Per-batch-size K schedule available."""
    tree: bool = False
    """Tree drafting (eagle_topk / num_draft_tokens) available."""
    prompt_lookup: bool = False
    """n-gram lookup window (prompt_lookup_min/max) available."""
    engine_adaptive: bool = False
    """The engine's own per-batch K adaptation available."""


class EngineAdapter(Protocol):
    """The two doors between SpecPilot and an engine's command line."""

    name: EngineName
    version: str
    capabilities: Mapping[str, MethodSupport]
    max_batch_flags: tuple[str, ...]
    """The spellings of the flag that caps the requests the engine runs at once."""
    drain_flags: tuple[str, ...]
    """The spellings of the flag that lets the engine finish the requests it holds after
    SIGTERM, for at most its value in seconds (its first spelling is the one rendered); empty
    where the engine drains without being told."""

    def check(self, config: SpecConfig) -> None:
        """Raise `EngineCapabilityError` if this engine cannot run `config`."""

    def render(self, config: SpecConfig, base: LaunchSettings) -> list[str]:
        """Full argument list (without the program) for the engine's OpenAI server."""

    def sidecar_files(self, config: SpecConfig, base: LaunchSettings) -> dict[str, str]:
        """Files (path -> content) the rendered arguments refer to."""

    def parse(self, args: Sequence[str], files: Mapping[str, str] | None = None) -> SpecConfig:
        """The SpecConfig a command line runs; `files` overrides reading referenced files."""

    def program(self, python: str) -> list[str]:
        """The command that starts this engine's OpenAI server with the given interpreter."""


def check_capability(
    engine: str, capabilities: Mapping[str, MethodSupport], config: SpecConfig
) -> MethodSupport | None:
    """Checks shared by all engines; returns the method's support entry (None for 'none')."""
    if not config.speculative:
        return None
    support = capabilities.get(config.method)
    if support is None:
        raise EngineCapabilityError(
            "method",
            config.method,
            " | ".join(["none", *capabilities]),
            f"{engine} has no {config.method!r} speculative decoding",
        )
    if support.draft == "required" and config.draft_model is None:
        raise EngineCapabilityError(
            "draft_model",
            None,
            "a draft model path or repo id",
            f"{engine} method {support.engine_name} needs draft weights",
        )
    if support.draft == "forbidden" and config.draft_model is not None:
        raise EngineCapabilityError(
            "draft_model", config.draft_model, "None", f"{engine} {support.engine_name} takes none"
        )
    if config.schedule is not None and not support.schedule:
        with_schedule = [m for m, s in capabilities.items() if s.schedule]
        raise EngineCapabilityError(
            "schedule",
            [list(t) for t in config.schedule],
            "None for this method; schedules work with " + (", ".join(with_schedule) or "none"),
            f"{engine} {support.engine_name} has no per-batch-size K",
        )
    if config.eagle_topk is not None and not support.tree:
        raise EngineCapabilityError(
            "eagle_topk",
            config.eagle_topk,
            "None (chain drafting)",
            f"{engine} {support.engine_name} drafts chains only",
        )
    if config.engine_adaptive and not support.engine_adaptive:
        with_it = [m for m, s in capabilities.items() if s.engine_adaptive]
        raise EngineCapabilityError(
            "engine_adaptive",
            True,
            "false for this method; engine-side adaptation works with "
            + (", ".join(with_it) or "no method of this engine"),
            f"{engine} {support.engine_name} has no adaptive K of its own",
        )
    lookup = config.prompt_lookup_min, config.prompt_lookup_max
    if lookup != (None, None) and not support.prompt_lookup:
        raise EngineCapabilityError(
            "prompt_lookup_min/prompt_lookup_max",
            lookup,
            "None",
            f"{engine} {support.engine_name} has no prompt-lookup window setting",
        )
    return support


@dataclass(frozen=True, slots=True)
class FoundFlag:
    name: str
    value: str | None


def find_flags(
    args: Sequence[str],
    value_flags: Mapping[str, str],
    bool_flags: Mapping[str, str] = {},
) -> dict[str, FoundFlag]:
    """Collect the given flags from an argument list, by canonical name.

    `value_flags` and `bool_flags` map every accepted spelling to a canonical name. Both
    `--flag value` and `--flag=value` are read; a flag given twice is an error, since engines
    disagree on which one wins.
    """
    bool_flags = bool_flags or {}
    found: dict[str, FoundFlag] = {}
    index = 0
    while index < len(args):
        token = args[index]
        spelling, eq, inline = token.partition("=")
        canonical = value_flags.get(spelling) or bool_flags.get(spelling)
        if canonical is None:
            index += 1
            continue
        if canonical in found:
            raise EngineArgsError(spelling, token, "the flag at most once", "it was given twice")
        if spelling in bool_flags:
            found[canonical] = FoundFlag(spelling, inline if eq else None)
            index += 1
            continue
        if eq:
            found[canonical] = FoundFlag(spelling, inline)
            index += 1
            continue
        if index + 1 >= len(args):
            raise EngineArgsError(spelling, None, "a value after the flag", "the line ends there")
        found[canonical] = FoundFlag(spelling, args[index + 1])
        index += 2
    return found


def parse_int_flag(flag: FoundFlag | None) -> int | None:
    if flag is None:
        return None
    try:
        return int(flag.value or "")
    except ValueError as exc:
        raise EngineArgsError(flag.name, flag.value, "an integer") from exc


def max_batch_from_args(adapter: EngineAdapter, args: Sequence[str]) -> int | None:
    """The most requests `adapter`'s engine runs at once as `args` set it (None: the engine's
    default); a value that is not a positive integer is an `EngineArgsError` naming the flag."""
    found = find_flags(args, dict.fromkeys(adapter.max_batch_flags, "max_batch")).get("max_batch")
    value = parse_int_flag(found)
    if found is not None and value is not None and value < 1:
        raise EngineArgsError(found.name, found.value, "a positive integer")
    return value


def drain_from_args(adapter: EngineAdapter, args: Sequence[str]) -> int | None:
    """The seconds `args` let `adapter`'s engine drain for after SIGTERM (None: not set); a
    value that is not a non-negative integer is an `EngineArgsError` naming the flag."""
    found = find_flags(args, dict.fromkeys(adapter.drain_flags, "drain")).get("drain")
    value = parse_int_flag(found)
    if found is not None and value is not None and value < 0:
        raise EngineArgsError(found.name, found.value, "a non-negative integer")
    return value


def refuse_speculative_flags(extra_args: Sequence[str], owned_prefixes: Sequence[str]) -> None:
    """Speculative flags belong to SpecPilot; in pass-through args they would fight it."""
    for token in extra_args:
        spelling = token.partition("=")[0]
        if any(spelling == p or spelling.startswith(p) for p in owned_prefixes):
            raise EngineArgsError(
                "extra_args",
                token,
                "engine flags other than speculative decoding",
                "speculative settings belong to SpecPilot's candidates, not to extra args",
            )


def launch_args(base: LaunchSettings, model_flag: str) -> list[str]:
    """The non-speculative head of a command line, identical in spirit across engines."""
    args = [model_flag, base.model]
    if base.served_model_name is not None:
        args += ["--served-model-name", base.served_model_name]
    return [*args, "--host", base.host, "--port", str(base.port)]
