"""The surrogate's residual GP: hyperparameters fitted to the data, a bounded fit set, the
physics prior untouched without data, fits cached by their data, and acquisition through
scikit-optimize equal to expected improvement computed by hand."""

from __future__ import annotations

import math
import random
from collections import OrderedDict
from statistics import NormalDist

import numpy as np
import pytest

from specpilot.tuner import AcceptanceCurve, SpecConfig, StepCost, Surrogate
from specpilot.tuner._model import residual_gp
from specpilot.tuner._model.acquisition import (
    expected_improvement,
    probability_of_improvement,
    upper_confidence_bound,
)
from specpilot.tuner._model.residual_gp import (
    AMPLITUDE,
    FIT_POINTS,
    LENGTH_SCALE,
    RESIDUAL_QUANTUM,
    WHITE_NOISE,
    ResidualPoint,
    bounded,
    features,
    fit_residuals,
    level_variance,
)

COST = StepCost.for_hardware("H100", "llama-3.1-8b")
PRIORS = {"eagle3": AcceptanceCurve(0.775, 0.973), "ngram": AcceptanceCurve(0.2853, 1.0)}
PLAIN = SpecConfig()
EAGLE = [SpecConfig(method="eagle3", num_speculative_tokens=k, draft_model="d") for k in (1, 3, 5)]
NGRAM = SpecConfig(method="ngram", num_speculative_tokens=3)
CONFIGS = [PLAIN, *EAGLE]


