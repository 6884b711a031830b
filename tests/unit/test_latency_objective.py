"""The latency objective: steady batches by Little's law, capacity against the load ahead, and
a config whose capacity is below the forecast arrival rate never chosen at peak."""

from __future__ import annotations

import json
import math
import re
from dataclasses import replace

import pytest

from specpilot.tuner import (
    AcceptanceCurve,
    Decision,
    Observation,
    SpecConfig,
    StepCost,
    Surrogate,
    TunerSettings,
    TunerState,
    decide,
    judge_trial,
    learn_trial,
)
from specpilot.tuner._model.residual_gp import ResidualPoint
from specpilot.tuner.policy import latency_proposal
from specpilot.tuner.policy.decision import exit_ceiling
from specpilot.tuner.policy.latency import (
    OVERLOAD_PENALTY,
    QUEUE_GROWTH,
    backlog_point,
    batch_limit,
    latency_score,
    load_curves,
    overload_factor,
    overload_unit,
    throughput_at,
)
from specpilot.tuner.policy.latency_proposal import (
    BACKLOG_BATCH_RATIO,
    BACKLOG_MIN_BATCH,
    BEYOND_SATURATION,
    behind,
    demand_ahead,
    exit_ceilings,
    offered_demand,
    plain_capacity,
    propose_for_latency,
    short_in_the_canary_start,
)
from specpilot.tuner.policy.learn import Belief
from specpilot.tuner.policy.plan import trend_holds
from specpilot.tuner.policy.propose import propose

COST = StepCost.for_hardware("H100", "llama-3.1-8b")
PRIORS = {"eagle3": AcceptanceCurve(0.775, 0.973)}
NO_SPEC = SpecConfig()
EAGLE = SpecConfig(method="eagle3", num_speculative_tokens=5, draft_model="d")
CANDIDATES = (NO_SPEC, EAGLE)
CONTEXT = 1024.0
PREFILL_RATIO = 3.0
"""Prompt tokens per output token: at this ratio verification costs compute early, and EAGLE-3
K=5 has less capacity than no speculation at max-num-seqs (the physics prior says so)."""


def settings(
    objective: str = "latency",
    windows: int = 1,
    restart_s: float = 60.0,
    rollout_share: float = 1.0,
) -> TunerSettings:
    """Only the last of `windows` windows may switch (the dwell holds the earlier ones)."""
    return TunerSettings(
        restart_downtime_s=restart_s,
        rollout_share=rollout_share,
        candidates=CANDIDATES,
        objective=objective,  # type: ignore[arg-type]
        synthesize_schedules=False,
        min_dwell_s=60.0 * windows - 30.0,
        restart_budget_per_hour=100,
        exploration=0.0,
    )


def window(config: SpecConfig, batch: float, waiting: float = 0.0) -> Observation:
    """What the physics prior predicts `config` serves at `batch`: the world is exactly the
    prior, so every difference below is the objective's."""
    prediction = Surrogate(COST, PRIORS, prefill_ratio=PREFILL_RATIO).prior(config, batch, CONTEXT)
    curve = PRIORS.get(config.method)
    return Observation(
        engine="vllm",
        window_s=60.0,
        pods=("p",),
        acceptance_length=curve.expected_length(prediction.k) if curve else None,
        acceptance_rate=None,
        acceptance_per_position=None,
        running_requests=batch,
        waiting_requests=waiting,
        kv_cache_usage=None,
        generation_tokens_per_s=prediction.tokens_per_s,
        prompt_tokens_per_s=prediction.tokens_per_s * PREFILL_RATIO,
        tpot_p50_s=None,
        tpot_p95_s=None,
        ttft_p95_s=None,
    )


def run(
    objective: str,
    config: SpecConfig,
    batches: list[float],
    waiting: float = 0.0,
    restart_s: float = 60.0,
    rollout_share: float = 1.0,
):
    """Tick through windows at these batches from `config` (six steady windows first, so the
    traffic's prompt share is learned); the last one decides, with `waiting` queued."""
    batches = [batches[0]] * 6 + batches
    chosen = settings(
        objective, windows=len(batches), restart_s=restart_s, rollout_share=rollout_share
    )
    # as if the tuner had just moved to `config`: its dwell holds the windows before the last
    state = replace(TunerState.initial(config, 0.0, PRIORS), restarts=(0.0,))
    decision = None
    for i, batch in enumerate(batches):
        last = i == len(batches) - 1
        decision, state = decide(
            window(config, batch, waiting if last else 0.0), state, chosen, COST, 60.0 * (i + 1)
        )
        if decision.action != "stay" and not last:
            pytest.fail(f"switched before the deciding window: {decision.reason}")
    assert decision is not None
    return decision


def test_the_steady_batch_serves_the_demand() -> None:
    surrogate = Surrogate(COST, PRIORS)
    curves = load_curves(CANDIDATES, surrogate, CONTEXT, settings())
    unit = overload_unit(curves)
    demand = throughput_at(curves[0], 32.0)
    for config, curve in zip(CANDIDATES, curves, strict=True):
        score = latency_score(config, curve, demand, demand, 0.0, unit)
        assert not score.overloaded
        # Little's law: the batch it settles at serves exactly the demand
        assert throughput_at(curve, score.batch) == pytest.approx(demand, rel=1e-6)
    no_spec, eagle = (
        latency_score(c, curve, demand, demand, 0.0, unit)
        for c, curve in zip(CANDIDATES, curves, strict=True)
    )
    # EAGLE-3 finishes requests sooner: it holds fewer at once, at a lower per-token latency
    assert eagle.batch < 32.0 < no_spec.batch * 1.001
    assert eagle.tpot_s < no_spec.tpot_s


