"""Tuner properties: stays in its space, honours dwell, budget and SLO, holds on unknown
metrics, learns acceptance, keeps its state small, and finds the regime on the physics."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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
from specpilot.tuner._model.schedule import synthesize_schedule
from specpilot.tuner.policy.learn import learn

COST = StepCost.for_hardware("H100", "llama-3.1-8b")
PRIORS = {"eagle3": AcceptanceCurve(0.775, 0.973), "ngram": AcceptanceCurve(0.2853, 1.0)}
CANDIDATES = (
    SpecConfig(),
    *(SpecConfig(method="eagle3", num_speculative_tokens=k, draft_model="d") for k in (1, 3, 5)),
    SpecConfig(method="ngram", num_speculative_tokens=3),
)


def observation(batch: float | None, tok_s: float | None, length: float | None) -> Observation:
    return Observation(
        engine="vllm",
        window_s=30.0,
        pods=("p",),
        acceptance_length=length,
        acceptance_rate=None,
        acceptance_per_position=None,
        running_requests=batch,
        waiting_requests=0.0,
        kv_cache_usage=None,
        generation_tokens_per_s=tok_s,
        tpot_p50_s=None,
        tpot_p95_s=None,
        ttft_p95_s=None,
    )


def physics_observation(config: SpecConfig, batch: float) -> Observation:
    """What the prior itself predicts: a world where the physics is exactly right."""
    curves = dict(PRIORS)
    prediction = Surrogate(COST, curves).prior(config, batch, 1024.0)
    curve = curves.get(config.method)
    length = curve.expected_length(prediction.k) if curve and prediction.k else None
    return observation(batch, prediction.tokens_per_s, length)


def in_space(config: SpecConfig) -> bool:
    if config in CANDIDATES:
        return True
    base = SpecConfig.from_dict({**config.to_dict(), "schedule": None})
    same_method = [c for c in CANDIDATES if c.method == config.method]
    return config.schedule is not None and any(
        base.draft_model == c.draft_model for c in same_method
    )


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.floats(0.5, 400),
            st.floats(0.1, 3.0),
            st.floats(1.0, 6.0) | st.none(),
            st.floats(1, 900),
        ),
        min_size=1,
        max_size=12,
    )
)
def test_never_leaves_space_and_respects_dwell_budget_and_its_reserve(ticks: list) -> None:
    tuning = TunerSettings(candidates=CANDIDATES, min_dwell_s=120.0, restart_budget_per_hour=2)
    state = TunerState.initial(SpecConfig(), 0.0, PRIORS)
    now, switches = 0.0, []
    for batch, scale, length, step in ticks:
        now += step
        truth = physics_observation(state.current, batch)
        assert truth.generation_tokens_per_s is not None
        obs = observation(batch, truth.generation_tokens_per_s * scale, length)
        before = state
        decision, state = decide(obs, state, tuning, COST, now)
        assert in_space(decision.config) and decision.reason
        if decision.action == "stay":
            assert state.current == before.current and decision.config == before.current
        else:
            # only a fresh deployment's first move may come sooner (tests/unit/test_first_move.py)
            assert now - before.since_s >= tuning.min_dwell_s or not before.restarts
            # the budget's last restart is kept for the way back: off speculation, or for
            # capacity (whose first window is not speed-checked: a queue grows the batch)
            if len([s for s in switches if now - 3600 < s]) == tuning.restart_budget_per_hour - 1:
                assert decision.action == "off" or not decision.speed_checked, decision.reason
            switches.append(now)
            assert state.current == decision.config and state.since_s == now
    for t in switches:
        assert len([s for s in switches if t - 3600 < s <= t]) <= 2


def test_holds_when_metrics_are_unknown() -> None:
    state = TunerState.initial(SpecConfig(), 0.0, PRIORS)
    tuning = TunerSettings(candidates=CANDIDATES, min_dwell_s=0)
    for obs in (
        observation(None, 100.0, 2.0),
        observation(4.0, None, 2.0),
        observation(0.0, 0.0, None),
    ):
        decision, after = decide(obs, state, tuning, COST, 1000.0)
        assert decision.action == "stay" and "holding" in decision.reason and after == state


def test_slo_excludes_slow_configs() -> None:
    tuning = TunerSettings(candidates=CANDIDATES, min_dwell_s=0, slo_tpot_p95_s=0.004)
    state = TunerState.initial(SpecConfig(), 0.0, PRIORS)
    decision, _ = decide(physics_observation(SpecConfig(), 2.0), state, tuning, COST, 1000.0)
    prediction = Surrogate(COST, dict(PRIORS)).prior(decision.config, 2.0, 1024.0)
    assert decision.action == "switch" and prediction.tpot_s <= 0.004


def test_finds_the_regime_on_exact_physics() -> None:
    # tokens/s at the window's batch: the latency objective (test_latency_objective.py) reads
    # batch 512 as beyond max-num-seqs
    tuning = TunerSettings(
        candidates=CANDIDATES,
        objective="throughput",
        min_dwell_s=0,
        synthesize_schedules=False,
        exploration=0.0,
    )
    state = TunerState.initial(SpecConfig(), 0.0, PRIORS)
    low, state = decide(physics_observation(state.current, 2.0), state, tuning, COST, 1000.0)
    assert low.action == "switch" and low.config.method == "eagle3" and low.regime == "memory-bound"
    state = TunerState.initial(low.config, 2000.0, PRIORS)
    high, _ = decide(physics_observation(low.config, 512.0), state, tuning, COST, 4000.0)
    assert high.config.max_k < low.config.max_k  # compute-bound: verify fewer tokens
    assert high.regime == "compute-bound"


def test_four_pods_at_one_pods_batch_read_as_four_engines_not_one_faster_engine() -> None:
    # `generation_tokens_per_s` is summed over the pods and `running_requests` is a mean per
    # pod: read as one engine, four replicas would look four times faster than the physics
    tuning = TunerSettings(candidates=CANDIDATES, min_dwell_s=0)
    state = TunerState.initial(SpecConfig(), 0.0, PRIORS)
    one = physics_observation(SpecConfig(), 40.0)
    assert one.generation_tokens_per_s is not None
    four = replace(
        one, pods=("a", "b", "c", "d"), generation_tokens_per_s=4 * one.generation_tokens_per_s
    )
    assert four.tokens_per_engine_s == pytest.approx(one.generation_tokens_per_s)
    decided_one, after_one = decide(one, state, tuning, COST, 1000.0)
    decided_four, after_four = decide(four, state, tuning, COST, 1000.0)
    assert decided_four == decided_one and after_four == after_one
    residual = {r.config: r.mean for r in after_four.residuals}[SpecConfig()]
    assert residual == pytest.approx(0.0, abs=1e-6)  # the physics, exactly


def test_learns_acceptance_of_the_running_method() -> None:
    config = SpecConfig(method="eagle3", num_speculative_tokens=3, draft_model="d")
    state = TunerState.initial(config, 0.0, PRIORS)
    tuning = TunerSettings(candidates=CANDIDATES, restart_budget_per_hour=0)  # never moves
    for tick in range(20):
        _, state = decide(observation(4.0, 600.0, 1.6), state, tuning, COST, 100.0 * tick)
    learned = state.acceptance_curves()["eagle3"].expected_length(3)
    assert abs(learned - 1.6) < 0.05  # the prior said 2.79; the engine says 1.6


def test_state_round_trips_and_stays_small() -> None:
    state = TunerState.initial(SpecConfig(), 0.0, PRIORS)
    tuning = TunerSettings(candidates=CANDIDATES, min_dwell_s=0, restart_budget_per_hour=1000)
    for tick in range(1000):
        batch = 1 + (tick * 37) % 300
        _, state = decide(
            physics_observation(state.current, batch), state, tuning, COST, 60.0 * tick
        )
    text = state.to_json()
    assert len(text.encode()) < 64 * 1024
    assert TunerState.from_json(text) == state
    json.loads(text)


def test_synthesised_schedule_drafts_less_as_batch_grows() -> None:
    config = SpecConfig(method="eagle3", num_speculative_tokens=7, draft_model="d")
    schedule = synthesize_schedule(config, PRIORS["eagle3"], COST)
    assert schedule is not None and schedule[0][0] == 1
    ks = [k for _, _, k in schedule]
    assert ks == sorted(ks, reverse=True) and ks[0] > ks[-1]
    SpecConfig(method="eagle3", num_speculative_tokens=max(ks), draft_model="d", schedule=schedule)


def test_acceptance_uncertainty_shrinks_as_the_method_runs() -> None:
    eagle = SpecConfig(method="eagle3", num_speculative_tokens=3, draft_model="d")
    ngram = SpecConfig(method="ngram", num_speculative_tokens=3)
    state = TunerState.initial(eagle, 0.0, PRIORS)
    before = state.acceptance_sd()
    # n-gram depends on the traffic more than a learned drafter does.
    assert before["ngram"] > before["eagle3"] > 0
    tuning = TunerSettings(candidates=CANDIDATES, restart_budget_per_hour=0)  # never moves
    for tick in range(10):
        _, state = decide(physics_observation(eagle, 8.0), state, tuning, COST, 60.0 * tick)
    after = state.acceptance_sd()
    assert after["eagle3"] < before["eagle3"] / 2  # ten windows measured it
    assert after["ngram"] == before["ngram"]  # never ran: still the prior's spread
    surrogate = Surrogate(COST, state.acceptance_curves(), acceptance_sd=after)
    running, unseen = surrogate.predict_many([eagle, ngram], 8.0, 1024.0)
    assert unseen.uncertainty > 2 * running.uncertainty
    assert surrogate.predict(SpecConfig(), 8.0, 1024.0).uncertainty == 0.0
    assert TunerState.from_json(state.to_json()).acceptance_sd() == after


def test_a_switch_reason_says_what_acceptance_it_assumed() -> None:
    state = TunerState.initial(SpecConfig(), 0.0, PRIORS)
    tuning = TunerSettings(candidates=CANDIDATES, min_dwell_s=0)
    decision, _ = decide(physics_observation(SpecConfig(), 2.0), state, tuning, COST, 600.0)
    assert decision.action == "switch"
    assert "acceptance " in decision.reason and "(prior)" in decision.reason


def test_explores_an_uncertain_method_once_and_returns_when_it_disappoints() -> None:
    plain, ngram = SpecConfig(), SpecConfig(method="ngram", num_speculative_tokens=3)
    tuning = TunerSettings(
        candidates=(plain, ngram),
        objective="throughput",
        synthesize_schedules=False,
        min_dwell_s=0,
        restart_downtime_s=5.0,
        max_downside=0.4,
    )
    state = TunerState.initial(plain, 0.0, PRIORS)
    # At batch 64 n-gram's prior is a little below no speculation, with a wide spread.
    decision, state = decide(physics_observation(plain, 64.0), state, tuning, COST, 600.0)
    assert decision.action == "switch" and decision.config == ngram
    assert decision.reason.startswith("exploring (expected improvement")
    # a downside bound below the trial's expected loss holds it (n-gram never ran: its level
    # and its acceptance are both unsure, and the default 5% bound allows the trial)
    cautious = TunerSettings(
        candidates=(plain, ngram),
        objective="throughput",
        synthesize_schedules=False,
        min_dwell_s=0,
        max_downside=0.01,
    )
    for settings_without_trial in (cautious, replace(tuning, exploration=0.0)):
        held, _ = decide(
            physics_observation(plain, 64.0),
            TunerState.initial(plain, 0.0, PRIORS),
            settings_without_trial,
            COST,
            600.0,
        )
        assert held.action == "stay"
    # The trial measures little acceptance and a slower engine: back, and no second trial.
    plain_rate = physics_observation(plain, 64.0).generation_tokens_per_s
    assert plain_rate is not None
    configs = []
    for tick in range(1, 8):
        slow = observation(64.0, 0.7 * plain_rate, 1.05)
        obs = slow if state.current == ngram else physics_observation(plain, 64.0)
        decision, state = decide(obs, state, tuning, COST, 600.0 + 60.0 * tick)
        configs.append(state.current)
    assert configs[-1] == plain and configs.count(ngram) <= 2


EAGLE3_K1 = SpecConfig(method="eagle3", num_speculative_tokens=1, draft_model="d")


def _at_batch_160(dwell_s: float) -> tuple[TunerSettings, TunerState, Observation]:
    """No speculation running at batch 160, where EAGLE-3 K=1 is predicted 18% faster; a
    restart costs 30 s, its gain counts over `dwell_s`."""
    settings = TunerSettings(
        candidates=(SpecConfig(), EAGLE3_K1),
        objective="throughput",  # the restart's pricing, at today's batch
        synthesize_schedules=False,
        min_dwell_s=0,
        restart_downtime_s=30.0,
        expected_dwell_s=dwell_s,
        exploration=0.0,
    )
    state = TunerState.initial(SpecConfig(), 0.0, PRIORS)
    return settings, state, physics_observation(SpecConfig(), 160.0)


def test_a_restart_near_capacity_under_a_tight_slo_costs_its_backlog() -> None:
    base, state, obs = _at_batch_160(600.0)
    # Both meet a 15 ms per-token SLO at batch 160, but not at max-num-seqs, where the 30 s
    # backlog would be served, and the spare capacity is small: the drain would cost more
    # than the gain.
    loose, _ = decide(obs, state, replace(base, slo_tpot_p95_s=0.05), COST, 600.0)
    tight, _ = decide(obs, state, replace(base, slo_tpot_p95_s=0.015), COST, 600.0)
    assert loose.action == "switch" and loose.config == EAGLE3_K1
    assert tight.action == "stay" and "not worth a restart" in tight.reason


def test_a_ttft_target_shorter_than_the_restart_charges_the_requests_it_delays() -> None:
    base, state, obs = _at_batch_160(300.0)
    free, _ = decide(obs, state, base, COST, 600.0)
    loose, _ = decide(obs, state, replace(base, slo_ttft_p95_s=29.0), COST, 600.0)
    # a 30 s restart against a 0.5 s TTFT target: the requests of 29.5 s arrive too late to
    # count, on top of the downtime itself, and that outweighs the gain over the dwell
    tight, _ = decide(obs, state, replace(base, slo_ttft_p95_s=0.5), COST, 600.0)
    assert free.config == loose.config == EAGLE3_K1 and loose.action == "switch"
    assert tight.action == "stay" and "not worth a restart" in tight.reason


def test_a_synthesised_schedule_with_one_k_everywhere_is_not_a_config_of_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One K at every batch is the static config at that K: as a separate config it would lack
    what the static one measured and look better for it (a restart to the same engine)."""
    from specpilot.tuner.policy import propose

    candidates = tuple(SpecConfig(method="ngram", num_speculative_tokens=k) for k in (2, 4))
    settings_ = TunerSettings(candidates=candidates)
    constant = ((1, 1024, 4),)
    varying = ((1, 31, 4), (32, 1024, 2))
    for schedule, added in ((constant, False), (varying, True)):
        monkeypatch.setattr(propose, "synthesize_schedule", lambda *_, s=schedule: s)
        space = propose._space(settings_, PRIORS, COST, 0.0, 1024.0)
        scheduled = [c for c in space if c.schedule is not None]
        assert bool(scheduled) == added, space
    # a constant schedule at a K the candidates do not hold is still a config of its own
    monkeypatch.setattr(propose, "synthesize_schedule", lambda *_: ((1, 1024, 3),))
    space = propose._space(settings_, PRIORS, COST, 0.0, 1024.0)
    assert [c.schedule for c in space if c.schedule is not None] == [((1, 1024, 3),)]


