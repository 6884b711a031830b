"""Load benchmark: ONE real `specpilot operator` process with N SpecDeployments, each with its own
emulated engine metrics, against the mock Kubernetes API server (tests/kube, a MOCK).

    .venv/bin/python bench/operator_load.py --objects 200
    .venv/bin/python bench/operator_load.py --objects 500 1000 --steady-s 180

Per size, a fresh cluster: the mock API server (in this process, on its own thread), the
light kubelet and the metrics farm (bench/load_cluster.py: one process serving a distinct
emulated vLLM /metrics per pod; its docstring says why that is faithful), and the operator as
the chart runs it (`specpilot operator --standalone`, no --verbose), under the chart's RBAC.
Then, all bounded by `--max-run-s`:
1. create: N SpecDeployments POSTed back to back (as `kubectl apply -f dir/` would); the
   create-to-Deployment latency is from each POST's answer to the first poll (every
   `POLL_S`) that finds its Deployment;
2. steady: `--steady-s` seconds of tuning (every object ticks each
   spec.tuning.intervalSeconds; a tick observes a window of 0.8 x interval scraping its pod
   every 2 s, decides, writes status and an Event);
3. edit: every spec edited back to back (extraArgs); the edit-to-rollout latency is from each
   PATCH's answer to the first poll that finds the edit in the Deployment's pod template (the
   operator's part), and to the kubelet's rollout of it (new pod Ready; the double adds up to
   one poll of 1 s);
4. tail: `--tail-s` seconds more, then the operator's own /metrics are read:
   `specpilot_tick_duration_seconds` (a tick's work, its waits left out; p50/p95 are
   interpolated inside the histogram's buckets, as PromQL's histogram_quantile does) and
   `specpilot_decisions_total` per object (ticks per object: an object with none stalled).
The operator's CPU (utime + stime from /proc/PID/stat, in cores = CPU seconds / wall seconds)
and memory (VmRSS every second, VmHWM at the end) are sampled all along, and so are the mock
API server's own thread (its CPU minus the kubelet's, which runs on that thread too), the
farm's process and the host's load average. Results merge into `--out` (JSON, per size) and
`--md`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # the mock API server: tests/kube
sys.path.insert(0, str(REPO / "bench"))
Obj = dict[str, Any]
SPD_PATH = "/apis/specpilot.io/v1alpha1/namespaces/{ns}/specdeployments"
MERGE = {"Content-Type": "application/merge-patch+json"}
POLL_S = 0.5
CLK_TCK = os.sysconf("SC_CLK_TCK")
TARGETS = {"tick_p95_s": 1.0, "cpu_avg_cores": 0.5, "peak_rss_mib": 300.0}


def spd(name: str, namespace: str, interval_s: int) -> Obj:
    return {
        "apiVersion": "specpilot.io/v1alpha1",
        "kind": "SpecDeployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "engine": "vllm",
            "model": "/models/llama-3.1-8b",
            "gpu": {"type": "H100", "modelProfile": "llama-3.1-8b"},
            "speculative": {"candidates": [{"method": "ngram", "maxK": 5}]},
            "tuning": {"intervalSeconds": interval_s},
        },
    }


# ----------------------------------------------------------------------------- sampling


def proc_cpu_s(stat_path: str) -> float:
    """utime + stime of a process or thread, in seconds."""
    text = Path(stat_path).read_text()
    fields = text[text.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def proc_status_kib(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


@dataclass
class Sampler:
    """Every second: the operator's CPU and RSS, the API server thread's and the farm's CPU,
    the load average; `mark(phase)` splits the run into phases."""

    operator_pid: int
    farm_pid: int
    api_stat: str
    kubelet_cpu: Callable[[], float]
    samples: list[Obj] = field(default_factory=list)
    marks: list[tuple[str, float]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def sample(self) -> Obj:
        return {
            "t": time.monotonic(),
            "operator_cpu_s": proc_cpu_s(f"/proc/{self.operator_pid}/stat"),
            "operator_rss_kib": proc_status_kib(self.operator_pid, "VmRSS"),
            "api_cpu_s": proc_cpu_s(self.api_stat),
            "kubelet_cpu_s": self.kubelet_cpu(),
            "farm_cpu_s": proc_cpu_s(f"/proc/{self.farm_pid}/stat"),
            "load1": os.getloadavg()[0],
        }

    def run(self) -> None:
        while not self._stop.wait(1.0):
            with contextlib.suppress(OSError, ValueError):
                self.samples.append(self.sample())

    def mark(self, phase: str) -> None:
        self.marks.append((phase, time.monotonic()))
        with contextlib.suppress(OSError, ValueError):
            self.samples.append(self.sample())

    def stop(self) -> None:
        self._stop.set()

    def between(self, start: float, end: float) -> Obj:
        inside = [s for s in self.samples if start <= s["t"] <= end]
        if len(inside) < 2:
            return {}
        first, last = inside[0], inside[-1]
        wall = last["t"] - first["t"]

        def cores(key: str) -> float:
            return round((last[key] - first[key]) / wall, 3)

        api = (last["api_cpu_s"] - first["api_cpu_s"]) - (
            last["kubelet_cpu_s"] - first["kubelet_cpu_s"]
        )
        return {
            "wall_s": round(wall, 1),
            "operator_cpu_cores": cores("operator_cpu_s"),
            "operator_rss_mib_max": round(max(s["operator_rss_kib"] for s in inside) / 1024, 1),
            "apiserver_cpu_cores": round(api / wall, 3),
            "kubelet_cpu_cores": cores("kubelet_cpu_s"),
            "farm_cpu_cores": cores("farm_cpu_s"),
            "load1_max": max(s["load1"] for s in inside),
            "load1_mean": round(statistics.fmean(s["load1"] for s in inside), 2),
        }

    def phases(self) -> dict[str, Obj]:
        out: dict[str, Obj] = {}
        for (name, start), (_, end) in zip(self.marks, self.marks[1:], strict=False):
            out[name] = self.between(start, end)
        if self.marks:
            out["whole"] = self.between(self.marks[0][1], self.marks[-1][1])
        return out


# ----------------------------------------------------------------------------- figures


def percentiles(values: Sequence[float]) -> Obj:
    if not values:
        return {"n": 0}
    ordered = sorted(values)

    def pick(q: float) -> float:
        # numpy's linear percentile
        pos = (len(ordered) - 1) * q
        low = int(pos)
        high = min(low + 1, len(ordered) - 1)
        return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)

    return {
        "n": len(ordered),
        "p50_s": round(pick(0.5), 3),
        "p95_s": round(pick(0.95), 3),
        "max_s": round(ordered[-1], 3),
    }


SAMPLE = re.compile(r"^([a-zA-Z_:][\w:]*)(\{[^}]*\})?\s+(\S+)$")
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse_exposition(text: str) -> list[tuple[str, dict[str, str], float]]:
    out = []
    for line in text.splitlines():
        match = SAMPLE.match(line)
        if match and not line.startswith("#"):
            labels = dict(LABEL.findall(match.group(2) or ""))
            out.append((match.group(1), labels, float(match.group(3))))
    return out


def histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """PromQL's histogram_quantile over cumulative (le, count) pairs."""
    buckets = sorted(buckets)
    total = buckets[-1][1] if buckets else 0.0
    if total <= 0:
        return None
    rank = q * total
    previous_le, previous_count = 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if le == float("inf"):
                return previous_le
            width = count - previous_count
            share = (rank - previous_count) / width if width else 0.0
            return previous_le + (le - previous_le) * share
        previous_le, previous_count = le, count
    return previous_le


