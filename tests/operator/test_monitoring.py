"""Monitoring as kube-prometheus-stack users run it, with the real helm and promtool: the
chart's alerts pass `promtool check rules` and fire (and stay quiet) on series `promtool test
rules` feeds them; every metric name in the alerts and the dashboard is one the code exports
(the operator's registry) or the runtime reads from the engines; the dashboard is what its
generator builds; the labels kube-prometheus-stack selects on reach every monitoring object,
the engine PodMonitors included (through the operator's environment)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from kube.chart import CHART, REPO, find, helm

from specpilot.operator.api.spec import decode_spec
from specpilot.operator.kube import exported_metrics
from specpilot.operator.kube.children import desired_monitor
from specpilot.operator.kube.monitor_labels import monitor_labels
from specpilot.operator.kube.status import EVENT_REASONS
from specpilot.runtime.engine_metrics import ENGINE_METRICS, VLLM_PER_POSITION
from specpilot.tuner import SpecConfig

PROMTOOL = REPO / ".tools" / "prometheus" / "usr" / "bin" / "promtool"
GENERATOR = REPO / "helm" / "dashboard" / "build_dashboard.py"
DASHBOARD = CHART / "dashboards" / "specpilot.json"
MONITORING_VALUES = CHART / "ci" / "monitoring-values.yaml"

Obj = dict[str, Any]

# Every PromQL function and aggregation operator (Prometheus 2.x): a name called like a
# function must be one of these, so a misspelt function fails too.
PROMQL_FUNCTIONS = frozenset(
    """abs absent absent_over_time avg avg_over_time bottomk ceil changes clamp clamp_max
    clamp_min count count_over_time count_values day_of_month day_of_week day_of_year
    days_in_month delta deriv exp floor group histogram_quantile holt_winters hour idelta
    increase irate label_join label_replace last_over_time ln log10 log2 max max_over_time
    min min_over_time minute month predict_linear present_over_time quantile
    quantile_over_time rate resets round scalar sgn sort sort_desc sqrt stddev
    stddev_over_time stdvar stdvar_over_time sum sum_over_time time timestamp topk vector
    year""".split()
)
PROMQL_KEYWORDS = frozenset(
    "and or unless bool offset by without on ignoring group_left group_right inf nan".split()
)


def operator_metric_names() -> set[str]:
    """The sample names the operator's registry serves, after one tick of a stand-in object."""
    key = ("monitoring-test", "names")
    exported_metrics.record_config(*key, SpecConfig(method="ngram", num_speculative_tokens=3))
    exported_metrics.record_tick(
        *key,
        action="switch",
        regime="memory-bound",
        tokens_per_s=10.0,
        switched=True,
        predicted_gain=0.1,
    )
    exported_metrics.record_tick(
        *key, action="stay", regime="memory-bound", tokens_per_s=11.0, switched=False,
        predicted_gain=0.0,
    )  # fmt: skip
    try:
        return {s.name for f in exported_metrics.REGISTRY.collect() for s in f.samples}
    finally:
        exported_metrics.forget(*key)


def engine_metric_names() -> set[str]:
    """What the runtime reads from vLLM and SGLang (checked against the real engines by the
    contract tests); histograms as their three series."""
    names = {VLLM_PER_POSITION}
    for specs in ENGINE_METRICS.values():
        for spec in specs:
            if spec.kind == "histogram":
                names |= {spec.name + suffix for suffix in ("_bucket", "_sum", "_count")}
            else:
                names.add(spec.name)
    return names


