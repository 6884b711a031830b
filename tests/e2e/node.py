"""The node side of the kubelet double (tests/e2e/kubelet.py): what runs on this machine.

Contract: `local_program()` is THE one place that maps a container's program to an
interpreter here (the image is not pulled; arguments are kept). `container_argv()` builds a
pod's command line from its container exactly, with the two node-level substitutions the
kubelet docstring explains (the pod IP for `--host 0.0.0.0`, local folders for mount paths).
`LocalPod` is one pod: its process in its own session (stopped with its whole group), its log,
restarts, readiness, and the Pod status it reports (`status()`), including the terminated
state's message from the log tail (`terminationMessagePolicy: FallbackToLogsOnError`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
VLLM_PYTHON = ROOT / ".venvs/vllm/bin/python"
SGLANG_PYTHON = ROOT / ".venvs/sglang/bin/python"
Obj = dict[str, Any]


class UnknownProgram(RuntimeError):
    """A container command this harness cannot map to a local program."""


def local_program(command: Sequence[str]) -> list[str]:
    """THE mapping from a container's program to this machine's (arguments unchanged):
    `specpilot ...` -> this interpreter running the specpilot CLI; `python[3] -m vllm...` ->
    the vLLM CPU environment's interpreter (.venvs/vllm); `python[3] -m sglang...` -> SGLang's
    (.venvs/sglang); `python[3] -m specpilot...` and other `python[3] ...` -> this interpreter.
    """
    if not command:
        raise UnknownProgram("the container has no command (an image ENTRYPOINT is not known)")
    program, rest = os.path.basename(command[0]), list(command[1:])
    if program == "specpilot":
        return [sys.executable, "-m", "specpilot.operator.app.cli", *rest]
    if program.startswith("python"):
        module = rest[1] if rest[:1] == ["-m"] and len(rest) > 1 else ""
        if module.startswith("vllm"):
            return [str(VLLM_PYTHON), *rest]
        if module.startswith("sglang"):
            return [str(SGLANG_PYTHON), *rest]
        return [sys.executable, *rest]
    raise UnknownProgram(f"no local program for container command {list(command)!r}")


@dataclass(eq=False)
class LocalPod:
    name: str
    deployment: str
    template_hash: str
    ip: str
    pod: Obj
    """The Pod object as last written."""
    argv: list[str]
    env: dict[str, str]
    folder: Path
    process: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    last_exit: Obj | None = None
    restart_at: float = 0.0
    ready: bool = False
    written_status: Obj = field(default_factory=dict)

    @property
    def log(self) -> Path:
        return self.folder / "container.log"

    def start(self) -> None:
        with self.log.open("ab") as handle:
            self.process = subprocess.Popen(
                self.argv,
                stdout=handle,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=self.folder,
                start_new_session=True,
            )

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)

    def status(self) -> Obj:
        """The Pod's status as a kubelet reports it."""
        container = self.pod["spec"]["containers"][0]
        if self.process is not None:
            state: Obj = {"running": {"startedAt": _timestamp()}}
        else:
            state = {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off restarting"}}
        ready = "True" if self.ready else "False"
        return {
            "phase": "Running",
            "podIP": self.ip,
            "podIPs": [{"ip": self.ip}],
            "hostIP": "127.0.0.1",
            "conditions": [
                {"type": "PodScheduled", "status": "True"},
                {"type": "Initialized", "status": "True"},
                {"type": "ContainersReady", "status": ready},
                {"type": "Ready", "status": ready},
            ],
            "containerStatuses": [
                {
                    "name": container.get("name", "engine"),
                    "image": container.get("image", ""),
                    "ready": self.ready,
                    "restartCount": self.restarts,
                    "started": self.process is not None,
                    "state": state,
                    "lastState": {"terminated": self.last_exit} if self.last_exit else {},
                }
            ],
        }


def container_argv(container: Obj, ip: str, mounts: Mapping[str, Path]) -> list[str]:
    """The local command line of a pod's container: its command and args exactly, except
    `--host 0.0.0.0` (the pod's own network namespace: its IP) and mount paths (the folders
    standing in for the volumes)."""

    def local(args: Sequence[str]) -> list[str]:
        out = []
        for index, arg in enumerate(args):
            if index > 0 and args[index - 1] == "--host" and arg in ("0.0.0.0", "::"):
                arg = ip
            for mount_path, folder in mounts.items():
                arg = arg.replace(mount_path.rstrip("/") + "/", f"{folder}/")
                arg = str(folder) if arg == mount_path else arg
            out.append(arg)
        return out

    command = local(container.get("command") or [])
    if not command:
        raise UnknownProgram("the container has no command (an image ENTRYPOINT is unknown)")
    port = port_number(container, None)
    if port is not None:
        check_free(ip, port)
    return local_program(command) + local(container.get("args") or [])


def port_number(container: Mapping[str, Any], port: Any) -> int | None:
    ports = container.get("ports") or []
    if isinstance(port, int):
        return port
    if isinstance(port, str) and not port.isdigit():
        for entry in ports:
            if entry.get("name") == port:
                return int(entry["containerPort"])
        return None
    if isinstance(port, str):
        return int(port)
    return int(ports[0]["containerPort"]) if ports else None


def check_free(ip: str, port: int) -> None:
    with socket.socket() as sock:
        # As the engines' servers do: a connection of an earlier pod in TIME_WAIT is no owner.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((ip, port))
        except OSError as exc:
            raise RuntimeError(
                f"{ip}:{port} is taken on this machine (a process bound 0.0.0.0:{port}?): "
                "the kubelet double cannot give the pod its container port"
            ) from exc


def _timestamp() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
