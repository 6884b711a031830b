"""The Kubernetes actuator's logic without a cluster: rollout reading (operator/kube/rollout.py),
patch/follow/timeout/crash/canary with an in-memory API and a fake clock, and the loop's
goodput check (operator/loop.py) with a scripted actuator."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from specpilot.operator.api.names import CANARY_SLOT_ANNOTATION
from specpilot.operator.api.spec import decode_spec
from specpilot.operator.kube.actuator import (
    CanaryRejected,
    KubeActuator,
    RolloutError,
    for_spec,
)
from specpilot.operator.kube.pod_metrics import PodTarget, pod_target
from specpilot.operator.kube.rollout import rollout_status
from specpilot.operator.loop import Actuator, ControlLoop, TickRecord, TrialJudge
from specpilot.runtime.engine_metrics import WindowStats
from specpilot.tuner import (
    Decision,
    Observation,
    SpecConfig,
    StepCost,
    StepTimeModel,
    TunerSettings,
    TunerState,
    acceptance_curve,
)

Obj = dict[str, Any]
EAGLE = SpecConfig(method="eagle3", num_speculative_tokens=3, draft_model="/d")


def deployment(config: SpecConfig, replicas: int = 2, role: str = "main") -> Obj:
    labels = {"app": "llm", "role": role}
    return {
        "metadata": {"name": "llm" if role == "main" else "llm-canary", "generation": 1},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {
                    "labels": labels,
                    "annotations": {"specpilot.io/config": config.to_json()},
                },
                "spec": {"containers": [{"name": "engine", "args": [config.describe()]}]},
            },
        },
    }


def pod(
    name: str, config: SpecConfig, *, ready: bool = True, role: str = "main", **state: Any
) -> Obj:
    return {
        "metadata": {
            "name": name,
            "labels": {"app": "llm", "role": role},
            "annotations": {"specpilot.io/config": config.to_json()},
        },
        "spec": {
            "containers": [{"name": "engine", "ports": [{"name": "http", "containerPort": 8000}]}]
        },
        "status": {
            "podIP": f"10.0.0.{len(name)}",
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            "containerStatuses": [{"name": "engine", "state": state or {"running": {}}}],
        },
    }


@dataclass
class FakeCluster:
    """Deployments and pods in memory; `controller(cluster)` plays the Deployment controller
    and kubelet on every read, so a test scripts what the pods do."""

    deployments: dict[str, Obj] = field(default_factory=dict)
    pods: list[Obj] = field(default_factory=list)
    controller: Callable[[FakeCluster], None] = lambda _: None
    patches: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    writes: list[str] = field(default_factory=list)
    """Every write, in order: "create NAME", "patch NAME", "scale NAME N[ held M]", "delete",
    "route SERVICE to ROLE|both"."""
    services: dict[str, dict[str, str]] = field(default_factory=dict)
    """Service name -> its pod selector."""

    def read_deployment(self, namespace: str, name: str) -> Obj | None:
        self.controller(self)
        found = self.deployments.get(name)
        return copy.deepcopy(found) if found else None

    def create_deployment(self, namespace: str, body: Obj) -> Obj:
        self.deployments[body["metadata"]["name"]] = copy.deepcopy(body)
        self.writes.append(f"create {body['metadata']['name']}")
        return body

    def replace_template(self, namespace: str, name: str, template: Obj) -> Obj:
        live = self.deployments[name]
        live["spec"]["template"] = copy.deepcopy(template)
        live["metadata"]["generation"] += 1
        self.patches.append(name)
        self.writes.append(f"patch {name}")
        return live

    def set_replicas(self, namespace: str, name: str, replicas: int, held: int | None) -> None:
        live = self.deployments[name]
        live["spec"]["replicas"] = replicas
        live["metadata"]["generation"] += 1
        annotations = live["metadata"].setdefault("annotations", {})
        annotations.pop(CANARY_SLOT_ANNOTATION, None)
        if held is not None:
            annotations[CANARY_SLOT_ANNOTATION] = str(held)
        self.writes.append(f"scale {name} {replicas}" + ("" if held is None else f" held {held}"))

    def delete_deployment(self, namespace: str, name: str) -> None:
        if self.deployments.pop(name, None) is not None:
            self.deleted.append(name)
            self.writes.append(f"delete {name}")
            self.pods = [p for p in self.pods if p["metadata"]["labels"]["role"] != "canary"]

    def ensure_config_map(self, namespace: str, body: Obj) -> None:
        pass

    def list_pods(self, namespace: str, selector: Mapping[str, str]) -> list[Obj]:
        return [
            copy.deepcopy(p)
            for p in self.pods
            if all(p["metadata"]["labels"].get(k) == v for k, v in selector.items())
        ]

    def service_selector(self, namespace: str, name: str) -> dict[str, str] | None:
        found = self.services.get(name)
        return dict(found) if found is not None else None

    def set_service_selector(self, namespace: str, name: str, selector: Mapping[str, str]) -> None:
        self.services[name] = dict(selector)
        self.writes.append(f"route {name} to {selector.get('role', 'both')}")


def settle(cluster: FakeCluster) -> None:
    """A healthy controller: every Deployment's pods run its template, Ready."""
    pods = []
    for name, dep in cluster.deployments.items():
        config = SpecConfig.from_json(
            dep["spec"]["template"]["metadata"]["annotations"]["specpilot.io/config"]
        )
        role = dep["spec"]["selector"]["matchLabels"]["role"]
        count = dep["spec"]["replicas"]
        pods += [pod(f"{name}-{i}", config, role=role) for i in range(count)]
        dep["status"] = {
            "observedGeneration": dep["metadata"]["generation"],
            "replicas": count, "updatedReplicas": count, "availableReplicas": count,
        }  # fmt: skip
    cluster.pods = pods