def test_an_excluded_schedule_is_not_synthesised_back_into_the_space() -> None:
    # the control loop backs off a config its canary rejected; a schedule is synthesised anew
    # each tick, so the backoff must reach the space, not only the candidates
    from specpilot.tuner.policy import propose

    settings_ = TunerSettings(candidates=CANDIDATES)
    space = propose._space(settings_, PRIORS, COST, 0.0, 1024.0)
    scheduled = [c for c in space if c.schedule is not None]
    assert scheduled
    excluded = replace(settings_, excluded=(scheduled[0],))
    assert scheduled[0] not in propose._space(excluded, PRIORS, COST, 0.0, 1024.0)


def test_a_new_engines_first_window_is_not_learned_as_its_speed() -> None:
    """The real vLLM CPU server served its first window after a switch at half the speed of the
    same load before (a cold engine), and the tuner learned that as the config's speed and
    left it. However long after the switch it comes, the first window a new config serves
    teaches acceptance and traffic but not speed; the second teaches speed."""
    ngram = SpecConfig(method="ngram", num_speculative_tokens=3)
    state = replace(TunerState.initial(ngram, 0.0, PRIORS), restarts=(0.0,), last_window_s=-30.0)
    settings = TunerSettings(candidates=CANDIDATES)
    slow = physics_observation(ngram, 4.0)
    slow = replace(slow, generation_tokens_per_s=slow.generation_tokens_per_s / 2)
    first = learn(slow, state, settings, COST, now=600.0)
    assert not isinstance(first, str)
    assert first.state.residuals == ()
    assert first.state.acceptance_support  # the window's acceptance was learned
    second = learn(slow, first.state, settings, COST, now=630.0)
    assert not isinstance(second, str)
    residual = {r.config: r.mean for r in second.state.residuals}[ngram]
    assert residual == pytest.approx(-0.693, abs=0.01)  # log(1/2): the second window counts
    again = TunerState.from_json(second.state.to_json())
    assert again.last_window_s == 630.0


