"""Contract with SGLang 0.5.23: its own argument definitions and speculative checks accept what
SpecPilot renders, and resolve to the steps / topk / draft tokens / adaptive buckets SpecPilot
meant. Only SGLang's argument layer runs here, in-process: `ServerArgs.add_cli_args`,
`ServerArgs.from_cli_args`, then `handle_speculative_decoding`, which from_cli_args does not
call on its own (a live SGLang server: test_sglang_server.py).

The checks run with `--device cuda`, the deployment target: SGLang's hook refuses DFLASH on any
other device, which the last test pins."""

from __future__ import annotations

from pathlib import Path

import pytest

from specpilot.runtime.engines import LaunchSettings, get_adapter
from specpilot.runtime.engines.sglang import DEFAULT_ADAPTIVE_BUCKETS
from specpilot.tuner import SpecConfig

from conftest import SGLANG_PYTHON, run_engine_script

pytestmark = pytest.mark.engines
SGLANG = get_adapter("sglang")
# page size is resolved by another hook in SGLang's full pipeline; tree checks compare it.
DEVICE_ARGS = ("--device", "cuda", "--page-size", "1")


def sample_configs(models: Path) -> list[SpecConfig]:
    llama = str(models / "llama")
    configs: list[SpecConfig] = []
    for k in (1, 3, 7):
        configs += [
            SpecConfig(method="ngram", num_speculative_tokens=k),
            SpecConfig(method="eagle", num_speculative_tokens=k, draft_model=llama),
            SpecConfig(method="eagle3", num_speculative_tokens=k, draft_model=llama),
            SpecConfig(method="mtp", num_speculative_tokens=k),
            SpecConfig(method="draft_model", num_speculative_tokens=k, draft_model=llama),
            SpecConfig(method="dflash", num_speculative_tokens=k * 2 + 1, draft_model=llama),
            SpecConfig(
                method="eagle3",
                num_speculative_tokens=k,
                draft_model=llama,
                schedule=((1, 4, k), (5, 16, min(k, 1)), (17, 48, 0)),
            ),
            SpecConfig(method="mtp", num_speculative_tokens=k, schedule=((1, 8, k), (9, 64, 0))),
        ]
    configs += [
        SpecConfig(
            method="eagle",
            num_speculative_tokens=5,
            draft_model=llama,
            eagle_topk=4,
            num_draft_tokens=8,
        ),
        SpecConfig(method="ngram", num_speculative_tokens=5, eagle_topk=2, num_draft_tokens=8),
        SpecConfig(
            method="eagle3", num_speculative_tokens=3, draft_model=llama, engine_adaptive=True
        ),
        SpecConfig(method="mtp", num_speculative_tokens=7, engine_adaptive=True),
        SpecConfig(),
    ]
    return configs


def render_all(
    configs: list[SpecConfig], tmp_path: Path, device_args: tuple[str, ...]
) -> list[list[str]]:
    cases = []
    for index, config in enumerate(configs):
        sidecars = tmp_path / f"case{index}"
        sidecars.mkdir()
        base = LaunchSettings(
            model=str(Path(__file__).resolve().parents[2] / ".cache/tiny-models/llama"),
            sidecar_dir=str(sidecars),
            extra_args=device_args,
        )
        for path, content in SGLANG.sidecar_files(config, base).items():
            Path(path).write_text(content)
        cases.append(SGLANG.render(config, base))
    return cases


def test_sglang_accepts_and_resolves_every_rendered_config(models: Path, tmp_path: Path) -> None:
    configs = sample_configs(models)
    results = run_engine_script(
        SGLANG_PYTHON, "sglang_validate.py", render_all(configs, tmp_path, DEVICE_ARGS)
    )
    for config, result in zip(configs, results, strict=True):
        assert result["ok"], f"{config.describe()}: {result['error']}"
        resolved = result["resolved"]
        assert resolved["enable_metrics"] is True
        if not config.speculative:
            assert resolved["algorithm"] is None
            continue
        algorithm = SGLANG.capabilities[config.method].engine_name
        assert resolved["algorithm"] == {"NEXTN": "EAGLE"}.get(algorithm, algorithm)
        assert resolved["draft_model_path"] == config.draft_model
        k = config.max_k
        if config.method == "dflash":
            assert (resolved["num_steps"], resolved["eagle_topk"]) == (1, 1)
            assert resolved["num_draft_tokens"] == k + 1
        else:
            assert resolved["num_steps"] == k
            assert resolved["eagle_topk"] == (config.eagle_topk or 1)
            assert resolved["num_draft_tokens"] == (config.num_draft_tokens or k + 1)
        adaptive = config.schedule is not None or config.engine_adaptive
        assert resolved["adaptive"] is adaptive
        if config.schedule is not None:
            assert resolved["adaptive_candidate_steps"] == sorted({t[2] for t in config.schedule})
        if config.engine_adaptive:  # SGLang's default buckets, as SpecPilot's table says
            expected = sorted({k for ks in DEFAULT_ADAPTIVE_BUCKETS.values() for k in ks})
            assert resolved["adaptive_candidate_steps"] == expected


def test_sglang_refuses_what_it_cannot_run(models: Path, tmp_path: Path) -> None:
    llama = str(models / "llama")
    dflash_on_cpu = SpecConfig(method="dflash", num_speculative_tokens=15, draft_model=llama)
    unknown = ["--model-path", llama, "--speculative-algorithm", "SUFFIX"]
    [cpu_result, unknown_result] = run_engine_script(
        SGLANG_PYTHON,
        "sglang_validate.py",
        [*render_all([dflash_on_cpu], tmp_path, ("--device", "cpu")), unknown],
    )
    assert (
        not cpu_result["ok"]
        and "DFLASH speculative decoding is not supported" in cpu_result["error"]
    )
    # SpecPilot's table has no suffix for SGLang; SGLang agrees.
    assert not unknown_result["ok"] and "Unknown speculative algorithm" in unknown_result["error"]
