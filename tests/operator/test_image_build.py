"""The operator image, built and run: `image/build.sh --check` builds the Dockerfile's operator
target with buildah (overlay storage where the kernel allows it, else vfs; chroot isolation;
no daemon) over a Debian base made by debootstrap
(cached in .cache/image, keyed by debootstrap's arguments), runs it, then runs it again from
its OCI layout with plain chroot, on a read-only root filesystem. `make test` installs the tools
(buildah, debootstrap, umoci) and sets SPECPILOT_IMAGE_BUILD=required, so there a machine that
cannot build (not root, no tools) fails here instead of skipping.

Each fact the build saw is a file in .cache/image/out/; these tests read them."""

from __future__ import annotations

import os
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
WORK = REPO / ".cache" / "image"
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]
BUILD_TIMEOUT_S = 1800
"""A guard against a hung build, not a speed check (from nothing it took minutes here)."""


def _cannot_build() -> str | None:
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "the image build needs root (debootstrap, buildah's vfs storage, mounts)"
    missing = [tool for tool in ("buildah", "debootstrap", "umoci") if shutil.which(tool) is None]
    if missing:
        return f"missing {', '.join(missing)}: `make test` installs them (Debian packages)"
    return None


@pytest.fixture(scope="module")
def built() -> dict[str, str]:
    reason = _cannot_build()
    if reason is not None:
        if os.environ.get("SPECPILOT_IMAGE_BUILD") == "required":
            pytest.fail(reason)
        pytest.skip(reason)
    env = {**os.environ, "SPECPILOT_IMAGE_WORK": str(WORK)}
    done = subprocess.run(
        [str(REPO / "image" / "build.sh"), "--check"],
        env=env,
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
        check=False,
    )
    log = WORK / "build.log"
    log_tail = log.read_text(encoding="utf-8", errors="replace")[-4000:] if log.exists() else ""
    assert done.returncode == 0, f"image/build.sh --check failed:\n{done.stderr}\n{log_tail}"
    facts = (WORK / "out").iterdir()
    return {path.name: path.read_text(encoding="utf-8").strip() for path in facts}


def test_the_image_runs_specpilot(built: dict[str, str]) -> None:
    assert built["version"] == f"specpilot {VERSION}"
    help_text = built["operator-help"]
    assert help_text.startswith("usage: specpilot operator"), help_text
    assert "--kubeconfig" in help_text


def test_the_image_runs_as_65532_never_root(built: dict[str, str]) -> None:
    assert built["config-user"] == "65532:65532"
    assert built["config-entrypoint"] == "[specpilot]"
    assert built["uid"] == "65532"  # `id -u` under buildah run, as the image's user


def test_the_image_holds_no_torch_and_no_engine(built: dict[str, str]) -> None:
    assert built["engines-importable"] == "[]"


def test_the_oci_layout_runs_with_plain_chroot_on_a_read_only_root(built: dict[str, str]) -> None:
    """The path that needs no container runtime (umoci unpack, then chroot as 65532), with
    the root filesystem bind-mounted read-only and a tmpfs on /tmp, as the chart runs it."""
    assert built["readonly-version"] == f"specpilot {VERSION}"
    assert built["readonly-operator-help"] == built["operator-help"]
    status, _, message = built["readonly-write"].partition(": ")
    assert status != "exit 0" and "Read-only file system" in message, built["readonly-write"]
    assert built["readonly-imports"] == "imported"
    # no cluster: one line and exit 2, not kopf retrying a login forever
    unreachable = built["readonly-unreachable"]
    assert unreachable.startswith("exit 2: error: cannot load Kubernetes credentials"), unreachable
    assert "\n" not in unreachable and "Traceback" not in unreachable


def test_the_build_measured_its_sizes(built: dict[str, str]) -> None:
    assert int(built["oci-layout-bytes"]) > 0
    sizes = dict(line.split(" ", 1) for line in built["sizes"].splitlines())
    assert f"localhost/specpilot:{VERSION}" in sizes, sizes
    assert built["storage-driver"] in {"overlay", "vfs"}
    phases = dict(line.split() for line in built["timings"].splitlines())
    assert {"base", "bud-operator", "buildah-run", "oci-chroot", "total"} <= set(phases)
