"""Real vLLM (CPU build, tiny local model): SpecPilot against static configs on a moving load.

Contract: one run starts a real vLLM server per policy, all through `LocalEngine` (the actuator
`specpilot run` uses), keeps them all up, and loads one at a time in interleaved slots so that
load from other jobs on the shared CPU lands on every policy alike: for each phase, `--rounds`
rounds of one slot per policy in rotating order. A phase is a concurrency (closed-loop async
users streaming /v1/completions) and a traffic kind: repetitive prompts at temperature 0 (high
n-gram acceptance) or at 0.7 (low); the profile moves concurrency 1 -> 32 -> 1 and back to
greedy. Tokens are counted client-side from vLLM's continuous usage stats as they stream.
Policies: no speculation, ngram at each K given, a hand-set per-batch K table, and SpecPilot
(ControlLoop + LocalEngine: real decisions, real restarts).

SpecPilot's slot is one tick of its loop: load starts, the loop observes a window, decides and,
on a switch, restarts its server inside the slot. Restarts count against it: per phase,
`tokens_per_s_wall` is tokens over load + restart time (restart = zero tokens) and
`tokens_per_s_serving` tokens over load time only; both are reported.

The tuner on this CPU uses a step-time fit measured in the same run on the plain server (step
time = c / tokens per second at c = 1, 4, 16, 32, fitted by the probe's `fit_step_time`), fed
through `StepCost.from_fit` as `specpilot run --step-time-fit` does: the GPU catalog's roofline
says nothing about a CPU.

Run: HF_HUB_OFFLINE=1 .venv/bin/python bench/real_vllm.py   (~40 min on 2 shared cores)
Writes bench/results/real_vllm.json and .md after every phase, so a cut run keeps its part.
"""

from __future__ import annotations

import argparse
import asyncio
import calendar
import json
import os
import platform
import re
import shlex
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from specpilot.operator.loop import ControlLoop, TickRecord
from specpilot.runtime.engines import LaunchSettings, get_adapter
from specpilot.runtime.local_engine import LocalEngine
from specpilot.runtime.probe import fit_step_time
from specpilot.tuner import (
    AcceptanceCurve,
    SpecConfig,
    StepCost,
    StepTimeModel,
    TunerSettings,
    TunerState,
    acceptance_curve,
)

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
MODEL = ROOT / ".cache" / "tiny-models" / "llama"
VLLM_PYTHON = ROOT / ".venvs" / "vllm" / "bin" / "python"
SERVED = "tiny"
MAX_TOKENS = 96
# Repetitive sentences: a greedy random model falls into loops an n-gram drafter predicts.
PROMPTS = tuple(
    f"{s} " * 4
    for s in (
        "the quick brown fox jumps over the lazy dog",
        "a stitch in time saves nine and a penny saved is a penny earned",
        "all work and no play makes jack a dull boy",
        "to be or not to be that is the question",
        "she sells sea shells by the sea shore",
        "the rain in spain stays mainly in the plain",
        "an apple a day keeps the doctor away",
        "what goes up must come down",
    )
)
TABLE = ((1, 4, 3), (5, 16, 1), (17, 256, 0))
"""A hand-set per-batch K table (ngram, max K 3), as REFERENCE.md section 6 measured."""


@dataclass(frozen=True, slots=True)
class Phase:
    name: str
    concurrency: int
    temperature: float


PHASES = (
    Phase("c1 greedy", 1, 0.0),
    Phase("c32 greedy", 32, 0.0),
    Phase("c32 temp0.7", 32, 0.7),
    Phase("c1 temp0.7", 1, 0.7),
    Phase("c1 greedy (again)", 1, 0.0),
)