def metric_names(expr: str) -> set[str]:
    """The metric names an expression reads. Strings, label matchers, ranges and grouping
    lists are cut first; whatever is called must be a PromQL function."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'', '""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = set()
    for match in re.finditer(r"(?<![\w.$:])[a-zA-Z_:][\w:]*", text):
        word = match.group()
        called = text[match.end() :].lstrip().startswith("(")
        if called:
            assert word in PROMQL_FUNCTIONS, f"{word}() is no PromQL function in: {expr}"
        elif word.lower() not in PROMQL_KEYWORDS:
            names.add(word)
    return names


def test_metric_names_finds_what_an_expression_reads() -> None:
    expr = (
        'sum by (le) (rate(vllm:x_bucket{pod=~"a-[a-z]+"}[$__rate_interval])) / 2'
        " or on (job) max_over_time((sglang:y > 0)[5m:]) offset 1h and z_total > 1e3"
    )
    assert metric_names(expr) == {"vllm:x_bucket", "sglang:y", "z_total"}
    with pytest.raises(AssertionError, match="rat"):
        metric_names("rat(x[5m])")


def render(workdir: Path, *args: str) -> list[Obj]:
    out = helm(workdir, "template", "rel", str(CHART), "-n", "specpilot", *args)
    return [doc for doc in yaml.safe_load_all(out) if doc]


@pytest.fixture(scope="module")
def monitoring_docs(tmp_path_factory: pytest.TempPathFactory) -> list[Obj]:
    return render(tmp_path_factory.mktemp("helm"), "-f", str(MONITORING_VALUES))


@pytest.fixture(scope="module")
def rules_file(monitoring_docs: list[Obj], tmp_path_factory: pytest.TempPathFactory) -> Path:
    rule = find(monitoring_docs, "PrometheusRule")
    path = tmp_path_factory.mktemp("rules") / "rules.yaml"
    path.write_text(yaml.safe_dump(rule["spec"]), encoding="utf-8")
    return path


def rule_exprs(monitoring_docs: list[Obj]) -> list[str]:
    groups = find(monitoring_docs, "PrometheusRule")["spec"]["groups"]
    return [rule["expr"] for group in groups for rule in group["rules"]]


def dashboard_exprs(board: Obj) -> list[str]:
    exprs = [a["expr"] for a in board["annotations"]["list"] if "expr" in a]
    exprs += [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    for variable in board["templating"]["list"]:
        found = re.fullmatch(r"label_values\((.+), *\w+\)", variable["query"])
        if found:
            exprs.append(found.group(1))
    return exprs


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL.exists(), f"{PROMTOOL} is missing: `make` fetches it (.tools/prometheus)"
    return subprocess.run(
        [str(PROMTOOL), *args], capture_output=True, text=True, timeout=60, check=False
    )


def test_dashboard_is_what_the_generator_builds() -> None:
    done = subprocess.run(
        [sys.executable, str(GENERATOR), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def test_every_metric_in_rules_and_dashboard_is_exported(monitoring_docs: list[Obj]) -> None:
    known = operator_metric_names() | engine_metric_names()
    board = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    exprs = rule_exprs(monitoring_docs) + dashboard_exprs(board)
    assert len(exprs) >= 15
    used: set[str] = set()
    for expr in exprs:
        names = metric_names(expr)
        assert names, expr
        assert names <= known, f"{sorted(names - known)} exported by nothing, in: {expr}"
        used |= names
    # the dashboard covers both engines and the operator
    assert any(n.startswith("vllm:") for n in used) and any(n.startswith("sglang:") for n in used)
    assert "specpilot_current_config_info" in used and "specpilot_regime" in used


def test_label_values_in_queries_are_ones_the_operator_writes(monitoring_docs: list[Obj]) -> None:
    board = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    for expr in rule_exprs(monitoring_docs) + dashboard_exprs(board):
        for matcher in re.findall(r'action[!=]~?"([^"]+)"', expr):
            assert set(matcher.split("|")) <= set(EVENT_REASONS), expr
    assert "memory-bound" in exported_metrics.REGIMES


def test_promtool_accepts_the_rules(rules_file: Path) -> None:
    done = promtool("check", "rules", str(rules_file))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 5 rules found" in done.stdout


ALERT_LABELS = {"severity": "warning", "team": "inference"}
SPD = {"namespace": "llm", "name": "llama"}
JOB = {"namespace": "llm", "job": "llm/llama"}


def series(name: str, labels: dict[str, str], values: str) -> dict[str, str]:
    matchers = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return {"series": f"{name}{{{matchers}}}", "values": values}


def alert(name: str, at: str, labels: dict[str, str] | None, summary: str = "") -> dict[str, Any]:
    """An alert check; the description is the rule's own (filled in by the test)."""
    expected = (
        []
        if labels is None
        else [{"exp_labels": {**labels, **ALERT_LABELS}, "exp_annotations": {"summary": summary}}]
    )
    return {"eval_time": at, "alertname": name, "exp_alerts": expected}


