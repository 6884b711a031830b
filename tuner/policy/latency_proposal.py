"""Propose under the latency objective: the config users wait least on, at the load ahead.

Contract: `propose_for_latency(belief, space, settings, waiting)` reads the offered demand
(output tokens/s served, plus the queue's share when requests wait), the demand ahead (the batch
forecast read through the running config's curve; at max-num-seqs, beyond the running config's
capacity; when the measured batch is far above the running config's steady batch, beyond what it
serves: `behind`; never below the recent peak, `TunerState.demand_peak`), and scores every
config of the space with `latency.latency_score`, a method the tuner left for capacity held to
what it showed then, carried to today's conditions by no speculation's capacity
(`exit_ceilings`), a config that never ran read with the doubt
`capacity_caution` gives its capacity, no speculation that never ran read one sd slower per
token for a move made for speed (`read_unproven`), and takes the fastest for users (with
`TunerSettings.near_tie`, of those nearly as fast, the one with the most headroom:
`fastest_or_safest`). On a canary, no trial is made
under a queue (the running config overloaded, or requests waiting) or while the replicas a
canary's start leaves could not carry the load ahead (`short_in_the_canary_start`). A move for
capacity the running config lacks only at the forecast load, not at any load seen, is marked
`on_forecast`. It returns the running config's prediction, a `Proposal` in the objective's units
(tokens/s served, scaled by the per-token latency gain; see `latency.rate`) or None, and with
None, why a config that would serve the demand faster per token was passed over (`passed_over`:
its capacity short of the load ahead; `doubted_over`: never run, and not faster read one sd
slower), or None. The proposal's `speed_gain` is the per-sequence
speed gain at the window's batch, without the overload price: what the control loop checks after
a switch, when the batch has not moved much. Pure.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from specpilot.tuner._model.surrogate import Prediction
from specpilot.tuner.policy.latency import (
    QUEUED_REQUESTS,
    Curve,
    LatencyScore,
    backlog_point,
    batch_limit,
    latency_score,
    load_curves,
    offered_demand,
    overload_unit,
    rate,
    steady_batch,
    steady_tpot,
    throughput_at,
)
from specpilot.tuner.policy.learn import Belief
from specpilot.tuner.policy.plan import forecast_batch
from specpilot.tuner.policy.proposal import Proposal, explore, outweighs, trial_proposal
from specpilot.tuner.policy.settings import TunerSettings
from specpilot.tuner.spec_config import SpecConfig

SATURATION = 0.9
"""A forecast batch at this share of the batch limit means the running config saturates."""
BACKLOG_BATCH_RATIO = 1.5
"""A measured batch this many times the running config's predicted steady batch (at the
demand it serves) says the engine is behind its demand: a backlog draining, or a model that
overrates the running config where it runs. Either way the served rate is its capacity, not
the demand."""
BACKLOG_MIN_BATCH = 8.0
"""Below this measured batch a ratio says more about one window's arrivals than a backlog."""
BEYOND_SATURATION = 1.25
"""The demand a saturating forecast stands for, over the running config's capacity: the
batch forecast stops at the limit, the demand behind it does not, and a tie with the running
config's capacity would keep it however short it falls."""


def behind(batch: float, running: Curve, demand: float) -> bool:
    """Whether the measured batch is far above the running config's predicted steady batch at
    the demand it serves (`BACKLOG_BATCH_RATIO`): the engine is behind its demand."""
    if batch < BACKLOG_MIN_BATCH:
        return False
    return batch > BACKLOG_BATCH_RATIO * steady_batch(running, demand)


def demand_ahead(
    demand: float, running: Curve, batch: float, forecast: float | None, limit: float
) -> float:
    """The demand the load is heading to, at least today's: the forecast batch read through
    the running config's throughput curve; a forecast at the batch limit means the running
    config saturates, so the demand is beyond its capacity (BEYOND_SATURATION)."""
    if forecast is None or batch <= 0:
        return demand
    ahead = demand * throughput_at(running, forecast) / throughput_at(running, batch)
    if forecast >= SATURATION * limit:
        ahead = max(ahead, BEYOND_SATURATION * max(p.tokens_per_s for _, p in running))
    return max(demand, ahead)


