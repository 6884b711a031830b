"""What an engine did over a stretch of simulated time, and the stepwise way to get it.

Contract: `Progress` sums the steps an engine ran between two times (tokens, prefill, drafts and
accepted tokens by position, the integral of the decode batch over time, busy time, finished
requests, and per step its duration and decode batch for an inter-token-latency histogram).
`advance_stepwise(core, now, until)` is the reference `EngineCore.advance`: `core.step` in a
loop while a step can start before `until`; it returns the time the last step ended (`until`
when the engine went idle) and the Progress. The event-driven `EngineCore.advance`
(`fast_core`) must agree with it; SGLang's own adaptive mode runs on it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from specpilot.runtime.emulator.core import EngineCore, Request, StepOutcome


def _no_gaps() -> npt.NDArray[np.float64]:
    return np.zeros(0, dtype=np.float64)


def _no_weights() -> npt.NDArray[np.int64]:
    return np.zeros(0, dtype=np.int64)


@dataclass(slots=True)
class Progress:
    tokens: int = 0
    """Output tokens emitted: decode tokens plus first tokens from a prompt's last chunk."""
    prefill_tokens: int = 0
    drafts: int = 0
    """Request-steps that verified a draft (K > 0)."""
    draft_tokens: int = 0
    accepted: int = 0
    accepted_per_position: list[int] = field(default_factory=list)
    """Drafts whose i-th drafted token was accepted, i = 0, 1, ... (as long as the deepest K)."""
    batch_time: float = 0.0
    """Integral of the decode batch over time (s x requests)."""
    busy_time: float = 0.0
    """Seconds spent in steps."""
    steps: int = 0
    finished: list[Request] = field(default_factory=list)
    """Requests that finished, with first_token_s and finished_s set."""
    itl_gaps: npt.NDArray[np.float64] = field(default_factory=_no_gaps)
    """Per step, its duration: the gap of the chunk each decoding request received."""
    itl_weights: npt.NDArray[np.int64] = field(default_factory=_no_weights)
    """Per step, its decode batch (how many requests received a chunk)."""

    @property
    def acceptance_length(self) -> float | None:
        """Mean tokens per verified draft, the bonus token included."""
        return 1 + self.accepted / self.drafts if self.drafts else None

    def add_accepted(self, counts: list[int]) -> None:
        """Add per-position accepted counts, growing the list to the deeper of the two."""
        mine = self.accepted_per_position
        if len(mine) < len(counts):
            mine.extend([0] * (len(counts) - len(mine)))
        for position, count in enumerate(counts):
            mine[position] += count

    def extend(self, other: Progress) -> None:
        """Add `other` (a later stretch of the same engine) to this one."""
        self.tokens += other.tokens
        self.prefill_tokens += other.prefill_tokens
        self.drafts += other.drafts
        self.draft_tokens += other.draft_tokens
        self.accepted += other.accepted
        self.add_accepted(other.accepted_per_position)
        self.batch_time += other.batch_time
        self.busy_time += other.busy_time
        self.steps += other.steps
        self.finished.extend(other.finished)
        self.itl_gaps = np.concatenate((self.itl_gaps, other.itl_gaps))
        self.itl_weights = np.concatenate((self.itl_weights, other.itl_weights))


def advance_stepwise(core: EngineCore, now: float, until: float) -> tuple[float, Progress]:
    """`core.step` from `now` while a step can start before `until` (the exact reference)."""
    progress = Progress(accepted_per_position=[0] * core.config.max_k)
    gaps: list[float] = []
    weights: list[int] = []
    while now < until:
        outcome = core.step(now)
        if outcome is None:
            now = until
            break
        _add_step(progress, outcome)
        gaps.append(outcome.duration_s)
        weights.append(outcome.decode_batch)
        now += outcome.duration_s
    progress.itl_gaps = np.array(gaps, dtype=np.float64)
    progress.itl_weights = np.array(weights, dtype=np.int64)
    return now, progress


def _add_step(progress: Progress, outcome: StepOutcome) -> None:
    progress.tokens += sum(outcome.emitted.values())
    progress.prefill_tokens += outcome.prefill_tokens
    progress.drafts += outcome.drafts
    progress.draft_tokens += outcome.draft_tokens
    progress.accepted += outcome.accepted
    progress.add_accepted(outcome.accepted_per_position)
    progress.batch_time += outcome.decode_batch * outcome.duration_s
    progress.busy_time += outcome.duration_s
    progress.steps += 1
    progress.finished.extend(outcome.finished)
