"""A switch under faults: an operator stop mid-rollout, and API errors while the rollout is
followed. `tune()` drives the operator's real `KubeActuator` over HTTP against the mock API
server (tests/kube, a MOCK), whose Deployment controller is played in the actuator's sleep
(tuning_helpers.Controller); faults are injected by the mock (tests/kube/faults.py)."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import httpx
import pytest
from kube.apiserver import ApiServer
from kube.faults import Fault, fail_next
from tuning_helpers import (
    Controller,
    RealRollouts,
    busy,
    create,
    events,
    later,
    real_rollouts,
    running_config,
)
from tuning_helpers import spd as spd_of

from specpilot.operator import loop as loop_module
from specpilot.operator.api.names import CANARY_SLOT_ANNOTATION
from specpilot.operator.api.spec import config_to_status, decode_spec
from specpilot.operator.kube.client import KubeRest
from specpilot.operator.kube.persisted_state import load_state
from specpilot.operator.kube.reconcile import reconcile
from specpilot.operator.kube.retry import RETRIES
from specpilot.operator.kube.tuning_daemon import Stopping, cost_for, forget, settings_for, tune
from specpilot.operator.loop import ControlLoop
from specpilot.tuner import Observation, SpecConfig

INITIAL = SpecConfig(method="ngram", num_speculative_tokens=4)


def stored(api: ApiServer, name: str) -> dict[str, Any]:
    state: dict[str, Any] = json.loads(spd_of(api, name)["status"]["tunerState"])
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
    faults: list[Fault] = []

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
    assert spd_of(api, "hiccup")["status"]["phase"] == "Running"  # the switch is over
    assert "TunerSwitchFailed" not in events(api, "hiccup")


@pytest.mark.parametrize(
    ("method", "group", "version", "plural"),
    [
        ("patch", "specpilot.io", "v1alpha1", "specdeployments"),  # announcing the switch
        ("get", "apps", "v1", "deployments"),  # reading the Deployment before the patch
        ("patch", "apps", "v1", "deployments"),  # the template patch itself
        ("get", "", "v1", "pods"),  # listing the new pods while following
    ],
)
@pytest.mark.parametrize("status", [500, 503, 429])
def test_one_transient_error_at_any_step_of_a_switch_is_waited_out(
    api: ApiServer, rest: KubeRest, method: str, group: str, version: str, plural: str, status: int
) -> None:
    reconcile(rest, create(api, "step"))
    fault = fail_next(api, method, group, version, plural, status=status)
    make = real_rollouts(busy(), Controller(api, "step").sleep)
    no_wait = lambda _: None  # noqa: E731 - the tick's own waits (its status write's retry)
    outcome = tune(rest, spd_of(api, "step"), now=later(), make_actuator=make, sleep=no_wait)
    assert fault.hits == 1
    assert outcome is not None and outcome.applied, outcome
    assert running_config(api, "step") != INITIAL
    assert stored(api, "step").get("failed", []) == []


def test_an_outage_past_the_retry_budget_is_a_failed_rollout(
    api: ApiServer, rest: KubeRest
) -> None:
    reconcile(rest, create(api, "outage"))
    controller = Controller(api, "outage")
    faults: list[Fault] = []

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
    (failed,) = stored(api, "outage")["failed"]
    assert failed[0] != INITIAL.to_dict()


def killed_mid_rollout(api: ApiServer, rest: KubeRest, name: str, now: float) -> SpecConfig:
    """A tick whose operator dies once the template is patched (its first wait never returns);
    then a new operator, with none of the old one's memory."""
    reconcile(rest, create(api, name))

    def killed(_: float) -> None:
        raise Stopping("SIGKILL")

    with pytest.raises(Stopping):
        tune(rest, spd_of(api, name), now=now, make_actuator=real_rollouts(busy(), killed))
    forget("default", name)
    target = running_config(api, name)
    assert target != INITIAL
    return target


