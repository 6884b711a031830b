"""Acceptance as a posterior: per draft position a Beta over the conditional acceptance q_i,
from the published prior (a mixture over tasks) and the engine's discounted counts; the chain
(p, r) of `acceptance.py` is the precision-weighted fit to the Beta means.

Contract: `MethodPrior` is one method's published prior: per task a chain, the chain the state
started from (`anchor`, for traffic of the task weights `anchor_mix`, one task) and how far the
truth may sit from it (`p_sd`). Under task weights w its conditional acceptance at position i
is the mixture's, S_i(w) / S_{i-1}(w) with S_i(w) = sum_t w_t prod_{j<=i} q_{t,j} (what an
engine's counters measure on mixed traffic), moved in logit space by the anchor's offset from
the table at `anchor_mix` (none for a published prior; a user's own prior keeps its offset,
and only the task effect is borrowed).
It enters as `n0` pseudo-drafts run through that chain: position i gets n0 x S_{i-1} trials,
n0 chosen so position 1's Beta has the standard deviation `p_sd`.

`Counts` are what the engine measured: accepted and tried drafts per position, discounted
(each window of the method multiplies the old ones by FORGET, a window counts for at most
WINDOW_ESS drafts, the whole for at most MAX_ESS: exponential forgetting with a capped
effective sample size, so the estimate follows drift), with the task weights they were
measured under. `estimate(prior, counts, mix)` pools the two per position, moves the result
from the data's task weights to `mix` (the logit shift of the prior between them: a method
that ran under chat and now sits idle while the traffic turns to code follows the prior's
code effect), fits (p, r) over the measured positions (r stays the prior's until two are
measured) and gives the posterior standard deviation of q_1 as p's spread.

Counts come from vLLM's per-position accepted counts (`counts_from_survival`: position i's
trials are the drafts that reached it, accepted_{i-1}, with accepted_0 the drafts) or, where
an engine gives only the mean length (SGLang), from the chain through a decay r that gives
that length (`counts_from_length`, read with the prior's r: a length at one K
cannot tell p from r, and reading it with the estimate's own r would let r wander on its
own feedback). Pure, no numpy.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from specpilot.tuner._model.acceptance import AcceptanceCurve, p_for_length

MAX_POSITIONS = 16
"""Draft positions tracked per method (the deepest K a config may have)."""
FIT_POSITIONS = 5
"""Positions the prior's decay r is read over until the engine has measured two."""
WINDOW_ESS = 256.0
"""Drafts one window counts for at most: a busy window's thousands of drafts say little more
about next minute's traffic than a few hundred do."""
FORGET = 0.75
"""Weight of the old counts when the method's next window arrives: with full windows the newest
holds a quarter of the weight (about the old moving average's 0.3), and the estimate follows
drift within a few windows."""
MAX_ESS = WINDOW_ESS / (1.0 - FORGET)
"""Effective drafts behind an estimate at most (the steady state of full windows)."""
IDLE_FORGET = 0.98
"""Per window another config runs: what a method measured an hour ago is less sure now."""
MIN_PRIOR_DRAFTS = 1.0
R_BOUNDS = (0.3, 1.5)
"""The decay r a fit may report: beyond these the chain model itself is wrong."""
_EPS = 1e-6


@dataclass(frozen=True, slots=True)
class MethodPrior:
    """One method's published prior: per-task chains, the chain the state started from and
    the task weights it holds at, and how far the truth may sit from it (sd of p)."""

    tasks: tuple[AcceptanceCurve, ...]
    anchor: AcceptanceCurve
    anchor_mix: tuple[float, ...]
    p_sd: float

    def conditionals(self, mix: Sequence[float], positions: int) -> tuple[float, ...]:
        """Prior conditional acceptance at positions 1..`positions` under task weights `mix`."""
        return _conditionals(self, tuple(mix), positions)

    def task_lengths(self, k: int) -> tuple[float, ...]:
        """Expected length at K per task (the table's, before the anchor's offset): the mean
        accepted count is linear in the task weights, so these are its sensitivities."""
        return tuple(curve.expected_length(k) for curve in self.tasks)


