"""Exploration as a bounded trial, and what a fresh deployment's first window teaches.

A trial is bounded in time (the loop measures it in its first window and the tuner may undo it
once the dwell allows), so a method whose acceptance the tuner has never measured is worth
trying when its expected gain over the dwell beats its expected loss over the trial, even if
one standard deviation down it would be much slower. The scenario is the one the real-engine
benches hit: an affine step-time fit of a CPU server at batch 1, n-gram candidates, the chat
prior (acceptance length 1.39 at K=3, where greedy traffic gives 3.6), a 20 s restart.
"""

from __future__ import annotations

from dataclasses import replace

from test_first_move import proposal

from specpilot.tuner import (
    Observation,
    SpecConfig,
    StepCost,
    StepTimeModel,
    TunerSettings,
    TunerState,
    acceptance_curve,
    decide,
)
from specpilot.tuner.policy.gate import keeps_the_reserve

PLAIN = SpecConfig()
NGRAM3 = SpecConfig(method="ngram", num_speculative_tokens=3)
NGRAM5 = SpecConfig(method="ngram", num_speculative_tokens=5)
CPU_FIT = StepTimeModel(fixed_s=5.98e-3, per_token_s=0.791e-3, per_kv_token_s=0.0, source="fit")
"""bench/results/real_sglang.md's fit of the plain SGLang CPU server (c = 1, 2, 4, 8)."""
COST = StepCost.from_fit(CPU_FIT, "H100", "llama-3.1-8b")
PRIORS = {"ngram": acceptance_curve("ngram", "chat")}


def settings(**overrides: float) -> TunerSettings:
    base = TunerSettings(
        candidates=(PLAIN, NGRAM3, NGRAM5),
        synthesize_schedules=False,
        min_dwell_s=20.0,
        restart_downtime_s=20.0,
        window_s=10.0,
    )
    return replace(base, **overrides)


def window(batch: float, tokens_per_s: float) -> Observation:
    return Observation(
        engine="sglang",
        window_s=10.0,
        pods=("p",),
        acceptance_length=None,
        acceptance_rate=None,
        acceptance_per_position=None,
        running_requests=batch,
        waiting_requests=0.0,
        kv_cache_usage=0.01,
        generation_tokens_per_s=tokens_per_s,
        tpot_p50_s=None,
        tpot_p95_s=None,
        ttft_p95_s=None,
        prompt_tokens_per_s=0.2 * tokens_per_s,
    )


def test_an_unmeasured_method_level_on_the_mean_is_tried() -> None:
    state = TunerState.initial(PLAIN, 0.0, PRIORS)
    decision, after = decide(window(1.0, 115.0), state, settings(), COST, 35.0)
    assert decision.action == "switch" and decision.config.method == "ngram"
    assert decision.reason.startswith("exploring (expected improvement less the expected loss")
    assert "(prior)" in decision.reason  # it says the acceptance it tries was never measured
    assert after.current == decision.config and after.restarts == (35.0,)


def test_a_trial_leaves_the_budgets_last_restart_unspent() -> None:
    # a trial is only worth what it might teach, off speculation too (Azure, 4 replicas with a
    # surge, world 9: a canary of no speculation spent it and EAGLE-3 met the surge with none);
    # the last restart is the way out of a surge: a move for capacity off speculation
    assert keeps_the_reserve(proposal(headroom=None, trial=True, config=PLAIN))
    assert keeps_the_reserve(proposal(headroom=None, trial=True, for_capacity=True))
    assert not keeps_the_reserve(proposal(headroom=None, for_capacity=True, config=PLAIN))
    state = replace(TunerState.initial(PLAIN, 0.0, PRIORS), restarts=(1.0,))
    decision, after = decide(
        window(1.0, 115.0), state, settings(restart_budget_per_hour=2), COST, 35.0
    )
    assert decision.action == "stay" and "last restart" in decision.reason, decision.reason
    assert after.current == PLAIN
    tried, _ = decide(window(1.0, 115.0), state, settings(restart_budget_per_hour=3), COST, 35.0)
    assert tried.action == "switch" and tried.reason.startswith("exploring"), tried.reason


def test_a_trial_that_would_run_as_long_as_its_gain_counts_is_not_made() -> None:
    # With the dwell as long as the horizon, a disappointing trial loses over the whole
    # horizon what a good one gains: on a level mean that is no bet (max_downside binds too).
    long_trial = settings(min_dwell_s=900.0, expected_dwell_s=900.0)
    state = TunerState.initial(PLAIN, 0.0, PRIORS)
    decision, _ = decide(window(1.0, 115.0), state, long_trial, COST, 35.0)
    assert decision.action == "stay"
    no_exploration = settings(exploration=0.0)
    decision, _ = decide(window(1.0, 115.0), state, no_exploration, COST, 35.0)
    assert decision.action == "stay"


def test_a_fresh_deployment_learns_from_its_first_window() -> None:
    # a long dwell, but one window at batch 1 is far below any config's capacity: the first
    # move need not wait for it (tests/unit/test_first_move.py)
    patient = settings(min_dwell_s=600.0)
    # on code, n-gram's prior (length 2.03 at K=3) is faster than no speculation on the mean
    state = TunerState.initial(PLAIN, 0.0, {"ngram": acceptance_curve("ngram", "code")})
    first, state = decide(window(1.0, 115.0), state, patient, COST, 10.0)
    assert first.action == "switch" and first.reason.startswith("predicted faster")
    # and that first window taught the residual: the plain engine runs slower than its prior
    assert len(state.residuals) == 1 and state.residuals[0].config == PLAIN
    assert state.residuals[0].mean < 0
