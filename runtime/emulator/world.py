"""Hidden worlds: the emulator's truth, drawn per seed around what the tuner is told.

Contract: `draw_world(seed)` returns a frozen `World` drawn with `random.Random(seed)` only (the
same seed gives the same world on every machine); world seed 0 is the nominal world, whose truth
IS the priors and the catalog (every factor exactly 1). A world answers what the emulator needs:
`acceptance_curve(method, task)` (pass the bound method as `EngineCore(acceptance=...)`),
`step_cost(gpu, profile)` (the emulator's `performance`), `start_time_s(nominal_s)` (how long an
engine takes to load) and `describe()` (the hidden parameters, for result files). The tuner
never sees a World: it keeps the priors (`specpilot.tuner.priors`) and the nominal catalog
(`StepCost.for_hardware`), as it would on a user's cluster, and has to measure the rest.

What is drawn, and why each range (REFERENCE.md sections 2, 4 and 5; a range that no published
number pins down is a judgment and says so). Factors whose range is symmetric about 1 are drawn
uniformly; the others multiply a time or a rate with an uncertainty that is a ratio, so they are
drawn log-uniformly (x0.5 as likely as x2).
- Acceptance, per method x task, independently: x0.65-1.35 (uniform) on the mean ACCEPTED tokens
  per draft (the bonus token excluded) at the method's reference K (its anchored K: 3, or the
  DFlash block, 15), turned back into the chain's p with `p_for_length` at the prior's decay r
  (the length is clamped to what K can give, so a near-perfect prior cannot scale past p = 1).
  Why accepted tokens and not the length with its bonus token: the bonus token comes with every
  verify, whatever the drafter; scaling it too would let x0.65 push EAGLE-3 chat to 1.8, which
  REFERENCE 5 calls broken, and n-gram math below 1 token. Why +-35%: measurements of the same
  kind of drafter on Llama-3.1-8B disagree by that much: EAGLE K=3 accepts 1.25-1.38 tokens on
  four benchmarks while vLLM's EAGLE-3 accepts 1.79 on MT-bench at K=3 (0.70-0.77x); a healthy
  EAGLE-3 chat length is 2.5-3.5 (REFERENCE 5), accepted 1.5-2.5 around the prior's 1.79
  (0.84-1.40x).
- Compute efficiency: x0.6-1.1 of the achieved FLOP/s (log-uniform). The nominal is the H100
  fit's 77% of the 989 TFLOP/s datasheet peak (SpecDecode-Bench's 21 us/token, REFERENCE 4);
  x1.1 is 85%, about the best dense bf16 GEMMs reach; x0.6 is 46%, for kernels that do not reach
  the fit (attention at long contexts, unfused ops, another engine version). A judgment.
- Memory bandwidth: x0.7-1.0 of the datasheet's HBM bandwidth (log-uniform). The nominal fit
  puts weight streaming at the full 3.35 TB/s and books the rest of its 5.9 ms as overhead;
  decode GEMVs commonly achieve 70-90% of peak. The range is a judgment; nothing in REFERENCE
  measures it.
- Per-step overhead (scheduling, sampling, launches): x0.7-2.0 (log-uniform). The nominal is the
  H100 fit's intercept less weight streaming (1.1 ms, vLLM); SGLang on B200 measured ~3.9 ms
  (tuner/_model/hardware.py), so engines and hosts differ by more than 2x; the range stays
  narrower around the anchor's own engine. A judgment.
- Spec-path overhead: x0.5-2.0 (log-uniform) of SPEC_PATH_OVERHEAD_POINTS' fractions (+6.6% at
  batch 2, +21.6% at 189, vLLM issue 49548: one config, one GPU). PIECEWISE CUDA graphs alone
  cost about 14% single-stream (REFERENCE 2), so +3.3% (x0.5) is an engine that avoids most of
  it and +43% (x2) one that pays it twice. A judgment around one measurement.
- Drafter cost: x0.7-1.5 (log-uniform) of the modelled drafting time (roofline passes plus a
  20 us launch overhead fitted to EAGLE-3's 373 tok/s, REFERENCE 5). Drafters carry sampling,
  tree bookkeeping and their own KV that the roofline omits (above 1) and can be fused or
  overlapped (below 1). A judgment.
- Engine start time: x0.5-3 (log-uniform) of a nominal start/restart downtime (the caller's;
  the emulator's default is 7.5 s per billion parameters). Weights from a local page cache and a
  warm compile cache start fast; a cold pull from network storage plus torch.compile and CUDA
  graph capture take minutes. A judgment.

Together these move the concurrency where EAGLE-3 K=3 stops paying on H100 x Llama-3.1-8B (chat,
closed loop): REFERENCE 4's roofline arithmetic puts it near 70, the nominal world at ~140; over
world seeds 0..19 it runs from ~50 to beyond 512 (bench/worlds.py, bench/results/worlds.md; over
seeds 0..99: 10th percentile ~86, median ~127, 90th ~310, 7 in 100 still paying at 512).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import random
from dataclasses import dataclass
from typing import Any

from specpilot.tuner import (
    AcceptanceCurve,
    ConfigError,
    StepCost,
    StepTimeModel,
    acceptance_curve,
    p_for_length,
)
from specpilot.tuner.priors import DFLASH_BLOCK_K, TASKS, acceptance_table

NOMINAL_SEED = 0
REFERENCE_K = 3
"""The K at which acceptance is scaled (the K the chain priors are anchored at), except DFlash,
which is anchored at its block (DFLASH_BLOCK_K)."""

ACCEPTANCE_RANGE = (0.65, 1.35)
COMPUTE_EFFICIENCY_RANGE = (0.6, 1.1)
BANDWIDTH_RANGE = (0.7, 1.0)
STEP_OVERHEAD_RANGE = (0.7, 2.0)
SPEC_PATH_OVERHEAD_RANGE = (0.5, 2.0)
DRAFTER_COST_RANGE = (0.7, 1.5)
START_TIME_RANGE = (0.5, 3.0)

FACTOR_RANGES: dict[str, tuple[float, float]] = {
    "compute_efficiency": COMPUTE_EFFICIENCY_RANGE,
    "bandwidth": BANDWIDTH_RANGE,
    "step_overhead": STEP_OVERHEAD_RANGE,
    "spec_path_overhead": SPEC_PATH_OVERHEAD_RANGE,
    "drafter_cost": DRAFTER_COST_RANGE,
    "start_time": START_TIME_RANGE,
}
"""The hardware and engine factors, in the order they are drawn (all log-uniform)."""


def reference_k(method: str) -> int:
    """The K at which `method`'s acceptance is scaled: where its prior is anchored."""
    return DFLASH_BLOCK_K if method == "dflash" else REFERENCE_K


