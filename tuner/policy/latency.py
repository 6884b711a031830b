"""The latency objective: which config makes users wait least at the load the traffic brings.

Contract: `load_curves(space, surrogate, context, settings)` reads each config's predictions
along a batch grid; `latency_score(config, curve, demand, peak_demand, margin)` predicts the
per-token latency its users would see once the engine settles at the offered demand (output
tokens/s), and whether its capacity keeps up with the peak demand ahead: a `LatencyScore`
(steady batch, per-token latency, capacity, overload). `rate` turns a score into the tokens/s
units the policy's gate prices restarts in: the tokens/s served scaled by how much faster tokens
come than at the reference latency (the running config's rate is what it serves). Pure.

Why steady batch and not the current batch: a config that generates faster finishes requests
sooner, so at the same arrival rate it holds fewer of them at once and each step is cheaper. By
Little's law the batch b a config settles at under demand D satisfies D = b / TPOT(b), which is
the surrogate's throughput at b. Comparing configs at the batch the running one happens to hold
overstates the slow config's batch.

Why capacity dominates: a config whose throughput under a backlog (at max-num-seqs, or at the
KV limit; see `backlog_point`) falls below the demand builds a queue that grows for as long as
the demand lasts; every request waits behind it. No per-token gain at low load pays for that,
so such a config's latency is priced as the slowest per-token latency of any config times
`OVERLOAD_PENALTY`, growing with the shortfall it would face (`QUEUE_GROWTH`): among configs
that all fall short, the one with the most capacity wins, by the queue it saves.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from specpilot.tuner._model.surrogate import Prediction, Surrogate
from specpilot.tuner.policy.settings import TunerSettings
from specpilot.tuner.spec_config import SpecConfig

QUEUED_REQUESTS = 0.5
"""Mean waiting requests above which the served rate understates the demand."""
OVERLOAD_PENALTY = 10.0
"""How much worse than the slowest per-token latency an overloaded config is priced at the
least overload: a queue's wait soon dwarfs any per-token difference."""
QUEUE_GROWTH = 10.0
"""How fast that price grows with the shortfall (peak demand over capacity, less one): the
queue grows at demand minus capacity, so at 1.3x demand a config 4% short of another adds
about 13% more queue, not the 4% a ratio of capacities says."""
GRID_POINTS = 13
"""Batches (geometric, 1 to the most the engine can hold) each config's curve is read at."""


@dataclass(frozen=True, slots=True)
class LatencyScore:
    config: SpecConfig
    batch: float
    """The mean batch the config settles at under the demand (max-num-seqs when overloaded)."""
    tpot_s: float
    """Predicted per-token latency at that batch (its full-batch one when overloaded)."""
    capacity: float
    """Predicted output tokens/s it sustains under a backlog (see `backlog_point`)."""
    overloaded: bool
    latency_s: float
    """Per-token latency as the objective prices it (the overload penalty included)."""
    uncertainty: float
    """Std of the log prediction there (the surrogate's)."""


def batch_limit(context: float, settings: TunerSettings) -> float:
    """The most requests the engine can run at once: max-num-seqs, or fewer when the KV cache
    cannot hold that many contexts."""
    limit = float(settings.max_batch)
    if settings.kv_capacity_tokens and context > 0:
        limit = min(limit, max(1.0, settings.kv_capacity_tokens / context))
    return limit


def batch_grid(limit: float) -> list[float]:
    return [limit ** (i / (GRID_POINTS - 1)) for i in range(GRID_POINTS)]


Curve = list[tuple[float, Prediction]]
"""One config's predictions along the batch grid, (batch, prediction) in batch order."""


def load_curves(
    space: Sequence[SpecConfig], surrogate: Surrogate, context: float, settings: TunerSettings
) -> list[Curve]:
    """Each config's predictions along the batch grid (one GP pass per grid batch)."""
    grid = batch_grid(batch_limit(context, settings))
    by_batch = [surrogate.predict_many(space, b, context) for b in grid]
    return [
        [(b, predictions[i]) for b, predictions in zip(grid, by_batch, strict=True)]
        for i in range(len(space))
    ]


def throughput_at(curve: Curve, batch: float) -> float:
    """The curve's tokens/s at `batch`, interpolated log-log (clamped to the grid)."""
    previous_b, previous = curve[0]
    if batch <= previous_b:
        return previous.tokens_per_s * max(batch, 1e-3) / previous_b
    for b, prediction in curve[1:]:
        if batch <= b:
            share = math.log(batch / previous_b) / math.log(b / previous_b)
            return math.exp(
                math.log(previous.tokens_per_s)
                + share * math.log(prediction.tokens_per_s / previous.tokens_per_s)
            )
        previous_b, previous = b, prediction
    return previous.tokens_per_s


def overload_unit(curves: Sequence[Curve]) -> float:
    """The slowest per-token latency any config shows along the grid: an overloaded config is
    priced in multiples of it, so that any config that keeps up beats every one that does not,
    and among those that do not, the one with the most capacity wins."""
    return max(p.tpot_s for curve in curves for _, p in curve)


def offered_demand(throughput: float, batch: float, waiting: float) -> float:
    """Output tokens/s the traffic asks for. With a queue, the served rate is the running
    config's capacity, not the demand: the queued requests ask for their share on top
    (each as much as a running one)."""
    if waiting > QUEUED_REQUESTS and batch > 0:
        return throughput * (1.0 + waiting / batch)
    return throughput


