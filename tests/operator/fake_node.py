"""A node for the operator's fault tests: plays the Deployment controller and the kubelet
against the mock API server (tests/kube, a MOCK), in the test's process. A TEST DOUBLE.

Contract: `FakeNode(api, namespace=..., world=...)`, started as a context manager, runs one
pass every `poll_s` on its own thread. A pass lists the Deployments and, for each, rolls its
pods towards the template as a RollingUpdate does (new pods up to maxSurge above replicas;
old pods stopped only while the Ready count stays at or above replicas minus maxUnavailable;
old pods that are not Ready go first), writes the Pods (template labels and annotations,
`status.podIP`, Ready condition) and the Deployment's status (observedGeneration, replicas,
updated, ready, available). A new pod is Ready `start_passes` passes after it was made, unless
its config crash-loops (`crash`, a predicate on the config): then it reports CrashLoopBackOff
with the engine's last words and is never Ready. Deleting a Deployment deletes its pods.

Engines: every pod serves vLLM's /metrics on its own loopback address (127.N.x.y, the
container port), in the test's process, from `World`: counters grow at the world's rates with
wall time, so a window of any length measures the same rates (no speed assumption).

Watching (checked on EVERY pass, i.e. along the way, not only at the end), into `violations`:
- a Deployment with replicas >= 2 whose Ready pods drop to zero once it had one, or that is
  deleted;
- more than one rollout in flight: pods of more than two configs at once (main and canary),
  or a template changed while its last rollout was unfinished to anything but the config
  that ran before it (a rollback).
`on_pass(node)` runs at the start of every pass (a test kills its operator there, at a rollout
step it chose); `steps` says which steps this pass sees (`rollout_steps`).
"""

from __future__ import annotations

import contextlib
import hashlib
import http.server
import json
import random
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx
from kube.apiserver import ApiServer
from kube.objects import rolling_update_counts

Obj = dict[str, Any]
CONFIG = "specpilot.io/config"
MERGE = {"Content-Type": "application/merge-patch+json"}


@dataclass
class World:
    """The traffic every engine sees: a batch, a queue and tokens/s per pod; acceptance
    length for a speculative config."""

    batch: float = 1.0
    waiting: float = 0.0
    tokens_per_s: float = 150.0
    acceptance_length: float = 2.5

    def become(self, other: World) -> None:
        """Take another world's traffic (the pods' servers keep reading this object)."""
        self.batch, self.waiting = other.batch, other.waiting
        self.tokens_per_s, self.acceptance_length = other.tokens_per_s, other.acceptance_length

    def metrics(self, config: Mapping[str, Any] | None, seconds: float) -> str:
        k = int((config or {}).get("num_speculative_tokens") or 0)
        method = (config or {}).get("method")
        tokens = self.tokens_per_s * seconds
        lines = [
            "# TYPE vllm:generation_tokens counter",
            f"vllm:generation_tokens_total {tokens:.3f}",
            "# TYPE vllm:num_requests_running gauge",
            f"vllm:num_requests_running {self.batch}",
            "# TYPE vllm:num_requests_waiting gauge",
            f"vllm:num_requests_waiting {self.waiting}",
            "# TYPE vllm:kv_cache_usage_perc gauge",
            f"vllm:kv_cache_usage_perc {min(0.95, self.batch / 300):.3f}",
        ]
        if method not in (None, "none") and k > 0:
            drafts = tokens / self.acceptance_length
            lines += [
                "# TYPE vllm:spec_decode_num_drafts counter",
                f"vllm:spec_decode_num_drafts_total {drafts:.3f}",
                "# TYPE vllm:spec_decode_num_draft_tokens counter",
                f"vllm:spec_decode_num_draft_tokens_total {drafts * k:.3f}",
                "# TYPE vllm:spec_decode_num_accepted_tokens counter",
                f"vllm:spec_decode_num_accepted_tokens_total "
                f"{drafts * (self.acceptance_length - 1):.3f}",
            ]
        return "\n".join(lines) + "\n"


@dataclass(eq=False)
class Pod:
    name: str
    deployment: str
    template_hash: str
    config: Any
    ip: str
    port: int
    born: int
    """The pass it was made in."""
    server: http.server.ThreadingHTTPServer | None = None
    ready: bool = False
    crashing: bool = False


@dataclass
class Rollout:
    """What the node knows of one Deployment's template history."""

    stable: Any = None
    """The config whose rollout last completed."""
    target: Any = None
    before: Any = None
    """The config that ran before `target` was set."""
    ever_ready: bool = False
    replicas: int = 1