@dataclass(frozen=True, slots=True, kw_only=True)
class World:
    """One hidden truth: multiplicative factors on the priors and the catalog (1 = nominal)."""

    seed: int
    acceptance: tuple[tuple[str, str, float], ...] = ()
    """(method, task, factor on the mean accepted tokens at the reference K); absent = 1."""
    compute_efficiency: float = 1.0
    """Factor on the achieved FLOP/s (the catalog's peak x the anchor fit's efficiency)."""
    bandwidth: float = 1.0
    """Factor on the catalog's HBM bandwidth (weights, KV reads, drafter weights)."""
    step_overhead: float = 1.0
    """Factor on the per-step overhead (the fixed part of a step)."""
    spec_path_overhead: float = 1.0
    """Factor on the spec-decode path's overhead fractions."""
    drafter_cost: float = 1.0
    """Factor on the drafting time."""
    start_time: float = 1.0
    """Factor on an engine's start (and restart) time."""

    @property
    def nominal(self) -> bool:
        """Whether this world's truth is exactly the priors and the catalog."""
        hardware = (getattr(self, name) for name in FACTOR_RANGES)
        return all(f == 1.0 for f in hardware) and all(f == 1.0 for *_, f in self.acceptance)

    def acceptance_factor(self, method: str, task: str) -> float:
        for m, t, factor in self.acceptance:
            if (m, t) == (method, task):
                return factor
        return 1.0

    def acceptance_curve(self, method: str, task: str) -> AcceptanceCurve:
        """The true acceptance of `method` on `task` in this world (an unknown method or task
        is the prior's ConfigError)."""
        prior = acceptance_curve(method, task)
        factor = self.acceptance_factor(method, task)
        if factor == 1.0:
            return prior
        return _scaled_curve(prior, reference_k(method), factor)

    def step_cost(self, gpu: str, profile: str) -> StepCost:
        """The true step times of `gpu` x `profile` in this world: the catalog's roofline with
        this world's compute, bandwidth and overhead, spec path and drafter factors."""
        catalog = StepCost.for_hardware(gpu, profile)
        if all(getattr(self, name) == 1.0 for name in FACTOR_RANGES if name != "start_time"):
            return catalog
        nominal = catalog.step_model
        hidden_gpu = dataclasses.replace(
            catalog.gpu,
            peak_flops=catalog.gpu.peak_flops * self.compute_efficiency,
            bandwidth=catalog.gpu.bandwidth * self.bandwidth,
            step_overhead_s=nominal.fixed_s * self.step_overhead,
        )
        truth = StepTimeModel.roofline(hidden_gpu, catalog.profile)
        return StepCost(
            step_model=dataclasses.replace(truth, source=f"{nominal.source}, world {self.seed}"),
            profile=catalog.profile,
            gpu=hidden_gpu,
            spec_path_scale=self.spec_path_overhead,
            draft_cost_scale=self.drafter_cost,
        )

    def start_time_s(self, nominal_s: float) -> float:
        """Seconds an engine takes to start in this world, given the nominal start time."""
        return nominal_s * self.start_time

    def describe(self) -> dict[str, Any]:
        """The hidden parameters, for result files (never for the tuner)."""
        acceptance: dict[str, dict[str, dict[str, float]]] = {}
        for method, task, factor in self.acceptance:
            k = reference_k(method)
            prior = acceptance_curve(method, task)
            truth = self.acceptance_curve(method, task)
            acceptance.setdefault(method, {})[task] = {
                "factor": round(factor, 4),
                "reference_k": k,
                "prior_length": round(prior.expected_length(k), 4),
                "length": round(truth.expected_length(k), 4),
                "prior_p": round(prior.p, 4),
                "p": round(truth.p, 4),
                "r": truth.r,
            }
        return {
            "world_seed": self.seed,
            "nominal": self.nominal,
            **{name: round(getattr(self, name), 4) for name in FACTOR_RANGES},
            "acceptance": acceptance,
        }


