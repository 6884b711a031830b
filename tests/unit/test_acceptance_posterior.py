"""Acceptance as a posterior: from simulated engine counters drawn from a known chain (p, r),
the tuner's estimate converges to it (r included), its spread shrinks, it follows drift, a
method that never ran follows the task mix the running one reveals, SGLang's length-only
figures update it, and broken inputs change nothing."""

from __future__ import annotations

import itertools
import json
import math
import random
from collections.abc import Sequence
from dataclasses import replace

import pytest

from specpilot.runtime.engine_metrics import WindowStats, observe
from specpilot.tuner import (
    AcceptanceCurve,
    ConfigError,
    Observation,
    SpecConfig,
    TunerState,
    acceptance_curve,
)
from specpilot.tuner._model import task_mix
from specpilot.tuner._model.acceptance_posterior import MAX_ESS, fit_chain

EAGLE3_K5 = SpecConfig(method="eagle3", num_speculative_tokens=5, draft_model="d")
NGRAM_K3 = SpecConfig(method="ngram", num_speculative_tokens=3)
CHAT = {m: acceptance_curve(m, "chat") for m in ("eagle3", "ngram", "mtp")}
TRUTH = AcceptanceCurve(0.8, 0.9)


def window(
    counts: Sequence[int] | None,
    drafts: float | None,
    length: float | None,
    *,
    engine: str = "vllm",
    k: int | None = None,
) -> Observation:
    """One window as engine_metrics reports it: per-position shares of the drafts (vLLM)."""
    per_position = None if counts is None or not drafts else tuple(c / drafts for c in counts)
    rate = (length - 1) / k if length is not None and k else None
    return Observation(
        engine=engine,
        window_s=60.0,
        pods=("p",),
        acceptance_length=length,
        acceptance_rate=rate,
        acceptance_per_position=per_position,
        running_requests=4.0,
        waiting_requests=0.0,
        kv_cache_usage=None,
        generation_tokens_per_s=500.0,
        tpot_p50_s=None,
        tpot_p95_s=None,
        ttft_p95_s=None,
        drafts=drafts,
    )


def drawn(curve: AcceptanceCurve, k: int, drafts: int, rng: random.Random) -> Observation:
    """vLLM's counters over one window of `drafts` drafts drawn from `curve`."""
    per_position = [0] * k
    for _ in range(drafts):
        for position in range(curve.draw(rng, k)):
            per_position[position] += 1
    return window(per_position, float(drafts), 1 + sum(per_position) / drafts, k=k)


def expected(curve: AcceptanceCurve, k: int, *, engine: str = "vllm") -> Observation:
    """A window exactly on `curve`'s expectation (2,000 drafts)."""
    drafts, survive, counts = 2000.0, 1.0, []
    for position in range(1, k + 1):
        survive *= curve.conditional(position)
        counts.append(drafts * survive)
    length = 1 + sum(counts) / drafts
    if engine == "sglang":
        return window(None, drafts, length, engine="sglang", k=k)
    return window([round(c) for c in counts], drafts, length, k=k)


def close(a: AcceptanceCurve, b: AcceptanceCurve, tol: float = 1e-9) -> bool:
    return abs(a.p - b.p) <= tol and abs(a.r - b.r) <= tol


def run(state: TunerState, config: SpecConfig, windows: Sequence[Observation]) -> TunerState:
    for obs in windows:
        state = state.learn_acceptance(config, obs, 0.0)
    return state


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_converges_to_a_known_chain_and_learns_r(seed: int) -> None:
    rng = random.Random(seed)
    state = TunerState.initial(EAGLE3_K5, 0.0, CHAT)
    # the traffic is believed 95% chat: the estimate starts at the chat prior, nearly
    assert close(state.acceptance_curves()["eagle3"], CHAT["eagle3"], 0.002)  # r = 0.973
    state = run(state, EAGLE3_K5, [drawn(TRUTH, 5, 500, rng) for _ in range(30)])
    learned = state.acceptance_curves()["eagle3"]
    assert learned.p == pytest.approx(0.8, abs=0.015)
    assert learned.r == pytest.approx(0.9, abs=0.015)  # the prior's 0.973 is left behind
    assert learned.expected_length(5) == pytest.approx(TRUTH.expected_length(5), abs=0.03)


