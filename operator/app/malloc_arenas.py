"""Cap glibc's malloc arenas in the operator process before its threads start.

Contract: `limit_malloc_arenas()` calls glibc's `mallopt(M_ARENA_MAX, MALLOC_ARENAS)` unless the
environment already sets MALLOC_ARENA_MAX (glibc reads that itself) and returns whether the
cap is in force; on a C library without mallopt (musl, macOS) it does nothing and returns
False.
Why: glibc gives threads that allocate at once arenas of their own, up to 8 per core, and each
keeps the memory its thread freed. The operator runs a tick thread per SpecDeployment being
observed (operator/kube/beat.py, up to 256), each allocating while it parses scrapes and fits
its GP, so its resident memory grew with the arenas, not with what it holds
(bench/results/operator_load.md measures both).
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