def operator_figures(text: str, names: list[str]) -> Obj:
    samples = parse_exposition(text)
    buckets = [
        (float(labels["le"]), value)
        for name, labels, value in samples
        if name == "specpilot_tick_duration_seconds_bucket"
    ]
    count = next((v for n, _, v in samples if n == "specpilot_tick_duration_seconds_count"), 0.0)
    total = next((v for n, _, v in samples if n == "specpilot_tick_duration_seconds_sum"), 0.0)
    per_object: dict[str, float] = dict.fromkeys(names, 0.0)
    actions: dict[str, float] = {}
    for name, labels, value in samples:
        if name == "specpilot_decisions_total" and labels.get("name") in per_object:
            per_object[labels["name"]] += value
            actions[labels["action"]] = actions.get(labels["action"], 0.0) + value
    ticks = sorted(per_object.values())
    p50, p95 = histogram_quantile(0.5, buckets), histogram_quantile(0.95, buckets)
    return {
        "tick_count": int(count),
        "tick_mean_s": round(total / count, 4) if count else None,
        "tick_p50_s": round(p50, 4) if p50 is not None else None,
        "tick_p95_s": round(p95, 4) if p95 is not None else None,
        "tick_buckets": [[le, int(c)] for le, c in sorted(buckets)],
        "decisions_by_action": {k: int(v) for k, v in sorted(actions.items())},
        "ticks_per_object": {
            "min": int(ticks[0]) if ticks else 0,
            "median": statistics.median(ticks) if ticks else 0,
            "max": int(ticks[-1]) if ticks else 0,
            "objects_without_a_tick": sum(1 for t in ticks if t == 0),
        },
    }


