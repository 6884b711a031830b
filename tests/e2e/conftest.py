"""End-to-end fixtures: the mock API server (the only mock), the kubelet double, engine
processes (the emulator; once real vLLM), closed-loop load through the "Service", Prometheus.

The Service has no kube-proxy here: `ServiceLoad` sends each request to one of the Ready pods
of the SpecDeployment (main and canary alike, round robin), which is what a ClusterIP Service
does. Everything an engine serves, the operator sees or the tuner decides is real.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from kube.apiserver import ApiServer, running_apiserver
from kube.chart import operator_rules
from kube.operator_process import wait_for as poll_until

from e2e.kubelet import Kubelet

ROOT = Path(__file__).resolve().parents[2]
KUBECTL = ROOT / ".tools/kube/kubectl/kubectl"
PROMETHEUS = ROOT / ".tools/prometheus/usr/bin/prometheus"
NAMESPACE = "default"
# The emulator stands in for the engine container: its command is the SpecDeployment's
# `spec.command`; the args are what the adapter renders. A100's low ridge point (~156
# FLOP/byte) puts the compute-bound regime within reach of ~100 emulated users.
GPU = "A100"


def emulator_command(engine: str, load_delay_s: float = 0.5) -> list[str]:
    return [
        "specpilot", "emulate", "--engine", engine, "--gpu", GPU,
        "--model-profile", "llama-3.1-8b", "--load-delay", str(load_delay_s),
        "--require-local-weights",
    ]  # fmt: skip


@pytest.fixture
def models(tmp_path: Path) -> Path:
    """Local "weights" folders: the target and an EAGLE-3 head (the emulator checks they
    exist, as an engine would)."""
    root = tmp_path / "models"
    for name in ("llama", "eagle3"):
        (root / name).mkdir(parents=True)
    return root


@pytest.fixture
def apiserver(tmp_path: Path) -> Iterator[ApiServer]:
    with running_apiserver(tmp_path, operator_rules=operator_rules(tmp_path)) as api:
        yield api
        assert api.denials() == [], "the chart's ClusterRole refused the operator"


@pytest.fixture
def kubelet(apiserver: ApiServer, tmp_path: Path) -> Iterator[Kubelet]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    with Kubelet(
        apiserver.url,
        namespace=NAMESPACE,
        workdir=tmp_path / "node",
        base_env=env,
        prometheus_targets=tmp_path / "targets.json",
    ) as node:
        yield node
        assert not node.errors, node.errors[-5:]


def wait_for(what: str, check: Callable[[], Any], timeout_s: float, every_s: float = 0.25) -> Any:
    return poll_until(check, timeout_s, every_s, what=what)


class ServiceLoad:
    """`users` closed-loop clients (asyncio, one thread) against the Ready pods of `app`."""

    def __init__(self, kubelet: Kubelet, app: str, *, users: int, max_tokens: int = 256) -> None:
        self.kubelet, self.app, self.max_tokens = kubelet, app, max_tokens
        self.completed = 0
        self.failed = 0
        self._users = users
        self._stop = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._round_robin = itertools.count()
        self._thread = threading.Thread(target=self._loop.run_until_complete, args=(self._run(),))
        self._thread.start()

    def set_users(self, users: int) -> None:
        self._users = users

    def _endpoints(self) -> list[str]:
        while True:
            try:  # the kubelet's thread changes the dict; retry a torn read
                pods = list(self.kubelet.pods.values())
                break
            except RuntimeError:
                continue
        return [
            f"http://{p.ip}:{_port(p.pod)}"
            for p in pods
            if p.ready and p.deployment in (self.app, f"{self.app}-canary")
        ]

    async def _run(self) -> None:
        limits = httpx.Limits(max_connections=1024, max_keepalive_connections=1024)
        async with httpx.AsyncClient(timeout=120, limits=limits) as client:
            tasks: dict[int, asyncio.Task[None]] = {}
            while not self._stop.is_set():
                for index in range(self._users):
                    if index not in tasks or tasks[index].done():
                        tasks[index] = asyncio.create_task(self._user(client, index))
                await asyncio.sleep(0.2)
            await asyncio.gather(*tasks.values())

    async def _user(self, client: httpx.AsyncClient, index: int) -> None:
        body = {"prompt": "word " * 64, "max_tokens": self.max_tokens, "temperature": 0}
        while not self._stop.is_set() and index < self._users:
            endpoints = self._endpoints()
            if not endpoints:
                await asyncio.sleep(0.2)
                continue
            url = endpoints[next(self._round_robin) % len(endpoints)]
            try:
                response = await client.post(f"{url}/v1/completions", json=body)
                if response.status_code == 200:
                    self.completed += 1
                else:
                    self.failed += 1
            except httpx.HTTPError:
                self.failed += 1  # the pod went away mid-request (a rollout)
                await asyncio.sleep(0.1)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=90)


def _port(pod: dict[str, Any]) -> int:
    return int(pod["spec"]["containers"][0]["ports"][0]["containerPort"])


@pytest.fixture
def load_factory() -> Iterator[Callable[..., ServiceLoad]]:
    started: list[ServiceLoad] = []

    def make(kubelet: Kubelet, app: str, *, users: int, max_tokens: int = 256) -> ServiceLoad:
        load = ServiceLoad(kubelet, app, users=users, max_tokens=max_tokens)
        started.append(load)
        return load

    yield make
    for load in started:
        load.stop()


class Operator:
    """`specpilot operator` as a subprocess against the mock API server."""

    def __init__(self, apiserver: ApiServer, workdir: Path) -> None:
        self.log = workdir / "operator.log"
        with self.log.open("wb") as handle:
            command = [
                # as the chart runs it by default: every namespace, under its ClusterRole
                sys.executable, "-m", "specpilot.operator.app.cli", "operator", "--standalone",
                "--all-namespaces", "--liveness-port", "0", "--metrics-port", "0",
                "--kubeconfig", str(apiserver.operator_kubeconfig),
            ]  # fmt: skip
            self.process = subprocess.Popen(
                command,
                stdout=handle,
                stderr=subprocess.STDOUT,
                # the Prometheus the tests start listens on this host
                env={
                    **apiserver.operator_env(),
                    "SPECPILOT_PROMETHEUS_URL_ALLOW": "http://127.0.0.1",
                },
                start_new_session=True,
            )

    def tail(self, chars: int = 6000) -> str:
        return self.log.read_text(errors="replace")[-chars:]

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)


@pytest.fixture
def operator(apiserver: ApiServer, tmp_path: Path) -> Iterator[Operator]:
    running = Operator(apiserver, tmp_path)
    yield running
    running.stop()


def kubectl(apiserver: ApiServer, *args: str, stdin: str | None = None) -> str:
    done = subprocess.run(
        [str(KUBECTL), "--kubeconfig", str(apiserver.kubeconfig), *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "HOME": str(apiserver.kubeconfig.parent)},
    )
    assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stderr}"
    return done.stdout
