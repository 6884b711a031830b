"""The benchmark scripts still import against the code they measure (they run outside pytest)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.mark.parametrize("script", sorted(p.name for p in BENCH.glob("*.py")))
def test_bench_script_imports(script: str) -> None:
    spec = importlib.util.spec_from_file_location(f"bench_{script[:-3]}", BENCH / script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # dataclasses look their module up in sys.modules while the class is being defined
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)  # runs imports and definitions; main() is guarded
    finally:
        del sys.modules[spec.name]
    assert callable(module.main)
