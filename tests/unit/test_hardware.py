"""Roofline step-time model: reproduces the published Llama-3.1-8B/H100 fit it is anchored on,
and the ridge points and knee REFERENCE.md section 4 derives."""

from __future__ import annotations

import pytest

from specpilot.tuner import (
    GPUS,
    PROFILES,
    ConfigError,
    StepCost,
    StepTimeModel,
    get_gpu,
    get_profile,
)
from specpilot.tuner._model.step_cost import spec_path_overhead


def test_anchor_profile_reproduces_published_fit() -> None:
    model = StepTimeModel.roofline(get_gpu("H100"), get_profile("llama-3.1-8b"))
    assert model.step_time(1, 0) == pytest.approx(5.9e-3, rel=0.001)
    slope_far = (model.step_time(40_000, 0) - model.step_time(30_000, 0)) / 10_000
    assert slope_far == pytest.approx(21e-6, rel=0.01)
    assert model.per_kv_token_s == pytest.approx(39e-9, rel=0.01)  # 131072 B / 3.35 TB/s
    assert model.knee_tokens == pytest.approx(281, rel=0.01)  # "knee ~280 tokens"
    # between the two, the roofline bends: below the affine fit, never below either bound
    for tokens in (64, 256, 1024):
        affine = 5.9e-3 + 21e-6 * tokens
        assert max(5.9e-3, 1.1e-3 + 21e-6 * tokens) < model.step_time(tokens, 0) < affine


def test_affine_fit_is_exact() -> None:
    fit = StepTimeModel(fixed_s=2e-3, per_token_s=1e-5, per_kv_token_s=1e-8)
    assert fit.step_time(100, 1000) == pytest.approx(2e-3 + 1e-3 + 1e-5)


@pytest.mark.parametrize(("gpu", "ridge"), [("H100", 295), ("H200", 206)])
def test_ridge_points(gpu: str, ridge: float) -> None:
    # the arithmetic intensity where the roofline turns from memory- to compute-bound
    assert GPUS[gpu].peak_flops / GPUS[gpu].bandwidth == pytest.approx(ridge, rel=0.01)


def test_bandwidth_moves_the_knee_later() -> None:
    profile = get_profile("llama-3.1-8b")
    h100 = StepTimeModel.roofline(get_gpu("H100"), profile)
    h200 = StepTimeModel.roofline(get_gpu("H200"), profile)
    assert h200.weight_s < h100.weight_s and h200.per_token_s == h100.per_token_s
    assert h200.knee_tokens < h100.knee_tokens  # faster memory: compute-bound sooner


def test_moe_reads_more_experts_as_tokens_grow() -> None:
    profile = PROFILES["qwen3-30b-a3b"]
    model = StepTimeModel.roofline(get_gpu("H100"), profile)
    one, four, many = (model.step_time(t, 0) for t in (1, 4, 512))
    dense_slope = model.per_token_s
    assert four - one > 3 * dense_slope  # verifying 3 extra tokens touches new experts
    assert profile.weight_bytes_read(10_000) == pytest.approx(profile.params * 2, rel=1e-6)
    assert many > four > one


def test_unknown_names_list_the_known_ones() -> None:
    with pytest.raises(ConfigError, match="H100 \\| H200"):
        get_gpu("V100")
    with pytest.raises(ConfigError, match=r"llama-3\.1-8b"):
        get_profile("gpt-5")


# The vLLM CPU server's decode-only fit in bench/results/real_vllm.md (d4afe97), with the price of
# a sequence's extra tokens a prefill probe would measure (an illustrative 0.7 ms: ngram K=5's
# 6-token steps took about 5.06 ms there against 1.52 ms for one token).
CPU_FIT = dict(fixed_s=0.29e-3, per_token_s=1.283e-3, per_kv_token_s=0.0)


def test_a_sequences_extra_tokens_are_priced_apart_when_measured() -> None:
    decode_only = StepTimeModel(**CPU_FIT)
    priced = StepTimeModel(**CPU_FIT, per_extra_token_s=0.7e-3)
    # one sequence verifying 6 tokens: its first at the decode price, 5 at the extra price
    assert priced.step_time(6, 0, sequences=1) == pytest.approx((0.29 + 1.283 + 5 * 0.7) * 1e-3)
    assert decode_only.step_time(6, 0, sequences=1) == pytest.approx((0.29 + 6 * 1.283) * 1e-3)
    # one token per sequence (plain decode), or sequences unsaid: the decode fit as measured
    for model in (decode_only, priced):
        assert model.step_time(32, 0, sequences=32) == pytest.approx((0.29 + 32 * 1.283) * 1e-3)
        assert model.step_time(32, 0) == pytest.approx((0.29 + 32 * 1.283) * 1e-3)


def test_a_verify_step_is_priced_by_its_sequences() -> None:
    priced = StepTimeModel(**CPU_FIT, per_extra_token_s=0.7e-3)
    cost = StepCost.from_fit(priced, "H100", "llama-3.1-8b")
    ngram = cost.step_time(method="ngram", decode_batch=4, k=5, prefill_tokens=0, kv_tokens=0)
    verify = priced.step_time(24, 0, sequences=4)
    assert ngram == pytest.approx(verify * (1 + spec_path_overhead(4)))
    plain = cost.step_time(method="none", decode_batch=4, k=0, prefill_tokens=0, kv_tokens=0)
    assert plain == pytest.approx((0.29 + 4 * 1.283) * 1e-3)
    # a roofline has no separate price: the same step however its tokens are spread
    roofline = StepTimeModel.roofline(get_gpu("H100"), get_profile("llama-3.1-8b"))
    assert roofline.step_time(24, 0, sequences=4) == roofline.step_time(24, 0)


def test_fit_json_takes_the_extra_token_price() -> None:
    body = {**CPU_FIT, "per_extra_token_s": 0.7e-3}
    assert StepTimeModel.from_fit_json(body).per_extra_token_s == 0.7e-3
    assert StepTimeModel.from_fit_json(CPU_FIT).per_extra_token_s is None
    with pytest.raises(ConfigError, match="per_extra_token_s"):
        StepTimeModel.from_fit_json({**CPU_FIT, "per_extra_token_s": "fast"})
    with pytest.raises(ConfigError, match="non-negative"):
        StepTimeModel.from_fit_json({**CPU_FIT, "per_extra_token_s": -1.0})
