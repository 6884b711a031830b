"""SIGKILL of the real operator process (`specpilot operator`, kopf) at seeded points of its
rollouts, KILLS times in a row (5 in `make test`: each rollout step armed once, a canary or a
rollback in flight killed into first; SPECPILOT_OPERATOR_KILLS=20 for the long run, which took
22 minutes of a 54-minute fresh-clone `make test` on a busy 2-core host; 8 took 615 s on a
busy one),
against the mock API server (tests/kube, a MOCK); the Deployment controller, the kubelet and
the engines' /metrics are played by tests/operator/fake_node.py.

Each kill lands at a rollout step a seeded RNG picks (the template patch refused as the
operator dies sending it; the new template seen by the controller; a new pod made; a new pod
Ready beside the old ones; the rollout complete but not yet recorded); a trial's canary and a
rollback (some configs crash-loop, seeded) are always killed into. A new operator is started
after each kill; sometimes (seeded) it is killed again while it resumes. Asserted:
- along the way, on every pass of the node: never zero Ready pods of the 2-replica Deployment,
  never more than one rollout in flight (pods of at most two configs; a template changed
  mid-rollout only back to the config before it);
- after each restart, once the operator has settled: no rollout left in flight, the
  Deployment runs the config status.tunerState and status.currentConfig name at the spec's
  replica count (a canary's slot given back), every pod Ready runs it, and nothing the tuner
  had in status.tunerState before the kill is lost (its restart history, the configs it
  backed off, the methods it learned acceptance for);
- a config that crash-loops is never what it settles on.
Kill points are steps of the rollout, never wall-clock offsets; waits only bound a hang.
"""

from __future__ import annotations

import json
import os
import random
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import kmock
import pytest
from fake_node import CONFIG, FakeNode, World
from kube.apiserver import OPERATOR_TOKEN, ApiServer, running_apiserver
from kube.chart import operator_rules
from kube.operator_process import Operator, start_operator, stop, wait_for
from kube.realism import RealisticKubernetes

from specpilot.operator.api.names import CANARY_SLOT_ANNOTATION
from specpilot.operator.api.spec import config_to_status
from specpilot.tuner import SpecConfig

NAME = "killed"
SPD_PATH = "/apis/specpilot.io/v1alpha1/namespaces/default/specdeployments"
SEED = 13
STEPS = ("patch-refused", "patched", "surged", "new-ready", "complete")
"""Steps every rollout goes through, in order (a kill picks one)."""
KILLS = int(os.environ.get("SPECPILOT_OPERATOR_KILLS", str(len(STEPS))))
# Traffic that flips after every decision, so that each tick is a switch between n-gram's Ks
# (or speculation off): a busy batch where n-gram accepts little, then one user whose text it
# predicts well. No queue: a queue's demand is remembered as the recent peak
# (`TunerState.demand_peak`), and one past n-gram's capacity keeps it off at the next idle.
BUSY = World(batch=128.0, waiting=0.0, tokens_per_s=6000.0, acceptance_length=1.5)
IDLE = World(batch=1.0, waiting=0.0, tokens_per_s=150.0, acceptance_length=3.0)


def body() -> dict[str, Any]:
    return {
        "apiVersion": "specpilot.io/v1alpha1",
        "kind": "SpecDeployment",
        "metadata": {"name": NAME, "namespace": "default"},
        "spec": {
            "engine": "vllm",
            "model": "m",
            "replicas": 2,
            "speculative": {
                "candidates": [{"method": "ngram", "maxK": 4}],
                "initial": {"method": "ngram", "k": 4},
            },
            "tuning": {
                "mode": "auto",
                "intervalSeconds": 5,
                "minDwellSeconds": 0,
                "restartBudgetPerHour": 60,
                "rolloutTimeoutSeconds": 600,
                "explore": True,  # trials: a canary to kill into
            },
        },
    }


