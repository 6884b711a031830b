"""Helpers for driving `tune()` against the mock API server: SpecDeployments, status reads,
a scripted window, and a Deployment controller played in the actuator's `sleep`. TEST HELPERS.

The mock API server has no controllers (tests/kube/realism.py), so nothing ever rolls a
Deployment out; `Controller.sleep` writes the status a Deployment controller would (every
replica updated and available at the current generation) each time the actuator waits, so a
real `KubeActuator` follows a real rollout over HTTP without a clock of its own.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx
from kube.apiserver import ApiServer

from specpilot.operator.api.spec import SpecDeploymentSpec
from specpilot.operator.kube.actuator import KubeActuator, for_spec
from specpilot.operator.kube.client import KubeRest
from specpilot.operator.kube.pod_metrics import ScrapeSource
from specpilot.operator.kube.tuning_daemon import forget
from specpilot.operator.loop import TrialJudge
from specpilot.tuner import Observation, SpecConfig

SPD_PATH = "/apis/specpilot.io/v1alpha1/namespaces/default/specdeployments"
DEPLOYMENTS = "/apis/apps/v1/namespaces/default/deployments"
MERGE = {"Content-Type": "application/merge-patch+json"}


def later() -> float:
    """A tick's time: after the state's start (real time at reconcile), past no dwell."""
    return time.time() + 60.0


def busy(batch: float = 256.0, tokens_per_s: float = 9000.0) -> Observation:
    """A compute-bound window: n-gram speculation costs more than it gives here."""
    return Observation(
        engine="vllm", window_s=4.0, pods=("p-0",), acceptance_length=1.2, acceptance_rate=0.07,
        acceptance_per_position=None, running_requests=batch, waiting_requests=40.0,
        kv_cache_usage=0.9, generation_tokens_per_s=tokens_per_s, tpot_p50_s=0.03,
        tpot_p95_s=0.05, ttft_p95_s=0.4,
    )  # fmt: skip


def create(api: ApiServer, name: str, mode: str = "auto", **tuning: Any) -> dict[str, Any]:
    body = {
        "apiVersion": "specpilot.io/v1alpha1",
        "kind": "SpecDeployment",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "engine": "vllm",
            "model": "m",
            "speculative": {
                "candidates": [{"method": "ngram", "maxK": 4}],
                "initial": {"method": "ngram", "k": 4},
            },
            "tuning": {"mode": mode, "intervalSeconds": 5, "minDwellSeconds": 0, **tuning},
        },
    }
    created = httpx.post(api.url + SPD_PATH, json=body)
    assert created.status_code == 201, created.text
    forget("default", name)
    result: dict[str, Any] = created.json()
    return result


def spd(api: ApiServer, name: str) -> dict[str, Any]:
    found: dict[str, Any] = api.get("specpilot.io", "specdeployments", "default", name)
    return found


def events(api: ApiServer, name: str) -> dict[str, dict[str, Any]]:
    return {
        e["reason"]: e
        for e in api.list("", "events", "default")
        if e["involvedObject"]["name"] == name
    }


def running_config(api: ApiServer, name: str) -> SpecConfig:
    template = api.get("apps", "deployments", "default", name)["spec"]["template"]
    return SpecConfig.from_json(template["metadata"]["annotations"]["specpilot.io/config"])


class Controller:
    """Plays the Deployment controller whenever the actuator sleeps; `on_sleep` runs first
    (a test injects its fault there, once the rollout is under way). With `crash`, the pods of
    that config crash-loop (a pod in CrashLoopBackOff is there, as the kubelet reports it)."""

    def __init__(self, api: ApiServer, name: str, crash: SpecConfig | None = None) -> None:
        self.api, self.name, self.crash = api, name, crash
        self.sleeps: list[float] = []
        self.on_sleep: Callable[[int], None] = lambda _: None

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.on_sleep(len(self.sleeps))
        live = self.api.get("apps", "deployments", "default", self.name)
        if self.crash is not None:
            self._crash_loop(live["spec"]["selector"]["matchLabels"], self.crash)
        replicas = int(live["spec"].get("replicas", 1))
        status = {
            "observedGeneration": live["metadata"]["generation"], "replicas": replicas,
            "updatedReplicas": replicas, "availableReplicas": replicas, "readyReplicas": replicas,
        }  # fmt: skip
        done = httpx.patch(
            f"{self.api.url}{DEPLOYMENTS}/{self.name}/status",
            json={"status": status},
            headers=MERGE,
        )
        assert done.status_code == 200, done.text

    def _crash_loop(self, labels: dict[str, str], config: SpecConfig) -> None:
        name = f"{self.name}-crashing"
        pods = f"{self.api.url}/api/v1/namespaces/default/pods"
        if self.api.get("", "pods", "default", name) is not None:
            return
        meta = {"name": name, "labels": labels,
                "annotations": {"specpilot.io/config": config.to_json()}}  # fmt: skip
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
               "spec": {"containers": [{"name": "engine", "image": "engine"}]}}  # fmt: skip
        assert httpx.post(pods, json=pod).status_code == 201
        waiting = {"reason": "CrashLoopBackOff", "message": "back-off restarting"}
        last = {"exitCode": 1, "message": "engine: out of memory loading the draft"}
        status = {"containerStatuses": [{"name": "engine", "state": {"waiting": waiting},
                                         "lastState": {"terminated": last}}]}  # fmt: skip
        patched = httpx.patch(f"{pods}/{name}/status", json={"status": status}, headers=MERGE)
        assert patched.status_code == 200, patched.text


class RealRollouts:
    """A real `KubeActuator` over HTTP for `apply` and `apply_trial`; `observe` returns a
    scripted window (the mock has no engine pods to scrape)."""

    def __init__(self, inner: KubeActuator, observation: Observation) -> None:
        self.inner, self.observation = inner, observation
        self.observed = 0

    def apply(self, config: SpecConfig) -> None:
        self.inner.apply(config)

    def apply_trial(self, config: SpecConfig, judge: TrialJudge | None = None) -> None:
        self.inner.apply_trial(config, judge)

    def canary_share(self) -> float | None:
        return self.inner.canary_share()

    def trial_observation(self) -> Observation | None:
        return self.inner.trial_observation()

    def observe(self, window_s: float) -> Observation:
        self.observed += 1
        return self.observation


def real_rollouts(
    observation: Observation, sleep: Callable[[float], None], made: list[RealRollouts] | None = None
) -> Callable[..., RealRollouts]:
    """A `make_actuator` for `tune()`: the operator's own actuator, waiting through `sleep`;
    each one made is appended to `made`."""

    def make(rest: KubeRest, body: Any, spec: SpecDeploymentSpec, _: Any) -> RealRollouts:
        meta = body["metadata"]
        inner = for_spec(
            api=rest, name=meta["name"], namespace=meta["namespace"], spec=spec,
            metrics=ScrapeSource(sleep=sleep), sleep=sleep, owner=body,
        )  # fmt: skip
        actuator = RealRollouts(inner, observation)
        if made is not None:
            made.append(actuator)
        return actuator

    return make