def test_on_the_expectation_the_fit_is_tight() -> None:
    state = run(TunerState.initial(EAGLE3_K5, 0.0, CHAT), EAGLE3_K5, [expected(TRUTH, 5)] * 30)
    learned = state.acceptance_curves()["eagle3"]
    assert learned.p == pytest.approx(0.8, abs=0.005)
    assert learned.r == pytest.approx(0.9, abs=0.005)


def test_spread_shrinks_with_data_and_stays_bounded() -> None:
    rng = random.Random(7)
    state = TunerState.initial(EAGLE3_K5, 0.0, CHAT)
    spreads = [state.acceptance_sd()["eagle3"]]
    assert spreads[0] == pytest.approx(0.08)  # the published prior's spread
    for _ in range(12):
        state = run(state, EAGLE3_K5, [drawn(TRUTH, 5, 40, rng)])
        spreads.append(state.acceptance_sd()["eagle3"])
    assert all(b < a for a, b in itertools.pairwise(spreads[:7]))
    assert spreads[-1] < spreads[0] / 2.5  # 40 drafts a window: about 160 behind it
    # the never-run method keeps its prior's spread; the running one's sample size is capped
    assert state.acceptance_sd()["ngram"] == pytest.approx(0.25)
    state = run(state, EAGLE3_K5, [drawn(TRUTH, 5, 5000, rng) for _ in range(20)])
    (_, _, trials, _), *_ = state.acceptance_counts
    assert trials[0] <= MAX_ESS + 1e-6
    floor = math.sqrt(0.8 * 0.2 / (MAX_ESS + 1))
    assert state.acceptance_sd()["eagle3"] == pytest.approx(floor, rel=0.1)


def test_follows_drift() -> None:
    rng = random.Random(11)
    state = run(
        TunerState.initial(EAGLE3_K5, 0.0, CHAT),
        EAGLE3_K5,
        [drawn(TRUTH, 5, 500, rng) for _ in range(20)],
    )
    drifted = AcceptanceCurve(0.6, 0.9)
    path = []
    for _ in range(12):
        state = run(state, EAGLE3_K5, [drawn(drifted, 5, 500, rng)])
        path.append(state.acceptance_curves()["eagle3"].p)
    assert path[0] < 0.78  # the first window already moves it
    assert path[-1] == pytest.approx(0.6, abs=0.02)
    assert state.acceptance_curves()["eagle3"].r == pytest.approx(0.9, abs=0.03)


def test_a_task_mix_shift_moves_a_method_that_never_ran() -> None:
    code = {m: acceptance_curve(m, "code") for m in CHAT}
    state = run(
        TunerState.initial(NGRAM_K3, 0.0, CHAT), NGRAM_K3, [expected(CHAT["ngram"], 3)] * 10
    )
    before = state.acceptance_curves()
    assert before["eagle3"].p == pytest.approx(CHAT["eagle3"].p, abs=0.003)
    assert state.task_weights()["chat"] > 0.7
    # the traffic turns to code: n-gram's acceptance rises to its code prior
    state = run(state, NGRAM_K3, [expected(code["ngram"], 3)] * 8)
    after = state.acceptance_curves()
    assert state.task_weights()["code"] > 0.5
    assert after["ngram"].p == pytest.approx(code["ngram"].p, abs=0.02)
    for method in ("eagle3", "mtp"):  # never ran: they follow their own code priors
        gap_before = abs(before[method].p - code[method].p)
        gap_after = abs(after[method].p - code[method].p)
        assert gap_after < 0.6 * gap_before
    assert "eagle3" not in dict(state.acceptance_support)


