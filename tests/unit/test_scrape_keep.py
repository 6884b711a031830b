"""A window keeps only the samples it reads (runtime/scrape.py `window_samples`): the same
WindowStats as from every sample, a fraction of the memory, and a broken line among the kept
series still fails the scrape."""

from __future__ import annotations

import pytest

from specpilot.runtime.emulator.core import EngineCore, Request
from specpilot.runtime.emulator.exposition import exposition_for
from specpilot.runtime.scrape import ScrapeError, parse_snapshot, window_samples, window_stats
from specpilot.tuner import SpecConfig, StepCost

EAGLE3 = SpecConfig(method="eagle3", num_speculative_tokens=3, draft_model="/d")


def _texts(engine: str) -> list[str]:
    """Three /metrics texts of a real emulated engine while it serves 12 requests."""
    core = EngineCore(config=EAGLE3, performance=StepCost.for_hardware("H100", "llama-3.1-8b"))
    exposition = exposition_for(engine, "llama", EAGLE3.max_k)
    for i in range(12):
        core.add_request(Request(request_id=f"r{i}", task="chat", prompt_tokens=64,
                                 max_tokens=24 + 8 * i, arrival_s=0.0))  # fmt: skip
    texts, now = [], 0.0
    while (outcome := core.step(now)) is not None:
        now = outcome.start_s + outcome.duration_s
        exposition.record_step(outcome, core)
        for request in outcome.finished:
            exposition.record_finished(request, False)
        if len(outcome.finished) and len(texts) < 3:
            texts.append(exposition.render().decode())
    texts.append(exposition.render().decode())
    return texts


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_kept_samples_give_the_same_window_as_every_sample(engine: str) -> None:
    texts = _texts(engine)
    keep = window_samples(engine)
    every = [parse_snapshot(text, float(t)) for t, text in enumerate(texts)]
    kept = [parse_snapshot(text, float(t), keep) for t, text in enumerate(texts)]
    assert window_stats(engine, "pod", kept) == window_stats(engine, "pod", every)
    assert window_stats(engine, "pod", kept).counters["generation_tokens"] > 0
    assert set(kept[-1].samples) <= keep < set(every[-1].samples) | keep
    assert sum(map(len, kept[-1].samples.values())) < sum(map(len, every[-1].samples.values()))


def test_a_broken_line_in_a_kept_series_still_fails_the_scrape() -> None:
    text = "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running three\n"
    for keep in (None, window_samples("vllm")):
        with pytest.raises(ScrapeError):
            parse_snapshot(text, 0.0, keep)


def test_series_no_window_reads_are_skipped_unparsed() -> None:
    text = (
        "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 3\n"
        "some_other_metric{broken 1\n"
    )
    with pytest.raises(ScrapeError):
        parse_snapshot(text, 0.0)
    kept = parse_snapshot(text, 0.0, window_samples("vllm"))
    assert kept.series("vllm:num_requests_running") == {(): 3.0}