def test_a_switch_onto_a_warm_engine_is_learned_from_the_first_window_wholly_after_it() -> None:
    """In the real vLLM bench's pool (one warm server per candidate) the first window after the
    move to ngram K=5 served 1324.7 tok/s where the tuner predicted 3009.6, and the load changed
    before a second window came, so K=5's speed there was never learned. With warm switches
    the first window that began after the switch teaches speed; one that straddles it (the
    old config served part of it) does not; and a restart still waits for the second."""
    ngram = SpecConfig(method="ngram", num_speculative_tokens=5)
    switched = replace(TunerState.initial(ngram, 600.0, PRIORS), restarts=(600.0,))
    slow = physics_observation(ngram, 1.0)
    slow = replace(slow, generation_tokens_per_s=slow.generation_tokens_per_s / 2)
    window = slow.window_s
    warm = TunerSettings(candidates=CANDIDATES, warm_switches=True)
    cold = TunerSettings(candidates=CANDIDATES)

    straddling = learn(slow, switched, warm, COST, now=600.0 + window / 2)
    after = learn(slow, switched, warm, COST, now=600.0 + window)
    restarted = learn(slow, switched, cold, COST, now=600.0 + 2 * window)
    assert not isinstance(straddling, str) and not isinstance(after, str)
    assert not isinstance(restarted, str)
    assert straddling.state.residuals == ()
    residual = {r.config: r.mean for r in after.state.residuals}[ngram]
    assert residual == pytest.approx(-0.693, abs=0.01)  # log(1/2)
    assert restarted.state.residuals == ()


