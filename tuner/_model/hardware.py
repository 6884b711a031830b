"""GPU catalog, model profiles and the step-time model they imply (roofline or measured fit).

Contract: `StepTimeModel.step_time(tokens, kv_tokens, sequences)` is the seconds one engine step
takes when it processes `tokens` tokens of `sequences` sequences (batch x (K+1) tokens of batch
sequences when verifying) attending `kv_tokens` cached tokens in total. A measured fit (the
probe) is affine, t = a + b x tokens + c x kv (the form of the SpecDecode-Bench fit, arXiv
2601.11580). A fit measured only on plain decode steps (one token per sequence, e.g. c / tokens
per second at several concurrencies) prices each sequence's first token, which carries the
per-sequence work (sampling, scheduling, its own attention); the tokens a sequence adds beyond
its first (verified drafts, prompt tokens) may cost less, and `per_extra_token_s` prices them
when it was measured (bench/real_engine.py's calibration prices it by prefill, a proxy that
underprices a verify step there: it read 0.009 ms, bench/results/real_vllm_calibrate_only.json,
where ngram K=5's steps implied 0.461, bench/results/real_vllm.md at 1f96d7e). On that run
(replayed by bench/results/real_vllm_what_if.md), given the acceptance it measured, the
decode-only fit predicted 3730 tok/s for ngram K=5 at batch 1 where the run served 1364;
priced apart at 0.461 ms, 1301.

`roofline()` derives the model from a GPU and a model profile: overhead + blend(weight
streaming, compute) + KV reads, where the blend bends from memory-bound to compute-bound at the
knee (and, for MoE, more tokens touch more experts); it has no separate extra-token price (a
GPU's compute per token is the same wherever the token sits).
The anchor constants calibrate efficiency and overhead so that Llama-3.1-8B on H100 matches
the published fit (5.9 ms + 21 us/token + 39 ns/KV token) at one token and in slope far past
the knee; between the two the roofline is below the affine fit, which is what makes
speculation lose at large batches. A GPU with a published per-step overhead of its own (B200,
measured with SGLang) takes that instead of the anchor's.

Sources: GPU peaks from vendor datasheets as gathered in REFERENCE.md section 4; model shapes
from the models' published configs (Hugging Face model cards).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from specpilot.tuner.spec_config import ConfigError


@dataclass(frozen=True, slots=True, kw_only=True)
class Gpu:
    name: str
    peak_flops: float
    """Dense bf16 FLOP/s."""
    bandwidth: float
    """HBM bytes/s."""
    memory_bytes: float
    step_overhead_s: float | None = None
    """Per-step overhead measured on this GPU class where a measurement is published; None
    takes the overhead of the H100 anchor fit (STEP_OVERHEAD_S)."""


# SGLang on B200 spends far more per step than the H100 anchor's 1.1 ms besides streaming
# weights: a sweep of SGLang v0.5.8 on B200 (bench_serving, random 1K in / 1K out; gist
# BenHamm/78563d0d0a08d7cb61b4737392633384) measured 4.36 ms TPOT at concurrency 1 for
# Nemotron3-Nano-30B-A3B in FP8, whose ~3.6 GB of active weights stream in ~0.45 ms at 8 TB/s.
# Cross-check: DFlash's published run (SGLang PR 23000, v1: 846 tok/s at c=1) over its 5.1x
# puts the plain Qwen3-8B step at ~6.0 ms, 2.05 ms of it weights: ~4.0 ms of overhead.
B200_STEP_OVERHEAD_S = 3.9e-3

GPUS: dict[str, Gpu] = {
    gpu.name: gpu
    for gpu in (
        Gpu(name="H100", peak_flops=989e12, bandwidth=3.35e12, memory_bytes=80e9),
        Gpu(name="H200", peak_flops=989e12, bandwidth=4.8e12, memory_bytes=141e9),
        Gpu(name="A100", peak_flops=312e12, bandwidth=2.0e12, memory_bytes=80e9),
        Gpu(
            name="B200",
            peak_flops=2.25e15,
            bandwidth=8e12,
            memory_bytes=180e9,
            step_overhead_s=B200_STEP_OVERHEAD_S,
        ),
        Gpu(name="L40S", peak_flops=362e12, bandwidth=0.864e12, memory_bytes=48e9),
    )
}


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelProfile:
    name: str
    params: float
    """All parameters (weights resident in memory)."""
    active_params: float
    """Parameters each token computes with (equal to params for dense models)."""
    bytes_per_param: float
    layers: int
    attention_heads: int
    kv_heads: int
    head_dim: int
    hidden_size: int
    vocab_size: int
    experts: int = 0
    """Routed experts per MoE layer (0 for dense)."""
    experts_per_token: int = 0
    expert_params: float = 0.0
    """Parameters in all routed experts together (the part a step reads only if touched)."""

    @property
    def kv_bytes_per_token(self) -> float:
        """K and V for every layer of one cached token."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.bytes_per_param

    @property
    def layer_params(self) -> float:
        """Parameters of one transformer layer (embeddings and LM head excluded)."""
        return (self.params - 2 * self.vocab_size * self.hidden_size) / self.layers

    @property
    def lm_head_params(self) -> float:
        return float(self.vocab_size * self.hidden_size)

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    def weight_bytes_read(self, tokens: int) -> float:
        """Weight bytes one step streams: dense models read everything; MoE models read the
        shared part plus the experts that `tokens` tokens route to (expected, uniform routing)."""
        if not self.is_moe:
            return self.params * self.bytes_per_param
        shared = self.params - self.expert_params
        untouched = (1 - self.experts_per_token / self.experts) ** max(tokens, 1)
        return (shared + self.expert_params * (1 - untouched)) * self.bytes_per_param