def test_a_config_short_of_the_demand_ahead_is_overloaded_and_priced_by_capacity() -> None:
    surrogate = Surrogate(COST, PRIORS, prefill_ratio=PREFILL_RATIO)
    curves = load_curves(CANDIDATES, surrogate, CONTEXT, settings())
    unit = overload_unit(curves)
    no_spec_capacity = max(p.tokens_per_s for _, p in curves[0])
    eagle_capacity = max(p.tokens_per_s for _, p in curves[1])
    assert eagle_capacity < no_spec_capacity  # the physics: verification costs compute at peak
    between = (eagle_capacity + no_spec_capacity) / 2
    low = 0.1 * eagle_capacity
    no_spec, eagle = (
        latency_score(c, curve, low, between, 0.0, unit)
        for c, curve in zip(CANDIDATES, curves, strict=True)
    )
    assert eagle.overloaded and not no_spec.overloaded
    assert eagle.latency_s > no_spec.latency_s
    beyond = 2 * no_spec_capacity
    no_spec, eagle = (
        latency_score(c, curve, low, beyond, 0.0, unit)
        for c, curve in zip(CANDIDATES, curves, strict=True)
    )
    # both fall short: the one with more capacity drains the queue sooner
    assert eagle.overloaded and no_spec.overloaded
    assert no_spec.latency_s < eagle.latency_s


def test_queued_requests_raise_the_demand_and_a_saturating_forecast_reaches_capacity() -> None:
    assert offered_demand(1000.0, 100.0, 0.0) == 1000.0
    assert offered_demand(1000.0, 100.0, 50.0) == pytest.approx(1500.0)
    curves = load_curves([NO_SPEC], Surrogate(COST, PRIORS), CONTEXT, settings())
    limit = batch_limit(CONTEXT, settings())
    demand = throughput_at(curves[0], 40.0)
    assert demand_ahead(demand, curves[0], 40.0, None, limit) == demand
    assert demand_ahead(demand, curves[0], 40.0, 20.0, limit) == demand  # falling: today's
    rising = demand_ahead(demand, curves[0], 40.0, 80.0, limit)
    assert rising == pytest.approx(throughput_at(curves[0], 80.0), rel=1e-6)
    capacity = max(p.tokens_per_s for _, p in curves[0])
    saturating = demand_ahead(demand, curves[0], 40.0, limit, limit)
    assert saturating == pytest.approx(BEYOND_SATURATION * capacity)


def test_at_low_load_latency_picks_speculation() -> None:
    decision = run("latency", NO_SPEC, [4.0])
    assert decision.action == "switch" and decision.config.method == "eagle3", decision.reason
    assert "ms/token" in decision.reason
    # the gain the loop checks after the switch is per-sequence speed, as predicted
    assert 0.3 < decision.predicted_gain < 3.0 and decision.speed_checked


def test_a_config_whose_capacity_is_below_the_forecast_load_is_not_chosen_at_peak() -> None:
    # the load doubles every window: heading to max-num-seqs
    rising = [4.0, 8.0, 16.0, 32.0]
    assert run("latency", NO_SPEC, [32.0] * 4).config == EAGLE  # faster if the load held
    latency = run("latency", NO_SPEC, rising)
    assert latency.action == "stay", latency.reason


def test_a_rollout_one_pod_at_a_time_enters_only_what_the_pods_left_serving_hold() -> None:
    # while a rollout replaces the replicas, those still up carry the load: a config must hold
    # it over that share (2 replicas, one at a time: twice the load), not just with the margin
    assert run("latency", NO_SPEC, [24.0] * 4).config == EAGLE
    held = run("latency", NO_SPEC, [24.0] * 4, rollout_share=0.5)
    assert held.action == "stay", held.reason
    assert run("latency", NO_SPEC, [12.0] * 4, rollout_share=0.5).config == EAGLE
    # the capacity margin on the replicas left serving: 1.2x the load on half of them
    assert settings(rollout_share=0.5).entry_margin() == pytest.approx(1.4)
    assert settings(rollout_share=0.9).entry_margin() == pytest.approx(1.2 / 0.9 - 1)
    # one replica (none left serving): the downtime is the restart's price, not a margin
    assert settings(rollout_share=0.0).entry_margin() == settings().capacity_margin


def test_a_stay_names_the_faster_config_its_capacity_rules_out() -> None:
    # half the pods left serving in a rollout: EAGLE-3 serves batch 24 faster per token, but
    # its capacity is short of the load ahead with a 140% margin (the test above)
    held = run("latency", NO_SPEC, [24.0] * 4, rollout_share=0.5)
    assert held.action == "stay", held.reason
    assert "eagle3 K=5 would serve" in held.reason, held.reason
    assert "140% margin" in held.reason, held.reason
    assert "not yet run on the main replicas" in held.reason, held.reason
    figures = re.search(
        r"at ([\d.]+) ms/token vs ([\d.]+) now, but its capacity, (\d+) tok/s \((\d+) "
        r"predicted.*short of the (\d+) the load ahead needs with a 140% margin \((\d+) "
        r"without\)",
        held.reason,
    )
    assert figures is not None, held.reason
    faster, now, sure, predicted, need, load = (float(g) for g in figures.groups())
    assert faster * (1 + settings().hysteresis) < now
    assert sure < predicted and sure < need == pytest.approx(load * 2.4, abs=1.0)
    # nothing faster ruled out: the running config is predicted best, and the reason says so
    light = run("latency", EAGLE, [4.0] * 4)
    assert light.action == "stay" and "is predicted best" in light.reason, light.reason