def with_descriptions(checks: list[dict[str, Any]], rules_file: Path) -> list[dict[str, Any]]:
    rules = yaml.safe_load(rules_file.read_text(encoding="utf-8"))["groups"][0]["rules"]
    described = {r["alert"]: r["annotations"]["description"] for r in rules}
    for check in checks:
        for expected in check["exp_alerts"]:
            expected["exp_annotations"]["description"] = described[check["alertname"]]
    return checks


# Each case: input series and when the alert must (labels) or must not (None) be firing.
ALERT_CASES: dict[str, tuple[list[dict[str, str]], list[dict[str, Any]]]] = {
    "stale": (
        [series("specpilot_observation_age_seconds", SPD, "0+60x30")],
        [
            alert("SpecPilotMetricsStale", "10m", None),
            alert(
                "SpecPilotMetricsStale",
                "20m",
                SPD,
                "SpecDeployment llm/llama has read no engine metrics for 20m 0s",
            ),
        ],
    ),
    "rollbacks": (
        [
            series("specpilot_decisions_total", {**SPD, "action": "rollback"}, "0 0 1 1 2 2 3x10"),
            series(
                "specpilot_decisions_total", {**SPD, "name": "ok", "action": "rollback"}, "0x16"
            ),
        ],
        [
            alert(
                "SpecPilotRepeatedRollbacks",
                "15m",
                SPD,
                "SpecDeployment llm/llama rolled back 3 switches in the last hour",
            )
        ],
    ),
    "restart budget": (
        [
            series("specpilot_decisions_total", {**SPD, "action": "switch"}, "0 1 2 3 3x10"),
            series("specpilot_decisions_total", {**SPD, "action": "off"}, "0 0 0 0 1 2x10"),
            series("specpilot_decisions_total", {**SPD, "action": "stay"}, "0+5x15"),
        ],
        [
            alert("SpecPilotRestartBudgetExhausted", "2m", None),
            alert(
                "SpecPilotRestartBudgetExhausted",
                "15m",
                SPD,
                "SpecDeployment llm/llama restarted its engines 5 times in the last hour",
            ),
        ],
    ),
    "vllm acceptance": (
        [
            series("vllm:spec_decode_num_accepted_tokens_total", JOB, "0+10x60"),
            series("vllm:spec_decode_num_drafts_total", JOB, "0+100x60"),
            series("vllm:spec_decode_num_accepted_tokens_total", {**JOB, "job": "ok"}, "0+200x60"),
            series("vllm:spec_decode_num_drafts_total", {**JOB, "job": "ok"}, "0+100x60"),
        ],
        [
            alert("SpecPilotAcceptanceLengthCollapsed", "10m", None),
            alert(
                "SpecPilotAcceptanceLengthCollapsed",
                "45m",
                JOB,
                "Engines of llm/llama accept 1.10 tokens per verify step",
            ),
        ],
    ),
    "sglang acceptance": (
        [
            series("sglang:spec_accept_length", JOB, "0x5 1.05x55"),
            # 0 is SGLang's "not measured yet", never a collapse
            series("sglang:spec_accept_length", {**JOB, "job": "idle"}, "0x60"),
        ],
        [
            alert(
                "SpecPilotAcceptanceLengthCollapsed",
                "45m",
                JOB,
                "Engines of llm/llama accept 1.05 tokens per verify step",
            )
        ],
    ),
    "gain": (
        [
            series("specpilot_predicted_gain_ratio", SPD, "0.2x30"),
            series("specpilot_realized_gain_ratio", SPD, "0.02x30"),
            series("specpilot_predicted_gain_ratio", {**SPD, "name": "ok"}, "0.2x30"),
            series("specpilot_realized_gain_ratio", {**SPD, "name": "ok"}, "0.18x30"),
        ],
        [
            alert("SpecPilotPredictedGainNotRealised", "5m", None),
            alert(
                "SpecPilotPredictedGainNotRealised",
                "20m",
                SPD,
                "SpecDeployment llm/llama realised 2% after a switch",
            ),
        ],
    ),
}


