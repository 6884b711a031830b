"""Engine adapters: exact flags, render/parse round trip, and named refusals."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from specpilot.runtime.engines import (
    ADAPTERS,
    EngineArgsError,
    EngineCapabilityError,
    LaunchSettings,
    get_adapter,
    max_batch_from_args,
)
from specpilot.runtime.engines.sglang import adaptive_config_json
from specpilot.tuner import ConfigError, SpecConfig

from strategies import spec_configs

BASE = LaunchSettings(model="/models/target", served_model_name="m", port=8000)
VLLM = get_adapter("vllm")
SGLANG = get_adapter("sglang")


@pytest.mark.parametrize("engine", sorted(ADAPTERS))
@given(data=st.data())
def test_parse_inverts_render(engine: str, data: st.DataObject) -> None:
    adapter = get_adapter(engine)
    config = data.draw(spec_configs(adapter.capabilities, engine))
    args = adapter.render(config, BASE)
    assert adapter.parse(args, adapter.sidecar_files(config, BASE)) == config


@pytest.mark.parametrize("engine", sorted(ADAPTERS))
@given(data=st.data())
def test_configs_an_engine_cannot_run_raise_a_named_error(engine: str, data: st.DataObject) -> None:
    adapter = get_adapter(engine)
    config = data.draw(spec_configs())
    try:
        adapter.check(config)
    except EngineCapabilityError as exc:
        assert exc.field in str(exc) and exc.allowed
        with pytest.raises(EngineCapabilityError):
            adapter.render(config, BASE)
    else:
        assert (
            adapter.parse(adapter.render(config, BASE), adapter.sidecar_files(config, BASE))
            == config
        )


def test_vllm_flags_are_exact() -> None:
    config = SpecConfig(
        method="eagle3",
        num_speculative_tokens=5,
        draft_model="/models/eagle3",
        schedule=[(1, 16, 5), (17, 32, 4), (33, 64, 3), (65, 128, 1), (129, 1024, 0)],
    )
    assert VLLM.render(config, BASE) == [
        "--model",
        "/models/target",
        "--served-model-name",
        "m",
        "--host",
        "0.0.0.0",
        "--port",
        "8000",
        "--speculative-config",
        '{"method":"eagle3","model":"/models/eagle3","num_speculative_tokens":5,'
        '"num_speculative_tokens_per_batch_size":[[1,16,5],[17,32,4],[33,64,3],[65,128,1],[129,1024,0]]}',
    ]
    ngram = SpecConfig(
        method="ngram", num_speculative_tokens=3, prompt_lookup_min=2, prompt_lookup_max=4
    )
    assert VLLM.render(ngram, BASE)[-1] == (
        '{"method":"ngram","num_speculative_tokens":3,"prompt_lookup_min":2,"prompt_lookup_max":4}'
    )
    assert "--speculative-config" not in VLLM.render(SpecConfig(), BASE)


# Expected SGLang flags pinned from SGLang 0.5.23's speculative_hook.py rules.
SGLANG_CASES = [
    (
        SpecConfig(method="eagle3", num_speculative_tokens=3, draft_model="/d"),
        [
            "--speculative-algorithm",
            "EAGLE3",
            "--speculative-draft-model-path",
            "/d",
            "--speculative-num-steps",
            "3",
            "--speculative-eagle-topk",
            "1",
            "--speculative-num-draft-tokens",
            "4",
        ],
    ),
    (
        SpecConfig(
            method="eagle",
            num_speculative_tokens=5,
            draft_model="/d",
            eagle_topk=4,
            num_draft_tokens=8,
        ),
        [
            "--speculative-algorithm",
            "EAGLE",
            "--speculative-draft-model-path",
            "/d",
            "--speculative-num-steps",
            "5",
            "--speculative-eagle-topk",
            "4",
            "--speculative-num-draft-tokens",
            "8",
        ],
    ),
    (
        SpecConfig(method="mtp", num_speculative_tokens=2),
        [
            "--speculative-algorithm",
            "NEXTN",
            "--speculative-num-steps",
            "2",
            "--speculative-eagle-topk",
            "1",
            "--speculative-num-draft-tokens",
            "3",
        ],
    ),
    (
        SpecConfig(method="draft_model", num_speculative_tokens=4, draft_model="/small"),
        [
            "--speculative-algorithm",
            "STANDALONE",
            "--speculative-draft-model-path",
            "/small",
            "--speculative-num-steps",
            "4",
            "--speculative-eagle-topk",
            "1",
            "--speculative-num-draft-tokens",
            "5",
        ],
    ),
    (
        SpecConfig(method="ngram", num_speculative_tokens=3),
        [
            "--speculative-algorithm",
            "NGRAM",
            "--speculative-num-steps",
            "3",
            "--speculative-ngram-max-bfs-breadth",
            "1",
            "--speculative-num-draft-tokens",
            "4",
        ],
    ),
    (
        SpecConfig(method="dflash", num_speculative_tokens=15, draft_model="/df"),
        [
            "--speculative-algorithm",
            "DFLASH",
            "--speculative-draft-model-path",
            "/df",
            "--speculative-num-draft-tokens",
            "16",
        ],
    ),
]


@pytest.mark.parametrize(("config", "speculative_flags"), SGLANG_CASES)
def test_sglang_flags_are_exact(config: SpecConfig, speculative_flags: list[str]) -> None:
    head = [
        "--model-path",
        "/models/target",
        "--served-model-name",
        "m",
        "--host",
        "0.0.0.0",
        "--port",
        "8000",
        "--enable-metrics",
    ]
    assert SGLANG.render(config, BASE) == head + speculative_flags


def test_sglang_always_enables_metrics() -> None:
    assert SGLANG.render(SpecConfig(), BASE)[-1] == "--enable-metrics"


def test_sglang_schedule_becomes_adaptive_config_file() -> None:
    config = SpecConfig(
        method="eagle3",
        num_speculative_tokens=3,
        draft_model="/d",
        schedule=[(1, 7, 3), (8, 31, 1), (32, 256, 0)],
    )
    base = LaunchSettings(model="/t", sidecar_dir="/etc/sp")
    args = SGLANG.render(config, base)
    assert args[-3:] == [
        "--speculative-adaptive",
        "--speculative-adaptive-config",
        "/etc/sp/sglang-speculative-adaptive.json",
    ]
    files = SGLANG.sidecar_files(config, base)
    body = json.loads(files["/etc/sp/sglang-speculative-adaptive.json"])
    assert {key: entry["candidate_steps"] for key, entry in body.items()} == {
        "1": [3],
        "8": [1],
        "32": [0],
    }


def test_sglang_parses_hand_written_adaptive_config(tmp_path) -> None:
    path = tmp_path / "adaptive.json"
    path.write_text(json.dumps({"1": {"candidate_steps": [3]}, "16": {"candidate_steps": [0]}}))
    args = [
        "--speculative-algorithm",
        "eagle",
        "--speculative-draft-model",
        "/d",
        "--speculative-num-steps",
        "3",
        "--speculative-adaptive",
        f"--speculative-adaptive-config={path}",
        "--max-running-requests",
        "64",
    ]
    config = SGLANG.parse(args)
    assert config.schedule == ((1, 15, 3), (16, 64, 0))


CAPABILITY_ERRORS = [
    ("sglang", SpecConfig(method="suffix", num_speculative_tokens=3), "method", "ngram"),
    ("vllm", SpecConfig(method="eagle3", num_speculative_tokens=3), "draft_model", "draft model"),
    (
        "sglang",
        SpecConfig(method="dflash", num_speculative_tokens=15),
        "draft_model",
        "draft model",
    ),
    (
        "vllm",
        SpecConfig(
            method="eagle",
            num_speculative_tokens=3,
            draft_model="d",
            eagle_topk=4,
            num_draft_tokens=8,
        ),
        "eagle_topk",
        "chain",
    ),
    (
        "sglang",
        SpecConfig(method="ngram", num_speculative_tokens=3, schedule=[(1, 8, 3)]),
        "schedule",
        "eagle",
    ),
    (
        "sglang",
        SpecConfig(
            method="eagle",
            num_speculative_tokens=3,
            draft_model="d",
            eagle_topk=2,
            num_draft_tokens=5,
            schedule=[(1, 8, 3)],
        ),
        "eagle_topk",
        "chain",
    ),
    (
        "sglang",
        SpecConfig(
            method="eagle3",
            num_speculative_tokens=5,
            draft_model="d",
            schedule=[(1, 8, 3), (9, 64, 0)],
        ),
        "num_speculative_tokens",
        "[0, 3]",
    ),
    (
        "sglang",
        SpecConfig(method="ngram", num_speculative_tokens=3, prompt_lookup_max=4),
        "prompt_lookup_min/prompt_lookup_max",
        "None",
    ),
]


@pytest.mark.parametrize(("engine", "config", "field", "allowed"), CAPABILITY_ERRORS)
def test_impossible_combinations_are_refused(
    engine: str, config: SpecConfig, field: str, allowed: str
) -> None:
    with pytest.raises(EngineCapabilityError) as info:
        get_adapter(engine).render(config, BASE)
    assert info.value.field == field and allowed in info.value.allowed


@pytest.mark.parametrize(
    ("engine", "flag"),
    [
        ("vllm", "--speculative-config={}"),
        ("vllm", "--spec-tokens"),
        ("vllm", "-sc"),
        ("sglang", "--speculative-num-steps"),
    ],
)
def test_speculative_flags_in_extra_args_are_refused(engine: str, flag: str) -> None:
    base = LaunchSettings(model="/t", extra_args=("--max-model-len", "4096", flag, "3"))
    with pytest.raises(EngineArgsError, match="belong to SpecPilot") as info:
        get_adapter(engine).render(SpecConfig(), base)
    assert info.value.field == "extra_args"


@pytest.mark.parametrize(
    ("engine", "args", "expected"),
    [
        ("vllm", ("--max-model-len", "4096"), None),
        ("vllm", ("--max-num-seqs", "64"), 64),
        ("vllm", ("--max-num-seqs=32", "--max-model-len", "1024"), 32),
        ("vllm", ("--max_num_seqs", "8"), 8),
        ("sglang", ("--max-running-requests", "48"), 48),
        ("sglang", ("--max-num-seqs", "64"), None),  # not SGLang's flag: its default stands
    ],
)
def test_the_engines_batch_cap_is_read_from_its_extra_args(
    engine: str, args: tuple[str, ...], expected: int | None
) -> None:
    assert max_batch_from_args(get_adapter(engine), args) == expected


@pytest.mark.parametrize(
    ("args", "flag", "allowed"),
    [
        (("--max-num-seqs", "many"), "--max-num-seqs", "an integer"),
        (("--max-num-seqs=0",), "--max-num-seqs", "a positive integer"),
        (("--max-num-seqs", "8", "--max_num_seqs", "9"), "--max_num_seqs", "at most once"),
        (("--max-num-seqs",), "--max-num-seqs", "a value after the flag"),
    ],
)
def test_a_bad_batch_cap_names_its_flag(args: tuple[str, ...], flag: str, allowed: str) -> None:
    with pytest.raises(EngineArgsError) as info:
        max_batch_from_args(get_adapter("vllm"), args)
    assert info.value.field == flag and allowed in info.value.allowed


PARSE_ERRORS = [
    ("vllm", ["--speculative-config", "{not json"], "--speculative-config", "JSON object"),
    (
        "vllm",
        ["--speculative-config", '{"num_speculative_tokens":3}'],
        "--speculative-config.method",
        "ngram",
    ),
    (
        "vllm",
        ["--speculative-config", '{"method":"medusa","model":"m","num_speculative_tokens":3}'],
        "--speculative-config.method",
        "eagle3",
    ),
    (
        "vllm",
        [
            "--speculative-config",
            '{"method":"ngram","num_speculative_tokens":3,"disable_by_batch_size":4}',
        ],
        "--speculative-config",
        "num_speculative_tokens_per_batch_size",
    ),
    (
        "vllm",
        ["--speculative-config", '{"method":"ngram","num_speculative_tokens":40}'],
        "--speculative-config.num_speculative_tokens",
        "1..16",
    ),
    (
        "vllm",
        ["--spec-method", "ngram", "--speculative-config", '{"method":"ngram"}'],
        "--spec-method",
        "either",
    ),
    ("vllm", ["--speculative-config.method", "ngram"], "--speculative-config.method", "<json>"),
    ("vllm", ["-sc", "{}", "-sc", "{}"], "-sc", "at most once"),
    ("sglang", ["--speculative-algorithm", "MEDUSA"], "--speculative-algorithm", "EAGLE3"),
    (
        "sglang",
        ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "d"],
        "--speculative-num-steps",
        "K",
    ),
    (
        "sglang",
        ["--speculative-algorithm", "EAGLE", "--speculative-num-steps", "x"],
        "--speculative-num-steps",
        "integer",
    ),
    (
        "sglang",
        ["--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", "d"],
        "--speculative-num-draft-tokens",
        "block size",
    ),
    (
        "sglang",
        ["--speculative-algorithm", "NGRAM", "--speculative-token-map", "x"],
        "--speculative-token-map",
        "--speculative-num-steps",
    ),
    ("sglang", ["--speculative-num-steps"], "--speculative-num-steps", "a value"),
]


@pytest.mark.parametrize(("engine", "args", "field", "allowed"), PARSE_ERRORS)
def test_malformed_command_lines_raise_named_errors(
    engine: str, args: list[str], field: str, allowed: str
) -> None:
    with pytest.raises(EngineArgsError) as info:
        get_adapter(engine).parse(args)
    assert info.value.field == field and allowed in info.value.allowed


def test_vllm_parse_reads_engine_semantics() -> None:
    # Deprecated model-specific MTP names, shorthand flags, unsorted/gapped schedules and K
    # above the maximum all mean what vLLM 0.32 makes of them.
    assert VLLM.parse(
        ["-sc", '{"method":"deepseek_mtp","num_speculative_tokens":1}']
    ) == SpecConfig(method="mtp", num_speculative_tokens=1)
    assert VLLM.parse(["--spec-method", "ngram", "--spec-tokens=4"]) == SpecConfig(
        method="ngram", num_speculative_tokens=4
    )
    schedule = "[[33,64,1],[1,8,9],[17,32,2]]"
    parsed = VLLM.parse(
        [
            "--speculative-config",
            f'{{"method":"ngram","num_speculative_tokens":3,"num_speculative_tokens_per_batch_size":{schedule}}}',
        ]
    )
    assert parsed.schedule == ((1, 16, 3), (17, 32, 2), (33, 64, 1))


def test_unknown_engine_names_the_known_ones() -> None:
    with pytest.raises(ConfigError, match=r"sglang \| vllm|vllm \| sglang"):
        get_adapter("tgi")


def test_adaptive_config_json_is_sglang_shaped() -> None:
    body = json.loads(adaptive_config_json(((1, 3, 2), (4, 9, 0))))
    assert all(isinstance(entry["candidate_steps"], list) for entry in body.values())
    assert sorted(body) == ["1", "4"]


def test_sglang_default_adaptive_mode_round_trips() -> None:
    args = [
        "--speculative-algorithm",
        "EAGLE3",
        "--speculative-draft-model-path",
        "/d",
        "--speculative-num-steps",
        "3",
        "--speculative-adaptive",
    ]
    config = SGLANG.parse(args)
    assert config == SpecConfig(
        method="eagle3", num_speculative_tokens=3, draft_model="/d", engine_adaptive=True
    )
    assert SGLANG.render(config, BASE)[-1] == "--speculative-adaptive"
    assert SGLANG.sidecar_files(config, BASE) == {}
    with pytest.raises(EngineCapabilityError, match="adaptive"):
        VLLM.render(config, BASE)
    with pytest.raises(EngineCapabilityError, match=r"\[1, 3, 5, 7\]"):
        SGLANG.parse([*args[:5], "4", "--speculative-adaptive"])


def test_sglang_multi_candidate_config_files_are_refused(tmp_path) -> None:
    path = tmp_path / "adaptive.json"
    path.write_text(json.dumps({"1": {"candidate_steps": [1, 3]}}))
    args = [
        "--speculative-algorithm",
        "EAGLE",
        "--speculative-draft-model-path",
        "/d",
        "--speculative-num-steps",
        "3",
        "--speculative-adaptive",
        "--speculative-adaptive-config",
        str(path),
    ]
    with pytest.raises(EngineArgsError, match="exactly one K"):
        SGLANG.parse(args)