def test_a_fresh_method_far_from_its_prior_does_not_drag_the_task_mix() -> None:
    # greedy repetitive traffic: n-gram accepts far more than any task's prior says; that is
    # n-gram's own level (its counts learn it), not evidence that the traffic is code
    greedy = AcceptanceCurve(0.85, 1.0)
    state = run(TunerState.initial(NGRAM_K3, 0.0, CHAT), NGRAM_K3, [expected(greedy, 3)] * 8)
    assert state.acceptance_curves()["ngram"].p == pytest.approx(0.85, abs=0.02)
    assert state.task_weights()["chat"] > 0.7
    assert state.acceptance_curves()["eagle3"].p == pytest.approx(CHAT["eagle3"].p, abs=0.01)


def test_sglang_length_only_updates() -> None:
    sglang = SpecConfig(method="eagle3", num_speculative_tokens=3, draft_model="d")
    truth = AcceptanceCurve(0.6, 0.973)
    state = TunerState.initial(sglang, 0.0, CHAT)
    before = state.acceptance_sd()["eagle3"]
    state = run(state, sglang, [expected(truth, 3, engine="sglang")] * 15)
    learned = state.acceptance_curves()["eagle3"]
    assert learned.expected_length(3) == pytest.approx(truth.expected_length(3), abs=0.03)
    assert learned.r == pytest.approx(CHAT["eagle3"].r, abs=0.01)  # one K cannot tell r
    assert state.acceptance_sd()["eagle3"] < before / 3
    # without a verify count a window counts as a full one
    unsized = window(None, None, truth.expected_length(3), engine="sglang", k=3)
    again = run(TunerState.initial(sglang, 0.0, CHAT), sglang, [unsized] * 15)
    assert again.acceptance_curves()["eagle3"].expected_length(3) == pytest.approx(
        truth.expected_length(3), abs=0.03
    )


@pytest.mark.parametrize(
    "broken",
    [
        window(None, 500.0, float("nan"), k=5),
        window(None, 500.0, float("inf"), k=5),
        window(None, 500.0, None, k=5),
        # no drafts and too few tokens to tell (prefill's first tokens)
        replace(window([250, 100, 40, 10, 2], 0.0, 1.8, k=5), generation_tokens_per_s=4.0),
        replace(window(None, 0.0, None, k=5), generation_tokens_per_s=None),
        window(None, float("nan"), 0.5, k=5),  # below 1: not a length
        window([250, 100, 40, 10, 2], float("inf"), None, k=5),
    ],
)
def test_non_finite_and_zero_inputs_are_ignored(broken: Observation) -> None:
    state = run(TunerState.initial(EAGLE3_K5, 0.0, CHAT), EAGLE3_K5, [expected(TRUTH, 5)] * 3)
    after = state.learn_acceptance(EAGLE3_K5, broken, 0.0)
    assert after == state


def test_a_drafter_that_proposes_nothing_is_learned_as_no_acceptance() -> None:
    # n-gram on sampled text: the engine decoded thousands of tokens and drafted not once;
    # the method's estimate falls toward no acceptance and lifts again once it drafts well
    state = run(TunerState.initial(NGRAM_K3, 0.0, CHAT), NGRAM_K3, [expected(TRUTH, 3)] * 10)
    learned = state.acceptance_curves()["ngram"].expected_length(3)
    assert learned > 2.0
    silent = window(None, 0.0, None, k=3)  # 500 tok/s over 60 s, no drafts
    after = run(state, NGRAM_K3, [silent] * 5)
    assert after.acceptance_curves()["ngram"].expected_length(3) < 1.3
    back = run(after, NGRAM_K3, [expected(TRUTH, 3)] * 10)
    assert back.acceptance_curves()["ngram"].expected_length(3) > 2.0


