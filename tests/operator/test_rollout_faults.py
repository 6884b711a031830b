"""A switch under faults: an operator stop mid-rollout, and API errors while the rollout is
followed. `tune()` drives the operator's real `KubeActuator` over HTTP against the mock API
server (tests/kube, a MOCK), whose Deployment controller is played in the actuator's sleep
(tuning_helpers.Controller); faults are injected by the mock (tests/kube/faults.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from kube.apiserver import ApiServer, running_apiserver
from kube.chart import operator_rules
from kube.faults import fail_next
from tuning_helpers import Controller, busy, create, events, later, real_rollouts, running_config
from tuning_helpers import spd as spd_of

from specpilot.operator.api.spec import decode_spec
from specpilot.operator.kube.client import KubeRest
from specpilot.operator.kube.persisted_state import load_state
from specpilot.operator.kube.reconcile import reconcile
from specpilot.operator.kube.retry import RETRIES
from specpilot.operator.kube.tuning_daemon import Stopping, cost_for, settings_for, tune
from specpilot.operator.loop import ControlLoop
from specpilot.tuner import Observation, SpecConfig

INITIAL = SpecConfig(method="ngram", num_speculative_tokens=4)


@pytest.fixture
def api(tmp_path: Path) -> Iterator[ApiServer]:
    with running_apiserver(tmp_path, operator_rules=operator_rules(tmp_path)) as server:
        yield server
        assert server.denials() == [], "the chart's ClusterRole refused the operator"


@pytest.fixture
def rest(api: ApiServer) -> KubeRest:
    return KubeRest.from_config(str(api.operator_kubeconfig))


def stored(api: ApiServer, name: str) -> dict[str, object]:
    state: dict[str, object] = json.loads(spd_of(api, name)["status"]["tunerState"])
    return state


def test_a_stop_mid_rollout_leaves_the_switch_in_flight(api: ApiServer, rest: KubeRest) -> None:
    reconcile(rest, create(api, "stopped"))

    def stop(_: float) -> None:  # kopf's stop flag, as the daemon's sleep raises it
        raise Stopping("operator exit")

    with pytest.raises(Stopping):
        tune(rest, spd_of(api, "stopped"), now=later(), make_actuator=real_rollouts(busy(), stop))
    # The template was patched and stays patched: nothing rolled back, nothing backed off.
    target = running_config(api, "stopped")
    assert target != INITIAL
    status = spd_of(api, "stopped")["status"]
    assert status["phase"] == "Switching"
    assert stored(api, "stopped")["current"] == target.to_dict()
    assert stored(api, "stopped").get("failed", []) == []
    assert not {"TunerSwitchFailed", "RolloutFailed"} & events(api, "stopped").keys()


def test_the_loop_lets_a_stop_through_without_rolling_back(api: ApiServer) -> None:
    spec = decode_spec(create(api, "looped")["spec"])
    applied: list[SpecConfig] = []

    class Stops:
        def apply(self, config: SpecConfig) -> None:
            applied.append(config)
            raise Stopping("peering paused")

        def observe(self, window_s: float) -> Observation:
            return busy()

    now = later()
    state, _ = load_state({}, spec, now - 60)
    loop = ControlLoop(
        actuator=Stops(), settings=settings_for(spec), cost=cost_for(spec), state=state
    )
    with pytest.raises(Stopping):
        loop.tick(now)
    assert len(applied) == 1 and applied[0] != INITIAL  # no second apply: no rollback
    assert loop._failed == {} and loop.state.current == INITIAL  # nothing backed off


def test_one_503_while_following_a_rollout_is_waited_out(api: ApiServer, rest: KubeRest) -> None:
    reconcile(rest, create(api, "hiccup"))
    controller = Controller(api, "hiccup")
    faults = []

    def after_the_patch(sleeps: int) -> None:  # the first wait is the first poll of the rollout
        if sleeps == 1:
            faults.append(fail_next(api, "get", "apps", "v1", "deployments", status=503))

    controller.on_sleep = after_the_patch
    make = real_rollouts(busy(), controller.sleep)
    outcome = tune(rest, spd_of(api, "hiccup"), now=later(), make_actuator=make)
    assert [f.hits for f in faults] == [1]  # the fault did fire, mid-rollout
    assert outcome is not None and outcome.applied and outcome.action in ("switch", "off")
    target = running_config(api, "hiccup")
    assert target != INITIAL and stored(api, "hiccup")["current"] == target.to_dict()
    assert stored(api, "hiccup").get("failed", []) == []
    assert "TunerSwitchFailed" not in events(api, "hiccup")


def test_an_outage_past_the_retry_budget_is_a_failed_rollout(
    api: ApiServer, rest: KubeRest
) -> None:
    reconcile(rest, create(api, "outage"))
    controller = Controller(api, "outage")
    faults = []

    def after_the_patch(sleeps: int) -> None:
        if sleeps == 1:  # every attempt of one read fails: the first and each retry
            faults.append(fail_next(api, "get", "apps", "v1", "deployments", times=RETRIES + 1))

    controller.on_sleep = after_the_patch
    make = real_rollouts(busy(), controller.sleep)
    outcome = tune(rest, spd_of(api, "outage"), now=later(), make_actuator=make)
    assert [f.hits for f in faults] == [RETRIES + 1]
    assert outcome is not None and outcome.action == "error", outcome
    assert "HTTP 503" in outcome.reason
    assert running_config(api, "outage") == INITIAL  # rolled back once the API answered again
    (failed,) = stored(api, "outage")["failed"]  # type: ignore[misc]
    assert failed[0] != INITIAL.to_dict()