def test_a_window_that_drafted_nothing_teaches_acceptance_not_speed() -> None:
    """vLLM's n-gram K=5 at temperature 0.7 proposed no draft for a whole phase and ran at a
    plain server's speed (bench/results/real_vllm.md at 8e4f5b7). Learned as n-gram's speed,
    that window blamed its step cost and kept the tuner off n-gram on the greedy traffic that
    followed. Such a window is evidence about acceptance (length 1) and none about speed; the
    same window with its drafts counted teaches both, as does a canary's."""
    from specpilot.tuner.policy.learn import learn_trial

    ngram = SpecConfig(method="ngram", num_speculative_tokens=5)
    state = TunerState.initial(ngram, 0.0, PRIORS)
    settings = TunerSettings(candidates=CANDIDATES)
    plain = physics_observation(SpecConfig(), 8.0)
    quiet = replace(plain, drafts=0.0)  # 30 s at the plain server's rate: thousands of tokens
    drafting = replace(plain, drafts=1000.0, acceptance_length=1.0)

    idle = learn(quiet, state, settings, COST, now=30.0)
    busy = learn(drafting, state, settings, COST, now=30.0)
    assert not isinstance(idle, str) and not isinstance(busy, str)
    assert idle.state.residuals == ()
    assert [r.config for r in busy.state.residuals] == [ngram]
    # n-gram accepts none while it drafts nothing; its counts keep what it measured before
    assert idle.acceptance["ngram"].expected_length(5) == 1.0
    assert idle.state.drafted_nothing_since("ngram") == 30.0
    assert idle.state.acceptance_counts == state.acceptance_counts
    assert busy.state.drafted_nothing_since("ngram") is None
    assert busy.acceptance["ngram"].expected_length(5) < state.acceptance_curves()[
        "ngram"
    ].expected_length(5)
    assert TunerState.from_json(idle.state.to_json()).no_drafts == (("ngram", 30.0),)

    canary_state, note = learn_trial(
        quiet, ngram, TunerState.initial(SpecConfig(), 0.0, PRIORS), settings, COST, 30.0
    )
    assert canary_state.residuals == ()
    assert "drafted nothing" in note
    counted, _ = learn_trial(
        drafting, ngram, TunerState.initial(SpecConfig(), 0.0, PRIORS), settings, COST, 30.0
    )
    assert [r.config for r in counted.residuals] == [ngram]

    # a schedule whose K at this batch is 0 meant not to draft: its window is its speed
    table = SpecConfig(method="ngram", num_speculative_tokens=3, schedule=((1, 4, 3), (5, 256, 0)))
    planned = learn(quiet, TunerState.initial(table, 0.0, PRIORS), settings, COST, now=30.0)
    assert not isinstance(planned, str)
    assert [r.config for r in planned.state.residuals] == [table]