@pytest.fixture(autouse=True)
def fresh_memos(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test fits from nothing, as a resumed tuner does."""
    monkeypatch.setattr(residual_gp, "_POSTERIORS", OrderedDict())
    monkeypatch.setattr(residual_gp, "_HYPERPARAMETERS", OrderedDict())


def count_hyperparameter_fits(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    fit = residual_gp.fit_hyperparameters

    def counting(rows):  # type: ignore[no-untyped-def]
        calls.append(len(rows))
        return fit(rows)

    monkeypatch.setattr(residual_gp, "fit_hyperparameters", counting)
    return calls


def grid(residual, weight: float = 8.0) -> list[ResidualPoint]:  # type: ignore[no-untyped-def]
    """A summary per config and load bucket 0..8, residual(config index, bucket)."""
    return [
        ResidualPoint(config, bucket, residual(i, bucket), weight)
        for i, config in enumerate(CONFIGS)
        for bucket in range(9)
    ]


def test_the_hyperparameters_move_with_the_data() -> None:
    smooth = fit_residuals(grid(lambda i, b: 0.25 * math.sin(b / 2.5) + 0.03 * i))
    rng = random.Random(7)
    noisy = fit_residuals(grid(lambda i, b: rng.gauss(0.0, 0.15)))
    assert smooth is not None and noisy is not None
    s, n = smooth.hyperparameters, noisy.hyperparameters
    initial = (math.sqrt(AMPLITUDE[2]), LENGTH_SCALE[2], math.sqrt(WHITE_NOISE[2]))
    for fitted in (s, n):
        assert (fitted.amplitude, fitted.length_scale, fitted.noise) != pytest.approx(initial)
    # A smooth trend over the load: next to no extra noise, a length the trend sets. Independent
    # noise: the spread is noise of about its size, and no trend to set a length.
    assert abs(math.log(s.length_scale / n.length_scale)) > math.log(2)
    assert s.length_scale != pytest.approx(LENGTH_SCALE[2], rel=0.2)
    assert s.noise < 0.03
    assert 0.08 < n.noise < 0.3


def test_the_fit_corrects_the_prior_where_it_measured_and_stays_unsure_elsewhere() -> None:
    curves = dict(PRIORS)
    measured = EAGLE[1]
    # Measured 25% faster than the prior at batch 8; nothing else measured.
    points = (ResidualPoint(measured, 3, math.log(1.25), 8.0),)
    surrogate = Surrogate(COST, curves, residuals=points)
    prior = surrogate.prior(measured, 8.0, 1024.0)
    there = surrogate.predict(measured, 8.0, 1024.0)
    assert there.tokens_per_s / prior.tokens_per_s == pytest.approx(1.25, rel=0.02)
    # A config nothing was measured near keeps at least the amplitude's floor of doubt: a few
    # agreeing summaries of one config cannot make the others certain.
    far = surrogate.predict(NGRAM, 256.0, 1024.0)
    assert far.uncertainty >= 0.9 * math.sqrt(AMPLITUDE[0])
    assert there.uncertainty < far.uncertainty


def test_a_method_measured_slow_stays_slow_far_from_the_batches_it_was_measured_at() -> None:
    # No speculation measured at every load, its residual wavy in the batch (so the fitted
    # length scale is short); EAGLE-3 K=3 measured 30% slow at batch 16 and 32 only (a canary's
    # share). At batch 256, where a backlog would drive it, it is still read slow: the GP
    # deviates from the method's level, not from the shared offset (which read it ~0.89x there).
    plain = [ResidualPoint(PLAIN, b, 0.1 * math.sin(1.3 * b), 8.0) for b in range(9)]
    slow = [ResidualPoint(EAGLE[1], b, math.log(0.7), 4.0) for b in (4, 5)]
    surrogate = Surrogate(COST, dict(PRIORS), residuals=(*plain, *slow))
    fit = surrogate.residual_fit
    assert fit is not None
    assert fit.levels["eagle3"] < math.log(0.75) < fit.levels["none"]
    for config in (EAGLE[1], EAGLE[2]):  # the level is the method's: its other K too
        for batch in (16.0, 256.0):
            ratio = (
                surrogate.predict(config, batch, 1024.0).tokens_per_s
                / surrogate.prior(config, batch, 1024.0).tokens_per_s
            )
            assert ratio == pytest.approx(0.7, abs=0.04), (config, batch)
    # A method nothing measured has no level: the shared offset alone is its mean.
    assert "ngram" not in fit.levels


def test_one_window_moves_a_methods_level_by_most_but_not_all_it_showed() -> None:
    def share_of_what_it_showed(windows: float) -> float:
        points = [
            ResidualPoint(PLAIN, 5, 0.0, 8.0),
            ResidualPoint(EAGLE[0], 5, math.log(0.8), windows),
        ]
        offset = residual_gp.shared_offset(points)
        return residual_gp.method_levels(points, offset)["eagle3"] / (math.log(0.8) - offset)

    assert share_of_what_it_showed(1.0) == pytest.approx(0.8)
    assert share_of_what_it_showed(8.0) == pytest.approx(8.0 / 8.25)


def test_without_data_the_prediction_is_the_prior_with_its_uncertainty() -> None:
    sd = {"eagle3": 0.05, "ngram": 0.2}
    surrogate = Surrogate(COST, dict(PRIORS), acceptance_sd=sd)
    assert surrogate.residual_fit is None and surrogate.offset == 0.0
    space = [PLAIN, *EAGLE, NGRAM]
    for batch in (1.0, 8.0, 300.0):
        predictions = surrogate.predict_many(space, batch, 2048.0)
        assert predictions == [surrogate.prior(c, batch, 2048.0) for c in space]
    assert surrogate.predict(NGRAM, 8.0, 2048.0).uncertainty > 0  # the acceptance's spread
    assert surrogate.predict(PLAIN, 8.0, 2048.0).uncertainty == 0.0


def test_the_fit_set_is_bounded_to_the_most_supported() -> None:
    configs = [
        SpecConfig(method=m, num_speculative_tokens=k, draft_model="d")
        for m in ("eagle3", "eagle", "mtp", "draft_model")
        for k in (1, 2, 3, 4)
    ]
    rng = random.Random(3)
    points = [
        ResidualPoint(c, b, rng.gauss(0.0, 0.1), 1.0 + (i * 7 + b * 3) % 8)
        for i, c in enumerate(configs)
        for b in range(8)
    ]
    assert len(points) == 128
    chosen = bounded(points)
    assert len(chosen) == FIT_POINTS
    least_kept = min(p.weight for p in chosen)
    assert all(p.weight <= least_kept for p in points if p not in chosen)
    fit = Surrogate(COST, dict(PRIORS), residuals=tuple(points)).residual_fit
    assert fit is not None and fit.points == FIT_POINTS
    # The offset still averages every summary (at the share speculative summaries alone get).
    total = sum(p.weight for p in points)
    mean = sum(p.mean * p.weight for p in points) / total
    assert fit.offset == pytest.approx(residual_gp.SPECULATIVE_ONLY_SHARE * mean)


def test_a_tick_without_new_residuals_fits_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    fits = count_hyperparameter_fits(monkeypatch)
    points = grid(lambda i, b: 0.1 * math.cos(b) - 0.05 * i)
    first = Surrogate(COST, dict(PRIORS), residuals=tuple(points))
    # The same summaries, in the order a state that updated them would hold them.
    again = Surrogate(COST, dict(PRIORS), residuals=tuple(reversed(points)))
    assert len(fits) == 1
    assert again.residual_fit is first.residual_fit

    # One more window moves a summary by a fraction of the quantum (towards the middle of its
    # step, so that it stays in it): the posterior follows, the hyperparameters are kept.
    last = points[-1]
    step = RESIDUAL_QUANTUM * round(last.mean / RESIDUAL_QUANTUM)
    assert step != last.mean
    nudged = [*points[:-1], ResidualPoint(last.config, 8, last.mean + (step - last.mean) / 4, 8.0)]
    moved = Surrogate(COST, dict(PRIORS), residuals=tuple(nudged))
    assert len(fits) == 1
    assert moved.residual_fit is not first.residual_fit
    before = first.predict(EAGLE[2], 256.0, 1024.0).tokens_per_s
    assert moved.predict(EAGLE[2], 256.0, 1024.0).tokens_per_s != before

    # A new config seen: the data's shape changed, the hyperparameters are fitted again.
    grown = (*points, ResidualPoint(NGRAM, 3, 0.2, 2.0))
    Surrogate(COST, dict(PRIORS), residuals=grown)
    assert len(fits) == 2


def test_a_resumed_tuner_refits_the_same_model(monkeypatch: pytest.MonkeyPatch) -> None:
    points = tuple(grid(lambda i, b: 0.2 * math.sin(b) * (i + 1) / 4))
    space = [PLAIN, *EAGLE, NGRAM]
    before = Surrogate(COST, dict(PRIORS), residuals=points).predict_many(space, 24.0, 1024.0)
    monkeypatch.setattr(residual_gp, "_POSTERIORS", OrderedDict())
    monkeypatch.setattr(residual_gp, "_HYPERPARAMETERS", OrderedDict())
    after = Surrogate(COST, dict(PRIORS), residuals=points).predict_many(space, 24.0, 1024.0)
    assert after == before


def test_the_posterior_is_scikit_optimizes() -> None:
    """The closed-form posterior the fit keeps predicts what skopt's regressor predicts with
    the same hyperparameters on the same summaries."""
    from skopt.learning import GaussianProcessRegressor
    from skopt.learning.gaussian_process.kernels import ConstantKernel, Matern, WhiteKernel

    rng = random.Random(11)
    points = grid(lambda i, b: 0.1 * math.sin(b) + rng.gauss(0.0, 0.05), weight=3.0)
    fit = fit_residuals(points)
    assert fit is not None
    h = fit.hyperparameters
    kernel = ConstantKernel(h.amplitude**2, "fixed") * Matern(
        h.length_scale, "fixed", nu=2.5
    ) + WhiteKernel(h.noise**2, "fixed")
    x = np.array([features(p.config, 2.0**p.log2_batch, None) for p in points])
    y = np.array([p.mean - fit.offset - fit.levels[p.config.method] for p in points])
    alpha = np.array([residual_gp.WINDOW_NOISE / p.weight for p in points])
    reference = GaussianProcessRegressor(
        kernel=kernel, alpha=alpha, optimizer=None, noise="gaussian"
    ).fit(x, y)
    queries = [PLAIN, *EAGLE, NGRAM]
    mean, std = reference.predict(
        np.array([features(c, 24.0, None) for c in queries]), return_std=True
    )
    ours_mean, ours_std = fit.predict(queries, 24.0, 1024.0)
    levels = np.array([fit.offset + fit.levels.get(c.method, 0.0) for c in queries])
    assert np.allclose(np.array(ours_mean) - levels, mean, atol=1e-9)
    # ours adds how unsure each method's level is to the GP's variance
    level_var = np.array([level_variance(fit.support.get(c.method, 0.0)) for c in queries])
    assert np.allclose(np.array(ours_std) ** 2 - level_var, std**2, atol=1e-9)


def test_a_method_never_measured_is_unsure_of_its_level_whatever_the_gp_knows() -> None:
    # no speculation measured at every load: the offset takes all it showed, and a method at
    # the same loads is only as close to it as LEVEL_SD allows
    points = [ResidualPoint(PLAIN, b, -0.3, 8.0) for b in range(0, 9)]
    fit = fit_residuals(points)
    assert fit is not None
    (measured, never), (measured_sd, never_sd) = fit.predict([PLAIN, EAGLE[2]], 24.0, 1024.0)
    assert measured == pytest.approx(-0.3, abs=0.01) and never == pytest.approx(-0.3, abs=0.01)
    assert never_sd >= residual_gp.LEVEL_SD
    assert measured_sd < 0.5 * never_sd
    assert level_variance(0.0) == pytest.approx(residual_gp.LEVEL_SD**2)
    assert level_variance(1.0) < level_variance(0.0) / 4


def test_what_speculation_alone_measured_is_read_on_no_speculation_only_in_part() -> None:
    # EAGLE-3 measured 30% slow at every load: the hardware, or its drafter and verification?
    # No speculation shares only the first, so it is read at the common error's posterior
    # share; EAGLE-3 itself stays read as slow as it ran.
    slow = math.log(0.7)
    points = [ResidualPoint(EAGLE[1], b, slow, 8.0) for b in range(0, 9)]
    fit = fit_residuals(points)
    assert fit is not None
    assert 0.0 < residual_gp.SPECULATIVE_ONLY_SHARE < 1.0
    assert fit.offset == pytest.approx(residual_gp.SPECULATIVE_ONLY_SHARE * slow)
    (eagle, plain), _ = fit.predict([EAGLE[1], PLAIN], 24.0, 1024.0)
    assert eagle == pytest.approx(slow, abs=0.02)
    assert plain == pytest.approx(residual_gp.SPECULATIVE_ONLY_SHARE * slow, abs=0.02)
    # Once no speculation has run, it says what the hardware is: the offset takes all again.
    measured = fit_residuals([*points, ResidualPoint(PLAIN, 5, slow, 8.0)])
    assert measured is not None and measured.offset == pytest.approx(slow)
    (plain_measured,), _ = measured.predict([PLAIN], 24.0, 1024.0)
    assert plain_measured == pytest.approx(slow, abs=0.02)


def test_context_is_a_feature_once_the_summaries_record_it() -> None:
    without = fit_residuals([ResidualPoint(EAGLE[1], 3, 0.1, 4.0)])
    assert without is not None
    # No context recorded: predictions do not depend on it.
    assert without.predict([EAGLE[1]], 8.0, 512.0) == without.predict([EAGLE[1]], 8.0, 16384.0)
    # Slower at long context than at short, for the same config and load.
    points = [
        ResidualPoint(EAGLE[1], 3, 0.15, 8.0, log2_context=9),
        ResidualPoint(EAGLE[1], 3, -0.15, 8.0, log2_context=14),
    ]
    fit = fit_residuals(points)
    assert fit is not None
    (short,), _ = fit.predict([EAGLE[1]], 8.0, 512.0)
    (long,), _ = fit.predict([EAGLE[1]], 8.0, 16384.0)
    assert short > long + 0.1


def test_expected_improvement_is_skopts_and_equals_the_formula() -> None:
    mean = [math.log(110.0), math.log(90.0), math.log(100.0), math.log(130.0)]
    std = [0.1, 0.2, 0.0, 0.05]
    best = math.log(100.0)
    normal = NormalDist()

    def by_hand(m: float, s: float, xi: float) -> float:
        if s == 0:
            return 0.0
        z = (m - best - xi) / s
        return (m - best - xi) * normal.cdf(z) + s * normal.pdf(z)

    for xi in (0.0, 0.01):
        ei = expected_improvement(mean, std, best, xi)
        assert ei.shape == (4,)
        assert list(ei) == pytest.approx(
            [by_hand(m, s, xi) for m, s in zip(mean, std, strict=True)]
        )
    pi = probability_of_improvement(mean, std, best)
    assert list(pi) == pytest.approx(
        [normal.cdf((m - best) / s) if s else 0.0 for m, s in zip(mean, std, strict=True)]
    )
    ucb = upper_confidence_bound(mean, std, kappa=2.0)
    assert list(ucb) == pytest.approx([m + 2.0 * s for m, s in zip(mean, std, strict=True)])
    assert expected_improvement([], [], best).shape == (0,)
    with pytest.raises(ValueError, match="std_log_tps"):
        expected_improvement([0.0, 1.0], [0.1], best)
    with pytest.raises(ValueError, match="std_log_tps"):
        expected_improvement([0.0], [-0.1], best)
