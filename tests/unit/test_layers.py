"""The house rule: imports only go down, operator -> runtime -> tuner; the tuner is pure."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN = {
    "tuner": (
        "specpilot.runtime",
        "specpilot.operator",
        "kopf",
        "kubernetes",
        "httpx",
        "prometheus_api_client",
        "time",
        "datetime",
    ),
    "runtime": ("specpilot.operator", "kopf", "kubernetes"),
}


def imported_modules(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_layer_imports_only_go_down(layer: str) -> None:
    files = sorted((ROOT / layer).rglob("*.py"))
    assert files
    for path in files:
        for module in imported_modules(path):
            for banned in FORBIDDEN[layer]:
                assert not (module == banned or module.startswith(banned + ".")), (
                    f"{path.relative_to(ROOT)} imports {module}"
                )


def test_operator_folder_cannot_shadow_the_stdlib() -> None:
    assert not (ROOT / "operator" / "__init__.py").exists()
