"""The mock API server and the operator's client, for the operator tests that tick `tune`.

`api` is KMock with the realism layer (tests/kube/), holding the operator's account to the
Helm chart's ClusterRole; a denial fails the test. `rest` is the operator's client on that
account. A test module that needs another server (a shared one, other rules) defines its own.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kube.apiserver import ApiServer, running_apiserver
from kube.chart import operator_rules

from specpilot.operator.kube.client import KubeRest


@pytest.fixture
def api(tmp_path: Path) -> Iterator[ApiServer]:
    with running_apiserver(tmp_path, operator_rules=operator_rules(tmp_path)) as server:
        yield server
        assert server.denials() == [], "the chart's ClusterRole refused the operator"


@pytest.fixture
def rest(api: ApiServer) -> KubeRest:
    """The operator's client, on its own account (RBAC: the chart's ClusterRole)."""
    return KubeRest.from_config(str(api.operator_kubeconfig))