def propose_for_latency(
    belief: Belief, space: Sequence[SpecConfig], settings: TunerSettings, waiting: float
) -> tuple[Prediction, Proposal | None, str | None]:
    state, surrogate, batch, context = belief.state, belief.surrogate, belief.batch, belief.context
    current = state.current
    configs = list(dict.fromkeys([*space, current]))
    curves = dict(zip(configs, load_curves(configs, surrogate, context, settings), strict=True))
    demand = offered_demand(belief.throughput, batch, waiting)
    forecast = forecast_batch(state.recent_batches, settings)
    peak = demand_ahead(demand, curves[current], batch, forecast, batch_limit(context, settings))
    # Bursty traffic comes back to its peaks within a dwell (Azure at peak 1.2, 4 replicas one
    # at a time, world 6: a canary of EAGLE-3 two windows after a queue of 260, promoted, met
    # the next peak mid-rollout; 1.48x no speculation's mean E2E)
    seen = max(demand, state.demand_peak)
    if behind(belief.batch, curves[current], demand):
        # the demand is at least what the running config serves flat out: only more capacity
        # helps, and a move to less would build the queue it is draining
        seen = max(seen, BEYOND_SATURATION * demand)
    peak = max(peak, seen)
    unit = overload_unit(list(curves.values()))
    # A move for capacity alone must be sure of it where the capacity is the physics prior's
    # guess for a speculative path; a config that ran here has a measured correction instead,
    # and no speculation is the roofline's own baseline (what a world hides from the prior, it
    # hides from every config alike).
    ran = {r.config for r in state.residuals} - set(settings.unproven)
    baseline = plain_capacity(curves)
    ceilings = exit_ceilings(state.capacity_exits, baseline)
    running_score = latency_score(current, curves[current], demand, peak, 0.0, unit)
    # Hysteresis on capacity: a config is entered only with the margin to spare, and left only
    # once the load ahead overloads it; else a load near the margin flips it every dwell.
    scores = {
        c: running_score
        if c == current
        else latency_score(
            c,
            curve,
            demand,
            peak,
            settings.entry_margin(),
            unit,
            caution_sd=capacity_caution(c, ran, running_score, settings),
            ceiling=ceilings.get(c.method),
        )
        for c, curve in curves.items()
    }
    candidates = _within_slo(scores, settings)
    reference = running_score.latency_s
    at_batch = dict(zip(configs, surrogate.predict_many(configs, batch, context), strict=True))
    now = at_batch[current]
    # In the gate's units: tokens/s served, scaled by each config's latency gain (a restart
    # loses what is served, not what is asked for)
    served = belief.throughput
    running = replace(now, tokens_per_s=served, uncertainty=running_score.uncertainty)
    read = {c: read_unproven(scores[c], current, ran, running_score) for c in candidates}
    ranked = [(c, _as_prediction(read[c], curves[c], served, reference)) for c in candidates]
    best_config, best = fastest_or_safest(ranked, scores, peak, settings.near_tie)
    detail = _detail(scores[best_config], running_score, demand, peak)
    if read[best_config] is not scores[best_config]:
        detail += "; read one sd slower per token: never run here"
    if settings.trial_share < 1.0:
        # On a canary a trial is how a config that never ran shows its capacity: it is valued
        # at the mean prediction (no caution, no margin), its risk bounded by the canary's
        # share of the traffic; committing to it still takes the cautious score above.
        trial_scores = {
            c: latency_score(
                c, curves[c], demand, peak, 0.0, unit,
                ceiling=None if c == current else ceilings.get(c.method),
            )
            for c in candidates
        }  # fmt: skip
        valued = [
            (c, _as_prediction(trial_scores[c], curves[c], served, reference)) for c in candidates
        ]
        # Under a queue a canary measures the backlog, not the config: its share of a queue
        # is served at the queue's batch, and its start takes a replica from the drain (Azure
        # at peak 1.2, 4 replicas with surge: worst world 1.186x no speculation's mean E2E at
        # e3d01c5, one trial made under 1328 waiting requests; 1.049x without them, c2aa949)
        under_a_queue = running_score.overloaded or waiting > QUEUED_REQUESTS
        trial = (
            None
            if under_a_queue
            or short_in_the_canary_start(current, curves[current], demand, peak, unit, settings)
            else explore(valued, current, running, settings)
        )
    else:
        trial = explore(ranked, current, running, settings)
    # Behind today's demand, what the running config serves is its capacity; keeping up, it is
    # only the load, and what the tuner reads as its capacity is the better figure
    queued = (
        waiting > QUEUED_REQUESTS
        or behind(belief.batch, curves[current], demand)
        or latency_score(current, curves[current], demand, demand, 0.0, unit).overloaded
    )
    if best_config != current and not outweighs(trial, best.tokens_per_s - served):
        why = "predicted faster for users"
        if running_score.overloaded:
            why = "capacity short of the load ahead"
        return (
            running,
            Proposal(
                config=best_config,
                prediction=best,
                improvement=best.tokens_per_s - served,
                gain=best.tokens_per_s / served - 1.0,
                why=why,
                speed_gain=now.tpot_s / at_batch[best_config].tpot_s - 1.0,
                for_capacity=running_score.overloaded,
                on_forecast=running_score.overloaded
                and not latency_score(current, curves[current], demand, seen, 0.0, unit).overloaded,
                detail=detail,
                headroom=headroom(scores[best_config], peak),
                mean_headroom=headroom(scores[best_config], peak, sds_down=0.0),
                running_capacity=None if queued else running_score.capacity,
                baseline_capacity=baseline,
            ),
            None,
        )
    if trial is None:
        why_not = passed_over(scores, curves, current, demand, peak, settings, ran)
        return running, None, why_not or doubted_over(scores, read, current, demand, settings)
    config = trial[0]
    return (
        running,
        trial_proposal(
            trial,
            served,
            settings,
            speed_gain=now.tpot_s / at_batch[config].tpot_s - 1.0,
            detail=_detail(scores[config], running_score, demand, peak),
            for_capacity=running_score.overloaded,
            baseline_capacity=baseline,
        ),
        None,
    )