def test_a_method_that_drafted_nothing_is_left_then_re_tested_on_what_it_accepted_before() -> None:
    """n-gram left at its first window without a draft (sampled traffic it cannot match), held
    at no acceptance while it does not run, and re-tested on what it accepted on greedy
    traffic once `retest_after_s` has passed: the traffic may have turned back (the last
    phase of bench/results/real_vllm.md at 9b462f5, where it never came back). A re-test that
    drafts nothing again is left again."""
    from specpilot.tuner.policy.learn import retest_after_s

    ks = {k: SpecConfig(method="ngram", num_speculative_tokens=k) for k in (3, 5)}
    settings = TunerSettings(
        candidates=(SpecConfig(), *ks.values()),
        objective="throughput",
        min_dwell_s=60.0,
        restart_downtime_s=30.0,
        window_s=30.0,
        synthesize_schedules=False,
    )
    greedy = {"ngram": AcceptanceCurve(0.9, 0.98)}

    def window(config: SpecConfig, drafting: bool) -> Observation:
        curves = greedy if drafting else {"ngram": AcceptanceCurve(0.0, 1.0)}
        prediction = Surrogate(COST, curves).prior(config, 4.0, 1024.0)
        obs = observation(4.0, prediction.tokens_per_s, None)
        if not config.speculative:
            return obs
        if not drafting:
            return replace(obs, drafts=0.0)
        return replace(obs, drafts=900.0, acceptance_length=curves["ngram"].expected_length(5))

    state, now = TunerState.initial(ks[5], 0.0, PRIORS), 0.0
    for _ in range(4):  # greedy traffic: n-gram K=5 runs and accepts most of its drafts
        now += 30.0
        decision, state = decide(window(state.current, True), state, settings, COST, now)
    assert state.current == ks[5] and decision.action == "stay"

    now += 30.0
    left, state = decide(window(ks[5], False), state, settings, COST, now)
    assert left.action == "off" and state.drafted_nothing_since("ngram") == now
    silent_at, marked = now, state
    # going silent after drafting is a change of the traffic's regime: one in the 120 s watched
    assert marked.regime_changes == 1 and marked.watched_since_s == 30.0
    dwell = (900.0 + silent_at - 30.0) / 2
    span = 60.0 + 2 * 30.0
    equal = retest_after_s(settings, marked, silent_at)  # loss and gain counted alike
    assert equal == pytest.approx((2 * dwell * span) ** 0.5)
    # the silent window's speed against the plain server's predicted one: what a re-test risks
    plain = Surrogate(COST, greedy).prior(SpecConfig(), 4.0, 1024.0).tokens_per_s
    silent_rate = window(ks[5], False).generation_tokens_per_s
    speed = dict(marked.no_draft_speed)["ngram"]  # kept against no speculation's prior
    assert speed == pytest.approx(math.log(silent_rate / plain), abs=0.02)
    loss = 1.0 - math.exp(speed)  # no speculation runs at its prior here
    assert loss > 0.0

    while True:  # plain traffic the windows cannot tell from greedy while n-gram is off
        now += 30.0
        before = state
        back, state = decide(window(SpecConfig(), True), state, settings, COST, now)
        if back.action != "stay":
            break
        assert state.current == SpecConfig(), back.reason
    due = before
    assert back.action == "switch" and back.config.method == "ngram", back.reason
    assert f"re-testing ngram, which drafted nothing {now - silent_at:.0f}s ago" in back.reason
    # a re-test that risks its restarts and a few percent of a span for a gain of several
    # times is due well before the wait that counts loss and gain alike (350 s here)
    assert now - silent_at < 0.6 * equal, back.reason
    assert f"drafting nothing lost {loss:.0%}" in back.reason
    assert not back.trial  # no canary: the re-test moves the engine
    assert state.drafted_nothing_since("ngram") is None
    # where a canary can run it, the re-test is a trial at the canary's share of the traffic
    with_canary = replace(settings, trial_share=0.25)
    on_canary, _ = decide(window(SpecConfig(), True), due, with_canary, COST, now)
    assert on_canary.trial and on_canary.config == back.config, on_canary.reason
    assert "re-testing ngram" in on_canary.reason and "(on a canary)" in on_canary.reason

    for _ in range(2):  # the restart's window, then the minimum dwell
        now += 30.0
        again, state = decide(window(back.config, False), state, settings, COST, now)
    assert again.action == "off" and state.drafted_nothing_since("ngram") is not None
    # the re-test's silent window is the tuner's bet failing, not the traffic changing
    assert state.regime_changes == 1