def test_a_config_that_could_not_carry_a_recent_peak_is_not_entered() -> None:
    # bursty traffic comes back to its peaks: at batch 24 EAGLE-3 is entered after a steady
    # load, not two windows after no speculation ran at max-num-seqs with a queue
    chosen = settings("latency", windows=8)

    def last_decision(batches: list[float], waiting: list[float]) -> Decision:
        state = replace(TunerState.initial(NO_SPEC, 0.0, PRIORS), restarts=(0.0,))
        for i, (batch, queued) in enumerate(zip(batches, waiting, strict=True)):
            decision, state = decide(
                window(NO_SPEC, batch, queued), state, chosen, COST, 60.0 * (i + 1)
            )
        return decision

    calm = last_decision([24.0] * 8, [0.0] * 8)
    assert calm.config == EAGLE, calm.reason
    peak = float(settings().max_batch)
    after_peak = last_decision([24.0] * 5 + [peak, 24.0, 24.0], [0.0] * 5 + [400.0, 0.0, 0.0])
    assert after_peak.action == "stay", after_peak.reason


def test_the_remembered_peak_halves_every_half_life() -> None:
    state = TunerState.initial(NO_SPEC, 0.0, PRIORS).remember_demand(1000.0, 60.0, 600.0)
    assert state.demand_peak == 1000.0
    for _ in range(10):  # ten windows of 60 s: one half-life
        state = state.remember_demand(100.0, 60.0, 600.0)
    assert state.demand_peak == pytest.approx(500.0)
    assert state.remember_demand(900.0, 60.0, 600.0).demand_peak == 900.0
    assert TunerState.from_json(state.to_json()).demand_peak == state.demand_peak


def test_without_a_spare_gpu_a_canary_waits_until_the_pods_left_carry_the_load() -> None:
    # the canary's start stops one replica as a rollout does: at 60% of the running config's
    # capacity two replicas one at a time cannot spare one, ten can, and a surge always can
    curves = load_curves(CANDIDATES, Surrogate(COST, PRIORS), CONTEXT, settings())
    unit = overload_unit(curves)
    demand = 0.6 * backlog_point(curves[0])[1].tokens_per_s

    def short(share: float) -> bool:
        chosen = settings(rollout_share=share)
        return short_in_the_canary_start(NO_SPEC, curves[0], demand, demand, unit, chosen)

    assert short(0.5)
    assert not short(0.9) and not short(1.0)


def test_no_canary_trial_is_made_while_requests_wait() -> None:
    # under a queue a canary would measure the backlog, not the config, and its start takes
    # a replica from the drain: the same window without the queue is worth a trial
    belief, _ = _belief_at(TunerState.initial(NO_SPEC, 0.0, PRIORS), 48.0, eagle_sd=0.15)
    on_a_canary = replace(settings(), exploration=1.0, trial_share=0.25)
    _, calm, _ = propose_for_latency(belief, CANDIDATES, on_a_canary, waiting=0.0)
    assert calm is not None and calm.trial and calm.config == EAGLE, calm
    _, queued, _ = propose_for_latency(belief, CANDIDATES, on_a_canary, waiting=5.0)
    assert queued is None, queued


def test_an_overloaded_speculative_config_is_left_for_more_capacity() -> None:
    batch = float(settings().max_batch)
    # a fast restart: under overload a slow one adds its downtime to the queue, which a few
    # percent more capacity takes longer than the dwell to drain
    decision = run("latency", EAGLE, [batch, batch, batch], waiting=400.0, restart_s=5.0)
    assert decision.action == "off", decision.reason
    assert decision.reason.startswith("capacity short of the load ahead")
    assert not decision.speed_checked  # a queue grows the batch whatever runs
    # predicted per-sequence speed at full batch: no speculation is faster there
    assert decision.predicted_gain > 0
    assert math.isfinite(decision.predicted_gain)


def test_a_config_slower_at_its_batch_limit_than_at_its_best_is_read_at_the_limit() -> None:
    # Bistable: best at batch 64, slower past it. A demand between what it serves at the limit
    # and its best would hold a steady batch below 64 until a burst pushed it past, and then
    # the queue grows on its own: at the peak it is overloaded.
    curve = load_curves([EAGLE], Surrogate(COST, PRIORS), CONTEXT, settings())[0]
    peak = max(p.tokens_per_s for _, p in curve)
    bent = [
        (b, replace(p, tokens_per_s=peak * min(1.0, b / 64.0) * (64.0 / max(b, 64.0)) ** 0.5))
        for b, p in curve
    ]
    limit_b, at_limit = bent[-1]
    best = max(p.tokens_per_s for _, p in bent)
    assert at_limit.tokens_per_s < 0.7 * best
    assert backlog_point(bent) == (limit_b, at_limit)
    unit = overload_unit([bent])
    between = (at_limit.tokens_per_s + best) / 2
    score = latency_score(EAGLE, bent, 0.1 * between, between, 0.0, unit)
    assert score.overloaded and score.capacity == at_limit.tokens_per_s
    assert score.batch == limit_b
    # A curve rising to its limit is read at its limit, as before.
    assert backlog_point(curve) == curve[-1]


