"""reconcile() and tune() as plain functions against the mock API server, with a fake actuator.

No kopf here: these are the functions the kopf handlers call, driven directly, so each tuning
mode and the rollback path are checked in a second each.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from kube.apiserver import REPO, ApiServer, default_crds, running_apiserver
from kube.chart import operator_rules
from tuning_helpers import busy, create, events, later, spd

from specpilot.operator.api.errors import SpecError
from specpilot.operator.api.spec import SpecDeploymentSpec, decode_spec
from specpilot.operator.kube.actuator import KubeActuator
from specpilot.operator.kube.client import KubeRest
from specpilot.operator.kube.reconcile import reconcile
from specpilot.operator.kube.tuning_daemon import kube_actuator, settings_for, tune
from specpilot.tuner import DEFAULT_MAX_BATCH, Observation, SpecConfig, TunerSettings


class FakeActuator:
    def __init__(self, observation: Observation, refuse: SpecConfig | None = None) -> None:
        self.observation, self.refuse = observation, refuse
        self.applied: list[SpecConfig] = []

    def apply(self, config: SpecConfig) -> None:
        self.applied.append(config)
        if config == self.refuse:
            raise RuntimeError("pods crash-looped")

    def observe(self, window_s: float) -> Observation:
        return self.observation


def factory(actuator: FakeActuator) -> Callable[..., FakeActuator]:
    def make(rest: KubeRest, body: Any, spec: SpecDeploymentSpec, sleep: Any) -> FakeActuator:
        return actuator

    return make


def test_reconcile_is_idempotent(api: ApiServer, rest: KubeRest) -> None:
    body = create(api, "idem", "auto")
    reconcile(rest, body)
    versions = {
        o["metadata"]["name"] + o["kind"]: o["metadata"]["resourceVersion"]
        for o in api.list("apps", "deployments") + api.list("", "services") + [spd(api, "idem")]
    }
    reconcile(rest, spd(api, "idem"))
    again = {
        o["metadata"]["name"] + o["kind"]: o["metadata"]["resourceVersion"]
        for o in api.list("apps", "deployments") + api.list("", "services") + [spd(api, "idem")]
    }
    assert again == versions  # nothing written the second time, not even status


def test_auto_switches_persists_and_reconcile_agrees(api: ApiServer, rest: KubeRest) -> None:
    body = create(api, "auto", "auto")
    reconcile(rest, body)
    actuator = FakeActuator(busy())
    now = later()
    outcome = tune(rest, spd(api, "auto"), now=now, make_actuator=factory(actuator))
    assert outcome is not None and outcome.applied
    assert outcome.action in ("switch", "off")
    (applied,) = actuator.applied
    status = spd(api, "auto")["status"]
    assert status["lastDecision"]["action"] == outcome.action
    assert status["currentConfig"]["description"] == applied.describe()
    assert json.loads(status["tunerState"])["current"] == applied.to_dict()
    assert status["regime"] in ("transition", "compute-bound")
    assert status["observed"]["batch"] == 256.0
    assert any(r in events(api, "auto") for r in ("TunerSwitched", "TunerSpeculationOff"))
    # The next reconcile renders the config the tuner chose: the template already says so.
    reconcile(rest, spd(api, "auto"))
    template = api.get("apps", "deployments", "default", "auto")["spec"]["template"]
    assert json.loads(template["metadata"]["annotations"]["specpilot.io/config"]) == (
        applied.to_dict()
    )
    # Not due again before spec.tuning.intervalSeconds.
    assert tune(rest, spd(api, "auto"), now=now + 1, make_actuator=factory(actuator)) is None


class WindowsActuator(FakeActuator):
    """Also records the window each observation was asked for."""

    def __init__(self, observation: Observation) -> None:
        super().__init__(observation)
        self.windows: list[float] = []

    def observe(self, window_s: float) -> Observation:
        self.windows.append(window_s)
        return replace(self.observation, window_s=window_s)


def test_a_fresh_deployment_short_of_its_load_is_left_at_the_first_probe(
    api: ApiServer, rest: KubeRest
) -> None:
    """With a 90 s interval (a 72 s window) the daemon's first tick looks after a third of the
    window: requests wait and the tuner leaves the initial config for capacity then. Without
    the queue it reads the whole window, in two parts."""
    for name, waiting, windows in (("queued", 40.0, [24.0]), ("calm", 0.0, [24.0, 48.0])):
        reconcile(rest, create(api, name, "auto", intervalSeconds=90))
        actuator = WindowsActuator(replace(busy(), waiting_requests=waiting))
        outcome = tune(rest, spd(api, name), now=later(), make_actuator=factory(actuator))
        assert outcome is not None
        assert actuator.windows == pytest.approx(windows), name
        if waiting:
            assert outcome.applied and outcome.action in ("switch", "off"), outcome.reason
            assert "capacity short of the load ahead" in outcome.reason


def test_recommend_only_writes_a_recommendation(api: ApiServer, rest: KubeRest) -> None:
    body = create(api, "reco", "recommend")
    reconcile(rest, body)
    actuator = FakeActuator(busy())
    outcome = tune(rest, spd(api, "reco"), now=later(), make_actuator=factory(actuator))
    assert outcome is not None and outcome.action == "recommend"
    assert actuator.applied == []
    status = spd(api, "reco")["status"]
    assert status["currentConfig"]["numSpeculativeTokens"] == 4  # still what it was
    assert status["recommendation"]["config"]["description"] != "ngram K=4"
    assert status["recommendation"]["predictedGain"] > 0
    assert "TunerRecommends" in events(api, "reco")


def test_off_pins_the_config(api: ApiServer, rest: KubeRest) -> None:
    reconcile(rest, create(api, "pinned", "off"))
    actuator = FakeActuator(busy())
    assert tune(rest, spd(api, "pinned"), now=later(), make_actuator=factory(actuator)) is None
    assert actuator.applied == []


def test_a_config_that_fails_is_rolled_back_and_backed_off(api: ApiServer, rest: KubeRest) -> None:
    reconcile(rest, create(api, "crashy", "auto"))
    probe = FakeActuator(busy())
    first = tune(rest, spd(api, "crashy"), now=later(), make_actuator=factory(probe))
    assert first is not None
    target = probe.applied[0]
    # Same situation on another object, but the chosen config crashes.
    reconcile(rest, create(api, "crashy2", "auto"))
    actuator = FakeActuator(busy(), refuse=target)
    outcome = tune(rest, spd(api, "crashy2"), now=later(), make_actuator=factory(actuator))
    assert outcome is not None and outcome.action == "error"
    assert actuator.applied[0] == target and actuator.applied[-1].max_k == 4  # rolled back
    status = spd(api, "crashy2")["status"]
    assert status["currentConfig"]["numSpeculativeTokens"] == 4
    assert "pods crash-looped" in status["lastDecision"]["reason"]
    assert json.loads(status["tunerState"])["failed"][0][0] == target.to_dict()
    assert events(api, "crashy2")["TunerSwitchFailed"]["type"] == "Warning"


def test_the_objective_decides_whether_the_slo_counts() -> None:
    def tuning(objective: str) -> TunerSettings:
        body = {
            "engine": "vllm",
            "model": "m",
            "speculative": {"candidates": [{"method": "ngram", "maxK": 4}]},
            "tuning": {"objective": objective, "slo": {"tpotP95Ms": 40, "ttftP95Ms": 800}},
        }
        return settings_for(decode_spec(body))

    goodput, throughput = tuning("goodput"), tuning("throughput")
    assert (goodput.slo_tpot_p95_s, goodput.slo_ttft_p95_s) == (0.04, 0.8)
    assert (throughput.slo_tpot_p95_s, throughput.slo_ttft_p95_s) == (None, None)


def test_the_tuner_is_told_how_many_replicas_serve_while_a_rollout_runs() -> None:
    def share(replicas: int | None, rollout: dict[str, int]) -> float:
        body: dict[str, object] = {"engine": "vllm", "model": "m", "tuning": rollout}
        if replicas is not None:
            body["replicas"] = replicas
        return settings_for(decode_spec(body)).rollout_share

    assert share(4, {}) == 1.0  # the default surge: new pods start beside the old
    assert share(4, {"maxSurge": 0, "maxUnavailable": 1}) == 0.75
    assert share(4, {"maxSurge": 0, "maxUnavailable": 2}) == 0.5
    assert share(1, {"maxSurge": 0, "maxUnavailable": 1}) == 0.0
    assert share(None, {"maxSurge": 0, "maxUnavailable": 1}) == 1.0  # an autoscaler's count


def test_trials_are_made_only_when_the_spec_asks_to_explore() -> None:
    def exploration(tuning: dict[str, object]) -> float:
        body = {"engine": "vllm", "model": "m", "replicas": 4, "tuning": tuning}
        return settings_for(decode_spec(body)).exploration

    assert exploration({}) == 0.0  # the ablations: trials paid for themselves in no world
    assert exploration({"explore": True}) == 1.0
    with pytest.raises(SpecError) as info:
        decode_spec({"engine": "vllm", "model": "m", "tuning": {"explore": "sometimes"}})
    assert "explore" in str(info.value)


def test_the_tuner_is_told_the_engines_batch_cap_from_extra_args() -> None:
    def cap(engine: str, extra_args: list[str]) -> int:
        body = {"engine": engine, "model": "m", "extraArgs": extra_args}
        return settings_for(decode_spec(body)).max_batch

    assert cap("vllm", ["--max-model-len", "4096", "--max-num-seqs", "32"]) == 32
    assert cap("sglang", ["--max-running-requests=16"]) == 16
    assert cap("vllm", []) == DEFAULT_MAX_BATCH
    with pytest.raises(SpecError) as info:
        decode_spec({"engine": "vllm", "model": "m", "extraArgs": ["--max-num-seqs", "lots"]})
    assert info.value.field == "spec.extraArgs" and "--max-num-seqs" in str(info.value)


def test_off_and_recommend_run_the_initial_config_the_spec_names_now(
    api: ApiServer, rest: KubeRest
) -> None:
    reconcile(rest, create(api, "edited", "auto"))
    actuator = FakeActuator(busy())
    assert tune(rest, spd(api, "edited"), now=later(), make_actuator=factory(actuator))
    (chosen,) = actuator.applied
    assert chosen.max_k != 2
    for mode in ("recommend", "off"):
        patch = {"spec": {"tuning": {"mode": mode}, "speculative": {"initial": {"k": 2}}}}
        rest.patch("specpilot.io/v1alpha1", "specdeployments", "default", "edited", patch)
        reconcile(rest, spd(api, "edited"))
        template = api.get("apps", "deployments", "default", "edited")["spec"]["template"]
        running = json.loads(template["metadata"]["annotations"]["specpilot.io/config"])
        assert (running["method"], running["num_speculative_tokens"]) == ("ngram", 2), mode
        assert json.loads(spd(api, "edited")["status"]["tunerState"])["current"] == running


def test_a_stale_recommendation_is_cleared(api: ApiServer, rest: KubeRest) -> None:
    reconcile(rest, create(api, "stale", "recommend"))
    now = later()
    tune(rest, spd(api, "stale"), now=now, make_actuator=factory(FakeActuator(busy())))
    assert "recommendation" in spd(api, "stale")["status"]
    # no restart left in the budget: whatever the tuner would move to, it stays
    patch = {"spec": {"tuning": {"restartBudgetPerHour": 0}}}
    rest.patch("specpilot.io/v1alpha1", "specdeployments", "default", "stale", patch)
    quiet = FakeActuator(busy(batch=1.0, tokens_per_s=150.0))
    outcome = tune(rest, spd(api, "stale"), now=now + 60, make_actuator=factory(quiet))
    assert outcome is not None and outcome.action == "stay", outcome
    assert "recommendation" not in spd(api, "stale")["status"]


class ShortfallActuator(FakeActuator):
    """Applies anything; after the first switch the engine delivers half what it did, and it
    records the phase the operator announced before each rollout."""

    def __init__(self, api: ApiServer, name: str) -> None:
        # no queue: a move made for capacity alone is not judged on per-sequence speed
        super().__init__(replace(busy(), waiting_requests=0.0))
        self.api, self.name = api, name
        self.phases: list[str] = []

    def apply(self, config: SpecConfig) -> None:
        super().apply(config)
        self.phases.append(spd(self.api, self.name)["status"]["phase"])
        if len(self.applied) == 1:
            self.observation = replace(busy(tokens_per_s=4500.0), waiting_requests=0.0)


def test_a_switch_short_of_its_prediction_is_rolled_back_and_remembered(
    api: ApiServer, rest: KubeRest
) -> None:
    reconcile(rest, create(api, "short", "auto"))
    actuator = ShortfallActuator(api, "short")
    now = later()
    first = tune(rest, spd(api, "short"), now=now, make_actuator=factory(actuator))
    assert first is not None and first.applied
    target = actuator.applied[0]
    second = tune(rest, spd(api, "short"), now=now + 10, make_actuator=factory(actuator))
    assert second is not None and second.action == "rollback", second
    assert actuator.applied[-1].max_k == 4 and actuator.phases == ["Switching", "RollingBack"]
    status = spd(api, "short")["status"]
    assert status["phase"] == "Running" and status["lastDecision"]["action"] == "rollback"
    stored = json.loads(status["tunerState"])
    assert stored["current"]["num_speculative_tokens"] == 4
    assert [c for c, _ in stored["failed"]] == [target.to_dict()]  # survives a restart
    assert events(api, "short")["TunerRolledBack"]["type"] == "Warning"


def test_what_the_actuator_creates_is_owned_by_the_spec_deployment(
    api: ApiServer, rest: KubeRest
) -> None:
    body = create(api, "owned", "auto")
    spec = decode_spec(body["spec"])
    actuator = kube_actuator(rest, body, spec, time.sleep)
    assert isinstance(actuator, KubeActuator)
    canary = actuator.render(SpecConfig(), "canary")
    (owner,) = canary["metadata"]["ownerReferences"]
    assert (owner["uid"], owner["kind"], owner["controller"]) == (
        body["metadata"]["uid"],
        "SpecDeployment",
        True,
    )


def test_a_pod_monitor_where_the_prometheus_operator_is_installed(tmp_path: Path) -> None:
    crds = [*default_crds(), REPO / "tests" / "kube" / "crds" / "prometheus-operator-monitors.yaml"]
    rules = operator_rules(tmp_path)
    with running_apiserver(tmp_path, crds=crds, operator_rules=rules) as api:
        rest = KubeRest.from_config(str(api.operator_kubeconfig))
        body = create(api, "watched", "auto")
        reconcile(rest, body)
        monitor = api.get("monitoring.coreos.com", "podmonitors", "default", "watched")
        assert monitor is not None, api.list("monitoring.coreos.com", "podmonitors")
        (owner,) = monitor["metadata"]["ownerReferences"]
        assert owner["uid"] == body["metadata"]["uid"]
        pods = api.list("apps", "deployments", "default")[0]["spec"]["template"]["metadata"]
        assert monitor["spec"]["selector"]["matchLabels"].items() <= pods["labels"].items()
        assert api.denials() == []
