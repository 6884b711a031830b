"""Schedule synthesis: the per-batch-size K an engine should use, from the tuner's model.

Contract: `synthesize_schedule(config, curve, cost)` picks, for each batch-size bucket (powers
of two up to MAX_BATCH), the K in 0..max K with the highest predicted decode throughput, and
merges equal neighbours into contiguous tiers that start at batch 1: the shape vLLM's
`num_speculative_tokens_per_batch_size` and SGLang's one-candidate adaptive buckets take.
The largest K the schedule uses becomes the config's K (SGLang needs it among the
candidates). None when no bucket wants drafts: a plain server is then faster.
"""

from __future__ import annotations

import functools

from specpilot.tuner._model.acceptance import AcceptanceCurve
from specpilot.tuner._model.step_cost import StepCost
from specpilot.tuner.spec_config import ScheduleTier, SpecConfig

MAX_BATCH = 1024
BUCKETS = tuple(2**i for i in range(11))  # 1 .. 1024


def best_k(
    method: str,
    max_k: int,
    curve: AcceptanceCurve,
    cost: StepCost,
    batch: int,
    context: float,
    prefill_ratio: float = 0.0,
) -> int:
    def throughput(k: int) -> float:
        length = curve.expected_length(k)
        step = cost.serving_step_time(
            method=method,  # a K=0 tier still runs the speculative path and pays its overhead
            decode_batch=batch,
            k=k,
            tokens_per_request=length,
            prefill_per_output_token=prefill_ratio,
            kv_tokens=round(batch * context),
        )
        return batch * length / step

    return max(range(max_k + 1), key=throughput)


def synthesize_schedule(
    config: SpecConfig,
    curve: AcceptanceCurve,
    cost: StepCost,
    context_tokens: float = 1024.0,
    prefill_ratio: float = 0.0,
) -> tuple[ScheduleTier, ...] | None:
    # Inputs are rounded before use: a schedule is a config, and one that moved with every
    # window's noise would look like a new config to switch to; it also makes the result
    # cacheable, which keeps a decision cheap.
    return _synthesize(
        config.method,
        config.max_k,
        AcceptanceCurve(round(curve.p, 3), round(curve.r, 3)),
        cost,
        float(round(context_tokens / 64) * 64),
        round(prefill_ratio, 1),
    )


@functools.lru_cache(maxsize=256)
def _synthesize(
    method: str,
    max_k: int,
    curve: AcceptanceCurve,
    cost: StepCost,
    context_tokens: float,
    prefill_ratio: float,
) -> tuple[ScheduleTier, ...] | None:
    ks = [best_k(method, max_k, curve, cost, b, context_tokens, prefill_ratio) for b in BUCKETS]
    if max(ks) == 0:
        return None
    tiers: list[list[int]] = []
    for index, (bucket, k) in enumerate(zip(BUCKETS, ks, strict=True)):
        end = BUCKETS[index + 1] - 1 if index + 1 < len(BUCKETS) else MAX_BATCH
        if tiers and tiers[-1][2] == k:
            tiers[-1][1] = end
        else:
            tiers.append([bucket, end, k])
    return tuple((start, end, k) for start, end, k in tiers)