def test_a_batch_far_above_the_steady_one_reads_as_an_engine_behind_its_demand() -> None:
    curve = load_curves([NO_SPEC], Surrogate(COST, PRIORS), CONTEXT, settings())[0]
    demand = throughput_at(curve, 32.0)
    assert not behind(40.0, curve, demand)  # about the batch that serves the demand
    assert behind(BACKLOG_BATCH_RATIO * 32.0 * 1.1, curve, demand)
    small = throughput_at(curve, 4.0)
    assert not behind(BACKLOG_MIN_BATCH * 0.9, curve, small)  # too few to tell a backlog
    # At batch 32 EAGLE-3 would be faster if the load held (the test above); the same
    # tokens/s served at three times the batch is a backlog: no move to less capacity.
    chosen = settings("latency", windows=7)
    state = replace(TunerState.initial(NO_SPEC, 0.0, PRIORS), restarts=(0.0,))
    steady = window(NO_SPEC, 32.0)
    for i in range(6):
        _, state = decide(steady, state, chosen, COST, 60.0 * (i + 1))
    backlog = replace(steady, running_requests=96.0)
    held, _ = decide(backlog, state, chosen, COST, 420.0)
    assert held.action == "stay", held.reason
    moved, _ = decide(steady, state, chosen, COST, 420.0)
    assert moved.config == EAGLE, moved.reason


def test_throughput_keeps_todays_behaviour() -> None:
    chosen = replace(settings("throughput"))
    assert chosen.objective == "throughput"
    decision = run("throughput", NO_SPEC, [4.0])
    assert decision.config.method == "eagle3"
    assert "tok/s predicted" in decision.reason


def test_a_move_for_capacity_off_speculation_trusts_the_baseline() -> None:
    """Overloaded on EAGLE-3 at max-num-seqs, with no speculation predicted about 2% more
    capacity, less than its one-sd spread: it is taken whether it ran (a measured correction)
    or not. No speculation is the roofline's own baseline: what a world hides from its prior
    (compute, overheads) it hides from every config alike, and the speculative path's share
    (acceptance, drafting, verification) is what the one-sd doubt is for. Started on EAGLE-3
    K=3 in world 4 of the Poisson sweep at 0.9, doubting it kept EAGLE-3 for the whole trace
    with thousands of requests queued."""
    residuals = (ResidualPoint(EAGLE, 8, 0.0, 8.0), ResidualPoint(NO_SPEC, 6, -0.1, 8.0))
    surrogate = Surrogate(COST, PRIORS, residuals=residuals, prefill_ratio=PREFILL_RATIO)
    running, other = surrogate.predict_many([EAGLE, NO_SPEC], 256.0, CONTEXT)
    assert 1.0 < other.tokens_per_s / running.tokens_per_s < math.exp(other.uncertainty)
    chosen = replace(settings(), synthesize_schedules=False)
    ran = replace(TunerState.initial(EAGLE, 0.0, PRIORS), residuals=residuals)
    belief = Belief(
        state=ran,
        batch=256.0,
        throughput=running.tokens_per_s,
        context=CONTEXT,
        acceptance=PRIORS,
        surrogate=surrogate,
    )
    _, proposal, _ = propose_for_latency(belief, CANDIDATES, chosen, waiting=100.0)
    assert proposal is not None and proposal.config == NO_SPEC and proposal.for_capacity
    never_ran = replace(ran, residuals=residuals[:1])
    unmeasured = replace(belief, state=never_ran)
    _, baseline, _ = propose_for_latency(unmeasured, CANDIDATES, chosen, 100.0)
    assert baseline is not None and baseline.config == NO_SPEC and baseline.for_capacity


def started_on(
    config: SpecConfig,
    residuals: tuple[ResidualPoint, ...],
    surrogate: Surrogate,
    batch: float,
    throughput: float,
) -> Belief:
    """A deployment started on `config`, which measured `residuals` and serves `throughput`
    at `batch`; nothing else has run."""
    return Belief(
        state=replace(TunerState.initial(config, 0.0, PRIORS), residuals=residuals),
        batch=batch,
        throughput=throughput,
        context=CONTEXT,
        acceptance=PRIORS,
        surrogate=surrogate,
    )


def test_a_speculative_config_measured_slow_under_a_queue_is_left_for_no_speculation() -> None:
    """Started on EAGLE-3 K=3, never on no speculation, with a queue at max-num-seqs: the
    prior gives EAGLE-3 a little more capacity than no speculation, and EAGLE-3 served 25%
    less than its prior. That may be the hardware (then no speculation is as slow) or its own
    drafter and verification (then it is not): no speculation is read slow by a share only,
    and its capacity is then enough more to leave for. Read slow by all of it, as before, it
    stayed about 3% short of EAGLE-3 and the queue grew for the whole trace (world 2 of the
    Poisson sweep at 0.9)."""
    eagle = SpecConfig(method="eagle3", num_speculative_tokens=3, draft_model="d")
    limit = 256.0
    prior = Surrogate(COST, PRIORS, prefill_ratio=1.0)
    running_prior, plain_prior = prior.predict_many([eagle, NO_SPEC], limit, CONTEXT)
    assert plain_prior.tokens_per_s < running_prior.tokens_per_s  # the prior keeps EAGLE-3
    residuals = (ResidualPoint(eagle, 8, math.log(0.75), 4.0),)
    surrogate = Surrogate(COST, PRIORS, residuals=residuals, prefill_ratio=1.0)
    running, plain = surrogate.predict_many([eagle, NO_SPEC], limit, CONTEXT)
    assert running.tokens_per_s == pytest.approx(0.75 * running_prior.tokens_per_s, rel=0.03)
    assert plain.tokens_per_s > 1.05 * running.tokens_per_s
    belief = started_on(eagle, residuals, surrogate, limit, running.tokens_per_s)
    chosen = replace(settings(), candidates=(NO_SPEC, eagle))
    _, proposal, _ = propose_for_latency(belief, chosen.candidates, chosen, waiting=400.0)
    assert proposal is not None and proposal.config == NO_SPEC and proposal.for_capacity
    assert proposal.gain > chosen.saturation_tolerance, proposal


