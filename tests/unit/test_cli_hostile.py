"""Hostile input on the `specpilot` command line: free text with shell metacharacters,
newlines and 10 kB values goes through `render` and `parse` as single arguments (quoted for a
shell when printed, and parsed back unchanged), and a number no run could use (NaN, infinity,
a negative count, a port past 65535), a URL with a control character or an interpreter that
does not exist is one `error:` line naming the flag and exit code 2, before anything starts:
never a traceback, never a run that cannot end."""

from __future__ import annotations

import contextlib
import io
import json
import shlex

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specpilot.operator.app.cli import main

HOSTILE = [
    "$(touch /tmp/pwned)",
    "`id`; rm -rf / #",
    "a && b || c | d > /etc/passwd < x",
    "'\"\\ \t*?[]{}~!",
    "line one\nline two\r\n",
    "${HF_TOKEN}",
    "ünïcødé ✓ 模型",
    "x" * 10_240,
]
CONFIGS = {
    "vllm": {"method": "ngram", "num_speculative_tokens": 3},
    "sglang": {"method": "eagle3", "num_speculative_tokens": 3, "draft_model": "d $(x)"},
}


def one_line_error(err: str, *fields: str) -> None:
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    for field in fields:
        assert field in err, err


def _round_trip(capsys: pytest.CaptureFixture[str], engine: str, text: str) -> None:
    config = json.dumps(CONFIGS[engine])
    argv = ["render", "--engine", engine, "--config", config, "--model", f"org/{text}"]
    argv += ["--served-model-name", text, "--", "--chat-template", text]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    args = shlex.split(printed)  # what a shell would pass: each value whole
    assert args[args.index("--served-model-name") + 1] == text
    assert args[-2:] == ["--chat-template", text] and f"org/{text}" in args
    assert main(["parse", "--engine", engine, "--", *args]) == 0
    assert json.loads(capsys.readouterr().out) == CONFIGS[engine]


@pytest.mark.parametrize("engine", sorted(CONFIGS))
@pytest.mark.parametrize("text", HOSTILE, ids=range(len(HOSTILE)))
def test_render_quotes_hostile_text_and_parse_reads_it_back(
    capsys: pytest.CaptureFixture[str], engine: str, text: str
) -> None:
    _round_trip(capsys, engine, text)


@settings(max_examples=50, deadline=None)
@given(text=st.text(st.characters(exclude_characters="\x00"), min_size=1, max_size=60))
def test_render_and_parse_round_trip_any_text(text: str) -> None:
    out = io.StringIO()  # (capsys is function-scoped: hypothesis runs many examples in one)
    config = json.dumps(CONFIGS["vllm"])
    with contextlib.redirect_stdout(out):
        code = main(["render", "--engine", "vllm", "--config", config, f"--model={text}",
                     "--", "--chat-template", text])  # fmt: skip
    assert code == 0
    args = shlex.split(out.getvalue())
    assert args[args.index("--model") + 1] == text and args[-1] == text


NO_RUN_COULD_USE = [
    (["observe", "--engine", "vllm", "--url", "http://127.0.0.1:1/", "--window", "nan"],
     "--window"),
    (["observe", "--engine", "vllm", "--url", "http://127.0.0.1:1/", "--interval", "inf"],
     "--interval"),
    (["observe", "--engine", "vllm", "--prometheus", "http://127.0.0.1:1", "--window", "-1"],
     "--window"),
    (["observe", "--engine", "vllm", "--url", "http://127.0.0.1:1/\nx"], "cannot scrape"),
    (["probe", "--max-seconds", "nan"], "--max-seconds"),
    (["probe", "--device", "$(reboot)", "--max-seconds", "1"], "--device"),
    (["render", "--engine", "vllm", "--config", "{}", "--model", "m", "--port", "99999"],
     "--port"),
    (["emulate", "--engine", "vllm", "--model", "m", "--load-delay", "nan"], "--load-delay"),
    (["emulate", "--engine", "vllm", "--model", "m", "--load-delay", "-1"], "--load-delay"),
    # run: refused before the engine starts (and an interpreter that is not there, at once)
    *[
        (["run", "--model", "m", "--python", "/nonexistent/python3", flag, value], flag)
        for flag, value in [
            ("--window", "nan"), ("--window", "0"), ("--min-dwell", "inf"),
            ("--restart-downtime", "nan"), ("--slo-tpot-p95-ms", "nan"), ("--port", "0"),
            ("--port", "65536"), ("--ticks", "-1"), ("--restart-budget", "-1"),
            ("--objective", "fastest"),
        ]
    ],
    (["run", "--model", "m", "--python", "/nonexistent/python3", "--objective", "goodput"],
     "--slo-tpot-p95-ms"),
    (["run", "--model", "m", "--python", "/nonexistent/python3", "--ticks", "1"],
     "cannot start '/nonexistent/python3'"),
    (["simulate", "--method", "ngram", "--rps", "nan"], "rps"),
    (["simulate", "--method", "ngram", "--concurrency", "-1"], "concurrency"),
    (["simulate", "--method", "ngram", "--rps", "1", "--gpu", "$(reboot)"], "gpu"),
    (["simulate", "--method", "ngram", "--rps", "1", "--duration", "inf"], "duration"),
    # operator: refused before it looks for a cluster (there is none at this kubeconfig)
    (["operator", "--kubeconfig", "/nonexistent", "--liveness-port", "99999"], "--liveness-port"),
    (["operator", "--kubeconfig", "/nonexistent", "--metrics-port", "-1"], "--metrics-port"),
    (["operator", "--kubeconfig", "/nonexistent", "--peering", "$(x)"], "--peering"),
    (["operator", "--kubeconfig", "/nonexistent", "--standalone", "--standalone-lifetime", "0"],
     "--standalone-lifetime"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "named"), NO_RUN_COULD_USE, ids=[" ".join(a[:1] + a[-2:]) for a, _ in NO_RUN_COULD_USE]
)
def test_a_value_no_run_could_use_is_one_error_line(
    capsys: pytest.CaptureFixture[str], argv: list[str], named: str
) -> None:
    try:
        code = main(argv)
    except SystemExit as exc:  # refused by argparse itself: usage, then one error line
        assert exc.code == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err
        one_line_error(err[err.index("error: ") :], named)
        return
    assert code == 2
    one_line_error(capsys.readouterr().err, named)