def test_the_re_test_wait_weighs_what_a_re_test_risks_against_what_it_finds() -> None:
    """T = sqrt(2 D (2R + S x loss) / gain): the equal-weights wait when loss and gain are
    alike; shorter for a re-test that risks little for much (n-gram on vLLM's CPU build with
    shared switches: about a quarter lost drafting nothing, +79% matched); a read of no loss
    or no gain is floored, so the wait neither collapses to every window nor grows without
    bound. The loss is measured, blended over silent windows, and kept across restarts."""
    from specpilot.tuner.policy.learn import MIN_RETEST_GAIN, MIN_RETEST_LOSS, retest_after_s

    shared = TunerSettings(
        candidates=(SpecConfig(),), min_dwell_s=70.0, window_s=70.0, restart_downtime_s=0.0
    )
    state = TunerState.initial(SpecConfig(), 0.0, PRIORS)
    dwell = 900.0  # nothing watched: the told dwell
    equal = retest_after_s(shared, state, 0.0)
    assert equal == pytest.approx((2 * dwell * 70.0) ** 0.5)
    assert retest_after_s(shared, state, 0.0, loss=0.3, gain=0.3) == pytest.approx(equal)
    weighted = retest_after_s(shared, state, 0.0, loss=0.25, gain=0.79)
    assert weighted == pytest.approx(equal * (0.25 / 0.79) ** 0.5)
    assert retest_after_s(shared, state, 0.0, loss=0.0, gain=0.79) == pytest.approx(
        equal * (MIN_RETEST_LOSS / 0.79) ** 0.5
    )
    assert retest_after_s(shared, state, 0.0, loss=0.25, gain=-0.1) == pytest.approx(
        equal * (0.25 / MIN_RETEST_GAIN) ** 0.5
    )
    # restarts are all serving lost, whatever the method loses while it drafts nothing
    restarting = replace(shared, restart_downtime_s=30.0)
    assert retest_after_s(restarting, state, 0.0, loss=0.25, gain=1.0) == pytest.approx(
        (2 * dwell * (60.0 + 70.0 * 0.25)) ** 0.5
    )

    measured = state.learn_no_draft_speed("ngram", -0.3).learn_no_draft_speed("ngram", -0.1)
    assert dict(measured.no_draft_speed)["ngram"] == pytest.approx(-0.2)
    assert TunerState.from_json(measured.to_json()) == measured


