"""The Helm chart rendered by the real helm (from `make`'s .tools/kube), and the RBAC it grants.

Contract: `render(workdir, *values)` is `helm template` of helm/specpilot as parsed documents;
`find(docs, kind, name)` is the one document of that kind; `operator_rules(workdir)` is the
ClusterRole's rules, which the mock API server enforces on the operator's token
(`kube.apiserver.running_apiserver(operator_rules=...)`); `allowed_verbs(rules, group,
resource)` is what the rules grant on one resource, as Kubernetes' RBAC evaluates them
(union of the matching rules; "*" matches everything).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
HELM = REPO / ".tools" / "kube" / "helm" / "helm"
CHART = REPO / "helm" / "specpilot"

Obj = dict[str, Any]


def helm(workdir: Path, *args: str) -> str:
    assert HELM.exists(), f"{HELM} is missing: `make` fetches it (target .tools/kube)"
    # Helm writes its cache and config under HOME; the caller's directory keeps runs apart.
    env = {**os.environ, "HOME": str(workdir), "XDG_CACHE_HOME": str(workdir / "cache")}
    done = subprocess.run(
        [str(HELM), *args], capture_output=True, text=True, env=env, timeout=60, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def render(workdir: Path, *values: str) -> list[Obj]:
    sets = [arg for value in values for arg in ("--set", value)]
    out = helm(workdir, "template", "rel", str(CHART), "-n", "specpilot", "--include-crds", *sets)
    return [doc for doc in yaml.safe_load_all(out) if doc]


def find(docs: list[Obj], kind: str, name: str | None = None) -> Obj:
    matches = [d for d in docs if d["kind"] == kind and name in (None, d["metadata"]["name"])]
    assert len(matches) == 1, f"{len(matches)} {kind} {name or ''}"
    return matches[0]


def operator_rules(workdir: Path) -> list[Obj]:
    # the operator's own role; the chart also renders aggregated view/edit roles for users
    roles = [
        d
        for d in render(workdir)
        if d["kind"] == "ClusterRole" and not d["metadata"]["name"].endswith(("-view", "-edit"))
    ]
    assert len(roles) == 1, f"{len(roles)} operator ClusterRoles"
    rules: list[Obj] = roles[0]["rules"]
    return rules


def allowed_verbs(rules: list[Obj], group: str, resource: str) -> set[str]:
    verbs: set[str] = set()
    for rule in rules:
        groups, resources = rule.get("apiGroups", []), rule.get("resources", [])
        if (group in groups or "*" in groups) and (resource in resources or "*" in resources):
            verbs |= set(rule.get("verbs", []))
    return verbs


def allows(rules: list[Obj], verb: str, group: str, resource: str) -> bool:
    verbs = allowed_verbs(rules, group, resource)
    return verb in verbs or "*" in verbs