@functools.lru_cache(maxsize=4096)
def _scaled_curve(prior: AcceptanceCurve, k: int, factor: float) -> AcceptanceCurve:
    accepted = prior.expected_accepted(k) * factor
    return AcceptanceCurve(p_for_length(1.0 + accepted, k, prior.r), prior.r)


def _log_uniform(rng: random.Random, low: float, high: float) -> float:
    return math.exp(rng.uniform(math.log(low), math.log(high)))


def draw_world(seed: int) -> World:
    """The world of `seed`: seed 0 is nominal; any other seed draws every factor (acceptance
    per method x task in the table's order, then FACTOR_RANGES in order) from Random(seed)."""
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ConfigError("world_seed", seed, "an integer >= 0 (0: the nominal world)")
    if seed == NOMINAL_SEED:
        return World(seed=seed)
    rng = random.Random(seed)
    low, high = ACCEPTANCE_RANGE
    acceptance = tuple(
        (method, task, rng.uniform(low, high)) for method in acceptance_table() for task in TASKS
    )
    factor = {name: _log_uniform(rng, *bounds) for name, bounds in FACTOR_RANGES.items()}
    return World(
        seed=seed,
        acceptance=acceptance,
        compute_efficiency=factor["compute_efficiency"],
        bandwidth=factor["bandwidth"],
        step_overhead=factor["step_overhead"],
        spec_path_overhead=factor["spec_path_overhead"],
        drafter_cost=factor["drafter_cost"],
        start_time=factor["start_time"],
    )
