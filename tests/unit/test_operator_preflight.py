"""`specpilot operator` against a cluster it cannot reach, or with credentials it cannot load,
or with installer settings Kubernetes would refuse: one `error:` line and exit status 2 before
kopf starts (kopf itself would retry the login forever). Run as the installed console script,
as a user would."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

SPECPILOT = Path(sys.executable).parent / "specpilot"


def _closed_port() -> int:
    # a port that was free a moment ago: nothing listens there, so connecting is refused
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def _kubeconfig(path: Path, server: str) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": server}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        ),
        encoding="utf-8",
    )
    return path


def _operator(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    assert SPECPILOT.exists(), f"{SPECPILOT}: the console script is not installed"
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("KUBE", "SPECPILOT_"))}
    done = subprocess.run(
        [str(SPECPILOT), "operator", "--standalone", "--liveness-port", "0", "--metrics-port", "0",
         *args],
        capture_output=True, text=True, timeout=120, check=False,
        env={**clean, "HOME": str(tmp_path), **(env or {})},
    )  # fmt: skip
    return done.returncode, done.stderr


def _one_error_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    return lines[0]


def test_a_refused_connection_is_one_line_naming_the_server(tmp_path: Path) -> None:
    server = f"https://127.0.0.1:{_closed_port()}"
    config = _kubeconfig(tmp_path / "config", server)
    code, stderr = _operator(tmp_path, "--kubeconfig", str(config))
    line = _one_error_line(stderr)
    assert code == 2
    assert server in line and str(config) in line, line


def test_the_kubeconfig_environment_variable_is_read_too(tmp_path: Path) -> None:
    server = f"https://127.0.0.1:{_closed_port()}"
    config = _kubeconfig(tmp_path / "config", server)
    code, stderr = _operator(tmp_path, env={"KUBECONFIG": str(config)})
    assert code == 2 and server in _one_error_line(stderr)


@pytest.mark.parametrize("content", [None, "not: [a kubeconfig"])
def test_a_missing_or_broken_kubeconfig_is_one_line(tmp_path: Path, content: str | None) -> None:
    path = tmp_path / "kubeconfig"
    if content is not None:
        path.write_text(content, encoding="utf-8")
    code, stderr = _operator(tmp_path, "--kubeconfig", str(path))
    line = _one_error_line(stderr)
    assert code == 2 and "cannot load Kubernetes credentials" in line, line


def test_bad_monitor_labels_are_refused_before_anything_else(tmp_path: Path) -> None:
    config = _kubeconfig(tmp_path / "config", f"https://127.0.0.1:{_closed_port()}")
    code, stderr = _operator(
        tmp_path, "--kubeconfig", str(config), env={"SPECPILOT_MONITOR_LABELS": "release=x"}
    )
    assert code == 2 and "SPECPILOT_MONITOR_LABELS" in _one_error_line(stderr)
