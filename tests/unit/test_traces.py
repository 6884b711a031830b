"""Traces: the CSV format, its named errors, and a policy replayed over one in fast mode."""

from __future__ import annotations

from pathlib import Path

import pytest

from specpilot.runtime.emulator.fast_replay import run_trace, static
from specpilot.runtime.traces import load_trace, parse_trace
from specpilot.tuner import ConfigError, SpecConfig, StepCost

SHIPPED = sorted((Path(__file__).resolve().parents[2] / "bench" / "traces").glob("*.csv"))


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_shipped_traces_load(path: Path) -> None:
    trace = load_trace(path)
    assert trace.duration_s > 0 and len(trace.rows) >= 3
    for row in trace.rows:
        assert abs(sum(p for _, p in row.mix) - 1.0) < 1e-9


def test_rate_and_mix_change_at_rows() -> None:
    trace = parse_trace("t,rps,chat,code\n0,2,1,0\n10,8,1,3\n20,0,1,0\n")
    assert trace.rate_at(5) == 2 and trace.rate_at(15) == 8
    assert dict(trace.row_at(15).mix) == {"chat": 0.25, "code": 0.75}
    assert trace.duration_s == 20


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("time,rps,chat\n0,1,1\n1,0,1\n", "trace header"),
        ("t,rps,poetry\n0,1,1\n1,0,1\n", "trace header task"),
        ("t,rps,chat\n0,1,1\n0,2,1\n", "trace line 3 column t"),
        ("t,rps,chat\n0,x,1\n1,0,1\n", "trace line 2"),
        ("t,rps,chat\n0,1\n1,0,1\n", "trace line 2"),
        ("t,rps,chat\n0,1,0\n1,0,1\n", "trace line 2"),
        ("t,rps,chat\n5,1,1\n9,0,1\n", "trace line 2 column t"),
        ("t,rps,chat\n0,1,1\n", "trace"),
    ],
)
def test_malformed_traces_name_the_place(text: str, field: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_trace(text)
    assert info.value.field == field


def test_replay_serves_the_trace_and_counts_restarts() -> None:
    trace = parse_trace("t,rps,chat\n0,4,1\n60,4,1\n120,0,1\n")
    cost = StepCost.for_hardware("H100", "llama-3.1-8b")
    plain = run_trace(trace, static(SpecConfig()), SpecConfig(), cost, name="plain", window_s=30.0)
    eagle = SpecConfig(method="eagle3", num_speculative_tokens=3, draft_model="d")

    def flip(_obs, current, now):  # switch once, at the first window boundary
        return eagle if now >= 30 else current

    flipped = run_trace(
        trace, flip, SpecConfig(), cost, name="flip", window_s=30.0, restart_downtime_s=5.0
    )
    assert plain.restarts == 0 and flipped.restarts == 1
    assert plain.completed > 300  # ~4 req/s for 120 s, minus the tail still running
    assert flipped.configs[0] == "no speculation" and flipped.configs[-1] == eagle.describe()
    assert flipped.tpot_ms_mean is not None and plain.tpot_ms_mean is not None
    assert flipped.tpot_ms_mean < plain.tpot_ms_mean  # speculation at low load: faster tokens


def test_a_free_switch_keeps_what_was_running() -> None:
    trace = parse_trace("t,rps,summarize\n0,6,1\n60,0,1\n")
    cost = StepCost.for_hardware("H100", "llama-3.1-8b")
    eagle = SpecConfig(method="eagle3", num_speculative_tokens=3, draft_model="d")

    def flip(_obs, current, now):
        return eagle if now >= 20 else current

    def replay(free: bool):
        return run_trace(
            trace, flip, SpecConfig(), cost, name="f", window_s=20.0, restart_downtime_s=0.0,
            free_switches=free,
        )  # fmt: skip

    restarted, free = replay(False), replay(True)
    assert restarted.restarts == free.restarts == 1
    # A restart recomputes the running requests' long prompts; a free switch does not.
    assert free.e2e_s_mean is not None and restarted.e2e_s_mean is not None
    assert free.e2e_s_mean < restarted.e2e_s_mean


def test_bench_command_compares_every_policy(tmp_path: Path) -> None:
    from specpilot.operator.app.cli import main

    trace = tmp_path / "short.csv"
    trace.write_text("t,rps,chat,code\n0,2,1,0\n60,20,0,1\n120,0,1,0\n")
    out = tmp_path / "report.json"
    assert main(["bench", "--trace", str(trace), "--window", "30", "--json", str(out)]) == 0
    import json

    report = json.loads(out.read_text())
    names = [p["policy"] for p in report["policies"]]
    assert {"no speculation", "vllm-eagle3-table", "specpilot"} <= set(names)
    assert report["oracle_goodput_tok_s"] > 0 and report["specpilot_vs_best_static"] > 0
    # 20 req/s of code stays under max-num-seqs on an H100: no window counts as saturated.
    assert report["saturation"] == {
        "windows": 0,
        "specpilot_vs_no_speculation": None,
        "worst_window": None,
    }
    assert report["oracle_vs_best_static"] > 0
