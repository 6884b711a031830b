"""Builds the chart's Grafana dashboard with Grafana's SDK (grafana-foundation-sdk).

Contract: `python helm/dashboard/build_dashboard.py` writes helm/specpilot/dashboards/
specpilot.json; `--check` exits 1 when the committed file differs from what this script builds
(tests/operator/test_monitoring.py runs it). One dashboard, one SpecDeployment at a time
(variables `namespace` and `name`): the config it runs, acceptance length, batch, regime,
tokens/s, TTFT and TPOT p95, the tuner's decisions as annotations.

Metric names: the operator's own (`specpilot_*`, labelled by the SpecDeployment's namespace
and name, see operator/kube/exported_metrics.py) and the engines' (runtime/engine_metrics.py).
Engine series carry their pod's namespace and name; a SpecDeployment's main Deployment is named
after it, so its pods are `<name>-<template hash>-<suffix>` (canary pods, `<name>-canary-...`,
are left out: they run another config). Every query is vLLM's `or` SGLang's: only one exists.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from grafana_foundation_sdk.builders import (
    common,
    dashboard,
    prometheus,
    stat,
    statetimeline,
    timeseries,
)
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.common import (
    BigValueGraphMode,
    LegendDisplayMode,
    LegendPlacement,
    VisibilityMode,
)
from grafana_foundation_sdk.models.dashboard import (
    DashboardCursorSync,
    DataSourceRef,
    VariableRefresh,
    VariableSort,
)

OUTPUT = Path(__file__).resolve().parents[1] / "specpilot" / "dashboards" / "specpilot.json"
DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")

OPERATOR = 'namespace="$namespace", name="$name"'
"""The operator's series of the chosen SpecDeployment."""
ENGINE = 'namespace="$namespace", pod=~"$name-[a-z0-9]+-[a-z0-9]+"'
"""The chosen SpecDeployment's main engine pods."""
RATE = "$__rate_interval"


def engine_rate(vllm: str, sglang: str) -> str:
    return f"sum(rate({vllm}{{{ENGINE}}}[{RATE}])) or sum(rate({sglang}{{{ENGINE}}}[{RATE}]))"


def engine_p95(vllm: str, sglang: str) -> str:
    return " or ".join(
        f"histogram_quantile(0.95, sum by (le) (rate({name}_bucket{{{ENGINE}}}[{RATE}])))"
        for name in (vllm, sglang)
    )


ACCEPTANCE_LENGTH = (
    f"1 + sum(rate(vllm:spec_decode_num_accepted_tokens_total{{{ENGINE}}}[{RATE}]))"
    f" / sum(rate(vllm:spec_decode_num_drafts_total{{{ENGINE}}}[{RATE}]))"
    f" or avg(sglang:spec_accept_length{{{ENGINE}}} > 0)"
)
BATCH = f"avg(vllm:num_requests_running{{{ENGINE}}}) or avg(sglang:num_running_reqs{{{ENGINE}}})"
WAITING = f"sum(vllm:num_requests_waiting{{{ENGINE}}}) or sum(sglang:num_queue_reqs{{{ENGINE}}})"
DECISIONS = (
    f'sum by (action) (increase(specpilot_decisions_total{{{OPERATOR}, action!="stay"}}'
    f"[$__interval])) > 0"
)
"""Annotations: every tick that did something other than stay."""
DECISIONS_BY_ACTION = (
    f"sum by (action) (increase(specpilot_decisions_total{{{OPERATOR}}}[$__interval]))"
)


def query(expr: str, legend: str, ref: str = "A") -> prometheus.Dataquery:
    return prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(ref)


def series(title: str, unit: str, *queries: prometheus.Dataquery) -> timeseries.Panel:
    legend = (
        common.VizLegendOptions()
        .display_mode(LegendDisplayMode.LIST)
        .placement(LegendPlacement.BOTTOM)
        .show_legend(True)
    )
    panel = (
        timeseries.Panel()
        .title(title)
        .unit(unit)
        .datasource(DATASOURCE)
        .height(8)
        .span(12)
        .legend(legend)
    )
    for q in queries:
        panel = panel.with_target(q)
    return panel


def variable(name: str, label: str, values: str) -> dashboard.QueryVariable:
    return (
        dashboard.QueryVariable(name)
        .label(label)
        .datasource(DATASOURCE)
        .query(f"label_values({values})")
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(VariableSort.ALPHABETICAL_ASC)
    )


