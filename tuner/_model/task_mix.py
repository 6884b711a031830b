"""The traffic's task weights as a Dirichlet posterior, learned from the running method's
acceptance length.

Contract: the mean accepted length of a method on mixed traffic is linear in the task weights
w (sum_t w_t L_t at K, L_t the published per-task lengths). When the running method's measured
length departs from what its own estimate expected (the innovation e), `update(mix, strength,
task_lengths, innovation, variance)` weighs candidate mixes by how well w - mix explains e,
with a Student-t likelihood (heavy tails: a length no mix of tasks can explain is the method's
own level, which its counts learn, not evidence for an extreme mix). The candidates are draws
from the prior predictive: the current Dirichlet (mean `mix`, concentration `strength`) or,
with probability HAZARD, a changed traffic (a sparse Dirichlet around `home`, the initial
weights: mostly one task, most likely the priors' own), so a sudden switch of the traffic is
believed within a window or two. The weighted
draws are matched back to a Dirichlet by their first two moments (assumed-density filtering);
the draws are the same every call (a fixed seed), and their own sampling error cancels (the
mean moves by the weighted minus the plain mean of the draws), so a window that says nothing
only lets the weights relax by HAZARD toward `home` (forgetting toward the prior).
`variance` is the innovation's: the estimate's own spread (a method that just started cannot
tell its level from the mix) plus the window's noise. The concentration stays within
[MIN_STRENGTH, MAX_STRENGTH]: the weights can always move again (forgetting). Pure; numpy is
imported on first use.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

DRAWS = 4096
"""Draws from the Dirichlet the likelihood weighs."""
SEED = 20240601
MIN_PSEUDO = 0.05
"""Smallest Dirichlet pseudo-count drawn from (smaller ones put all mass on the edges)."""
HAZARD = 0.05
"""Chance per window that the traffic changed: some weight for mixes the belief ruled out."""
CHANGED_STRENGTH = 1.0
"""Concentration of a changed traffic's mix around `home` (the initial weights): sparse, so
mostly one task, most likely the one the priors were chosen for."""
MIN_STRENGTH = 2.0
MAX_STRENGTH = 20.0
"""Pseudo-windows behind the task weights at most: a change of traffic moves them within a
few windows."""
TAIL_DOF = 4.0
"""Degrees of freedom of the Student-t likelihood."""
MIX_FLOOR = 0.002
"""No task's weight reaches 0: a Dirichlet needs every pseudo-count positive."""


def initial_mix(tasks: Sequence[str], task: str, share: float = 0.95) -> tuple[float, ...]:
    """`share` on `task`, the rest spread evenly: the traffic is what the priors were chosen
    for, nearly (a pure task would pin the weights: a Dirichlet needs them all positive)."""
    rest = (1.0 - share) / max(len(tasks) - 1, 1)
    return tuple(share if t == task else rest for t in tasks)


def update(
    mix: Sequence[float],
    strength: float,
    task_lengths: Sequence[float],
    innovation: float,
    variance: float,
    home: Sequence[float],
) -> tuple[tuple[float, ...], float]:
    """The Dirichlet (mean, concentration) after one window (see the module's contract)."""
    mix = tuple(mix)
    if (
        not math.isfinite(innovation)
        or not math.isfinite(variance)
        or variance <= 0
        or max(task_lengths) - min(task_lengths) < 1e-9
    ):
        return mix, strength
    import numpy as np  # lazy: importing the tuner must not pull in numpy

    m = np.asarray(mix)
    # What this window's mix may be: the current belief, or (HAZARD) a new traffic, most
    # likely dominated by one task. The same draws every window (a fixed seed): the update
    # is a deterministic function of its inputs, and the draws' own error cancels below.
    rng = np.random.default_rng(SEED)
    changed = int(HAZARD * DRAWS)
    draws = np.vstack(
        (
            rng.dirichlet(np.maximum(m * strength, MIN_PSEUDO), DRAWS - changed),
            rng.dirichlet(np.maximum(np.asarray(home) * CHANGED_STRENGTH, MIN_PSEUDO), changed),
        )
    )
    expected = (1.0 - HAZARD) * m + HAZARD * np.asarray(home)
    shift = (draws - m) @ np.asarray(task_lengths)
    z = (innovation - shift) ** 2 / (TAIL_DOF * variance)
    log_like = -0.5 * (TAIL_DOF + 1.0) * np.log1p(z)
    weights = np.exp(log_like - log_like.max())
    weights /= weights.sum()
    post_mean = expected + weights @ draws - draws.mean(axis=0)
    post_var = weights @ (draws - weights @ draws) ** 2
    prior_var = draws.var(axis=0)
    floored = np.maximum(post_mean, MIX_FLOOR)
    new_mix = floored / floored.sum()
    ratio = np.where(prior_var > 0, post_var / np.maximum(prior_var, 1e-12), 1.0)
    spread = float((m * (1.0 - m) / (strength + 1.0) * ratio).sum())
    if spread <= 0:
        new_strength = MAX_STRENGTH
    else:
        new_strength = float((new_mix * (1.0 - new_mix)).sum()) / spread - 1.0
    new_strength = min(max(new_strength, MIN_STRENGTH), MAX_STRENGTH)
    return tuple(round(float(w), 4) for w in new_mix), round(new_strength, 3)
