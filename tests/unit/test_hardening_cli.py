"""CLI conventions and hostile CLI input: `--version`, help on every option with its default,
one meaning of `--json`, progress only on a terminal, and a user's mistake (a missing fit file,
a duration too short to measure, an infinite or NaN trace, a malformed schedule) as one
`error:` line with exit code 2, never a traceback or a hang."""

from __future__ import annotations

import argparse
import io
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specpilot.operator.app.cli import build_parser, main
from specpilot.runtime.emulator.server import build_parser as emulate_parser
from specpilot.runtime.emulator.server import parse_settings
from specpilot.tuner import ConfigError


def subcommands(parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            yield from action.choices.items()


def every_parser() -> list[tuple[str, argparse.ArgumentParser]]:
    top = build_parser()
    return [("specpilot", top), *subcommands(top), ("emulate (own)", emulate_parser())]


def one_line_error(capsys: pytest.CaptureFixture[str], *fields: str) -> str:
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    for field in fields:
        assert field in err, err
    return err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("specpilot ") and out.split()[1][0].isdigit()


def test_every_option_of_every_subcommand_has_help_and_shows_its_default() -> None:
    walked = every_parser()
    names = {name for name, _ in walked}
    assert {"bench", "simulate", "probe", "run", "demo", "operator", "render"} <= names
    missing = []
    for name, parser in walked:
        # compared without whitespace: help wraps a long default at its hyphens (a clone
        # under /tmp/ci-clone printed "/tmp/ci- clone/.venv/bin/python")
        text = "".join(parser.format_help().split())
        for action in parser._actions:
            if not action.option_strings or isinstance(action, argparse._HelpAction):
                continue
            flag = action.option_strings[-1]
            if not (action.help or "").strip():
                missing.append(f"{name} {flag}: no help")
            default = action.default
            meaningful = default not in (None, False, [], argparse.SUPPRESS)
            if meaningful and "".join(f"default: {default}".split()) not in text:
                missing.append(f"{name} {flag}: default {default!r} not shown")
    assert not missing, "\n".join(missing)


def test_json_means_a_path_or_stdout_everywhere() -> None:
    having = []
    for name, parser in every_parser():
        for action in parser._actions:
            if "--json" in action.option_strings:
                having.append(name)
                assert action.nargs == "?" and action.const == "-", name
                assert action.default is None and "PATH" in (action.help or ""), name
    assert {"bench", "simulate", "probe"} <= set(having)


SIMULATE = ["simulate", "--method", "ngram", "--k", "3", "--concurrency", "4", "--duration", "30"]


def test_simulate_json_goes_to_stdout_or_to_a_file(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert main([*SIMULATE, "--json", "-"]) == 0
    captured = capsys.readouterr()
    to_stdout = json.loads(captured.out)
    assert captured.err == ""  # no progress escape codes off a terminal
    path = tmp_path / "simulate.json"
    assert main([*SIMULATE, "--json", str(path)]) == 0
    assert json.loads(path.read_text()) == to_stdout
    assert main(SIMULATE) == 0
    human = capsys.readouterr().out
    assert "concurrency 4:" in human and "x (" in human


def test_progress_is_drawn_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    terminal = Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    assert main([*SIMULATE, "--json", "-"]) == 0
    assert "simulate" in terminal.getvalue()


def test_simulate_duration_too_short_to_measure_is_an_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main([*SIMULATE[:-2], "--duration", "10"]) == 2
    one_line_error(capsys, "--duration", "warmup")
    quiet = ["simulate", "--method", "ngram", "--rps", "0.001", "--duration", "21"]
    assert main(quiet) == 2  # nothing arrives after the warmup: no speedup to report
    one_line_error(capsys, "--duration", "nothing was measured")
    assert main([*SIMULATE[:-2], "--duration", "inf"]) == 2
    one_line_error(capsys, "--duration")


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (None, "a readable file"),
        (b"{not json", "fixed_s"),
        (b"[1, 2, 3]", "not a JSON object"),
        (b'{"fixed_s": NaN, "per_token_s": 1e-5, "per_kv_token_s": 0}', "not finite"),
        (b'{"fixed_s": 1e-3, "per_token_s": 1e-5}', "per_kv_token_s"),
        (
            b'{"fixed_s": 1e-3, "per_token_s": 1e-5, "per_kv_token_s": 0, '
            b'"per_extra_token_s": Infinity}',
            "not finite",
        ),
        (
            b'{"fixed_s": 1e-3, "per_token_s": 1e-5, "per_kv_token_s": 0, '
            b'"per_extra_token_s": "fast"}',
            "per_extra_token_s",
        ),
        (
            b'{"fixed_s": 1e-3, "per_token_s": 1e-5, "per_kv_token_s": 0, '
            b'"per_extra_token_s": -1e-4}',
            "non-negative",
        ),
        (b"\xff\xfe", "fixed_s"),
    ],
)
def test_a_bad_step_time_fit_file_is_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, content: bytes | None, why: str
) -> None:
    path = tmp_path / "fit.json"
    if content is not None:
        path.write_bytes(content)
    argv = ["run", "--emulate", "--model", "m", "--step-time-fit", str(path), "--ticks", "1"]
    assert main(argv) == 2
    one_line_error(capsys, "--step-time-fit", why)


