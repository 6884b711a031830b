"""The torch probe: the non-negative fit on known data, the layer shapes against the profiles,
and real short probes on this machine's CPU (sane coefficients, growth with tokens,
predictions inside the reported fit error, the budget's scaling, JSON out)."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest

from specpilot.runtime.probe import (
    KV_SWEEP,
    TOKEN_SWEEP,
    ProbeResult,
    active_layer_params,
    fit_step_time,
    layer_shapes,
    run_probe,
)
from specpilot.tuner import PROFILES, ConfigError, ModelProfile, get_profile

# Small enough to probe at full width in a test: hidden 512, 8 heads of 64 (2 for KV), MLP
# 1792, a 1000-token vocabulary, 4 layers.
TINY_LAYER = 512 * 64 * 2 * (8 + 2) + 3 * 512 * 1792
TINY = ModelProfile(
    name="tiny-probe",
    params=4 * TINY_LAYER + 2 * 1000 * 512,
    active_params=4 * TINY_LAYER + 2 * 1000 * 512,
    bytes_per_param=2,
    layers=4,
    attention_heads=8,
    kv_heads=2,
    head_dim=64,
    hidden_size=512,
    vocab_size=1000,
)


def grid(a: float, b: float, c: float) -> list[tuple[int, int, float]]:
    return [(n, kv, a + b * n + c * kv) for kv in KV_SWEEP for n in TOKEN_SWEEP]


def test_fit_recovers_exact_coefficients() -> None:
    fit = fit_step_time(grid(5.9e-3, 21e-6, 39e-9))  # the published H100 fit
    assert (fit.fixed_s, fit.per_token_s, fit.per_kv_token_s) == pytest.approx(
        (5.9e-3, 21e-6, 39e-9), rel=1e-6
    )
    assert fit.max_rel_error < 1e-9 and fit.clamped == ()


def test_fit_clamps_a_negative_slope_at_the_constrained_optimum() -> None:
    points = grid(2e-3, 1e-5, -5e-8)  # steps that get faster with more KV: c must stop at 0
    fit = fit_step_time(points)
    assert fit.clamped == ("per_kv_token_s",) and fit.per_kv_token_s == 0
    assert fit.fixed_s > 0 and fit.per_token_s > 0

    def sse(a: float, b: float, c: float) -> float:
        return sum(((a + b * n + c * kv) / t - 1) ** 2 for n, kv, t in points)

    # Optimality (KKT): raising the clamped slope, or moving a free one, only adds error.
    best = sse(fit.fixed_s, fit.per_token_s, 0.0)
    assert sse(fit.fixed_s, fit.per_token_s, 1e-10) > best
    assert sse(fit.fixed_s * 1.01, fit.per_token_s, 0.0) > best
    assert sse(fit.fixed_s, fit.per_token_s * 0.99, 0.0) > best
    assert fit.rms_rel_error == pytest.approx(math.sqrt(best / len(points)))


@pytest.mark.parametrize(
    ("name", "heads", "mlp"),
    [
        ("llama-3.1-8b", 32, 14336),
        ("llama-3.1-70b", 64, 28672),
        ("qwen3-8b", 32, 12288),
        ("qwen3-30b-a3b", 32, 8 * 768),  # the 8 routed experts of 768 a token uses
    ],
)
def test_layer_shapes_match_the_published_configs(name: str, heads: int, mlp: int) -> None:
    shapes = layer_shapes(PROFILES[name])
    assert shapes.heads == heads and shapes.hidden == PROFILES[name].hidden_size
    assert shapes.intermediate == pytest.approx(mlp, rel=0.03)
    assert shapes.params == pytest.approx(active_layer_params(PROFILES[name]), rel=1e-3)


def test_shapes_scale_by_whole_kv_heads() -> None:
    shapes = layer_shapes(TINY)
    assert (shapes.hidden, shapes.heads, shapes.kv_heads, shapes.intermediate) == (512, 8, 2, 1792)
    half = layer_shapes(get_profile("llama-3.1-8b")).scaled(4)
    assert (half.hidden, half.heads, half.kv_heads, half.head_dim) == (2048, 16, 4, 128)
    assert half.intermediate == 14336 // 2


@pytest.mark.parametrize(
    ("field", "kwargs"),
    [
        ("layers", {"layers": 0}),
        ("layers", {"layers": 33}),
        ("hidden_scale", {"hidden_scale": 1.5}),
        ("token_sweep", {"token_sweep": (4,)}),
        ("kv_sweep", {"kv_sweep": (-1,)}),
        ("repeats", {"repeats": 0}),
    ],
)
def test_bad_arguments_fail_before_any_work(field: str, kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigError, match=f"^{field}="):
        run_probe(get_profile("llama-3.1-8b"), **kwargs)  # type: ignore[arg-type]


def test_module_imports_without_torch_or_numpy() -> None:
    blocked = "import sys; sys.modules['torch'] = sys.modules['numpy'] = None"
    code = f"{blocked}; import specpilot.runtime.probe"
    subprocess.run([sys.executable, "-c", code], check=True)


# One CPU thread: on a shared 2-core machine a busy neighbour stalls OpenMP's barriers and
# turns millisecond steps into 15 ms ones at random, which is noise, not the device.
@pytest.fixture(scope="module")
def tiny() -> ProbeResult:
    return run_probe(TINY, layers=2, hidden_scale=1.0, max_seconds=20, cpu_threads=1)


def test_real_probe_fits_sane_coefficients(tiny: ProbeResult) -> None:
    assert tiny.device == "cpu" and tiny.dtype == "float32" and tiny.cpu_threads == 1
    assert len(tiny.measurements) == len(TOKEN_SWEEP) * len(KV_SWEEP)
    fit = tiny.measured
    assert fit.fixed_s > 0 and fit.per_token_s > 0 and fit.per_kv_token_s >= 0
    by_point = {(n, kv): t for n, kv, t in tiny.measurements}
    for kv in KV_SWEEP:  # at the large end, more tokens per step cost more time
        assert by_point[(256, kv)] > by_point[(64, kv)]


def test_step_time_model_predicts_the_measurements_within_the_fit_error(
    tiny: ProbeResult,
) -> None:
    # 2 of 4 layers at full width: the full profile is twice the stack, plus its LM head.
    head = 1 + 1000 * 512 / (4 * TINY_LAYER)
    assert tiny.factors == pytest.approx((2 * head, 2 * head, 2)) and tiny.width_scale == 1
    model = tiny.to_step_time_model()
    assert model.source == "probe cpu tiny-probe" and model.weight_s == 0
    for n, kv, _ in tiny.measurements:  # no roofline bend: the emulator gets the fit as is
        affine = model.fixed_s + model.per_token_s * n + model.per_kv_token_s * kv
        assert model.step_time(n, kv) == pytest.approx(affine)
    fixed, per_token, per_kv = (
        c / f
        for c, f in zip(
            (model.fixed_s, model.per_token_s, model.per_kv_token_s), tiny.factors, strict=True
        )
    )
    predicted = np.array([fixed + per_token * n + per_kv * kv for n, kv, _ in tiny.measurements])
    seconds = np.array([t for _, _, t in tiny.measurements])
    rel = np.abs(predicted / seconds - 1)
    assert rel.max() <= tiny.measured.max_rel_error + 1e-9
    assert np.sqrt(np.mean(rel**2)) == pytest.approx(tiny.measured.rms_rel_error)


def test_to_dict_is_json_and_says_what_was_extrapolated(tiny: ProbeResult) -> None:
    data = json.loads(json.dumps(tiny.to_dict()))
    assert data["layers_measured"] == 2 and data["profile_layers"] == 4
    assert "factors" not in data  # one spelling: the named extrapolation_factors
    factors = data["extrapolation_factors"]
    assert data["fixed_s"] == pytest.approx(factors["fixed_s"] * data["measured"]["fixed_s"])
    assert factors["per_kv_token_s"] == 2  # KV reads: the layer ratio alone
    assert len(data["measurements"]) == len(tiny.measurements)


def test_a_small_budget_sizes_the_stack_and_the_fit_is_scaled_back_up() -> None:
    profile = get_profile("llama-3.1-8b")
    result = run_probe(profile, max_seconds=6, cpu_threads=1)
    layers, scale = result.layers_measured, result.width_scale
    assert 1 <= layers <= profile.layers and 0 < scale <= 1
    assert (scale * profile.kv_heads).is_integer()
    assert result.shapes.hidden == round(4096 * scale)
    ratio, head = profile.layers / layers, 1 + 128256 * 4096 / (8.03e9 - 2 * 128256 * 4096)
    expected = (ratio * head / scale**2, ratio * head / scale**2, ratio / scale)
    assert result.factors == pytest.approx(expected)
    assert result.fixed_s > 0 and result.per_token_s > 0 and result.per_kv_token_s >= 0
