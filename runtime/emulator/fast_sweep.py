"""Fast mode: the emulated engine as a discrete-event simulation (no sleeping, seeded).

Contract: `simulate(...)` drives one `EngineCore` with closed-loop users (each sends its next
request when the previous one finishes) or open-loop Poisson arrivals, advancing a simulated
clock by each step's duration, and reports steady-state throughput, acceptance and latency.
The same seed gives the same result.
"""

from __future__ import annotations

import heapq
import random
import statistics
from collections.abc import Callable
from dataclasses import dataclass

from specpilot.runtime.emulator.core import EngineCore, Request
from specpilot.tuner import AcceptanceCurve, ConfigError, SpecConfig, StepCost, acceptance_curve

# Typical request shapes per task (prompt, output tokens); drawn +-50% around these. These are
# workload assumptions of the emulator, not measurements.
TASK_SHAPES: dict[str, tuple[int, int]] = {
    "chat": (512, 256),
    "code": (768, 384),
    "summarize": (2048, 192),
    "math": (256, 384),
    "creative": (128, 512),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class SimResult:
    tokens_per_s: float
    acceptance_length: float | None
    tpot_ms_p50: float | None
    ttft_ms_p95: float | None
    completed: int
    mean_decode_batch: float
    preemptions: int

    def to_dict(self) -> dict[str, float | int | None]:
        return {
            "tokens_per_s": self.tokens_per_s,
            "acceptance_length": self.acceptance_length,
            "tpot_ms_p50": self.tpot_ms_p50,
            "ttft_ms_p95": self.ttft_ms_p95,
            "completed": self.completed,
            "mean_decode_batch": self.mean_decode_batch,
            "preemptions": self.preemptions,
        }


class _RequestFactory:
    def __init__(self, task: str, seed: int) -> None:
        if task not in TASK_SHAPES:
            raise ConfigError("task", task, " | ".join(TASK_SHAPES))
        self._task = task
        self._rng = random.Random(seed)
        self._count = 0

    def make(self, arrival_s: float) -> Request:
        prompt, output = TASK_SHAPES[self._task]
        self._count += 1
        return Request(
            request_id=f"r{self._count}",
            task=self._task,
            prompt_tokens=max(1, round(prompt * self._rng.uniform(0.5, 1.5))),
            max_tokens=max(2, round(output * self._rng.uniform(0.5, 1.5))),
            arrival_s=arrival_s,
        )


def simulate(
    *,
    config: SpecConfig,
    performance: StepCost,
    task: str = "chat",
    concurrency: int | None = None,
    rps: float | None = None,
    duration_s: float = 120.0,
    warmup_s: float = 20.0,
    seed: int = 0,
    max_num_seqs: int = 256,
    acceptance: Callable[[str, str], AcceptanceCurve] = acceptance_curve,
) -> SimResult:
    """Closed loop with `concurrency` users, or open loop at `rps` requests/s; acceptance is
    drawn from `acceptance(method, task)` (the priors, or a hidden world's curves)."""
    if (concurrency is None) == (rps is None):
        raise ConfigError("concurrency/rps", (concurrency, rps), "exactly one of them")
    core = EngineCore(
        config=config,
        performance=performance,
        seed=seed,
        max_num_seqs=max_num_seqs,
        acceptance=acceptance,
    )
    factory = _RequestFactory(task, seed + 1)
    arrivals = random.Random(seed + 2)
    pending: list[tuple[float, int]] = []  # (time, sequence) of future arrivals
    sequence = 0
    if concurrency is not None:
        for _ in range(concurrency):
            core.add_request(factory.make(0.0))
    else:
        assert rps is not None
        heapq.heappush(pending, (arrivals.expovariate(rps), sequence))

    now, tokens, accepted, drafts, batch_sum, steps = 0.0, 0, 0, 0, 0, 0
    finished: list[Request] = []
    while now < duration_s:
        while pending and pending[0][0] <= now:
            at, _ = heapq.heappop(pending)
            core.add_request(factory.make(at))
            sequence += 1
            heapq.heappush(pending, (at + arrivals.expovariate(rps or 1.0), sequence))
        outcome = core.step(now)
        if outcome is None:
            if not pending:
                break
            now = pending[0][0]
            continue
        now += outcome.duration_s
        if now >= warmup_s:
            tokens += sum(outcome.emitted.values())
            accepted += outcome.accepted
            drafts += outcome.drafts
            batch_sum += outcome.decode_batch
            steps += 1
        for request in outcome.finished:
            if request.arrival_s >= warmup_s:
                finished.append(request)
            if concurrency is not None:
                core.add_request(factory.make(now))
    measured = max(now - warmup_s, 1e-9)
    tpots = [t for r in finished if (t := r.time_per_output_token_s) is not None]
    ttfts = [r.first_token_s - r.arrival_s for r in finished if r.first_token_s is not None]
    return SimResult(
        tokens_per_s=tokens / measured,
        acceptance_length=1 + accepted / drafts if drafts else None,
        tpot_ms_p50=statistics.median(tpots) * 1e3 if tpots else None,
        ttft_ms_p95=_percentile(ttfts, 0.95) * 1e3 if ttfts else None,
        completed=len(finished),
        mean_decode_batch=batch_sum / steps if steps else 0.0,
        preemptions=core.preemptions,
    )


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