def test_a_re_test_reads_the_loss_of_drafting_nothing_against_no_speculation_as_measured() -> None:
    """A silent window's speed is kept against no speculation's prior, and read as a loss
    against no speculation as it is predicted once it has run at that load, in the same
    window that measured it: at 73dff18 n-gram's first silent window at concurrency 32 came
    before no speculation had run there and read a 9% loss, where the statics measured 28%
    (bench/results/real_vllm-shared-rounds6.md)."""
    from specpilot.tuner.policy.learn import learn, retest_wait

    k5 = SpecConfig(method="ngram", num_speculative_tokens=5)
    settings = TunerSettings(
        candidates=(SpecConfig(), k5),
        warm_switches=True,
        synthesize_schedules=False,
        objective="throughput",
    )
    plain_prior = Surrogate(COST, PRIORS).prior(SpecConfig(), 16.0, 1024.0).tokens_per_s
    silent = replace(observation(16.0, 0.9 * plain_prior, None), drafts=0.0)
    first = learn(silent, TunerState.initial(k5, 0.0, PRIORS), settings, COST, now=30.0)
    assert not isinstance(first, str)
    assert dict(first.state.no_draft_speed)["ngram"] == pytest.approx(math.log(0.9), abs=0.01)
    unmeasured = retest_wait("ngram", first.state, settings, COST, 16.0, first.context, 30.0)
    assert unmeasured.loss == pytest.approx(0.1, abs=0.02)  # no speculation at its prior

    # no speculation then serves this load at 1.25x its prior, long enough after that the
    # window that measures it is also the one n-gram's re-test is due in
    off = replace(first.state, current=SpecConfig(), since_s=60.0, restarts=(60.0,))
    plain = observation(16.0, 1.25 * plain_prior, None)
    later = learn(plain, off, settings, COST, now=5000.0)
    assert not isinstance(later, str)
    wait = later.retest_waits["ngram"]
    assert wait.loss == pytest.approx(1.0 - 0.9 / 1.25, abs=0.03)
    # one window's residual is an offset shared by every config: the predicted gain stays
    assert wait.gain == pytest.approx(unmeasured.gain)
    assert wait.seconds > unmeasured.seconds


