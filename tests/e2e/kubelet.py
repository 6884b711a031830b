"""A "kubelet" for the end-to-end tests. A TEST DOUBLE: it plays the Deployment and ReplicaSet
controllers and the kubelet of one node, against the test API server, with local processes.

Contract: `Kubelet(api_url, namespace=..., workdir=...)`, started as a context manager, polls
the namespace's Deployments every `poll_s` and, for every pod the Deployment wants, starts a
LOCAL process running exactly that pod's container command and args, writes the Pod object
(labels and annotations from the template plus `pod-template-hash`, an ownerReference to the
Deployment, `status.podIP`), probes the container's readinessProbe (httpGet) and writes the
Pod's Ready condition and container state, and writes the Deployment's status (replicas,
updatedReplicas, readyReplicas, availableReplicas, observedGeneration, the Available and
Progressing conditions, ProgressDeadlineExceeded after `progressDeadlineSeconds`). A template
change rolls out as a RollingUpdate: new pods are started up to maxSurge above the desired
replicas, and old pods are stopped only while availability stays at or above replicas minus
maxUnavailable (defaults 25%/25% as in Kubernetes; SpecPilot's Deployments say 1 and 0); old
pods that are not Ready are stopped at once. A process that exits is reported as terminated
with its exit code, and, where the container says `terminationMessagePolicy:
FallbackToLogsOnError` and the exit is an error, the tail of its log as the message; then
restarted after a doubling back-off, shown as CrashLoopBackOff meanwhile. Deleting a
Deployment stops its pods and deletes them.

What differs from a node, on purpose, each in one place (the node side is tests/e2e/node.py):
- `node.local_program()` maps the container's program to an interpreter on this machine (the image
  is not pulled); the arguments are kept.
- Networking: each pod gets its own loopback address 127.N.x.y as its pod IP, like a pod's own
  network namespace; an engine told to listen on 0.0.0.0 (`--host 0.0.0.0` in the args) is
  given the pod IP instead, so every pod keeps the container port of its template and the
  scrape path (podIP:containerPort) is the real one. Apart from mount paths (below), no
  argument changes.
- Volumes: a configMap volume is written into the pod's folder and emptyDir/other volumes are
  empty folders there; a mount path inside an argument is replaced by that folder (a mount
  namespace would make them the same path). hostPath volumes are the host paths themselves.
- Probes run every poll, without their period or initial delay; there is one node.
- `prometheus_targets`: when set, the Ready pods are written there as Prometheus file_sd
  targets (labels `pod`, `namespace`), standing in for Kubernetes service discovery.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx
from kube.objects import rolling_update_counts

from e2e.node import LocalPod, container_argv, port_number
from specpilot.operator.kube.pod_metrics import pod_target

API_SILENCE_LIMIT_S = 30.0
"""How long the API server may time out every call before the node reports it."""

Obj = dict[str, Any]


class Kubelet:
    """See the module docstring. Use as a context manager; `pods` holds the live local pods."""

    def __init__(
        self,
        api_url: str,
        *,
        namespace: str,
        workdir: Path,
        headers: Mapping[str, str] | None = None,
        poll_s: float = 0.25,
        base_env: Mapping[str, str] | None = None,
        prometheus_targets: Path | None = None,
    ) -> None:
        self.namespace = namespace
        self.workdir = workdir
        self.poll_s = poll_s
        self.base_env = dict(base_env if base_env is not None else os.environ)
        self.prometheus_targets = prometheus_targets
        self.pods: dict[str, LocalPod] = {}
        self.started_pods: list[str] = []
        """Every pod name ever started, in order (tests read restarts from it)."""
        self.errors: list[str] = []
        self._http = httpx.Client(base_url=api_url, headers=dict(headers or {}), timeout=10)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kubelet", daemon=True)
        # A random second octet keeps two test runs on one machine off each other's addresses.
        subnet = random.randrange(100, 250)
        self._ips = iter(f"127.{subnet}.{n // 250}.{n % 250 + 2}" for n in range(60000))
        self._progress: dict[str, tuple[str, int, float]] = {}
        self._written_deployment_status: dict[str, Obj] = {}
        self._counter = 0

    def __enter__(self) -> Kubelet:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        for pod in list(self.pods.values()):
            pod.stop()
        self._http.close()

    def pods_of(self, deployment: str) -> list[LocalPod]:
        return [p for p in self.pods.values() if p.deployment == deployment]

    def _run(self) -> None:
        timing_out_since: float | None = None
        while not self._stop.is_set():
            try:
                self.sync()
                timing_out_since = None
            except httpx.TimeoutException as exc:
                # A kubelet retries a slow API server; a real engine loading beside it on a
                # 2-core host can stall one call past the client's timeout. Only an API
                # server that stays silent is an error.
                now = time.monotonic()
                timing_out_since = timing_out_since if timing_out_since is not None else now
                if now - timing_out_since > API_SILENCE_LIMIT_S:
                    self.errors.append(f"{type(exc).__name__} for {now - timing_out_since:.0f} s")
            except Exception as exc:  # keep the node alive; the test reads `errors`
                self.errors.append(f"{type(exc).__name__}: {exc}")
            self._stop.wait(self.poll_s)

    # -- one pass -------------------------------------------------------------------------
    def sync(self) -> None:
        deployments = self._list("/apis/apps/v1/namespaces/{ns}/deployments")
        wanted = {d["metadata"]["name"] for d in deployments}
        for pod in [p for p in self.pods.values() if p.deployment not in wanted]:
            self._delete_pod(pod)  # garbage collection of a deleted Deployment's pods
        for deployment in deployments:
            self._sync_deployment(deployment)
        if self.prometheus_targets is not None:
            self._write_targets()

    def _sync_deployment(self, deployment: Obj) -> None:
        name = deployment["metadata"]["name"]
        spec = deployment.get("spec") or {}
        replicas = int(spec.get("replicas", 1))
        template = spec.get("template") or {}
        template_hash = _hash(template)
        for pod in self.pods_of(name):
            self._sync_process(pod)
        surge, unavailable = rolling_update_counts(spec, replicas)
        mine = self.pods_of(name)
        new = [p for p in mine if p.template_hash == template_hash]
        while len(new) < replicas and len(mine) < replicas + surge:
            pod = self._create_pod(deployment, template, template_hash)
            new.append(pod)
            mine.append(pod)
        old = [p for p in mine if p.template_hash != template_hash]
        for pod in [p for p in old if not p.ready]:
            self._delete_pod(pod)  # unhealthy old replicas go first, costing no availability
            mine.remove(pod)
        ready = sum(p.ready for p in mine)
        for pod in [p for p in old if p.ready]:
            if ready - 1 < replicas - unavailable:
                break
            self._delete_pod(pod)
            mine.remove(pod)
            ready -= 1
        for pod in sorted(new, key=lambda p: p.ready)[: max(0, len(new) - replicas)]:
            self._delete_pod(pod)  # scaled down: not-Ready ones first
            mine.remove(pod)
            new.remove(pod)
        self._write_deployment_status(deployment, template_hash, mine, new, replicas)

    def _sync_process(self, pod: LocalPod) -> None:
        now = time.monotonic()
        process = pod.process
        if process is not None and process.poll() is not None:
            code = process.returncode
            pod.process = None
            pod.ready = False
            pod.restarts += 1
            pod.last_exit = {"exitCode": code, "reason": "Completed" if code == 0 else "Error"}
            container = pod.pod["spec"]["containers"][0]
            # as the kubelet does: the log tail only where the container asks for it
            if code != 0 and container.get("terminationMessagePolicy") == "FallbackToLogsOnError":
                pod.last_exit["message"] = pod.log.read_text(errors="replace")[-2000:]
            pod.restart_at = now + min(1.0 * 2 ** (pod.restarts - 1), 8.0)
        if pod.process is None and now >= pod.restart_at:
            pod.start()
        if pod.process is not None:
            pod.ready = self._probe(pod)
        self._write_pod_status(pod)

    def _probe(self, pod: LocalPod) -> bool:
        container = pod.pod["spec"]["containers"][0]
        probe = (container.get("readinessProbe") or {}).get("httpGet")
        if probe is None:
            return True
        port = port_number(container, probe.get("port"))
        try:
            response = httpx.get(f"http://{pod.ip}:{port}{probe.get('path', '/')}", timeout=1)
        except httpx.HTTPError:
            return False
        return 200 <= response.status_code < 400

    # -- pods -----------------------------------------------------------------------------
    def _create_pod(self, deployment: Obj, template: Obj, template_hash: str) -> LocalPod:
        meta = template.get("metadata") or {}
        self._counter += 1
        name = f"{deployment['metadata']['name']}-{template_hash}-{self._counter:05d}"
        ip = next(self._ips)
        folder = self.workdir / name
        folder.mkdir(parents=True)
        spec = json.loads(json.dumps(template.get("spec") or {}))
        container = spec["containers"][0]
        argv = self._argv(container, spec, ip, folder)
        env = {**self.base_env}
        for var in container.get("env") or []:
            if "value" in var:
                env[var["name"]] = var["value"]
        pod: Obj = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": self.namespace,
                "labels": {**(meta.get("labels") or {}), "pod-template-hash": template_hash},
                "annotations": dict(meta.get("annotations") or {}),
                "ownerReferences": [
                    {
                        "apiVersion": "apps/v1",
                        "kind": "Deployment",
                        "name": deployment["metadata"]["name"],
                        "uid": deployment["metadata"].get("uid", ""),
                        "controller": True,
                    }
                ],
            },
            "spec": {**spec, "nodeName": "e2e-kubelet"},
        }
        created = self._send("POST", "/api/v1/namespaces/{ns}/pods", pod)
        local = LocalPod(
            name=name,
            deployment=deployment["metadata"]["name"],
            template_hash=template_hash,
            ip=ip,
            pod=created or pod,
            argv=argv,
            env=env,
            folder=folder,
        )
        self.pods[name] = local
        self.started_pods.append(name)
        self._sync_process(local)
        return local

    def _argv(self, container: Obj, spec: Obj, ip: str, folder: Path) -> list[str]:
        return container_argv(container, ip, self._volumes(container, spec, folder))

    def _volumes(self, container: Obj, spec: Obj, folder: Path) -> dict[str, Path]:
        volumes = {v["name"]: v for v in spec.get("volumes") or []}
        mounts: dict[str, Path] = {}
        for mount in container.get("volumeMounts") or []:
            volume = volumes.get(mount["name"], {})
            if "hostPath" in volume:
                continue
            local = folder / "volumes" / mount["name"]
            local.mkdir(parents=True, exist_ok=True)
            if "configMap" in volume:
                found = self._get(
                    "/api/v1/namespaces/{ns}/configmaps/" + volume["configMap"]["name"]
                )
                for key, value in ((found or {}).get("data") or {}).items():
                    (local / key).write_text(value, encoding="utf-8")
            mounts[mount["mountPath"]] = local
        return mounts

    def _delete_pod(self, pod: LocalPod) -> None:
        pod.stop()
        self.pods.pop(pod.name, None)
        with contextlib.suppress(httpx.HTTPError):
            self._http.delete(self._path("/api/v1/namespaces/{ns}/pods/") + pod.name)

    def _write_pod_status(self, pod: LocalPod) -> None:
        status = pod.status()
        if _without_times(status) == _without_times(pod.written_status):
            return
        pod.written_status = status
        written = self._send(
            "PATCH", f"/api/v1/namespaces/{{ns}}/pods/{pod.name}/status", {"status": status}
        )
        if written:
            pod.pod = written

    # -- deployments ----------------------------------------------------------------------
    def _write_deployment_status(
        self,
        deployment: Obj,
        template_hash: str,
        mine: list[LocalPod],
        new: list[LocalPod],
        replicas: int,
    ) -> None:
        name = deployment["metadata"]["name"]
        ready = sum(p.ready for p in mine)
        new_ready = sum(p.ready for p in new)
        done = len(new) == replicas and new_ready == replicas and len(mine) == replicas
        last_hash, last_ready, since = self._progress.get(name, ("", -1, time.monotonic()))
        if (last_hash, last_ready) != (template_hash, new_ready):
            since = time.monotonic()  # progress: the deadline counts from here
        self._progress[name] = (template_hash, new_ready, since)
        deadline = float((deployment.get("spec") or {}).get("progressDeadlineSeconds", 600))
        if done:
            progressing = ("True", "NewReplicaSetAvailable", "rollout complete")
        elif time.monotonic() - since > deadline:
            progressing = ("False", "ProgressDeadlineExceeded", f"no progress in {deadline:.0f}s")
        else:
            progressing = ("True", "ReplicaSetUpdated", f"{new_ready} of {replicas} updated")
        unavailable = rolling_update_counts(deployment.get("spec") or {}, replicas)[1]
        available = "True" if ready >= replicas - unavailable else "False"
        status: Obj = {
            "observedGeneration": deployment["metadata"].get("generation", 1),
            "replicas": len(mine),
            "updatedReplicas": len(new),
            "readyReplicas": ready,
            "availableReplicas": ready,
            "unavailableReplicas": max(0, len(mine) - ready),
            "conditions": [
                {"type": "Available", "status": available, "reason": "MinimumReplicas"},
                {
                    "type": "Progressing",
                    "status": progressing[0],
                    "reason": progressing[1],
                    "message": progressing[2],
                },
            ],
        }
        if self._written_deployment_status.get(name) == status:
            return
        self._send(
            "PATCH",
            f"/apis/apps/v1/namespaces/{{ns}}/deployments/{name}/status",
            {"status": status},
        )
        self._written_deployment_status[name] = status

    def _write_targets(self) -> None:
        groups = []
        for pod in self.pods.values():
            target = pod_target(pod.pod) if pod.ready else None
            if target is None:
                continue
            address = target.url.removeprefix("http://").split("/", 1)[0]
            labels = {"pod": pod.name, "namespace": self.namespace}
            groups.append({"targets": [address], "labels": labels})
        assert self.prometheus_targets is not None
        temporary = self.prometheus_targets.with_suffix(".tmp")
        temporary.write_text(json.dumps(groups))
        temporary.replace(self.prometheus_targets)  # atomic: Prometheus never reads half

    # -- HTTP -----------------------------------------------------------------------------
    def _path(self, template: str) -> str:
        return template.replace("{ns}", self.namespace)

    def _list(self, path: str) -> list[Obj]:
        found = self._get(path)
        return list((found or {}).get("items") or [])

    def _get(self, path: str) -> Obj | None:
        response = self._http.get(self._path(path))
        if response.status_code == 404:
            return None
        response.raise_for_status()
        data: Obj = response.json()
        return data

    def _send(self, method: str, path: str, body: Obj) -> Obj | None:
        headers = {"Content-Type": "application/merge-patch+json"} if method == "PATCH" else {}
        response = self._http.request(method, self._path(path), json=body, headers=headers)
        if response.status_code == 404:
            return None
        if response.status_code >= 400:
            raise RuntimeError(f"{method} {path}: HTTP {response.status_code}: {response.text}")
        data: Obj = response.json()
        return data


def _without_times(status: Obj) -> str:
    return json.dumps(_strip(status), sort_keys=True)


def _strip(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if k != "startedAt"}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def _hash(template: Obj) -> str:
    """What pod-template-hash is for: one value per distinct template (a ReplicaSet's)."""
    return hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:10]
