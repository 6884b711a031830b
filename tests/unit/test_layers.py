"""The house's layout. Its import rules (operator -> runtime -> tuner, the emulator only in the
application room, the tuner's maths private and pure) are import-linter contracts in
pyproject.toml's `[tool.importlinter]`, checked by `make lint`; what no import graph shows is
checked here."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_operator_folder_cannot_shadow_the_stdlib() -> None:
    assert not (ROOT / "operator" / "__init__.py").exists()
