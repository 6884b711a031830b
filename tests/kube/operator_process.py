"""`specpilot operator` as a subprocess against the mock API server, for tests. A TEST HELPER.

Contract: `running_operator(api, log_path, *extra_args)` starts the real command with the
operator's kubeconfig (its account, on which the server enforces RBAC when given rules) and
free probe/metrics ports, yields the `Operator` (process, ports, log), and on exit stops it
with SIGTERM (kopf's graceful stop: peering keep-alive withdrawn), then SIGKILL after a grace
period, so no process outlives the test; `start_operator` starts one that the caller stops
or kills itself. `wait_for(check, timeout)`
polls a check until it returns something truthy.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from kube.apiserver import ApiServer

T = TypeVar("T")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class Operator:
    process: subprocess.Popen[bytes]
    log: Path
    liveness_port: int
    metrics_port: int

    def text(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")


def start_operator(
    api: ApiServer, log: Path, *extra: str, env: Mapping[str, str] | None = None
) -> Operator:
    """The operator process, started; the caller stops it (`stop`, or a test's SIGKILL).
    `env` adds to the operator account's environment (e.g. POD_ID, its peering identity)."""
    liveness, metrics = free_port(), free_port()
    command = [
        sys.executable, "-m", "specpilot.operator.app.cli", "operator", "--verbose",
        "--liveness-port", str(liveness), "--metrics-port", str(metrics), *extra,
    ]  # fmt: skip
    with log.open("wb") as sink:
        process = subprocess.Popen(
            command,
            env={**api.operator_env(), **(env or {})},
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    return Operator(process, log, liveness, metrics)


@contextlib.contextmanager
def running_operator(
    api: ApiServer, log: Path, *extra: str, env: Mapping[str, str] | None = None
) -> Iterator[Operator]:
    operator = start_operator(api, log, *extra, env=env)
    try:
        yield operator
    finally:
        stop(operator.process)


def stop(process: subprocess.Popen[bytes], grace_s: float = 15.0) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(grace_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)


# A 2-core CI host under load runs the operator several times slower than a quiet one; a
# longer wait costs nothing when things work, since it returns as soon as the check holds.
SLOW_HOST_FACTOR = 4.0


def wait_for(
    check: Callable[[], T | None], timeout: float = 20.0, poll: float = 0.2, what: str = ""
) -> T:
    timeout *= SLOW_HOST_FACTOR
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what or check}")
        time.sleep(poll)