@dataclass
class FakeClock:
    now: float = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


@dataclass
class PerPodMetrics:
    """A PodWindowSource answering tokens/s per pod from the config the pod runs."""

    tokens_per_s: Callable[[PodTarget], float]
    windows: list[tuple[str, ...]] = field(default_factory=list)

    def window(
        self, engine: str, targets: Sequence[PodTarget], window_s: float
    ) -> list[WindowStats]:
        self.windows.append(tuple(t.name for t in targets))
        return [
            WindowStats(
                pod=t.name, window_s=window_s,
                counters={"generation_tokens": self.tokens_per_s(t) * window_s},
                gauges={"running": 4.0},
            )
            for t in targets
        ]  # fmt: skip


def actuator(cluster: FakeCluster, metrics: PerPodMetrics | None = None, **kw: Any) -> KubeActuator:
    clock = FakeClock()

    def render(config: SpecConfig, role: str) -> Obj:
        return deployment(config, replicas=1 if role == "canary" else 2, role=role)

    return KubeActuator(
        api=cluster, name="llm", namespace="ns", engine="vllm", render=render,  # type: ignore[arg-type]
        metrics=metrics or PerPodMetrics(lambda t: 100.0),
        rollout_timeout_s=60, poll_s=1, clock=clock, sleep=clock.sleep, **kw,
    )  # fmt: skip


def test_rollout_status_reads_like_kubectl() -> None:
    dep = deployment(EAGLE)
    dep["status"] = {"observedGeneration": 0}
    assert "controller" in rollout_status(dep, [], EAGLE.to_json()).message
    dep["status"] = {"observedGeneration": 1, "replicas": 3, "updatedReplicas": 2}
    assert "old replicas" in rollout_status(dep, [], EAGLE.to_json()).message
    dep["status"] = {
        "observedGeneration": 1,
        "replicas": 2,
        "updatedReplicas": 2,
        "availableReplicas": 1,
    }
    assert not rollout_status(dep, [], EAGLE.to_json()).done
    dep["status"]["availableReplicas"] = 2
    assert rollout_status(dep, [], EAGLE.to_json()).done
    dep["status"]["conditions"] = [{"type": "Progressing", "reason": "ProgressDeadlineExceeded"}]
    assert rollout_status(dep, [], EAGLE.to_json()).failed


def test_a_crash_looping_new_pod_fails_the_rollout_with_its_message() -> None:
    crashed = pod("llm-new", EAGLE, ready=False, waiting={"reason": "CrashLoopBackOff"})
    crashed["status"]["containerStatuses"][0]["lastState"] = {
        "terminated": {"exitCode": 2, "message": "error: draft_model='/d' is invalid"}
    }
    old = pod("llm-old", SpecConfig())
    status = rollout_status(deployment(EAGLE), [old, crashed], EAGLE.to_json())
    assert status.failed and "CrashLoopBackOff (exit code 2)" in status.message
    assert "draft_model" in status.message
    # the same crash on a pod of another config is not this rollout's business
    assert not rollout_status(deployment(EAGLE), [crashed], SpecConfig().to_json()).failed


def test_apply_patches_the_template_only_and_follows_the_rollout() -> None:
    cluster = FakeCluster(controller=settle)
    act = actuator(cluster)
    act.apply(SpecConfig())  # creates
    act.apply(SpecConfig())  # already running: no patch
    assert cluster.patches == []
    cluster.deployments["llm"]["spec"]["replicas"] = 5  # an HPA scaled it
    act.apply(EAGLE)
    assert cluster.patches == ["llm"] and act.config == EAGLE
    assert cluster.deployments["llm"]["spec"]["replicas"] == 5  # never written


def test_a_rollout_that_never_gets_ready_times_out() -> None:
    def stuck(cluster: FakeCluster) -> None:
        for dep in cluster.deployments.values():
            generation = dep["metadata"]["generation"]
            dep["status"] = {"observedGeneration": generation, "replicas": 3, "updatedReplicas": 1}

    cluster = FakeCluster(deployments={"llm": deployment(SpecConfig())}, controller=stuck)
    act = actuator(cluster)
    with pytest.raises(RolloutError, match="not Ready within 60s: 1 of 2 new replicas"):
        act.apply(EAGLE)
    assert act.config == SpecConfig()  # still what the Deployment runs


def test_canary_is_compared_per_pod_then_promoted_or_discarded() -> None:
    faster = PerPodMetrics(
        lambda t: 150.0 if t.config and t.config["method"] == "eagle3" else 100.0
    )
    cluster = FakeCluster(controller=settle)
    act = actuator(cluster, faster, canary=True, canary_window_s=10)
    act.apply(SpecConfig())
    act.apply(EAGLE)
    assert act.last_canary is not None and act.last_canary.promoted
    assert act.last_canary.canary_speed == pytest.approx(150.0 / 4)
    assert len(faster.windows[-1]) == 3  # two main pods and the canary, one window
    assert "llm-canary" in cluster.deleted and act.config == EAGLE

    slower = PerPodMetrics(lambda t: 50.0 if t.config and t.config["method"] == "ngram" else 100.0)
    act.metrics = slower
    ngram = SpecConfig(method="ngram", num_speculative_tokens=3)
    with pytest.raises(CanaryRejected, match=r"ngram.*rejected.*-50"):
        act.apply(ngram)
    assert act.config == EAGLE and "llm-canary" not in cluster.deployments
    assert cluster.patches == ["llm"]  # main was patched once, for EAGLE only


