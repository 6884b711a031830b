"""Per-request traces: the Azure and Mooncake readers, their one-line errors naming the line,
load shaping (time scale, peak load) on both kinds of trace, and the Poisson sweep."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from specpilot.runtime.load_shaping import (
    TaskShapes,
    TraceShapes,
    amplify_to_peak_load,
    busiest_minute_rps,
    parse_poisson_sweep,
    peak_load_factor,
    poisson_requests,
    scale_to_peak_load,
    time_scale,
)
from specpilot.runtime.request_traces import (
    RequestTrace,
    TraceRequest,
    load_any_trace,
    load_azure_trace,
    load_mooncake_trace,
    parse_task_mix,
)
from specpilot.runtime.traces import Trace, parse_trace
from specpilot.tuner import ConfigError

AZURE = Path(__file__).resolve().parents[2] / "bench" / "traces" / "azure_conv_2023.csv"
AZURE_SAMPLE = (
    "TIMESTAMP,ContextTokens,GeneratedTokens\n"
    "2023-11-16 18:15:46.6805900,374,44\n"
    "2023-11-16 18:15:50.9951690,396,109\n"
    "2023-11-16 18:15:51.2224670,879,55\n"
)
MOONCAKE_SAMPLE = (
    '{"timestamp": 0, "input_length": 6955, "output_length": 52, "hash_ids": [0, 1, 2]}\n'
    '{"timestamp": 1500, "input_length": 512, "output_length": 9, "hash_ids": [3]}\n'
    "\n"
    '{"timestamp": 1750, "input_length": 40, "output_length": 300}\n'
)
TASK_SHAPES = {"chat": (512, 256), "code": (768, 384)}


def write(tmp_path: Path, name: str, content: str | bytes) -> Path:
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return path


def test_azure_sample_reads_with_seven_fractional_digits(tmp_path: Path) -> None:
    trace = load_azure_trace(write(tmp_path, "conv.csv", AZURE_SAMPLE))
    assert trace.name == "conv" and trace.source.endswith("conv.csv")
    assert [r.arrival_s for r in trace.requests] == pytest.approx([0.0, 4.314579, 4.541877])
    assert [(r.prompt_tokens, r.output_tokens) for r in trace.requests] == [
        (374, 44), (396, 109), (879, 55),
    ]  # fmt: skip
    assert {r.task for r in trace.requests} == {"chat"} and trace.task_mix == (("chat", 1.0),)


def test_mooncake_sample_reads_ms_and_ignores_other_keys(tmp_path: Path) -> None:
    trace = load_mooncake_trace(write(tmp_path, "mc.jsonl", MOONCAKE_SAMPLE))
    assert trace.requests == (
        TraceRequest(0.0, 6955, 52, "chat"),
        TraceRequest(1.5, 512, 9, "chat"),
        TraceRequest(1.75, 40, 300, "chat"),
    )
    assert trace.duration_s == 1.75


def test_tasks_come_from_the_callers_mix_seeded(tmp_path: Path) -> None:
    path = write(tmp_path, "mc.jsonl", MOONCAKE_SAMPLE * 200)  # 600 requests, ts repeating
    mix = parse_task_mix("chat=3,code=1")
    one = load_mooncake_trace(path, mix=mix, seed=7, backwards_tolerance_s=10)
    again = load_mooncake_trace(path, mix=mix, seed=7, backwards_tolerance_s=10)
    assert one == again and one.task_mix == (("chat", 0.75), ("code", 0.25))
    share = sum(r.task == "code" for r in one.requests) / len(one.requests)
    assert 0.18 < share < 0.32
    with pytest.raises(ConfigError):
        parse_task_mix("poetry=1")


def test_load_any_trace_tells_the_formats_apart(tmp_path: Path) -> None:
    azure = load_any_trace(write(tmp_path, "a.csv", AZURE_SAMPLE))
    mooncake = load_any_trace(write(tmp_path, "m.txt", MOONCAKE_SAMPLE))
    curve = load_any_trace(write(tmp_path, "c.csv", "t,rps,chat\n0,2,1\n60,0,1\n"))
    assert isinstance(azure, RequestTrace) and len(azure.requests) == 3
    assert isinstance(mooncake, RequestTrace) and len(mooncake.requests) == 3
    assert isinstance(curve, Trace) and curve.duration_s == 60
    with pytest.raises(ConfigError, match=r"line 1 column header"):
        load_any_trace(write(tmp_path, "x.csv", "when,what\n1,2\n"))


def test_the_shipped_azure_trace() -> None:
    trace = load_any_trace(AZURE)
    assert isinstance(trace, RequestTrace)
    assert len(trace.requests) == 19_366
    assert trace.requests[:2] == (
        TraceRequest(0.0, 374, 44, "chat"),
        TraceRequest(pytest.approx(4.314579), 396, 109, "chat"),  # type: ignore[arg-type]
    )
    assert 3_500 < trace.duration_s < 3_503
    assert busiest_minute_rps(trace) == pytest.approx(522 / 60)
    assert statistics.median(r.prompt_tokens for r in trace.requests) == 1020


HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
ROW = "2023-11-16 18:15:46.6805900,374,44\n"


@pytest.mark.parametrize(
    ("name", "content", "where"),
    [
        ("empty.csv", "", "line 1 column header"),
        ("header-only.csv", HEADER, "line 2 column -"),
        ("bad-header.csv", "TIME,Context,Generated\n" + ROW, "line 1 column header"),
        ("columns.csv", HEADER + ROW + "2023-11-16 18:15:47.0,5\n", "line 3 column -"),
        (
            "number.csv",
            HEADER + ROW + "2023-11-16 18:15:47.0,12x,5\n",
            "line 3 column ContextTokens",
        ),
        (
            "float.csv",
            HEADER + ROW + "2023-11-16 18:15:47.0,12,5.5\n",
            "line 3 column GeneratedTokens",
        ),
        (
            "negative.csv",
            HEADER + ROW + ROW + "2023-11-16 18:15:47.0,-3,5\n",
            "line 4 column ContextTokens",
        ),
        ("stamp.csv", HEADER + "2023-11-16 25:15:46.68,374,44\n", "line 2 column TIMESTAMP"),
        (
            "digits.csv",
            HEADER + "2023-11-16 18:15:46.6805900123,374,44\n",
            "line 2 column TIMESTAMP",
        ),
        (
            "backwards.csv",
            HEADER + ROW + "2023-11-16 18:15:40.0,374,44\n",
            "line 3 column TIMESTAMP",
        ),
        (
            "latin1.csv",
            (HEADER + ROW + "2023-11-16 18:15:47.0,1,1 caf\xe9\n").encode("latin-1"),
            "line 3 column 30",
        ),
        ("empty.jsonl", "\n\n", "line 3 column -"),
        (
            "json.jsonl",
            MOONCAKE_SAMPLE + '{"timestamp": 2000, "input_length": 4,\n',
            "line 5 column 39",
        ),
        ("list.jsonl", "[1, 2, 3]\n", "line 1 column 1"),
        ("missing.jsonl", '{"timestamp": 1, "input_length": 4}\n', "line 1 column output_length"),
        (
            "negative.jsonl",
            '{"timestamp": 1, "input_length": -4, "output_length": 1}\n',
            "line 1 column input_length",
        ),
        (
            "text.jsonl",
            '{"timestamp": "soon", "input_length": 4, "output_length": 1}\n',
            "line 1 column timestamp",
        ),
        (
            "bool.jsonl",
            '{"timestamp": 1, "input_length": true, "output_length": 1}\n',
            "line 1 column input_length",
        ),
        (
            "backwards.jsonl",
            MOONCAKE_SAMPLE + '{"timestamp": 100, "input_length": 4, "output_length": 1}\n',
            "line 5 column timestamp",
        ),
    ],
)
def test_malformed_files_get_one_line_naming_the_line(
    tmp_path: Path, name: str, content: str | bytes, where: str
) -> None:
    path = write(tmp_path, name, content)
    with pytest.raises(ConfigError) as info:
        load_any_trace(path)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"{path} {where}="), message


def test_small_jitter_backwards_is_tolerated_and_sorted(tmp_path: Path) -> None:
    text = HEADER + ROW + "2023-11-16 18:15:48.0,1,2\n" + "2023-11-16 18:15:47.5,3,4\n"
    trace = load_azure_trace(write(tmp_path, "jitter.csv", text))
    assert [r.prompt_tokens for r in trace.requests] == [374, 3, 1]
    with pytest.raises(ConfigError, match="line 4 column TIMESTAMP"):
        load_azure_trace(write(tmp_path, "strict.csv", text), backwards_tolerance_s=0.1)


def test_timestamps_with_an_offset_count_in_absolute_time(tmp_path: Path) -> None:
    text = HEADER + "2024-05-10 10:00:00.5+02:00,1,1\n" + "2024-05-10T08:00:01Z,1,1\n"
    trace = load_azure_trace(write(tmp_path, "offset.csv", text))
    assert [r.arrival_s for r in trace.requests] == pytest.approx([0.0, 0.5])


def test_time_scale_compresses_request_traces_and_rate_curves(tmp_path: Path) -> None:
    trace = load_azure_trace(write(tmp_path, "conv.csv", AZURE_SAMPLE))
    fast = time_scale(trace, 2.0)
    assert [r.arrival_s for r in fast.requests] == pytest.approx([0.0, 2.1572895, 2.2709385])
    assert [r.prompt_tokens for r in fast.requests] == [r.prompt_tokens for r in trace.requests]
    curve = time_scale(parse_trace("t,rps,chat\n0,2,1\n60,8,1\n120,0,1\n"), 4.0)
    assert [(r.t, r.rps) for r in curve.rows] == [(0, 8), (15, 32), (30, 0)]
    with pytest.raises(ConfigError, match="--time-scale"):
        time_scale(trace, 0.0)


@pytest.mark.parametrize(("peak", "capacity"), [(1.2, 30.0), (0.5, 12.0), (1.0, 4.0), (3.0, 41.7)])
def test_peak_load_makes_the_busiest_minute_f_times_capacity(peak: float, capacity: float) -> None:
    trace = load_any_trace(AZURE)
    assert isinstance(trace, RequestTrace)
    scaled = scale_to_peak_load(trace, peak, capacity)
    assert len(scaled.requests) == len(trace.requests)  # compressed, not thinned
    assert busiest_minute_rps(scaled) == pytest.approx(peak * capacity, abs=1 / 60)
    factor = peak_load_factor(trace, peak, capacity)
    assert scaled.duration_s == pytest.approx(trace.duration_s / factor)


def test_peak_load_on_a_rate_curve() -> None:
    curve = parse_trace("t,rps,chat\n0,2,1\n30,10,1\n50,4,1\n300,1,1\n600,0,1\n")
    # the busiest minute is 30..90 s: 10 rps for 20 s, then 4 rps for 40 s
    assert busiest_minute_rps(curve) == pytest.approx((10 * 20 + 4 * 40) / 60)
    for peak, capacity in [(1.2, 15.0), (0.5, 2.0)]:  # at most 1,560 requests
        scaled = scale_to_peak_load(curve, peak, capacity)
        assert busiest_minute_rps(scaled) == pytest.approx(peak * capacity, rel=1e-6)
        assert [r.mix for r in scaled.rows] == [r.mix for r in curve.rows]


def test_peak_load_beyond_the_trace_is_refused() -> None:
    tiny = RequestTrace("tiny", (TraceRequest(0, 1, 1, "chat"), TraceRequest(1, 1, 1, "chat")), "x")
    with pytest.raises(ConfigError, match="--peak-load"):
        scale_to_peak_load(tiny, 1.0, 10.0)  # 600 requests in a minute from 2
    with pytest.raises(ConfigError, match="capacity"):
        scale_to_peak_load(tiny, 1.0, 0.0)


@pytest.mark.parametrize(("peak", "capacity"), [(1.2, 21.7), (1.2, 86.8), (0.5, 6.0)])
def test_amplified_peak_load_keeps_the_clock_and_the_request_shapes(
    peak: float, capacity: float
) -> None:
    trace = load_any_trace(AZURE)
    assert isinstance(trace, RequestTrace)
    scaled = amplify_to_peak_load(trace, peak, capacity, seed=5)
    assert isinstance(scaled, RequestTrace)
    factor = peak * capacity / busiest_minute_rps(trace)
    assert len(scaled.requests) == pytest.approx(factor * len(trace.requests), rel=0.02)
    assert scaled.duration_s == pytest.approx(trace.duration_s, rel=0.01)  # an hour stays one
    # in expectation: a draw moves the busiest minute by a few percent
    assert busiest_minute_rps(scaled) == pytest.approx(peak * capacity, rel=0.1)
    shapes = {(r.prompt_tokens, r.output_tokens, r.task) for r in trace.requests}
    assert {(r.prompt_tokens, r.output_tokens, r.task) for r in scaled.requests} <= shapes
    arrivals = [r.arrival_s for r in scaled.requests]
    assert arrivals == sorted(arrivals)
    assert amplify_to_peak_load(trace, peak, capacity, seed=5) == scaled


def test_amplified_peak_load_on_a_rate_curve_scales_its_rates() -> None:
    curve = parse_trace("t,rps,chat\n0,2,1\n30,10,1\n50,4,1\n300,1,1\n600,0,1\n")
    scaled = amplify_to_peak_load(curve, 1.2, 15.0)
    assert isinstance(scaled, Trace)
    assert busiest_minute_rps(scaled) == pytest.approx(1.2 * 15.0, rel=1e-9)
    assert [r.t for r in scaled.rows] == [r.t for r in curve.rows]


def test_poisson_mean_rate_and_determinism() -> None:
    shape = TaskShapes.of(TASK_SHAPES, {"chat": 1, "code": 1})
    trace = poisson_requests(12.0, 3_600.0, shape, seed=3)
    assert len(trace.requests) / 3_600 == pytest.approx(12.0, rel=0.02)  # ~43,200: sd ~0.5%
    gaps = [
        b.arrival_s - a.arrival_s for a, b in zip(trace.requests, trace.requests[1:], strict=False)
    ]
    assert statistics.mean(gaps) == pytest.approx(1 / 12, rel=0.02)
    assert statistics.stdev(gaps) == pytest.approx(1 / 12, rel=0.05)  # exponential: sd = mean
    assert poisson_requests(12.0, 3_600.0, shape, seed=3) == trace
    assert poisson_requests(12.0, 3_600.0, shape, seed=4) != trace
    assert {r.task for r in trace.requests} == {"chat", "code"}
    chat = [r.prompt_tokens for r in trace.requests if r.task == "chat"]
    assert min(chat) >= 256 and max(chat) <= 768
    assert trace.requests[-1].arrival_s < 3_600.0


def test_poisson_rates_share_their_random_numbers() -> None:
    source = RequestTrace("src", (TraceRequest(0, 100, 10, "code"),), "x", (("code", 1.0),))
    slow = poisson_requests(2.0, 600.0, TraceShapes.of(source), seed=1)
    fast = poisson_requests(4.0, 300.0, TraceShapes.of(source), seed=1)
    assert len(slow.requests) == len(fast.requests)
    assert [r.arrival_s / 2 for r in slow.requests] == pytest.approx(
        [r.arrival_s for r in fast.requests]
    )
    assert {(r.task, r.prompt_tokens) for r in slow.requests} == {("code", 100)}


def test_poisson_sweep_spec() -> None:
    assert parse_poisson_sweep("0.1:1.3:8") == pytest.approx(
        [0.1, 0.2714286, 0.4428571, 0.6142857, 0.7857143, 0.9571429, 1.1285714, 1.3]
    )
    assert parse_poisson_sweep("0.5:0.5:1") == (0.5,)
    assert parse_poisson_sweep("0.2:1:3")[-1] == 1.0


BAD_SPECS = (
    "|0.1:1.3|0.1:1.3:8:2|a:1:3|0.1:1.3:2.5|0:1:3|1.3:0.1:8|0.1:1.3:0|0.1:1.3:1|0.1:inf:3|-1:1:3"
)


@pytest.mark.parametrize("spec", BAD_SPECS.split("|"))
def test_malformed_poisson_specs_say_the_format(spec: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_poisson_sweep(spec)
    assert str(info.value).startswith(f"--poisson={spec!r} is invalid: allowed start:stop:count")
    assert "\n" not in str(info.value)