def test_a_switch_left_in_flight_counts_against_the_dwell_and_the_restart_budget(
    api: ApiServer, rest: KubeRest
) -> None:
    now = later()
    target = killed_mid_rollout(api, rest, "counted", now)
    state = stored(api, "counted")
    assert state["since_s"] == now and now in state["restarts"]
    assert state["rollout"] == {  # what a new operator needs to see it through
        "config": target.to_dict(), "previous": INITIAL.to_dict(),
        "rollingBack": False, "since": now,
    }  # fmt: skip


def test_a_rollout_left_in_flight_is_seen_through_by_the_next_operator(
    api: ApiServer, rest: KubeRest
) -> None:
    now = later()
    target = killed_mid_rollout(api, rest, "resumed", now)
    controller, made = Controller(api, "resumed"), list[RealRollouts]()
    make = real_rollouts(busy(), controller.sleep, made)
    outcome = tune(rest, spd_of(api, "resumed"), now=now + 5, make_actuator=make)
    assert outcome is not None and outcome.action == "switch" and "resumed" in outcome.reason
    assert controller.sleeps and made[0].observed == 0  # it followed; it measured nothing
    assert running_config(api, "resumed") == target
    state = stored(api, "resumed")
    assert "rollout" not in state and state["current"] == target.to_dict()
    assert state["since_s"] == now  # the switch's dwell runs from when it was made
    assert spd_of(api, "resumed")["status"]["phase"] == "Running"


def test_a_crash_looping_config_left_in_flight_is_rolled_back_by_the_next_operator(
    api: ApiServer, rest: KubeRest
) -> None:
    now = later()
    target = killed_mid_rollout(api, rest, "crashed", now)
    controller = Controller(api, "crashed", crash=target)
    make = real_rollouts(busy(), controller.sleep)
    outcome = tune(rest, spd_of(api, "crashed"), now=now + 5, make_actuator=make)
    assert outcome is not None and outcome.action == "error", outcome
    assert "CrashLoopBackOff" in outcome.reason and "out of memory" in outcome.reason
    assert running_config(api, "crashed") == INITIAL  # rolled back
    state = stored(api, "crashed")
    assert "rollout" not in state and state["current"] == INITIAL.to_dict()
    assert [c for c, _ in state["failed"]] == [target.to_dict()]
    assert events(api, "crashed")["TunerSwitchFailed"]["type"] == "Warning"
    assert spd_of(api, "crashed")["status"]["phase"] == "Running"


def test_a_kill_during_the_rollback_resumes_the_rollback(api: ApiServer, rest: KubeRest) -> None:
    now = later()
    target = killed_mid_rollout(api, rest, "twice", now)

    def dies_in_the_rollback(seconds: float) -> None:
        if running_config(api, "twice") == INITIAL:  # the rollback's patch is made
            raise Stopping("SIGKILL again")
        crashing.sleep(seconds)

    crashing = Controller(api, "twice", crash=target)
    with pytest.raises(Stopping):
        tune(rest, spd_of(api, "twice"), now=now + 5,
             make_actuator=real_rollouts(busy(), dies_in_the_rollback))  # fmt: skip
    forget("default", "twice")
    assert stored(api, "twice")["rollout"]["rollingBack"] is True
    assert spd_of(api, "twice")["status"]["phase"] == "RollingBack"
    make = real_rollouts(busy(), Controller(api, "twice").sleep)
    outcome = tune(rest, spd_of(api, "twice"), now=now + 10, make_actuator=make)
    assert outcome is not None and outcome.action == "rollback", outcome
    assert running_config(api, "twice") == INITIAL
    state = stored(api, "twice")
    assert "rollout" not in state
    assert [c for c, _ in state["failed"]] == [target.to_dict()]