def test_under_a_queue_no_speculation_that_never_ran_is_read_one_sd_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Started on EAGLE-3 K=3, never on no speculation, with a queue at max-num-seqs:
    EAGLE-3 served 5% under its prior, and no speculation is predicted about as much capacity
    at the mean (within its spread). Read at the mean it stays; read one sd up, as an
    overload asks (a window on the baseline measures it, a window more on a config short of
    the load grows the queue), it is left for."""
    eagle = SpecConfig(method="eagle3", num_speculative_tokens=3, draft_model="d")
    limit = 256.0
    residuals = (ResidualPoint(eagle, 8, math.log(0.95), 4.0),)
    surrogate = Surrogate(COST, PRIORS, residuals=residuals, prefill_ratio=1.0)
    running, plain = surrogate.predict_many([eagle, NO_SPEC], limit, CONTEXT)
    assert (
        plain.tokens_per_s < running.tokens_per_s < plain.tokens_per_s * math.exp(plain.uncertainty)
    )
    belief = started_on(eagle, residuals, surrogate, limit, running.tokens_per_s)
    chosen = replace(settings(), candidates=(NO_SPEC, eagle))
    _, proposal, _ = propose_for_latency(belief, chosen.candidates, chosen, waiting=400.0)
    assert proposal is not None and proposal.config == NO_SPEC and proposal.for_capacity
    at_the_mean = latency_proposal.capacity_caution

    def mean_for_the_baseline(config: SpecConfig, *args: object) -> float:
        return at_the_mean(config, *args) if config.speculative else 0.0  # type: ignore[arg-type]

    monkeypatch.setattr(latency_proposal, "capacity_caution", mean_for_the_baseline)
    _, stays, _ = propose_for_latency(belief, chosen.candidates, chosen, waiting=400.0)
    assert stays is None, stays


def test_a_move_for_speed_to_no_speculation_that_never_ran_reads_it_one_sd_slower(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Started on EAGLE-3 K=3, which served 30% under its prior at batch 64: no speculation,
    never run, is read slow by half of that and predicted faster per token, by less than its
    spread. At the mean it would be left for; one sd slower it is not. A move for capacity is
    not doubted (the test above)."""
    eagle = SpecConfig(method="eagle3", num_speculative_tokens=3, draft_model="d")
    residuals = (ResidualPoint(eagle, 6, math.log(0.7), 4.0),)
    surrogate = Surrogate(COST, PRIORS, residuals=residuals, prefill_ratio=PREFILL_RATIO)
    belief = started_on(
        eagle, residuals, surrogate, 64.0, surrogate.predict(eagle, 64.0, CONTEXT).tokens_per_s
    )
    chosen = replace(settings(), candidates=(NO_SPEC, eagle))
    _, doubted, why = propose_for_latency(belief, chosen.candidates, chosen, waiting=0.0)
    assert doubted is None, doubted
    # the stay says what was passed over and why, not "predicted best"
    assert why is not None and why.startswith("no speculation would serve"), why
    assert "never ran here, and read one sd slower" in why
    monkeypatch.setattr(latency_proposal, "read_unproven", lambda score, *_: score)
    _, at_the_mean, _ = propose_for_latency(belief, chosen.candidates, chosen, waiting=0.0)
    assert at_the_mean is not None and at_the_mean.config == NO_SPEC
    assert not at_the_mean.for_capacity and at_the_mean.gain > chosen.hysteresis


def _belief_at(
    state: TunerState,
    batch: float,
    priors: dict[str, AcceptanceCurve] = PRIORS,
    eagle_sd: float = 0.0,
) -> tuple[Belief, float]:
    """No speculation serving exactly its prior at `batch`, and the demand that is; EAGLE-3's
    acceptance known to `eagle_sd`."""
    surrogate = Surrogate(
        COST, priors, prefill_ratio=PREFILL_RATIO, acceptance_sd={"eagle3": eagle_sd}
    )
    demand = surrogate.predict(NO_SPEC, batch, CONTEXT).tokens_per_s
    belief = Belief(
        state=state,
        batch=batch,
        throughput=demand,
        context=CONTEXT,
        acceptance=priors,
        surrogate=surrogate,
    )
    return belief, demand