def latency_score(
    config: SpecConfig,
    curve: Curve,
    demand: float,
    peak_demand: float,
    margin: float,
    unit_s: float,
    caution_sd: float = 0.0,
    ceiling: float | None = None,
) -> LatencyScore:
    """`config`'s steady per-token latency at `demand`; overloaded when its capacity is below
    peak_demand x (1 + margin), and then priced at `unit_s` x OVERLOAD_PENALTY x (1 +
    QUEUE_GROWTH x the shortfall) (see `overload_unit`, `overload_factor`). `caution_sd`
    (`latency_proposal.capacity_caution`: for a speculative config that never ran) reads
    the capacity that many sds down, to enter and to price an overload: at the batch its
    capacity is read at, the prior can be well above the truth (a costly speculative path, a
    slow drafter), and a move there must be sure of it.
    `ceiling` caps the capacity at what was seen (what the config served when it was left for
    capacity)."""
    top_batch, top = backlog_point(curve)
    # The mean for a config that ran, not a pessimistic bound: far from any measured batch the
    # surrogate's spread is wide, and a bound would keep speculation off wherever the load is
    # not tiny; the margin and the hysteresis carry the caution. Entering a config that never
    # ran on the prior alone brought EAGLE-3 near its capacity and back in hidden worlds
    # (bench/results/yardstick-*: in world 4 of the Poisson sweep at 0.7, 1.33x no
    # speculation's mean E2E).
    capacity = top.tokens_per_s if ceiling is None else min(top.tokens_per_s, ceiling)
    sure = capacity * math.exp(-caution_sd * top.uncertainty) if caution_sd else capacity
    peak = max(demand, peak_demand)
    if sure < peak * (1.0 + margin):
        # priced without the margin: among configs that all fall short, capacity alone ranks
        overload = peak / sure if sure > 0 else math.inf
        return LatencyScore(
            config=config,
            batch=top_batch,
            tpot_s=top.tpot_s,
            capacity=capacity,
            overloaded=True,
            latency_s=unit_s * OVERLOAD_PENALTY * overload_factor(overload),
            uncertainty=top.uncertainty,
        )
    batch, tpot, uncertainty = _steady(curve, demand)
    return LatencyScore(
        config=config,
        batch=batch,
        tpot_s=tpot,
        capacity=capacity,
        overloaded=False,
        latency_s=tpot,
        uncertainty=uncertainty,
    )


def backlog_point(curve: Curve) -> tuple[float, Prediction]:
    """Where the config serves a backlog: the batch past its best throughput at which that
    throughput is least (the batch limit, unless the curve turns up again). A config whose
    throughput falls past its best is bistable: a burst that takes it past the best batch
    leaves it slower, so the queue grows on its own; what it sustains is the least it serves
    beyond that batch, not its best."""
    best = max(range(len(curve)), key=lambda i: curve[i][1].tokens_per_s)
    return min(curve[best:], key=lambda point: point[1].tokens_per_s)


def overload_factor(overload: float) -> float:
    """The overload price's multiple at `overload` (peak demand over capacity): 1 +
    QUEUE_GROWTH x the shortfall above 1; below 1 (short only of the capacity margin) the
    overload itself, so that the price stays at least most of OVERLOAD_PENALTY and still ranks
    by capacity: the shortfall's formula would turn negative there, and price such a config
    as faster than any that keeps up."""
    return max(overload, 1.0 + QUEUE_GROWTH * (overload - 1.0))


def steady_batch(curve: Curve, demand: float) -> float:
    """The batch a config settles at under `demand` (the grid's largest when it cannot)."""
    return _steady(curve, demand)[0]


def steady_tpot(curve: Curve, demand: float) -> float:
    """The per-token latency a config serves `demand` at, once settled (see `steady_batch`)."""
    return _steady(curve, demand)[1]


def _steady(curve: Curve, demand: float) -> tuple[float, float, float]:
    """The batch where the config's throughput meets the demand, and its per-token latency
    there, interpolated log-log between the grid's points (below the first point the engine
    idles part of the time at batch 1: its per-token latency is batch 1's)."""
    previous_b, previous = curve[0]
    if previous.tokens_per_s >= demand:
        return max(demand * previous.tpot_s, 1e-3), previous.tpot_s, previous.uncertainty
    for b, prediction in curve[1:]:
        if prediction.tokens_per_s >= demand:
            low, high = math.log(previous.tokens_per_s), math.log(prediction.tokens_per_s)
            share = (math.log(max(demand, 1e-9)) - low) / (high - low) if high > low else 1.0
            batch = math.exp(math.log(previous_b) + share * math.log(b / previous_b))
            tpot = math.exp(
                math.log(previous.tpot_s) + share * math.log(prediction.tpot_s / previous.tpot_s)
            )
            return batch, tpot, prediction.uncertainty
        previous_b, previous = b, prediction
    return previous_b, previous.tpot_s, previous.uncertainty


def rate(score: LatencyScore, served: float, reference_tpot_s: float) -> float:
    """The score in tokens/s units: the tokens/s served, scaled by the latency gain over the
    reference."""
    return served * reference_tpot_s / score.latency_s