def test_a_switch_to_no_speculation_leaves_no_stale_field_in_status(
    api: ApiServer, rest: KubeRest
) -> None:
    """status.currentConfig is the config that runs, whole: a merge patch of the new config
    over the old one kept n-gram's numSpeculativeTokens beside method none."""
    reconcile(rest, create(api, "plain"))
    make = real_rollouts(busy(), Controller(api, "plain").sleep)
    outcome = tune(rest, spd_of(api, "plain"), now=later(), make_actuator=make)
    assert outcome is not None and outcome.action == "off", outcome
    assert running_config(api, "plain") == SpecConfig()
    status = spd_of(api, "plain")["status"]
    assert status["currentConfig"] == config_to_status(SpecConfig()), status["currentConfig"]


def test_a_reconcile_before_the_next_tick_keeps_the_rollout_in_flight(
    api: ApiServer, rest: KubeRest
) -> None:
    """A restarted operator reconciles every object before its first tick (kopf's resume
    handler): that status write must keep the rollout in flight, or the tick after it never
    follows it (a crash-looping config would never be rolled back)."""
    now = later()
    target = killed_mid_rollout(api, rest, "reconciled", now)
    reconcile(rest, spd_of(api, "reconciled"))  # the new operator's resume handler
    assert stored(api, "reconciled")["rollout"]["config"] == target.to_dict()
    assert running_config(api, "reconciled") == target  # it renders the switch, not reverts it
    controller = Controller(api, "reconciled", crash=target)
    outcome = tune(rest, spd_of(api, "reconciled"), now=now + 5,
                   make_actuator=real_rollouts(busy(), controller.sleep))  # fmt: skip
    assert outcome is not None and outcome.action == "error", outcome
    assert running_config(api, "reconciled") == INITIAL  # rolled back
    assert [c for c, _ in stored(api, "reconciled")["failed"]] == [target.to_dict()]


TRIAL = SpecConfig(method="ngram", num_speculative_tokens=2)