@dataclass(frozen=True, slots=True)
class Counts:
    """Discounted engine counts of one method: per position accepted and tried drafts, and
    the task weights they were measured under."""

    accepted: tuple[float, ...]
    trials: tuple[float, ...]
    mix: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class Estimate:
    """The posterior of one method: the fitted chain, the sd of p (position 1's Beta), the
    prior's decay, and per measured position the Beta means and their pseudo-counts."""

    curve: AcceptanceCurve
    p_sd: float
    prior_r: float
    """The prior's decay under the current task weights (what a length alone is read with)."""
    means: tuple[float, ...]
    precisions: tuple[float, ...]


def prior_drafts(q1: float, p_sd: float) -> float:
    """Pseudo-drafts n0 whose Beta at position 1 has mean q1 and standard deviation p_sd."""
    q1 = min(max(q1, _EPS), 1.0 - _EPS)
    return max(q1 * (1.0 - q1) / max(p_sd, _EPS) ** 2 - 1.0, MIN_PRIOR_DRAFTS)


def estimate(prior: MethodPrior, counts: Counts | None, mix: Sequence[float]) -> Estimate:
    """Posterior of one method under task weights `mix` (see the module's contract)."""
    mix = tuple(mix)
    measured = len(counts.trials) if counts is not None else 0
    positions = max(measured, 1)
    data_mix = counts.mix if counts is not None else mix
    q_data = prior.conditionals(data_mix, max(positions, FIT_POSITIONS))
    q_now = q_data if data_mix == mix else prior.conditionals(mix, max(positions, FIT_POSITIONS))
    n0 = prior_drafts(q_data[0], prior.p_sd)
    means, precisions = [], []
    survive = 1.0
    for i in range(positions):
        pseudo = n0 * survive
        survive *= q_data[i]
        accepted, tried = pseudo * q_data[i], pseudo
        if i < measured and counts is not None:
            accepted += counts.accepted[i]
            tried += counts.trials[i]
        pooled = accepted / tried if tried > 0 else q_data[i]
        means.append(_sigmoid(_logit(pooled) + _logit(q_now[i]) - _logit(q_data[i])))
        precisions.append(tried)
    prior_r = fit_chain(q_now[:FIT_POSITIONS], [1.0] * FIT_POSITIONS, prior.anchor.r).r
    if measured >= 2:
        curve = fit_chain(means, precisions, prior.anchor.r)
    else:
        # One position measured (or none) says nothing of the decay: the prior's r. Fitting
        # the prior's deeper positions beside a measured first one would read their gap as
        # a decay.
        curve = AcceptanceCurve(min(max(means[0], _EPS), 1.0), prior_r)
    p_sd = math.sqrt(means[0] * (1.0 - means[0]) / (precisions[0] + 1.0))
    return Estimate(
        curve=curve,
        p_sd=p_sd,
        prior_r=prior_r,
        means=tuple(means),
        precisions=tuple(precisions),
    )


def fit_chain(
    means: Sequence[float], precisions: Sequence[float], r_default: float
) -> AcceptanceCurve:
    """(p, r) of q_i = p r^(i-1): p is position 1's mean, r the least-squares slope of
    log(q_i / p) through that anchor, each deeper position weighted by the precision of its
    log mean (N q / (1 - q) for a Beta of N pseudo-counts).

    Why anchored: position 1 sets most of the acceptance length, and a free intercept lets a
    deep position's precision (near-certain conditionals carry huge weight) drag p away from
    it: survival shares (1.7%, 1.7%, 1.7%) (length 1.05, conditionals 1.0 past the first) fit
    freely as p = 0.43, length 1.99.
    """
    if not means:
        return AcceptanceCurve(0.0, r_default)
    p = min(max(means[0], _EPS), 1.0)
    log_p = math.log(min(max(means[0], _EPS), 1.0 - _EPS))
    sxx = sxy = 0.0
    for i, (mean, n) in enumerate(zip(means, precisions, strict=True)):
        if i == 0:
            continue
        q = min(max(mean, _EPS), 1.0 - _EPS)
        weight = n * q / max(1.0 - q, 1e-3)
        sxx += weight * i * i
        sxy += weight * i * (math.log(q) - log_p)
    log_r = sxy / sxx if sxx > 0 else math.log(r_default)
    log_r = min(max(log_r, math.log(R_BOUNDS[0])), math.log(R_BOUNDS[1]))
    return AcceptanceCurve(p, math.exp(log_r))


