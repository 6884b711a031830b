"""Lumpy prefill: a chunked-prefill engine prefills a whole prompt in one step, so the mean step
is slower than a step carrying the mean prefill, and more so for a narrow decode step than for a
wide verify step; the tuner learns the mean prompt from the engine's counters."""

from __future__ import annotations

import json
import math

import pytest

from specpilot.tuner import Observation, SpecConfig, StepCost, TunerSettings, TunerState
from specpilot.tuner._model.step_cost import LUMPY_PROMPTS_PER_STEP, PREFILL_CHUNK_TOKENS
from specpilot.tuner.policy.learn import Belief, learn
from specpilot.tuner.priors import prior_curves

COST = StepCost.for_hardware("H100", "llama-3.1-8b")
RATIO = 5.25  # prompt tokens per output token, as the Azure conversation trace has
CONTEXT = 727


def per_token(method: str, batch: int, k: int, length: float, prompt: float | None) -> float:
    step = COST.serving_step_time(
        method=method,
        decode_batch=batch,
        k=k,
        tokens_per_request=length,
        prefill_per_output_token=RATIO,
        kv_tokens=batch * CONTEXT,
        prompt_tokens=prompt,
    )
    return step / length


def test_without_a_mean_prompt_the_prefill_rides_in_every_step() -> None:
    averaged = COST.step_time(
        method="none", decode_batch=32, k=0, prefill_tokens=round(RATIO * 32), kv_tokens=32 * 727
    )
    assert per_token("none", 32, 0, 1.0, None) == averaged
    assert per_token("none", 32, 0, 1.0, 0.0) == averaged


def test_lumps_slow_the_mean_step_and_a_decode_step_more_than_a_verify_step() -> None:
    none_gap = per_token("none", 63, 0, 1.0, 1155.0) / per_token("none", 63, 0, 1.0, None)
    spec_gap = per_token("eagle3", 38, 3, 2.8, 1155.0) / per_token("eagle3", 38, 3, 2.8, None)
    assert none_gap > spec_gap > 1.0
    assert none_gap > 1.05  # the bias a shared correction carried from one config to the other


def test_the_expectation_is_over_a_poisson_count_of_prompts_per_step() -> None:
    prompt, batch = 1000.0, 4
    mean = RATIO * batch / prompt  # prompts per step: 0.021

    def step(prompts: int) -> float:
        return COST.step_time(
            method="none",
            decode_batch=batch,
            k=0,
            prefill_tokens=round(prompts * prompt),
            kv_tokens=batch * CONTEXT,
        )

    by_hand = sum(math.exp(-mean) * mean**n / math.factorial(n) * step(n) for n in range(8))
    assert per_token("none", batch, 0, 1.0, prompt) == pytest.approx(by_hand, rel=1e-6)


def test_many_prompts_per_step_or_huge_ones_fall_back_to_the_averages_limits() -> None:
    # tiny prompts: many per step, the count's spread vanishes against its mean
    tiny = RATIO * 256 / (LUMPY_PROMPTS_PER_STEP + 1)
    assert per_token("none", 256, 0, 1.0, tiny) == per_token("none", 256, 0, 1.0, None)
    # a prompt past the engine's budget is prefilled in budget-sized chunks, not in one step
    huge = per_token("none", 16, 0, 1.0, 50 * PREFILL_CHUNK_TOKENS)
    assert huge == per_token("none", 16, 0, 1.0, PREFILL_CHUNK_TOKENS)


def window(prompt_per_s: float | None, finished_per_s: float | None) -> Observation:
    return Observation(
        engine="vllm",
        window_s=60.0,
        pods=("p",),
        acceptance_length=None,
        acceptance_rate=None,
        acceptance_per_position=None,
        running_requests=8.0,
        waiting_requests=0.0,
        kv_cache_usage=None,
        generation_tokens_per_s=400.0,
        tpot_p50_s=None,
        tpot_p95_s=None,
        ttft_p95_s=None,
        prompt_tokens_per_s=prompt_per_s,
        requests_per_s=finished_per_s,
    )


def test_the_state_learns_the_mean_prompt_and_keeps_it_across_a_restart() -> None:
    state = TunerState.initial(SpecConfig(), 0.0, prior_curves((SpecConfig(),)))
    assert state.prompt_tokens == 0.0
    state = state.learn_traffic(window(2000.0, None), None)
    assert state.prompt_tokens == 0.0  # no request finished: nothing to divide by
    state = state.learn_traffic(window(2000.0, 2.0), None)
    assert state.prompt_tokens == pytest.approx(1000.0)
    state = state.learn_traffic(window(4000.0, 2.0), None)
    assert 1000.0 < state.prompt_tokens < 2000.0  # a moving estimate
    assert TunerState.from_json(state.to_json()) == state
    older = json.loads(state.to_json())
    del older["prompt_tokens"]  # a state persisted before the estimate existed
    assert TunerState.from_json(json.dumps(older)).prompt_tokens == 0.0


def test_the_tuner_prices_lumps_only_when_its_settings_say_so() -> None:
    """On by default (TunerSettings.lumpy_prefill); the mean prompt is learned either way."""
    state = TunerState.initial(SpecConfig(), 0.0, prior_curves((SpecConfig(),)))
    assert TunerSettings(candidates=(SpecConfig(),)).lumpy_prefill
    beliefs = {}
    for lumpy in (False, True):
        settings = TunerSettings(candidates=(SpecConfig(),), lumpy_prefill=lumpy)
        belief = learn(window(2000.0, 2.0), state, settings, COST, 60.0)
        assert isinstance(belief, Belief)
        assert belief.state.prompt_tokens == pytest.approx(1000.0)
        beliefs[lumpy] = belief.surrogate.prompt_tokens
    assert beliefs == {False: 0.0, True: pytest.approx(1000.0)}