@pytest.mark.parametrize("case", ALERT_CASES)
def test_alerts_fire_when_they_should(rules_file: Path, case: str, tmp_path: Path) -> None:
    inputs, checks = ALERT_CASES[case]
    spec = {
        "rule_files": [str(rules_file)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": inputs,
                "alert_rule_test": with_descriptions(checks, rules_file),
            }
        ],
    }
    test_file = tmp_path / "test.yaml"
    test_file.write_text(yaml.safe_dump(spec), encoding="utf-8")
    done = promtool("test", "rules", str(test_file))
    assert done.returncode == 0, done.stdout + done.stderr


def test_release_label_reaches_every_monitoring_object(monitoring_docs: list[Obj]) -> None:
    wanted = {"release": "kube-prometheus-stack", "team": "inference"}
    for kind in ("ServiceMonitor", "PrometheusRule", "ConfigMap"):
        labels = find(monitoring_docs, kind)["metadata"]["labels"]
        assert labels.items() >= wanted.items(), kind
    # the engine PodMonitors are the operator's: it reads the labels from its environment,
    # here the environment the chart gives it
    pod = find(monitoring_docs, "Deployment")["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    labels = monitor_labels({name: value for name, value in env.items() if value is not None})
    assert labels == wanted
    spec = decode_spec({"engine": "vllm", "model": "org/m"})
    monitor = desired_monitor(
        name="llama", namespace="llm", spec=spec, kind="PodMonitor", extra_labels=labels
    )
    assert monitor["metadata"]["labels"].items() >= wanted.items()
    # SpecPilot's own labels are kept beside them
    assert monitor["metadata"]["labels"]["app.kubernetes.io/instance"] == "llama"


def test_monitoring_objects_are_off_by_default(tmp_path: Path) -> None:
    docs = render(tmp_path)
    kinds = {d["kind"] for d in docs}
    assert not kinds & {"ServiceMonitor", "PrometheusRule", "ConfigMap"}
    pod = find(docs, "Deployment")["spec"]["template"]["spec"]
    assert "SPECPILOT_MONITOR_LABELS" not in {e["name"] for e in pod["containers"][0]["env"]}


def test_operator_service_monitor_keeps_the_spd_labels(monitoring_docs: list[Obj]) -> None:
    monitor = find(monitoring_docs, "ServiceMonitor")
    service = find(monitoring_docs, "Service")
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == service["spec"]["ports"][0]["name"]
    # without it Prometheus renames the metrics' namespace label to exported_namespace
    assert endpoint["honorLabels"] is True


def test_dashboard_config_map_carries_the_sidecar_label(monitoring_docs: list[Obj]) -> None:
    config_map = find(monitoring_docs, "ConfigMap")
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config_map["metadata"]["namespace"] == "monitoring"
    board = json.loads(config_map["data"]["specpilot.json"])
    assert board == json.loads(DASHBOARD.read_text(encoding="utf-8"))
    titles = {p["title"] for p in board["panels"]}
    for wanted in ("Speculative config", "Acceptance length", "Batch", "Regime", "Latency p95"):
        assert wanted in titles
    assert board["annotations"]["list"][0]["name"] == "Decisions"
