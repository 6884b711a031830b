"""The ablations' stand-ins (tuner/policy/ablation.py, TunerSettings.acceptance_model and
residual_model) and the bench's `--policies` choice that runs them (bench/ablations.py)."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import pytest

from specpilot.operator.app.bench.policies import ABLATIONS, TUNED, VARIANTS
from specpilot.operator.app.cli import main as specpilot
from specpilot.tuner import (
    AcceptanceCurve,
    Observation,
    SpecConfig,
    StepCost,
    Surrogate,
    TunerSettings,
    TunerState,
    decide,
)
from specpilot.tuner._model.surrogate import ResidualPoint

COST = StepCost.for_hardware("H100", "llama-3.1-8b")
EAGLE = SpecConfig(method="eagle3", num_speculative_tokens=3, draft_model="d")
NGRAM = SpecConfig(method="ngram", num_speculative_tokens=3)
PRIORS = {"eagle3": AcceptanceCurve(0.775, 0.973), "ngram": AcceptanceCurve(0.2853, 1.0)}


def window(length: float) -> Observation:
    return Observation(
        engine="vllm",
        window_s=60.0,
        pods=("p",),
        acceptance_length=length,
        acceptance_rate=None,
        acceptance_per_position=None,
        running_requests=4.0,
        waiting_requests=0.0,
        kv_cache_usage=None,
        generation_tokens_per_s=600.0,
        tpot_p50_s=None,
        tpot_p95_s=None,
        ttft_p95_s=None,
    )


def test_the_moving_average_learns_the_length_but_never_r_nor_the_other_methods() -> None:
    pinned = TunerSettings(
        candidates=(EAGLE, NGRAM), restart_budget_per_hour=0, acceptance_model="moving-average"
    )
    state = TunerState.initial(EAGLE, 0.0, PRIORS)
    lengths = []
    for tick in range(12):
        _, state = decide(window(1.6), state, pinned, COST, 60.0 * (tick + 1))
        lengths.append(AcceptanceCurve(*_pr(state, "eagle3")).expected_length(3))
    # 0.3 of the way each window: from the prior's 2.79 down towards 1.6, monotonically
    assert all(a > b for a, b in itertools.pairwise(lengths))
    assert abs(lengths[-1] - 1.6) < 0.02 and abs(lengths[0] - 1.6) > 0.5
    assert _pr(state, "eagle3")[1] == PRIORS["eagle3"].r  # r is never learned
    assert _pr(state, "ngram") == (PRIORS["ngram"].p, PRIORS["ngram"].r)  # nor what did not run
    assert state.acceptance_counts == ()  # the posterior's counts are never kept
    full = TunerSettings(candidates=(EAGLE, NGRAM), restart_budget_per_hour=0)
    learned = TunerState.initial(EAGLE, 0.0, PRIORS)
    for tick in range(12):
        _, learned = decide(window(1.6), learned, full, COST, 60.0 * (tick + 1))
    assert learned.acceptance_counts != ()  # the full tuner keeps the posterior's counts


def _pr(state: TunerState, method: str) -> tuple[float, float]:
    return next((p, r) for m, p, r in state.acceptance if m == method)


def test_without_the_gp_every_config_moves_by_the_shared_offset_alone() -> None:
    points = (ResidualPoint(EAGLE, 3, math.log(1.25), 8.0),)
    with_gp = Surrogate(COST, PRIORS, residuals=points)
    offset_only = Surrogate(COST, PRIORS, residuals=points, residual_gp=False)
    assert offset_only.residual_fit is None and offset_only.offset == pytest.approx(math.log(1.25))
    for config in (EAGLE, NGRAM, SpecConfig()):
        for batch in (1.0, 8.0, 128.0):
            prior = offset_only.prior(config, batch, 1024.0)
            got = offset_only.predict(config, batch, 1024.0)
            assert got.tokens_per_s == pytest.approx(1.25 * prior.tokens_per_s)
    # the GP corrects where it measured and doubts far from it; the offset alone cannot
    far_gp, far_offset = (s.predict(NGRAM, 256.0, 1024.0) for s in (with_gp, offset_only))
    assert far_gp.uncertainty > far_offset.uncertainty


def test_the_bench_runs_the_named_ablations_and_refuses_unknown_names(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert set(ABLATIONS) == {
        "specpilot:no-gp",
        "specpilot:moving-average",
        "specpilot:no-schedules",
        "specpilot:averaged-prefill",
        "specpilot:exploration",
    }
    assert set(VARIANTS) == {
        "specpilot:caution-1",
        "specpilot:caution-0",
        "specpilot:strict-fastest",
    }
    for overrides in TUNED.values():  # each names settings that exist
        replace(TunerSettings(candidates=(EAGLE,)), **overrides)  # type: ignore[arg-type]
    code = specpilot(
        ["bench", "--trace", "bench/traces/step.csv", "--policies", "no-spec,specpilot:nope"]
    )
    assert code != 0
    err = capsys.readouterr().err
    assert "--policies" in err and "specpilot:no-gp" in err and "Traceback" not in err
    assert "specpilot:caution-0" in err  # the variants are named among the allowed values