@pytest.mark.parametrize(
    ("trace", "where"),
    [
        (b"t,rps,chat\n0,inf,1\n60,1,1\n", "line 2 column rps"),
        (b"t,rps,chat\n0,nan,1\n60,1,1\n", "line 2 column rps"),
        (b"t,rps,chat\n0,1,1\n1e400,1,1\n", "line 3 column t"),
        (b"t,rps,chat\n0,1,NaN\n60,1,1\n", "line 2 column chat"),
        (b"t,rps,chat\n0,1\xff,1\n60,1,1\n", "UTF-8"),
        (b"t,rps,chat\n0,1e300,1\n60,1,1\n", "10,000,000 requests"),
        (b"t,rps,chat\n0,0,1\n60,0,1\n", "at least one request"),
        (b'{"timestamp": NaN, "input_length": 1, "output_length": 2}\n', "timestamp"),
    ],
)
def test_bench_refuses_infinite_nan_and_undecodable_traces_at_once(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, trace: bytes, where: str
) -> None:
    path = tmp_path / ("trace.jsonl" if trace.startswith(b"{") else "trace.csv")
    path.write_bytes(trace)
    assert main(["bench", "--trace", str(path), "--workers", "1"]) == 2
    one_line_error(capsys, where)


@pytest.mark.parametrize(
    ("flag", "value", "allowed"),
    [
        ("--peak-load", "1e12", "at most"),
        ("--time-scale", "1e-300", "at least"),
        ("--poisson", "1:1e12:2", "fractions of capacity up to"),
        ("--window", "inf", "finite"),
    ],
)
def test_bench_refuses_shaping_that_would_never_end(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, flag: str, value: str, allowed: str
) -> None:
    path = tmp_path / "trace.csv"
    path.write_text("t,rps,chat\n0,1,1\n60,1,1\n")
    assert main(["bench", "--trace", str(path), "--workers", "1", flag, value]) == 2
    one_line_error(capsys, flag, allowed)


SCHEDULE_VALUES = st.one_of(
    st.integers(-2, 600),
    st.text(max_size=3),
    st.floats(),
    st.none(),
    st.booleans(),
    st.lists(st.integers(), max_size=2),
)


@settings(max_examples=60, deadline=None)
@given(
    schedule=st.one_of(
        st.lists(st.lists(SCHEDULE_VALUES, min_size=3, max_size=3), max_size=3),
        SCHEDULE_VALUES,
    ),
    method=st.sampled_from(["ngram", "eagle3"]) | SCHEDULE_VALUES,
)
def test_parse_never_tracebacks_on_malformed_schedules(schedule: object, method: object) -> None:
    body = {
        "method": method,
        "model": "d",
        "num_speculative_tokens": 3,
        "num_speculative_tokens_per_batch_size": schedule,
    }
    argv = ["parse", "--engine", "vllm", "--", "--model", "m"]
    argv += ["--speculative-config", json.dumps(body)]
    assert main(argv) in (0, 2)


def test_emulate_port_zero_is_kept_and_out_of_range_ports_are_refused() -> None:
    assert parse_settings(["--model", "m", "--port", "0"]).port == 0
    assert parse_settings(["--model", "m"]).port == 8000
    assert parse_settings(["--engine", "sglang", "--model-path", "m"]).port == 30000
    with pytest.raises(ConfigError, match="--port"):
        parse_settings(["--model", "m", "--port", "70000"])
    with pytest.raises(ConfigError, match="--max-model-len"):
        parse_settings(["--model", "m", "--max-model-len", "0"])
    assert parse_settings(["--model", "m", "--max-model-len", "4096"]).context_tokens == 4096


def test_bench_refuses_an_initial_config_outside_the_space(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "trace.csv"
    path.write_text("t,rps,chat\n0,1,1\n60,1,1\n")
    code = main(["bench", "--trace", str(path), "--workers", "1", "--initial", "static:eagle3 K=9"])
    assert code == 2
    one_line_error(capsys, "--initial", "no-spec", "static:eagle3 K=3")