def test_a_broken_per_position_reading_falls_back_to_the_length() -> None:
    obs = expected(TRUTH, 5)
    assert obs.acceptance_per_position is not None
    broken = Observation(
        **{
            **{f: getattr(obs, f) for f in obs.__dataclass_fields__},
            "acceptance_per_position": (0.8, float("nan"), 0.4, 0.2, 0.1),
        }
    )
    state = run(TunerState.initial(EAGLE3_K5, 0.0, CHAT), EAGLE3_K5, [broken] * 20)
    learned = state.acceptance_curves()["eagle3"]
    assert learned.expected_length(5) == pytest.approx(TRUTH.expected_length(5), abs=0.03)


def test_a_schedule_reads_only_the_positions_every_tier_offers() -> None:
    scheduled = SpecConfig(
        method="eagle3",
        num_speculative_tokens=3,
        draft_model="d",
        schedule=((1, 4, 3), (5, 256, 1)),
    )
    # half the drafts at K=1, half at K=3: position 2 and 3 were offered by half of them only
    drafts, q = 1000.0, TRUTH
    deep = drafts / 2 * q.conditional(1)
    counts = [
        drafts * q.conditional(1),
        deep * q.conditional(2),
        deep * q.conditional(2) * q.conditional(3),
    ]
    length = 1 + sum(counts) / drafts
    obs = window([round(c) for c in counts], drafts, length, k=2)  # rate as if K were 2 on average
    state = run(TunerState.initial(scheduled, 0.0, CHAT), scheduled, [obs] * 20)
    learned = state.acceptance_curves()["eagle3"]
    assert learned.p == pytest.approx(0.8, abs=0.01)
    assert learned.r > 0.95  # the diluted deep positions did not pass for a fast decay


def test_state_round_trips_stays_small_and_reads_old_json() -> None:
    rng = random.Random(5)
    config = SpecConfig(method="dflash", num_speculative_tokens=15, draft_model="d")
    priors = {m: acceptance_curve(m, "chat") for m in ("eagle3", "ngram", "mtp", "dflash", "eagle")}
    state = TunerState.initial(config, 0.0, priors)
    state = run(state, config, [drawn(AcceptanceCurve(0.9, 0.97), 15, 300, rng) for _ in range(5)])
    state = run(state, EAGLE3_K5, [drawn(TRUTH, 5, 300, rng) for _ in range(5)])
    state = run(state, NGRAM_K3, [drawn(CHAT["ngram"], 3, 300, rng) for _ in range(5)])
    state = state.measured_on_canary(EAGLE3_K5).measured_on_canary(NGRAM_K3)
    assert state.measured_on_canary(NGRAM_K3).canary_only == (EAGLE3_K5, NGRAM_K3)
    assert state.ran_on_main(EAGLE3_K5).canary_only == (NGRAM_K3,)
    text = state.to_json()
    assert len(text.encode()) < 4096
    assert TunerState.from_json(text) == state
    # a state stored before the posterior (its estimates held as the priors) still loads
    old = json.loads(text)
    for key in ("acceptance_counts", "prior_task", "task_mix", "task_strength", "canary_only"):
        del old[key]
    resumed = TunerState.from_json(json.dumps(old))
    assert close(resumed.acceptance_curves()["eagle3"], CHAT["eagle3"], 0.002)
    with pytest.raises(ValueError, match="prior_task"):
        TunerState.from_json(json.dumps({**json.loads(text), "prior_task": "poetry"}))


