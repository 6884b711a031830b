"""Cap glibc's malloc arenas in the operator process before its threads start.

Contract: `limit_malloc_arenas()` calls glibc's `mallopt(M_ARENA_MAX, MALLOC_ARENAS)` unless the
environment already sets MALLOC_ARENA_MAX (glibc reads that itself) and returns whether the
cap is in force; on a C library without mallopt (musl, macOS) it does nothing and returns
False.
Why: glibc gives threads that allocate at once arenas of their own, up to 8 per core, and each
keeps the memory its thread freed. The operator runs a tick thread per SpecDeployment being
observed (operator/kube/beat.py, up to 256), each allocating while it parses scrapes and fits
its GP. Measured at 200 SpecDeployments (bench/results/operator_load.md): peak RSS 305.0 MiB
with glibc's default, 293.6 MiB capped; a small gain, kept because it costs nothing.
"""

from __future__ import annotations

import ctypes
import os

M_ARENA_MAX = -8
"""glibc's malloc.h parameter number for the arena cap."""
MALLOC_ARENAS = 2


def limit_malloc_arenas(arenas: int = MALLOC_ARENAS) -> bool:
    if os.environ.get("MALLOC_ARENA_MAX"):
        return True
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_ARENA_MAX, arenas))
