"""The `specpilot` command: render/parse round trip, and user mistakes as one-line errors."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from specpilot.operator.app.cli import main
from specpilot.tuner import SpecConfig


def test_render_then_parse_round_trips(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    config = SpecConfig(
        method="eagle3",
        num_speculative_tokens=3,
        draft_model="/d",
        schedule=[(1, 8, 3), (9, 64, 0)],
    )
    code = main(
        [
            "render",
            "--engine",
            "sglang",
            "--model",
            "/t",
            "--config",
            config.to_json(),
            "--sidecar-dir",
            str(tmp_path),
            "--write-sidecars",
            "--",
            "--tp-size",
            "2",
        ]
    )
    assert code == 0
    args = shlex.split(capsys.readouterr().out)
    assert args[-2:] == ["--tp-size", "2"]
    assert (tmp_path / "sglang-speculative-adaptive.json").exists()
    assert main(["parse", "--engine", "sglang", "--", *args]) == 0
    assert SpecConfig.from_json(capsys.readouterr().out) == config


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["render", "--engine", "vllm", "--model", "m", "--config", '{"method":"eagle9"}'],
            "method='eagle9' is invalid: allowed none | ngram",
        ),
        (
            [
                "render",
                "--engine",
                "sglang",
                "--model",
                "m",
                "--config",
                '{"method":"suffix","num_speculative_tokens":3}',
            ],
            "SGLang has no 'suffix'",
        ),
        (["parse", "--engine", "vllm", "--", "--speculative-config", "{oops"], "JSON object"),
        (["observe", "--engine", "vllm"], "--url"),
        (
            ["observe", "--engine", "vllm", "--url", "http://127.0.0.1:9/metrics", "--window", "0"],
            "cannot scrape",
        ),
    ],
)
def test_user_mistakes_are_one_line_errors(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err
    assert "Traceback" not in err


def test_console_script_is_installed() -> None:
    done = subprocess.run(
        [
            str(Path(sys.executable).parent / "specpilot"),
            "render",
            "--engine",
            "vllm",
            "--model",
            "m",
            "--config",
            '{"method":"ngram","num_speculative_tokens":2}',
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    body = json.loads(shlex.split(done.stdout)[-1])
    assert body == {"method": "ngram", "num_speculative_tokens": 2}