def test_leaving_a_method_for_capacity_records_what_it_served() -> None:
    batch, waiting = float(settings().max_batch), 400.0
    windows = [batch] * 9
    chosen = settings("latency", windows=len(windows), restart_s=5.0)
    state = replace(TunerState.initial(EAGLE, 0.0, PRIORS), restarts=(0.0,))
    decision = None
    for i, b in enumerate(windows):
        queued = waiting if i == len(windows) - 1 else 0.0
        decision, state = decide(window(EAGLE, b, queued), state, chosen, COST, 60.0 * (i + 1))
    assert decision is not None and decision.action == "off", decision
    served = window(EAGLE, batch).generation_tokens_per_s
    assert served is not None
    ((method, demand, baseline),) = state.capacity_exits
    assert method == "eagle3"
    # under a queue what it served is its capacity; the demand it was offered is more
    assert demand == pytest.approx(served, rel=1e-6)
    assert offered_demand(served, batch, waiting) > 2 * demand
    # no speculation's capacity, read in the same window, is kept beside it
    assert baseline > demand
    read = TunerState.from_json(state.to_json()).capacity_exits
    assert read == ((method, pytest.approx(demand, abs=0.1), pytest.approx(baseline, abs=0.1)),)
    # a state written before the field existed reads as no exits, and one written before the
    # baseline was kept as exits held to their figure
    old = json.loads(state.to_json())
    old["capacity_exits"] = [[m, d] for m, d, _ in old["capacity_exits"]]
    older = TunerState.from_json(json.dumps(old))
    assert older.capacity_exits == (("eagle3", pytest.approx(demand, abs=0.1), 0.0),)
    held = older.capacity_exits[0][1]
    assert exit_ceilings(older.capacity_exits, 2 * baseline) == {"eagle3": held}
    del old["capacity_exits"]
    assert TunerState.from_json(json.dumps(old)).capacity_exits == ()


def test_a_method_left_for_capacity_is_held_to_what_it_served_until_it_serves_more() -> None:
    chosen = replace(settings(), synthesize_schedules=False)
    fresh = TunerState.initial(NO_SPEC, 0.0, PRIORS)
    belief, demand = _belief_at(fresh, 32.0)
    _, free, _ = propose_for_latency(belief, CANDIDATES, chosen, waiting=0.0)
    assert free is not None and free.config == EAGLE  # the prior says it keeps up
    left = fresh.left_for_capacity("eagle3", demand)
    _, held, _ = propose_for_latency(replace(belief, state=left), CANDIDATES, chosen, waiting=0.0)
    assert held is None or held.config != EAGLE
    # well below what it served (the capacity margin to spare): it may return
    lower, low_demand = _belief_at(left, 8.0)
    assert low_demand * (1 + chosen.capacity_margin) < demand
    _, back, _ = propose_for_latency(lower, CANDIDATES, chosen, waiting=0.0)
    assert back is not None and back.config == EAGLE
    # serving more than that lifts the ceiling; other configs do not
    assert left.served(NO_SPEC, 3 * demand).capacity_exits == left.capacity_exits
    assert left.served(EAGLE, 0.5 * demand) == left
    lifted = left.served(EAGLE, 2 * demand)
    assert lifted.capacity_exits == (("eagle3", 2 * demand, 0.0),)
    _, again, _ = propose_for_latency(replace(belief, state=lifted), CANDIDATES, chosen, 0.0)
    assert again is not None and again.config == EAGLE


def test_a_method_held_to_what_it_showed_is_carried_by_no_speculations_capacity() -> None:
    """EAGLE-3 left for capacity at `demand`, where no speculation's capacity read `then`: held
    to that figure while no speculation reads what it read then; where no speculation reads
    twice what it did (a lighter context than at the exit), EAGLE-3 is held to twice as much
    and may return; where it reads half, to half."""
    chosen = replace(settings(), synthesize_schedules=False)
    fresh = TunerState.initial(NO_SPEC, 0.0, PRIORS)
    belief, demand = _belief_at(fresh, 32.0)
    curves = dict(
        zip(CANDIDATES, load_curves(CANDIDATES, belief.surrogate, CONTEXT, chosen), strict=True)
    )
    today = plain_capacity(curves)
    assert today is not None and today > demand

    def proposed(baseline_then: float) -> SpecConfig | None:
        left = fresh.left_for_capacity("eagle3", demand, baseline_then)
        _, proposal, _ = propose_for_latency(replace(belief, state=left), CANDIDATES, chosen, 0.0)
        return None if proposal is None else proposal.config

    assert proposed(today) != EAGLE
    assert proposed(today / 2) == EAGLE
    assert exit_ceilings((("eagle3", demand, today),), today) == {"eagle3": demand}
    assert exit_ceilings((("eagle3", demand, today),), today / 2) == {"eagle3": demand / 2}
    # no speculation not in the space, or an exit from an older state: the figure alone
    assert exit_ceilings((("eagle3", demand, today),), None) == {"eagle3": demand}
    assert exit_ceilings((("eagle3", demand, 0.0),), today) == {"eagle3": demand}


def test_a_config_short_only_of_its_capacity_margin_is_priced_as_overloaded() -> None:
    """Capacity above the peak but below peak x (1 + margin): overloaded, priced below no
    config that keeps up, and ranked by capacity among such configs."""
    surrogate = Surrogate(COST, PRIORS, prefill_ratio=PREFILL_RATIO)
    curves = load_curves(CANDIDATES, surrogate, CONTEXT, settings())
    unit = overload_unit(curves)
    eagle_capacity = max(p.tokens_per_s for _, p in curves[1])
    margin = 0.2
    scores = [
        latency_score(EAGLE, curves[1], peak, peak, margin, unit)
        for peak in (eagle_capacity / 1.15, eagle_capacity / 1.05, eagle_capacity * 1.05)
    ]
    assert all(s.overloaded for s in scores)
    slowest_keeping_up = max(p.tpot_s for curve in curves for _, p in curve)
    assert all(s.latency_s >= OVERLOAD_PENALTY * slowest_keeping_up * 0.8 for s in scores)
    # the closer the peak comes to its capacity, the worse it is priced
    assert scores[0].latency_s < scores[1].latency_s < scores[2].latency_s
    assert overload_factor(1.0) == 1.0
    assert overload_factor(1.1) == pytest.approx(1.0 + QUEUE_GROWTH * 0.1)


