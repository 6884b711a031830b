"""The Prometheus Operator objects SpecPilot writes, validated against that operator's own CRD
schemas (monitoring.coreos.com/v1, v0.90.1): the chart's ServiceMonitor and PrometheusRule
with every tested values file, and the PodMonitor or ServiceMonitor the operator creates for
each SpecDeployment. kubernetes-validate knows only the built-in kinds, so these schemas come
from the npm package @kubernetes-models/prometheus-operator (validators compiled from the
CRDs' openAPIV3Schema), which `make` installs from tests/operator/prometheus_operator's lock;
validate.mjs there runs them.

The CRDs' schemas do not forbid unknown fields (the API server prunes them, so a misspelt
field is silently dropped), and neither do the compiled validators: a field no schema names is
found by `unknown_fields`, from the field names in the same package's TypeScript declarations
(generated from the same CRDs)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from kube.chart import CHART, REPO, helm

from specpilot.operator.api.spec import decode_spec
from specpilot.operator.kube.children import desired_monitor

HERE = Path(__file__).resolve().parent / "prometheus_operator"
MODELS = REPO / ".tools" / "prometheus-operator-schemas"
PACKAGE = MODELS / "node_modules" / "@kubernetes-models" / "prometheus-operator"
KINDS = ("PodMonitor", "ServiceMonitor", "PrometheusRule")

Obj = dict[str, Any]


def schema_errors(objects: list[Obj]) -> list[list[str]]:
    """For each object, what the Prometheus Operator's CRD schema says is wrong with it, and
    the fields it does not name."""
    node = shutil.which("node")
    assert node, "node is missing (the machine's Node.js runs the CRD validators)"
    assert PACKAGE.is_dir(), f"{PACKAGE} is missing: `make` installs it"
    done = subprocess.run(
        [node, str(HERE / "validate.mjs"), str(MODELS)],
        input=json.dumps(objects),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    errors: list[list[str]] = json.loads(done.stdout)
    assert len(errors) == len(objects)
    for obj, found in zip(objects, errors, strict=True):
        if obj.get("kind") in KINDS:
            found += unknown_fields(obj, declared_fields(obj["kind"]))
    return errors


FieldTree = dict[str, "FieldTree | None"]
_PROPERTY = re.compile(r'^"(?P<name>[^"]+)"\??: (?P<type>.+)$|^\[key: string\]: (?P<map>.+)$')


def declared_fields(kind: str) -> FieldTree:
    """The fields of `kind` as the package's declarations (monitoring.coreos.com/v1/KIND.d.ts)
    name them: name -> its fields (None: a leaf or a type declared elsewhere, as metadata);
    "*" for any key of a map. The file is generated, one property per line; a line of another
    shape fails here rather than being read wrongly."""
    path = PACKAGE / "monitoring.coreos.com" / "v1" / f"{kind}.d.ts"
    lines = path.read_text(encoding="utf-8").splitlines()
    start = lines.index(f"export interface I{kind} {{")
    root: FieldTree = {}
    stack = [root]
    for line in lines[start + 1 :]:
        text = line.strip()
        if text.startswith("}"):
            if len(stack) == 1:
                return root
            stack.pop()
            continue
        found = _PROPERTY.match(text)
        assert found, f"{path.name}: cannot read {text!r}"
        name = found["name"] or "*"
        if (found["type"] or found["map"]).endswith("{"):
            child: FieldTree = {}
            stack[-1][name] = child
            stack.append(child)
        else:
            stack[-1][name] = None
    raise AssertionError(f"{path.name}: interface I{kind} never closes")


def unknown_fields(value: object, tree: FieldTree | None, path: str = "") -> list[str]:
    if isinstance(value, list):
        return [
            e for i, item in enumerate(value) for e in unknown_fields(item, tree, f"{path}/{i}")
        ]
    if not isinstance(value, dict) or tree is None:
        return []
    out = []
    for key, item in value.items():
        if key not in tree and "*" not in tree:
            out.append(f"{path}/{key}: a field the CRD does not have")
            continue
        out += unknown_fields(item, tree[key] if key in tree else tree["*"], f"{path}/{key}")
    return out


def monitoring_objects(docs: list[Obj]) -> list[Obj]:
    return [d for d in docs if d["apiVersion"].startswith("monitoring.coreos.com/")]


def test_the_schemas_refuse_what_prometheus_operator_refuses() -> None:
    """The check can fail: each of these breaks the CRD (a duration, a required field, an
    enum, a type, a field it does not have), and a kind without a schema is never passed."""
    monitor = {"apiVersion": "monitoring.coreos.com/v1", "kind": "PodMonitor"}
    endpoint = {"port": "http", "path": "/metrics", "interval": "15s"}
    good = {**monitor, "metadata": {"name": "m"}, "spec": {"selector": {}}}
    good["spec"]["podMetricsEndpoints"] = [endpoint]
    bad = [
        {**good, "spec": {"selector": {}, "podMetricsEndpoints": [{**endpoint, "interval": "1x"}]}},
        {**good, "spec": {"podMetricsEndpoints": [endpoint]}},
        {**good, "spec": {"selector": {}, "podMetricsEndpoints": [{**endpoint, "scheme": "ftp"}]}},
        {
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "PrometheusRule",
            "metadata": {"name": "r"},
            "spec": {"groups": [{"name": "g", "rules": [{"alert": "A", "for": "5m"}]}]},
        },
        {
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "ServiceMonitor",
            "metadata": {"name": "s"},
            "spec": {"selector": {}, "endpoints": [{"port": 9090}]},
        },
        {"apiVersion": "monitoring.coreos.com/v1", "kind": "Probe", "metadata": {"name": "p"}},
        # misspelt: the schema allows it (the API server would drop it), the field names do not
        {**good, "spec": {"selector": {}, "podMetricEndpoints": [endpoint]}},
        {**good, "spec": {"selector": {"matchLabel": {"a": "b"}}, "podMetricsEndpoints": []}},
    ]
    first, *rest = schema_errors([good, *bad])
    assert first == []
    for obj, errors in zip(bad, rest, strict=True):
        assert errors, f"accepted {obj}"
    assert "/spec/podMetricsEndpoints/0/interval" in rest[0][0]
    assert "selector" in rest[1][0]
    assert rest[-2] == ["/spec/podMetricEndpoints: a field the CRD does not have"]
    assert rest[-1] == ["/spec/selector/matchLabel: a field the CRD does not have"]


MONITORING_ON = [
    "-f",
    str(CHART / "ci" / "monitoring-values.yaml"),
]
SETUPS = {
    "monitoring-values": [],
    # every rule threshold and the scrape interval moved, no release, a dashboard elsewhere
    "other-settings": [
        "--set", "monitoring.prometheusRelease=",
        "--set", "monitoring.serviceMonitor.interval=1m",
        "--set", "monitoring.rules.metricsStaleSeconds=120",
        "--set", "monitoring.rules.rollbacksPerHour=5",
        "--set", "monitoring.rules.restartBudgetPerHour=1",
        "--set", "monitoring.rules.acceptanceLengthFloor=1.05",
        "--set", "monitoring.rules.realisedGainFraction=0.25",
        "--set", "monitoring.rules.alertLabels.severity=critical",
    ],
}  # fmt: skip


@pytest.mark.parametrize("setup", SETUPS, ids=str)
def test_chart_monitoring_objects_match_the_crds(tmp_path: Path, setup: str) -> None:
    args = [*MONITORING_ON, *SETUPS[setup]]
    out = helm(tmp_path, "template", "rel", str(CHART), "-n", "specpilot", *args)
    objects = monitoring_objects([d for d in yaml.safe_load_all(out) if d])
    assert sorted(o["kind"] for o in objects) == ["PrometheusRule", "ServiceMonitor"]
    for obj, errors in zip(objects, schema_errors(objects), strict=True):
        assert errors == [], f"{obj['kind']} {obj['metadata']['name']}: {errors}"


def test_operator_monitors_match_the_crds() -> None:
    specs = [
        decode_spec({"engine": "vllm", "model": "org/m"}),
        decode_spec({"engine": "sglang", "model": "org/m", "replicas": 2}),
    ]
    objects = [
        desired_monitor(
            name="chat", namespace="team", spec=spec, kind=kind, extra_labels={"release": "kps"}
        )
        for spec in specs
        for kind in ("PodMonitor", "ServiceMonitor")
    ]
    for obj, errors in zip(objects, schema_errors(objects), strict=True):
        assert errors == [], f"{obj['kind']}: {errors}"
