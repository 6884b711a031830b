"""Operator HA: two `specpilot operator` replicas with kopf peering, one active at a time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
from kube.apiserver import running_apiserver
from kube.chart import operator_rules
from kube.operator_process import running_operator, stop, wait_for

SPD_PATH = "/apis/specpilot.io/v1alpha1/namespaces/default/specdeployments"


def spd(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "specpilot.io/v1alpha1",
        "kind": "SpecDeployment",
        "metadata": {"name": name},
        "spec": {
            "engine": "vllm",
            "model": "m",
            "speculative": {"candidates": [{"method": "ngram", "maxK": 3}]},
        },
    }


def paused(log: str) -> bool:
    """kopf's log says this replica is paused now (it never resumed, or paused since)."""
    return log.rfind("Pausing operations in favour of") >= log.rfind("Resuming operations")


def test_two_replicas_one_active_and_the_standby_takes_over(tmp_path: Path) -> None:
    with (
        running_apiserver(tmp_path, operator_rules=operator_rules(tmp_path)) as api,
        httpx.Client(base_url=api.url, timeout=10) as http,
        running_operator(api, tmp_path / "high.log", "--priority", "200") as high,
        running_operator(api, tmp_path / "low.log", "--priority", "100") as low,
    ):
        peering = lambda: api.get("kopf.dev", "clusterkopfpeerings", "", "specpilot")  # noqa: E731
        wait_for(lambda: len((peering() or {}).get("status") or {}) == 2, 30)
        # Mandatory peering starts paused; only the highest priority resumes (a replica that
        # saw only itself for a moment at start may resume, then pauses when the other shows).
        wait_for(lambda: "Resuming operations" in high.text(), 30)
        wait_for(lambda: paused(low.text()), 30)
        assert http.post(SPD_PATH, json=spd("first")).status_code == 201
        wait_for(lambda: api.get("apps", "deployments", "default", "first"), 30)
        wait_for(lambda: "Handler 'reconcile_spec' succeeded" in high.text())
        assert "reconcile_spec" not in low.text()
        assert paused(low.text())

        stop(high.process)  # a graceful exit withdraws its keep-alive from the peering object
        wait_for(lambda: not paused(low.text()), 30)
        assert http.post(SPD_PATH, json=spd("second")).status_code == 201
        wait_for(lambda: api.get("apps", "deployments", "default", "second"), 30)
        wait_for(lambda: "Handler 'reconcile_spec' succeeded" in low.text())
        assert low.process.poll() is None
        assert api.denials() == []  # peering needs nothing the chart's ClusterRole lacks