class Killer:
    """Kills the operator at the armed step of a rollout, from the node's pass (the node
        stands still meanwhile) or, for "patch-refused", in the API server as the operator's
        template patch arrives (answered 503 and not applied: the operator died sending it).
        Once armed, a trial's canary comparison (its pods scraped) or a rollback in flight is killed
    into whatever was armed."""

    def __init__(self, api: ApiServer) -> None:
        self.api = api
        self.operator: Operator | None = None
        self._canary_scrapes = 0
        self.armed: str | None = None
        self.fired: list[tuple[str, dict[str, Any]]] = []
        """(step, status.tunerState as it was at the kill)."""
        self._refused: set[int] = set()
        self._once: set[tuple[str, Any]] = set()
        api.call(self._install)

    def _install(self, kube: RealisticKubernetes) -> None:
        message = {"kind": "Status", "status": "Failure", "code": 503, "message": "killed"}
        deployments = kmock.resource("apps", "v1", "deployments")

        def at_patch(request: kmock.Request) -> bool:  # on the server's loop
            if request.id in self._refused:  # asked more than once per request
                return True
            if self.armed != "patch-refused" or self.operator is None:
                return False
            if request.name != NAME or request.subresource or not _by_operator(request):
                return False
            self._refused.add(request.id)
            status = kube.store.get(("specpilot.io", "specdeployments", "default", NAME)) or {}
            self._kill("patch-refused", (status.get("status") or {}).get("tunerState"))
            return True

        kube["patch", deployments, at_patch] << 503 << message

    def arm(self, step: str) -> None:
        self.armed = step

    def started(self, operator: Operator, node: FakeNode) -> None:
        self.operator = operator
        self._canary_scrapes = node.scrapes.get(f"{NAME}-canary", 0)

    def on_pass(self, node: FakeNode) -> None:
        if self.armed is None or self.operator is None or self.operator.process.poll() is not None:
            return
        seen, key = self._steps(node)
        # a rollback once (a new operator finds it still in flight until it has seen it through)
        if ("rolling-back", key.get("rolling-back")) in self._once:
            seen.discard("rolling-back")
        step = next((s for s in ("canary", "rolling-back", self.armed) if s in seen), None)
        if step is not None:
            self._once.add((step, key.get(step)))
            self._kill(step, (_spd(self.api).get("status") or {}).get("tunerState"))

    def _steps(self, node: FakeNode) -> tuple[set[str], dict[str, Any]]:
        """The steps this pass sees, and what identifies the rollback seen."""
        deployment = self.api.get("apps", "deployments", "default", NAME)
        rollout = node.rollouts.get(NAME)
        if deployment is None or rollout is None:
            return set(), {}
        inflight = _state(self.api).get("rollout")
        seen: set[str] = set()
        key: dict[str, Any] = {}
        if node.scrapes.get(f"{NAME}-canary", 0) > self._canary_scrapes:
            seen.add("canary")  # this operator compares its canary with the main pods
        if inflight and inflight.get("rollingBack"):
            seen.add("rolling-back")
            key["rolling-back"] = inflight.get("since")
        for name in (NAME, f"{NAME}-canary"):  # a switch rolls the main pods, a trial a canary
            rolled = self.api.get("apps", "deployments", "default", name)
            history = node.rollouts.get(name)
            if rolled is None:
                continue
            template = _template_config(rolled)
            if history is None or template != history.target:
                seen.add("patched")  # the node has not acted on this template yet
                continue
            pods = node.pods_of(name)
            new = [p for p in pods if p.config == history.target]
            old = [p for p in pods if p.config != history.target]
            if history.stable != history.target and new and (old or name != NAME):
                seen.add("new-ready" if any(p.ready for p in new) else "surged")
        template = _template_config(deployment)
        if inflight and rollout.stable == rollout.target == template:
            seen.add("complete")
        return seen, key

    def _kill(self, step: str, tuner_state: str | None) -> None:
        assert self.operator is not None
        os.kill(self.operator.process.pid, signal.SIGKILL)
        self.fired.append((step, json.loads(tuner_state) if tuner_state else {}))
        self.operator = None
        self.armed = None


def _by_operator(request: kmock.Request) -> bool:
    auth = next((v for k, v in request.headers.items() if k.lower() == "authorization"), "")
    return OPERATOR_TOKEN in auth


def _spd(api: ApiServer) -> dict[str, Any]:
    found: dict[str, Any] = api.get("specpilot.io", "specdeployments", "default", NAME) or {}
    return found


def _state(api: ApiServer) -> dict[str, Any]:
    raw = (_spd(api).get("status") or {}).get("tunerState")
    found: dict[str, Any] = json.loads(raw) if raw else {}
    return found


def _template_config(deployment: dict[str, Any]) -> Any:
    return json.loads(deployment["spec"]["template"]["metadata"]["annotations"][CONFIG])