PROFILES: dict[str, ModelProfile] = {
    profile.name: profile
    for profile in (
        ModelProfile(
            name="llama-3.1-8b",
            params=8.03e9,
            active_params=8.03e9,
            bytes_per_param=2,
            layers=32,
            attention_heads=32,
            kv_heads=8,
            head_dim=128,
            hidden_size=4096,
            vocab_size=128256,
        ),
        ModelProfile(
            name="llama-3.1-70b",
            params=70.6e9,
            active_params=70.6e9,
            bytes_per_param=2,
            layers=80,
            attention_heads=64,
            kv_heads=8,
            head_dim=128,
            hidden_size=8192,
            vocab_size=128256,
        ),
        ModelProfile(
            name="qwen3-8b",
            params=8.19e9,
            active_params=8.19e9,
            bytes_per_param=2,
            layers=36,
            attention_heads=32,
            kv_heads=8,
            head_dim=128,
            hidden_size=4096,
            vocab_size=151936,
        ),
        # Qwen3-30B-A3B: 128 routed experts, 8 per token; experts hold ~29.0B of the 30.5B.
        ModelProfile(
            name="qwen3-30b-a3b",
            params=30.5e9,
            active_params=3.3e9,
            bytes_per_param=2,
            layers=48,
            attention_heads=32,
            kv_heads=4,
            head_dim=128,
            hidden_size=2048,
            vocab_size=151936,
            experts=128,
            experts_per_token=8,
            expert_params=29.0e9,
        ),
    )
}

# Calibration against the published Llama-3.1-8B/H100 fit: the roofline's ideal compute term
# (2 x 8.03e9 / 989e12 = 16.2 us/token) over the measured 21 us is the achieved fraction of
# peak; the measured 5.9 ms less the weight-streaming time (16.06 GB / 3.35 TB/s = 4.79 ms)
# is the per-step overhead (scheduling, sampling, kernel launches).
ANCHOR_FIXED_S = 5.9e-3
ANCHOR_PER_TOKEN_S = 21e-6
ANCHOR_PER_KV_TOKEN_S = 39e-9
COMPUTE_EFFICIENCY = (2 * 8.03e9 / 989e12) / ANCHOR_PER_TOKEN_S
STEP_OVERHEAD_S = ANCHOR_FIXED_S - 8.03e9 * 2 / 3.35e12


