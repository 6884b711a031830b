"""Hidden worlds: seeded, within their ranges, world 0 nominal, and wired into the emulator."""

from __future__ import annotations

import json
import math

import pytest

from specpilot.operator.app.cli import main
from specpilot.runtime.emulator.fast_sweep import simulate
from specpilot.runtime.emulator.server import (
    LOAD_SECONDS_PER_BILLION_PARAMS,
    EmulatedEngine,
    parse_settings,
)
from specpilot.runtime.emulator.world import (
    ACCEPTANCE_RANGE,
    FACTOR_RANGES,
    World,
    draw_world,
    reference_k,
)
from specpilot.tuner import (
    GPUS,
    PROFILES,
    TASKS,
    ConfigError,
    SpecConfig,
    StepCost,
    acceptance_curve,
)
from specpilot.tuner.priors import acceptance_table

SEEDS = range(1, 201)
EAGLE3_K3 = SpecConfig(method="eagle3", num_speculative_tokens=3, draft_model="d")


def _far_world(below: float = 0.72) -> World:
    """A world whose EAGLE-3 chat acceptance is far under the prior's."""
    return next(
        w for w in map(draw_world, range(1, 200)) if w.acceptance_factor("eagle3", "chat") < below
    )


def test_same_seed_same_world_and_seeds_differ() -> None:
    assert draw_world(7) == draw_world(7)
    assert draw_world(7).describe() == draw_world(7).describe()
    worlds = [draw_world(seed) for seed in range(1, 51)]
    assert len({w.describe()["compute_efficiency"] for w in worlds}) == len(worlds)
    assert len({w.acceptance for w in worlds}) == len(worlds)


def test_every_factor_within_its_range_over_200_seeds() -> None:
    drawn: dict[str, list[float]] = {name: [] for name in FACTOR_RANGES}
    acceptance: list[float] = []
    cells = {(m, t) for m in acceptance_table() for t in TASKS}
    for seed in SEEDS:
        world = draw_world(seed)
        assert not world.nominal
        for name, (low, high) in FACTOR_RANGES.items():
            value = getattr(world, name)
            assert low <= value <= high, (seed, name, value)
            drawn[name].append(value)
        assert {(m, t) for m, t, _ in world.acceptance} == cells
        for *_, factor in world.acceptance:
            assert ACCEPTANCE_RANGE[0] <= factor <= ACCEPTANCE_RANGE[1]
            acceptance.append(factor)
    # the draws cover their ranges, not a corner of them
    for name, (low, high) in FACTOR_RANGES.items():
        span = high - low
        assert min(drawn[name]) < low + 0.1 * span and max(drawn[name]) > high - 0.1 * span
    low, high = ACCEPTANCE_RANGE
    assert min(acceptance) < low + 0.01 and max(acceptance) > high - 0.01


@pytest.mark.parametrize("seed", [1, 11, 42, 199])
def test_acceptance_scales_accepted_tokens_at_the_reference_k(seed: int) -> None:
    world = draw_world(seed)
    for method, task, factor in world.acceptance:
        k = reference_k(method)
        prior, truth = acceptance_curve(method, task), world.acceptance_curve(method, task)
        assert truth.r == prior.r
        ceiling = type(prior)(1.0, prior.r).expected_accepted(k)  # p = 1: all K can give
        want = min(prior.expected_accepted(k) * factor, ceiling)
        assert truth.expected_accepted(k) == pytest.approx(want, abs=1e-6), (method, task)


def test_world_zero_is_the_priors_and_the_catalog() -> None:
    world = draw_world(0)
    assert world.nominal and world == World(seed=0)
    for method in acceptance_table():
        for task in TASKS:
            assert world.acceptance_curve(method, task) == acceptance_curve(method, task)
    for gpu in GPUS:
        for profile in PROFILES:
            truth, catalog = world.step_cost(gpu, profile), StepCost.for_hardware(gpu, profile)
            assert truth == catalog
            for method in ("none", "ngram", "eagle3", "draft_model", "dflash"):
                for batch in (1, 64, 512):
                    args = {"method": method, "decode_batch": batch, "k": 3}
                    assert truth.step_time(
                        **args, prefill_tokens=100, kv_tokens=batch * 600
                    ) == catalog.step_time(**args, prefill_tokens=100, kv_tokens=batch * 600)
    assert world.start_time_s(60.0) == 60.0
    described = world.describe()
    assert described["nominal"] is True and described["acceptance"] == {}
    assert all(described[name] == 1.0 for name in FACTOR_RANGES)