def settled(api: ApiServer, node: FakeNode) -> dict[str, Any] | None:
    """status, once no rollout is in flight and the Deployment runs what status says."""
    traffic(api, node)
    status = _spd(api).get("status") or {}
    state = _state(api)
    deployment = api.get("apps", "deployments", "default", NAME)
    if not state or "rollout" in state or status.get("phase") != "Running" or not deployment:
        return None
    if _template_config(deployment) != state["current"]:
        return None
    held = (deployment["metadata"].get("annotations") or {}).get(CANARY_SLOT_ANNOTATION)
    if deployment["spec"].get("replicas") != 2 or held is not None:  # a canary's slot not back
        return None
    pods = node.pods_of(NAME)
    if len(pods) != 2 or not all(p.ready and p.config == state["current"] for p in pods):
        return None
    return status


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[ApiServer, FakeNode, Killer]]:
    with running_apiserver(tmp_path, operator_rules=operator_rules(tmp_path)) as api:
        killer = Killer(api)
        rng = random.Random(SEED)
        crashing: dict[str, bool] = {}

        def crash(config: Any) -> bool:  # a seeded quarter of the configs the tuner picks
            key = json.dumps(config, sort_keys=True)
            if config == SpecConfig(method="ngram", num_speculative_tokens=4).to_dict():
                return False
            return crashing.setdefault(key, rng.random() < 0.25)

        # an engine takes 30 passes of the node to start: longer than an operator restart
        with FakeNode(api, world=World(**vars(BUSY)), crash=crash, start_passes=30) as node:
            node.on_pass = killer.on_pass
            yield api, node, killer
            assert not node.errors, node.errors[-5:]
        assert api.denials() == []


def test_sigkills_mid_rollout_each_resumed_or_rolled_back(
    cluster: tuple[ApiServer, FakeNode, Killer], tmp_path: Path
) -> None:
    api, node, killer = cluster
    rng = random.Random(SEED)
    assert httpx.post(api.url + SPD_PATH, json=body()).status_code == 201
    runs = 0

    def start() -> Operator:
        nonlocal runs
        runs += 1
        operator = start_operator(api, tmp_path / f"operator-{runs:02d}.log", "--standalone")
        killer.started(operator, node)
        return operator

    operator = start()
    try:
        wait_for(lambda: settled(api, node), 60, what="the first rollout")
        # every step armed once first, in a seeded order, then seeded picks
        order = rng.sample(STEPS, len(STEPS))
        while len(killer.fired) < KILLS:
            armed = len(killer.fired)
            step = order[armed] if armed < len(order) else rng.choice(STEPS)
            killer.arm(step)
            wait_for(lambda: killed(api, node, killer), 90, what=f"a rollout reaching {step}")
            operator.process.wait(30)
            operator = start()
            if rng.random() < 0.5:  # kill the next one too, mid-resume if it can
                continue
            status = wait_for(lambda: settled(api, node), 60, what="the rollout seen through")
            check_end_state(api, status, killer.fired[-1][1])
        status = wait_for(lambda: settled(api, node), 60, what="the last rollout seen through")
        check_end_state(api, status, killer.fired[-1][1])
    except AssertionError:
        decision = (_spd(api).get("status") or {}).get("lastDecision")
        print(f"kills: {[s for s, _ in killer.fired]}; {decision}; {node.errors[-3:]}")
        raise
    finally:
        stop(operator.process)
    assert node.violations == [], node.violations[:5]
    assert len(killer.fired) == KILLS
    print(f"kills: {[s for s, _ in killer.fired]}; min Ready: {node.min_ready}")


def flip(node: FakeNode) -> None:
    node.world.become(IDLE if node.world.batch > 1 else BUSY)


_decided: list[str] = []


def traffic(api: ApiServer, node: FakeNode) -> None:
    """The traffic flips after each decision recorded in status."""
    decision = (_spd(api).get("status") or {}).get("lastDecision") or {}
    if decision.get("time") and decision["time"] not in _decided:
        _decided.append(decision["time"])
        flip(node)


def killed(api: ApiServer, node: FakeNode, killer: Killer) -> bool:
    traffic(api, node)
    return killer.armed is None


def check_end_state(api: ApiServer, status: dict[str, Any], before: dict[str, Any]) -> None:
    state = json.loads(status["tunerState"])
    current = SpecConfig.from_dict(state["current"])
    assert status["currentConfig"] == config_to_status(current)
    if not before:
        return
    # nothing the tuner knew at the kill is lost
    assert set(before["restarts"]) <= set(state["restarts"]), (before, state)
    failed = lambda s: {json.dumps(c, sort_keys=True) for c, _ in s.get("failed", [])}  # noqa: E731
    assert failed(before) <= failed(state)
    learned = lambda s: {m for m, *_ in s.get("acceptance_counts", [])}  # noqa: E731
    assert learned(before) <= learned(state)
    assert json.dumps(state["current"], sort_keys=True) not in failed(state)
