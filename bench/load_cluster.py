"""The cluster side of the operator load benchmark (bench/operator_load.py). A BENCH DOUBLE.

Two parts, each standing in for what a cluster would run beside the operator:

- `LightKubelet` plays the Deployment controller and the kubelet for every Deployment in the
  mock API server (tests/kube, a MOCK), WITHOUT a process per pod: every poll it gives each
  Deployment `spec.replicas` pods of its current template (labels and annotations copied, an
  ownerReference, Ready at once, pod IP 127.0.0.1), deletes the pods of older templates and
  writes the Deployment's status (observedGeneration, replicas, updated/ready/available, the
  Available and Progressing conditions), so a rollout the operator starts completes on the next
  poll. It writes straight into the server's store on the server's own event loop (no HTTP),
  and times its own CPU there (`cpu_s`), so the server's CPU can be told apart from it. Each
  pod's `prometheus.io/port` and `prometheus.io/path` point at the metrics farm below, at a
  path of its own: the operator's scrape of a pod is one HTTP GET of that pod's own text.
- The metrics farm (`main`: `python bench/load_cluster.py --port-file F`) is ONE aiohttp
  process serving `/pods/<namespace>/<pod>/metrics` for every pod the kubelet registered
  (`POST /register` with the pod's config annotation and a seed). Each pod is its own emulated
  engine, `PodEngine`: the hidden world of its seed (`runtime/emulator/world.py`: acceptance per
  method and task, step times), its config (method, K, schedule) as the operator deployed it,
  and a decode batch that drifts between the memory-bound and the compute-bound regime with
  a period and phase of its own. At each scrape the engine is advanced analytically to now:
  steps at the world's step time for (config, batch), tokens per step by the world's acceptance
  chain at K, finished requests whose latencies follow from the same step time (so Little's law
  over their latency sums gives back the batch). The text is rendered by the emulator's own vLLM
  exposition (`runtime/emulator/exposition.py`: vLLM 0.32's names, types, labels, buckets), fed
  one aggregated step per scrape. So the operator parses real vLLM text whose counters grow,
  whose acceptance follows the config it chose and whose load moves, per object; what is not
  emulated is queueing between requests (no scheduler runs), which the operator's cost does not
  depend on. A full real-time emulator per pod (runtime/emulator/server.py, a process stepping
  every few ms) would cost 200 to 1,000 processes on this 2-core host and measure them instead.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import hashlib
import json
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

Obj = dict[str, Any]
GPU, PROFILE, TASK = "H100", "llama-3.1-8b", "chat"
PROMPT_TOKENS, OUTPUT_TOKENS = 512, 256
CONFIG_ANNOTATION = "specpilot.io/config"


# ----------------------------------------------------------------------------- the farm side


@dataclass
class _FakeCore:
    """What the exposition reads from a core at a step: running requests, waiting, KV usage."""

    running: list[Any]
    waiting: list[Any]
    kv_usage: float


@dataclass
class PodEngine:
    """One pod's emulated engine, advanced analytically at each scrape (module docstring)."""

    config_json: str
    seed: int
    started: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        import random

        from specpilot.runtime.emulator.core import Request
        from specpilot.runtime.emulator.exposition import VllmExposition
        from specpilot.runtime.emulator.world import draw_world
        from specpilot.tuner import SpecConfig

        self.config = SpecConfig.from_dict(json.loads(self.config_json))
        world = draw_world(self.seed)
        self.cost = world.step_cost(GPU, PROFILE)
        self.curve = (
            world.acceptance_curve(self.config.method, TASK) if self.config.speculative else None
        )
        rng = random.Random(self.seed)
        self.low, self.high = rng.choice((1, 2, 4)), rng.choice((32, 64, 128))
        self.period_s, self.phase = rng.uniform(120.0, 600.0), rng.uniform(0.0, 2 * math.pi)
        self.exposition = VllmExposition("model", self.config.max_k)
        self._request = Request
        self._last = time.monotonic()
        self._finished_carry = 0.0
        self._ids = 0
        self._running = [
            Request(request_id=f"run-{i}", task=TASK, prompt_tokens=PROMPT_TOKENS,
                    max_tokens=OUTPUT_TOKENS, arrival_s=0.0)
            for i in range(self.high)
        ]  # fmt: skip

    def batch(self, now: float) -> int:
        """The decode batch now: log-sinusoidal between low and high, per pod."""
        x = 0.5 * (1 + math.sin(2 * math.pi * (now - self.started) / self.period_s + self.phase))
        return max(1, round(self.low * (self.high / self.low) ** x))

    def render(self) -> bytes:
        from specpilot.runtime.emulator.core import StepOutcome

        now = time.monotonic()
        dt, self._last = now - self._last, now
        b = self.batch(now)
        k = self.config.k_for_batch(b) if self.config.speculative else 0
        method = self.config.method if k else "none"
        step_s = self.cost.step_time(
            method=method, decode_batch=b, k=k, prefill_tokens=0,
            kv_tokens=b * (PROMPT_TOKENS + OUTPUT_TOKENS // 2),
        )  # fmt: skip
        per_request = self.curve.expected_length(k) if (self.curve and k) else 1.0
        steps = dt / step_s if step_s > 0 else 0.0
        emitted = steps * b * per_request
        outcome = StepOutcome(
            start_s=now - dt, duration_s=dt, k=k, decode_batch=b,
            prefill_tokens=0, emitted={"agg": round(emitted)},
        )  # fmt: skip
        if k and self.curve is not None:
            drafts = round(steps * b)
            survive, per_pos = 1.0, []
            for position in range(1, k + 1):
                survive *= self.curve.conditional(position)
                per_pos.append(round(drafts * survive))
            outcome.drafts, outcome.draft_tokens = drafts, drafts * k
            outcome.accepted, outcome.accepted_per_position = sum(per_pos), per_pos
        tpot = step_s / per_request if per_request else step_s
        self._finished_carry += emitted / OUTPUT_TOKENS
        finished = int(self._finished_carry)
        self._finished_carry -= finished
        for _ in range(finished):
            self._ids += 1
            decode = tpot * (OUTPUT_TOKENS - 1)
            first = now - decode
            request = self._request(
                request_id=f"r{self._ids}", task=TASK, prompt_tokens=PROMPT_TOKENS,
                max_tokens=OUTPUT_TOKENS, arrival_s=first - 2 * step_s,
                prefilled=PROMPT_TOKENS, generated=OUTPUT_TOKENS,
                first_token_s=first, finished_s=now,
            )  # fmt: skip
            outcome.finished.append(request)
            outcome.prefill_tokens += PROMPT_TOKENS
        kv = min(1.0, b * (PROMPT_TOKENS + OUTPUT_TOKENS // 2) / self.cost.kv_capacity_tokens())
        core = _FakeCore(self._running[:b], [], kv)
        self.exposition.record_step(outcome, core)  # type: ignore[arg-type]
        for request in outcome.finished:
            self.exposition.record_finished(request, False)
        return self.exposition.render()


async def serve_farm(port_file: Path) -> None:
    from aiohttp import web

    engines: dict[str, PodEngine] = {}
    served = {"scrapes": 0, "render_s": 0.0}

    async def register(request: web.Request) -> web.Response:
        body = await request.json()
        for pod in body:
            engines[pod["key"]] = PodEngine(pod["config"], int(pod["seed"]))
        return web.json_response({"engines": len(engines)})

    async def metrics(request: web.Request) -> web.Response:
        key = f"{request.match_info['namespace']}/{request.match_info['pod']}"
        engine = engines.get(key)
        if engine is None:
            return web.Response(status=404, text=f"no pod {key}\n")
        began = time.perf_counter()
        text = engine.render()
        served["scrapes"] += 1
        served["render_s"] += time.perf_counter() - began
        return web.Response(body=text, content_type="text/plain", charset="utf-8")

    async def stats(_: web.Request) -> web.Response:
        return web.json_response({**served, "engines": len(engines)})

    app = web.Application()
    app.router.add_post("/register", register)
    app.router.add_get("/pods/{namespace}/{pod}/metrics", metrics)
    app.router.add_get("/stats", stats)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    port_file.write_text(str(port), encoding="utf-8")
    await asyncio.Event().wait()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="the load benchmark's metrics farm")
    parser.add_argument("--port-file", type=Path, required=True)
    args = parser.parse_args(argv)
    asyncio.run(serve_farm(args.port_file))
    return 0


# ----------------------------------------------------------------------------- the kubelet side


def template_hash(template: Obj) -> str:
    return hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:10]


class LightKubelet:
    """See the module docstring. `start()` / `stop()`; `register(pods)` is called with the new
    pods' registrations after each poll (outside the server's loop)."""

    def __init__(
        self,
        api: Any,
        *,
        farm_port: int,
        seed_of: Callable[[str, str], int],
        register: Callable[[list[Obj]], None],
        poll_s: float = 1.0,
    ) -> None:
        self.api, self.farm_port, self.seed_of = api, farm_port, seed_of
        self.register, self.poll_s = register, poll_s
        self.cpu_s = 0.0
        self.polls = 0
        self.pods_started = 0
        self.errors: list[str] = []
        self.pod_ready_at: dict[tuple[str, str], list[tuple[float, str]]] = {}
        """(namespace, deployment) -> [(monotonic time, template hash)] of each rollout done."""
        self._seen: dict[tuple[str, str], str] = {}
        self._pods: dict[tuple[str, str], set[str]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="light-kubelet", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                new = self.api.call(self._poll, timeout=60)
                if new:
                    self.register(new)
            except Exception as exc:  # a bench must keep going; the errors are reported
                self.errors.append(repr(exc))

    def _poll(self, kube: Any) -> list[Obj]:
        began = time.thread_time()
        try:
            return self._reconcile_all(kube)
        finally:
            self.cpu_s += time.thread_time() - began
            self.polls += 1

    def _reconcile_all(self, kube: Any) -> list[Obj]:
        deployments = kube.kinds["apps", "v1", "deployments"]
        pods = kube.kinds["", "v1", "pods"]
        registrations: list[Obj] = []
        for (group, plural, namespace, name), obj in list(kube.store.items()):
            if (group, plural) != ("apps", "deployments"):
                continue
            meta = obj["metadata"]
            stamp = f"{meta['resourceVersion']}"
            if self._seen.get((namespace, name)) == stamp:
                continue
            spec = obj.get("spec") or {}
            template = spec.get("template") or {}
            wanted = int(spec.get("replicas", 1))
            digest = template_hash(template)
            keep = {f"{name}-{digest}-{i}" for i in range(wanted)}
            mine = self._pods.setdefault((namespace, name), set())
            for pod_name in sorted(mine - keep):
                pod = kube.store.get(("", "pods", namespace, pod_name))
                if pod is not None:
                    kube._delete(pods, pod, orphan=False)
                mine.discard(pod_name)
            for pod_name in sorted(keep - mine):
                registrations.append(self._start_pod(kube, pods, obj, template, pod_name))
                mine.add(pod_name)
            status = {
                "observedGeneration": meta.get("generation", 1),
                "replicas": wanted, "updatedReplicas": wanted,
                "readyReplicas": wanted, "availableReplicas": wanted,
                "conditions": [
                    {"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable"},
                    {"type": "Progressing", "status": "True",
                     "reason": "NewReplicaSetAvailable"},
                ],
            }  # fmt: skip
            fresh = kube.store[(group, plural, namespace, name)]
            written = kube._update(
                deployments, fresh, lambda o, s=status: {**o, "status": s}, "status"
            )
            self._seen[(namespace, name)] = written["metadata"]["resourceVersion"]
            self.pod_ready_at.setdefault((namespace, name), []).append((time.monotonic(), digest))
        return registrations

    def _start_pod(self, kube: Any, kind: Any, owner: Obj, template: Obj, name: str) -> Obj:
        meta, namespace = owner["metadata"], owner["metadata"]["namespace"]
        tmeta = template.get("metadata") or {}
        annotations = {
            **(tmeta.get("annotations") or {}),
            "prometheus.io/port": str(self.farm_port),
            "prometheus.io/path": f"/pods/{namespace}/{name}/metrics",
        }
        body: Obj = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name, "namespace": namespace,
                "labels": copy.deepcopy(tmeta.get("labels") or {}), "annotations": annotations,
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment",
                                     "name": meta["name"], "uid": meta["uid"]}],
            },
            "spec": copy.deepcopy(template.get("spec") or {}),
        }  # fmt: skip
        created = kube.put_object(kind, namespace, body)
        status = {
            "phase": "Running", "podIP": "127.0.0.1",
            "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [{"name": "engine", "ready": True,
                                   "state": {"running": {}}, "restartCount": 0}],
        }  # fmt: skip
        kube._update(kind, created, lambda o: {**o, "status": status}, "status")
        self.pods_started += 1
        config = annotations.get(CONFIG_ANNOTATION) or "{}"
        return {
            "key": f"{namespace}/{name}",
            "config": config,
            "seed": self.seed_of(namespace, meta["name"]),
        }


if __name__ == "__main__":
    raise SystemExit(main())