@pytest.mark.parametrize(
    ("spare", "taken", "given_back"),
    [
        (True, ["create llm-canary", "scale llm 1 held 2"], ["scale llm 2", "delete llm-canary"]),
        (False, ["scale llm 1 held 2", "create llm-canary"], ["delete llm-canary", "scale llm 2"]),
    ],
)
def test_an_in_place_canary_takes_a_main_replicas_slot_and_gives_it_back(
    spare: bool, taken: list[str], given_back: list[str]
) -> None:
    # with a spare GPU the canary is Ready before a main replica stops, and the replica is
    # back before the canary goes; without one the other way round
    speeds = {"eagle3": 150.0, "ngram": 50.0, "none": 100.0}
    faster = PerPodMetrics(lambda t: speeds[t.config["method"] if t.config else "none"])
    cluster = FakeCluster(controller=settle)
    act = actuator(cluster, faster, canary_window_s=10, canary_in_place=True, spare_replica=spare)
    act.apply(SpecConfig())
    assert act.canary_share() == pytest.approx(1 / 2)  # one of two slots, not one of three
    cluster.writes.clear()
    with pytest.raises(CanaryRejected):
        act.apply_trial(SpecConfig(method="ngram", num_speculative_tokens=3))
    assert cluster.writes == taken + given_back
    assert len(faster.windows[-1]) == 2  # one main pod beside the canary
    main = cluster.deployments["llm"]
    assert main["spec"]["replicas"] == 2 and act.config == SpecConfig()
    assert CANARY_SLOT_ANNOTATION not in main["metadata"]["annotations"]
    cluster.writes.clear()
    act.apply_trial(EAGLE)  # promoted: the main pods roll, then the slot comes back
    assert cluster.writes == [*taken, "patch llm", *given_back] and act.config == EAGLE
    assert cluster.deployments["llm"]["spec"]["replicas"] == 2


def test_a_slot_an_earlier_operator_left_held_is_given_back_at_the_next_apply() -> None:
    cluster = FakeCluster(controller=settle)
    act = actuator(cluster, canary_in_place=True, spare_replica=False)
    act.apply(SpecConfig())
    cluster.set_replicas("ns", "llm", 1, 2)  # killed mid-trial: main held, canary up
    cluster.create_deployment("ns", deployment(EAGLE, replicas=1, role="canary"))
    fresh = actuator(cluster, canary_in_place=True, spare_replica=False)
    fresh.apply(SpecConfig())
    main = cluster.deployments["llm"]
    assert main["spec"]["replicas"] == 2 and "llm-canary" not in cluster.deployments
    assert CANARY_SLOT_ANNOTATION not in main["metadata"]["annotations"]
    assert sum(p["metadata"]["labels"]["role"] == "main" for p in cluster.pods) == 2


def test_where_an_autoscaler_owns_the_count_the_canary_runs_beside_the_main_pods() -> None:
    cluster = FakeCluster(controller=settle)
    act = actuator(cluster, canary_window_s=10)  # canary_in_place off: replicas not ours
    act.apply(SpecConfig())
    assert act.canary_share() == pytest.approx(1 / 3)
    cluster.writes.clear()
    act.apply_trial(EAGLE)
    assert not [w for w in cluster.writes if w.startswith("scale")]


def test_pod_target_uses_the_prometheus_port_annotation_and_skips_unready_pods() -> None:
    ready = pod("a", EAGLE)
    ready["metadata"]["annotations"]["prometheus.io/port"] = "9000"
    target = pod_target(ready)
    assert target is not None and target.url.endswith(":9000/metrics")
    assert target.config == json.loads(EAGLE.to_json())
    assert pod_target(pod("b", EAGLE, ready=False)) is None


@dataclass
class ScriptedActuator:
    throughput: dict[str, float]
    applied: list[SpecConfig] = field(default_factory=list)

    def apply(self, config: SpecConfig) -> None:
        self.applied.append(config)

    def observe(self, window_s: float) -> Observation:
        current = self.applied[-1]
        return Observation(
            engine="vllm", window_s=window_s, pods=("p",), acceptance_length=None,
            acceptance_rate=None, acceptance_per_position=None, running_requests=2.0,
            waiting_requests=0.0, kv_cache_usage=0.1,
            generation_tokens_per_s=self.throughput[current.method], tpot_p50_s=None,
            tpot_p95_s=None, ttft_p95_s=None,
        )  # fmt: skip


def goodput_loop(actuator: ScriptedActuator) -> ControlLoop:
    return ControlLoop(
        actuator=actuator,
        settings=TunerSettings(
            candidates=(SpecConfig(), EAGLE),
            min_dwell_s=0,
            synthesize_schedules=False,
            restart_downtime_s=1.0,
            exploration=0.0,
        ),
        cost=StepCost.for_hardware("H100", "llama-3.1-8b"),
        state=TunerState.initial(SpecConfig(), 0.0, {"eagle3": acceptance_curve("eagle3", "chat")}),
        goodput_tolerance=0.25,
    )