class FakeNode:
    def __init__(
        self,
        api: ApiServer,
        *,
        namespace: str = "default",
        world: World | None = None,
        poll_s: float = 0.1,
        start_passes: int = 3,
        crash: Callable[[Any], bool] = lambda _: False,
    ) -> None:
        self.api, self.namespace, self.poll_s = api, namespace, poll_s
        self.world = world or World()
        self.start_passes, self.crash = start_passes, crash
        self.on_pass: Callable[[FakeNode], None] = lambda _: None
        self.pods: dict[str, Pod] = {}
        self.rollouts: dict[str, Rollout] = {}
        self.violations: list[str] = []
        self.errors: list[str] = []
        self.min_ready: dict[str, int] = {}
        self.scrapes: dict[str, int] = {}
        """/metrics requests served, per Deployment."""
        self.passes = 0
        self._http = httpx.Client(base_url=api.url, timeout=10)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fake-node", daemon=True)
        subnet = random.Random(id(self)).randrange(100, 250)
        self._ips = iter(f"127.{subnet}.{n // 250}.{n % 250 + 2}" for n in range(60000))
        self._count = 0

    def __enter__(self) -> FakeNode:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        for pod in list(self.pods.values()):
            self._stop_server(pod)
        self._http.close()

    def pods_of(self, deployment: str) -> list[Pod]:
        return [p for p in list(self.pods.values()) if p.deployment == deployment]

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.on_pass(self)
                self.sync()
            except Exception as exc:  # keep the node alive; the test reads `errors`
                self.errors.append(f"{type(exc).__name__}: {exc}")
            self.passes += 1
            self._stop.wait(self.poll_s)

    # -- one pass ---------------------------------------------------------------------------
    def sync(self) -> None:
        deployments = self._items(f"/apis/apps/v1/namespaces/{self.namespace}/deployments")
        wanted = {d["metadata"]["name"] for d in deployments}
        for pod in [p for p in self.pods.values() if p.deployment not in wanted]:
            self._delete(pod)
        for deployment in deployments:
            self._sync(deployment)
        self._watch(deployments)

    def _sync(self, deployment: Obj) -> None:
        name = deployment["metadata"]["name"]
        spec = deployment.get("spec") or {}
        replicas = int(spec.get("replicas", 1))
        template = spec.get("template") or {}
        template_hash = _hash(template)
        config = _config(template)
        self._track_template(name, config)
        for pod in self.pods_of(name):
            if not pod.ready and not pod.crashing and self.passes - pod.born >= self.start_passes:
                pod.ready = True
                self._write_pod_status(pod)
        surge, unavailable = rolling_update_counts(spec, replicas)
        mine = self.pods_of(name)
        new = [p for p in mine if p.template_hash == template_hash]
        while len(new) < replicas and len(mine) < replicas + surge:
            pod = self._create(deployment, template, template_hash, config)
            new.append(pod)
            mine.append(pod)
        old = [p for p in mine if p.template_hash != template_hash]
        for pod in [p for p in old if not p.ready]:
            self._delete(pod)
            mine.remove(pod)
        ready = sum(p.ready for p in mine)
        for pod in [p for p in old if p.ready]:
            if ready - 1 < replicas - unavailable:
                break
            self._delete(pod)
            mine.remove(pod)
            ready -= 1
        for pod in sorted(new, key=lambda p: p.ready)[: max(0, len(new) - replicas)]:
            self._delete(pod)
            mine.remove(pod)
            new.remove(pod)
        new_ready = sum(p.ready for p in new)
        status = {
            "observedGeneration": deployment["metadata"].get("generation", 1),
            "replicas": len(mine), "updatedReplicas": len(new),
            "readyReplicas": ready, "availableReplicas": ready,
        }  # fmt: skip
        if len(new) == replicas == new_ready == len(mine):
            self.rollouts[name].stable = config
        if (deployment.get("status") or {}) != status:
            self._patch(f"/apis/apps/v1/namespaces/{self.namespace}/deployments/{name}", status)

    def _track_template(self, name: str, config: Any) -> None:
        rollout = self.rollouts.setdefault(name, Rollout(stable=None, target=config))
        if config == rollout.target:
            return
        unfinished = rollout.stable != rollout.target
        if unfinished and config != rollout.before:
            self.violations.append(
                f"{name}: template changed to {config} while the rollout to {rollout.target} "
                f"(from {rollout.before}) was unfinished: two rollouts in flight"
            )
        rollout.before, rollout.target = rollout.target, config

    def _watch(self, deployments: list[Obj]) -> None:
        configs = {json.dumps(p.config, sort_keys=True) for p in self.pods.values()}
        if len(configs) > 2:
            self.violations.append(f"pass {self.passes}: pods of {len(configs)} configs at once")
        for deployment in deployments:
            name = deployment["metadata"]["name"]
            replicas = int((deployment.get("spec") or {}).get("replicas", 1))
            ready = sum(p.ready for p in self.pods_of(name))
            rollout = self.rollouts[name]
            rollout.replicas = replicas
            if rollout.ever_ready and replicas >= 2:
                self.min_ready[name] = min(self.min_ready.get(name, ready), ready)
                if ready == 0:
                    self.violations.append(f"pass {self.passes}: {name} has no Ready pod")
            rollout.ever_ready |= ready > 0
        names = {d["metadata"]["name"] for d in deployments}
        for name, rollout in list(self.rollouts.items()):
            if name not in names:  # deleted: a canary may be; a serving 2-replica one never
                if rollout.ever_ready and rollout.replicas >= 2:
                    self.violations.append(f"pass {self.passes}: Deployment {name} was deleted")
                del self.rollouts[name]

    # -- pods -------------------------------------------------------------------------------
    def _create(self, deployment: Obj, template: Obj, template_hash: str, config: Any) -> Pod:
        meta = template.get("metadata") or {}
        container = ((template.get("spec") or {}).get("containers") or [{}])[0]
        port = int((container.get("ports") or [{"containerPort": 8000}])[0]["containerPort"])
        self._count += 1
        name = f"{deployment['metadata']['name']}-{template_hash}-{self._count:05d}"
        pod = Pod(name, deployment["metadata"]["name"], template_hash, config,
                  next(self._ips), port, self.passes, crashing=self.crash(config))  # fmt: skip
        body = {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": name, "namespace": self.namespace,
                "labels": {**(meta.get("labels") or {}), "pod-template-hash": template_hash},
                "annotations": dict(meta.get("annotations") or {}),
            },
            "spec": {"containers": [container]},
        }  # fmt: skip
        created = self._http.post(f"/api/v1/namespaces/{self.namespace}/pods", json=body)
        created.raise_for_status()
        if not pod.crashing:
            pod.server = self._serve(pod)
        self.pods[name] = pod
        self._write_pod_status(pod)
        return pod

    def _serve(self, pod: Pod) -> http.server.ThreadingHTTPServer:
        world, clock, scrapes = self.world, _Clock(), self.scrapes

        class Metrics(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                scrapes[pod.deployment] = scrapes.get(pod.deployment, 0) + 1
                body = world.metrics(pod.config, clock.seconds()).encode()
                self.send_response(200 if self.path.startswith("/metrics") else 404)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_: Any) -> None:
                pass

        server = http.server.ThreadingHTTPServer((pod.ip, pod.port), Metrics)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return server

    def _write_pod_status(self, pod: Pod) -> None:
        ready = "True" if pod.ready else "False"
        container: Obj = {"name": "engine", "ready": pod.ready, "restartCount": 0}
        if pod.crashing:
            last = {"exitCode": 1, "message": "engine: out of memory loading the draft"}
            container.update(restartCount=3, lastState={"terminated": last},
                             state={"waiting": {"reason": "CrashLoopBackOff"}})  # fmt: skip
        else:
            container["state"] = {"running": {}}
        status = {
            "phase": "Running", "podIP": pod.ip,
            "conditions": [{"type": "Ready", "status": ready}],
            "containerStatuses": [container],
        }  # fmt: skip
        self._patch(f"/api/v1/namespaces/{self.namespace}/pods/{pod.name}", status)

    def _delete(self, pod: Pod) -> None:
        self.pods.pop(pod.name, None)
        self._stop_server(pod)
        self._http.delete(f"/api/v1/namespaces/{self.namespace}/pods/{pod.name}")

    @staticmethod
    def _stop_server(pod: Pod) -> None:
        if pod.server is not None:
            pod.server.shutdown()
            pod.server.server_close()
            pod.server = None

    # -- HTTP -------------------------------------------------------------------------------
    def _items(self, path: str) -> list[Obj]:
        response = self._http.get(path)
        response.raise_for_status()
        return list(response.json().get("items") or [])

    def _patch(self, path: str, status: Obj) -> None:
        with contextlib.suppress(httpx.HTTPError):
            self._http.patch(f"{path}/status", json={"status": status}, headers=MERGE)


@dataclass
class _Clock:
    start: float = field(default_factory=time.monotonic)

    def seconds(self) -> float:
        return time.monotonic() - self.start


def _config(template: Obj) -> Any:
    raw = ((template.get("metadata") or {}).get("annotations") or {}).get(CONFIG, "null")
    return json.loads(raw)


def _hash(template: Obj) -> str:
    return hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:10]