def test_a_config_that_never_ran_enters_only_if_its_capacity_one_sd_down_has_the_margin() -> None:
    surrogate = Surrogate(COST, PRIORS, prefill_ratio=PREFILL_RATIO, acceptance_sd={"eagle3": 0.05})
    curves = load_curves(CANDIDATES, surrogate, CONTEXT, settings())
    unit = overload_unit(curves)
    top = max((p for _, p in curves[1]), key=lambda p: p.tokens_per_s)
    assert top.uncertainty > 0.01
    margin = 0.2
    # between the capacity one sd down and the mean, over the margin
    peak = top.tokens_per_s * (1 + math.exp(-top.uncertainty)) / 2 / (1 + margin)
    sure = latency_score(EAGLE, curves[1], peak, peak, margin, unit, caution_sd=1.0)
    measured = latency_score(EAGLE, curves[1], peak, peak, margin, unit)
    assert sure.overloaded and not measured.overloaded
    assert sure.capacity == measured.capacity == top.tokens_per_s
    # half an sd down enters where the capacity half an sd down clears the margin, not below
    half_down = top.tokens_per_s * math.exp(-0.5 * top.uncertainty) / (1 + margin)
    for load, overloaded in ((half_down * 0.99, False), (half_down * 1.01, True)):
        half = latency_score(EAGLE, curves[1], load, load, margin, unit, caution_sd=0.5)
        assert half.overloaded is overloaded


def test_a_canary_is_judged_with_its_capacity_one_sd_down() -> None:
    # the canary measured EAGLE-3 exactly at the physics prior, at half the main replicas'
    # batch: near capacity the judge must be as sure of it as of a config that never ran
    # (`TunerSettings.unproven`), so it promotes at fewer loads than a reading at the mean
    chosen = replace(settings(), min_dwell_s=0.0)
    state = TunerState.initial(NO_SPEC, 0.0, PRIORS)
    promoted, at_the_mean = [], []
    for batch in (8.0, *(float(b) for b in range(32, 97, 4)), 256.0):
        main, canary = window(NO_SPEC, batch), window(EAGLE, batch / 2)
        verdict = judge_trial(main, canary, EAGLE, state, chosen, COST, 1000.0)
        promoted.append(verdict.rejection is None)
        learned, _ = learn_trial(canary, EAGLE, state, chosen, COST, 1000.0)
        decision, _ = decide(main, learned, chosen, COST, 1000.0)
        at_the_mean.append(decision.config == EAGLE)
    assert promoted[0] and not promoted[-1]  # light load: EAGLE-3; at max-num-seqs: not
    assert all(mean for sure, mean in zip(promoted, at_the_mean, strict=True) if sure)
    assert sum(at_the_mean) > sum(promoted), (promoted, at_the_mean)


def _decisions(config: SpecConfig, batches: list[float]) -> list[Decision]:
    """Every decision over windows at these batches from `config`, the dwell over from the
    first (six steady windows first, so the traffic's prompt share is learned)."""
    chosen = replace(settings(), min_dwell_s=0.0)
    state = replace(TunerState.initial(config, 0.0, PRIORS), restarts=(0.0,))
    decisions = []
    for i, batch in enumerate([batches[0]] * 6 + batches):
        decision, state = decide(window(config, batch), state, chosen, COST, 60.0 * (i + 1))
        decisions.append(decision)
        if decision.action != "stay":
            break
    return decisions[6:]


def test_a_step_in_the_load_is_not_left_for_as_a_ramp_but_a_ramp_is() -> None:
    # a ramp toward max-num-seqs: the second window that forecasts EAGLE-3 short of it, the
    # batch still rising with the trend, leaves it before the queue builds
    ramp = _decisions(EAGLE, [4.0, 8.0, 16.0, 32.0])
    assert [d.action for d in ramp] == ["stay", "stay", "stay", "off"], [d.reason for d in ramp]
    assert ramp[-1].reason.startswith("capacity short of the load ahead")
    assert ramp[-2].reason.startswith(f"{EAGLE.describe()} keeps up with the load seen")
    # a step to a new phase (a closed-loop client going from 4 to 32 streams) moves once and
    # holds: EAGLE-3 carries 32 (the same load steady picks it), and no window leaves it
    step = _decisions(EAGLE, [4.0, 4.0, 32.0, 32.0, 32.0, 32.0])
    assert [d.action for d in step] == ["stay"] * 6, [d.reason for d in step]
    assert "keeps up with the load seen" in step[2].reason
    # with a queue the shortfall is seen, not forecast: no second window is waited for
    assert run("latency", EAGLE, [4.0, 4.0, 32.0], waiting=400.0, restart_s=5.0).action == "off"


def test_the_trend_holds_while_the_last_window_moves_with_it() -> None:
    assert trend_holds([4.0, 8.0, 16.0])
    assert trend_holds([8.0, 12.0, 16.0])  # linear: the last step is smaller, the same way
    assert not trend_holds([4.0, 32.0, 32.0])  # a step, then flat
    assert not trend_holds([0.83, 4.23, 5.0])  # the real vLLM run's step, then noise
    assert trend_holds([16.0, 8.0, 4.0])  # falling
    assert not trend_holds([16.0, 16.0])  # too few windows to tell a trend
    assert not trend_holds([8.0, 8.0, 8.0])


