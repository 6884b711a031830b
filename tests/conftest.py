"""Shared test settings: hypothesis profiles sized for 2-core CI machines; tests marked
`engines` (real vLLM or SGLang environments) skipped with SPECPILOT_SKIP_ENGINES=1, wherever
they live (the hook is here so that `pytest tests/e2e` alone skips them too)."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("SPECPILOT_SKIP_ENGINES") != "1":
        return
    skip = pytest.mark.skip(reason="SPECPILOT_SKIP_ENGINES=1")
    for item in items:
        if "engines" in item.keywords:
            item.add_marker(skip)


settings.register_profile(
    "ci", max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("dev", max_examples=100, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
