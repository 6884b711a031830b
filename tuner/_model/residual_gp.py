"""The surrogate's learned correction: a GP over the residual summaries, fitted by likelihood.

Contract: `fit_residuals(points)` returns None for no points, else a `ResidualFit`: the shared
offset (`hardware_offset`: the support-weighted mean residual, how far the hardware model is off
for every config at once; a share of it while only speculative configs were measured), each
measured method's level (how far its own summaries sit from that mean, shrunk toward none by how
little support they have, plus what the offset left out of the mean), and, on what those leave,
a scikit-optimize GP over (method, K, log batch, scheduled, log context). The level is the GP's
mean for the method: far from the batches it was measured at, a method's correction reverts to
its own level, not to the shared offset (a drafter measured 25% slow at batch 50 is still read
slow at batch 256, where a backlog would drive it; with the offset alone as the mean, it was
read near the prior there).
Its kernel is amplitude x Matern(5/2) + white noise; all three hyperparameters are fitted by
maximising the marginal likelihood (L-BFGS from the initial values and one seeded restart),
within bounds that keep a few dozen noisy summaries from fitting nonsense.
`ResidualFit.predict(configs, batch, context)` returns the correction's mean (offset and
level included) and std in log throughput: the latent function's std (a config's true speed,
not one window's) with the level's posterior std added in quadrature. A method never measured
is LEVEL_SD unsure of its level however much the GP knows at that load: the data cannot tell a
slow world from a slow drafter. Read as sure as the running config's own summaries, a drafter
never run was also seldom worth a canary. For the same reason the offset takes only a share of
what speculative configs alone measured (`hardware_offset`): no speculation has no drafter and
no verification path to be slow in, and reading it as slow as EAGLE-3 kept an overloaded
EAGLE-3 running.

Bounded: the GP sees the FIT_POINTS most supported summaries (the offset sees all). A
summary's own noise shrinks with its support (WINDOW_NOISE / windows); the white noise is what
averaging does not remove (drift, the load's spread inside a bucket).

Cheap between ticks, in two memos, both pure functions of the data (so they are caches, never
state: a resumed tuner refits the same model from the persisted summaries):
- the posterior, by the exact fit set: a tick whose residuals did not change fits nothing;
- the hyperparameters, by the fit set seen coarsely (residuals to RESIDUAL_QUANTUM, support to
  a power of two), and fitted on that coarse view: one more window moves a summary by a
  fraction of the quantum, which tells the likelihood nothing, so most ticks only redo the
  posterior with known hyperparameters (one Cholesky) and the optimiser runs when the data's
  shape changed: a new config or load seen, a residual moved, support doubled.
"""

from __future__ import annotations

import math
import warnings
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from specpilot.tuner.spec_config import SPEC_METHODS, SpecConfig

FIT_POINTS = 64
"""At most this many summaries in the GP: its cost grows as the cube of them."""
WINDOW_NOISE = 0.01
"""Variance of one window's log residual around the config's truth (10% per window)."""
AMPLITUDE = (0.1**2, 1.0, 0.2**2)
"""Variance of the correction between unrelated configs (log units): (low, high, initial). The
floor keeps a config nothing was measured near at least 10% uncertain: one config's summaries
say nothing of how far the others are, and the likelihood alone would then settle on none."""
LENGTH_SCALE = (0.5, 16.0, 1.0)
"""In feature units (one unit: a 4x change of batch, or K 8 apart; another method is 0.7 away).
The floor is one load bucket (2x): shorter, the kernel would call independent noise signal."""
WHITE_NOISE = (1e-6, 0.1, 1e-3)
"""Extra variance per summary that its support does not average away."""
RESTARTS = 1
MAX_ITERATIONS = 60
"""L-BFGS iterations per start: three hyperparameters converge well within it, and it bounds a
fit's cost on a degenerate set."""
LEVEL_SD = 0.2
"""Prior std of a method's level around the shared offset (log units). With WINDOW_NOISE, one
window of a method moves its level by 80% of what it measured, four windows by 94%."""
HARDWARE_SD = 0.2
"""Prior std of the hardware model's error common to every config (log units): as large as a
method's own (LEVEL_SD); nothing says in advance which of the two is the larger."""
SPECULATIVE_ONLY_SHARE = HARDWARE_SD**2 / (HARDWARE_SD**2 + LEVEL_SD**2)
"""The share of what speculative configs measured that the offset takes while no summary is
of no speculation: the common error's posterior mean under the two priors (the summaries' own
noise aside). A speculative config's slowness may be the hardware's, or its own path's (a slow
drafter, a costly verification); no speculation shares only the first. Started on EAGLE-3 K=3
in world 2 of the Poisson sweep at 0.9 (`specpilot bench ... --poisson 0.9:0.9:1 --world-seed 2
--initial 'static:eagle3 K=3'`), the whole offset read no speculation's capacity 0.5% above
EAGLE-3's (3086 vs 3072 tok/s): it kept EAGLE-3 under a growing queue for the whole trace, 92 s
mean E2E against static no speculation's 38 s. At half, no speculation read 3829 tok/s, and
then served 3700-3890."""
_LEVEL_SHRINK = WINDOW_NOISE / LEVEL_SD**2
"""Windows of prior weight a method's level starts with (the LEVEL_SD prior, in windows)."""
RESIDUAL_QUANTUM = 0.025
"""Resolution (log units, 2.5%) of the residuals the hyperparameters are fitted on: a quarter
of the per-window noise assumed (WINDOW_NOISE), and a few times what one more window moves a
summary at full support (a window 7% off moves an 8-window summary by under 1%)."""
_MEMO_SIZE = 16