def test_a_re_test_reads_its_gain_from_what_each_config_measured_at_this_load() -> None:
    """A re-test's gain compares configs that ran in different phases: each is read as its own
    windows in this load bucket measured it, where the GP would shrink a lone summary far from
    the config's others toward its level (on the real vLLM CPU server no speculation was
    predicted 3353 tok/s at batch 17.9 in the window that measured 5177)."""
    from specpilot.tuner.policy.learn import _surrogate, retest_wait

    k5 = SpecConfig(method="ngram", num_speculative_tokens=5)
    settings = TunerSettings(
        candidates=(SpecConfig(), k5), synthesize_schedules=False, objective="throughput"
    )
    state = TunerState.initial(k5, 0.0, PRIORS)
    for _ in range(8):  # no speculation, long at batch 1, read slow there
        state = state.learn_throughput(SpecConfig(), 1.0, math.exp(-0.4))
    for _ in range(3):  # n-gram K=5 at this load on traffic it matched
        state = state.learn_throughput(k5, 16.0, math.exp(0.2))
    state = state.learn_throughput(SpecConfig(), 16.0, math.exp(0.3))  # once, just now
    assert state.measured_residual(SpecConfig(), 16.0) == pytest.approx(0.3)
    assert state.measured_residual(k5, 64.0) is None

    wait = retest_wait("ngram", state, settings, COST, 16.0, 1024.0, 100.0)
    fitted = _surrogate(state, settings, COST)  # the prior at the state's acceptance, plus the GP
    measured = (
        fitted.prior(k5, 16.0, 1024.0).tokens_per_s
        * math.exp(0.2)
        / (fitted.prior(SpecConfig(), 16.0, 1024.0).tokens_per_s * math.exp(0.3))
    )
    assert wait.gain == pytest.approx(measured - 1.0, rel=1e-6)
    plain, drafting = fitted.predict_many([SpecConfig(), k5], 16.0, 1024.0)
    # the GP's cross-config read is the one that would have been used: it reads more gain
    assert drafting.tokens_per_s / plain.tokens_per_s - 1.0 > wait.gain + 0.05
    # no candidate of the method measured at this load: the GP's prediction stands
    unmeasured = retest_wait("ngram", state, settings, COST, 64.0, 1024.0, 100.0)
    plain64, drafting64 = fitted.predict_many([SpecConfig(), k5], 64.0, 1024.0)
    expected64 = drafting64.tokens_per_s / plain64.tokens_per_s - 1.0
    assert unmeasured.gain == pytest.approx(expected64, rel=1e-6)


def test_how_long_traffic_stays_in_one_regime_is_learned_from_the_changes_seen() -> None:
    """The re-test interval's dwell: the told `expected_dwell_s` before any window, then a
    Gamma posterior on the rate of the regime changes the tuner counted (load steps of 2x or
    more from where the last change left it, a drafter going silent) over the time watched."""
    from specpilot.tuner.policy.learn import regime_dwell_s

    settings = TunerSettings(candidates=(SpecConfig(),), expected_dwell_s=900.0)
    state = TunerState.initial(SpecConfig(), 0.0, PRIORS)
    assert regime_dwell_s(settings, state, 500.0) == 900.0  # nothing watched yet
    state = state.note_regime(1.0, False, 60.0)  # the first window: where the load starts
    state = state.note_regime(1.6, False, 120.0)  # drift under 2x is not a new regime
    assert state.regime_changes == 0
    state = state.note_regime(20.0, False, 180.0)  # concurrency 1 -> 32
    state = state.note_regime(28.0, False, 240.0)  # within 2x of where that step left it
    state = state.note_regime(25.0, True, 300.0)  # the drafter found nothing to propose
    state = state.note_regime(1.0, False, 360.0)  # back down
    assert state.regime_changes == 3 and state.regime_batch == 1.0
    assert regime_dwell_s(settings, state, 360.0) == pytest.approx((900.0 + 300.0) / 4)
    assert TunerState.from_json(state.to_json()) == state
    steady = TunerState.initial(SpecConfig(), 0.0, PRIORS).note_regime(4.0, False, 0.0)
    assert regime_dwell_s(settings, steady, 3600.0) == pytest.approx(4500.0)