@dataclass
class TimedEngine(LocalEngine):
    """LocalEngine that records each apply's interval: the engine serves nothing meanwhile."""

    downtime: list[tuple[float, float | None]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def apply(self, config: SpecConfig) -> None:
        with self.lock:
            self.downtime.append((time.time(), None))
        try:
            super().apply(config)
        finally:
            with self.lock:
                start, _ = self.downtime[-1]
                self.downtime[-1] = (start, time.time())

    def down_between(self, t0: float, t1: float) -> float:
        with self.lock:
            spans = [(s, t1 if e is None else e) for s, e in self.downtime]
        return sum(max(0.0, min(e, t1) - max(s, t0)) for s, e in spans)


async def _user(
    client: httpx.AsyncClient, url: str, phase: Phase, user: int, counts: dict[str, int]
) -> None:
    """One closed-loop user: a streamed request, then the next, until cancelled."""
    index = user
    while True:
        body = {
            "model": SERVED,
            "prompt": PROMPTS[index % len(PROMPTS)],
            "max_tokens": MAX_TOKENS,
            "temperature": phase.temperature,
            "ignore_eos": True,  # random weights: an early EOS would shorten requests by chance
            "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        }
        index += 1
        seen = 0
        try:
            async with client.stream("POST", f"{url}/v1/completions", json=body) as response:
                response.raise_for_status()
                async for line in response.aiter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    usage = json.loads(line[6:]).get("usage") or {}
                    total = int(usage.get("completion_tokens") or 0)
                    if total > seen:
                        counts["tokens"] += total - seen
                        seen = total
            counts["requests"] += 1
        except (httpx.HTTPError, json.JSONDecodeError):
            # the server is restarting (SpecPilot) or refused: no tokens, try again shortly
            counts["errors"] += 1
            await asyncio.sleep(0.5)


async def _drive(url: str, phase: Phase, done: Callable[[float], bool]) -> dict[str, int]:
    counts = {"tokens": 0, "requests": 0, "errors": 0}
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    async with httpx.AsyncClient(timeout=httpx.Timeout(120.0), limits=limits) as client:
        users = [
            asyncio.create_task(_user(client, url, phase, u, counts))
            for u in range(phase.concurrency)
        ]
        start = time.time()
        while not done(start):
            await asyncio.sleep(0.2)
        for task in users:  # closing the stream makes vLLM abort the request
            task.cancel()
        await asyncio.gather(*users, return_exceptions=True)
    return counts


@dataclass
class Tally:
    """One policy's load slots in one phase, summed."""

    tokens: int = 0
    wall_s: float = 0.0
    downtime_s: float = 0.0
    requests: int = 0
    errors: int = 0
    slots: int = 0

    def add(self, counts: dict[str, int], wall_s: float, downtime_s: float) -> None:
        self.tokens += counts["tokens"]
        self.requests += counts["requests"]
        self.errors += counts["errors"]
        self.wall_s += wall_s
        self.downtime_s += downtime_s
        self.slots += 1

    def to_dict(self, phase: Phase) -> dict[str, Any]:
        serving = self.wall_s - self.downtime_s
        return {
            "name": phase.name,
            "concurrency": phase.concurrency,
            "temperature": phase.temperature,
            "slots": self.slots,
            "wall_s": round(self.wall_s, 2),
            "downtime_s": round(self.downtime_s, 2),
            "serving_s": round(serving, 2),
            "tokens": self.tokens,
            "requests_done": self.requests,
            "errors": self.errors,
            "tokens_per_s_wall": round(self.tokens / max(self.wall_s, 1e-9), 2),
            "tokens_per_s_serving": round(self.tokens / max(serving, 1e-9), 2),
        }


def slot(engine: TimedEngine, phase: Phase, seconds: float) -> tuple[dict[str, int], float]:
    """Load one static server for `seconds`; (counts, wall seconds)."""
    t0 = time.time()
    counts = asyncio.run(_drive(engine.url, phase, lambda start: time.time() - start >= seconds))
    return counts, time.time() - t0


def pilot_slot(
    engine: TimedEngine, loop: ControlLoop, phase: Phase, lead_s: float
) -> tuple[dict[str, int], float, float, TickRecord | None]:
    """Load SpecPilot's server for one tick: the load starts, `lead_s` later the loop observes
    its window, decides and, on a switch, restarts the engine; the load ends with the tick, so
    a restart's time is inside the slot with no tokens. (counts, wall s, downtime s, record)"""
    records: list[TickRecord] = []
    errors: list[BaseException] = []

    def tick() -> None:
        try:
            time.sleep(lead_s)
            records.append(loop.tick(time.time()))
        except BaseException as exc:  # reported with the results; the bench goes on
            errors.append(exc)

    thread = threading.Thread(target=tick, daemon=True)
    t0 = time.time()
    thread.start()
    counts = asyncio.run(_drive(engine.url, phase, lambda start: not thread.is_alive()))
    t1 = time.time()
    if errors:
        counts["loop_errors"] = len(errors)
    return counts, t1 - t0, engine.down_between(t0, t1), (records[0] if records else None)


def warm_up(url: str) -> None:
    """A few seconds of load after a fresh start, so first-request costs (allocations, caches)
    do not land in the first measured slot. SpecPilot's later restarts get none."""
    warm = Phase("warm-up", 4, 0.0)
    asyncio.run(_drive(url, warm, lambda start: time.time() - start >= 5.0))


def make_engine(port: int, log_dir: Path) -> TimedEngine:
    launch = LaunchSettings(
        model=str(MODEL),
        served_model_name=SERVED,
        host="127.0.0.1",
        port=port,
        extra_args=("--max-model-len", "1024", "--max-num-seqs", "32"),
        sidecar_dir=f"/tmp/specpilot-bench-{port}",
    )
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
    }
    log_dir.mkdir(parents=True, exist_ok=True)
    return TimedEngine(
        engine="vllm",
        program=get_adapter("vllm").program(str(VLLM_PYTHON)),
        launch=launch,
        env=env,
        log_dir=log_dir,
    )


def calibrate(engine: TimedEngine, seconds: float) -> tuple[StepTimeModel, list[list[float]]]:
    """The plain server's step time at several concurrencies (c / tokens per second: one token
    per request per step), fitted as the probe fits its sweep. Greedy traffic; the plain server
    does not care about acceptance."""
    points = []
    for c in (1, 4, 16, 32):
        counts, wall = slot(engine, Phase(f"calibrate c{c}", c, 0.0), seconds)
        points.append((c, 0, c / (counts["tokens"] / wall)))
    fit = fit_step_time(points)
    model = StepTimeModel(
        fixed_s=fit.fixed_s,
        per_token_s=fit.per_token_s,
        per_kv_token_s=fit.per_kv_token_s,
        source="measured on the plain vLLM CPU server in this run (c / tok/s at c = 1,4,16,32)",
    )
    return model, [[c, round(t * 1e3, 3)] for c, _, t in points]


def tick_row(
    record: TickRecord, before: SpecConfig | None, t_zero: float, phase: str
) -> dict[str, Any]:
    obs, decision = record.observation, record.decision
    return {
        "t": round(record.now - t_zero, 1),
        "phase": phase,
        "running_config": before.describe() if before else None,
        "action": decision.action,
        "config": decision.config.describe(),
        "applied": record.applied,
        "error": record.error,
        "regime": decision.regime,
        "batch": None if obs.running_requests is None else round(obs.running_requests, 2),
        "acceptance_length": (
            None if obs.acceptance_length is None else round(obs.acceptance_length, 3)
        ),
        "tokens_per_s": (
            None if obs.generation_tokens_per_s is None else round(obs.generation_tokens_per_s, 1)
        ),
        "predicted_tokens_per_s": (
            None
            if decision.predicted_tokens_per_s is None
            else round(decision.predicted_tokens_per_s, 1)
        ),
        "predicted_gain": round(decision.predicted_gain, 4),
        "reason": decision.reason,
    }


def summarize(policies: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per phase: every policy's tokens/s, best and worst static, SpecPilot's ratios."""
    rows = []
    for i, phase in enumerate(PHASES):
        statics = {
            p["policy"]: p["phases"][i]["tokens_per_s_serving"]
            for p in policies
            if p["kind"] == "static" and p["policy"] != "table" and i < len(p["phases"])
        }
        row: dict[str, Any] = {
            "phase": phase.name,
            "tokens_per_s": {
                p["policy"]: p["phases"][i]["tokens_per_s_serving"]
                for p in policies
                if i < len(p["phases"])
            },
        }
        if statics:
            best = max(statics, key=lambda k: statics[k])
            worst = min(statics, key=lambda k: statics[k])
            row |= {"best_static": best, "worst_static": worst}
            pilot = next((p for p in policies if p["kind"] == "specpilot"), None)
            if pilot is not None and i < len(pilot["phases"]):
                got = pilot["phases"][i]
                row |= {
                    "specpilot_wall": got["tokens_per_s_wall"],
                    "specpilot_serving": got["tokens_per_s_serving"],
                    "specpilot_downtime_s": got["downtime_s"],
                    "ratio_wall": round(got["tokens_per_s_wall"] / statics[best], 3),
                    "ratio_serving": round(got["tokens_per_s_serving"] / statics[best], 3),
                }
        rows.append(row)
    return rows


def write(report: dict[str, Any], out: Path) -> None:
    out.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    out.with_suffix(".md").write_text(markdown(report))


def markdown(report: dict[str, Any]) -> str:
    policies = [p["policy"] for p in report["policies"]]
    lines = [
        "# Real vLLM (CPU build, tiny local model): tokens/s per phase",
        "",
        f"Command: `{report['command']}`  ",
        f"Started {report['started_utc']}, {report['wall_min']:.1f} min wall; {report['machine']}.",
        "",
        "All policies ran in this one run, on the same shared 2-core machine (other agents' jobs "
        "ran beside it), each on its own vLLM server, all servers up at once and loaded one at a "
        "time in interleaved slots: each phase is "
        f"{report['rounds']} rounds of one {report['slot_seconds']:.0f} s slot per policy, "
        "the order rotating, so load from elsewhere spreads over all policies and ratios within "
        "the run compare; absolute figures move with that load. Idle servers burned "
        f"{report.get('idle_cores_all_servers', '?')} cores together. Closed-loop streaming "
        f"clients, {MAX_TOKENS} output tokens per request (ignore_eos), tokens counted as they "
        "stream (vLLM's continuous usage stats).",
        "",
        "SpecPilot's slot is one tick of its loop: load starts, 1 s later the loop observes a "
        "window, decides and, on a switch, restarts its server before the slot ends; `wall` "
        "counts that restart time as zero tokens (tokens over load + restart time), `serving` "
        "excludes it. Best/worst static are over no speculation and the plain ngram Ks; the "
        "hand-set per-batch table is shown beside them. Tokens/s below are per policy's slots "
        "(static: serving = wall).",
        "",
        "| phase | "
        + " | ".join(policies)
        + " | best static | worst static | SpecPilot wall / best | SpecPilot serving / best "
        "| SpecPilot restart s |",
        "|---" * (len(policies) + 6) + "|",
    ]
    for row in report["summary"]:
        cells = [f"{row['tokens_per_s'].get(p, float('nan')):.1f}" for p in policies]
        if "specpilot_wall" in row:
            cells[policies.index("specpilot")] = (
                f"{row['specpilot_wall']:.1f} wall / {row['specpilot_serving']:.1f} serving"
            )
        lines.append(
            f"| {row['phase']} | "
            + " | ".join(cells)
            + f" | {row.get('best_static', '-')} | {row.get('worst_static', '-')} "
            f"| {row.get('ratio_wall', '-')} | {row.get('ratio_serving', '-')} "
            f"| {row.get('specpilot_downtime_s', '-')} |"
        )
    accept = report.get("acceptance_length_from_engine_logs")
    if accept:
        folders = sorted(accept)
        lines += [
            "",
            "Mean acceptance length per phase, from each server's own vLLM log lines "
            "(SpecDecoding metrics, weighted by drafted tokens):",
            "",
            "| phase | " + " | ".join(folders) + " |",
            "|---" * (len(folders) + 1) + "|",
        ]
        for name in [p.name for p in PHASES]:
            cells = [str(accept[f].get(name, "-")) for f in folders]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Starts (s to healthy): "
        + ", ".join(f"{p['policy']} {p['start_s']}" for p in report["policies"]),
    ]
    if report.get("step_time_fit"):
        f = report["step_time_fit"]
        lines += [
            "",
            f"Tuner's step-time fit ({f['source']}): fixed {f['fixed_s'] * 1e3:.2f} ms + "
            f"{f['per_token_s'] * 1e3:.3f} ms/token (knee {f['knee_tokens']:.1f} tokens/step); "
            f"measured points (c, ms/step): {f['points_c_ms']}.",
        ]
    pilot = report.get("specpilot")
    if pilot is not None:
        lines += [
            "",
            f"SpecPilot: {pilot['restarts']} restarts (offset s, duration s): "
            f"{pilot['restart_intervals_s']}; settings `{json.dumps(pilot['settings'])}`.",
            "",
            "## SpecPilot's ticks",
            "",
            "| t s | phase | running | action -> config | applied | batch | acc. len | tok/s "
            "| predicted tok/s | reason |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for t in pilot["ticks"]:
            lines.append(
                f"| {t['t']} | {t['phase']} | {t['running_config']} | {t['action']} -> "
                f"{t['config']} | {t['applied']} | {t['batch']} | {t['acceptance_length']} | "
                f"{t['tokens_per_s']} | {t['predicted_tokens_per_s']} | {t['reason']} |"
            )
    if report.get("notes"):
        lines += ["", "## Notes", "", *report["notes"]]
    return "\n".join(lines) + "\n"


SPEC_LOG = re.compile(
    r"(\d\d-\d\d \d\d:\d\d:\d\d) \[metrics\.py:\d+\] SpecDecoding metrics: Mean acceptance "
    r"length: ([\d.]+).*?Drafted: (\d+) tokens"
)


def acceptance_from_logs(
    log_dir: Path, windows: list[tuple[str, float, float]], year: int
) -> dict[str, dict[str, float | None]]:
    """Mean acceptance length per policy per phase from vLLM's own periodic log lines (each
    covers the ~10 s before it; weighted by drafted tokens), for the static servers, whose
    slots the tuner does not observe. {policy dir: {phase: length or None}}."""
    out: dict[str, dict[str, float | None]] = {}
    for folder in sorted(p for p in log_dir.iterdir() if p.is_dir()):
        sums = {name: [0.0, 0.0] for name, _, _ in windows}
        for log in folder.glob("engine-*.log"):
            for match in SPEC_LOG.finditer(log.read_text(errors="replace")):
                stamp = time.strptime(f"{year}-{match.group(1)}", "%Y-%m-%d %H:%M:%S")
                t = calendar.timegm(stamp) - 5.0  # the middle of the interval it reports
                for name, t0, t1 in windows:
                    if t0 <= t < t1:
                        drafted = float(match.group(3))
                        sums[name][0] += float(match.group(2)) * drafted
                        sums[name][1] += drafted
        out[folder.name] = {name: (round(a / d, 3) if d else None) for name, (a, d) in sums.items()}
    return out


def idle_cpu(engines: list[TimedEngine], seconds: float) -> float:
    """Cores the idle servers burn together (their process groups' CPU time over `seconds`):
    idle servers must not slow the one under load."""

    def cpu() -> float:
        groups = {e._process.pid for e in engines if e._process is not None}
        total = 0
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) in groups:  # field 5 of stat: the process group
                total += int(fields[11]) + int(fields[12])  # utime + stime, in ticks
        return total / os.sysconf("SC_CLK_TCK")

    before = cpu()
    time.sleep(seconds)
    return (cpu() - before) / seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--slot-seconds", type=float, default=11.0, help="one load slot")
    parser.add_argument("--rounds", type=int, default=3, help="slots per policy per phase")
    parser.add_argument("--ks", default="1,3,5", help="ngram Ks of the static configs")
    parser.add_argument("--no-table", action="store_true")
    parser.add_argument("--port", type=int, default=18731)
    parser.add_argument("--min-dwell", type=float, default=20.0)
    parser.add_argument("--restart-budget", type=int, default=12, help="restarts per hour")
    parser.add_argument("--task", default="chat", help="acceptance prior of the tuner")
    parser.add_argument("--calibrate-seconds", type=float, default=8.0)
    parser.add_argument("--gpu-for-drafts", default="H100", help="unused by ngram")
    parser.add_argument("--model-profile", default="llama-3.1-8b", help="unused by ngram")
    parser.add_argument("--out", default=str(RESULTS / "real_vllm"))
    parser.add_argument("--log-dir", default="/tmp/specpilot-real-vllm-bench")
    ns = parser.parse_args()
    ks = [int(k) for k in ns.ks.split(",")]
    out = Path(ns.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    started = time.time()

    def log(message: str) -> None:
        print(f"[{time.time() - started:7.1f}s] {message}", flush=True)

    statics: list[tuple[str, SpecConfig]] = [("none", SpecConfig())]
    statics += [(f"ngram K={k}", SpecConfig(method="ngram", num_speculative_tokens=k)) for k in ks]
    if not ns.no_table:
        statics.append(
            ("table", SpecConfig(method="ngram", num_speculative_tokens=3, schedule=TABLE))
        )
    report: dict[str, Any] = {
        "command": " ".join(["HF_HUB_OFFLINE=1", ".venv/bin/python", *map(shlex.quote, sys.argv)]),
        "started_utc": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(started)),
        "machine": f"{os.cpu_count()} CPUs ({platform.machine()}, shared), vLLM 0.32 CPU build, "
        f"model {MODEL.relative_to(ROOT)}",
        "slot_seconds": ns.slot_seconds,
        "rounds": ns.rounds,
        "max_tokens": MAX_TOKENS,
        "phases": [vars_phase(p) for p in PHASES],
    }
    engines: dict[str, TimedEngine] = {}
    starts: dict[str, float] = {}
    pilot: TimedEngine | None = None
    try:
        for i, (name, config) in enumerate(statics):
            engine = make_engine(ns.port + i, Path(ns.log_dir) / name.replace(" ", "_"))
            engines[name] = engine
            log(f"{name}: starting vLLM with {config.describe()}")
            t0 = time.time()
            engine.apply(config)
            starts[name] = time.time() - t0
            log(f"{name}: healthy after {starts[name]:.1f}s")
            warm_up(engine.url)
        fit, calibration = calibrate(engines["none"], ns.calibrate_seconds)
        report["step_time_fit"] = {
            "fixed_s": fit.fixed_s,
            "per_token_s": fit.per_token_s,
            "per_kv_token_s": fit.per_kv_token_s,
            "knee_tokens": fit.knee_tokens,
            "source": fit.source,
            "points_c_ms": calibration,
        }
        log(f"step-time fit: {report['step_time_fit']}")

        candidates = (
            SpecConfig(),
            *(SpecConfig(method="ngram", num_speculative_tokens=k) for k in ks),
        )
        priors: dict[str, AcceptanceCurve] = {"ngram": acceptance_curve("ngram", ns.task)}
        restart_s = sum(starts.values()) / len(starts)
        settings = TunerSettings(
            candidates=candidates,
            min_dwell_s=ns.min_dwell,
            restart_budget_per_hour=ns.restart_budget,
            restart_downtime_s=restart_s,
        )
        pilot = make_engine(ns.port + len(statics), Path(ns.log_dir) / "specpilot")
        loop = ControlLoop(
            actuator=pilot,
            settings=settings,
            cost=StepCost.from_fit(fit, ns.gpu_for_drafts, ns.model_profile),
            state=TunerState.initial(SpecConfig(), time.time(), priors),
            window_s=ns.slot_seconds - 1.0,
        )
        log("specpilot: starting vLLM with speculation off (the tuner decides from there)")
        t0 = time.time()
        loop.start()
        starts["specpilot"] = time.time() - t0
        log(f"specpilot: healthy after {starts['specpilot']:.1f}s")
        warm_up(pilot.url)
        report["idle_cores_all_servers"] = round(idle_cpu([*engines.values(), pilot], 10.0), 3)
        log(f"idle servers burn {report['idle_cores_all_servers']} cores together")

        names = [name for name, _ in statics] + ["specpilot"]
        tallies = {name: [Tally() for _ in PHASES] for name in names}
        ticks: list[dict[str, Any]] = []
        t_zero = time.time()
        windows: list[tuple[str, float, float]] = []
        for pi, phase in enumerate(PHASES):
            phase_start = time.time()
            for r in range(ns.rounds):
                shift = (pi * ns.rounds + r) % len(names)  # rotate: no policy always goes first
                for name in names[shift:] + names[:shift]:
                    if name == "specpilot":
                        before = pilot.config
                        counts, wall, down, record = pilot_slot(pilot, loop, phase, 1.0)
                        tallies[name][pi].add(counts, wall, down)
                        if record is not None:
                            ticks.append(tick_row(record, before, t_zero, phase.name))
                            log(f"  tick {json.dumps(ticks[-1])}")
                        if counts.get("loop_errors"):
                            log("  loop error in this slot")
                    else:
                        counts, wall = slot(engines[name], phase, ns.slot_seconds)
                        tallies[name][pi].add(counts, wall, 0.0)
            log(
                f"{phase.name}: "
                + ", ".join(
                    f"{n} {tallies[n][pi].to_dict(phase)['tokens_per_s_serving']}" for n in names
                )
            )
            report["policies"] = [
                {
                    "policy": name,
                    "kind": "specpilot" if name == "specpilot" else "static",
                    "config": dict(statics).get(name, SpecConfig()).describe()
                    if name != "specpilot"
                    else "tuned live (ControlLoop + LocalEngine)",
                    "start_s": round(starts[name], 1),
                    "phases": [
                        t.to_dict(p) for t, p in zip(tallies[name], PHASES, strict=True) if t.slots
                    ],
                }
                for name in names
            ]
            report["specpilot"] = {
                "restarts": pilot.restarts - 1,
                "restart_intervals_s": [
                    [round(s - t_zero, 1), None if e is None else round(e - s, 1)]
                    for s, e in pilot.downtime[1:]
                ],
                "settings": {
                    "window_s": ns.slot_seconds - 1.0,
                    "min_dwell_s": ns.min_dwell,
                    "restart_budget_per_hour": ns.restart_budget,
                    "restart_downtime_s": round(restart_s, 1),
                    "expected_dwell_s": settings.expected_dwell_s,
                    "hysteresis": settings.hysteresis,
                    "acceptance_prior_task": ns.task,
                    "candidates": [c.describe() for c in candidates],
                    "initial": "none",
                },
                "ticks": ticks,
            }
            windows.append((phase.name, phase_start, time.time()))
            report["phase_windows_utc"] = [[n, t0, t1] for n, t0, t1 in windows]
            report["acceptance_length_from_engine_logs"] = acceptance_from_logs(
                Path(ns.log_dir), windows, time.gmtime(started).tm_year
            )
            report["summary"] = summarize(report["policies"])
            report["wall_min"] = (time.time() - started) / 60
            write(report, out)
    finally:
        for engine in [*engines.values(), *([pilot] if pilot else [])]:
            engine.stop()
    log(f"done: {out}.json / .md")
    return 0


def vars_phase(phase: Phase) -> dict[str, Any]:
    return {"name": phase.name, "concurrency": phase.concurrency, "temperature": phase.temperature}


if __name__ == "__main__":
    sys.exit(main())