def plain_capacity(curves: dict[SpecConfig, Curve]) -> float | None:
    """No speculation's capacity as the tuner reads it in this window (None: not in the
    space): measured where it runs or ran, else the roofline's own baseline."""
    plain = next((c for c in curves if not c.speculative), None)
    return None if plain is None else backlog_point(curves[plain])[1].tokens_per_s


def exit_ceilings(
    exits: Sequence[tuple[str, float, float]], baseline: float | None
) -> dict[str, float]:
    """The capacity each method left for capacity is held to today (`TunerState.
    capacity_exits`): what it showed then, carried by no speculation's capacity read now over
    the one read then. Held to what it served alone until it serves more (under a queue that
    is its capacity, short of one the load it was left at), since the prior's capacity at a
    batch the method never ran at is a guess, and re-entering on that guess at the same load
    is how the policy flapped near capacity. Carried, since a figure read at one batch and
    context is not what the method serves at another: diurnal, started on EAGLE-3 K=3, world
    7, left EAGLE-3 at 840 s (read at 6165 tok/s, no speculation 7346), and came back "for
    capacity" at 1028 s under the evening peak, where no speculation served 5971 and EAGLE-3,
    held to 6165, looked the larger; it left again at 1395 s (1.313x no speculation's mean
    E2E, `yardstick-diurnal-vllm-surge-start-eagle3` at 36797df). Carried, EAGLE-3 reads
    6165 / 7346 x 5971 = 5011 there. An exit without a baseline (an older state) is held to
    its figure."""
    if baseline is None or baseline <= 0:
        return {method: shown for method, shown, _ in exits}
    return {method: shown * baseline / then if then > 0 else shown for method, shown, then in exits}


def fastest_or_safest(
    ranked: Sequence[tuple[SpecConfig, Prediction]],
    scores: dict[SpecConfig, LatencyScore],
    peak: float,
    near_tie: float,
) -> tuple[SpecConfig, Prediction]:
    """The fastest for users; with `near_tie` above 0, of the configs within that share of it,
    the one with the most headroom over the load ahead: equally fast today, it is the one the
    next step up of the load does not catch short."""
    fastest = max(ranked, key=lambda item: item[1].tokens_per_s)
    if near_tie <= 0.0:
        return fastest
    floor = fastest[1].tokens_per_s * (1.0 - near_tie)
    near = [item for item in ranked if item[1].tokens_per_s >= floor]
    return max(near, key=lambda item: headroom(scores[item[0]], peak))


