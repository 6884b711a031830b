"""The yardstick's metric definitions (runtime/serving_metrics.py) pinned on hand-computed
requests: TTFT, TPOT (vLLM's 0 for a 1-token request in goodput), E2EL, ITL from the histogram,
attainment and goodput per tier, a failed request counted as a miss with its wait, thresholds
met exactly, empty input, arrival windows, and the ITL histogram's stated resolution."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specpilot.runtime.serving_metrics import (
    ITL_BIN_COUNT,
    ITL_HIGH_S,
    ITL_LOW_S,
    ITL_RELATIVE_ERROR,
    NO_GAPS,
    TIERS,
    ItlCounts,
    ItlHistogram,
    RequestRecord,
    SloTier,
    per_window,
    summarize,
)

# Six requests on a 10 s trace. Tiers (TTFT / TPOT): tight 0.45 / 0.025, standard 1 / 0.05,
# relaxed 2 / 0.1 s. Met: t(ight), s(tandard), r(elaxed).
#
#    arrival first finished tokens TTFT  TPOT            E2EL  met
# A  0.0     0.45  1.45     41     0.45  1.0/40 = 0.025  1.45  t s r  exactly at both tight targets
# B  2.0     3.0   4.0      21     1.0   1.0/20 = 0.05   2.0   - s r  exactly at both standard ones
# C  3.0     3.5   3.5      1      0.5   undefined -> 0  0.5   - s r  1 token: judged on TTFT
# D  4.0     5.5   9.5      41     1.5   4.0/40 = 0.1    5.5   - - r  TPOT exactly at relaxed
# E  6.0     6.25  -        10     0.25  -               1.0   - - -  failed: dropped at 7.0
# F  8.0     -     -        0      2.0   -               2.0   - - -  failed: waiting at the end
# E and F count with their wait: E's E2EL 7.0 - 6.0, F's TTFT and E2EL 10.0 - 8.0.
#
# A streams its 40 later tokens as 20 chunks of 2, 0.05 s apart (20 gaps); B 20 chunks 0.05 s
# apart; D 40 chunks 0.1 s apart; E streamed 9 gaps of 0.025 s before it was dropped.
A = RequestRecord(0.0, 0.45, 1.45, 41, itl=ItlCounts.from_gaps([0.05] * 20))
B = RequestRecord(2.0, 3.0, 4.0, 21, itl=ItlCounts.from_gaps([0.05], counts=[20]))
C = RequestRecord(3.0, 3.5, 3.5, 1)
D = RequestRecord(4.0, 5.5, 9.5, 41, itl=ItlCounts.from_gaps(np.full(40, 0.1)))
E = RequestRecord(
    6.0, 6.25, None, 10, failed=True, given_up_s=7.0, itl=ItlCounts.from_gaps([0.025] * 9)
)
F = RequestRecord(8.0, None, None, 0, failed=True)
RECORDS = [A, B, C, D, E, F]


def test_per_request_definitions() -> None:
    assert A.ttft_s == 0.45 and A.tpot_s == 0.025 and A.e2el_s == 1.45
    assert B.ttft_s == 1.0 and B.tpot_s == 0.05 and B.e2el_s == 2.0
    # 1 token: TPOT is undefined (vLLM: `if output_len > 1` before computing it).
    assert C.ttft_s == 0.5 and C.tpot_s is None and C.e2el_s == 0.5
    assert D.tpot_s == 0.1
    # Failed: no TPOT, no E2EL of its own; its wait is what the user lived.
    assert E.ttft_s == 0.25 and E.tpot_s is None and E.e2el_s is None
    assert E.wait_s(trace_end_s=10.0) == 1.0
    assert F.ttft_s is None and F.wait_s(trace_end_s=10.0) == 2.0


def test_summary_of_the_hand_computed_trace() -> None:
    s = summarize(RECORDS, 10.0)
    assert (s.requests, s.completed, s.failed) == (6, 4, 2)
    # A, B, C, D completed in 10 s; their tokens 41 + 21 + 1 + 41 = 104 (E's 10 do not count).
    assert s.request_throughput == pytest.approx(0.4)
    assert s.output_tok_s == pytest.approx(10.4)
    # TTFT over all six (E real, F its wait): sorted 0.25 0.45 0.5 1.0 1.5 2.0.
    # mean 5.7 / 6 = 0.95; median (0.5 + 1.0) / 2; p99 at rank 0.99 * 5 = 4.95:
    # 1.5 + 0.95 * (2.0 - 1.5) = 1.975.
    assert s.ttft_ms_mean == pytest.approx(950.0)
    assert s.ttft_ms_median == pytest.approx(750.0)
    assert s.ttft_ms_p99 == pytest.approx(1975.0)
    # TPOT over completed requests of >= 2 tokens only (A, B, D; not C): 0.025 0.05 0.1.
    # mean 0.175 / 3; median 0.05; p99 at rank 1.98: 0.05 + 0.98 * 0.05 = 0.099.
    assert s.tpot_ms_mean == pytest.approx(175.0 / 3)
    assert s.tpot_ms_median == pytest.approx(50.0)
    assert s.tpot_ms_p99 == pytest.approx(99.0)
    # E2EL over all six (E and F with their wait): sorted 0.5 1.0 1.45 2.0 2.0 5.5.
    # mean 12.45 / 6 = 2.075; median (1.45 + 2.0) / 2 = 1.725; p99 2.0 + 0.95 * 3.5 = 5.325.
    assert s.e2el_ms_mean == pytest.approx(2075.0)
    assert s.e2el_ms_median == pytest.approx(1725.0)
    assert s.e2el_ms_p99 == pytest.approx(5325.0)
    # ITL pooled: 40 gaps of 0.05 (A, B), 40 of 0.1 (D), 9 of 0.025 (E): 89 gaps.
    # Sorted: ranks 0-8 are 0.025, 9-48 are 0.05, 49-88 are 0.1. Mean (2.0 + 4.0 + 0.225) / 89
    # s, exact; median at rank 44: 0.05; p99 at rank 0.99 * 88 = 87.12: 0.1.
    assert s.itl_ms_mean == pytest.approx(6225.0 / 89, rel=1e-12)
    assert s.itl_ms_median == pytest.approx(50.0, rel=ITL_RELATIVE_ERROR)
    assert s.itl_ms_p99 == pytest.approx(100.0, rel=ITL_RELATIVE_ERROR)
    # Attainment over all six: tight A; standard A B C; relaxed A B C D.
    assert s.slo_attainment == pytest.approx({"tight": 1 / 6, "standard": 3 / 6, "relaxed": 4 / 6})
    # Request goodput = good requests / 10 s; token goodput = their tokens / 10 s.
    assert s.request_goodput == pytest.approx({"tight": 0.1, "standard": 0.3, "relaxed": 0.4})
    assert s.token_goodput_tok_s == pytest.approx({"tight": 4.1, "standard": 6.3, "relaxed": 10.4})


def test_thresholds_are_met_at_or_under_and_missed_just_over() -> None:
    # A sits exactly at tight's 450 ms TTFT and 25 ms TPOT: it counts (vLLM: `s >= r`).
    assert summarize([A], 10.0).slo_attainment["tight"] == 1.0
    later_token = RequestRecord(0.0, math.nextafter(0.45, 1.0), 1.45, 41)
    assert summarize([later_token], 10.0).slo_attainment["tight"] == 0.0
    slower_decode = RequestRecord(0.0, 0.45, math.nextafter(1.45, 2.0), 41)
    assert summarize([slower_decode], 10.0).slo_attainment["tight"] == 0.0


def test_one_token_request_is_judged_on_ttft_alone() -> None:
    # vLLM (benchmarks/serve.py): "if output_len <= 1, we regard tpot as 0 for goodput".
    s = summarize([C], 1.0, tiers=[SloTier("zero-tpot", 0.5, 0.0)])
    assert s.slo_attainment == {"zero-tpot": 1.0}
    assert s.request_goodput == {"zero-tpot": 1.0}
    assert s.token_goodput_tok_s == {"zero-tpot": 1.0}
    # ...and it is left out of the TPOT figures, which have no request left.
    assert (s.tpot_ms_mean, s.tpot_ms_median, s.tpot_ms_p99) == (0.0, 0.0, 0.0)
    assert summarize([C], 1.0, tiers=[SloTier("ttft", 0.49, 1.0)]).slo_attainment == {"ttft": 0.0}


def test_a_failed_request_is_a_miss_even_with_fast_tokens() -> None:
    # E's TTFT (0.25 s) and its streamed gaps would meet tight; it was dropped, so it misses.
    s = summarize([E], 10.0)
    assert s.slo_attainment == {"tight": 0.0, "standard": 0.0, "relaxed": 0.0}
    assert s.request_goodput == {"tight": 0.0, "standard": 0.0, "relaxed": 0.0}
    assert (s.completed, s.failed, s.request_throughput, s.output_tok_s) == (0, 1, 0.0, 0.0)
    assert s.e2el_ms_mean == pytest.approx(1000.0)
    # F waits until the trace end: the default is duration_s, or the one the caller names.
    assert summarize([F], 10.0).e2el_ms_mean == pytest.approx(2000.0)
    assert summarize([F], 10.0, trace_end_s=20.0).ttft_ms_mean == pytest.approx(12000.0)


def test_empty_input_reports_zeros_with_every_key() -> None:
    s = summarize([], 60.0)
    d = s.to_dict()
    assert list(d) == [
        "requests",
        "completed",
        "failed",
        "request_throughput",
        "output_tok_s",
        "ttft_ms_mean",
        "ttft_ms_median",
        "ttft_ms_p99",
        "tpot_ms_mean",
        "tpot_ms_median",
        "tpot_ms_p99",
        "itl_ms_mean",
        "itl_ms_median",
        "itl_ms_p99",
        "e2el_ms_mean",
        "e2el_ms_median",
        "e2el_ms_p99",
        "slo_attainment",
        "request_goodput",
        "token_goodput_tok_s",
    ]
    zeros = {"tight": 0.0, "standard": 0.0, "relaxed": 0.0}
    assert d["slo_attainment"] == d["request_goodput"] == d["token_goodput_tok_s"] == zeros
    assert all(d[key] == 0 for key in list(d)[:17])


def test_to_dict_carries_the_figures() -> None:
    d = summarize(RECORDS, 10.0).to_dict()
    assert d["requests"] == 6 and d["failed"] == 2
    assert d["ttft_ms_p99"] == pytest.approx(1975.0)
    assert d["slo_attainment"] == pytest.approx({"tight": 1 / 6, "standard": 0.5, "relaxed": 2 / 3})


def test_tiers_are_the_published_ones() -> None:
    assert [(t.name, t.ttft_s, t.tpot_s) for t in TIERS] == [
        ("tight", 0.45, 0.025),
        ("standard", 1.0, 0.05),
        ("relaxed", 2.0, 0.1),
    ]


def test_a_producers_histogram_replaces_the_records_gaps() -> None:
    pooled = ItlHistogram()
    pooled.add(0.02, count=3)
    s = summarize(RECORDS, 10.0, itl=pooled)
    assert s.itl_ms_mean == pytest.approx(20.0)
    assert s.itl_ms_median == pytest.approx(20.0, rel=ITL_RELATIVE_ERROR)


def test_per_window_files_requests_by_arrival() -> None:
    first, second = per_window(RECORDS, 5.0, 10.0)
    # [0, 5): A B C D arrived, all completed (D only at 9.5, after its window: it still counts
    # for the load it arrived in). Tight A; standard A B C; relaxed all four.
    assert (first.requests, first.completed, first.failed) == (4, 4, 0)
    assert first.request_throughput == pytest.approx(4 / 5)
    assert first.output_tok_s == pytest.approx(104 / 5)
    assert first.slo_attainment == pytest.approx({"tight": 0.25, "standard": 0.75, "relaxed": 1.0})
    assert first.request_goodput == pytest.approx({"tight": 0.2, "standard": 0.6, "relaxed": 0.8})
    # [5, 10]: E and F, both failed; waits 1.0 and 2.0 (F until the trace end, not the window's).
    assert (second.requests, second.completed, second.failed) == (2, 0, 2)
    assert second.e2el_ms_mean == pytest.approx(1500.0)
    assert second.slo_attainment == {"tight": 0.0, "standard": 0.0, "relaxed": 0.0}
    # Each window pools its own requests' gaps: E's nine 25 ms gaps.
    assert second.itl_ms_mean == pytest.approx(25.0)


def test_per_window_last_window_is_partial_and_empty_windows_are_zero() -> None:
    windows = per_window([RequestRecord(11.0, 11.5, 12.0, 2)], 5.0, 12.0)
    assert [w.duration_s for w in windows] == [5.0, 5.0, 2.0]
    assert [w.requests for w in windows] == [0, 0, 1]
    assert windows[2].request_throughput == pytest.approx(0.5)
    assert windows[0].to_dict()["slo_attainment"] == {"tight": 0.0, "standard": 0.0, "relaxed": 0.0}
    # An arrival at exactly the end joins the last window; float noise adds no sliver window.
    assert len(per_window([RequestRecord(0.7, 0.7, 0.7, 1)], 0.1, 0.7)) == 7
    assert per_window([], 60.0, 60.0)[0].requests == 0


def test_per_window_rejects_arrivals_outside_the_trace() -> None:
    with pytest.raises(ValueError, match="outside the trace"):
        per_window([RequestRecord(10.5, 11.0, 11.0, 1)], 5.0, 10.0)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"arrival_s": 1.0, "first_token_s": 0.5, "finished_s": 2.0, "output_tokens": 2},
        {"arrival_s": 0.0, "first_token_s": 1.0, "finished_s": 0.5, "output_tokens": 2},
        {"arrival_s": 0.0, "first_token_s": None, "finished_s": 1.0, "output_tokens": 1},
        {"arrival_s": 0.0, "first_token_s": 0.1, "finished_s": 0.2, "output_tokens": 0},
        {"arrival_s": 0.0, "first_token_s": 0.1, "finished_s": 0.2, "output_tokens": -1},
        {
            "arrival_s": 0.0,
            "first_token_s": 0.1,
            "finished_s": 1.0,
            "output_tokens": 3,
            "failed": True,
        },
        {
            "arrival_s": 0.0,
            "first_token_s": 1.0,
            "finished_s": None,
            "output_tokens": 3,
            "failed": True,
            "given_up_s": 0.5,
        },
        {
            "arrival_s": 0.0,
            "first_token_s": 0.1,
            "finished_s": 0.2,
            "output_tokens": 2,
            "given_up_s": 0.3,
        },
        {
            "arrival_s": math.nan,
            "first_token_s": None,
            "finished_s": None,
            "output_tokens": 0,
            "failed": True,
        },
    ],
)
def test_inconsistent_records_are_rejected(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        RequestRecord(**kwargs)


def test_summarize_rejects_a_zero_duration() -> None:
    with pytest.raises(ValueError, match="duration"):
        summarize([A], 0.0)


# --- the ITL histogram -----------------------------------------------------------------------


def test_histogram_resolution_is_about_one_percent() -> None:
    assert pytest.approx(0.01158, abs=1e-5) == ITL_RELATIVE_ERROR
    assert ITL_BIN_COUNT == 802  # 8 decades x 100 bins + underflow + overflow


def test_histogram_percentiles_on_known_gaps() -> None:
    # 99 gaps of 10 ms and one of 500 ms: median 10 ms, p99 at rank 98.01:
    # 10 + 0.01 * (500 - 10) = 14.9 ms; p100 is the largest gap, kept exactly.
    h = ItlHistogram.from_gaps([0.01] * 99 + [0.5])
    assert h.count == 100
    assert h.mean_s() == pytest.approx((0.99 + 0.5) / 100, rel=1e-12)
    assert h.median_s() == pytest.approx(0.01, rel=ITL_RELATIVE_ERROR)
    assert h.percentile_s(99) == pytest.approx(0.0149, rel=ITL_RELATIVE_ERROR)
    assert h.percentile_s(100) == 0.5
    assert h.percentile_s(0) == 0.01  # the smallest gap, kept exactly


@settings(max_examples=200, deadline=None)
@given(
    gaps=st.lists(
        st.floats(min_value=ITL_LOW_S, max_value=ITL_HIGH_S, exclude_max=True), min_size=1
    ),
    p=st.floats(min_value=0.0, max_value=100.0),
)
def test_histogram_percentile_within_its_resolution(gaps: list[float], p: float) -> None:
    h = ItlHistogram.from_gaps(gaps)
    exact = float(np.percentile(gaps, p))
    assert abs(h.percentile_s(p) - exact) <= ITL_RELATIVE_ERROR * exact * (1 + 1e-9) + 1e-15
    assert h.mean_s() == pytest.approx(float(np.mean(gaps)), rel=1e-9, abs=1e-9)


def test_histogram_out_of_range_gaps_report_the_extremes() -> None:
    h = ItlHistogram.from_gaps([0.0, 2e-6, 5e3])
    assert h.percentile_s(0) == 0.0
    assert (
        h.percentile_s(50) == 0.0
    )  # the underflow bin reports the smallest gap: 10 us at most off
    assert h.percentile_s(100) == 5e3


def test_histogram_is_deterministic_and_mergeable() -> None:
    rng = np.random.default_rng(7)
    gaps = rng.lognormal(math.log(0.02), 0.6, 5000)
    whole = ItlHistogram.from_gaps(gaps)
    reversed_order = ItlHistogram.from_gaps(gaps[::-1])
    halves = ItlHistogram.from_gaps(gaps[:2000])
    halves.merge(ItlHistogram.from_gaps(gaps[2000:]))
    one_by_one = ItlHistogram()
    for gap in gaps:
        one_by_one.add(float(gap))
    per_request = ItlHistogram()
    per_request.merge_many(ItlCounts.from_gaps(chunk) for chunk in np.array_split(gaps, 50))
    singly = ItlHistogram()
    for chunk in np.array_split(gaps, 50):
        singly.merge(ItlCounts.from_gaps(chunk))
    expected = whole.compact()
    for other in (reversed_order, halves, one_by_one, per_request, singly):
        assert other.compact() == expected
        assert other.percentile_s(99) == whole.percentile_s(99)
        assert other.mean_s() == whole.mean_s()


def test_histogram_counts_weigh_gaps() -> None:
    weighted = ItlHistogram.from_gaps([0.01, 0.03], counts=[3, 1])
    plain = ItlHistogram.from_gaps([0.01, 0.01, 0.01, 0.03])
    added = ItlHistogram()
    added.add(0.01, count=3)
    added.add(0.03)
    added.add(0.9, count=0)  # nothing, and does not move min/max
    assert weighted.compact() == plain.compact() == added.compact()
    assert ItlCounts.from_gaps([0.01, 0.03], counts=[3, 1]) == plain.compact()
    assert ItlCounts.from_gaps([0.01, 0.03], counts=[3, 1]).count == 4


def test_empty_histogram_and_no_gaps() -> None:
    h = ItlHistogram()
    assert (h.count, h.mean_s(), h.median_s(), h.percentile_s(99)) == (0, 0.0, 0.0, 0.0)
    assert h.compact() == NO_GAPS == ItlCounts.from_gaps([])
    h.merge(NO_GAPS)
    h.merge_many([NO_GAPS, NO_GAPS])
    assert h.count == 0


@pytest.mark.parametrize("bad", [-0.001, math.nan, math.inf])
def test_histogram_rejects_bad_gaps(bad: float) -> None:
    with pytest.raises(ValueError):
        ItlHistogram().add(bad)
    with pytest.raises(ValueError):
        ItlHistogram().add_many([0.01, bad])
    with pytest.raises(ValueError):
        ItlCounts.from_gaps([bad])


def test_histogram_rejects_bad_counts() -> None:
    with pytest.raises(ValueError):
        ItlHistogram().add(0.01, count=-1)
    with pytest.raises(ValueError):
        ItlHistogram().add_many([0.01, 0.02], counts=[1])
    with pytest.raises(ValueError):
        ItlHistogram().add_many([0.01], counts=[-2])
    with pytest.raises(ValueError):
        ItlHistogram().add_many([0.01], counts=[1.5])