@dataclass(frozen=True, slots=True, kw_only=True)
class StepTimeModel:
    """t = fixed + blend(weight streaming, compute) + per_kv_token x kv.

    `blend` is the Euclidean norm of the memory-bound and compute-bound times: it is the
    weight-streaming time at small steps, tends to per_token x tokens at large ones, and bends
    smoothly at the knee, as a roofline does. With `weight_s` = 0 (a measured affine fit,
    e.g. from the probe) it is exactly fixed + per_token x tokens + per_kv_token x kv; with
    `per_extra_token_s` set, compute is per_token x sequences + per_extra_token x (tokens -
    sequences).
    """

    fixed_s: float
    """Per-step overhead (scheduling, sampling, launches); for an affine fit, its intercept."""
    per_token_s: float
    per_kv_token_s: float
    per_extra_token_s: float | None = None
    """Seconds per token a sequence adds to a step beyond its first (a verified draft, a prompt
    token); None: the same as `per_token_s` (a roofline, or a fit that did not measure it)."""
    weight_s: float = 0.0
    """Time to stream the weights once (memory-bound part); 0 for an affine fit."""
    profile: ModelProfile | None = None
    gpu: Gpu | None = None
    source: str = "fit"

    def step_time(self, tokens: int, kv_tokens: int, sequences: int | None = None) -> float:
        """`sequences` (default: `tokens`, one token each) prices the first token of each at
        `per_token_s` and the rest at `per_extra_token_s`."""
        memory = self.weight_s
        if self.profile is not None and self.profile.is_moe and self.gpu is not None:
            # more tokens route to more experts, whose weights must be streamed too
            touched = self.profile.weight_bytes_read(tokens) - self.profile.weight_bytes_read(1)
            memory += touched / self.gpu.bandwidth
        compute = self.per_token_s * tokens
        if self.per_extra_token_s is not None and sequences is not None:
            first = min(max(sequences, 0), tokens)
            compute = self.per_token_s * first + self.per_extra_token_s * (tokens - first)
        return self.fixed_s + math.hypot(memory, compute) + self.per_kv_token_s * kv_tokens

    @property
    def knee_tokens(self) -> float:
        """Tokens per step where compute time reaches the step's fixed time (the published
        fit's a/b): past it, each extra verified token costs real time."""
        return (self.fixed_s + self.weight_s) / self.per_token_s

    @classmethod
    def from_fit_json(cls, body: Mapping[str, Any], source: str = "fit") -> StepTimeModel:
        """An affine fit from JSON with `fixed_s`, `per_token_s` and `per_kv_token_s` (the
        top-level keys `specpilot probe --json` writes), and optionally `per_extra_token_s`."""
        allowed = "fixed_s, per_token_s, per_kv_token_s (seconds), optional per_extra_token_s"
        try:
            coef = [float(body[name]) for name in ("fixed_s", "per_token_s", "per_kv_token_s")]
            extra = body.get("per_extra_token_s")
            per_extra = None if extra is None else float(extra)
        except (KeyError, TypeError, ValueError):
            raise ConfigError("step_time_fit", dict(body), allowed) from None
        if min(coef) < 0 or coef[0] + coef[1] <= 0 or (per_extra is not None and per_extra < 0):
            names = ("fixed_s", "per_token_s", "per_kv_token_s", "per_extra_token_s")
            raise ConfigError(
                "step_time_fit",
                dict(zip(names, [*coef, per_extra], strict=True)),
                "every coefficient non-negative, fixed_s + per_token_s > 0",
            )
        return cls(
            fixed_s=coef[0],
            per_token_s=coef[1],
            per_kv_token_s=coef[2],
            per_extra_token_s=per_extra,
            source=source,
        )

    @classmethod
    def roofline(cls, gpu: Gpu, profile: ModelProfile) -> StepTimeModel:
        return cls(
            fixed_s=STEP_OVERHEAD_S if gpu.step_overhead_s is None else gpu.step_overhead_s,
            weight_s=profile.weight_bytes_read(1) / gpu.bandwidth,
            per_token_s=2 * profile.active_params / (gpu.peak_flops * COMPUTE_EFFICIENCY),
            per_kv_token_s=profile.kv_bytes_per_token / gpu.bandwidth,
            profile=profile,
            gpu=gpu,
            source=f"roofline {gpu.name} x {profile.name}",
        )


def get_gpu(name: str) -> Gpu:
    try:
        return GPUS[name.upper()]
    except KeyError:
        raise ConfigError("gpu", name, " | ".join(GPUS)) from None


def get_profile(name: str) -> ModelProfile:
    try:
        return PROFILES[name.lower()]
    except KeyError:
        raise ConfigError("model_profile", name, " | ".join(PROFILES)) from None
