"""The emulated engine: continuous batching with speculative verification, one step at a time.

Contract: `EngineCore.step(now)` runs one engine step starting at `now` (seconds, the caller's
clock) and returns what happened and how long it took; it never sleeps. The real-time server
sleeps for `duration_s` between steps, the fast simulator jumps its clock instead: one core,
two drivers. Per step, like vLLM's scheduler:
- admission from a FIFO waiting queue up to `max_num_seqs` and the KV capacity;
- decoding requests first, each verifying K+1 tokens, K from the config's per-batch-size
  schedule (vLLM's table and SGLang's one-candidate adaptive buckets read the same way) or,
  for an engine-adaptive config, from SGLang's own EMA-driven buckets;
- chunked prefill of admitted prompts in the remaining `max_batched_tokens` budget; a prompt's
  last chunk yields its first token;
- acceptance drawn per request-step from the method x task curve;
- KV growth past capacity preempts the newest request back to the waiting queue (recompute).
`EngineCore.advance(now, until)` runs the same rules from event to event for fast mode
(`fast_core`: acceptance drawn ahead per request, steps between events added up with numpy);
it agrees with `step` in distribution and exactly when acceptance is certain.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from specpilot.runtime.emulator.fast_core import FastCore
from specpilot.runtime.emulator.progress import Progress as Progress
from specpilot.runtime.emulator.progress import advance_stepwise
from specpilot.runtime.emulator.sglang_adaptive import SglangAdaptive
from specpilot.tuner import AcceptanceCurve, SpecConfig, StepCost, acceptance_curve

DEFAULT_MAX_NUM_SEQS = 256
DEFAULT_MAX_BATCHED_TOKENS = 8192
# vLLM's default --gpu-memory-utilization; what is left after weights holds the KV cache.
GPU_MEMORY_UTILIZATION = 0.9


@dataclass(slots=True, kw_only=True, eq=False)
class Request:
    request_id: str
    task: str
    prompt_tokens: int
    max_tokens: int
    arrival_s: float
    prefilled: int = 0
    generated: int = 0
    first_token_s: float | None = None
    finished_s: float | None = None

    @property
    def context_tokens(self) -> int:
        return self.prefilled + self.generated

    @property
    def decoding(self) -> bool:
        return self.prefilled >= self.prompt_tokens

    @property
    def time_per_output_token_s(self) -> float | None:
        """vLLM's request_time_per_output_token: decode time over tokens after the first."""
        if self.first_token_s is None or self.finished_s is None or self.generated < 2:
            return None
        return (self.finished_s - self.first_token_s) / (self.generated - 1)


@dataclass(slots=True, kw_only=True)
class StepOutcome:
    start_s: float
    duration_s: float
    k: int
    decode_batch: int
    prefill_tokens: int
    emitted: dict[str, int] = field(default_factory=dict)
    finished: list[Request] = field(default_factory=list)
    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    accepted_per_position: list[int] = field(default_factory=list)
    preempted: int = 0