# ----------------------------------------------------------------------------- one run


def git_commit() -> str:
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=False
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"],
        cwd=REPO, capture_output=True, text=True, check=False,
    ).stdout.splitlines()  # fmt: skip
    return head + (f" (tree dirty: {len(dirty)} tracked paths modified)" if dirty else "")


class Deadline(RuntimeError):
    pass


@dataclass
class Run:
    objects: int
    seed: int
    interval_s: int
    steady_s: float
    tail_s: float
    max_run_s: float
    namespace: str = "default"
    log: Callable[[str], None] = print

    def __post_init__(self) -> None:
        self.deadline = time.monotonic() + self.max_run_s
        self.names = [f"load-{i:04d}" for i in range(self.objects)]
        self.partial: Obj = {}
        """What the run measured before its edit phase, reported if a later step fails."""

    def seed_of(self, namespace: str, name: str) -> int:
        index = self.names.index(name) if name in self.names else 0
        return self.seed * 100_003 + index + 1

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def go(self, workdir: Path) -> Obj:
        from kube.apiserver import running_apiserver
        from kube.chart import operator_rules
        from kube.operator_process import free_port, stop
        from load_cluster import LightKubelet

        result: Obj = {"objects": self.objects}
        with contextlib.ExitStack() as stack:
            api = stack.enter_context(
                running_apiserver(workdir, operator_rules=operator_rules(workdir))
            )
            api_tid = api.call(lambda _: threading.get_native_id())
            farm_port_file = workdir / "farm.port"
            farm = subprocess.Popen(
                [sys.executable, str(REPO / "bench/load_cluster.py"),
                 "--port-file", str(farm_port_file)],
                stdout=(workdir / "farm.log").open("wb"), stderr=subprocess.STDOUT,
            )  # fmt: skip
            stack.callback(stop, farm, 5.0)
            while not farm_port_file.exists() or not farm_port_file.read_text():
                self._check(farm.poll() is None, "the farm exited")
                time.sleep(0.2)
            farm_url = f"http://127.0.0.1:{farm_port_file.read_text()}"
            farm_http = stack.enter_context(httpx.Client(base_url=farm_url, timeout=30))

            def register(pods: list[Obj]) -> None:
                farm_http.post("/register", json=pods).raise_for_status()

            kubelet = LightKubelet(
                api, farm_port=int(farm_port_file.read_text()), seed_of=self.seed_of,
                register=register,
            )  # fmt: skip
            kubelet.start()
            stack.callback(kubelet.stop)
            liveness, metrics_port = free_port(), free_port()
            command = [
                sys.executable, "-m", "specpilot.operator.app.cli", "operator", "--standalone",
                "--liveness-port", str(liveness), "--metrics-port", str(metrics_port),
            ]  # fmt: skip
            result["operator_command"] = shlex.join(["specpilot", *command[3:]])
            operator_log = workdir / "operator.log"
            operator = subprocess.Popen(
                command, env=api.operator_env(), stdout=operator_log.open("wb"),
                stderr=subprocess.STDOUT,
            )  # fmt: skip
            stack.callback(stop, operator, 30.0)
            http = stack.enter_context(httpx.Client(base_url=api.url, timeout=60))
            metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
            self._wait(lambda: _answers(metrics_url), 120, "the operator's metrics endpoint")
            sampler = Sampler(
                operator.pid, farm.pid, f"/proc/{os.getpid()}/task/{api_tid}/stat",
                lambda: kubelet.cpu_s,
            )  # fmt: skip
            threading.Thread(target=sampler.run, daemon=True).start()
            stack.callback(sampler.stop)
            sampler.mark("idle")
            time.sleep(5.0)
            result["load_average_at_start"] = os.getloadavg()

            # 1. create
            sampler.mark("create")
            created: dict[str, float] = {}
            path = SPD_PATH.format(ns=self.namespace)
            for name in self.names:
                answer = http.post(path, json=spd(name, self.namespace, self.interval_s))
                self._check(answer.status_code == 201, f"create {name}: {answer.text[:300]}")
                created[name] = time.monotonic()
            seen = self._poll_until(api, created, _has_deployment, "every Deployment")
            result["create_to_deployment"] = {
                **percentiles([seen[n] - created[n] for n in seen]),
                "handled": len(seen), "of": self.objects,
                "create_burst_s": round(max(created.values()) - min(created.values()), 1),
            }  # fmt: skip
            self.log(f"{self.objects}: created, {result['create_to_deployment']}")

            # 2. steady
            sampler.mark("steady")
            self._sleep(self.steady_s, operator)
            steady_text = httpx.get(metrics_url, timeout=60).text
            result["steady_operator"] = operator_figures(steady_text, self.names)

            # 3. edit (partial results are kept on disk before it: a later step past the
            # bound loses only itself)
            self.partial = dict(result)
            sampler.mark("edit")
            edited: dict[str, float] = {}
            edit = {"spec": {"extraArgs": ["--max-model-len", "4096"]}}
            for name in self.names:
                if self.left() < 120:  # keep the run's bound: edit fewer, say so below
                    break
                answer = http.patch(f"{path}/{name}", json=edit, headers=MERGE)
                self._check(answer.status_code == 200, f"edit {name}: {answer.text[:300]}")
                edited[name] = time.monotonic()
            applied = self._poll_until(api, edited, _has_edit, "the edit on every Deployment")
            result["edit_to_template"] = {
                **percentiles([applied[n] - edited[n] for n in applied]),
                "handled": len(applied), "of": self.objects,
                "edit_burst_s": round(max(edited.values()) - min(edited.values()), 1),
            }  # fmt: skip
            rolled = [
                next((t for t, _ in kubelet.pod_ready_at.get((self.namespace, n), [])
                      if t >= applied[n] - POLL_S), None) for n in applied
            ]  # fmt: skip
            rollout = [t - edited[n] for t, n in zip(rolled, applied, strict=True) if t]
            result["edit_to_rolled_out"] = percentiles(rollout)
            self.log(f"{self.objects}: edited, {result['edit_to_template']}")

            # 4. tail
            sampler.mark("tail")
            self._sleep(self.tail_s, operator)
            text = httpx.get(metrics_url, timeout=60).text
            result["operator"] = operator_figures(text, self.names)
            result["operator_peak_rss_mib"] = round(
                proc_status_kib(operator.pid, "VmHWM") / 1024, 1
            )
            sampler.mark("end")
            result["load_average_at_end"] = os.getloadavg()
            result["phases"] = sampler.phases()
            farm_stats = farm_http.get("/stats").json()
            result["farm"] = {
                "engines": farm_stats["engines"], "scrapes": farm_stats["scrapes"],
                "render_s": round(farm_stats["render_s"], 1),
            }  # fmt: skip
            result["kubelet"] = {
                "pods_started": kubelet.pods_started, "polls": kubelet.polls,
                "errors": kubelet.errors[:5],
            }  # fmt: skip
            result["operator_alive_at_end"] = operator.poll() is None
            result["api_denials"] = api.denials()[:10]
            log_text = operator_log.read_text(errors="replace")
            result["operator_log_tracebacks"] = log_text.count("Traceback")
            result["store_objects_at_end"] = api.call(lambda kube: len(kube.store))
        return result

    # --- helpers

    def _check(self, ok: bool, what: str) -> None:
        if not ok:
            raise RuntimeError(what)

    def _sleep(self, seconds: float, operator: subprocess.Popen[bytes]) -> None:
        end = time.monotonic() + min(seconds, max(0.0, self.left() - 60))
        while time.monotonic() < end:
            self._check(operator.poll() is None, "the operator exited")
            time.sleep(1.0)

    def _wait(self, check: Callable[[], bool], timeout: float, what: str) -> None:
        end = time.monotonic() + min(timeout, self.left())
        while not check():
            if time.monotonic() > end:
                raise Deadline(f"timed out waiting for {what}")
            time.sleep(POLL_S)

    def _poll_until(
        self, api: Any, since: dict[str, float], found: Callable[[Any, str, str], bool], what: str
    ) -> dict[str, float]:
        """Poll the store every POLL_S; the first poll that finds each name's condition. Stops
        at the run's deadline less a minute (for the tail), keeping what it found."""
        seen: dict[str, float] = {}
        end = self.deadline - 90
        while len(seen) < len(since) and time.monotonic() < end:
            pending = [n for n in since if n not in seen]
            hits = api.call(
                lambda kube, pending=pending: [n for n in pending if found(kube, self.namespace, n)]
            )
            now = time.monotonic()
            for name in hits:
                seen[name] = now
            time.sleep(POLL_S)
        if len(seen) < len(since):
            self.log(f"{what}: {len(since) - len(seen)} of {len(since)} never seen")
        return seen


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def _has_deployment(kube: Any, namespace: str, name: str) -> bool:
    return ("apps", "deployments", namespace, name) in kube.store


