"""SGLang 0.5.23's own adaptive speculation, emulated: per batch-size bucket, a list of candidate
step counts, moved by an EMA of accepted drafts.

Contract (the rules of sglang/srt/speculative/adaptive_spec_params.py, restated): a batch goes
to the bucket with the largest start not above its size. Each bucket starts at the configured
steps if they are among its candidates (else its middle candidate), with an EMA of accepted
drafts per request seeded at steps - 1. After every verify with steps > 0 the EMA moves by
EMA_ALPHA toward the batch's mean accepted drafts; after WARMUP_BATCHES, every
UPDATE_INTERVAL verifies, the bucket steps down while the EMA is at or below the previous
candidate - 0.5 (0.5 when that candidate is 0) plus its down hysteresis, otherwise up while the
EMA exceeds the current candidate - 0.5 plus its up hysteresis; a bucket at 0 steps probes the
next candidate at each update.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from specpilot.runtime.engines.sglang import DEFAULT_ADAPTIVE_BUCKETS

EMA_ALPHA = 0.2
UPDATE_INTERVAL = 5
WARMUP_BATCHES = 10
# Per-bucket (up, down) hysteresis of SGLang's default config.
DEFAULT_HYSTERESIS: Mapping[int, tuple[float, float]] = {
    1: (0.0, -0.25),
    8: (0.0, 0.0),
    32: (0.0, 0.0),
    64: (0.0, 0.0),
}


@dataclass(slots=True)
class _Bucket:
    candidates: tuple[int, ...]
    up: float
    down: float
    steps: int
    ema: float
    verifies: int = 0

    def observe(self, accepted: Sequence[int]) -> None:
        if self.steps > 0 and accepted:
            self.ema += EMA_ALPHA * (sum(accepted) / len(accepted) - self.ema)
        self.verifies += 1
        past_warmup = self.verifies - WARMUP_BATCHES
        if past_warmup > 0 and past_warmup % UPDATE_INTERVAL == 0:
            self._retarget()

    def _retarget(self) -> None:
        index = self.candidates.index(self.steps)
        if self.steps == 0:
            index = min(index + 1, len(self.candidates) - 1)
            if self.candidates[index] > 0 and self.ema < 0:
                self.ema = float(self.candidates[index] - 1)
            self.steps = self.candidates[index]
            return
        start = index
        while index > 0:
            previous = self.candidates[index - 1]
            threshold = (0.5 if previous == 0 else previous - 0.5) + self.down
            if self.ema > threshold:
                break
            index -= 1
        if index == start:
            while index < len(self.candidates) - 1:
                if self.ema <= self.candidates[index] - 0.5 + self.up:
                    break
                index += 1
        self.steps = self.candidates[index]


class SglangAdaptive:
    """The per-bucket step counts of one SGLang engine in default adaptive mode."""

    def __init__(self, initial_steps: int) -> None:
        self._starts = sorted(DEFAULT_ADAPTIVE_BUCKETS)
        self._buckets: dict[int, _Bucket] = {}
        for start in self._starts:
            candidates = tuple(sorted(DEFAULT_ADAPTIVE_BUCKETS[start]))
            steps = (
                initial_steps if initial_steps in candidates else candidates[len(candidates) // 2]
            )
            up, down = DEFAULT_HYSTERESIS[start]
            self._buckets[start] = _Bucket(candidates, up, down, steps, float(steps - 1))

    def _bucket(self, batch: int) -> _Bucket:
        index = max(0, bisect_right(self._starts, batch) - 1)
        return self._buckets[self._starts[index]]

    def steps_for(self, batch: int) -> int:
        return self._bucket(batch).steps

    def observe(self, batch: int, accepted: Sequence[int]) -> None:
        self._bucket(batch).observe(accepted)