def test_the_loop_rolls_back_a_switch_that_falls_short_of_its_prediction() -> None:
    # At batch 2 the tuner predicts eagle3 about doubles throughput; it measures 10% less.
    actuator = ScriptedActuator({"none": 200.0, "eagle3": 180.0})
    loop = goodput_loop(actuator)
    loop.start()
    switched = loop.tick(100.0)
    assert switched.applied and switched.decision.config == EAGLE
    checked = loop.tick(200.0)
    assert checked.rolled_back and checked.decision.config == SpecConfig()
    assert "measured 90.0 tok/s per sequence" in (checked.error or "")
    assert actuator.applied[-1] == SpecConfig() and loop.state.current == SpecConfig()
    assert loop.state.restarts == (100.0, 200.0)  # the rollback spent a restart too
    again = loop.tick(300.0)
    assert not again.applied  # backed off: EAGLE is not tried again at once


def test_the_goodput_check_passes_a_switch_that_delivers() -> None:
    actuator = ScriptedActuator({"none": 200.0, "eagle3": 420.0})
    loop = goodput_loop(actuator)
    loop.start()
    assert loop.tick(100.0).applied
    checked = loop.tick(200.0)
    assert not checked.rolled_back and loop.state.current == EAGLE


def test_a_main_rollout_failing_after_the_canary_cleans_up_and_rolls_back_without_canary() -> None:
    def crash_new_main(cluster: FakeCluster) -> None:
        settle(cluster)
        main = cluster.deployments.get("llm")
        if (
            main
            and "eagle3"
            in main["spec"]["template"]["metadata"]["annotations"]["specpilot.io/config"]
        ):
            main["status"]["availableReplicas"] = 0  # the promoted template never gets Ready

    cluster = FakeCluster(controller=settle)
    act = actuator(cluster, PerPodMetrics(lambda t: 100.0), canary=True, canary_window_s=5)
    act.apply(SpecConfig())
    cluster.controller = crash_new_main
    with pytest.raises(RolloutError):
        act.apply(EAGLE)
    assert "llm-canary" not in cluster.deployments and act.config == SpecConfig()
    canaries = len(act.metrics.windows)  # type: ignore[attr-defined]
    cluster.controller = settle
    act.apply(SpecConfig())  # the loop's rollback: straight back, no canary of the old config
    assert len(act.metrics.windows) == canaries  # type: ignore[attr-defined]
    assert act.config == SpecConfig() and cluster.patches == ["llm", "llm"]


