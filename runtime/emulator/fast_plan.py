"""The decoding batch's next steps, drawn ahead: fast mode's plan.

Contract: a request's acceptance does not depend on the batch it runs in, so `Draws` draws it
per request, ahead: per future decode step F, the chain's first rejected position capped at the
config's max K (P(F >= f) = q_1 x ... x q_f, the chain's per-position probabilities), from one
seeded numpy generator in blocks per task, handed out in the order requests ask (one seed, one
history). A step at K accepts min(F, K) drafted tokens, valid for whatever K the batch size
picks, and emits that plus one, capped at what the request has left.

A `Plan` lays out `width` engine steps from step `origin` at one K. Per row (a decoding
request): its cumulative tokens after each step and the step it finishes in; per step: the
cumulative tokens of all rows (the KV growth) and, per row, 1 + the tokens it accepted (binned
into per-position counts for any run of steps). `add_one` adds a request that starts decoding
(a prompt's last chunk) in a handful of numpy calls; `add_many` lays out a whole batch (a new
plan: K changed, a request was preempted, or the horizon was reached). At K = 0 every row
emits one token a step and the plan needs no arrays. The plan never changes a Request but in
`write_back`; `generated_at` and `cursor_at` give a row's state at a step.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from specpilot.tuner import AcceptanceCurve

if TYPE_CHECKING:
    from specpilot.runtime.emulator.core import Request

Draw = npt.NDArray[np.int64]

BLOCK = 1 << 15
"""Draws made at once per task."""
HEADROOM = 1.25
"""Draws given a request beyond its expected number of steps (more are added when it runs out)."""
_STEPS = np.arange(1 << 12, dtype=np.int64)


class Draws:
    """Per request, F + 1 (the tokens a step emits when K >= F) for each of its future decode
    steps, indexed by the decode steps it has taken at K > 0 (its cursor). A request gets the
    draws its expected steps need with some headroom, plus `slack` (a plan's width: a plan
    reads that far ahead), and more if it runs out."""

    def __init__(
        self,
        *,
        rng: np.random.Generator,
        max_k: int,
        curve: Callable[[str], AcceptanceCurve],
        slack: int,
    ) -> None:
        self._rng = rng
        self._slack = slack
        self._max_k = max_k
        self._curve = curve
        self._tasks: dict[str, tuple[npt.NDArray[np.float64], float]] = {}
        self._blocks: dict[str, tuple[Draw, int]] = {}
        self._by_request: dict[Request, Draw] = {}

    def _task(self, task: str) -> tuple[npt.NDArray[np.float64], float]:
        known = self._tasks.get(task)
        if known is None:
            curve = self._curve(task)
            survive, thresholds = 1.0, []
            for position in range(1, self._max_k + 1):
                survive *= curve.conditional(position)
                thresholds.append(1.0 - survive)  # P(F <= position - 1)
            known = np.array(thresholds), curve.expected_length(self._max_k)
            self._tasks[task] = known
        return known

    def _take(self, task: str, n: int) -> Draw:
        block, used = self._blocks.get(task, (_STEPS[:0], 0))
        if used + n > len(block):
            thresholds, _ = self._task(task)
            uniform = self._rng.random(max(BLOCK, n))
            block, used = thresholds.searchsorted(uniform, side="right") + 1, 0
        self._blocks[task] = (block, used + n)
        return block[used : used + n]

    def view(self, request: Request, cursor: int, length: int, remaining: int) -> Draw:
        """`length` draws of `request` from its `cursor` on."""
        need = cursor + length
        draws = self._by_request.get(request)
        if draws is None:
            _, mean_length = self._task(request.task)
            expected = cursor + math.ceil(remaining / mean_length * HEADROOM) + self._slack
            draws = self._take(request.task, max(need, expected))
            self._by_request[request] = draws
        elif need > len(draws):
            more = self._take(request.task, max(need - len(draws), len(draws)))
            draws = self._by_request[request] = np.concatenate((draws, more))
        return draws[cursor:need]

    def forget(self, request: Request) -> None:
        self._by_request.pop(request, None)


class Plan:
    """`width` steps from global step `origin` at K = `k`, for the rows added so far. At K = 0
    every row emits one token a step and the plan needs no arrays."""

    def __init__(self, *, origin: int, width: int, k: int, max_k: int, rows: int) -> None:
        self.origin = origin
        self.width = width
        self.k = k
        self._max_k = max_k
        self.requests: list[Request] = []
        self.row_of: dict[Request, int] = {}
        """Rows still decoding (the engine removes a row when its request finishes or is
        preempted): their number is the decode batch."""
        self._start: list[int] = []
        self._base: list[int] = []
        self._cursor: list[int] = []
        self.ends: dict[int, list[int]] = {}
        """Local step -> rows that finish at its end."""
        shape = (max(rows, 1), width) if k else (0, 0)
        self._cum = np.zeros(shape, dtype=np.int64)
        """Per row, its tokens emitted in this plan up to and including each step (K > 0)."""
        self._verified = np.zeros(shape[::-1], dtype=np.int64)
        """Per step and row, 1 + the drafted tokens the row accepted; 0 where it did not
        decode (steps first, so a run of steps is one contiguous block)."""
        self._total = np.zeros(width if k else 0, dtype=np.int64)
        self.total: list[int] = [0] * width if k else []
        """Per step, the tokens all rows emitted in this plan up to and including it (K > 0)."""

    def _new_row(self, request: Request, start: int, base: int, cursor: int) -> int:
        row = len(self.requests)
        if self.k and row >= len(self._cum):
            rows = 2 * row + 1
            cum = np.zeros((rows, self.width), dtype=np.int64)
            cum[:row] = self._cum
            verified = np.zeros((self.width, rows), dtype=np.int64)
            verified[:, :row] = self._verified
            self._cum, self._verified = cum, verified
        self.requests.append(request)
        self.row_of[request] = row
        self._start.append(start)
        self._base.append(base)
        self._cursor.append(cursor)
        return row

    def add_one(
        self, request: Request, generated: int, cursor: int, start: int, draws: Draws
    ) -> None:
        """`request` decodes from local step `start` (< width), having `generated` tokens and
        `cursor` draws consumed."""
        length = self.width - start
        remaining = request.max_tokens - generated
        row = self._new_row(request, start, generated, cursor)
        k = self.k
        if not k:
            if remaining <= length:
                self.ends.setdefault(start + remaining - 1, []).append(row)
            return
        emitted = draws.view(request, cursor, length, remaining)
        if k < self._max_k:
            emitted = np.minimum(emitted, k + 1)
        cum = np.add.accumulate(emitted)
        last = int(cum.searchsorted(remaining))
        if last < length:
            cum[last:] = remaining
            self.ends.setdefault(start + last, []).append(row)
        self._cum[row, start:] = cum
        self._total[start:] += cum
        self._verified[start : start + last + 1, row] = emitted[: last + 1]
        self.total = self._total.tolist()

    def add_many(
        self,
        requests: Sequence[Request],
        generated: Sequence[int],
        cursors: Sequence[int],
        draws: Draws,
    ) -> None:
        """Rows decoding from this plan's first step (a new plan's batch)."""
        n, width, k = len(requests), self.width, self.k
        for request, base, cursor in zip(requests, generated, cursors, strict=True):
            self._new_row(request, 0, base, cursor)
        if not k:
            for row, (request, base) in enumerate(zip(requests, generated, strict=True)):
                if request.max_tokens - base <= width:
                    self.ends.setdefault(request.max_tokens - base - 1, []).append(row)
            return
        if n == 0:
            return
        remaining = np.array([r.max_tokens - g for r, g in zip(requests, generated, strict=True)])
        emitted = np.concatenate(
            [
                draws.view(r, c, width, int(left))
                for r, c, left in zip(requests, cursors, remaining, strict=True)
            ]
        ).reshape(n, width)
        if k < self._max_k:
            emitted = np.minimum(emitted, k + 1)
        cum = np.add.accumulate(emitted, axis=1)
        last = (cum < remaining[:, None]).sum(axis=1)
        np.minimum(cum, remaining[:, None], out=cum)
        self._cum[:n] = cum
        self._total += cum.sum(axis=0)
        self._verified[:, :n] = np.where(_STEPS[:width] <= last[:, None], emitted, 0).T
        for row, stop in enumerate(last.tolist()):
            if stop < width:
                self.ends.setdefault(stop, []).append(row)
        self.total = self._total.tolist()

    def generated_at(self, row: int, step: int) -> int:
        """The row's generated tokens before local step `step` (0..width)."""
        if not self.k:
            done = max(0, step - self._start[row])
            return min(self._base[row] + done, self.requests[row].max_tokens)
        return self._base[row] + (int(self._cum[row, step - 1]) if step > 0 else 0)

    def cursor_at(self, row: int, step: int) -> int:
        """The row's draws consumed before local step `step` (draws are used at K > 0 only)."""
        if not self.k:
            return self._cursor[row]
        return self._cursor[row] + max(0, step - self._start[row])

    def write_back(self, step: int) -> None:
        """Set every row still decoding's `generated` to its count before local step `step`."""
        base, start = self._base, self._start
        if not self.k:  # a row still decoding emitted one token a step since it started
            for request, row in self.row_of.items():
                request.generated = base[row] + step - start[row]
        elif step == 0:
            for request, row in self.row_of.items():
                request.generated = base[row]
        else:
            column = self._cum[: len(self.requests), step - 1].tolist()
            for request, row in self.row_of.items():
                request.generated = base[row] + column[row]

    def accepted_counts(self, first: int, stop: int) -> list[int]:
        """Drafts in local steps first..stop-1 that accepted 0, 1, ... max K tokens."""
        bins = self._max_k + 1
        if stop <= first or not self.k:
            return [0] * bins
        block = self._verified[first:stop].ravel()
        counts: list[int] = np.bincount(block, minlength=bins + 1).tolist()
        return counts[1:]