def _has_edit(kube: Any, namespace: str, name: str) -> bool:
    deployment = kube.store.get(("apps", "deployments", namespace, name))
    if deployment is None:
        return False
    containers = deployment["spec"]["template"]["spec"]["containers"]
    return "4096" in (containers[0].get("args") or [])


# ----------------------------------------------------------------------------- report


def verdict(result: Obj) -> Obj:
    whole = result.get("phases", {}).get("whole", {})
    tick = result.get("operator", {})
    handled = (
        result.get("create_to_deployment", {}).get("handled") == result["objects"]
        and result.get("edit_to_template", {}).get("handled") == result["objects"]
        and tick.get("ticks_per_object", {}).get("objects_without_a_tick", 1) == 0
    )
    p95 = tick.get("tick_p95_s")
    cpu = whole.get("operator_cpu_cores")
    rss = result.get("operator_peak_rss_mib")
    return {
        "every_object_handled": handled,
        "tick_p95_under_1s": p95 is not None and p95 < TARGETS["tick_p95_s"],
        "cpu_under_half_a_core": cpu is not None and cpu < TARGETS["cpu_avg_cores"],
        "rss_under_300_mib": rss is not None and rss < TARGETS["peak_rss_mib"],
    }


def markdown(report: Obj) -> str:
    lines = [
        "# Operator load benchmark",
        "",
        "Written by `bench/operator_load.py` (its docstring is the method). One real "
        "`specpilot operator` process against the MOCK API server (tests/kube), the light "
        "kubelet and the metrics farm of `bench/load_cluster.py`: every SpecDeployment's pod "
        "serves its own emulated vLLM /metrics. This 2-core host was shared with other work "
        "during the runs (load averages below): every figure is pessimistic.",
        "",
    ]
    for key in sorted(report["runs"], key=int):
        run = report["runs"][key]
        whole = run.get("phases", {}).get("whole", {})
        steady = run.get("phases", {}).get("steady", {})
        op = run.get("operator", {})
        c2d, e2t = run.get("create_to_deployment", {}), run.get("edit_to_template", {})
        if "error" in run:
            lines += [
                f"## {key} SpecDeployments: the run did not finish",
                "",
                f"- commit `{run['commit']}`; command `{run['command']}`; seed {run['seed']}; "
                f"intervalSeconds {run['interval_s']}; started {run['started_utc']}",
                f"- ended by: {run['error']}",
                f"- create-to-Deployment p50 / p95 / max (s): {c2d.get('p50_s')} / "
                f"{c2d.get('p95_s')} / {c2d.get('max_s')}; handled {c2d.get('handled')} of "
                f"{run['objects']} (burst of creates took {c2d.get('create_burst_s')} s)",
                *([f"- {run['note']}"] if run.get("note") else []),
                "",
            ]
            continue
        lines += [
            f"## {key} SpecDeployments",
            "",
            f"- commit `{run['commit']}`; command `{run['command']}`; seed {run['seed']}; "
            f"intervalSeconds {run['interval_s']}; started {run['started_utc']}",
            f"- load average (1 min) at start {run['load_average_at_start'][0]:.2f}, "
            f"mean over the run {whole.get('load1_mean')}, max {whole.get('load1_max')}",
            "",
            "| figure | value | target | met |",
            "|---|---|---|---|",
            f"| objects handled: Deployment created / edit reached / ticked | "
            f"{c2d.get('handled')} / {e2t.get('handled')} / "
            f"{run['objects'] - op.get('ticks_per_object', {}).get('objects_without_a_tick', 0)}"
            f" of {run['objects']} | all | {run['verdict']['every_object_handled']} |",
            f"| create-to-Deployment p50 / p95 / max (s) | {c2d.get('p50_s')} / "
            f"{c2d.get('p95_s')} / {c2d.get('max_s')} (burst of {run['objects']} creates "
            f"took {c2d.get('create_burst_s')} s) | | |",
            f"| spec-edit-to-template p50 / p95 / max (s) | {e2t.get('p50_s')} / "
            f"{e2t.get('p95_s')} / {e2t.get('max_s')} | | |",
            f"| spec-edit-to-rolled-out p95 (s, kubelet double included) | "
            f"{run.get('edit_to_rolled_out', {}).get('p95_s')} | | |",
            f"| tuning tick work p50 / p95 (s) | {op.get('tick_p50_s')} / {op.get('tick_p95_s')}"
            f" ({op.get('tick_count')} ticks) | p95 < 1 s | {run['verdict']['tick_p95_under_1s']}"
            " |",
            f"| ticks per object min / median / max | "
            f"{op.get('ticks_per_object', {}).get('min')} / "
            f"{op.get('ticks_per_object', {}).get('median')} / "
            f"{op.get('ticks_per_object', {}).get('max')} | >= 1 | |",
            f"| operator CPU, whole run / steady phase (cores) | "
            f"{whole.get('operator_cpu_cores')} / {steady.get('operator_cpu_cores')} | < 0.5 | "
            f"{run['verdict']['cpu_under_half_a_core']} |",
            f"| operator peak RSS (MiB, VmHWM) | {run.get('operator_peak_rss_mib')} | < 300 | "
            f"{run['verdict']['rss_under_300_mib']} |",
            f"| mock API server thread CPU, whole run (cores) | "
            f"{whole.get('apiserver_cpu_cores')} | | |",
            f"| metrics farm CPU (cores) / scrapes served | {whole.get('farm_cpu_cores')} / "
            f"{run.get('farm', {}).get('scrapes')} | | |",
            "",
        ]
    lines += report.get("summary", [])
    history = report.get("history", [])
    if history:
        lines += [
            "## Earlier runs: what the benchmark found and what was fixed",
            "",
            "| objects | commit | what the operator had then | tick work p95 (s) | "
            "CPU whole run (cores) | peak RSS (MiB) | edit-to-template p95 (s) | load1 mean |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for old in history:
            whole = old.get("phases", {}).get("whole", {})
            lines.append(
                f"| {old['objects']} | `{old['commit'][:7]}` | {old.get('what', '')} | "
                f"{old.get('operator', {}).get('tick_p95_s')} | {whole.get('operator_cpu_cores')}"
                f" | {old.get('operator_peak_rss_mib')} | "
                f"{old.get('edit_to_template', {}).get('p95_s')} | {whole.get('load1_mean')} |"
            )
        lines.append("")
    lines += NOTES
    return "\n".join(lines) + "\n"


OPERATOR_ENV = ("MALLOC_ARENA_MAX",)
"""Environment variables that change the operator's behaviour, recorded with the command."""

NOTES = [
    "## Reading the figures",
    "",
    "- **Tick work** is `specpilot_tick_duration_seconds`: a tick's wall time with its waits "
    "in `sleep` (the pauses between scrape rounds, rollout polling) left out. It includes the "
    "scrapes themselves, so when the operator's one Python process is saturated (every "
    "scrape queued on the GIL and on a CPU shared with the host's other work), the scrapes "
    "fill the observation window (0.8 x intervalSeconds) and tick work approaches it: that "
    "is how saturation shows, and why the 1 s target reads as missed by far rather than "
    "by a little.",
    "- **Spec-edit latency** includes the per-object lock (operator/kube/tuning_daemon.py "
    "`object_lock`) that a tick holds from its observation window to its status write: an "
    "edit to an object in the middle of a tick waits for that tick's window to end, and "
    "kopf's 16 handler threads blocked that way delay the edits queued behind them.",
    "- The mock API server runs in the benchmark's process on one thread; its CPU is "
    "measured on that thread less the light kubelet's (which runs there too). The metrics "
    "farm is its own process. Both share the host's 2 cores with the operator, so they "
    "take CPU the operator would have on a cluster node of its own.",
    "",
    "## Past one operator",
    "",
    "kopf runs one active operator per peering: a second replica (`--peering`, the chart's "
    "default) is a standby, not a second worker. Scaling out means sharding the "
    "SpecDeployments between operators, each with its own peering, as kopf users do with "
    "`--namespace` (and label filters on handlers) and controller-runtime users with a "
    "namespaced cache or a label selector. What SpecPilot supports today: `specpilot operator "
    "--namespace NS` (repeatable) watches only those namespaces, and the chart renders it "
    "with `operator.allNamespaces=false` and `operator.namespaces=[...]` (Roles and "
    "RoleBindings per namespace; `crds.enabled=false` for a second release), so N releases "
    "over disjoint namespace sets are N independent operators. There is no label-selector "
    "sharding (the CLI and chart have no selector flag), so one namespace is never split "
    "between operators; and a release cannot see another's namespace list, so whoever "
    "installs them keeps the sets disjoint.",
]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, nargs="+", default=[200])
    parser.add_argument("--interval-s", type=int, default=30)
    parser.add_argument("--steady-s", type=float, default=240.0)
    parser.add_argument("--tail-s", type=float, default=60.0)
    parser.add_argument("--max-run-s", type=float, default=900.0, help="per size, a hard bound")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=REPO / "bench/results/operator_load.json")
    parser.add_argument("--md", type=Path, default=REPO / "bench/results/operator_load.md")
    args = parser.parse_args(argv)

    def terminated(signum: int, _: Any) -> None:  # an outer `timeout`: write what was measured
        raise RuntimeError(f"terminated by signal {signum}")

    signal.signal(signal.SIGTERM, terminated)
    report: Obj = json.loads(args.out.read_text()) if args.out.exists() else {"runs": {}}
    command = shlex.join([".venv/bin/python", "bench/operator_load.py", *(argv or sys.argv[1:])])
    for name in OPERATOR_ENV:  # the operator inherits them: part of what was measured
        if name in os.environ:
            command = f"{name}={shlex.quote(os.environ[name])} {command}"
    for objects in args.objects:
        run = Run(objects, args.seed, args.interval_s, args.steady_s, args.tail_s, args.max_run_s)
        started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        commit = git_commit()
        with tempfile.TemporaryDirectory(prefix="operator-load-") as tmp:
            try:
                result = run.go(Path(tmp))
            except Exception as exc:  # recorded, not hidden: the size bent or broke
                result = {**run.partial, "objects": objects, "error": repr(exc)}
                print(f"{objects}: {exc!r}", file=sys.stderr)
                with contextlib.suppress(OSError):
                    result["operator_log_tail"] = (Path(tmp) / "operator.log").read_text()[-3000:]
        result.update(
            commit=commit, command=command, seed=args.seed, started_utc=started,
            interval_s=args.interval_s, steady_s=args.steady_s, cpus=os.cpu_count(),
        )  # fmt: skip
        result.setdefault("load_average_at_start", os.getloadavg())
        result["verdict"] = verdict(result)
        report["runs"][str(objects)] = result
        args.out.write_text(json.dumps(report, indent=2) + "\n")
        args.md.write_text(markdown(report))
        print(json.dumps({k: result.get(k) for k in ("objects", "verdict")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