OVERLOAD_ENTRY_CAUTION_SD = 1.0
"""The least sds down a never-run speculative config has its capacity read while the running
config is overloaded. A move for capacity into a config that proves short lengthens the queue
for a whole rollout, and a rollout under an overload is slow (each replaced replica holds its
GPU while it works off its backlog): at half an sd, Azure at peak 1.2 with 4 replicas (surge),
world 1 moved into EAGLE-3 K=3 read at 4282 tok/s against no speculation's 3704, the rollout
there and the one back took 818 s and 933 s, and the trace ended at 1.292x no speculation's
mean E2E, against 1.000 (`specpilot bench ... --replicas 4 --rollout surge --world-seed 1
--policies specpilot:caution-0.5`, at ae69c40)."""


def passed_over(
    scores: dict[SpecConfig, LatencyScore],
    curves: dict[SpecConfig, Curve],
    current: SpecConfig,
    demand: float,
    peak: float,
    settings: TunerSettings,
    ran: set[SpecConfig],
) -> str | None:
    """Why the running config stays although another would serve today's demand faster per
    token (by more than the hysteresis): that config's capacity, as the objective reads it,
    is short of the load ahead with the entry margin. None when no such config exists, or
    when the running config is itself overloaded (then the queue, not speed, decides)."""
    running = scores[current]
    if running.overloaded:
        return None
    faster = []
    for config, score in scores.items():
        if config == current or not score.overloaded:
            continue
        if max(p.tokens_per_s for _, p in curves[config]) < demand:
            continue  # it could not serve today's demand at any batch: no speed to pass over
        tpot = steady_tpot(curves[config], demand)
        if tpot * (1.0 + settings.hysteresis) < running.tpot_s:
            faster.append((tpot, config, score))
    if not faster:
        return None
    tpot, config, score = min(faster, key=lambda item: item[0])
    caution = settings.entry_caution_sd if config not in ran and config.speculative else 0.0
    sure = score.capacity * math.exp(-caution * score.uncertainty)
    read = f"{score.capacity:.0f} predicted"
    if caution:
        read += f", read {caution:g} sd down: not yet run on the main replicas"
    if score.capacity < backlog_point(curves[config])[1].tokens_per_s:
        read += ", capped at what it showed when it was left for capacity"
    margin = settings.entry_margin()
    return (
        f"{config.describe()} would serve the {demand:.0f} tok/s offered at "
        f"{tpot * 1e3:.1f} ms/token vs {running.tpot_s * 1e3:.1f} now, but its capacity, "
        f"{sure:.0f} tok/s ({read}), is short of the {max(demand, peak) * (1 + margin):.0f} "
        f"the load ahead needs with a {margin:.0%} margin ({max(demand, peak):.0f} without)"
    )


def capacity_caution(
    config: SpecConfig, ran: set[SpecConfig], running: LatencyScore, settings: TunerSettings
) -> float:
    """How many sds down a config other than the running one has its capacity read: a
    speculative config that never ran, `TunerSettings.entry_caution_sd` (its capacity is the
    prior's guess for a drafter and a verify path), and at least `OVERLOAD_ENTRY_CAUTION_SD`
    while the running config is overloaded; no speculation that never ran, one sd up while the
    running config is overloaded. Before it runs, the baseline's correction is half
    of what the speculative configs measured (`residual_gp.hardware_offset`), and where the
    speculative path is the slow part that half underrates it: started on EAGLE-3 in world 1
    of Azure at peak 1.2, the tuner read no speculation's capacity at 3078 tok/s against
    EAGLE-3's 3131 (it served 4270, EAGLE-3 3075-3860) and stayed two windows under a growing
    queue. Under an overload every window on the wrong config adds to the queue, and one
    window on the baseline measures it."""
    if config in ran:
        return 0.0
    if config.speculative:
        if running.overloaded:
            return max(settings.entry_caution_sd, OVERLOAD_ENTRY_CAUTION_SD)
        return settings.entry_caution_sd
    return -1.0 if running.overloaded else 0.0


