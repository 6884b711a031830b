"""Time of one speculative engine step: target verification plus the method's drafting.

Contract: `StepCost.step_time(method, decode_batch, k, prefill_tokens, kv_tokens)` is the
seconds of one step that verifies K+1 tokens for each of `decode_batch` requests, prefills
`prefill_tokens` and attends `kv_tokens`; drafting cost per method:
- ngram / suffix: 0 (a CPU-side lookup overlapped with the GPU step);
- eagle / eagle3 / mtp: K sequential passes of a one-layer head with the LM head;
- draft_model: K sequential passes of a small same-family model (DRAFT_MODEL_FRACTION of the
  target's weights, an assumption: a 1B-class draft for an 8B target);
- dflash: one parallel pass over the block with a DFLASH_LAYERS-layer drafter plus LM head.
A pass streams its weights once (memory bound) and adds per-token compute at the target's
per-token rate scaled by its size, plus DRAFT_PASS_OVERHEAD_S of launch overhead.

With speculation on, the engine's spec-decode path (rejection sampling, draft bookkeeping,
piecewise CUDA graphs) slows every step: vLLM issue 49548 measured +6.6% TPOT at concurrency 2
rising to +21.6% at 189 for a schedule that drafts nothing, against a plain server. The
emulator applies that measured overhead, interpolated in log batch size, to every
speculative step (an assumption for configs without a schedule, where it was not measured).

Prefill comes in lumps: a chunked-prefill engine puts a whole prompt (up to its token budget)
into one step, so a few steps carry a prompt and the rest decode alone. A step's time is convex
in its tokens (memory-bound decode, compute-bound prefill), so the mean over steps is more than
the time of a step carrying the mean prefill (Jensen), and more so for a small decode step (no
speculation) than for a wide verify step. `serving_step_time` with the traffic's mean prompt
takes that expectation over a Poisson count of prompts per step; without it, the mean prefill
rides in every step. That gap is why a correction learned on no speculation overstated how
slow speculation would be (bench/results/lumpy_prefill.md).

`spec_path_scale` and `draft_cost_scale` (default 1: the published numbers above, which is what
the tuner uses) scale the spec-path overhead fractions and the drafting time; the emulator's
hidden worlds (`specpilot.runtime.emulator.world`) set them to make a truth the tuner is not told.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from specpilot.tuner._model.hardware import Gpu, ModelProfile, StepTimeModel, get_gpu, get_profile

DRAFT_MODEL_FRACTION = 0.15
DFLASH_LAYERS = 5
# Fitted with the EAGLE-3 head cost so Llama-3.1-8B on H100 at batch 1 gives the published
# 373 tok/s (bench/calibration.py); small next to a head's weight-streaming time.
DRAFT_PASS_OVERHEAD_S = 20e-6
SPEC_PATH_OVERHEAD_POINTS = ((2, 0.066), (189, 0.216))
PREFILL_CHUNK_TOKENS = 2048
"""The most prompt tokens one step prefills: vLLM 0.32's smallest GPU default
max-num-batched-tokens for its API server (GPUs under 70 GiB and A100; 8192 on H100 and H200,
16384 from 160 GiB). The smallest, so that a long prompt is never assumed lumpier than it is."""
LUMPY_PROMPTS_PER_STEP = 16.0
"""Above this many prompts per step the steps are alike: the mean prefill in each is exact enough
(the Poisson count's spread is a quarter of its mean), and the expectation is skipped."""


def spec_path_overhead(batch: int) -> float:
    """Fractional step-time overhead of the spec-decode path at this batch size."""
    (low_batch, low), (high_batch, high) = SPEC_PATH_OVERHEAD_POINTS
    position = math.log(max(batch, 1) / low_batch) / math.log(high_batch / low_batch)
    return low + (high - low) * min(1.0, max(0.0, position))


@dataclass(frozen=True, slots=True, kw_only=True)
class StepCost:
    step_model: StepTimeModel
    profile: ModelProfile
    gpu: Gpu
    spec_path_scale: float = 1.0
    """Multiplies the spec-decode path's overhead fractions (SPEC_PATH_OVERHEAD_POINTS)."""
    draft_cost_scale: float = 1.0
    """Multiplies the drafting time of every method that drafts on the GPU."""

    def kv_capacity_tokens(self, memory_utilization: float = 0.9) -> int:
        """KV tokens that fit beside the weights (vLLM's default memory utilisation: 0.9)."""
        free = (
            self.gpu.memory_bytes * memory_utilization
            - self.profile.params * self.profile.bytes_per_param
        )
        return max(int(free / self.profile.kv_bytes_per_token), 1024)

    @classmethod
    def for_hardware(cls, gpu: str, profile: str) -> StepCost:
        """The roofline cost model of a catalog GPU running a catalog model profile."""
        g, p = get_gpu(gpu), get_profile(profile)
        return cls(step_model=StepTimeModel.roofline(g, p), profile=p, gpu=g)

    @classmethod
    def from_fit(cls, step_model: StepTimeModel, gpu: str, profile: str) -> StepCost:
        """A measured step-time fit (the probe's, or one measured on the engine itself, e.g.
        a CPU with no catalog entry) in place of the roofline. The GPU and profile still size
        the drafting passes of draft-weight methods; ngram and suffix draft for free."""
        return cls(step_model=step_model, profile=get_profile(profile), gpu=get_gpu(gpu))

    def draft_fraction(self, method: str) -> float:
        """Share of the target's weights one drafting pass streams."""
        profile = self.profile
        head = (profile.layer_params + profile.lm_head_params) / profile.params
        if method in ("eagle", "eagle3", "mtp"):
            return head
        if method == "draft_model":
            return DRAFT_MODEL_FRACTION
        if method == "dflash":
            return (DFLASH_LAYERS * profile.layer_params + profile.lm_head_params) / profile.params
        return 0.0

    def _kv_share(self, method: str) -> float:
        """Share of the target's KV reads the drafter makes (its own layers' cache)."""
        if method == "dflash":
            return DFLASH_LAYERS / self.profile.layers
        if method == "draft_model":
            return DRAFT_MODEL_FRACTION
        return 1 / self.profile.layers

    def draft_time(self, method: str, k: int, batch: int, kv_tokens: int) -> float:
        if k <= 0 or batch <= 0 or method in ("none", "ngram", "suffix"):
            return 0.0
        fraction = self.draft_fraction(method)
        weights_s = fraction * self.profile.weight_bytes_read(1) / self.gpu.bandwidth
        kv_s = self.step_model.per_kv_token_s * kv_tokens * self._kv_share(method)
        if method == "dflash":
            tokens = batch * (k + 1)
            return (
                weights_s
                + fraction * self.step_model.per_token_s * tokens
                + kv_s
                + (DRAFT_PASS_OVERHEAD_S)
            ) * self.draft_cost_scale
        one_pass = weights_s + fraction * self.step_model.per_token_s * batch + kv_s
        return k * (one_pass + DRAFT_PASS_OVERHEAD_S) * self.draft_cost_scale

    def serving_step_time(
        self,
        *,
        method: str,
        decode_batch: int,
        k: int,
        tokens_per_request: float,
        prefill_per_output_token: float,
        kv_tokens: int,
        prompt_tokens: float | None = None,
    ) -> float:
        """One step in steady serving, where prompts arrive in proportion to the output.

        Each step emits `decode_batch x tokens_per_request` tokens; in steady state the engine
        prefills `prefill_per_output_token` prompt tokens for each of them (chunked prefill
        rides in the same step), so a config that emits more per step also prefills more.
        `prompt_tokens`, the traffic's mean prompt, makes that prefill come in chunks of a
        prompt each (at most PREFILL_CHUNK_TOKENS), a Poisson count of them per step: the mean
        step time over steps that carry none, one or several (see the module's note).
        """
        prefill = prefill_per_output_token * decode_batch * tokens_per_request

        def step(prefill_tokens: float) -> float:
            return self.step_time(
                method=method,
                decode_batch=decode_batch,
                k=k,
                prefill_tokens=round(prefill_tokens),
                kv_tokens=kv_tokens,
            )

        if not prompt_tokens or prompt_tokens <= 0 or prefill <= 0:
            return step(prefill)
        chunk = min(prompt_tokens, PREFILL_CHUNK_TOKENS)
        chunks_per_step = prefill / chunk
        if chunks_per_step > LUMPY_PROMPTS_PER_STEP:
            return step(prefill)
        return _poisson_mean(chunks_per_step, lambda count: step(count * chunk))

    def step_time(
        self, *, method: str, decode_batch: int, k: int, prefill_tokens: int, kv_tokens: int
    ) -> float:
        tokens = decode_batch * (k + 1) + prefill_tokens
        if tokens <= 0:
            return 0.0
        verify = self.step_model.step_time(tokens, kv_tokens, sequences=decode_batch)
        if method == "none":
            return verify
        verify *= 1.0 + spec_path_overhead(decode_batch) * self.spec_path_scale
        return verify + self.draft_time(method, k, decode_batch, kv_tokens)


def _poisson_mean(mean: float, value: Callable[[int], float]) -> float:
    """E[value(N)] for N ~ Poisson(mean), over the counts holding all but a negligible tail
    (beyond mean + 6 sd + 6), renormalised to the mass summed."""
    probability, total, mass, count = math.exp(-mean), 0.0, 0.0, 0
    while count <= mean + 6.0 * math.sqrt(mean) + 6.0:
        total += probability * value(count)
        mass += probability
        count += 1
        probability *= mean / count
    return total / mass
