"""The real-engine bench's harness, shared by bench/real_vllm.py and bench/real_sglang.py.

Contract: `run(plan, ns, log)` starts one real server per static policy and one for SpecPilot
(none with `--switch shared`), all through `LocalEngine` (the actuator `specpilot run` uses),
keeps them all up and loads one at a time in interleaved slots, so that load from other jobs on
the shared CPU lands on every policy alike: for each phase, `ns.rounds` rounds of one slot per
policy in rotating order. A phase is a concurrency (closed-loop async users streaming
/v1/completions) and a temperature. Tokens are counted client-side from the engine's continuous
usage stats as they stream.
SpecPilot's slot is one tick of its loop (`pilot_slot`); its switches count against it:
a restart's time as time without tokens, a surge's (`--switch surge`: the new server starts
beside the serving one, as the operator's default rollout does on a spare GPU) as time the old
config serves while the new one starts on the same cores; a pool's (`--switch pool`: one
server per candidate, all up before the load, `LocalEngine.standby_ports`) as a move of the
clients, with the pool's servers' idle CPU on the shared cores and their memory held; with
`--switch shared` SpecPilot has no server of its own and moves its clients between the static
policies' servers (`SharedServers`), so it and a static policy running one config are measured
on one server.

What differs per engine comes in the `Plan`: how to make a server, the phases, the calibration
concurrencies, an optional per-slot meter of the server's own counters, an optional hook after
each phase, and the Markdown renderer. The report is written after every phase, so a cut run
keeps its part.

The one-server probes (bench/scrape_cost.py, bench/engine_batch.py, bench/sglang_threads.py)
share its load slots, their report's head (`probe_head`), and for those that compare server
variants their options and per-variant loop (`probe_variant`); `cpu_seconds_by_process` reads
what each of a server's processes used from /proc.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import os
import platform
import random
import shlex
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, get_args

import httpx

from specpilot.operator.loop import ControlLoop, TickRecord
from specpilot.runtime.engines import get_adapter
from specpilot.runtime.local_engine import EngineStartError, LocalEngine
from specpilot.runtime.probe import fit_step_time
from specpilot.runtime.scrape import ScrapeError
from specpilot.tuner import (
    AcceptanceCurve,
    Observation,
    SpecConfig,
    StepCost,
    StepTimeModel,
    TunerSettings,
    TunerState,
    acceptance_curve,
)
from specpilot.tuner.policy.settings import Objective

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
MODEL = ROOT / ".cache" / "tiny-models" / "llama"
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
WARM_UP = (4, 5.0)
"""(concurrency, seconds) of greedy load after a fresh start."""
PREFILL_PROBE = (8, 40, 16)
"""(short prompt tokens, long prompt tokens, requests of each) of the prefill calibration: a
few dozen extra tokens, the scale of a verify step's drafts rather than of a long prompt."""
PROBE_TOKEN_IDS = (100, 1000)
"""Token ids the prefill probe draws from (inside any model's vocabulary)."""
TWIN = "none (twin)"
"""A second no-speculation server: how far two servers of one config differ per phase on this
host (the noise a per-phase comparison must clear); shown, not ranked among the statics."""
SWITCHES = ("surge", "restart", "pool", "shared")
"""How SpecPilot's server changes config (`--switch`): `LocalEngine.surge_port`, a restart,
`LocalEngine.standby_ports` (a warm pool: one server per candidate, started before the load),
or `SharedServers` (the static policies' own servers, one per candidate)."""
WARM_SWITCHES = ("pool", "shared")
"""Switches onto servers that were up and warmed before the load."""
FREE_SWITCHES = ("surge", *WARM_SWITCHES)
"""Switches that lose no serving: the tuner prices them at 0 s, and so does `switching_bound`."""
OBJECTIVES: tuple[str, ...] = get_args(Objective)
UNRANKED = ("table", TWIN)
"""Static policies shown beside the others but not counted as best or worst static."""


def with_twin(statics: Sequence[tuple[str, SpecConfig]]) -> list[tuple[str, SpecConfig]]:
    """The static policies and the no-speculation twin that measures the servers' noise."""
    return [*statics, (TWIN, SpecConfig())]


@dataclass(frozen=True, slots=True)
class Phase:
    name: str
    concurrency: int
    temperature: float


