"""Real engines for the contract tests: where they live, how to start them, how to ask them.

Everything here runs real software built by `make engines`: vLLM 0.32 (CPU build) and SGLang
0.5.23 in their own virtual environments, Debian's Prometheus, and tiny local models. Tests
marked `engines` are skipped with SPECPILOT_SKIP_ENGINES=1 (tests/conftest.py); otherwise a
missing environment is a failure, never a silent skip.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
ENGINE_SIDE = Path(__file__).resolve().parent / "engine_side"
VLLM_PYTHON = ROOT / ".venvs/vllm/bin/python"
SGLANG_PYTHON = ROOT / ".venvs/sglang/bin/python"
PROMETHEUS = ROOT / ".tools/prometheus/usr/bin/prometheus"
MODELS = ROOT / ".cache/tiny-models"
OFFLINE_ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def require(path: Path) -> Path:
    if not path.exists():
        pytest.fail(f"{path} is missing: run `make engines` (or SPECPILOT_SKIP_ENGINES=1)")
    return path


def run_engine_script(python: Path, script: str, cases: Sequence[Sequence[str]]) -> list[dict]:
    """Run an engine-side validation script over argument lists; one result dict per case."""
    done = subprocess.run(
        [str(require(python)), str(ENGINE_SIDE / script)],
        input=json.dumps([list(c) for c in cases]),
        capture_output=True,
        text=True,
        env=OFFLINE_ENV,
        timeout=1200,
        check=False,
    )
    results = [
        json.loads(line.removeprefix("RESULT "))
        for line in done.stdout.splitlines()
        if line.startswith("RESULT ")
    ]
    assert len(results) == len(cases), done.stderr[-4000:]
    return results


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Process:
    """A started server process in its own session, stopped with its whole group."""

    popen: subprocess.Popen[bytes]
    log: Path

    def stop(self) -> None:
        if self.popen.poll() is None:
            os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait(timeout=10)

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]


def start(command: Sequence[str], log: Path, env: dict[str, str] | None = None) -> Process:
    handle = log.open("wb")
    popen = subprocess.Popen(
        list(command),
        stdout=handle,
        stderr=subprocess.STDOUT,
        env=env or OFFLINE_ENV,
        start_new_session=True,
    )
    return Process(popen, log)


def wait_http_ok(process: Process, url: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.popen.poll() is not None:
            pytest.fail(f"server exited with {process.popen.returncode}:\n{process.tail()}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    process.stop()
    pytest.fail(f"{url} not ready after {timeout_s}s:\n{process.tail()}")


def start_prometheus(
    binary: Path, job: str, target: str, folder: Path, stopper: list[Process]
) -> str:
    """A real Prometheus scraping `target` (host:port) every second as `job`; its URL once
    ready. Stopped with the test's other processes."""
    port = free_port()
    config = folder / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        f"scrape_configs:\n  - job_name: {job}\n"
        f"    static_configs:\n      - targets: ['{target}']\n"
    )
    process = start(
        [
            str(binary),
            f"--config.file={config}",
            f"--storage.tsdb.path={folder / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        folder / "prometheus.log",
    )
    stopper.append(process)
    url = f"http://127.0.0.1:{port}"
    wait_http_ok(process, f"{url}/-/ready", timeout_s=60)
    return url


@pytest.fixture(scope="session")
def models() -> Path:
    return require(MODELS / "llama").parent


@pytest.fixture(scope="session")
def prometheus_binary() -> Path:
    return require(PROMETHEUS)


@pytest.fixture
def stopper() -> Iterator[list[Process]]:
    started: list[Process] = []
    yield started
    for process in started:
        process.stop()