def test_a_users_own_prior_is_kept_until_measured() -> None:
    mine = {"ngram": AcceptanceCurve(0.5, 1.0), "eagle3": AcceptanceCurve(0.7, 0.95)}
    state = TunerState.initial(NGRAM_K3, 0.0, mine)
    assert state.prior_task == "chat"
    # 95% chat: a few percent of other tasks, whose chains mix into the deeper positions
    assert close(state.acceptance_curves()["ngram"], mine["ngram"], 0.03)
    assert close(state.acceptance_curves()["eagle3"], mine["eagle3"], 0.005)
    with pytest.raises(ConfigError, match="task"):
        TunerState.initial(NGRAM_K3, 0.0, mine, task="poetry")
    coded = TunerState.initial(NGRAM_K3, 0.0, {"ngram": acceptance_curve("ngram", "code")})
    assert coded.prior_task == "code" and coded.task_weights()["code"] > 0.5
    added = state.with_priors({"mtp": CHAT["mtp"], "ngram": AcceptanceCurve(0.1)})
    assert close(added.acceptance_curves()["mtp"], CHAT["mtp"], 0.005)
    assert added.acceptance_curves()["ngram"] == state.acceptance_curves()["ngram"]


def test_the_chain_fit_recovers_a_chain_and_weighs_by_precision() -> None:
    chain = AcceptanceCurve(0.7, 0.9)
    means = [chain.conditional(i) for i in range(1, 7)]
    assert close(fit_chain(means, [100.0] * 6, 1.0), chain)
    # a wild deep position with almost no support barely moves the fit
    noisy = [*means[:-1], 0.05]
    fitted = fit_chain(noisy, [100.0] * 5 + [0.01], 1.0)
    assert fitted.p == pytest.approx(0.7, abs=0.002) and fitted.r == pytest.approx(0.9, abs=0.002)


def test_task_mix_moves_only_on_evidence() -> None:
    mix = task_mix.initial_mix(("chat", "code", "summarize"), "chat")
    lengths = (1.39, 2.03, 1.33)
    # a window on the expectation keeps the length the mix explains (and the mix, roughly)
    still, _ = task_mix.update(mix, 2.0, lengths, 0.0, 0.01, mix)
    explained = sum(w * length for w, length in zip(mix, lengths, strict=True))
    assert sum(w * length for w, length in zip(still, lengths, strict=True)) == pytest.approx(
        explained, abs=0.05
    )
    assert still == pytest.approx(mix, abs=0.1)
    assert task_mix.update(mix, 2.0, (2.0, 2.0, 2.0), 0.5, 0.01, mix) == (mix, 2.0)
    assert task_mix.update(mix, 2.0, lengths, float("nan"), 0.01, mix) == (mix, 2.0)
    moved, strength = task_mix.update(mix, 2.0, lengths, 0.5, 0.003, mix)
    assert moved[1] > 0.5 and sum(moved) == pytest.approx(1.0, abs=1e-3)
    assert task_mix.MIN_STRENGTH <= strength <= task_mix.MAX_STRENGTH


def test_engine_metrics_report_the_drafts_behind_the_acceptance() -> None:
    vllm = WindowStats(
        pod="a",
        window_s=30.0,
        counters={"accepted": 300.0, "drafts": 200.0, "draft_tokens": 600.0},
        accepted_per_position={0: 150.0, 1: 100.0, 2: 50.0},
    )
    obs = observe("vllm", [vllm, vllm])
    assert obs.drafts == 400.0 and obs.acceptance_per_position == pytest.approx((0.75, 0.5, 0.25))
    sglang = WindowStats(
        pod="b",
        window_s=30.0,
        counters={"verify_calls": 120.0},
        gauges={"accept_length_gauge": 2.5},
    )
    assert observe("sglang", [sglang]).drafts == 120.0


def test_the_chain_fit_keeps_position_one_where_it_was_measured() -> None:
    # vLLM's survival shares (1.7%, 1.7%, 1.7%): the first draft almost never accepted, but
    # when it is, so are the rest (conditionals 1.0): the length is 1.05, not a chain of 2.
    measured = [0.0167, 1.0 - 1e-6, 1.0 - 1e-6]
    fitted = fit_chain(measured, [3000.0, 50.0, 50.0], 1.0)
    assert fitted.p == pytest.approx(0.0167, abs=1e-4)
    assert fitted.expected_length(3) == pytest.approx(1.0 + 3 * 0.0167, abs=0.04)