def build() -> dashboard.Dashboard:
    return (
        dashboard.Dashboard("SpecPilot")
        .uid("specpilot")
        .description("One SpecDeployment: the speculative config the tuner runs and why.")
        .tags(["specpilot", "llm", "speculative-decoding"])
        .tooltip(DashboardCursorSync.CROSSHAIR)
        .time("now-6h", "now")
        .refresh("1m")
        .with_variable(
            dashboard.DatasourceVariable("datasource").label("Data source").type("prometheus")
        )
        .with_variable(
            variable("namespace", "Namespace", "specpilot_current_config_info, namespace")
        )
        .with_variable(
            variable(
                "name",
                "SpecDeployment",
                'specpilot_current_config_info{namespace="$namespace"}, name',
            )
        )
        .annotation(
            dashboard.AnnotationQuery()
            .name("Decisions")
            .datasource(DATASOURCE)
            .enable(True)
            .icon_color("orange")
            .expr(DECISIONS)
        )
        .with_row(dashboard.Row("What runs"))
        .with_panel(
            statetimeline.Panel()
            .title("Speculative config")
            .description("The config the tuner runs (method and K).")
            .datasource(DATASOURCE)
            .height(6)
            .span(12)
            .show_value(VisibilityMode.NEVER)
            .merge_values(True)
            .with_target(query(f"specpilot_current_config_info{{{OPERATOR}}}", "{{description}}"))
        )
        .with_panel(
            statetimeline.Panel()
            .title("Regime")
            .description("memory-bound: speculation pays; compute-bound: it costs.")
            .datasource(DATASOURCE)
            .height(6)
            .span(12)
            .show_value(VisibilityMode.NEVER)
            .merge_values(True)
            .with_target(query(f"specpilot_regime{{{OPERATOR}}} == 1", "{{regime}}"))
        )
        .with_row(dashboard.Row("What the engines measure"))
        .with_panel(
            series(
                "Acceptance length",
                "short",
                query(ACCEPTANCE_LENGTH, "tokens per verify step (bonus included)"),
            )
        )
        .with_panel(
            series(
                "Batch",
                "short",
                query(BATCH, "running per pod"),
                query(WAITING, "waiting", "B"),
            )
        )
        .with_panel(
            series(
                "Generation throughput",
                "tokens/s",
                query(
                    engine_rate("vllm:generation_tokens_total", "sglang:generation_tokens_total"),
                    "tokens/s",
                ),
            )
        )
        .with_panel(
            series(
                "Latency p95",
                "s",
                query(
                    engine_p95(
                        "vllm:time_to_first_token_seconds", "sglang:time_to_first_token_seconds"
                    ),
                    "TTFT p95",
                ),
                query(
                    engine_p95(
                        "vllm:request_time_per_output_token_seconds",
                        "sglang:request_time_per_output_token_seconds",
                    ),
                    "TPOT p95",
                    "B",
                ),
            )
        )
        .with_row(dashboard.Row("What the tuner decided"))
        .with_panel(
            series(
                "Decisions",
                "short",
                query(DECISIONS_BY_ACTION, "{{action}}"),
            )
        )
        .with_panel(
            stat.Panel()
            .title("Last switch: predicted vs realised gain")
            .unit("percentunit")
            .graph_mode(BigValueGraphMode.NONE)
            .datasource(DATASOURCE)
            .height(8)
            .span(12)
            .with_target(query(f"specpilot_predicted_gain_ratio{{{OPERATOR}}}", "predicted"))
            .with_target(query(f"specpilot_realized_gain_ratio{{{OPERATOR}}}", "realised", "B"))
        )
        .with_panel(
            series(
                "Seconds since the last observation with data",
                "s",
                query(f"specpilot_observation_age_seconds{{{OPERATOR}}}", "age"),
            )
        )
    )


def render() -> str:
    return json.dumps(build().build(), cls=JSONEncoder, indent=2, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check", action="store_true", help="exit 1 if the committed dashboard is stale"
    )
    ns = parser.parse_args(argv)
    text = render()
    if ns.check:
        if OUTPUT.read_text(encoding="utf-8") != text:
            print(f"{OUTPUT} is stale: run python {Path(__file__).name}", file=sys.stderr)
            return 1
        return 0
    OUTPUT.parent.mkdir(parents=True, exist_ok=True)
    OUTPUT.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
