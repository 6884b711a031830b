"""`specpilot demo`, shortened: the real-time loop, the fast-mode baselines and the report.

Runs the real command as a subprocess (emulator process, tuner, load generator over HTTP) on a
40 s trace and checks what it leaves behind: a valid PNG, a summary with the static configs and
SpecPilot's real-time row, ticks that carry decision reasons, exit status 0, and no engine
process left running (found by a marker in the environment the engine inherits).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _processes_with(marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue  # gone, or not ours
        if marker.encode() in environ:
            found.append(int(entry.name))
    return found


def test_short_demo_writes_plot_and_summary_and_cleans_up(tmp_path: Path) -> None:
    marker = f"SPECPILOT_DEMO_TEST={uuid.uuid4().hex}"
    env = {**os.environ, marker.split("=")[0]: marker.split("=")[1]}
    out = tmp_path / "out"
    command = [
        sys.executable,
        "-m",
        "specpilot.operator.app.cli",
        "demo",
        "--duration",
        "40",
        "--window",
        "4",
        "--min-dwell",
        "8",
        "--load-delay",
        "0.5",
        "--out",
        str(out),
    ]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=480)
    assert done.returncode == 0, done.stderr[-3000:]
    assert _processes_with(marker) == []

    png = (out / "plot.png").read_bytes()
    assert png.startswith(PNG_SIGNATURE) and png[12:16] == b"IHDR"
    summary = json.loads((out / "summary.json").read_text())
    rows = {(r["policy"], r["mode"].split(" (")[0]): r for r in summary["policies"]}
    assert ("no speculation", "fast mode") in rows
    assert ("eagle3 K=3", "fast mode") in rows
    realtime = rows[("specpilot", "real time")]
    assert realtime["tokens_per_s"] > 0 and realtime["completed"] > 0
    assert any(t["reason"] for t in summary["ticks"])
    assert summary["switches"][0]["config"] == "no speculation"
    # the default rollout is a surge: the load generator follows the new engine's port
    assert summary["setup"]["rollout"] == "surge" and summary["requests"]["http_errors"] == 0
    # and its fast mode counts SpecPilot also without the spare GPU's drain
    assert ("specpilot:handover", "fast mode") in rows
    assert summary["best_static_fast_mode"] not in ("specpilot", "specpilot:handover")
    markdown = (out / "summary.md").read_text()
    assert "| specpilot | real time" in markdown and "without the spare GPU's drain" in markdown
    # Not a terminal: one plain line per tick, no ANSI redraws.
    assert "\x1b[" not in done.stdout and "t=" in done.stdout