class EngineCore:
    """One engine process's scheduler and model, emulated."""

    def __init__(
        self,
        *,
        config: SpecConfig,
        performance: StepCost,
        max_num_seqs: int = DEFAULT_MAX_NUM_SEQS,
        max_batched_tokens: int = DEFAULT_MAX_BATCHED_TOKENS,
        kv_capacity_tokens: int | None = None,
        seed: int = 0,
        acceptance: Callable[[str, str], AcceptanceCurve] = acceptance_curve,
    ) -> None:
        """`acceptance(method, task)` is the true acceptance the core draws from: the priors by
        default, a hidden world's `World.acceptance_curve` in benchmarks."""
        self.config = config
        self._acceptance = acceptance
        self.performance = performance
        self.max_num_seqs = max_num_seqs
        self.max_batched_tokens = max_batched_tokens
        self.kv_capacity_tokens = kv_capacity_tokens or default_kv_capacity(performance)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.preemptions = 0
        self.seed = seed
        self._rng = random.Random(seed)
        self._curves: dict[str, AcceptanceCurve] = {}
        # SGLang's own adaptive mode moves K at run time; a schedule or a fixed K does not.
        self._adaptive = SglangAdaptive(config.max_k) if config.engine_adaptive else None
        # fast mode's event-driven state (`advance`); `step` drops it
        self._fast: FastCore | None = None
        self._fast_generation = 0

    def add_request(self, request: Request) -> None:
        self.waiting.append(request)

    def abort(self, request: Request) -> bool:
        """Drop a request wherever it is (its client went away), freeing its KV cache as
        vLLM's and SGLang's aborts do; False when it had already finished."""
        self._fast = None  # fast mode's plan held the request; it is rebuilt from here
        if request in self.running:
            self.running.remove(request)
            return True
        if request in self.waiting:
            self.waiting.remove(request)
            return True
        return False

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.running

    @property
    def kv_used_tokens(self) -> int:
        return sum(r.context_tokens for r in self.running)

    @property
    def kv_usage(self) -> float:
        return min(1.0, self.kv_used_tokens / self.kv_capacity_tokens)

    def step(self, now: float) -> StepOutcome | None:
        """Run one step starting at `now`; None when there is nothing to do."""
        self._fast = None
        self._admit()
        if not self.running:
            return None
        decoding = [r for r in self.running if r.decoding]
        k = self._k_for(len(decoding)) if decoding else 0
        budget = self.max_batched_tokens - len(decoding) * (k + 1)
        chunks = self._plan_prefill(max(budget, 0))
        outcome = StepOutcome(
            start_s=now,
            duration_s=0.0,
            k=k,
            decode_batch=len(decoding),
            prefill_tokens=sum(chunks.values()),
            accepted_per_position=[0] * k,
        )
        kv_tokens = self.kv_used_tokens
        outcome.duration_s = self.performance.step_time(
            method=self.config.method,
            decode_batch=len(decoding),
            k=k,
            prefill_tokens=outcome.prefill_tokens,
            kv_tokens=kv_tokens,
        )
        end = now + outcome.duration_s
        drafted: list[int] = []
        for request in decoding:
            drafted.append(self._decode(request, k, outcome))
        if self._adaptive is not None and decoding:
            self._adaptive.observe(len(decoding), drafted if k else [])
        for request, tokens in chunks.items():
            request.prefilled += tokens
            if request.decoding:
                request.generated += 1
                if request.first_token_s is None:
                    request.first_token_s = end
                outcome.emitted[request.request_id] = outcome.emitted.get(request.request_id, 0) + 1
        for request in list(self.running):
            if request.generated >= request.max_tokens:
                request.finished_s = end
                self.running.remove(request)
                outcome.finished.append(request)
        outcome.preempted = self._preempt_over_capacity()
        return outcome

    def advance(self, now: float, until: float) -> tuple[float, Progress]:
        """Run whole steps from `now` while a step can start before `until`; return the time the
        last step ended (>= until when a step straddles it; == until when idle) and what
        happened. Event to event (`fast_core`), except SGLang's own adaptive mode, which moves K
        after every verify and runs step by step (`advance_stepwise`)."""
        if self._adaptive is not None:
            return advance_stepwise(self, now, until)
        if self._fast is None:
            self._fast_generation += 1
            self._fast = FastCore(self, self._fast_generation)
        return self._fast.advance(now, until)

    def curve_for(self, task: str) -> AcceptanceCurve:
        """The true acceptance curve of this core's method on `task`."""
        curve = self._curves.get(task)
        if curve is None:
            curve = self._curves[task] = self._acceptance(self.config.method, task)
        return curve

    def _admit(self) -> None:
        used = self.kv_used_tokens
        while self.waiting and len(self.running) < self.max_num_seqs:
            request = self.waiting[0]
            need = request.prompt_tokens + request.generated
            if self.running and used + need > self.kv_capacity_tokens:
                return
            self.waiting.popleft()
            self.running.append(request)
            used += request.context_tokens

    def _plan_prefill(self, budget: int) -> dict[Request, int]:
        chunks: dict[Request, int] = {}
        for request in self.running:
            if budget <= 0:
                break
            if request.decoding:
                continue
            chunk = min(budget, request.prompt_tokens - request.prefilled)
            chunks[request] = chunk
            budget -= chunk
        return chunks

    def _k_for(self, batch: int) -> int:
        if self._adaptive is not None:
            return self._adaptive.steps_for(batch)
        return self.config.k_for_batch(batch)

    def _decode(self, request: Request, k: int, outcome: StepOutcome) -> int:
        """Verify one request's draft; returns how many drafted tokens were accepted."""
        accepted = 0
        if k > 0:
            curve = self._curves.get(request.task)
            if curve is None:
                curve = self._curves[request.task] = self._acceptance(
                    self.config.method, request.task
                )
            accepted = curve.draw(self._rng, k)
            outcome.drafts += 1
            outcome.draft_tokens += k
            outcome.accepted += accepted
            for position in range(accepted):
                outcome.accepted_per_position[position] += 1
        tokens = min(accepted + 1, request.max_tokens - request.generated)
        request.generated += tokens
        outcome.emitted[request.request_id] = tokens
        return accepted

    def _preempt_over_capacity(self) -> int:
        preempted = 0
        while len(self.running) > 1 and self.kv_used_tokens > self.kv_capacity_tokens:
            victim = self.running.pop()
            victim.prefilled = 0  # recompute: its prompt and output are prefilled again
            self.waiting.appendleft(victim)
            preempted += 1
        self.preemptions += preempted
        return preempted


def default_kv_capacity(performance: StepCost) -> int:
    """KV tokens that fit beside the weights at vLLM's default memory utilisation."""
    return performance.kv_capacity_tokens(GPU_MEMORY_UTILIZATION)
