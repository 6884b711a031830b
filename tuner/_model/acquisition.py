"""Acquisition over the surrogate's predictions, through scikit-optimize's own functions.

Contract: each function takes, per candidate, the predicted log throughput (`mean_log_tps`) and
its standard deviation (`std_log_tps`, the surrogate's `Prediction.uncertainty`) and returns one
value per candidate as a numpy array:
- `expected_improvement`: E[max(f - best - xi, 0)] for f ~ N(mean, std), in log units, so
  about the relative gain a trial is expected to buy (skopt's `gaussian_ei`);
- `probability_of_improvement`: P(f > best + xi) (skopt's `gaussian_pi`); one minus it at
  xi = 0 is the chance a trial turns out slower;
- `upper_confidence_bound`: mean + kappa x std (skopt's `gaussian_lcb` on the negated mean).
A candidate with std 0 has no improvement to expect and no chance of one beyond its mean
(skopt's convention). skopt minimises, so the means are negated on the way in. numpy and skopt
are imported lazily: importing the tuner must not pull them in.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

    Values = Sequence[float] | NDArray[np.float64]


class _Fixed:
    """A 'model' whose predictions are given: skopt's acquisition functions read a model's
    predict(X, return_std=True); X holds each candidate's index."""

    def __init__(self, mean: NDArray[np.float64], std: NDArray[np.float64]) -> None:
        self.mean = mean
        self.std = std

    def predict(self, x: Any, return_std: bool = False) -> Any:
        index = x[:, 0].astype(int)
        if return_std:
            return self.mean[index], self.std[index]
        return self.mean[index]


def _minimising(mean_log_tps: Values, std_log_tps: Values) -> tuple[NDArray[np.float64], _Fixed]:
    import numpy as np

    mean = np.asarray(mean_log_tps, dtype=float).reshape(-1)
    std = np.asarray(std_log_tps, dtype=float).reshape(-1)
    if mean.shape != std.shape:
        raise ValueError(f"mean_log_tps has {mean.size} values but std_log_tps has {std.size}")
    if np.any(std < 0) or not np.all(np.isfinite(std)):
        raise ValueError("std_log_tps must be finite and >= 0")
    index: NDArray[np.float64] = np.arange(mean.size, dtype=float).reshape(-1, 1)
    return index, _Fixed(-mean, std)


def expected_improvement(
    mean_log_tps: Values, std_log_tps: Values, best_log_tps: float, xi: float = 0.0
) -> NDArray[np.float64]:
    """Expected improvement of log throughput over `best_log_tps` (plus a margin `xi`)."""
    from skopt.acquisition import gaussian_ei

    index, model = _minimising(mean_log_tps, std_log_tps)
    if index.size == 0:
        return index[:, 0]
    values: NDArray[np.float64] = gaussian_ei(index, model, y_opt=-best_log_tps, xi=xi)
    return values


def probability_of_improvement(
    mean_log_tps: Values, std_log_tps: Values, best_log_tps: float, xi: float = 0.0
) -> NDArray[np.float64]:
    """Chance the log throughput beats `best_log_tps + xi`; 0 where std is 0 (skopt's rule:
    a certain candidate is not a trial)."""
    from skopt.acquisition import gaussian_pi

    index, model = _minimising(mean_log_tps, std_log_tps)
    if index.size == 0:
        return index[:, 0]
    values: NDArray[np.float64] = gaussian_pi(index, model, y_opt=-best_log_tps, xi=xi)
    return values


def upper_confidence_bound(
    mean_log_tps: Values, std_log_tps: Values, kappa: float = 1.96
) -> NDArray[np.float64]:
    """Optimistic log throughput: mean + kappa x std (kappa 1.96: the 97.5% quantile)."""
    from skopt.acquisition import gaussian_lcb

    index, model = _minimising(mean_log_tps, std_log_tps)
    if index.size == 0:
        return index[:, 0]
    values: NDArray[np.float64] = -gaussian_lcb(index, model, kappa=kappa)
    return values
