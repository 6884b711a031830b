"""The emulator's SGLang 0.5.23 /metrics dialect, driven step by step through an EngineCore:
the update rules a live SGLang server showed (tests/contract/test_sglang_server.py checks the
emulator against one): gauges published from startup, acceptance over 40-decode-batch windows
and held in between and when idle, running back to 0 when idle, tokenizer-side counters per
finished request, inter-token latency for streamed requests only."""

from __future__ import annotations

import itertools

import pytest

from specpilot.runtime.emulator.core import EngineCore, Request
from specpilot.runtime.emulator.exposition import SGLANG_WINDOW_STEPS, SglangExposition
from specpilot.runtime.engine_metrics import observe
from specpilot.runtime.scrape import Snapshot, parse_snapshot, window_stats
from specpilot.tuner import SpecConfig, StepCost

H100_8B = StepCost.for_hardware("H100", "llama-3.1-8b")
NGRAM_K3 = SpecConfig(method="ngram", num_speculative_tokens=3)
SCHEDULER = (
    ("engine_type", "unified"),
    ("model_name", "m"),
    ("moe_ep_rank", "0"),
    ("pp_rank", "0"),
    ("tp_rank", "0"),
)


def gauge(snapshot: Snapshot, name: str) -> float:
    return snapshot.series(name)[SCHEDULER]


class Driven:
    """An EngineCore and its SGLang exposition, stepped in emulated time."""

    def __init__(self, config: SpecConfig = NGRAM_K3) -> None:
        self.core = EngineCore(config=config, performance=H100_8B, seed=3)
        self.exposition = SglangExposition("m", max_k=config.max_k)
        self.now = 0.0
        self.decode_batches = 0
        self.accepted = self.request_steps = 0

    def add(self, count: int, max_tokens: int = 60) -> None:
        for _ in range(count):
            index = len(self.core.running) + len(self.core.waiting) + int(self.now * 1e6)
            self.core.add_request(
                Request(
                    request_id=f"r{index}-{self.now}",
                    task="code",
                    prompt_tokens=32,
                    max_tokens=max_tokens,
                    arrival_s=self.now,
                )
            )

    def step(self, streaming: bool = False) -> bool:
        outcome = self.core.step(self.now)
        if outcome is None:
            return False
        self.now = outcome.start_s + outcome.duration_s
        if outcome.decode_batch:
            self.decode_batches += 1
            self.accepted += outcome.accepted
            self.request_steps += outcome.decode_batch
        self.exposition.record_step(outcome, self.core)
        for request in outcome.finished:
            self.exposition.record_finished(request, streaming)
        return True

    def snapshot(self) -> Snapshot:
        return parse_snapshot(self.exposition.render().decode(), self.now)


def test_every_scheduler_gauge_exists_at_zero_from_startup() -> None:
    start = Driven().snapshot()
    for name in (
        "sglang:num_running_reqs",
        "sglang:num_queue_reqs",
        "sglang:token_usage",
        "sglang:gen_throughput",
        "sglang:spec_accept_length",
        "sglang:spec_accept_rate",
        "sglang:spec_num_steps",
        "sglang:spec_num_draft_tokens",
    ):
        assert gauge(start, name) == 0.0, name
    assert not start.series("sglang:generation_tokens_total")


def test_acceptance_moves_only_at_window_ends_and_is_held_when_idle() -> None:
    driven = Driven()
    driven.add(4, max_tokens=400)
    lengths: list[tuple[int, float]] = []
    while driven.step():
        lengths.append(
            (driven.decode_batches, gauge(driven.snapshot(), "sglang:spec_accept_length"))
        )
    changed_at = [
        now for (_, before), (now, after) in itertools.pairwise(lengths) if before != after
    ]
    assert changed_at and all(b % SGLANG_WINDOW_STEPS == 0 for b in changed_at)
    idle = driven.snapshot()
    assert gauge(idle, "sglang:num_running_reqs") == 0.0
    assert gauge(idle, "sglang:gen_throughput") == 0.0
    assert gauge(idle, "sglang:spec_accept_length") == lengths[-1][1] > 1.0
    assert gauge(idle, "sglang:spec_num_steps") == 3.0
    assert gauge(idle, "sglang:spec_num_draft_tokens") == 4.0


def test_window_acceptance_is_tokens_per_request_step() -> None:
    driven = Driven()
    driven.add(2, max_tokens=10_000)
    while driven.decode_batches < SGLANG_WINDOW_STEPS:
        assert driven.step()
    # accepted drafts plus one token per request per batch, over request-batches
    expected = (driven.accepted + driven.request_steps) / driven.request_steps
    assert gauge(driven.snapshot(), "sglang:spec_accept_length") == pytest.approx(expected)
    assert gauge(driven.snapshot(), "sglang:num_running_reqs") == 2.0


def test_a_prefill_republishes_load_but_not_acceptance() -> None:
    driven = Driven()
    driven.add(1, max_tokens=10_000)
    while driven.decode_batches < SGLANG_WINDOW_STEPS:
        assert driven.step()
    before = driven.snapshot()
    driven.add(3)
    assert driven.step()  # admits and prefills the three new requests
    after = driven.snapshot()
    assert gauge(after, "sglang:num_queue_reqs") == 0.0
    assert gauge(after, "sglang:num_running_reqs") == 1.0  # the decode batch that ran
    assert gauge(after, "sglang:token_usage") > gauge(before, "sglang:token_usage")
    assert gauge(after, "sglang:spec_accept_length") == gauge(before, "sglang:spec_accept_length")


@pytest.mark.parametrize("streaming", [False, True])
def test_tokenizer_counters_move_when_requests_finish(streaming: bool) -> None:
    driven = Driven()
    driven.add(3, max_tokens=30)
    verifies = 0
    while True:
        outcome_steps = driven.request_steps
        if not driven.step(streaming):
            break
        verifies += driven.request_steps - outcome_steps
    end = driven.snapshot()
    flag = (
        ("engine_type", "unified"),
        ("is_streaming", str(streaming).lower()),
        ("model_name", "m"),
    )
    assert end.series("sglang:generation_tokens_total")[flag] == 90
    assert end.series("sglang:prompt_tokens_total")[flag] == 96
    tokenizer = (("engine_type", "unified"), ("model_name", "m"))
    assert end.series("sglang:spec_verify_calls_total")[tokenizer] == verifies
    assert end.series("sglang:e2e_request_latency_seconds_count")[flag] == 3
    itl = end.series("sglang:inter_token_latency_seconds_count")
    # one observation per token after the first, streamed requests only
    assert itl == ({tokenizer: 87.0} if streaming else {})


def test_plain_server_reports_zero_acceptance_gauges() -> None:
    driven = Driven(SpecConfig())
    driven.add(2, max_tokens=200)
    while driven.step():
        pass
    end = driven.snapshot()
    assert driven.decode_batches >= SGLANG_WINDOW_STEPS
    assert gauge(end, "sglang:spec_accept_length") == 0.0
    assert not end.series("sglang:spec_verify_calls_total")


def test_reader_acceptance_from_a_fresh_server_ignores_the_startup_zeros() -> None:
    driven = Driven()
    start = driven.snapshot()
    driven.add(4, max_tokens=400)
    while driven.step():
        pass
    stats = window_stats("sglang", "pod", [start, driven.snapshot()])
    observation = observe("sglang", [stats])
    assert observation.acceptance_length == pytest.approx(
        gauge(driven.snapshot(), "sglang:spec_accept_length")
    )