def test_a_forecast_shortfall_survives_a_restart_of_the_operator() -> None:
    state = replace(TunerState.initial(EAGLE, 0.0, PRIORS), forecast_shortfall=True)
    assert TunerState.from_json(state.to_json()).forecast_shortfall
    old = json.loads(state.to_json())
    del old["forecast_shortfall"]  # a state written before the field existed
    assert not TunerState.from_json(json.dumps(old)).forecast_shortfall


def test_a_method_left_under_a_queue_is_held_to_the_most_it_served_since_it_started() -> None:
    """EAGLE-3 served its prior at max-num-seqs for eight windows, then a queue formed and it
    served a fifth less (longer contexts, a slower mix): it is left for capacity, held to what
    it served at best, not to the slow exit window. Held to the exit window's figure, EAGLE-3
    never came back after Azure's peak in world 3 (`decision.exit_ceiling`)."""
    batch = float(settings().max_batch)
    chosen = settings("latency", windows=9, restart_s=5.0)
    state = replace(TunerState.initial(EAGLE, 0.0, PRIORS), restarts=(0.0,))
    best = window(EAGLE, batch).generation_tokens_per_s
    assert best is not None
    decision = None
    for i in range(9):
        observed = window(EAGLE, batch)
        if i == 8:
            observed = replace(observed, waiting_requests=400.0, generation_tokens_per_s=0.8 * best)
        decision, state = decide(observed, state, chosen, COST, 60.0 * (i + 1))
    assert decision is not None and decision.action == "off", decision
    ((method, ceiling, _),) = state.capacity_exits
    assert (method, ceiling) == ("eagle3", pytest.approx(best, rel=1e-6))
    # the switch starts the next config's count
    assert state.served_peak == 0.0
    assert TunerState.from_json(state.to_json()).served_peak == 0.0


def test_a_method_left_for_the_load_ahead_while_keeping_up_is_held_to_its_read_capacity() -> None:
    """EAGLE-3 keeps up with today's demand (no queue, its steady batch) but not with the
    recent peak: left for capacity, what it served is only today's load, and the ceiling is
    the capacity the tuner read for it. Under a queue the proposal carries no such figure."""
    batch = 8.0
    surrogate = Surrogate(COST, PRIORS, prefill_ratio=PREFILL_RATIO)
    served = surrogate.predict(EAGLE, batch, CONTEXT).tokens_per_s
    belief = started_on(EAGLE, (), surrogate, batch, served)
    capacity = backlog_point(load_curves([EAGLE], surrogate, CONTEXT, settings())[0])[1]
    peaked = replace(belief, state=replace(belief.state, demand_peak=2 * capacity.tokens_per_s))
    _, proposal, _ = propose_for_latency(peaked, CANDIDATES, settings(), waiting=0.0)
    assert proposal is not None and proposal.config == NO_SPEC and proposal.for_capacity
    assert proposal.running_capacity == pytest.approx(capacity.tokens_per_s, rel=1e-6)
    assert proposal.running_capacity > 1.5 * served
    assert exit_ceiling(proposal, served) == proposal.running_capacity
    _, queued, _ = propose_for_latency(peaked, CANDIDATES, settings(), waiting=400.0)
    assert queued is not None and queued.for_capacity and queued.running_capacity is None
    assert exit_ceiling(queued, served) == served


def test_of_configs_as_fast_for_users_a_near_tie_goes_to_the_one_with_most_headroom() -> None:
    """At batch 2 EAGLE-3 K=5 and its synthesised schedule run K=5 alike and serve the load
    equally fast; the schedule drops K at larger batches and so carries more. With `near_tie`
    at 0 the strict fastest is taken; by default the one the next step up of the load does
    not catch."""
    chosen = replace(settings(), synthesize_schedules=True)
    surrogate = Surrogate(COST, PRIORS, prefill_ratio=PREFILL_RATIO)
    batch = 2.0
    served = surrogate.predict(NO_SPEC, batch, CONTEXT).tokens_per_s
    belief = started_on(NO_SPEC, (), surrogate, batch, served)
    _, fastest, _ = propose(belief, replace(chosen, near_tie=0.0), COST)
    _, safest, _ = propose(belief, chosen, COST)
    assert fastest is not None and safest is not None
    assert fastest.config == EAGLE, fastest.config.describe()
    assert safest.config.method == "eagle3" and safest.config.schedule is not None
    assert safest.config.num_speculative_tokens == EAGLE.num_speculative_tokens
    assert safest.prediction.tokens_per_s >= 0.99 * fastest.prediction.tokens_per_s
    assert safest.headroom > fastest.headroom
    # a config far faster is not given up for headroom
    _, wide, _ = propose(belief, replace(chosen, synthesize_schedules=False), COST)
    assert wide is not None and wide.config == EAGLE


def test_a_never_run_speculative_config_is_taken_for_speed_at_the_mean() -> None:
    """A speculative config that never ran is predicted 28% faster per token on its prior
    alone (acceptance sd 0.5): it is taken at the mean, not read one sd slower as a never-run
    no speculation is, and the reason does not say it was doubted."""
    priors = {"eagle3": AcceptanceCurve(0.5, 0.9)}
    state = TunerState.initial(NO_SPEC, 0.0, priors)
    belief, _ = _belief_at(state, 2.0, priors, eagle_sd=0.5)
    chosen = settings()
    _, at_the_mean, _ = propose_for_latency(belief, chosen.candidates, chosen, waiting=0.0)
    assert at_the_mean is not None and at_the_mean.config == EAGLE
    assert chosen.hysteresis < at_the_mean.gain < 0.5
    assert at_the_mean.detail is not None and "read one sd slower" not in at_the_mean.detail