Row = tuple[tuple[float, ...], float, float]
"""(features, residual less the offset, noise variance): one summary as the GP sees it."""


@dataclass(frozen=True, slots=True)
class ResidualPoint:
    """Mean log(measured / prior) for one config at one load bucket, and its weight."""

    config: SpecConfig
    log2_batch: int
    mean: float
    weight: float
    log2_context: int | None = None
    """Bucket of the context per request it was measured at; None: not recorded."""


@dataclass(frozen=True, slots=True)
class Hyperparameters:
    """The fitted kernel, as standard deviations in log throughput and a feature length."""

    amplitude: float
    """Std of the correction between configs far apart in feature space."""
    length_scale: float
    noise: float
    """Std of the extra noise per summary (beyond what its support averages away)."""
    log_marginal_likelihood: float
    """At the optimum, on the coarse view the hyperparameters were fitted on."""


class ResidualFit:
    """The offset and the GP posterior on what it leaves; predicts the log correction."""

    def __init__(
        self,
        offset: float,
        levels: Mapping[str, float],
        support: Mapping[str, float],
        rows: Sequence[Row],
        hyperparameters: Hyperparameters,
        log2_context: float | None,
    ) -> None:
        import numpy as np
        from scipy.linalg import cho_factor, cho_solve

        self.offset = offset
        self.levels = dict(levels)
        """Each measured method's level above the offset (log units); others have none."""
        self.support = dict(support)
        """Each measured method's windows: how sure its level is (`level_variance`)."""
        self.hyperparameters = hyperparameters
        self.points = len(rows)
        """How many summaries the GP was fitted on (at most FIT_POINTS)."""
        self._log2_context = log2_context
        # The posterior at known hyperparameters is closed form (GPML algorithm 2.1, as skopt's
        # regressor computes it; a test holds the two equal): the estimator's input checks and
        # clones cost several times this arithmetic at this size, and it runs on most ticks.
        self._x = np.array([x for x, _, _ in rows])
        noise = np.array([alpha for _, _, alpha in rows]) + hyperparameters.noise**2
        gram = _matern(self._x, self._x, hyperparameters) + np.diag(noise)
        factor = cho_factor(gram, lower=True)
        self._weights = cho_solve(factor, np.array([y for _, y, _ in rows]))
        self._inverse = cho_solve(factor, np.eye(len(rows)))

    def predict(
        self, configs: Sequence[SpecConfig], batch: float, context: float
    ) -> tuple[list[float], list[float]]:
        """Mean (offset and the method's level included) and std of log(true / prior) throughput
        per config; the std is the latent function's (a config's true speed), without the
        per-summary noise, and the level's: a method never measured is LEVEL_SD unsure of how
        far it sits from the offset, whatever the GP knows at that load."""
        if not configs:
            return [], []
        import numpy as np

        log2_context = math.log2(max(context, 1.0)) if self._log2_context is not None else None
        x = np.array([features(c, batch, log2_context) for c in configs])
        cross = _matern(x, self._x, self.hyperparameters)
        means = cross @ self._weights
        latent = self.hyperparameters.amplitude**2 - np.einsum(
            "ki,kj,ij->k", cross, cross, self._inverse
        )
        levels = np.array([level_variance(self.support.get(c.method, 0.0)) for c in configs])
        stds = np.sqrt(np.maximum(latent, 0.0) + levels)
        return [
            self.offset + self.levels.get(c.method, 0.0) + float(m)
            for c, m in zip(configs, means, strict=True)
        ], [float(s) for s in stds]


def _matern(a: Any, b: Any, hyperparameters: Hyperparameters) -> Any:
    """amplitude^2 x Matern 5/2 between the rows of a and b (sklearn's Matern, nu=2.5)."""
    import numpy as np

    scaled = np.sqrt(((a[:, None, :] - b[None, :, :]) ** 2).sum(axis=2))
    scaled *= math.sqrt(5.0) / hyperparameters.length_scale
    return hyperparameters.amplitude**2 * (1.0 + scaled + scaled**2 / 3.0) * np.exp(-scaled)