def test_a_worlds_step_cost_applies_its_factors() -> None:
    world = draw_world(11)
    catalog = StepCost.for_hardware("H100", "llama-3.1-8b")
    truth = world.step_cost("H100", "llama-3.1-8b")
    nominal, hidden = catalog.step_model, truth.step_model
    assert hidden.fixed_s == pytest.approx(nominal.fixed_s * world.step_overhead)
    assert hidden.per_token_s == pytest.approx(nominal.per_token_s / world.compute_efficiency)
    assert hidden.weight_s == pytest.approx(nominal.weight_s / world.bandwidth)
    assert hidden.per_kv_token_s == pytest.approx(nominal.per_kv_token_s / world.bandwidth)
    assert truth.kv_capacity_tokens() == catalog.kv_capacity_tokens()
    # the spec path's overhead fraction scales; ngram drafts for free, so it is all there is
    plain = truth.step_time(method="none", decode_batch=64, k=3, prefill_tokens=0, kv_tokens=0)
    ngram = truth.step_time(method="ngram", decode_batch=64, k=3, prefill_tokens=0, kv_tokens=0)
    nominal_plain = catalog.step_time(
        method="none", decode_batch=64, k=3, prefill_tokens=0, kv_tokens=0
    )
    nominal_ngram = catalog.step_time(
        method="ngram", decode_batch=64, k=3, prefill_tokens=0, kv_tokens=0
    )
    assert ngram / plain - 1 == pytest.approx(
        (nominal_ngram / nominal_plain - 1) * world.spec_path_overhead
    )
    unscaled = StepCost(step_model=hidden, profile=truth.profile, gpu=truth.gpu)
    assert truth.draft_time("eagle3", 3, 64, 40_000) == pytest.approx(
        unscaled.draft_time("eagle3", 3, 64, 40_000) * world.drafter_cost
    )
    assert world.start_time_s(60.0) == pytest.approx(60.0 * world.start_time)
    json.dumps(world.describe())  # result files can hold it


def test_the_engine_draws_from_the_worlds_curve_not_the_prior() -> None:
    world = _far_world()
    truth = world.acceptance_curve("eagle3", "chat").expected_length(3)
    prior = acceptance_curve("eagle3", "chat").expected_length(3)
    assert prior - truth > 0.4
    result = simulate(
        config=EAGLE3_K3,
        performance=world.step_cost("H100", "llama-3.1-8b"),
        acceptance=world.acceptance_curve,
        concurrency=16,
        duration_s=60.0,
        warmup_s=5.0,
        seed=3,
    )
    assert result.acceptance_length is not None
    assert result.acceptance_length == pytest.approx(truth, abs=0.05)


def test_simulate_takes_a_world_seed(capsys: pytest.CaptureFixture[str]) -> None:
    world = _far_world()
    argv = ["simulate", "--method", "eagle3", "--k", "3", "--concurrency", "4"]
    argv += ["--duration", "60", "--json"]
    assert main([*argv, "--world-seed", str(world.seed)]) == 0
    hidden = json.loads(capsys.readouterr().out)
    assert main(argv) == 0
    nominal = json.loads(capsys.readouterr().out)
    assert hidden["world"]["world_seed"] == world.seed and not hidden["world"]["nominal"]
    assert nominal["world"] == {**draw_world(0).describe()}
    truth = world.acceptance_curve("eagle3", "chat").expected_length(3)
    assert hidden["points"][0]["acceptance_length"] == pytest.approx(truth, abs=0.1)
    assert nominal["points"][0]["acceptance_length"] == pytest.approx(2.79, abs=0.1)
    assert hidden["points"][0]["base_tok_s"] != nominal["points"][0]["base_tok_s"]


def test_simulate_rejects_a_negative_world_seed(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["simulate", "--method", "eagle3", "--concurrency", "1", "--world-seed", "-1"]
    assert main(argv) == 2
    assert "world_seed=-1 is invalid" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="world_seed"):
        draw_world(-3)


def test_the_emulator_server_takes_a_world_seed() -> None:
    base = ["--engine", "vllm", "--gpu", "H100", "--model", "/m"]
    nominal = parse_settings(base)
    assert nominal.world_seed == 0
    assert nominal.load_delay_s == LOAD_SECONDS_PER_BILLION_PARAMS * 8.03e9 / 1e9  # unchanged
    settings = parse_settings([*base, "--world-seed", "11", "--load-delay", "2"])
    world = draw_world(11)
    assert settings.world_seed == 11
    assert settings.load_delay_s == pytest.approx(2.0 * world.start_time)
    engine = EmulatedEngine(settings)
    assert engine.core.performance == world.step_cost("H100", "llama-3.1-8b")
    assert EmulatedEngine(nominal).core.performance == StepCost.for_hardware("H100", "llama-3.1-8b")
    assert not math.isclose(settings.load_delay_s, 2.0)