def doubted_over(
    scores: dict[SpecConfig, LatencyScore],
    read: dict[SpecConfig, LatencyScore],
    current: SpecConfig,
    demand: float,
    settings: TunerSettings,
) -> str | None:
    """Why the running config stays although a config would serve today's demand faster per
    token at the mean, by more than the hysteresis: read one sd slower, as a no speculation
    that never ran is for a move made for speed (`read_unproven`), it is not faster. None
    when no such config exists."""
    running = scores[current]
    for config, score in scores.items():
        doubted = read.get(config, score)
        if doubted is score or score.latency_s * (1.0 + settings.hysteresis) >= running.latency_s:
            continue
        return (
            f"{config.describe()} would serve the {demand:.0f} tok/s offered at "
            f"{score.tpot_s * 1e3:.1f} ms/token vs {running.tpot_s * 1e3:.1f} now at the mean, "
            f"but it never ran here, and read one sd slower per token "
            f"({doubted.latency_s * 1e3:.1f} ms/token) it is not faster"
        )
    return None


def read_unproven(
    score: LatencyScore,
    current: SpecConfig,
    ran: set[SpecConfig],
    running: LatencyScore,
) -> LatencyScore:
    """No speculation, never run here, is scored one sd slower per token for a move made for
    speed (neither it nor the running config overloaded). Before it runs, its correction is
    half of what the speculative configs measured (`residual_gp.hardware_offset`), and in a
    world whose hardware is the slow part that half overrates it: started on EAGLE-3 in
    worlds 5 and 6 of the Poisson sweep at 0.7, the tuner left for it on +22% and +30%
    predicted and met 1.261x and 1.118x the best fixed policy's mean E2E; the moves that paid
    were predicted at +99% and more. A move for capacity still trusts the baseline. A
    speculative config that never ran is read at the mean: reading it the same way (a bench
    variant until stop 50 of issue 11) changed no yardstick world by more than 0.016 at 7f3afec."""
    config = score.config
    if config == current or config in ran or config.speculative:
        return score
    if score.overloaded or running.overloaded:
        return score
    return replace(score, latency_s=score.latency_s * math.exp(score.uncertainty))


def headroom(score: LatencyScore, peak: float, sds_down: float = 1.0) -> float:
    """The config's capacity `sds_down` sd down over the demand ahead."""
    return score.capacity * math.exp(-sds_down * score.uncertainty) / peak if peak > 0 else math.inf


def _within_slo(
    scores: dict[SpecConfig, LatencyScore], settings: TunerSettings
) -> list[SpecConfig]:
    """The configs predicted to meet the per-token SLO at their steady batch (all of them when
    none does: the fastest is kept, and the reason says so)."""
    slo = settings.slo_tpot_p95_s
    if slo is None:
        return list(scores)
    within = [c for c, s in scores.items() if not s.overloaded and s.tpot_s <= slo]
    return within or list(scores)


def _as_prediction(
    score: LatencyScore, curve: Curve, served: float, reference: float
) -> Prediction:
    """The grid point at (or just above) the steady batch, carrying the objective's rate."""
    point = next((p for b, p in curve if b >= score.batch), curve[-1][1])
    return replace(
        point,
        tokens_per_s=rate(score, served, reference),
        tpot_s=score.tpot_s,
        uncertainty=score.uncertainty,
    )


def _detail(target: LatencyScore, running: LatencyScore, demand: float, peak: float) -> str:
    def one(score: LatencyScore) -> str:
        state = "overloaded" if score.overloaded else f"batch {score.batch:.0f}"
        return f"{score.tpot_s * 1e3:.1f} ms/token ({state}, capacity {score.capacity:.0f} tok/s)"

    ahead = f", {peak:.0f} ahead" if peak > demand * 1.01 else ""
    return f"at {demand:.0f} tok/s offered{ahead}: {one(target)} vs {one(running)} now"


def short_in_the_canary_start(
    current: SpecConfig,
    curve: Curve,
    demand: float,
    peak: float,
    unit: float,
    settings: TunerSettings,
) -> bool:
    """Without a spare GPU (`rollout_share` below 1) a canary's start stops one replica, as a
    rollout does: the running config must carry the load ahead on the rest meanwhile, with
    the margin a config is entered with (`TunerSettings.entry_margin`)."""
    if not 0.0 < settings.rollout_share < 1.0:
        return False
    return latency_score(current, curve, demand, peak, settings.entry_margin(), unit).overloaded
