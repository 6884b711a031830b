"""SpecConfig: validation with named errors, normalisation, value semantics, JSON round-trip."""

from __future__ import annotations

import json

import pytest
from hypothesis import given

from specpilot.tuner import ConfigError, SpecConfig

from strategies import spec_configs


@given(spec_configs())
def test_json_round_trip_is_exact(config: SpecConfig) -> None:
    assert SpecConfig.from_json(config.to_json()) == config
    assert SpecConfig.from_dict(json.loads(config.to_json())) == config


@given(spec_configs())
def test_equal_values_hash_equal(config: SpecConfig) -> None:
    twin = SpecConfig.from_dict(config.to_dict())
    assert twin == config and hash(twin) == hash(config)
    assert len({config, twin}) == 1


@given(spec_configs())
def test_k_for_batch_stays_within_max_k(config: SpecConfig) -> None:
    for batch in (1, 2, 7, 64, 1000):
        assert 0 <= config.k_for_batch(batch) <= config.max_k


def test_frozen() -> None:
    config = SpecConfig(method="ngram", num_speculative_tokens=3)
    with pytest.raises(AttributeError):
        config.method = "eagle"  # type: ignore[misc]


def test_chain_defaults_have_one_spelling() -> None:
    spelled_out = SpecConfig(
        method="eagle3",
        num_speculative_tokens=3,
        draft_model="d",
        eagle_topk=1,
        num_draft_tokens=4,
    )
    assert spelled_out == SpecConfig(method="eagle3", num_speculative_tokens=3, draft_model="d")
    assert spelled_out.eagle_topk is None and spelled_out.num_draft_tokens is None


def test_schedule_lookup() -> None:
    config = SpecConfig(
        method="eagle3",
        num_speculative_tokens=5,
        draft_model="d",
        schedule=[[1, 16, 5], [17, 32, 4], [33, 64, 3], [65, 128, 1], [129, 256, 0]],
    )
    assert [config.k_for_batch(b) for b in (1, 16, 17, 40, 100, 200, 999)] == [5, 5, 4, 3, 1, 0, 0]
    assert config.describe() == "eagle3 K=5 sched[1-16:5,17-32:4,33-64:3,65-128:1,129-256:0]"


INVALID = [
    ({"method": "medusa", "num_speculative_tokens": 3}, "method", "none | ngram"),
    ({"method": "ngram"}, "num_speculative_tokens", "1..16"),
    ({"method": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens", "1..16"),
    ({"method": "ngram", "num_speculative_tokens": 17}, "num_speculative_tokens", "1..16"),
    ({"method": "ngram", "num_speculative_tokens": True}, "num_speculative_tokens", "1..16"),
    ({"method": "ngram", "num_speculative_tokens": "3"}, "num_speculative_tokens", "1..16"),
    ({"method": "none", "num_speculative_tokens": 3}, "num_speculative_tokens", "None"),
    ({"method": "ngram", "num_speculative_tokens": 3, "draft_model": "d"}, "draft_model", "None"),
    (
        {"method": "eagle", "num_speculative_tokens": 3, "draft_model": " "},
        "draft_model",
        "non-empty",
    ),
    (
        {"method": "eagle", "num_speculative_tokens": 3, "prompt_lookup_max": 4},
        "prompt_lookup_max",
        "None",
    ),
    (
        {
            "method": "ngram",
            "num_speculative_tokens": 3,
            "prompt_lookup_min": 5,
            "prompt_lookup_max": 2,
        },
        "prompt_lookup_min",
        "<= prompt_lookup_max",
    ),
    ({"method": "dflash", "num_speculative_tokens": 3, "eagle_topk": 4}, "eagle_topk", "None"),
    (
        {"method": "eagle", "num_speculative_tokens": 3, "eagle_topk": 4},
        "num_draft_tokens",
        "2..13",
    ),
    (
        {"method": "eagle", "num_speculative_tokens": 3, "eagle_topk": 4, "num_draft_tokens": 14},
        "num_draft_tokens",
        "2..13",
    ),
    (
        {"method": "eagle", "num_speculative_tokens": 3, "num_draft_tokens": 7},
        "num_draft_tokens",
        "K+1",
    ),
    ({"method": "ngram", "num_speculative_tokens": 3, "schedule": []}, "schedule", "at least one"),
    (
        {"method": "ngram", "num_speculative_tokens": 3, "schedule": [[2, 8, 3]]},
        "schedule[0].first_batch",
        "1",
    ),
    (
        {"method": "ngram", "num_speculative_tokens": 3, "schedule": [[1, 8, 3], [10, 20, 1]]},
        "schedule[1].first_batch",
        "9",
    ),
    (
        {"method": "ngram", "num_speculative_tokens": 3, "schedule": [[1, 8, 3], [9, 4, 1]]},
        "schedule[1].last_batch",
        "9..",
    ),
    (
        {"method": "ngram", "num_speculative_tokens": 3, "schedule": [[1, 8, 4]]},
        "schedule[0].k",
        "0..3",
    ),
    ({"method": "ngram", "num_speculative_tokens": 3, "schedule": [[1, 8]]}, "schedule", "triples"),
    (
        {"method": "ngram", "num_speculative_tokens": 3, "speculative_tokens": 3},
        "speculative_tokens",
        "num_speculative_tokens",
    ),
]


@pytest.mark.parametrize(("data", "field", "allowed"), INVALID)
def test_invalid_config_names_field_and_allowed_values(
    data: dict, field: str, allowed: str
) -> None:
    with pytest.raises(ConfigError) as info:
        SpecConfig.from_dict(data)
    assert info.value.field == field
    assert allowed in info.value.allowed
    assert field in str(info.value) and allowed in str(info.value)
    assert isinstance(info.value, ValueError)


def test_bad_json_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="JSON object"):
        SpecConfig.from_json("{method: ngram")
