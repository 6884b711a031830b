"""The policies the bench compares, by name, and the offline-tuned K schedule.

Contract: `baselines(engine, cost)` returns the fixed policies of the space for an engine, each
a `StaticPolicy(name, config)`: `no-spec`, `static:<config>` for every config of the space the
engine runs, the engine's own baseline (`vllm-eagle3-table`: vLLM's documented EAGLE-3
per-batch table; `sglang-adaptive`: SGLang's default adaptive buckets starting at K=3) and
`tuned-schedule`. `SPECPILOT` and `HINDSIGHT` name the two policies that are not fixed configs:
the tuner through the control loop, and the hindsight reference (the best static config per
window, switched for free), which is computed from the statics' runs, not run itself.
`ABLATIONS` name SpecPilot with one component removed, or one added that is off by default
(`bench/ablations.py` runs them); `VARIANTS` name SpecPilot with one setting at another value
(`bench/entry_caution.py`); `HANDOVER` names the full tuner with its surges counted without
the spare GPU's drain; `TUNED` is all of them, by name.

`tuned_schedule(cost, method)` tunes a per-batch-size K table offline the way vLLM's
`benchmarks/sweep/tune_speculative_k.py` does: for each batch size of a grid, run every K
(0..max) several times at that concurrency, take the median tokens/s less its median absolute
deviation (a penalty for noisy K), keep the best K, and merge equal neighbours into
`[start, end, K]` tiers. It is measured once, on the nominal world (the one a user would tune
on), and then run unchanged in every world.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from functools import cache

from specpilot.runtime.emulator.fast_sweep import simulate
from specpilot.runtime.engines import get_adapter
from specpilot.tuner import SpecConfig, SpecMethod, StepCost

DRAFT = "emulated-eagle3-draft"
SPECPILOT = "specpilot"
ABLATIONS: dict[str, dict[str, object]] = {
    "specpilot:no-gp": {"residual_model": "offset"},
    "specpilot:moving-average": {"acceptance_model": "moving-average"},
    "specpilot:no-schedules": {"synthesize_schedules": False},
    "specpilot:averaged-prefill": {"lumpy_prefill": False},
    "specpilot:exploration": {"exploration": 1.0},
}
"""SpecPilot with one component removed, or one added that is off by default (`ADDED`), by
name: the TunerSettings each one overrides (averaged-prefill spreads the prefill over every
step instead of pricing it in lumps; exploration lets the tuner make trials, which it does
only where a trial runs on a canary: two replicas or more, or one with a surge rollout's
spare GPU for a canary beside it; with one replica and no spare GPU the control loop never
explores)."""
ADDED = frozenset({"specpilot:exploration"})
"""Ablations that add a component the default leaves off (trials: the operator's
`tuning.explore`, false unless set, after they paid for themselves in no 4-replica world)."""
VARIANTS: dict[str, dict[str, object]] = {
    "specpilot:caution-1": {"entry_caution_sd": 1.0},
    "specpilot:caution-0": {"entry_caution_sd": 0.0},
    "specpilot:strict-fastest": {"near_tie": 0.0},
}
"""SpecPilot with a default set otherwise, by name: what the default's value buys or costs
(caution: a never-run speculative config's capacity read one sd down, or at the mean, instead
of half an sd down; under an overload never less than one sd down, whatever the setting;
strict-fastest: the fastest for users, instead of the one with the most headroom over the
load ahead among the configs within 1% of it)."""
HANDOVER = "specpilot:handover"
"""The full tuner, its surges counted without the spare GPU's drain (`EmulatedDeployment`'s
`surge_handover`): a surge's stopped replica hands what it holds to its replacement instead of
finishing it on the spare GPU beside it. Under a queue that drain is a second GPU serving
through the pod's preStop sleep and drain after each switch (`PRE_STOP_SLEEP_S` + `DRAIN_S`),
a capacity the static configs, which never roll, do not get; this policy is SpecPilot's count
without it (identical to `specpilot` for the other rollouts). The bench runs it by default
with a surge."""
TUNED: dict[str, dict[str, object]] = {**ABLATIONS, **VARIANTS, HANDOVER: {}}
"""Every policy the tuner runs but the full tuner as counted by default: the TunerSettings each
overrides."""
HINDSIGHT = "hindsight"
NO_SPEC = "no-spec"
VLLM_EAGLE3_TABLE = SpecConfig(
    method="eagle3",
    num_speculative_tokens=5,
    draft_model=DRAFT,
    schedule=((1, 16, 5), (17, 32, 4), (33, 64, 3), (65, 128, 1), (129, 1024, 0)),
)
SGLANG_DEFAULT_ADAPTIVE = SpecConfig(
    method="eagle3", num_speculative_tokens=3, draft_model=DRAFT, engine_adaptive=True
)
SPACE = (
    SpecConfig(),
    *(
        SpecConfig(method="eagle3", num_speculative_tokens=k, draft_model=DRAFT)
        for k in range(1, 6)
    ),
    SpecConfig(method="ngram", num_speculative_tokens=3),
)
TUNE_BATCHES = (1, 4, 16, 32, 64, 128, 256)
TUNE_REPEATS = 3
TUNE_MAX_K = 5


@dataclass(frozen=True, slots=True)
class StaticPolicy:
    name: str
    config: SpecConfig


def space_for(engine: str) -> tuple[SpecConfig, ...]:
    adapter = get_adapter(engine)
    runs: list[SpecConfig] = []
    for config in SPACE:
        try:
            adapter.check(config)
        except ValueError:
            continue
        runs.append(config)
    return tuple(runs)


def baselines(engine: str, cost: StepCost) -> list[StaticPolicy]:
    space = space_for(engine)
    policies = [
        StaticPolicy(NO_SPEC if not c.speculative else f"static:{c.describe()}", c) for c in space
    ]
    if engine == "vllm":
        policies.append(StaticPolicy("vllm-eagle3-table", VLLM_EAGLE3_TABLE))
    else:
        policies.append(StaticPolicy("sglang-adaptive", SGLANG_DEFAULT_ADAPTIVE))
    policies.append(StaticPolicy("tuned-schedule", tuned_schedule(cost, engine)))
    return policies


@cache
def tuned_schedule(cost: StepCost, engine: str, method: SpecMethod = "eagle3") -> SpecConfig:
    """vLLM's offline K tuning over the grid, on `cost` (the nominal world)."""
    best_k: list[int] = []
    for batch in TUNE_BATCHES:
        scores: dict[int, float] = {}
        for k in range(TUNE_MAX_K + 1):
            config = (
                SpecConfig(method=method, num_speculative_tokens=k, draft_model=DRAFT)
                if k
                else SpecConfig()
            )
            runs = [
                simulate(
                    config=config,
                    performance=cost,
                    concurrency=batch,
                    duration_s=30.0,
                    warmup_s=5.0,
                    seed=seed,
                ).tokens_per_s
                for seed in range(TUNE_REPEATS)
            ]
            median = statistics.median(runs)
            spread = statistics.median(abs(r - median) for r in runs)
            scores[k] = median - spread
        best_k.append(max(scores, key=lambda k: (scores[k], -k)))
    tiers: list[tuple[int, int, int]] = []
    for i, (batch, k) in enumerate(zip(TUNE_BATCHES, best_k, strict=True)):
        start = 1 if i == 0 else TUNE_BATCHES[i - 1] + 1
        end = batch if i < len(TUNE_BATCHES) - 1 else 1024
        if tiers and tiers[-1][2] == k:
            tiers[-1] = (tiers[-1][0], end, k)
        else:
            tiers.append((start, end, k))
    top = max(best_k)
    if top == 0:
        return SpecConfig()
    return SpecConfig(
        method=method, num_speculative_tokens=top, draft_model=DRAFT, schedule=tuple(tiers)
    )
