"""Acceptance along a draft: the chain model shared by the emulator (as ground truth, with
calibrated tables) and the tuner (as its physics prior, with online estimates).

Contract: position i (1-based) of a K-token draft is accepted, given positions 1..i-1 were,
with probability q_i = min(1, p x r^(i-1)). The expected acceptance length (bonus token
included) is 1 + sum_i prod_{j<=i} q_j; `draw` samples one step's accepted count.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class AcceptanceCurve:
    """Conditional acceptance q_i = min(1, p * r^(i-1)) along a draft."""

    p: float
    r: float = 1.0

    def conditional(self, position: int) -> float:
        return min(1.0, self.p * self.r ** (position - 1))

    def expected_accepted(self, k: int) -> float:
        total, survive = 0.0, 1.0
        for position in range(1, k + 1):
            survive *= self.conditional(position)
            total += survive
        return total

    def expected_length(self, k: int) -> float:
        """Mean tokens per drafted step, the bonus token included."""
        return 1.0 + self.expected_accepted(k)

    def length_range(self, k: int, p_sd: float) -> tuple[float, float]:
        """Expected lengths at K with p one standard deviation down and up."""
        low = AcceptanceCurve(max(self.p - p_sd, 0.0), self.r).expected_length(k)
        high = AcceptanceCurve(min(self.p + p_sd, 1.0), self.r).expected_length(k)
        return low, high

    def draw(self, rng: random.Random, k: int) -> int:
        """Accepted tokens of one K-token draft."""
        for position in range(1, k + 1):
            if rng.random() >= self.conditional(position):
                return position - 1
        return k


def p_for_length(length: float, k: int, r: float) -> float:
    """The p whose chain with decay r gives this acceptance length at K (Brent's method; the
    length is clamped to what a K-token draft can give, 1 to K + 1, and p to 0..1)."""
    from scipy.optimize import brentq  # lazy: importing the tuner must not pull in numpy

    target = min(max(length, 1.0), 1.0 + k)

    def shortfall(p: float) -> float:
        return AcceptanceCurve(p, r).expected_length(k) - target

    if shortfall(0.0) >= 0.0:
        return 0.0
    if shortfall(1.0) <= 0.0:
        return 1.0
    return float(brentq(shortfall, 0.0, 1.0, xtol=1e-15))