def test_a_trial_left_in_flight_is_abandoned_not_promoted(
    api: ApiServer, rest: KubeRest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A trial runs on a canary in one main pod's place until it is judged. An operator killed
    meanwhile leaves it unjudged, the main Deployment one replica short: the next one neither
    renders it on the main pods (its reconcile) nor promotes it (its first tick); it deletes
    the canary and gives its slot back, nothing backed off."""
    create(api, "tried")
    # no spare GPU: a main pod stops before the canary starts (the controller here plays the
    # main Deployment only, so the canary never gets Ready: the kill comes while it starts)
    two = {"spec": {"replicas": 2, "tuning": {"maxSurge": 0, "maxUnavailable": 1}}}
    rest.patch("specpilot.io/v1alpha1", "specdeployments", "default", "tried", two)
    reconcile(rest, spd_of(api, "tried"))
    real_decide = loop_module.decide

    def a_trial(*args: Any, **kwargs: Any) -> Any:  # the tuner exploring, as it may
        decision, state = real_decide(*args, **kwargs)
        trial = replace(decision, action="switch", config=TRIAL, trial=True)
        return trial, replace(state, current=TRIAL)

    monkeypatch.setattr(loop_module, "decide", a_trial)
    controller = Controller(api, "tried")

    held_at_kill: list[int] = []

    def killed_comparing(seconds: float) -> None:  # once the canary holds a main pod's slot
        main = api.get("apps", "deployments", "default", "tried") or {}
        annotations = main["metadata"].get("annotations") or {}
        if CANARY_SLOT_ANNOTATION in annotations and controller.sleeps:
            held_at_kill.append(main["spec"]["replicas"])
            raise Stopping("SIGKILL")
        controller.sleep(seconds)

    make = real_rollouts(busy(), killed_comparing)
    with pytest.raises(Stopping):
        tune(rest, spd_of(api, "tried"), now=later(), make_actuator=make)
    assert held_at_kill == [1]  # the canary had taken the other replica's place
    monkeypatch.undo()
    forget("default", "tried")
    assert stored(api, "tried")["rollout"]["trial"] is True
    reconcile(rest, spd_of(api, "tried"))  # the new operator's resume handler
    assert running_config(api, "tried") == INITIAL  # not the unjudged trial
    make = real_rollouts(busy(), Controller(api, "tried").sleep)
    outcome = tune(rest, spd_of(api, "tried"), now=later() + 5, make_actuator=make)
    assert outcome is not None and "abandoned the trial" in outcome.reason, outcome
    assert running_config(api, "tried") == INITIAL
    assert api.get("apps", "deployments", "default", "tried-canary") is None
    main = api.get("apps", "deployments", "default", "tried")
    assert main["spec"]["replicas"] == 2
    assert CANARY_SLOT_ANNOTATION not in main["metadata"].get("annotations", {})
    state = stored(api, "tried")
    assert "rollout" not in state and state["current"] == INITIAL.to_dict()
    assert state.get("failed", []) == []
    assert spd_of(api, "tried")["status"]["currentConfig"] == config_to_status(INITIAL)


def test_a_spec_edited_mid_rollout_is_rendered_once_the_switch_is_through(
    api: ApiServer, rest: KubeRest
) -> None:
    """A user edits the spec while the tuner's rollout is followed: the switch completes (it
    is neither reverted nor backed off) and the next reconcile renders the edit with the
    tuner's config (the kopf handler waits for the tick: one lock per object)."""
    reconcile(rest, create(api, "edited"))
    controller = Controller(api, "edited")
    edit = {"spec": {"extraArgs": ["--max-model-len", "4096"]}}

    def user_edits(sleeps: int) -> None:
        if sleeps == 1:  # the template is patched, the rollout under way
            rest.patch("specpilot.io/v1alpha1", "specdeployments", "default", "edited", edit)

    controller.on_sleep = user_edits
    outcome = tune(rest, spd_of(api, "edited"), now=later(),
                   make_actuator=real_rollouts(busy(), controller.sleep))  # fmt: skip
    assert outcome is not None and outcome.applied and outcome.action in ("switch", "off")
    target = running_config(api, "edited")
    assert target != INITIAL and stored(api, "edited").get("failed", []) == []
    reconcile(rest, spd_of(api, "edited"))  # the edit's handler, after the tick
    template = api.get("apps", "deployments", "default", "edited")["spec"]["template"]
    assert "4096" in template["spec"]["containers"][0]["args"]
    assert running_config(api, "edited") == target  # the edit did not revert the switch
    status = spd_of(api, "edited")["status"]
    assert status["currentConfig"] == config_to_status(target)
    assert status["observedGeneration"] == spd_of(api, "edited")["metadata"]["generation"]


def test_a_spec_deployment_deleted_mid_rollout_leaves_nothing_behind(
    api: ApiServer, rest: KubeRest
) -> None:
    """Deleted while its rollout is followed: the mock collects the Deployment (owner
    references, as the garbage collector does); the rollout fails and the rollback that
    follows stops at its announcement, creating nothing again for an object that is gone."""
    reconcile(rest, create(api, "deleted"))
    controller = Controller(api, "deleted")

    def user_deletes(sleeps: int) -> None:
        if sleeps == 1:
            path = "/apis/specpilot.io/v1alpha1/namespaces/default/specdeployments/deleted"
            assert httpx.delete(api.url + path).status_code == 200  # the user, not the operator

    controller.on_sleep = user_deletes

    def sleep(seconds: float) -> None:
        if api.get("apps", "deployments", "default", "deleted") is not None:
            controller.sleep(seconds)  # the controller while there is something to roll

    with pytest.raises(Stopping):  # as kopf stops a deleted object's daemon
        tune(rest, spd_of(api, "deleted"), now=later(), make_actuator=real_rollouts(busy(), sleep))
    assert spd_of(api, "deleted") is None
    assert api.list("apps", "deployments", "default") == []
    assert api.list("", "configmaps", "default") == []
