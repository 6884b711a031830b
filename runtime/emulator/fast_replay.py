"""Fast mode over a trace: one policy (static, a per-batch table, or the tuner) serving a
day of traffic in simulated time, with restarts that cost what they cost.

Contract: `run_trace(trace, policy, cost, ...)` replays the trace's Poisson arrivals (rate and
task mix per row) into an `EngineCore`; every `window_s` it hands the policy an Observation
built from that window (the numbers the engine's /metrics would give) and, on a switch, stops
serving for `restart_downtime_s` (running requests go back to the queue and are recomputed);
with `free_switches` (the oracle's) the config changes between two steps and nothing is lost.
It reports SLO-goodput (output tokens/s of requests whose per-token latency met the SLO),
per-token and end-to-end latency, restarts, and each window's goodput (for the oracle).
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field

from specpilot.runtime.emulator.core import EngineCore, Request
from specpilot.runtime.emulator.fast_sweep import TASK_SHAPES
from specpilot.runtime.traces import Trace
from specpilot.tuner import Observation, SpecConfig, StepCost

Policy = Callable[[Observation, SpecConfig, float], SpecConfig]
"""(window observation, running config, now) -> the config to run next."""


def static(config: SpecConfig) -> Policy:
    return lambda _obs, _current, _now: config


@dataclass(slots=True)
class _Window:
    tokens: int = 0
    prefill_tokens: int = 0
    accepted: int = 0
    drafts: int = 0
    batch_time: float = 0.0
    busy_time: float = 0.0


@dataclass(slots=True, kw_only=True)
class TraceResult:
    name: str
    duration_s: float
    goodput_tok_s: float
    tokens_per_s: float
    tpot_ms_mean: float | None
    tpot_ms_p95: float | None
    e2e_s_mean: float | None
    restarts: int
    completed: int
    window_goodput: list[float] = field(default_factory=list)
    configs: list[str] = field(default_factory=list)
    """The config running in each window."""
    window_batch: list[float] = field(default_factory=list)
    """Each window's time-averaged number of running requests (the engine's gauge)."""

    def to_dict(self) -> dict[str, object]:
        return {
            "policy": self.name,
            "goodput_tok_s": round(self.goodput_tok_s, 2),
            "tokens_per_s": round(self.tokens_per_s, 2),
            "tpot_ms_mean": self.tpot_ms_mean and round(self.tpot_ms_mean, 3),
            "tpot_ms_p95": self.tpot_ms_p95 and round(self.tpot_ms_p95, 3),
            "e2e_s_mean": self.e2e_s_mean and round(self.e2e_s_mean, 3),
            "restarts": self.restarts,
            "completed": self.completed,
            "window_goodput_tok_s": [round(g, 1) for g in self.window_goodput],
            "window_batch": [round(b, 1) for b in self.window_batch],
        }


def run_trace(
    trace: Trace,
    policy: Policy,
    initial: SpecConfig,
    cost: StepCost,
    *,
    name: str,
    engine: str = "vllm",
    window_s: float = 60.0,
    restart_downtime_s: float = 60.0,
    slo_tpot_s: float = 0.05,
    seed: int = 0,
    free_switches: bool = False,
) -> TraceResult:
    rng = random.Random(seed)
    config = initial
    core = EngineCore(config=config, performance=cost, seed=seed)
    now, next_arrival, paused_until = 0.0, draw_arrival(trace, 0.0, rng), 0.0
    window, window_end = _Window(), window_s
    finished: list[Request] = []
    window_goodput: list[float] = []
    configs: list[str] = []
    batches: list[float] = []
    good_in_window, restarts, count = 0, 0, 0
    end = trace.duration_s
    while now < end:
        while next_arrival is not None and next_arrival <= now:
            count += 1
            core.add_request(draw_request(trace, next_arrival, count, rng))
            next_arrival = draw_arrival(trace, next_arrival, rng)
        if now >= window_end:
            obs = _observation(engine, window, window_s, core)
            window_goodput.append(good_in_window / window_s)
            configs.append(config.describe())
            batches.append(obs.running_requests or 0.0)
            good_in_window, window = 0, _Window()
            window_end += window_s
            chosen = policy(obs, config, now)
            if chosen != config:
                config = chosen
                core = _restart(core, config, cost, seed + restarts + 1, keep=free_switches)
                restarts += 1
                paused_until = now + (0.0 if free_switches else restart_downtime_s)
            continue
        outcome = core.step(now) if now >= paused_until else None
        if outcome is None:
            wake = min(
                t
                for t in (next_arrival, window_end, paused_until, end)
                if t is not None and t > now
            )
            now = wake
            continue
        now += outcome.duration_s
        emitted = sum(outcome.emitted.values())
        window.tokens += emitted
        window.prefill_tokens += outcome.prefill_tokens
        window.accepted += outcome.accepted
        window.drafts += outcome.drafts
        window.batch_time += outcome.decode_batch * outcome.duration_s
        window.busy_time += outcome.duration_s
        for request in outcome.finished:
            finished.append(request)
            tpot = request.time_per_output_token_s
            if tpot is not None and tpot <= slo_tpot_s:
                good_in_window += request.generated
    tpots = [t for r in finished if (t := r.time_per_output_token_s) is not None]
    good = sum(
        r.generated
        for r in finished
        if (t := r.time_per_output_token_s) is not None and t <= slo_tpot_s
    )
    e2e = [r.finished_s - r.arrival_s for r in finished if r.finished_s is not None]
    return TraceResult(
        name=name,
        duration_s=end,
        goodput_tok_s=good / end,
        tokens_per_s=sum(r.generated for r in finished) / end,
        tpot_ms_mean=statistics.fmean(tpots) * 1e3 if tpots else None,
        tpot_ms_p95=sorted(tpots)[int(0.95 * (len(tpots) - 1))] * 1e3 if tpots else None,
        e2e_s_mean=statistics.fmean(e2e) if e2e else None,
        restarts=restarts,
        completed=len(finished),
        window_goodput=window_goodput,
        configs=configs,
        window_batch=batches,
    )


def _restart(
    core: EngineCore, config: SpecConfig, cost: StepCost, seed: int, *, keep: bool = False
) -> EngineCore:
    """A new engine process: what was running is recomputed (unless `keep`: a free switch that
    keeps the KV cache), what waited still waits."""
    fresh = EngineCore(config=config, performance=cost, seed=seed)
    for request in core.running:
        if not keep:
            request.prefilled = 0
        fresh.add_request(request)
    for request in core.waiting:
        fresh.add_request(request)
    return fresh


def _observation(engine: str, window: _Window, window_s: float, core: EngineCore) -> Observation:
    return Observation(
        engine=engine,
        window_s=window_s,
        pods=("emulated",),
        acceptance_length=1 + window.accepted / window.drafts if window.drafts else None,
        acceptance_rate=None,
        acceptance_per_position=None,
        # Time-averaged over the whole window, idle time included, as a scraped gauge is.
        running_requests=window.batch_time / window_s if window.busy_time else None,
        waiting_requests=float(len(core.waiting)),
        kv_cache_usage=core.kv_usage,
        generation_tokens_per_s=window.tokens / window_s if window.tokens else None,
        tpot_p50_s=None,
        tpot_p95_s=None,
        ttft_p95_s=None,
        prompt_tokens_per_s=window.prefill_tokens / window_s if window.prefill_tokens else None,
    )


def draw_arrival(trace: Trace, after: float, rng: random.Random) -> float | None:
    """The first Poisson arrival after `after` at the trace's rate (seconds), or None past its
    end. Consumes `rng` exactly as the replay does, so callers sharing a seed see one sequence."""
    t = after
    while t < trace.duration_s:
        row = trace.row_at(t)
        next_row_t = next((r.t for r in trace.rows if r.t > t), trace.duration_s)
        if row.rps > 0:
            candidate = t + rng.expovariate(row.rps)
            if candidate < next_row_t:
                return candidate
        t = next_row_t  # memoryless: redraw from the row boundary at the new rate
    return None


def draw_request(trace: Trace, arrival: float, number: int, rng: random.Random) -> Request:
    """Request number `number` arriving at `arrival`: its task drawn from the trace's mix there,
    its prompt and output lengths within +-50% of the task's shape (`rng` as the replay uses it)."""
    tasks, weights = zip(*trace.row_at(arrival).mix, strict=True)
    task = rng.choices(tasks, weights)[0]
    prompt, output = TASK_SHAPES[task]
    return Request(
        request_id=f"r{number}",
        task=task,
        prompt_tokens=max(1, round(prompt * rng.uniform(0.5, 1.5))),
        max_tokens=max(2, round(output * rng.uniform(0.5, 1.5))),
        arrival_s=arrival,
    )
