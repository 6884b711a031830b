"""The operator image, checked without building it (test_image_build.py builds and runs it in
`make test`; `make image` builds both targets and writes image/BUILD-RESULT.md): what the
Dockerfile installs is the package with its run-time dependencies only, pinned by
image/constraints.txt to versions pyproject.toml allows, from a build context that holds what it
copies; every package folder is in the distribution (a non-editable install, as the image makes,
has only those); and the committed build record is of this Dockerfile and these constraints."""

from __future__ import annotations

import fnmatch
import hashlib
import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile"
CONSTRAINTS = REPO / "image" / "constraints.txt"
RECORD = REPO / "image" / "BUILD-RESULT.md"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
FORBIDDEN = ("torch", "vllm", "sglang", "sgl-kernel", "triton", "nvidia-*", "transformers")
"""What the image must not hold: the probe's torch and everything an engine brings."""


def _pins() -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in CONSTRAINTS.read_text(encoding="utf-8").splitlines():
        if not line or line.startswith("#"):
            continue
        found = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9.!+_-]+)", line)
        assert found, f"not an exact pin: {line!r}"
        pins[canonicalize_name(found.group(1))] = found.group(2)
    return pins


def _instructions() -> list[tuple[str, str]]:
    text = DOCKERFILE.read_text(encoding="utf-8").replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            keyword, _, rest = line.strip().partition(" ")
            out.append((keyword.upper(), " ".join(rest.split())))
    return out


def test_every_runtime_dependency_is_pinned_within_pyproject() -> None:
    pins = _pins()
    for line in PYPROJECT["project"]["dependencies"]:
        requirement = Requirement(line)
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{name} is a dependency but image/constraints.txt does not pin it"
        assert requirement.specifier.contains(pins[name], prereleases=True), (
            f"image/constraints.txt pins {name}=={pins[name]}, outside pyproject's {requirement}"
        )


def test_the_image_holds_no_torch_and_no_engine() -> None:
    for name in _pins():
        assert not any(fnmatch.fnmatch(name, pattern) for pattern in FORBIDDEN), name
    installs = [rest for keyword, rest in _instructions() if "pip install" in rest]
    assert len(installs) == 1
    # the package itself, no extras ([probe] is torch), under the constraints
    assert re.search(r"pip install .*-c image/constraints\.txt \.(?=\s|$)", installs[0])


def test_the_operator_target_runs_unprivileged_as_the_chart_expects() -> None:
    steps = _instructions()
    stages = [rest for keyword, rest in steps if keyword == "FROM"]
    assert [s.split(" AS ")[-1] for s in stages] == ["build", "operator", "emulator"]
    assert ("USER", "65532:65532") in steps
    assert ("ENTRYPOINT", '["specpilot"]') in steps
    # the chart runs it with this uid and a read-only root filesystem (values.yaml)
    values = (REPO / "helm" / "specpilot" / "values.yaml").read_text(encoding="utf-8")
    assert "runAsUser: 65532" in values and "readOnlyRootFilesystem: true" in values


def test_the_build_context_holds_what_the_dockerfile_copies() -> None:
    ignore = [
        line
        for line in (REPO / ".dockerignore").read_text(encoding="utf-8").splitlines()
        if line and not line.startswith("#")
    ]
    copied = [
        path
        for keyword, rest in _instructions()
        if keyword == "COPY" and "--from" not in rest
        for path in rest.split()[:-1]
    ]
    assert copied
    for path in copied:
        assert (REPO / path).exists(), path
        # .dockerignore: the last matching pattern decides; "!" lets a path back in
        admitted = True
        for pattern in ignore:
            negated = pattern.startswith("!")
            bare = pattern.lstrip("!").rstrip("/")
            if fnmatch.fnmatch(path, bare) or path.startswith(bare + "/"):
                admitted = negated
        assert admitted, f"{path} is copied but .dockerignore leaves it out"


def test_every_package_folder_is_in_the_distribution() -> None:
    tool = PYPROJECT["tool"]["setuptools"]
    folders = {package: Path(folder) for package, folder in tool["package-dir"].items()}
    found = set()
    for package, folder in folders.items():
        for init in (REPO / folder).rglob("__init__.py"):
            relative = init.parent.relative_to(REPO / folder)
            found.add(".".join((package, *relative.parts)))
    found |= set(folders)  # specpilot.operator has no __init__.py at its top, on purpose
    assert set(tool["packages"]) == found


def test_the_build_record_is_of_this_dockerfile_and_these_constraints() -> None:
    record = RECORD.read_text(encoding="utf-8")
    for path in (DOCKERFILE, CONSTRAINTS):
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        assert digest in record, f"{path.name} changed since the recorded build: run `make image`"
    version = PYPROJECT["project"]["version"]
    # what `specpilot --version` printed in the image, run by buildah and from the OCI layout
    assert record.count(f"specpilot {version}") >= 2, record
    assert "(`id -u`: 65532)" in record
    # on a read-only root filesystem the operator imports, and an unreachable cluster is one line
    assert "importing the operator's handlers printed `imported`" in record
    assert "/nonexistent` exited 2, printing `error: cannot load Kubernetes credentials" in record
