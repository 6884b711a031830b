"""The SpecDeployment CustomResourceDefinition, generated from the API models.

Contract: `crd()` is the CRD as a dict (names from operator/api/names.py, the schema from
`SpecDeployment` in operator/api/status.py through `structural_schema`), `render_crd()` its YAML
text with a header saying it is generated. `python -m specpilot.operator.api.crd` writes that
text to crds/specdeployment.yaml and its byte-identical Helm copy; with `--check` it writes
nothing and exits 1 when a committed copy is stale. kubebuilder's controller-gen does this for
Go types; here the markers are pydantic fields, docstrings and `rules(cel(...))`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

from specpilot.operator.api.names import (
    APP_NAME,
    GROUP,
    KIND,
    NAME_LABEL,
    PLURAL,
    SHORT_NAME,
    SINGULAR,
    VERSION,
)
from specpilot.operator.api.schema import structural_schema
from specpilot.operator.api.status import SpecDeployment
from specpilot.operator.api.yaml_text import dump_yaml

__all__ = ["CRD_FILES", "REGENERATE", "crd", "main", "render_crd"]

CRD_FILES = ("crds/specdeployment.yaml", "helm/specpilot/crds/specdeployment.yaml")
"""Where the CRD is committed, relative to the repository root (the chart's copy is identical)."""
REGENERATE = "python -m specpilot.operator.api.crd"

HEADER = f"""\
# GENERATED FILE, do not edit. `{REGENERATE}` writes it from the API
# models in operator/api/ (models.py and speculative.py: the spec; status.py: the status and the
# whole object), and its byte-identical copy helm/specpilot/crds/specdeployment.yaml. Field
# descriptions are the models' docstrings, CEL rules their `rules(cel(...))`. Replicas belong to
# the user, an HPA or KEDA (scale subresource): SpecPilot copies .spec.replicas to its
# Deployment, never back.
"""

PRINTER_COLUMNS: tuple[dict[str, str | int], ...] = (
    {"name": "Engine", "type": "string", "jsonPath": ".spec.engine",
     "description": "Inference engine (vllm or sglang)."},
    {"name": "Method", "type": "string", "jsonPath": ".status.currentConfig.method",
     "description": 'Speculative method running now ("none" is a plain server).'},
    {"name": "K", "type": "integer", "jsonPath": ".status.currentConfig.numSpeculativeTokens",
     "description": "Speculative tokens drafted per step (the maximum when a schedule is set)."},
    {"name": "Regime", "type": "string", "jsonPath": ".status.regime",
     "description": "Load regime (memory-bound, transition, compute-bound)."},
    {"name": "AccLen", "type": "number", "jsonPath": ".status.observed.acceptanceLength",
     "description": "Mean acceptance length observed (tokens per verify step, bonus included)."},
    {"name": "Batch", "type": "number", "jsonPath": ".status.observed.batch",
     "description": "Mean running requests per replica observed."},
    {"name": "Ready", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Ready")].status',
     "description": "The Ready condition: every wanted engine pod serves the running config."},
    {"name": "Replicas", "type": "integer", "jsonPath": ".status.replicas",
     "description": "Engine pods of the main Deployment (status.readyReplicas: those Ready)."},
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase",
     "description": "Lifecycle phase."},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    {"name": "URL", "type": "string", "jsonPath": ".status.url", "priority": 1,
     "description": "The engine's endpoint inside the cluster (the Service)."},
)  # fmt: skip


def crd() -> dict[str, Any]:
    """The CustomResourceDefinition object."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{PLURAL}.{GROUP}",
            "labels": {NAME_LABEL: APP_NAME, "app.kubernetes.io/part-of": APP_NAME},
        },
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": [SHORT_NAME],
                "categories": ["all", APP_NAME],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {
                        "status": {},
                        "scale": {
                            "specReplicasPath": ".spec.replicas",
                            "statusReplicasPath": ".status.replicas",
                            "labelSelectorPath": ".status.selector",
                        },
                    },
                    "additionalPrinterColumns": [dict(c) for c in PRINTER_COLUMNS],
                    "schema": {"openAPIV3Schema": structural_schema(SpecDeployment)},
                }
            ],
        },
    }


def render_crd() -> str:
    """The CRD's YAML text, exactly as committed."""
    document = crd()
    text = HEADER + dump_yaml(document)
    if yaml.safe_load(text) != document:  # the writer's own check: what loads is what we meant
        raise AssertionError("the YAML writer changed the CRD")
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=REGENERATE, description="Write the SpecDeployment CRD from the API models."
    )
    parser.add_argument(
        "--root",
        type=Path,
        default=Path(__file__).resolve().parents[2],
        help="repository root (default: the checkout this module lives in)",
    )
    parser.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 if a committed copy differs"
    )
    args = parser.parse_args(argv)
    text = render_crd()
    stale = []
    for name in CRD_FILES:
        path = args.root / name
        current = path.read_text(encoding="utf-8") if path.exists() else None
        if current == text:
            continue
        stale.append(name)
        if not args.check:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
    verb = "stale" if args.check else "written"
    print(f"{verb}: {', '.join(stale)}" if stale else "up to date", file=sys.stderr)
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    raise SystemExit(main())
