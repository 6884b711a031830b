"""Fast mode's engine: `EngineCore.advance` from event to event instead of draw by draw.

Contract: `FastCore(core, generation).advance(now, until)` runs the steps `core.step` would run
from `now` while one can start before `until`, under the same rules (FIFO admission within
max_num_seqs and the KV capacity; the decode batch first, at the K its size picks from the
config's schedule; chunked prefill in the rest of the token budget, a prompt's last chunk
yielding its first token; KV growth past capacity preempting the newest request back to the
queue), and returns when the last step ended (`until` when the engine went idle) and a
`Progress`. It keeps the running requests' counters in a `Plan` and writes them back to the
Request objects before it returns; `EngineCore.step` drops this state (the next `advance`
starts a new one from the Request objects).

How it is fast: each request's acceptance is drawn ahead when it starts decoding
(`fast_plan.Draws`), so the batch's next steps are known (`fast_plan.Plan`: per row its
cumulative tokens and finishing step, per step the decode batch and the KV growth). Between
events the loop only adds up step times, which are affine in the KV tokens at a fixed batch and
K (one multiply-add per step, the coefficients read once per batch size from the step-cost
model). Events: a prompt's last chunk (the request joins the plan), a completion (admission),
KV preemption and the batch crossing a schedule tier (the plan is redrawn for the rows' current
state), and the plan's horizon. It draws acceptance in another order than `step`, so the two
agree in distribution, exactly when acceptance is certain; one seed gives one result.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from specpilot.runtime.emulator.fast_plan import Draws, Plan
from specpilot.runtime.emulator.progress import Progress

if TYPE_CHECKING:
    from specpilot.runtime.emulator.core import EngineCore, Request

WIDTH = 64
"""Steps a plan lays out ahead."""
_PROBE_KV = 1 << 20
_STATS = 3


class FastCore:
    """The event-driven state of one `EngineCore`."""

    def __init__(self, core: EngineCore, generation: int) -> None:
        self.core = core
        config = core.config
        self._method = config.method
        self._max_k = config.max_k
        self._k_by_batch = [config.k_for_batch(max(b, 1)) for b in range(core.max_num_seqs + 1)]
        self._draws = Draws(
            rng=np.random.default_rng((core.seed, generation)),
            max_k=self._max_k,
            curve=core.curve_for,
            slack=WIDTH,
        )
        self._affine: dict[int, list[tuple[float, float] | None]] = {}
        self._exact = False
        """Set if a step time turned out not to be affine in the KV tokens."""
        self._step = 0
        self._kv = core.kv_used_tokens
        self._prefilling = [r for r in core.running if not r.decoding]
        self._cursor: dict[Request, int] = {}
        decoding = [r for r in core.running if r.decoding]
        k = self._k_by_batch[len(decoding)] if decoding else 0
        self._plan = self._build(k, decoding, [r.generated for r in decoding])

    # -- plans -------------------------------------------------------------------------------

    def _build(self, k: int, rows: list[Request], generated: list[int]) -> Plan:
        plan = Plan(origin=self._step, width=WIDTH, k=k, max_k=self._max_k, rows=len(rows) + 16)
        cursors = [self._cursor.pop(r, 0) for r in rows]
        plan.add_many(rows, generated, cursors, self._draws)
        return plan

    def _replan(self, plan: Plan, k: int) -> Plan:
        """A new plan from this step on, for the running requests that decode, at K = k."""
        here = self._step - plan.origin
        rows: list[Request] = []
        generated: list[int] = []
        for request in self.core.running:
            if not request.decoding:
                continue
            row = plan.row_of.get(request)
            if row is None:  # joined at the old plan's horizon
                generated.append(request.generated)
            else:
                generated.append(plan.generated_at(row, here))
                self._cursor[request] = plan.cursor_at(row, here)
            rows.append(request)
        return self._build(k, rows, generated)

    def _join(self, plan: Plan, request: Request, start: int) -> None:
        if start < plan.width:
            cursor = self._cursor.pop(request, 0)
            plan.add_one(request, request.generated, cursor, start, self._draws)
        # else: the next plan picks it up from `core.running`

    # -- step time -------------------------------------------------------------------------

    def _decode_times(self, k: int) -> list[tuple[float, float] | None]:
        """Per decode batch, the (intercept, slope) of the step time in KV tokens at K = k
        (filled as batch sizes occur)."""
        times = self._affine.get(k)
        if times is None:
            times = self._affine[k] = [None] * (self.core.max_num_seqs + 1)
        return times

    def _fit(self, batch: int, k: int) -> tuple[float, float]:
        """The step time of a decode step is affine in the KV tokens (the attention reads);
        checked once per batch size, else every step is computed exactly."""
        low = self._step_time(batch, k, 0, 0)
        high = self._step_time(batch, k, 0, _PROBE_KV)
        slope = (high - low) / _PROBE_KV
        middle = self._step_time(batch, k, 0, _PROBE_KV // 2)
        if abs(low + slope * (_PROBE_KV // 2) - middle) > 1e-12 * max(high, 1e-9):
            self._exact = True
        return low, slope

    def _step_time(self, batch: int, k: int, prefill: int, kv: int) -> float:
        return self.core.performance.step_time(
            method=self._method, decode_batch=batch, k=k, prefill_tokens=prefill, kv_tokens=kv
        )

    # -- the loop ------------------------------------------------------------------------------

    def _admit(self, plan: Plan) -> None:
        core = self.core
        running, waiting = core.running, core.waiting
        used = self._kv
        while waiting and len(running) < core.max_num_seqs:
            request = waiting[0]
            need = request.prompt_tokens + request.generated
            if running and used + need > core.kv_capacity_tokens:
                return
            waiting.popleft()
            running.append(request)
            used += request.context_tokens
            self._kv += request.context_tokens
            if request.decoding:  # nothing to prefill: it decodes in this very step
                self._join(plan, request, self._step - plan.origin)
            else:
                self._prefilling.append(request)

    def _finish(self, request: Request, end: float, finished: list[Request]) -> None:
        request.finished_s = end
        self.core.running.remove(request)
        self._kv -= request.context_tokens
        self._draws.forget(request)
        self._cursor.pop(request, None)
        finished.append(request)

    def advance(self, now: float, until: float) -> tuple[float, Progress]:
        core = self.core
        running, waiting, prefilling = core.running, core.waiting, self._prefilling
        k_by_batch, capacity = self._k_by_batch, core.kv_capacity_tokens
        plan = self._plan
        drafted = [0] * (_STATS + self._max_k)  # drafts, draft tokens, accepted, by position
        finished: list[Request] = []
        gaps: list[float] = []
        weights: list[int] = []
        flushed = self._step - plan.origin
        tokens, prefilled, batch_time, busy = 0, 0, 0.0, 0.0
        decode_k, decode_times = -1, self._decode_times(0)
        admit = True
        while now < until:
            if admit:
                admit = False
                if waiting:
                    self._admit(plan)
            if not running:
                now = until
                break
            here = self._step - plan.origin
            if here >= plan.width:
                self._flush(plan, flushed, here, drafted)
                plan = self._replan(plan, plan.k)
                here = flushed = 0
            batch = len(plan.row_of)
            k = k_by_batch[batch] if batch else 0
            if batch and k != plan.k:
                self._flush(plan, flushed, here, drafted)
                plan = self._replan(plan, k)
                here = flushed = 0
            kv = self._kv
            total = plan.total
            fit: tuple[float, float] | None = None
            if not prefilling and not self._exact:
                if decode_k != k:
                    decode_k, decode_times = k, self._decode_times(k)
                fit = decode_times[batch]
                if fit is None:
                    fit = decode_times[batch] = self._fit(batch, k)
                    fit = None if self._exact else fit
            if fit is not None:
                # Pure decode steps until the next event: the batch and K are fixed, the step
                # time is affine in the KV tokens, which grow by what the plan says.
                intercept, slope = fit
                ends, width, first = plan.ends, plan.width, here
                before = (total[here - 1] if here else 0) if plan.k else 0
                run_time = 0.0
                while now < until and here < width and here not in ends:
                    emitted = total[here] - before if plan.k else batch
                    if kv + emitted > capacity:
                        break
                    duration = intercept + slope * kv
                    gaps.append(duration)
                    run_time += duration
                    now += duration
                    kv += emitted
                    tokens += emitted
                    before += emitted
                    here += 1
                weights.extend([batch] * (here - first))
                busy += run_time
                batch_time += batch * run_time
                self._kv = kv
                self._step = plan.origin + here
                if now >= until or here >= width:
                    continue
                duration = intercept + slope * kv
                chunks: list[tuple[Request, int]] = []
            else:
                chunks, prefill = self._chunks(batch * (k + 1))
                prefilled += prefill
                duration = self._step_time(batch, k, prefill, kv)
            end = now + duration
            gaps.append(duration)
            weights.append(batch)
            batch_time += batch * duration
            busy += duration
            emitted = (total[here] - (total[here - 1] if here else 0)) if plan.k else batch
            tokens += emitted
            self._kv = kv + emitted
            for request, chunk in chunks:
                request.prefilled += chunk
                self._kv += chunk
                if request.prefilled < request.prompt_tokens:
                    break
                prefilling.pop(0)
                request.generated += 1
                self._kv += 1
                tokens += 1
                if request.first_token_s is None:
                    request.first_token_s = end
                if request.generated >= request.max_tokens:
                    self._finish(request, end, finished)
                    admit = True
                else:
                    self._join(plan, request, here + 1)
            finishing = plan.ends.get(here)
            if finishing:
                for row in finishing:
                    request = plan.requests[row]
                    del plan.row_of[request]
                    request.generated = request.max_tokens
                    self._finish(request, end, finished)
                admit = True
            now = end
            self._step += 1
            if self._kv > capacity and len(running) > 1:
                admit = True
                redraw = False
                while len(running) > 1 and self._kv > capacity:
                    redraw |= self._preempt(plan, here + 1)
                if redraw:
                    self._flush(plan, flushed, here + 1, drafted)
                    plan = self._replan(plan, plan.k)
                    flushed = 0
        self._flush(plan, flushed, self._step - plan.origin, drafted)
        plan.write_back(self._step - plan.origin)
        self._plan = plan
        return now, Progress(
            tokens=tokens,
            prefill_tokens=prefilled,
            drafts=drafted[0],
            draft_tokens=drafted[1],
            accepted=drafted[2],
            accepted_per_position=drafted[_STATS:],
            batch_time=batch_time,
            busy_time=busy,
            steps=len(gaps),
            finished=finished,
            itl_gaps=np.array(gaps, dtype=np.float64),
            itl_weights=np.array(weights, dtype=np.int64),
        )

    def _chunks(self, decode_tokens: int) -> tuple[list[tuple[Request, int]], int]:
        """This step's prefill chunks, in queue order, in the budget the decode batch leaves."""
        budget, prefill = self.core.max_batched_tokens - decode_tokens, 0
        chunks: list[tuple[Request, int]] = []
        for request in self._prefilling:
            if budget <= 0:
                break
            chunk = min(budget, request.prompt_tokens - request.prefilled)
            chunks.append((request, chunk))
            budget -= chunk
            prefill += chunk
        return chunks, prefill

    def _preempt(self, plan: Plan, after: int) -> bool:
        """Preempt the newest running request (recompute); True if it was decoding in `plan`."""
        victim = self.core.running.pop()
        row = plan.row_of.pop(victim, None)
        if row is not None:
            victim.generated = plan.generated_at(row, after)
            self._cursor[victim] = plan.cursor_at(row, after)
        elif victim in self._prefilling:
            self._prefilling.remove(victim)
        self._kv -= victim.context_tokens
        victim.prefilled = 0
        self.core.waiting.appendleft(victim)
        self.core.preemptions += 1
        return row is not None

    def _flush(self, plan: Plan, first: int, stop: int, drafted: list[int]) -> None:
        """Add the drafts of the plan's steps first..stop-1 to `drafted` (drafts, draft
        tokens, accepted tokens, then drafts accepted past each position)."""
        if stop <= first or not plan.k:
            return
        counts = plan.accepted_counts(first, stop)
        drafts = sum(counts)
        drafted[0] += drafts
        drafted[1] += drafts * plan.k
        deeper = 0
        for position in range(self._max_k, 0, -1):
            deeper += counts[position]
            drafted[2] += deeper
            drafted[_STATS + position - 1] += deeper
