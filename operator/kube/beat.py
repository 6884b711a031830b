"""A SpecDeployment daemon's beats, run on the operator's own bounded tick pool.

Contract: `await run_beats(stopped, beat, pool=..., every_s=...)` calls `beat(sleep)` on a
thread of `pool` every `every_s` seconds until kopf's stop flag `stopped` is set, and returns
then. Between beats the daemon is a coroutine waiting on kopf's event loop and holds no
thread. The first beat comes `first_after_s` late (`tick_phase`: objects created together tick
apart). `sleep(seconds)`, the only wait a beat may use, raises `Stopping` as soon as the flag
is set (the flag is relayed to the thread), and `run_beats` ends quietly on it; any other
exception from a beat is raised to kopf (which logs it and restarts the daemon).

Why a pool of our own: a beat can wait through an observation window and follow a rollout for
minutes. A synchronous kopf daemon holds one thread of kopf's executor for its lifetime, and
create and update handlers run on that same executor, so 16 SpecDeployments (its 16 workers)
stalled every later create and spec edit. Here kopf's executor is left to the handlers; beats
queue for a tick thread when more are due at once than `pool` has threads (a tick runs late,
never lost), and never delay a create or an edit.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import threading
from collections.abc import Callable

import kopf

from specpilot.operator.kube.tuning_daemon import Stopping

Sleep = Callable[[float], None]
TICK_WORKERS = 256
"""Tick threads: a due tick holds one while it observes (most of its interval), so this is
about how many SpecDeployments tick on time, each at its own interval; past it ticks run late."""


def tick_pool(workers: int = TICK_WORKERS) -> concurrent.futures.ThreadPoolExecutor:
    """Threads start on demand, so a small operator runs a few."""
    return concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="specpilot-tick")


def tick_phase(namespace: str, name: str) -> float:
    """A fixed share of the interval, in [0, 1), by object: where its ticks fall in it.

    Why: SpecDeployments created together (`kubectl apply -f dir/`) or resumed together (an
    operator restart) would otherwise tick in lock-step, every object scraping its pods at the
    same instants and writing status at once; at 200 objects that burst, not the work itself,
    made most of a tick's time (bench/results/operator_load.md). A hash, not a random draw,
    so a restarted operator spreads them the same way."""
    digest = hashlib.blake2b(f"{namespace}/{name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


async def run_beats(
    stopped: kopf.DaemonStopped,
    beat: Callable[[Sleep], None],
    *,
    pool: concurrent.futures.Executor,
    every_s: float,
    first_after_s: float = 0.0,
) -> None:
    """`first_after_s`: the first beat waits this long (`tick_phase` x the object's interval)."""
    flag = threading.Event()

    async def relay() -> None:
        await stopped.wait()
        flag.set()

    def sleep(seconds: float) -> None:
        if flag.wait(seconds):
            raise Stopping(str(stopped.reason))

    relaying = asyncio.create_task(relay())
    loop = asyncio.get_running_loop()
    try:
        if first_after_s > 0:
            await stopped.wait(first_after_s)
        while not stopped.is_set():
            try:
                await loop.run_in_executor(pool, beat, sleep)
            except Stopping:
                return
            await stopped.wait(every_s)
    finally:
        flag.set()  # a beat still running (the daemon cancelled) stops at its next wait
        relaying.cancel()
