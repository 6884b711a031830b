"""specpilot.tuner: pure decision logic (no Kubernetes, no HTTP, no clock)."""

from specpilot.tuner.spec_config import (
    SPEC_METHODS,
    ConfigError,
    ScheduleTier,
    SpecConfig,
    SpecMethod,
)

__all__ = ["SPEC_METHODS", "ConfigError", "ScheduleTier", "SpecConfig", "SpecMethod"]