def features(config: SpecConfig, batch: float, log2_context: float | None) -> list[float]:
    # The relative scales are a modelling choice the fitted length scale keeps (one length
    # for all): the model's error depends mostly on the load (the hardware model is off alike
    # for every config at one batch), less on the method, least on K and on having a schedule;
    # so what one config measured at a load moves the other configs' predictions at that load.
    method_index = [0.5 if config.method == m else 0.0 for m in SPEC_METHODS]
    scheduled = 0.3 if config.schedule is not None else 0.0
    x = [*method_index, config.max_k / 8.0, math.log2(max(batch, 1.0)) / 2.0, scheduled]
    if log2_context is not None:
        x.append(log2_context / 4.0)
    return x


def shared_offset(points: Sequence[ResidualPoint]) -> float:
    """The support-weighted mean residual (0 for none)."""
    # fsum: exactly rounded, so the order the state holds the summaries in changes nothing.
    total = math.fsum(p.weight for p in points)
    return math.fsum(p.mean * p.weight for p in points) / total if total > 0 else 0.0


def hardware_offset(points: Sequence[ResidualPoint], mean: float) -> float:
    """The offset a method with no summary is corrected by: `mean` (the points' support-weighted
    mean residual, `shared_offset`) once no speculation has a summary, and SPECULATIVE_ONLY_SHARE
    of it while only speculative configs have (a measured method's level carries the rest:
    `fit_residuals`)."""
    if any(not p.config.speculative for p in points):
        return mean
    return SPECULATIVE_ONLY_SHARE * mean


def method_support(points: Sequence[ResidualPoint]) -> dict[str, float]:
    """Each method's windows of support over all its summaries."""
    support: dict[str, float] = {}
    for p in points:
        support[p.config.method] = support.get(p.config.method, 0.0) + p.weight
    return support


def level_variance(support: float) -> float:
    """Posterior variance of a method's level after `support` windows: LEVEL_SD^2 for a method
    never measured: how far it sits from the offset is then only what the prior allows."""
    return LEVEL_SD**2 * _LEVEL_SHRINK / (max(support, 0.0) + _LEVEL_SHRINK)


def method_levels(points: Sequence[ResidualPoint], offset: float) -> dict[str, float]:
    """Each method's support-weighted mean residual above `offset`, shrunk toward 0 as a
    posterior mean under a LEVEL_SD prior with WINDOW_NOISE per window: a method one window
    measured is not yet sure to be off by all it showed."""
    support: dict[str, list[tuple[float, float]]] = {}
    for p in points:
        support.setdefault(p.config.method, []).append((p.weight, p.mean - offset))
    return {
        method: math.fsum(w * d for w, d in rows) / (math.fsum(w for w, _ in rows) + _LEVEL_SHRINK)
        for method, rows in sorted(support.items())
    }


def fit_residuals(points: Sequence[ResidualPoint]) -> ResidualFit | None:
    if not points:
        return None
    mean = shared_offset(points)
    offset = hardware_offset(points, mean)
    # A measured method's level is taken above the whole mean and carries the part of it the
    # offset left out: what it ran is read as it ran; only what did not run sees the split.
    levels = {m: level + mean - offset for m, level in method_levels(points, mean).items()}
    chosen = bounded(points)
    log2_context = _reference_context(chosen)
    # Sorted: the state reorders summaries as it updates them, which changes no fit.
    rows = tuple(
        sorted(
            (
                tuple(features(p.config, 2.0**p.log2_batch, _point_context(p, log2_context))),
                p.mean - offset - levels[p.config.method],
                WINDOW_NOISE / max(p.weight, 1e-6),
            )
            for p in chosen
        )
    )
    key = (offset, tuple(levels.items()), log2_context, rows)
    fit = _POSTERIORS.get(key)
    if fit is None:
        coarse = _coarse(chosen, offset, levels, log2_context)
        hyperparameters = _HYPERPARAMETERS.get(coarse)
        if hyperparameters is None:
            hyperparameters = fit_hyperparameters(coarse)
            _remember(_HYPERPARAMETERS, coarse, hyperparameters)
        fit = ResidualFit(
            offset, levels, method_support(points), rows, hyperparameters, log2_context
        )
        _remember(_POSTERIORS, key, fit)
    else:
        _POSTERIORS.move_to_end(key)
    return fit


def bounded(points: Sequence[ResidualPoint]) -> list[ResidualPoint]:
    """The FIT_POINTS most supported summaries; among equals the latest (the state appends the
    summary it just updated), so the set follows what was measured last."""
    if len(points) <= FIT_POINTS:
        return list(points)
    order = sorted(range(len(points)), key=lambda i: (points[i].weight, i), reverse=True)
    return [points[i] for i in sorted(order[:FIT_POINTS])]