def absorb(
    counts: Counts | None,
    accepted: Sequence[float],
    trials: Sequence[float],
    mix: Sequence[float],
) -> Counts:
    """`counts` discounted by FORGET plus one window's (at most WINDOW_ESS drafts), the whole
    capped at MAX_ESS drafts; the task weights pooled the same way."""
    new = trials[0] if trials else 0.0
    if new <= 0:
        return counts if counts is not None else Counts((), (), tuple(mix))
    scale = min(1.0, WINDOW_ESS / new)
    old_acc = counts.accepted if counts is not None else ()
    old_tried = counts.trials if counts is not None else ()
    size = min(MAX_POSITIONS, max(len(old_tried), len(trials)))
    acc = [FORGET * _at(old_acc, i) + scale * _at(accepted, i) for i in range(size)]
    tried = [FORGET * _at(old_tried, i) + scale * _at(trials, i) for i in range(size)]
    cap = min(1.0, MAX_ESS / tried[0]) if tried[0] > 0 else 1.0
    old_weight = FORGET * _at(old_tried, 0)
    new_weight = scale * new
    old_mix = counts.mix if counts is not None else tuple(mix)
    pooled = [
        (old_weight * o + new_weight * n) / (old_weight + new_weight)
        for o, n in zip(old_mix, mix, strict=True)
    ]
    return Counts(
        accepted=tuple(round(a * cap, 3) for a in acc),
        trials=tuple(round(t * cap, 3) for t in tried),
        mix=tuple(round(w, 4) for w in pooled),
    )


def idle(counts: Counts) -> Counts:
    """One window in which the method did not run: its counts fade toward the prior."""
    return Counts(
        accepted=tuple(round(a * IDLE_FORGET, 3) for a in counts.accepted),
        trials=tuple(round(t * IDLE_FORGET, 3) for t in counts.trials),
        mix=counts.mix,
    )


def counts_from_survival(
    survival: Sequence[float], drafts: float
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """vLLM: `survival[i]` is accepted_at_position_(i+1) / drafts. Position i's trials are the
    drafts that reached it (accepted at i-1, the drafts themselves at position 1)."""
    accepted, trials = [], []
    reached = drafts
    for share in survival:
        hits = min(max(share, 0.0) * drafts, reached)
        accepted.append(hits)
        trials.append(reached)
        reached = hits
    return tuple(accepted), tuple(trials)


def counts_from_length(
    length: float, k: int, r: float, drafts: float
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """SGLang: only the mean length at K. The chain with decay r whose length at K is
    `length`, run for `drafts` drafts: its expected per-position counts."""
    curve = AcceptanceCurve(p_for_length(length, k, r), r)
    accepted, trials = [], []
    reached = drafts
    for position in range(1, k + 1):
        hits = reached * curve.conditional(position)
        accepted.append(hits)
        trials.append(reached)
        reached = hits
    return tuple(accepted), tuple(trials)


def _at(values: Sequence[float], i: int) -> float:
    return values[i] if i < len(values) else 0.0


def _logit(q: float) -> float:
    q = min(max(q, _EPS), 1.0 - _EPS)
    return math.log(q / (1.0 - q))


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def _mixture(
    tasks: tuple[AcceptanceCurve, ...], mix: tuple[float, ...], positions: int
) -> list[float]:
    survive = [1.0] * len(tasks)
    previous, out = 1.0, []
    for position in range(1, positions + 1):
        survive = [s * c.conditional(position) for s, c in zip(survive, tasks, strict=True)]
        total = sum(w * s for w, s in zip(mix, survive, strict=True))
        out.append(total / previous if previous > _EPS else tasks[0].conditional(position))
        previous = total
    return out


@functools.lru_cache(maxsize=256)
def _conditionals(prior: MethodPrior, mix: tuple[float, ...], positions: int) -> tuple[float, ...]:
    here = _mixture(prior.tasks, mix, positions)
    if mix == prior.anchor_mix:
        return tuple(prior.anchor.conditional(i + 1) for i in range(positions))
    there = _mixture(prior.tasks, prior.anchor_mix, positions)
    return tuple(
        _sigmoid(_logit(h) + _logit(prior.anchor.conditional(i + 1)) - _logit(t))
        for i, (h, t) in enumerate(zip(here, there, strict=True))
    )