def test_for_spec_renders_with_children_and_adopts_what_it_creates() -> None:
    spec = decode_spec(
        {
            "engine": "sglang",
            "model": "/m",
            "speculative": {"candidates": [{"method": "eagle3", "maxK": 3, "draftModel": "/d"}]},
            "tuning": {"canary": True, "rolloutTimeoutSeconds": 120},
        }
    )
    owner = {
        "apiVersion": "specpilot.io/v1alpha1",
        "kind": "SpecDeployment",
        "metadata": {"name": "llm", "uid": "u-1"},
    }
    act = for_spec(
        api=FakeCluster(), name="llm", namespace="ns", spec=spec,
        metrics=PerPodMetrics(lambda t: 1.0), owner=owner,
    )  # fmt: skip
    assert act.canary and act.rollout_timeout_s == 120 and act.engine == "sglang"
    canary = act.render(EAGLE, "canary")
    assert canary["metadata"]["name"] == "llm-canary" and canary["spec"]["replicas"] == 1
    assert canary["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    scheduled = replace(EAGLE, schedule=((1, 4, 3), (5, 256, 1)))
    assert act.render_sidecar is not None
    sidecar = act.render_sidecar(scheduled, "main")
    assert sidecar is not None and sidecar["metadata"]["ownerReferences"][0]["name"] == "llm"


def test_a_trial_runs_on_a_canary_even_where_the_spec_asks_for_none() -> None:
    faster = PerPodMetrics(
        lambda t: 150.0 if t.config and t.config["method"] == "eagle3" else 100.0
    )
    cluster = FakeCluster(controller=settle)
    act = actuator(cluster, faster, canary_window_s=10)  # canary off in the spec
    act.apply(SpecConfig())
    act.apply_trial(EAGLE)
    assert act.last_canary is not None and act.last_canary.promoted
    assert "llm-canary" in cluster.deleted and act.config == EAGLE
    # what the canary pod alone served, for the tuner to learn the trial's config from
    served = act.trial_observation()
    assert served is not None and served.generation_tokens_per_s == pytest.approx(150.0)
    # a disappointing trial never touches the main pods: the canary alone measured it
    act.metrics = PerPodMetrics(
        lambda t: 50.0 if t.config and t.config["method"] == "ngram" else 100.0
    )
    with pytest.raises(CanaryRejected):
        act.apply_trial(SpecConfig(method="ngram", num_speculative_tokens=3))
    assert act.config == EAGLE and cluster.patches == ["llm"]
    rejected = act.trial_observation()
    assert rejected is not None and rejected.generation_tokens_per_s == pytest.approx(50.0)
    # a canary as fast as the main pods that the tuner, having seen it, would not choose
    act.metrics = faster
    seen: list[Observation] = []

    def judge(served: Observation) -> str | None:
        seen.append(served)
        return "the tuner stays"

    with pytest.raises(CanaryRejected, match="the tuner stays"):
        act.apply_trial(replace(EAGLE, num_speculative_tokens=2), judge)
    assert act.config == EAGLE and cluster.patches == ["llm"] and len(seen) == 1
    assert act.last_canary is not None and not act.last_canary.promoted
    # a switch that is not a trial follows the spec: no canary
    act.apply(SpecConfig())
    assert cluster.patches == ["llm", "llm"] and "llm-canary" not in cluster.deployments
    assert act.trial_observation() is None  # no canary ran in that call: nothing stale to learn


@dataclass
class TrialRecordingActuator(ScriptedActuator):
    trials: list[SpecConfig] = field(default_factory=list)
    batch: float = 2.0
    canary: bool = True

    def apply_trial(self, config: SpecConfig, judge: TrialJudge | None = None) -> None:
        self.trials.append(config)
        self.applied.append(config)

    def canary_share(self) -> float | None:
        return 0.25 if self.canary else None

    def trial_observation(self) -> Observation | None:
        return None

    def observe(self, window_s: float) -> Observation:
        served = super().observe(window_s)
        tokens_per_s = served.generation_tokens_per_s or 0.0
        return replace(served, running_requests=self.batch, prompt_tokens_per_s=0.2 * tokens_per_s)


NGRAM = SpecConfig(method="ngram", num_speculative_tokens=3)


def _ngram_trial_loop(act: Actuator) -> ControlLoop:
    """n-gram's chat prior is level with no speculation on an affine CPU fit at batch 1, with
    a wide spread: the tuner would try it (tests/unit/test_exploration.py)."""
    fit = StepTimeModel(fixed_s=5.98e-3, per_token_s=0.791e-3, per_kv_token_s=0.0)
    return ControlLoop(
        actuator=act,
        settings=TunerSettings(
            candidates=(SpecConfig(), NGRAM),
            min_dwell_s=0,
            synthesize_schedules=False,
            restart_downtime_s=20.0,
            window_s=10.0,
        ),
        cost=StepCost.from_fit(fit, "H100", "llama-3.1-8b"),
        state=TunerState.initial(SpecConfig(), 0.0, {"ngram": acceptance_curve("ngram", "chat")}),
        window_s=10.0,
    )


def test_the_loop_sends_the_tuners_trials_through_apply_trial() -> None:
    # a switch the tuner is sure of is an ordinary apply
    act = TrialRecordingActuator({"none": 115.0, "ngram": 115.0}, batch=1.0)
    loop = _ngram_trial_loop(act)
    loop.start()
    record = loop.tick(100.0)
    assert record.applied and record.decision.trial and record.decision.config == NGRAM
    assert act.trials == [NGRAM]
    sure = goodput_loop(TrialRecordingActuator({"none": 200.0, "eagle3": 420.0}))
    sure.start()
    switched = sure.tick(100.0)
    assert switched.applied and not switched.decision.trial
    assert isinstance(sure.actuator, TrialRecordingActuator) and sure.actuator.trials == []


@dataclass
class RejectingCanary(TrialRecordingActuator):
    """Every trial's canary is rejected after serving a window in which n-gram drafted well
    (acceptance length 3.4 at K=3: repetitive traffic the chat prior does not expect)."""

    def apply_trial(self, config: SpecConfig, judge: TrialJudge | None = None) -> None:
        self.trials.append(config)
        raise RuntimeError(f"canary {config.describe()} rejected")

    def trial_observation(self) -> Observation | None:
        return Observation(
            engine="vllm", window_s=60.0, pods=("canary",), acceptance_length=3.4,
            acceptance_rate=2.4 / 3, acceptance_per_position=(0.92, 0.8, 0.68), drafts=6000.0,
            running_requests=1.0, waiting_requests=0.0, kv_cache_usage=0.1,
            generation_tokens_per_s=118.0, tpot_p50_s=None, tpot_p95_s=None, ttft_p95_s=None,
        )  # fmt: skip


def test_what_a_rejected_canary_served_is_learned_and_named_in_the_reason() -> None:
    act = RejectingCanary({"none": 115.0, "ngram": 115.0}, batch=1.0)
    loop = _ngram_trial_loop(act)
    loop.start()
    before = loop.state.acceptance_curves()["ngram"].expected_length(3)
    record = loop.tick(100.0)
    assert act.trials == [NGRAM] and record.error is not None and not record.applied
    assert loop.state.current == SpecConfig()  # the main replicas never left it
    after = loop.state.acceptance_curves()["ngram"].expected_length(3)
    assert before < 2.0 < 2.5 < after, (before, after)
    assert "the canary ran ngram K=3 at batch 1.0" in record.decision.reason
    assert f"acceptance length {before:.2f} -> {after:.2f}" in record.decision.reason


@dataclass
class JudgedCanary(TrialRecordingActuator):
    """A canary that serves `served` and is promoted exactly when the judge says so."""

    served: Observation | None = None
    verdicts: list[str | None] = field(default_factory=list)

    def apply_trial(self, config: SpecConfig, judge: TrialJudge | None = None) -> None:
        assert judge is not None and self.served is not None
        self.trials.append(config)
        verdict = judge(self.served)
        self.verdicts.append(verdict)
        if verdict is not None:
            raise RuntimeError(verdict)
        self.applied.append(config)

    def trial_observation(self) -> Observation | None:
        return self.served


def _canary_window(shares: tuple[float, float, float], tokens_per_s: float) -> Observation:
    """A canary's window of ngram K=3 with vLLM's per-position shares (accepted at i / drafts)."""
    length = 1.0 + sum(shares)
    return Observation(
        engine="vllm", window_s=60.0, pods=("canary",), acceptance_length=length,
        acceptance_rate=(length - 1) / 3, acceptance_per_position=shares, drafts=6000.0,
        running_requests=1.0, waiting_requests=0.0, kv_cache_usage=0.1,
        generation_tokens_per_s=tokens_per_s, tpot_p50_s=None, tpot_p95_s=None,
        ttft_p95_s=None,
    )  # fmt: skip


def test_a_canary_is_promoted_only_when_what_it_served_makes_the_tuner_choose_it() -> None:
    fast = JudgedCanary({"none": 115.0, "ngram": 115.0}, batch=1.0)
    fast.served = _canary_window((0.92, 0.8, 0.68), 300.0)  # 3.4 a step, 2.6x the main pods
    loop = _ngram_trial_loop(fast)
    loop.start()
    promoted = loop.tick(100.0)
    assert fast.verdicts == [None] and promoted.applied and loop.state.current == NGRAM
    slow = JudgedCanary({"none": 115.0, "ngram": 115.0}, batch=1.0)
    slow.served = _canary_window((0.045, 0.004, 0.001), 80.0)  # 1.05 a step, slower than main
    loop = _ngram_trial_loop(slow)
    loop.start()
    rejected = loop.tick(100.0)
    (verdict,) = slow.verdicts
    assert verdict is not None and verdict.startswith("with what the canary taught")
    assert not rejected.applied and loop.state.current == SpecConfig()
    assert rejected.error is not None and "with what the canary taught" in rejected.error


def test_a_canary_of_one_k_can_move_the_main_replicas_to_another_k_of_its_method() -> None:
    # the tuner tries n-gram at K=1; its canary drafts well (75% of first drafts accepted), so
    # with that learned the tuner would run K=3: the canary is not promoted (K=1 is not what it
    # would run) and the main replicas move to K=3 in the same tick, on one restart
    ngram1 = SpecConfig(method="ngram", num_speculative_tokens=1)
    act = JudgedCanary({"none": 115.0, "ngram": 115.0}, batch=1.0)
    act.served = replace(
        _canary_window((0.75,), 160.0), acceptance_rate=0.75, acceptance_per_position=(0.75,)
    )
    loop = _ngram_trial_loop(act)
    loop.settings = replace(loop.settings, candidates=(SpecConfig(), ngram1, NGRAM))
    loop.start()
    record = loop.tick(100.0)
    (verdict,) = act.verdicts
    assert act.trials == [ngram1] and verdict is not None and "prefers ngram K=3" in verdict
    assert record.applied and record.error is None and record.decision.config == NGRAM
    assert act.applied[-1] == NGRAM and loop.state.current == NGRAM
    assert len(loop.state.restarts) == 1  # the trial's restart is the move's
    assert "the canary of ngram K=1 taught: the canary ran ngram K=1" in record.decision.reason


def test_a_method_that_drafted_nothing_is_re_tested_on_a_canary_where_one_can_run() -> None:
    """n-gram drafted nothing on sampled traffic and was left; the traffic gives no sign while
    it is off, so the tuner re-tests it on what it accepted before. With a canary that re-test
    is a trial: a canary that drafts nothing again is not promoted (the main replicas never
    leave no speculation, and n-gram is marked again); one that drafts well is."""
    # what n-gram accepted on greedy traffic before it went silent at t=0
    greedy = TunerState.initial(SpecConfig(), 0.0, {"ngram": acceptance_curve("ngram", "code")})
    silent = replace(greedy, no_drafts=(("ngram", 0.0),))

    def retest(served: Observation) -> tuple[JudgedCanary, TickRecord, ControlLoop]:
        act = JudgedCanary({"none": 115.0, "ngram": 115.0}, batch=1.0, served=served)
        loop = _ngram_trial_loop(act)
        loop.state = silent
        loop.start()
        return act, loop.tick(1000.0), loop

    quiet = replace(_canary_window((0.0, 0.0, 0.0), 110.0), drafts=0.0, acceptance_length=None)
    act, record, loop = retest(quiet)
    assert record.decision.trial and act.trials == [NGRAM], record.decision.reason
    reason = record.decision.reason
    assert "re-testing ngram" in reason and "(on a canary)" in reason
    assert act.verdicts[0] is not None and not record.applied
    assert loop.state.current == SpecConfig()
    assert loop.state.drafted_nothing_since("ngram") == 1000.0
    act, record, loop = retest(_canary_window((0.92, 0.8, 0.68), 300.0))
    assert act.verdicts == [None] and record.applied and loop.state.current == NGRAM
    assert loop.state.drafted_nothing_since("ngram") is None
    # one replica, no canary: the re-test moves the engine itself
    alone = TrialRecordingActuator({"none": 115.0, "ngram": 115.0}, batch=1.0, canary=False)
    solo = _ngram_trial_loop(alone)
    solo.state = silent
    solo.start()
    moved = solo.tick(1000.0)
    assert moved.applied and not moved.decision.trial and alone.trials == []
    assert moved.decision.config == NGRAM and "re-testing ngram" in moved.decision.reason


@dataclass
class OneRunningPerPod(PerPodMetrics):
    def window(
        self, engine: str, targets: Sequence[PodTarget], window_s: float
    ) -> list[WindowStats]:
        return [
            replace(stats, gauges={"running": 1.0})
            for stats in super().window(engine, targets, window_s)
        ]


def test_the_loop_learns_a_rejected_canary_over_the_kube_actuator_despite_its_rollback() -> None:
    # the rollback after a rejected canary is an apply, and KubeActuator forgets its last
    # canary at each apply: the loop must read the canary's window before rolling back
    cluster = FakeCluster(controller=settle)
    slow_ngram = OneRunningPerPod(
        lambda t: 50.0 if t.config and t.config["method"] == "ngram" else 115.0
    )
    act = actuator(cluster, slow_ngram, canary_window_s=10)
    loop = _ngram_trial_loop(act)
    loop.start()
    record = loop.tick(100.0)
    assert record.decision.trial and record.error is not None and "CanaryRejected" in record.error
    assert act.config == SpecConfig() and act.trial_observation() is None  # the rollback
    assert "the canary ran ngram K=3 at batch 1.0: 50 tok/s" in record.decision.reason
    assert any(r.config == NGRAM for r in loop.state.residuals)
    # only a canary ran it: its capacity is still read one sd down, after an operator restart
    # too (the mark is in the persisted state); and it is backed off, synthesised schedules
    # included
    assert loop.state.canary_only == (NGRAM,)
    assert TunerState.from_json(loop.state.to_json()).canary_only == (NGRAM,)
    assert loop._without_failed(200.0).excluded == (NGRAM,)


def test_without_a_canary_the_loop_does_not_explore() -> None:
    # the same window as above: with no canary to run it on (one replica), a trial would take
    # all the traffic, and the tuner stays
    act = TrialRecordingActuator({"none": 115.0, "ngram": 115.0}, batch=1.0, canary=False)
    loop = _ngram_trial_loop(act)
    loop.start()
    record = loop.tick(100.0)
    assert record.decision.action == "stay" and not record.applied, record.decision.reason
    assert act.applied == [SpecConfig()] and act.trials == []


def test_the_kube_actuator_has_a_canary_with_two_replicas_or_one_and_a_spare_gpu() -> None:
    cluster = FakeCluster()
    act = actuator(cluster)
    assert act.canary_share() is None  # no Deployment yet
    for replicas, expected in ((1, 1 / 2), (2, 1 / 3), (4, 1 / 5)):
        cluster.deployments["llm"] = deployment(SpecConfig(), replicas=replicas, role="main")
        assert act.canary_share() == expected
    cluster.deployments["llm"] = deployment(SpecConfig(), replicas=1, role="main")
    assert actuator(cluster, spare_replica=False).canary_share() is None
    # in place is for a count of two or more: the only replica's place is never taken
    assert actuator(cluster, canary_in_place=True).canary_share() == pytest.approx(1 / 2)


@dataclass
class LittleMetrics:
    """A PodWindowSource answering each pod's requests in flight and finished per second:
    the main pods' from `main`, the canary's from `canary(probe)` while the Service routes
    to it (probe: the canary's windows so far), and an emptied canary once it does not."""

    cluster: FakeCluster
    main: tuple[float, float]
    canary: Callable[[int], tuple[float, float]]
    windows: list[tuple[tuple[str, ...], float]] = field(default_factory=list)
    probes: int = 0

    def window(
        self, engine: str, targets: Sequence[PodTarget], window_s: float
    ) -> list[WindowStats]:
        self.windows.append((tuple(t.name for t in targets), window_s))
        routed = self.cluster.services.get("llm", {}).get("role")
        out = []
        for t in targets:
            if not t.name.startswith("llm-canary"):
                held, rate = self.main
            elif routed == "canary":
                held, rate = self.canary(self.probes)
                self.probes += 1
            else:
                held, rate = 0.0, 0.0
            out.append(
                WindowStats(
                    pod=t.name, window_s=window_s, gauges={"running": held, "waiting": 0.0},
                    histogram_sums={"inference_s": held * window_s},
                    histogram_counts={"inference_s": rate * window_s},
                )
            )  # fmt: skip
        return out


def beside_one_replica(
    canary: Callable[[int], tuple[float, float]],
) -> tuple[KubeActuator, FakeCluster, LittleMetrics]:
    """One main replica at 40 requests in flight, 10 finished/s (4 s each), a spare GPU, the
    Service over both roles; the tuner's window of it already observed."""
    cluster = FakeCluster(controller=settle, services={"llm": {"app": "llm"}})
    metrics = LittleMetrics(cluster, (40.0, 10.0), canary)
    clock = FakeClock()

    def render(config: SpecConfig, role: str) -> Obj:
        return deployment(config, replicas=1, role=role)

    act = KubeActuator(
        api=cluster, name="llm", namespace="ns", engine="vllm", render=render,  # type: ignore[arg-type]
        metrics=metrics, rollout_timeout_s=60, poll_s=1, clock=clock, sleep=clock.sleep,
        canary_in_place=True,
    )  # fmt: skip
    act.apply(SpecConfig())
    act.observe(60.0)
    cluster.writes.clear()
    return act, cluster, metrics


def test_beside_one_replica_a_trial_takes_all_of_the_load_and_serves_while_the_replica_rolls() -> (
    None
):
    act, cluster, metrics = beside_one_replica(lambda probe: (20.0, 10.0))  # 2 s each
    assert act.canary_share() == pytest.approx(1 / 2)
    act.apply_trial(EAGLE)
    # all of the load to the canary for the whole window; promoted, it serves on while the
    # idle replica is replaced on its own GPU (scaled to 0, patched, scaled back and
    # followed to Ready); then new requests to the replica, the canary finishes and goes,
    # and the Service has both roles again
    assert cluster.writes == [
        "create llm-canary", "route llm to canary", "scale llm 0 held 1", "patch llm",
        "scale llm 1", "route llm to main", "delete llm-canary", "route llm to both",
    ]  # fmt: skip
    assert cluster.deployments["llm"]["spec"]["replicas"] == 1
    assert metrics.probes * 5.0 == pytest.approx(act.full_load_window_s)
    assert act.config == EAGLE and cluster.services["llm"] == {"app": "llm"}
    assert (
        act.last_canary is not None
        and "promoted at all of the load (2.00 s in system" in act.last_canary.reason
    )
    served = act.trial_observation()
    # the tuner learns the canary over the whole window, its probes joined
    assert served is not None and served.window_s == pytest.approx(act.full_load_window_s)
    assert served.requests_per_s == pytest.approx(10.0)


def test_beside_one_replica_a_congested_canary_is_stopped_and_the_replica_left_alone() -> None:
    act, cluster, metrics = beside_one_replica(lambda probe: (60.0 + 10 * probe, 8.0))
    with pytest.raises(
        CanaryRejected,
        match=r"rejected: at all of the load a request stayed 10\.00 s against 4\.00 s",
    ):
        act.apply_trial(SpecConfig(method="ngram", num_speculative_tokens=3))
    # stopped at the second probe past the settle time, long before its window ran out
    assert metrics.probes == 3
    assert cluster.writes == [
        "create llm-canary", "route llm to canary", "route llm to main", "delete llm-canary",
        "route llm to both",
    ]  # fmt: skip
    assert act.config == SpecConfig() and cluster.services["llm"] == {"app": "llm"}


def test_a_service_an_operator_left_on_the_canary_gets_both_roles_back_with_the_canary_gone() -> (
    None
):
    act, cluster, _ = beside_one_replica(lambda probe: (20.0, 10.0))
    # killed mid-trial: the canary runs and the Service routes every request to it
    cluster.deployments["llm-canary"] = deployment(EAGLE, replicas=1, role="canary")
    cluster.services["llm"] = {"app": "llm", "role": "canary"}
    act.apply(SpecConfig())
    # new requests to the replica, the canary drained and deleted, both roles again
    assert cluster.writes == ["route llm to main", "delete llm-canary", "route llm to both"]


def test_an_operator_killed_mid_promotion_routes_to_the_replica_once_it_is_ready() -> None:
    act, cluster, _ = beside_one_replica(lambda probe: (20.0, 10.0))
    # killed mid-promotion: the canary has all of the load, the main Deployment is scaled to
    # 0 with its count held for the GPU the canary's successor needs
    cluster.deployments["llm-canary"] = deployment(EAGLE, replicas=1, role="canary")
    cluster.services["llm"] = {"app": "llm", "role": "canary"}
    main = cluster.deployments["llm"]
    main["spec"]["replicas"] = 0
    main["metadata"].setdefault("annotations", {})[CANARY_SLOT_ANNOTATION] = "1"
    starting = {"reads": 0, "ready": False}

    def slow_start(c: FakeCluster) -> None:
        """The main pod, once scaled back, is Ready from its fourth read on."""
        settle(c)
        if c.deployments["llm"]["spec"]["replicas"] == 0:
            return
        starting["reads"] += 1
        starting["ready"] = starting["reads"] > 3
        if not starting["ready"]:
            c.deployments["llm"]["status"]["availableReplicas"] = 0
            for p in c.pods:
                if p["metadata"]["labels"]["role"] == "main":
                    p["status"]["conditions"] = [{"type": "Ready", "status": "False"}]

    cluster.controller = slow_start
    ready_when_routed: list[bool] = []
    route = cluster.set_service_selector

    def watched(namespace: str, name: str, selector: Mapping[str, str]) -> None:
        if selector.get("role") == "main":
            ready_when_routed.append(starting["ready"])
        route(namespace, name, selector)

    cluster.set_service_selector = watched  # type: ignore[method-assign]
    act.apply(SpecConfig())
    assert cluster.writes == [
        "scale llm 1", "route llm to main", "delete llm-canary", "route llm to both",
    ]  # fmt: skip
    assert ready_when_routed == [True]


def test_a_refused_move_is_explained_by_its_reason_and_the_refusal() -> None:
    decision = Decision(
        action="switch", config=NGRAM, reason="exploring: ngram K=3 " + "x" * 900,
        predicted_gain=0.2, regime="memory-bound",
    )  # fmt: skip
    served = _canary_window((0.9, 0.8, 0.7), 100.0)
    refused = TickRecord(0.0, served, decision, applied=False, error="CanaryRejected: slower")
    assert refused.explanation.startswith("exploring: ngram K=3")
    assert refused.explanation.endswith("; not applied: CanaryRejected: slower")
    assert len(refused.explanation) <= 1024  # the status field's cap keeps the refusal
    assert TickRecord(0.0, served, decision, applied=True).explanation == decision.reason
    back = TickRecord(0.0, served, decision, True, error="rolled back x", rolled_back=True)
    assert back.explanation == "rolled back x"


def test_beside_one_replica_no_canary_starts_without_a_window_of_the_replica() -> None:
    act, cluster, _ = beside_one_replica(lambda probe: (20.0, 10.0))
    act.last_observation = None  # a fresh actuator: the tuner's window came from another
    with pytest.raises(CanaryRejected, match="no window of the replica's"):
        act.apply_trial(EAGLE)
    # nothing was created or routed; the canary's delete (a no-op) gives nothing back
    assert cluster.writes == [] and act.config == SpecConfig()