@dataclass
class TimedEngine(LocalEngine):
    """LocalEngine that records each apply's interval (`switches`) and, where the engine served
    nothing meanwhile (a restart, not a surge beside the serving engine), its `downtime`."""

    downtime: list[tuple[float, float | None]] = field(default_factory=list)
    switches: list[tuple[float, float | None]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def apply(self, config: SpecConfig) -> None:
        spans = [self.switches] if self.keeps_serving else [self.switches, self.downtime]
        with self.lock:
            for span in spans:
                span.append((time.time(), None))
        try:
            super().apply(config)
        finally:
            with self.lock:
                for span in spans:
                    span[-1] = (span[-1][0], time.time())

    def down_between(self, t0: float, t1: float) -> float:
        with self.lock:
            spans = [(s, t1 if e is None else e) for s, e in self.downtime]
        return sum(max(0.0, min(e, t1) - max(s, t0)) for s, e in spans)


@dataclass
class SharedServers:
    """SpecPilot's actuator for `--switch shared`: its clients move between the static
    policies' own servers, one per candidate config, instead of servers of its own. SpecPilot
    running a config and that config's static policy are then measured on one server, so any
    difference between two servers of one config leaves their comparison (what remains is the
    spread between one server's slots: `slot_noise`). Slots never overlap, so a server serves
    one policy at a time, and the loop's window lies inside SpecPilot's slot: it reads only its
    own traffic. A switch is a move of the clients, as in a pool; the servers' processes belong
    to the static policies (started, stopped and counted there)."""

    servers: Mapping[SpecConfig, TimedEngine]
    config: SpecConfig | None = None
    restarts: int = 0
    switches: list[tuple[float, float | None]] = field(default_factory=list)
    downtime: list[tuple[float, float | None]] = field(default_factory=list)
    """Always empty: a move loses no serving."""
    keeps_serving: bool = True
    process_groups: tuple[int, ...] = ()

    @classmethod
    def of(
        cls, engines: Mapping[str, TimedEngine], statics: Sequence[tuple[str, SpecConfig]]
    ) -> SharedServers:
        """The first static server of each config (the twin repeats `none`'s config)."""
        servers: dict[SpecConfig, TimedEngine] = {}
        for name, config in statics:
            servers.setdefault(config, engines[name])
        return cls(servers=servers)

    @property
    def url(self) -> str:
        assert self.config is not None, "apply a config first"
        return self.servers[self.config].url

    def apply(self, config: SpecConfig) -> None:
        if config not in self.servers:
            raise EngineStartError(f"no static server runs {config.describe()}")
        now = time.time()
        self.switches.append((now, now))
        self.config = config
        self.restarts += 1

    def observe(self, window_s: float) -> Observation:
        assert self.config is not None, "apply a config first"
        return self.servers[self.config].observe(window_s)

    def down_between(self, t0: float, t1: float) -> float:
        return 0.0

    def stop(self) -> None:
        """Nothing of its own to stop."""


Pilot = TimedEngine | SharedServers
"""SpecPilot's server: its own (restart, surge, pool) or the statics' (shared)."""

Meter = Callable[[Pilot], dict[str, float]]
"""Cumulative counters read from a server (e.g. its /metrics); slots sum their deltas."""


async def _user(
    client: httpx.AsyncClient,
    url_of: Callable[[], str],
    phase: Phase,
    user: int,
    counts: dict[str, int],
) -> None:
    """One closed-loop user: a streamed request, then the next, until cancelled. The server's
    URL is read per request: a surge switch moves SpecPilot's engine to another port."""
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
            url = url_of()
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


async def _drive(
    url_of: Callable[[], str], phase: Phase, done: Callable[[float], bool]
) -> dict[str, int]:
    counts = {"tokens": 0, "requests": 0, "errors": 0}
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    async with httpx.AsyncClient(timeout=httpx.Timeout(120.0), limits=limits) as client:
        users = [
            asyncio.create_task(_user(client, url_of, phase, u, counts))
            for u in range(phase.concurrency)
        ]
        start = time.time()
        while not done(start):
            await asyncio.sleep(0.2)
        for task in users:  # closing the stream makes the engine abort the request
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
    counters: dict[str, float] = field(default_factory=dict)
    """Summed deltas of the server's own counters over the metered slots (a `Meter`)."""
    metered_slots: int = 0
    slot_tokens_per_s: list[float] = field(default_factory=list)
    """Each slot's tokens over its wall time: the spread of one server between its slots."""
    tick_cpu_ms: int | None = None
    """SpecPilot's: its ticks' CPU in the client's process, summed."""

    def add(self, counts: dict[str, int], wall_s: float, downtime_s: float) -> None:
        self.slot_tokens_per_s.append(round(counts["tokens"] / max(wall_s, 1e-9), 1))
        if "tick_cpu_ms" in counts:
            self.tick_cpu_ms = (self.tick_cpu_ms or 0) + counts["tick_cpu_ms"]
        self.tokens += counts["tokens"]
        self.requests += counts["requests"]
        self.errors += counts["errors"]
        self.wall_s += wall_s
        self.downtime_s += downtime_s
        self.slots += 1

    def add_counters(self, deltas: Mapping[str, float]) -> None:
        for name, value in deltas.items():
            self.counters[name] = self.counters.get(name, 0.0) + value
        self.metered_slots += 1

    def to_dict(self, phase: Phase) -> dict[str, Any]:
        serving = self.wall_s - self.downtime_s
        out = {
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
        out["slot_tokens_per_s"] = self.slot_tokens_per_s
        if self.tick_cpu_ms is not None:
            out["tick_cpu_ms"] = self.tick_cpu_ms
        if self.metered_slots:
            out["server_counters"] = {k: round(v, 3) for k, v in sorted(self.counters.items())}
            out["metered_slots"] = self.metered_slots
        return out


def slot(engine: TimedEngine, phase: Phase, seconds: float) -> tuple[dict[str, int], float]:
    """Load one static server for `seconds`; (counts, wall seconds)."""
    t0 = time.time()
    counts = asyncio.run(
        _drive(lambda: engine.url, phase, lambda start: time.time() - start >= seconds)
    )
    return counts, time.time() - t0


def pilot_slot(
    engine: Pilot, loop: ControlLoop, phase: Phase, lead_s: float
) -> tuple[dict[str, int], float, float, TickRecord | None]:
    """Load SpecPilot's server for one tick: the load starts, `lead_s` later the loop observes
    its window, decides and, on a switch, restarts the engine (or starts the new one beside it:
    a surge); the load ends with the tick, so a restart's time is inside the slot with no
    tokens, and a surge's with the old config serving. (counts, wall s, downtime s, record)"""
    records: list[TickRecord] = []
    errors: list[BaseException] = []
    cpu_s: list[float] = []

    def tick() -> None:
        try:
            time.sleep(lead_s)
            started = time.thread_time()
            records.append(loop.tick(time.time()))
            cpu_s.append(time.thread_time() - started)
        except BaseException as exc:  # reported with the results; the bench goes on
            errors.append(exc)

    thread = threading.Thread(target=tick, daemon=True)
    t0 = time.time()
    thread.start()
    counts = asyncio.run(_drive(lambda: engine.url, phase, lambda start: not thread.is_alive()))
    t1 = time.time()
    if errors:
        counts["loop_errors"] = len(errors)
    if cpu_s:
        # the tick's own CPU (parsing its window's scrapes, deciding), taken from the cores
        # and the interpreter the slot's clients share
        counts["tick_cpu_ms"] = round(cpu_s[0] * 1e3)
    return counts, t1 - t0, engine.down_between(t0, t1), (records[0] if records else None)


def metered(
    meter: Meter | None, engine: Pilot, run_slot: Callable[[], Any]
) -> tuple[Any, dict[str, float] | None]:
    """Run a slot between two reads of the server's counters; (slot's result, deltas), the
    deltas None without a meter, when the server restarted within (its counters reset) or when
    either read failed (a server that died or is between a failed switch and its rollback: the
    slot's tokens still count, its counters are unknown)."""
    if meter is None:
        return run_slot(), None
    restarts = engine.restarts
    try:
        before: dict[str, float] | None = meter(engine)
    except ScrapeError:
        before = None
    result = run_slot()
    if before is None or engine.restarts != restarts:
        return result, None
    try:
        after = meter(engine)
    except ScrapeError:
        return result, None
    return result, {k: after.get(k, 0.0) - v for k, v in before.items()}


def warm_up(url: str) -> None:
    """A few seconds of load after a fresh start, so first-request costs (allocations, caches)
    do not land in the first measured slot. SpecPilot's later restarts get none."""
    users, seconds = WARM_UP
    warm = Phase("warm-up", users, 0.0)
    asyncio.run(_drive(lambda: url, warm, lambda start: time.time() - start >= seconds))


def calibrate(
    engine: TimedEngine, seconds: float, concurrencies: Sequence[int], source: str
) -> tuple[StepTimeModel, list[list[float]], dict[str, float]]:
    """The plain server's step time at several concurrencies (c / tokens per second: one token
    per request per step), fitted as the probe fits its sweep, and the price of a token a
    sequence adds beyond its first from the prefill probe (`prefill_slope`). Greedy traffic;
    the plain server does not care about acceptance. (model, points (c, ms), prefill probe)"""
    points = []
    for c in concurrencies:
        counts, wall = slot(engine, Phase(f"calibrate c{c}", c, 0.0), seconds)
        points.append((c, 0, c / (counts["tokens"] / wall)))
    fit = fit_step_time(points)
    per_extra, probe = prefill_slope(engine.url)
    model = StepTimeModel(
        fixed_s=fit.fixed_s,
        per_token_s=fit.per_token_s,
        per_kv_token_s=fit.per_kv_token_s,
        per_extra_token_s=per_extra,
        source=source,
    )
    return model, [[c, round(t * 1e3, 3)] for c, _, t in points], probe


def prefill_slope(
    url: str,
    probe: tuple[int, int, int] = PREFILL_PROBE,
    seed: int = 0,
    *,
    transport: httpx.BaseTransport | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> tuple[float, dict[str, float]]:
    """Seconds per prompt token from one-token completions of two prompt lengths, alternated,
    one at a time: the difference of the median request times over the difference in length,
    so that what every request pays (HTTP, scheduling, the one sampled token) cancels. Each
    prompt is fresh random token ids, so prefix caching cannot serve any of it. Prefill stands in
    for a verify step's drafts (more positions of a sequence already in the step), and
    underprices them on the vLLM CPU server: 0.009 ms (results/real_vllm_calibrate_only.json at
    a3ab795) where ngram K=5's steps at concurrency 1 greedy implied 0.461 (results/real_vllm.md
    at 1f96d7e: 1364.08 tokens/s at acceptance 4.912 against no speculation's 772.32, the
    difference of step times over 5 drafts). (the
    slope, clamped at 0; the medians in ms for the report)"""
    short, long, requests = probe
    rng = random.Random(seed)
    times: dict[int, list[float]] = {short: [], long: []}
    with httpx.Client(timeout=120.0, transport=transport) as client:
        for _ in range(requests):
            for length in (short, long):
                body = {
                    "model": SERVED,
                    "prompt": [rng.randrange(*PROBE_TOKEN_IDS) for _ in range(length)],
                    "max_tokens": 1,
                    "temperature": 0.0,
                }
                t0 = clock()
                client.post(f"{url}/v1/completions", json=body).raise_for_status()
                times[length].append(clock() - t0)
    medians = {length: statistics.median(taken) for length, taken in times.items()}
    slope = max(0.0, (medians[long] - medians[short]) / (long - short))
    return slope, {
        "short_tokens": short,
        "long_tokens": long,
        "requests_each": requests,
        "short_median_ms": round(medians[short] * 1e3, 3),
        "long_median_ms": round(medians[long] * 1e3, 3),
    }


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
        "batch_gauge": (
            None if obs.running_requests_gauge is None else round(obs.running_requests_gauge, 2)
        ),
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


def summarize(policies: list[dict[str, Any]], phases: Sequence[Phase]) -> list[dict[str, Any]]:
    """Per phase: every policy's tokens/s, best and worst static, SpecPilot's ratios, and the
    servers' noise: how far the no-speculation twin's tokens/s is from the first server's
    (|twin / none - 1|), against which SpecPilot's wall ratio to the best static is judged.
    Best and worst are over the plain statics (`UNRANKED` ones are shown, not ranked)."""
    rows = []
    for i, phase in enumerate(phases):
        statics = {
            p["policy"]: p["phases"][i]["tokens_per_s_serving"]
            for p in policies
            if p["kind"] == "static" and p["policy"] not in UNRANKED and i < len(p["phases"])
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
        twin, none = row["tokens_per_s"].get(TWIN), statics.get("none")
        if twin is not None and none:
            row["server_noise"] = round(abs(twin / none - 1.0), 3)
            if "ratio_wall" in row:
                row["specpilot_within_noise"] = row["ratio_wall"] >= 1.0 - row["server_noise"]
        slots = [
            p["phases"][i].get("slot_tokens_per_s") or []
            for p in policies
            if p["kind"] == "static" and i < len(p["phases"])
        ]
        noise = slot_noise(slots)
        if noise is not None:
            row |= noise
            if "ratio_wall" in row:
                row["specpilot_within_slot_noise"] = row["ratio_wall"] >= 1.0 - noise["slot_noise"]
        rows.append(row)
    return rows


def slot_noise(slots: Sequence[Sequence[float]]) -> dict[str, float] | None:
    """How far two policies' means over a phase's slots differ by chance, from the slots of
    each static server (each served one config throughout, so its slots differ only by the
    host): the pooled coefficient of variation between one server's slots, and twice the
    standard error of the ratio of two means of that many slots (`slot_noise`). None with
    fewer than two slots per server."""
    spreads = [statistics.stdev(s) / statistics.fmean(s) for s in slots if len(s) >= 2]
    if not spreads or min(min(s) for s in slots if len(s) >= 2) <= 0:
        return None
    cv = math.sqrt(statistics.fmean(x * x for x in spreads))
    n = min(len(s) for s in slots if len(s) >= 2)
    return {"slot_cv": round(cv, 3), "slot_noise": round(2.0 * cv * math.sqrt(2.0 / n), 3)}


def switching_bound(report: dict[str, Any], restart_share: float = 1.0) -> dict[str, Any] | None:
    """The best the run's ranked static configs could have reached as one policy that runs one
    of them per phase, starting from no speculation as SpecPilot does and paying SpecPilot's
    mean measured restart (or, with none measured, the static servers' mean start) as time
    without tokens for each change of config: every such sequence tried, the one with the most
    tokens/s over all phases kept. Not a bound on every policy (one may switch within a phase,
    or to a config no static ran), but what phase-by-phase switching among these configs was
    worth here against the restarts' price. With surge or pool switches a change costs no time
    without tokens (the old engine serves until the new one is up, or the pool's is up already),
    and the bound is the best static of each phase. `restart_share` scales the restart's price
    (`duty_cycle_overall`'s duty: what it takes from a server loaded the whole phase). None
    before a phase has a best static."""
    rows, policies = report.get("summary") or [], report.get("policies") or []
    if not rows or any("best_static" not in r for r in rows):
        return None
    by_name = {p["policy"]: p for p in policies}
    ranked = [
        p["policy"]
        for p in policies
        if p["kind"] == "static" and p["policy"] not in UNRANKED and len(p["phases"]) >= len(rows)
    ]
    pilot = report.get("specpilot", {})
    restarts = [d for _, d in pilot.get("restart_intervals_s", []) if d]
    starts = [p["start_s"] for p in policies if p["kind"] == "static"]
    if pilot.get("switch") in FREE_SWITCHES:
        restart_s = 0.0
    else:
        restart_s = statistics.mean(restarts) if restarts else statistics.mean(starts)
    restart_s *= restart_share
    best: tuple[float, tuple[str, ...], int] | None = None
    for sequence in itertools.product(ranked, repeat=len(rows)):
        configs = [by_name[name]["config"] for name in ("none", *sequence)]
        changes = sum(a != b for a, b in itertools.pairwise(configs))
        phases = [by_name[name]["phases"][i] for i, name in enumerate(sequence)]
        wall = sum(ph["wall_s"] for ph in phases) + changes * restart_s
        rate = sum(ph["tokens"] for ph in phases) / wall if wall > 0 else 0.0
        if best is None or rate > best[0]:
            best = (rate, sequence, changes)
    if best is None:
        return None
    rate, sequence, changes = best
    return {
        "restart_s": round(restart_s, 1),
        "sequence": list(sequence),
        "changes": changes,
        "tokens_per_s": round(rate, 2),
    }


def overall_tok_s(policies: list[dict[str, Any]]) -> dict[str, float]:
    """Tokens/s over all phases run, per policy: all its tokens over all its slots' wall time
    (SpecPilot's restarts inside its slots count as time without tokens)."""
    out = {}
    for p in policies:
        tokens = sum(ph["tokens"] for ph in p["phases"])
        wall = sum(ph["wall_s"] for ph in p["phases"])
        out[p["policy"]] = round(tokens / wall, 2) if wall > 0 else 0.0
    return out


def duty_cycle_overall(report: dict[str, Any]) -> dict[str, float] | None:
    """SpecPilot's tokens/s over all phases with each restart charged at the share of its
    phase's wall clock that SpecPilot's slots took (`duty`), not whole. The interleaved slots
    give each policy about 1/(policies) of a phase's wall clock, and the tuner sees that wall
    clock (its ticks, the dwell it prices a restart over), so a restart of R s costs R/W of a
    phase W s long to a server loaded the whole time (an operator's is) but R/L of the L s
    SpecPilot is loaded here: charged at L/W, it takes the share of the phase it would take
    under continuous load. A phase's W leaves SpecPilot's own downtime out (the phase ran
    longer by it). The bench's figure (`overall_tok_s`) charges restarts whole; this one is
    shown beside it. None without recorded phase windows, or without SpecPilot."""
    windows = report.get("phase_windows_utc") or []
    pilot = next((p for p in report.get("policies", []) if p["kind"] == "specpilot"), None)
    if pilot is None or not windows or len(windows) < len(pilot["phases"]):
        return None
    tokens = served = charged = downtime = 0.0
    duties = []
    for phase, (_, t0, t1) in zip(pilot["phases"], windows, strict=False):
        serving = phase["wall_s"] - phase["downtime_s"]
        duty = serving / max(t1 - t0 - phase["downtime_s"], serving, 1e-9)
        duties.append(duty)
        tokens += phase["tokens"]
        served += serving
        charged += serving + phase["downtime_s"] * duty
        downtime += phase["downtime_s"]
    return {
        "tokens_per_s": round(tokens / charged, 2) if charged > 0 else 0.0,
        "duty": round(statistics.fmean(duties), 4),
        "downtime_s": round(downtime, 1),
        "charged_downtime_s": round(charged - served, 1),
    }


def overall_noise(report: dict[str, Any]) -> float | None:
    """How far two policies' overall tokens/s differ by chance, as a fraction of the best
    static's: twice the standard error of their difference, from each phase's slot spread
    (`slot_cv`) at that phase's best static tokens/s over `rounds` slots, the phases weighed
    equally (as their equal slot time weighs them in `overall_tok_s`). None for a run that
    did not record its slots."""
    rows = report.get("summary") or []
    if not rows or any("slot_cv" not in r or "best_static" not in r for r in rows):
        return None
    ranked = ranked_overall(report)
    per_phase = [r["slot_cv"] * r["tokens_per_s"][r["best_static"]] for r in rows]
    variance = sum(2.0 * sd * sd / report["rounds"] for sd in per_phase) / len(rows) ** 2
    return round(2.0 * math.sqrt(variance) / max(ranked.values()), 3)


def ranked_overall(report: dict[str, Any]) -> dict[str, float]:
    """Overall tokens/s of the ranked static policies (not `UNRANKED` ones)."""
    return {
        p["policy"]: report["overall_tok_s"][p["policy"]]
        for p in report["policies"]
        if p["kind"] == "static" and p["policy"] not in UNRANKED
    }


def git_commit(root: Path = ROOT) -> str:
    """HEAD's hash, and a note when the working tree differs from it (the figures then come
    from code that no commit holds exactly)."""

    def git(*args: str) -> str:
        done = subprocess.run(
            ["git", "-C", str(root), *args], capture_output=True, text=True, check=False
        )
        return done.stdout.strip() if done.returncode == 0 else ""

    head = git("rev-parse", "HEAD") or "unknown (not a git checkout)"
    changed = [line for line in git("status", "--porcelain").splitlines() if line.strip()]
    if not changed:
        return head
    return f"{head} (tree dirty: {len(changed)} paths modified or untracked)"


def command_line(argv: Sequence[str]) -> str:
    """The command as one shell line, with the environment the run needs."""
    return " ".join(["HF_HUB_OFFLINE=1", ".venv/bin/python", *map(shlex.quote, argv)])


def probe_head(script: str, started: float, rounds: int, slot_seconds: float) -> dict[str, Any]:
    """The report head of a one-server probe (bench/scrape_cost.py, bench/engine_batch.py):
    commit, the command as run, seeds (none drawn: fixed prompts at temperature 0), start time,
    machine, and its rounds of slots."""
    return {
        "commit": git_commit(),
        "command": command_line([script, *sys.argv[1:]]),
        "seeds": None,
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "machine": f"{platform.machine()}, {platform.python_version()}",
        "rounds": rounds,
        "slot_seconds": slot_seconds,
    }


def probe_markdown_head(report: dict[str, Any], title: str) -> list[str]:
    """The Markdown lines `probe_head`'s report starts with, under `title`."""
    return [
        f"# {title}",
        "",
        f"Commit `{report['commit']}`; command `{report['command']}`; seeds: "
        f"{report.get('seeds') or 'none (fixed prompts, temperature 0)'}.",
        f"Started {report['started_utc']}, {report['wall_min']:.1f} min wall; {report['machine']}.",
        "",
    ]


def add_variant_probe_arguments(
    parser: argparse.ArgumentParser,
    *,
    variants: Sequence[str],
    rounds: int,
    concurrency: list[int],
    port: int,
    out: Path,
) -> None:
    """The options of a one-server probe that measures server variants (bench/engine_batch.py,
    bench/sglang_threads.py); `check_variant_probe_arguments` refuses bad values."""
    parser.add_argument("--rounds", type=int, default=rounds, help="slots per concurrency")
    parser.add_argument("--slot-seconds", type=float, default=11.0)
    parser.add_argument("--concurrency", type=int, nargs="+", default=concurrency)
    parser.add_argument("--variant", nargs="+", default=list(variants), choices=variants)
    parser.add_argument("--port", type=int, default=port)
    parser.add_argument("--out", type=Path, default=out)


def check_variant_probe_arguments(parser: argparse.ArgumentParser, ns: argparse.Namespace) -> None:
    if ns.rounds < 1 or ns.slot_seconds < 4.0 or min(ns.concurrency) < 1:
        parser.error("--rounds must be >= 1, --slot-seconds >= 4 and every --concurrency >= 1")


def probe_variant(
    engine: TimedEngine,
    config: SpecConfig,
    ns: argparse.Namespace,
    row: dict[str, Any],
    measure: Callable[[TimedEngine, Phase, float], dict[str, Any]],
    summarize: Callable[[list[dict[str, Any]]], dict[str, Any]],
    save: Callable[[], None],
) -> None:
    """One variant of a one-server probe: `engine` started on `config` and warmed up, then
    `ns.rounds` slots of `measure` (greedy, `ns.slot_seconds` each) per concurrency of
    `ns.concurrency`, each concurrency's slots and their `summarize` appended to the variant's
    `row["concurrencies"]` and the report saved (`save`) as it grows; the engine is stopped
    whatever happens."""
    try:
        engine.apply(config)
        warm_up(engine.url)
        for c in ns.concurrency:
            phase = Phase(f"c{c} greedy", c, 0.0)
            slots = [measure(engine, phase, ns.slot_seconds) for _ in range(ns.rounds)]
            row["concurrencies"].append({"concurrency": c, "slots": slots, **summarize(slots)})
            print(f"{row['variant']} c{c}: {slots}", flush=True)
            save()
    finally:
        engine.stop()


def arm_rounds(
    ns: argparse.Namespace,
    report: dict[str, Any],
    started: float,
    arms_of_round: Callable[[int], Sequence[str]],
    measure: Callable[[str, Phase], dict[str, Any]],
    summarize: Callable[[list[dict[str, dict[str, Any]]]], dict[str, Any]],
    markdown: Callable[[dict[str, Any]], str],
    temperature: float = 0.0,
) -> None:
    """The rounds of a one-server probe that compares arms (bench/scrape_cost.py,
    bench/tick_cost.py): per concurrency of `ns.concurrency` (its clients at `temperature`),
    `ns.rounds` rounds of one slot per arm in the round's order (`arms_of_round`, so drift
    lands on every arm alike), each slot `measure`d; each concurrency's rounds and their
    `summarize` appended to `report["concurrencies"]` and the report written to `ns.out` as it
    grows."""
    for c in ns.concurrency:
        mode = f"temp{temperature:g}" if temperature else "greedy"
        phase = Phase(f"c{c} {mode}", c, temperature)
        rounds: list[dict[str, dict[str, Any]]] = []
        for r in range(ns.rounds):
            row = {arm: measure(arm, phase) for arm in arms_of_round(r)}
            rounds.append(row)
            print(f"c{c} round {r}: {row}", flush=True)
        report["concurrencies"].append(
            {"concurrency": c, "rounds": rounds, "summary": summarize(rounds)}
        )
        report["wall_min"] = (time.time() - started) / 60
        write(report, ns.out, markdown)


def environment_lines(
    report: dict[str, Any],
    option: str,
    settings: Mapping[str, Mapping[str, str]],
    subject: str,
    engine: str,
) -> list[str]:
    """The report's line on how its servers ran their model: the setting the report records
    under `option` (one of `settings`, each an environment), said as `subject` with the setting
    in it; none for a run from before the option (it ran the engine's defaults)."""
    chosen = report.get(option)
    if chosen is None:
        return []
    env = ", ".join(f"{k}={v}" for k, v in settings[chosen].items()) or f"{engine}'s defaults"
    return [f"Every {subject.format(chosen)} ({env}): see `--{option}`."]


def write(report: dict[str, Any], out: Path, markdown: Callable[[dict[str, Any]], str]) -> None:
    out.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    out.with_suffix(".md").write_text(markdown(report))


def vars_phase(phase: Phase) -> dict[str, Any]:
    return {"name": phase.name, "concurrency": phase.concurrency, "temperature": phase.temperature}


def idle_cpu(engines: Sequence[Pilot], seconds: float) -> float:
    """Cores the idle servers burn together (their process groups' CPU time over `seconds`):
    idle servers must not slow the one under load."""

    def cpu() -> float:
        groups = {pid for e in engines for pid in e.process_groups}
        return sum(cpu_seconds_by_process(groups).values())

    before = cpu()
    time.sleep(seconds)
    return (cpu() - before) / seconds


def cpu_seconds_by_process(groups: Collection[int]) -> dict[str, float]:
    """CPU seconds (user + system) each live process of the process `groups` has used so far,
    keyed `name:pid` (the name as the process set it, e.g. SGLang's `sglang::schedul`)."""
    used: dict[str, float] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        name, fields = text[text.index("(") + 1 : text.rindex(")")], text.rsplit(")", 1)[1].split()
        if int(fields[2]) in groups:  # field 5 of stat: the process group
            ticks = int(fields[11]) + int(fields[12])  # utime + stime
            used[f"{name}:{stat.parent.name}"] = ticks / os.sysconf("SC_CLK_TCK")
    return used


def add_arguments(parser: argparse.ArgumentParser, *, phases: int, out: Path, log_dir: str) -> None:
    """The options both arms take (the engine's own are added by its script)."""
    parser.add_argument("--slot-seconds", type=float, default=11.0, help="one load slot")
    parser.add_argument("--rounds", type=int, default=3, help="slots per policy per phase")
    parser.add_argument("--ks", default="1,3,5", help="ngram Ks of the static configs")
    parser.add_argument(
        "--phases",
        type=int,
        default=phases,
        help=f"run the first N phases of the profile (1..{phases}; a short smoke run)",
    )
    parser.add_argument("--port", type=int, default=18731)
    parser.add_argument("--min-dwell", type=float, default=20.0)
    parser.add_argument(
        "--objective",
        choices=OBJECTIVES,
        default="throughput",
        help="the tuner's objective (the CRD's tuning.objective). throughput, the default here: "
        "the clients are a closed loop of a fixed number of users and the bench scores tokens/s, "
        "so the served tokens/s is not an arrival rate the latency objective could plan "
        "capacity for (on a compute-bound CPU a single user's tokens/s reads as most of the "
        "plain server's capacity)",
    )
    parser.add_argument(
        "--switch",
        choices=SWITCHES,
        default="restart",
        help="how SpecPilot's engine changes config: restart (stopped, then started: no serving "
        "meanwhile) or surge (the new engine starts on a second port beside the serving one, as "
        "the operator's default rollout does on a spare GPU). On 2 cores a surge start waits "
        "for the serving engine's spinning workers: one sat over 6 minutes without a log line "
        "where a start alone takes 35 s; or pool (one server per candidate, all started "
        "before the load, each waiting idle on its own port: a switch moves the clients, and "
        "the server left keeps waiting; SpecPilot then holds more servers, and their memory, "
        "than a static policy); or shared (SpecPilot's clients move between the static "
        "policies' own servers, one per candidate: SpecPilot and the static policy of the "
        "config it runs are measured on one server, so the spread between two servers of one "
        "config leaves that comparison)",
    )
    parser.add_argument("--restart-budget", type=int, default=12, help="restarts per hour")
    parser.add_argument("--task", default="chat", help="acceptance prior of the tuner")
    parser.add_argument("--calibrate-seconds", type=float, default=8.0)
    parser.add_argument("--gpu-for-drafts", default="H100", help="unused by ngram")
    parser.add_argument("--model-profile", default="llama-3.1-8b", help="unused by ngram")
    parser.add_argument("--out", default=str(out))
    parser.add_argument("--log-dir", default=log_dir)
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="print the plan (policies, command lines, phases, expected minutes) and exit",
    )
    parser.add_argument(
        "--calibrate-only",
        metavar="FILE",
        help="start the plain server only, calibrate it as the run would and write the fit to "
        "FILE as JSON (`specpilot run --step-time-fit FILE` reads it), then exit",
    )


def check_arguments(parser: argparse.ArgumentParser, ns: argparse.Namespace, phases: int) -> None:
    """Bad values end with a message naming the option and what it accepts."""
    if not 1 <= ns.phases <= phases:
        parser.error(f"--phases must be between 1 and {phases}, got {ns.phases}")
    if ns.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {ns.rounds}")
    if ns.slot_seconds < 2.0:
        parser.error(
            f"--slot-seconds must be at least 2 (the loop's window is 1 s less), got "
            f"{ns.slot_seconds}"
        )
    try:
        ks = [int(k) for k in ns.ks.split(",")]
    except ValueError:
        ks = []
    if not ks or min(ks) < 1:
        parser.error(f"--ks must be comma-separated positive integers, e.g. 1,3,5; got {ns.ks!r}")


def parse_ks(text: str) -> list[int]:
    return [int(k) for k in text.split(",")]


@dataclass(frozen=True, kw_only=True)
class Plan:
    """What one engine brings to the harness."""

    engine_label: str
    """e.g. "vLLM CPU" or "SGLang CPU": used in the calibration fit's source."""
    make_engine: Callable[[int, Path], TimedEngine]
    """(port, log folder) -> a stopped server of this engine."""
    statics: Sequence[tuple[str, SpecConfig]]
    candidates: tuple[SpecConfig, ...]
    phases: tuple[Phase, ...]
    calibration_concurrency: tuple[int, ...]
    markdown: Callable[[dict[str, Any]], str]
    report_head: dict[str, Any]
    """Keys the report starts with (command, commit, machine, ...), in order."""
    settings_overrides: dict[str, Any] = field(default_factory=dict)
    """TunerSettings fields the engine needs beyond the defaults (recorded in the report)."""
    meter: Meter | None = None
    after_phase: Callable[[dict[str, Any], list[tuple[str, float, float]], float], None] | None = (
        None
    )
    """(report, phase windows (name, t0, t1), started) -> adds to the report after a phase."""
    preflight: Callable[[dict[str, Any]], None] | None = None
    """Checks at the start of a real run (not --dry-run) that add their findings to the report."""


def pilot_overrides(plan: Plan, switch: str) -> dict[str, Any]:
    """The TunerSettings fields SpecPilot runs under beyond the defaults: the plan's, and on
    warm servers (a pool, or the statics' shared) no synthesised schedules (a config outside
    them would start beside the serving server, and on 2 cores such a start stalled for
    minutes: see `--switch`) and warm switches (those servers were up and warmed before the
    load: the first window after a move measures the config)."""
    if switch in WARM_SWITCHES:
        return {**plan.settings_overrides, "synthesize_schedules": False, "warm_switches": True}
    return dict(plan.settings_overrides)


def make_pilot(plan: Plan, ns: argparse.Namespace, engines: Mapping[str, TimedEngine]) -> Pilot:
    """SpecPilot's server for `--switch`: its own on the next port (and the surge's or the
    pool's ports after it), or the static policies' servers."""
    if ns.switch == "shared":
        shared = SharedServers.of(engines, plan.statics)
        missing = [c.describe() for c in plan.candidates if c not in shared.servers]
        if missing:
            raise ValueError(f"--switch shared: no static server runs {', '.join(missing)}")
        return shared
    pilot = plan.make_engine(ns.port + len(plan.statics), Path(ns.log_dir) / "specpilot")
    if ns.switch == "surge":
        pilot.surge_port = ns.port + len(plan.statics) + 1
    elif ns.switch == "pool":
        first = ns.port + len(plan.statics) + 1
        pilot.standby_ports = tuple(range(first, first + len(plan.candidates) - 1))
    return pilot


def expected_minutes(plan: Plan, ns: argparse.Namespace, start_s: float) -> float:
    """A lower bound of the run's wall time: starts, warm-ups, calibration and the slots."""
    own = {"pool": len(plan.candidates), "shared": 0}.get(ns.switch, 1)
    servers = len(plan.statics) + own
    slot_s, calibrate_s = float(ns.slot_seconds), float(ns.calibrate_seconds)
    slots = len(plan.phases) * ns.rounds * servers * slot_s
    setup = servers * (start_s + WARM_UP[1]) + len(plan.calibration_concurrency) * calibrate_s
    return float(setup + slots + 10.0) / 60.0


def run(plan: Plan, ns: argparse.Namespace, log: Callable[[str], None], started: float) -> int:
    """The bench: servers up, calibration, SpecPilot's loop, interleaved slots per phase."""
    out = Path(ns.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    phases = plan.phases
    report: dict[str, Any] = {
        **plan.report_head,
        "slot_seconds": ns.slot_seconds,
        "rounds": ns.rounds,
        "max_tokens": MAX_TOKENS,
        "phases": [vars_phase(p) for p in phases],
    }
    if plan.preflight is not None:
        plan.preflight(report)
    engines: dict[str, TimedEngine] = {}
    starts: dict[str, float] = {}
    pilot: Pilot | None = None
    try:
        for i, (name, config) in enumerate(plan.statics):
            engine = plan.make_engine(ns.port + i, Path(ns.log_dir) / name.replace(" ", "_"))
            engines[name] = engine
            log(f"{name}: starting {plan.engine_label} with {config.describe()}")
            t0 = time.time()
            engine.apply(config)
            starts[name] = time.time() - t0
            log(f"{name}: healthy after {starts[name]:.1f}s")
            warm_up(engine.url)
        source = (
            f"measured on the plain {plan.engine_label} server in this run (c / tok/s at c = "
            + ",".join(map(str, plan.calibration_concurrency))
            + ")"
        )
        fit, calibration, prefill = calibrate(
            engines["none"], ns.calibrate_seconds, plan.calibration_concurrency, source
        )
        report["step_time_fit"] = {
            "fixed_s": fit.fixed_s,
            "per_token_s": fit.per_token_s,
            "per_kv_token_s": fit.per_kv_token_s,
            "per_extra_token_s": fit.per_extra_token_s,
            "knee_tokens": fit.knee_tokens,
            "source": fit.source,
            "points_c_ms": calibration,
            "prefill_probe": prefill,
        }
        log(f"step-time fit: {report['step_time_fit']}")

        priors: dict[str, AcceptanceCurve] = {"ngram": acceptance_curve("ngram", ns.task)}
        restart_s = sum(starts.values()) / len(starts)
        # as the operator prices a surge rollout: no serving lost (serving_lost_per_switch_s)
        lost_per_switch_s = 0.0 if ns.switch in FREE_SWITCHES else restart_s
        overrides = pilot_overrides(plan, ns.switch)
        settings = TunerSettings(
            candidates=plan.candidates,
            min_dwell_s=ns.min_dwell,
            restart_budget_per_hour=ns.restart_budget,
            restart_downtime_s=lost_per_switch_s,
            objective=ns.objective,
            **overrides,
        )
        pilot = make_pilot(plan, ns, engines)
        loop = ControlLoop(
            actuator=pilot,
            settings=settings,
            cost=StepCost.from_fit(fit, ns.gpu_for_drafts, ns.model_profile),
            state=TunerState.initial(SpecConfig(), time.time(), priors),
            window_s=ns.slot_seconds - 1.0,
        )
        log(
            f"specpilot: starting {plan.engine_label} with speculation off "
            "(the tuner decides from there)"
        )
        t0 = time.time()
        loop.start()
        starts["specpilot"] = time.time() - t0
        log(f"specpilot: healthy after {starts['specpilot']:.1f}s")
        if isinstance(pilot, TimedEngine):
            warm_up(pilot.url)
        pool_start_s = None
        if isinstance(pilot, TimedEngine) and ns.switch == "pool":
            t0 = time.time()
            pilot.prewarm(plan.candidates)
            pool_start_s = time.time() - t0
            log(f"specpilot: pool of {len(pilot.standby)} more servers up in {pool_start_s:.1f}s")
            for url in pilot.standby_urls().values():
                warm_up(url)
        report["idle_cores_all_servers"] = round(idle_cpu([*engines.values(), pilot], 10.0), 3)
        log(f"idle servers burn {report['idle_cores_all_servers']} cores together")

        names = [name for name, _ in plan.statics] + ["specpilot"]
        tallies = {name: [Tally() for _ in phases] for name in names}
        ticks: list[dict[str, Any]] = []
        t_zero = time.time()
        windows: list[tuple[str, float, float]] = []
        for pi, phase in enumerate(phases):
            phase_start = time.time()
            for r in range(ns.rounds):
                shift = (pi * ns.rounds + r) % len(names)  # rotate: no policy always goes first
                for name in names[shift:] + names[:shift]:
                    if name == "specpilot":
                        before = pilot.config
                        (counts, wall, down, record), deltas = metered(
                            plan.meter, pilot, partial(pilot_slot, pilot, loop, phase, 1.0)
                        )
                        tallies[name][pi].add(counts, wall, down)
                        if record is not None:
                            ticks.append(tick_row(record, before, t_zero, phase.name))
                            log(f"  tick {json.dumps(ticks[-1])}")
                        if counts.get("loop_errors"):
                            log("  loop error in this slot")
                    else:
                        engine = engines[name]
                        (counts, wall), deltas = metered(
                            plan.meter, engine, partial(slot, engine, phase, ns.slot_seconds)
                        )
                        tallies[name][pi].add(counts, wall, 0.0)
                    if deltas is not None:
                        tallies[name][pi].add_counters(deltas)
            log(
                f"{phase.name}: "
                + ", ".join(
                    f"{n} {tallies[n][pi].to_dict(phase)['tokens_per_s_serving']}" for n in names
                )
            )
            statics = dict(plan.statics)
            report["policies"] = [
                {
                    "policy": name,
                    "kind": "specpilot" if name == "specpilot" else "static",
                    "config": statics.get(name, SpecConfig()).describe()
                    if name != "specpilot"
                    else "tuned live (ControlLoop + LocalEngine)",
                    "start_s": round(starts[name], 1),
                    "phases": [
                        t.to_dict(p) for t, p in zip(tallies[name], phases, strict=True) if t.slots
                    ],
                }
                for name in names
            ]
            report["specpilot"] = {
                "restarts": pilot.restarts - 1,
                "switch": ns.switch,
                "pool": (
                    [c.describe() for c in plan.candidates] if ns.switch in WARM_SWITCHES else None
                ),
                "pool_start_s": None if pool_start_s is None else round(pool_start_s, 1),
                "restart_intervals_s": [
                    [round(s - t_zero, 1), None if e is None else round(e - s, 1)]
                    for s, e in pilot.downtime[1:]
                ],
                "switch_intervals_s": [
                    [round(s - t_zero, 1), None if e is None else round(e - s, 1)]
                    for s, e in pilot.switches[1:]
                ],
                "settings": {
                    "window_s": ns.slot_seconds - 1.0,
                    # the tuner's own spacing of decisions (its trend and trial span), left at
                    # its default: SpecPilot's ticks come one round of slots apart
                    "tuner_window_s": settings.window_s,
                    "min_dwell_s": ns.min_dwell,
                    "restart_budget_per_hour": ns.restart_budget,
                    "restart_downtime_s": round(lost_per_switch_s, 1),
                    "objective": ns.objective,
                    "expected_dwell_s": settings.expected_dwell_s,
                    "hysteresis": settings.hysteresis,
                    "acceptance_prior_task": ns.task,
                    "candidates": [c.describe() for c in plan.candidates],
                    "initial": "none",
                    **overrides,
                },
                "ticks": ticks,
            }
            windows.append((phase.name, phase_start, time.time()))
            report["phase_windows_utc"] = [[n, t0, t1] for n, t0, t1 in windows]
            if plan.after_phase is not None:
                plan.after_phase(report, windows, started)
            report["summary"] = summarize(report["policies"], phases)
            report["overall_tok_s"] = overall_tok_s(report["policies"])
            report["wall_min"] = (time.time() - started) / 60
            write(report, out, plan.markdown)
    finally:
        for server in [*engines.values(), *([pilot] if pilot else [])]:
            server.stop()
    log(f"done: {out}.json / .md")
    return 0


def main_for(
    plan_for: Callable[[argparse.Namespace, list[str]], Plan],
    parser: argparse.ArgumentParser,
    profile: int,
    argv: Sequence[str] | None,
    script: str,
    dry_run_start_s: float,
) -> int:
    """Parse, check, build the plan; print it (--dry-run) or run it. `script` stands for the
    program in the recorded command when `argv` is given (a test); else sys.argv is recorded."""
    args = list(sys.argv[1:] if argv is None else argv)
    ns = parser.parse_args(args)
    check_arguments(parser, ns, profile)
    started = time.time()

    def log(message: str) -> None:
        print(f"[{time.time() - started:7.1f}s] {message}", flush=True)

    plan = plan_for(ns, [sys.argv[0] if argv is None else script, *args])
    if ns.dry_run:
        print(json.dumps(dry_run(plan, ns, dry_run_start_s), indent=2))
        return 0
    if ns.calibrate_only:
        return calibrate_only(plan, ns, log, Path(ns.calibrate_only))
    return run(plan, ns, log, started)


def calibrate_only(
    plan: Plan, ns: argparse.Namespace, log: Callable[[str], None], out: Path
) -> int:
    """The plain server's fit as `run` measures it, written where `--step-time-fit` reads it,
    with the command, the commit and the measured points beside the coefficients."""
    name, config = plan.statics[0]
    engine = plan.make_engine(ns.port, Path(ns.log_dir) / "calibrate-only")
    log(f"{name}: starting {plan.engine_label} with {config.describe()}")
    try:
        engine.apply(config)
        warm_up(engine.url)
        fit, points, prefill = calibrate(
            engine, ns.calibrate_seconds, plan.calibration_concurrency, "calibrate-only"
        )
    finally:
        engine.stop()
    body = {
        "fixed_s": fit.fixed_s,
        "per_token_s": fit.per_token_s,
        "per_kv_token_s": fit.per_kv_token_s,
        "per_extra_token_s": fit.per_extra_token_s,
        "points_c_ms": points,
        "prefill_probe": prefill,
        **{k: v for k, v in plan.report_head.items() if k in ("command", "commit", "machine")},
    }
    out.write_text(json.dumps(body, indent=1) + "\n")
    log(f"fit written to {out}: {json.dumps(body)}")
    return 0


def dry_run(plan: Plan, ns: argparse.Namespace, start_s: float) -> dict[str, Any]:
    """The plan as data: each server's command line and environment additions, the phases,
    the tuner's settings overrides and a lower bound of the wall time. Starts nothing."""
    servers = []
    own = [] if ns.switch == "shared" else [("specpilot", SpecConfig())]
    for i, (name, config) in enumerate([*plan.statics, *own]):
        engine = plan.make_engine(ns.port + i, Path(ns.log_dir) / name.replace(" ", "_"))
        servers.append({"policy": name, **describe_launch(engine, config)})
    return {
        **plan.report_head,
        "servers": servers,
        "candidates": [c.describe() for c in plan.candidates],
        "tuner_settings_overrides": pilot_overrides(plan, ns.switch),
        "objective": ns.objective,
        "switch": ns.switch,
        "specpilot_pool": (
            [c.describe() for c in plan.candidates] if ns.switch in WARM_SWITCHES else None
        ),
        "phases": [vars_phase(p) for p in plan.phases],
        "calibration_concurrency": list(plan.calibration_concurrency),
        "slot_seconds": ns.slot_seconds,
        "rounds": ns.rounds,
        "expected_minutes_at_least": round(expected_minutes(plan, ns, start_s), 1),
    }


def describe_launch(engine: TimedEngine, config: SpecConfig) -> dict[str, Any]:
    """What `engine.apply(config)` would run; engines whose flags depend on the config
    (`prepare`) are asked first."""
    prepare = getattr(engine, "prepare", None)
    if callable(prepare):
        prepare(config)
    args = get_adapter(engine.engine).render(config, engine.launch)
    added = {k: v for k, v in engine.env.items() if os.environ.get(k) != v}
    return {"command": [*engine.program, *args], "env": dict(sorted(added.items()))}


# --------------------------------------------------------------------------- Markdown pieces


def summary_table(report: dict[str, Any]) -> list[str]:
    """Per phase: every policy's tokens/s, best and worst static, SpecPilot's ratios, and the
    noise they are judged against (the slot noise only for runs that recorded their slots)."""
    policies = [p["policy"] for p in report["policies"]]
    with_slots = any("slot_noise" in row for row in report["summary"])
    extra = " | slot noise | SpecPilot within slot noise" if with_slots else ""
    lines = [
        "| phase | "
        + " | ".join(policies)
        + " | best static | worst static | SpecPilot wall / best | SpecPilot serving / best "
        f"| SpecPilot restart s | server noise | SpecPilot within noise{extra} |",
        "|---" * (len(policies) + (10 if with_slots else 8)) + "|",
    ]
    for row in report["summary"]:
        cells = [f"{row['tokens_per_s'].get(p, float('nan')):.1f}" for p in policies]
        if "specpilot_wall" in row:
            cells[policies.index("specpilot")] = (
                f"{row['specpilot_wall']:.1f} wall / {row['specpilot_serving']:.1f} serving"
            )
        slot_cells = (
            f" {row.get('slot_noise', '-')} | {row.get('specpilot_within_slot_noise', '-')} |"
            if with_slots
            else ""
        )
        lines.append(
            f"| {row['phase']} | "
            + " | ".join(cells)
            + f" | {row.get('best_static', '-')} | {row.get('worst_static', '-')} "
            f"| {row.get('ratio_wall', '-')} | {row.get('ratio_serving', '-')} "
            f"| {row.get('specpilot_downtime_s', '-')} | {row.get('server_noise', '-')} "
            f"| {row.get('specpilot_within_noise', '-')} |{slot_cells}"
        )
    lines += [
        "",
        f"Server noise: |{TWIN} / none - 1|, two servers of one config loaded alike in the "
        "same phase (the twin is shown, not ranked); SpecPilot is within noise when its "
        "wall ratio to the best static is at least 1 minus that.",
    ]
    if with_slots:
        lines[-1] += (
            " Slot noise: twice the standard error of the ratio of two policies' means over "
            "the phase's slots, from the spread between one static server's slots (pooled "
            "over the statics; `slot_noise`)."
        )
    return lines


def servers_phrase(report: dict[str, Any], engine: str) -> str:
    """Whose servers the policies ran on, for the report's opening paragraph."""
    if report.get("specpilot", {}).get("switch") == "shared":
        return f"each static policy on its own {engine} server and SpecPilot on theirs"
    return f"each on its own {engine} server"


def pilot_slot_line(report: dict[str, Any]) -> str:
    """How SpecPilot's slots are counted, for the switch the run used."""
    line = (
        "SpecPilot's slot is one tick of its loop: load starts, 1 s later the loop observes a "
        "window, decides and, on a switch, "
    )
    if report.get("specpilot", {}).get("switch") == "shared":
        return line + (
            "moves the clients to the static policy's server of the new config (SpecPilot has no "
            "server of its own: it runs each config on the server that config's static policy "
            "is measured on, in its own slots), so `wall` = `serving`, and SpecPilot and a "
            "static policy running one config are compared on one server."
        )
    if report.get("specpilot", {}).get("switch") == "pool":
        return line + (
            "moves the clients to the pool's server of the new config (one server per candidate, "
            "all started before the load and waiting idle on their own ports; the one left keeps "
            "waiting), so `wall` = `serving`. SpecPilot holds "
            f"{len(report['specpilot']['pool'])} servers where a static policy holds one: the "
            "same cores, more memory."
        )
    if report.get("specpilot", {}).get("switch") == "surge":
        return line + (
            "starts the new config's server on a second port beside the serving one (the "
            "operator's default surge rollout on one machine: both on the same cores), moves "
            "the clients to it once healthy and stops the old one when its requests are done; "
            "the slot lasts until then, the old config serving, so `wall` = `serving`."
        )
    return line + (
        "restarts its server before the slot ends; `wall` counts that restart time as zero "
        "tokens (tokens over load + restart time), `serving` excludes it."
    )


def tail_lines(report: dict[str, Any]) -> list[str]:
    """Starts, the step-time fit, SpecPilot's restarts, settings and ticks, and the notes."""
    lines = [
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
        if f.get("per_extra_token_s") is not None:
            probe = f["prefill_probe"]
            lines[-1] += (
                f" Each token a sequence adds beyond its first (a verified draft) is priced at "
                f"{f['per_extra_token_s'] * 1e3:.3f} ms: the prefill probe's one-token "
                f"completions took {probe['short_median_ms']} ms (median) at "
                f"{probe['short_tokens']} prompt tokens and {probe['long_median_ms']} ms at "
                f"{probe['long_tokens']} ({probe['requests_each']} requests each, one at a time)."
            )
    pilot = report.get("specpilot")
    if pilot is not None:
        lines += [
            "",
            (
                f"SpecPilot: {pilot['restarts']} {pilot['switch']} switches (offset s, s until "
                f"the new config served): {pilot['switch_intervals_s']}"
                + (
                    f"; its pool of {len(pilot['pool'])} servers started in "
                    f"{pilot['pool_start_s']} s before the load"
                    if pilot.get("switch") == "pool"
                    else ""
                )
                if pilot.get("switch") in FREE_SWITCHES
                else f"SpecPilot: {pilot['restarts']} restarts (offset s, duration s): "
                f"{pilot['restart_intervals_s']}"
            )
            + f"; settings `{json.dumps(pilot['settings'])}`.",
            "",
            "## SpecPilot's ticks",
            "",
            "| t s | phase | running | action -> config | applied | batch | gauge | acc. len "
            "| tok/s | predicted tok/s | reason |",
            "|---" * 11 + "|",
        ]
        for t in pilot["ticks"]:
            lines.append(
                f"| {t['t']} | {t['phase']} | {t['running_config']} | {t['action']} -> "
                f"{t['config']} | {t['applied']} | {t['batch']} | "
                + f"{t['batch_gauge']} | "
                + f"{t['acceptance_length']} | "
                f"{t['tokens_per_s']} | {t['predicted_tokens_per_s']} | {t['reason']} |"
            )
    if report.get("notes"):
        lines += ["", "## Notes", "", *report["notes"]]
    return lines


def provenance_lines(report: dict[str, Any]) -> list[str]:
    """Command, commit (when recorded) and overall tokens/s per policy (when recorded)."""
    lines = [f"Command: `{report['command']}`  "]
    if "commit" in report:
        lines.append(f"Commit: `{report['commit']}`  ")
    return lines


def overall_line(report: dict[str, Any]) -> list[str]:
    overall = report.get("overall_tok_s")
    if not overall:
        return []
    lines = [
        "",
        "Overall tokens/s over all phases (tokens over slot wall time, SpecPilot's restarts "
        "included): " + ", ".join(f"{k} {v}" for k, v in overall.items()) + ".",
    ]
    noise = overall_noise(report)
    pilot = overall.get("specpilot")
    if noise is not None and pilot is not None:
        ranked = ranked_overall(report)
        best = max(ranked, key=lambda k: ranked[k])
        lines[-1] += (
            f" SpecPilot / best static ({best}) overall: {pilot / ranked[best]:.3f}; two "
            f"policies' overall figures differ by chance by up to {noise:.1%} of it (twice "
            "the standard error of a difference, from the spread between one static server's "
            "slots: `overall_noise`)."
        )
    duty = duty_cycle_overall(report)
    if duty is not None and duty["downtime_s"] > 0:
        ranked = ranked_overall(report)
        best = max(ranked, key=lambda k: ranked[k])
        lines += [
            "",
            f"SpecPilot with each restart charged at its slots' share of the phase's wall clock "
            f"(mean duty {duty['duty']:.3f}: {duty['downtime_s']} s of restarts count as "
            f"{duty['charged_downtime_s']} s, what they would take from a server loaded the "
            f"whole phase, as the tuner that priced them saw it): {duty['tokens_per_s']} tok/s, "
            f"{duty['tokens_per_s'] / ranked[best]:.3f} of the best static ({best}); the "
            "bench's figure above charges them whole (`duty_cycle_overall`).",
        ]
        scaled = switching_bound(report, duty["duty"])
        if scaled:
            lines[-1] += (
                f" At that charge ({scaled['restart_s']} s per change) the best phase-by-phase "
                f"sequence of the ranked static configs is {' -> '.join(scaled['sequence'])}, "
                f"{scaled['changes']} changes, {scaled['tokens_per_s']} tok/s."
            )
    bound = switching_bound(report)
    if bound:  # derived from the figures above
        lines += [
            "",
            "Best phase-by-phase sequence of the ranked static configs, starting from no "
            f"speculation and paying {bound['restart_s']} s without tokens per change "
            + (
                f"(none with {report['specpilot']['switch']} switches): "
                if report.get("specpilot", {}).get("switch") in FREE_SWITCHES
                else "(SpecPilot's mean measured restart): "
            )
            + f"{' -> '.join(bound['sequence'])}, "
            f"{bound['changes']} changes, {bound['tokens_per_s']} tok/s overall "
            "(`switching_bound`).",
        ]
    return lines


def main() -> int:
    """Not a bench by itself: says which scripts run it (every bench/*.py has a main)."""
    print(
        "bench/real_engine.py is the shared harness; run bench/real_vllm.py or bench/real_sglang.py"
    )
    return 2


if __name__ == "__main__":
    sys.exit(main())
