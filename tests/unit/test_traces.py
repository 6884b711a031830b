"""Rate-curve traces: the CSV format and its named errors. A policy run over one in fast mode:
test_bench.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from specpilot.runtime.traces import load_trace, parse_trace
from specpilot.tuner import ConfigError

TRACES = Path(__file__).resolve().parents[2] / "bench" / "traces"
# The rate curves (per-request traces such as azure_conv_2023.csv: test_request_traces.py)
SHIPPED = sorted(
    p for p in TRACES.glob("*.csv") if p.read_text(encoding="utf-8").startswith("t,rps,")
)


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
        ("t,rps,chat\n0,x,1\n1,0,1\n", "trace line 2 column rps"),
        ("t,rps,chat\n0,inf,1\n1,0,1\n", "trace line 2 column rps"),
        ("t,rps,chat\n0,NaN,1\n1,0,1\n", "trace line 2 column rps"),
        ("t,rps,chat\n0,-1,1\n1,0,1\n", "trace line 2 column rps"),
        ("t,rps,chat\n0,1,nan\n1,0,1\n", "trace line 2 column chat"),
        ("t,rps,chat\n0,1,1\n1e400,0,1\n", "trace line 3 column t"),
        ("t,rps,chat\n0,1,1\nnan,0,1\n", "trace line 3 column t"),
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


def test_a_trace_that_is_not_utf8_names_the_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "latin1.csv"
    path.write_bytes("t,rps,chat\n0,1,1\n1,0,1 # café\n".encode("latin-1"))
    with pytest.raises(ConfigError) as info:
        load_trace(path)
    assert info.value.field == f"{path} line 3 column 12" and "UTF-8" in str(info.value)
