"""Engine adapters: SpecConfig <-> exact command lines of vLLM 0.32 and SGLang 0.5.23."""

from __future__ import annotations

from specpilot.runtime.engines.base import (
    EngineAdapter,
    EngineArgsError,
    EngineCapabilityError,
    EngineName,
    LaunchSettings,
    MethodSupport,
    drain_from_args,
    max_batch_from_args,
)
from specpilot.runtime.engines.sglang import SglangAdapter
from specpilot.runtime.engines.vllm import VllmAdapter
from specpilot.tuner import ConfigError

ADAPTERS: dict[str, EngineAdapter] = {"vllm": VllmAdapter(), "sglang": SglangAdapter()}


def get_adapter(engine: str) -> EngineAdapter:
    """The adapter for an engine name; an unknown name names the known ones."""
    try:
        return ADAPTERS[engine]
    except KeyError:
        raise ConfigError("engine", engine, " | ".join(ADAPTERS)) from None


__all__ = [
    "ADAPTERS",
    "EngineAdapter",
    "EngineArgsError",
    "EngineCapabilityError",
    "EngineName",
    "LaunchSettings",
    "MethodSupport",
    "SglangAdapter",
    "VllmAdapter",
    "drain_from_args",
    "get_adapter",
    "max_batch_from_args",
]
