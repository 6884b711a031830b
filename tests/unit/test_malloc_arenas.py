"""The operator caps glibc's malloc arenas (operator/app/malloc_arenas.py); its effect on
resident memory is measured by bench/operator_load.py, not here."""

from __future__ import annotations

import ctypes
import platform

import pytest

from specpilot.operator.app import malloc_arenas


def test_an_arena_max_from_the_environment_is_left_to_glibc(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    monkeypatch.setattr(ctypes, "CDLL", lambda *_: pytest.fail("mallopt called"))
    assert malloc_arenas.limit_malloc_arenas() is True


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_glibc_accepts_the_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    assert malloc_arenas.limit_malloc_arenas() is True


def test_a_c_library_without_mallopt_is_not_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)

    class NoMallopt:
        def __init__(self, *_: object) -> None:
            pass

    monkeypatch.setattr(ctypes, "CDLL", NoMallopt)
    assert malloc_arenas.limit_malloc_arenas() is False