def fit_hyperparameters(rows: Sequence[Row]) -> Hyperparameters:
    """Amplitude, length scale and white noise maximising the marginal likelihood of `rows`."""
    import numpy as np
    from skopt.learning import GaussianProcessRegressor
    from skopt.learning.gaussian_process.kernels import ConstantKernel, Matern, WhiteKernel

    kernel = ConstantKernel(AMPLITUDE[2], AMPLITUDE[:2]) * Matern(
        LENGTH_SCALE[2], LENGTH_SCALE[:2], nu=2.5
    ) + WhiteKernel(WHITE_NOISE[2], WHITE_NOISE[:2])
    gp = GaussianProcessRegressor(
        kernel=kernel,
        alpha=np.array([alpha for _, _, alpha in rows]),
        optimizer=_lbfgs,
        n_restarts_optimizer=RESTARTS,
        # Not normalised: the offset already centres the residuals, and scaling them by their
        # spread would make the bounds above mean nothing (a few near-equal summaries would
        # shrink every unseen config's uncertainty to their spread).
        normalize_y=False,
        # skopt keeps the fitted white noise apart (noise_), out of the predictive std.
        noise="gaussian",
        random_state=0,
    )
    with warnings.catch_warnings(), _one_thread():
        # A hyperparameter at its bound is the bounds doing their job, not news.
        warnings.simplefilter("ignore")
        gp.fit(np.array([x for x, _, _ in rows]), np.array([y for _, y, _ in rows]))
    product = gp.kernel_.k1
    return Hyperparameters(
        amplitude=math.sqrt(float(product.k1.constant_value)),
        length_scale=float(product.k2.length_scale),
        noise=math.sqrt(float(gp.noise_ or 0.0)),
        log_marginal_likelihood=float(gp.log_marginal_likelihood_value_),
    )


def _coarse(
    points: Sequence[ResidualPoint],
    offset: float,
    levels: Mapping[str, float],
    log2_context: float | None,
) -> tuple[Row, ...]:
    """The rows as the hyperparameters see them: residual, offset and levels each to the
    quantum, support to the power of two below it (one more window changes neither, mostly)."""

    def quantised(value: float) -> float:
        return RESIDUAL_QUANTUM * round(value / RESIDUAL_QUANTUM)

    base = quantised(offset)
    return tuple(
        sorted(
            (
                tuple(features(p.config, 2.0**p.log2_batch, _point_context(p, log2_context))),
                quantised(p.mean) - base - quantised(levels[p.config.method]),
                WINDOW_NOISE / 2.0 ** math.floor(math.log2(max(p.weight, 1.0))),
            )
            for p in points
        )
    )


def _lbfgs(objective: Any, initial: Any, bounds: Any) -> tuple[Any, float]:
    from scipy.optimize import minimize

    result = minimize(
        objective,
        initial,
        method="L-BFGS-B",
        jac=True,
        bounds=bounds,
        options={"maxiter": MAX_ITERATIONS},
    )
    return result.x, float(result.fun)


def _reference_context(points: Sequence[ResidualPoint]) -> float | None:
    """The context bucket given to summaries that recorded none: the support-weighted mean of
    those that did, to a whole bucket; None when none did (context is then no feature)."""
    known = [(p.weight, p.log2_context) for p in points if p.log2_context is not None]
    total = sum(w for w, _ in known)
    if not known or total <= 0:
        return None
    return float(round(sum(w * c for w, c in known) / total))


def _point_context(point: ResidualPoint, reference: float | None) -> float | None:
    if reference is None:
        return None
    return float(point.log2_context) if point.log2_context is not None else reference


def _remember(memo: OrderedDict[Any, Any], key: Any, value: Any) -> None:
    memo[key] = value
    while len(memo) > _MEMO_SIZE:
        memo.popitem(last=False)


_POSTERIORS: OrderedDict[tuple[Any, ...], ResidualFit] = OrderedDict()
_HYPERPARAMETERS: OrderedDict[tuple[Row, ...], Hyperparameters] = OrderedDict()
_THREADS: Any = None


def _one_thread() -> Any:
    # The matrices are at most 64 x 64: BLAS threads only contend, and on a loaded host a
    # threaded fit ran about ten times slower than a single-threaded one. One controller,
    # made once numpy and scipy are loaded: finding the BLAS libraries costs milliseconds.
    global _THREADS
    if _THREADS is None:
        import numpy  # noqa: F401  (loaded first: the controller lists the libraries loaded now)
        import scipy.linalg  # noqa: F401
        from threadpoolctl import ThreadpoolController

        _THREADS = ThreadpoolController()
    return _THREADS.limit(limits=1, user_api="blas")
