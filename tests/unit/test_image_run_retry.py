"""image/build.sh's `run_in`, the real function text run by bash against a fake buildah: it
retries `buildah run` only on the kernel's transient EBUSY while buildah seals its memfd copy
(seen in the image tests beside stress-ng), and fails at once on any other error."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

BUILD_SCRIPT = Path(__file__).resolve().parents[2] / "image" / "build.sh"
TRANSIENT = (
    "Error: Close_Fd sealing memfd copy: Device or resource busy"  # buildah's words, stress-full-3
)


def run_in_function() -> str:
    found = re.search(r"^run_in\(\) \{.*?^\}$", BUILD_SCRIPT.read_text(), re.M | re.S)
    assert found, "image/build.sh no longer defines run_in()"
    return found.group(0)


def run_with_fake_buildah(tmp_path: Path, failures: int, message: str) -> tuple[int, int, str]:
    """(exit status, buildah run calls, stderr) of `run_in image true` where the fake buildah's
    first `failures` runs print `message` and exit 1."""
    calls = tmp_path / "calls"
    fake = tmp_path / "buildah"
    fake.write_text(
        "#!/usr/bin/env bash\n"
        'if [ "$1" = from ]; then echo container-1; exit 0; fi\n'
        f'echo run >>"{calls}"\n'
        f'if [ "$(wc -l <"{calls}")" -le {failures} ]; then echo "{message}" >&2; exit 1; fi\n'
        "echo ran\n"
    )
    fake.chmod(0o755)
    script = (
        "set -euo pipefail\n"
        f'BUILDAH=("{fake}")\n'
        f'LOG="{tmp_path / "log"}"\n'
        "declare -A containers=()\n"
        "sleep() { :; }\n"  # the back-off is not what is tested
        f"{run_in_function()}\n"
        'run_in image true\necho "out=$OUT_TEXT"\n'
    )
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)
    count = len(calls.read_text().splitlines()) if calls.exists() else 0
    return done.returncode, count, done.stdout + done.stderr


@pytest.mark.parametrize("failures", [1, 2])
def test_transient_memfd_busy_is_retried(tmp_path: Path, failures: int) -> None:
    status, calls, output = run_with_fake_buildah(tmp_path, failures, TRANSIENT)
    assert status == 0, output
    assert calls == failures + 1
    assert "out=ran" in output


def test_transient_error_gives_up_after_three_runs(tmp_path: Path) -> None:
    status, calls, output = run_with_fake_buildah(tmp_path, 5, TRANSIENT)
    assert status == 1
    assert calls == 3
    assert "error: true failed in image (exit 1)" in output


def test_any_other_error_fails_at_once(tmp_path: Path) -> None:
    status, calls, output = run_with_fake_buildah(tmp_path, 1, "Error: no such container")
    assert status == 1
    assert calls == 1
    assert "error: true failed in image" in output
