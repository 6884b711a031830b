"""Fast mode's event-driven `EngineCore.advance` against the stepwise reference.

The two draw acceptance in different orders (the event-driven path draws a request's steps
ahead, the reference per request-step), so they agree in distribution: over enough requests the
means a user feels (TTFT, TPOT, E2E latency) and the acceptance length agree within a few %,
and the tokens exactly (every request drains). Where acceptance is certain (no speculation, or
p = 1) they agree exactly, request by request, preemptions included. One seed gives one result.
No test here depends on how fast anything runs.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest

from specpilot.runtime.emulator.core import EngineCore, Progress, Request
from specpilot.runtime.emulator.progress import advance_stepwise
from specpilot.tuner import AcceptanceCurve, SpecConfig, StepCost

H100_8B = StepCost.for_hardware("H100", "llama-3.1-8b")
EAGLE3_K3 = SpecConfig(method="eagle3", num_speculative_tokens=3, draft_model="d")
TIERED = SpecConfig(
    method="eagle3",
    num_speculative_tokens=5,
    draft_model="d",
    schedule=[(1, 16, 5), (17, 40, 2), (41, 512, 1)],
)
NGRAM = SpecConfig(method="ngram", num_speculative_tokens=3)

Advance = Callable[[EngineCore, float, float], tuple[float, Progress]]


def event_driven(core: EngineCore, now: float, until: float) -> tuple[float, Progress]:
    return core.advance(now, until)


@dataclass(frozen=True)
class Traffic:
    requests: int
    rps: float | None  # None: every request arrives at 0
    prompt: int
    output: int
    seed: int = 5


def make_requests(traffic: Traffic) -> list[Request]:
    rng = random.Random(traffic.seed)
    t, out = 0.0, []
    for i in range(traffic.requests):
        t += rng.expovariate(traffic.rps) if traffic.rps else 0.0
        out.append(
            Request(
                request_id=f"r{i}",
                task=rng.choice(["chat", "code", "math"]),
                prompt_tokens=max(1, round(traffic.prompt * rng.uniform(0.5, 1.5))),
                max_tokens=max(2, round(traffic.output * rng.uniform(0.5, 1.5))),
                arrival_s=t,
            )
        )
    return out


@dataclass
class Served:
    core: EngineCore
    requests: list[Request]
    progress: list[Progress]

    def total(self, name: str) -> int:
        return sum(getattr(p, name) for p in self.progress)

    @property
    def acceptance_length(self) -> float:
        return 1 + self.total("accepted") / self.total("drafts")

    def mean(self, metric: Callable[[Request], float | None]) -> float:
        return statistics.fmean(v for r in self.requests if (v := metric(r)) is not None)


def serve(
    config: SpecConfig, traffic: Traffic, advance: Advance, *, seed: int = 0, **engine: object
) -> Served:
    """Advance to each arrival, add it, then drain, as the fast-mode driver does."""
    core = EngineCore(config=config, performance=H100_8B, seed=seed, **engine)  # type: ignore[arg-type]
    requests = make_requests(traffic)
    progress: list[Progress] = []
    now = 0.0
    for request in requests:
        if now < request.arrival_s:
            now, step = advance(core, now, request.arrival_s)
            assert now >= request.arrival_s
            progress.append(step)
        core.add_request(request)
    while not core.idle:
        now, step = advance(core, now, now + 30.0)
        progress.append(step)
    assert all(r.generated == r.max_tokens and r.finished_s is not None for r in requests)
    return Served(core, requests, progress)


def ttft(r: Request) -> float | None:
    return None if r.first_token_s is None else r.first_token_s - r.arrival_s


def e2e(r: Request) -> float | None:
    return None if r.finished_s is None else r.finished_s - r.arrival_s


def tpot(r: Request) -> float | None:
    return r.time_per_output_token_s


SCENARIOS = {
    # name: (config, traffic, engine kwargs, relative tolerance on the latency means)
    "eagle3-k3": (EAGLE3_K3, Traffic(1500, 20.0, 512, 256), {}, 0.02),
    "schedule-crossing-tiers": (TIERED, Traffic(1500, 20.0, 512, 256), {}, 0.02),
    "ngram": (NGRAM, Traffic(1200, 15.0, 512, 256), {}, 0.02),
    "low-load": (EAGLE3_K3, Traffic(300, 1.0, 512, 256), {}, 0.02),
    "high-load-kv-preemption": (
        EAGLE3_K3,
        Traffic(800, 20.0, 512, 256),
        {"kv_capacity_tokens": 14_000},
        0.05,
    ),
    "chunked-prefill-long-prompts": (EAGLE3_K3, Traffic(150, 1.0, 20_000, 256), {}, 0.02),
}


@pytest.mark.parametrize("name", SCENARIOS)
def test_event_driven_agrees_with_stepwise_in_distribution(name: str) -> None:
    config, traffic, engine, tolerance = SCENARIOS[name]
    fast = serve(config, traffic, event_driven, seed=1, **engine)
    slow = serve(config, traffic, advance_stepwise, seed=1, **engine)
    assert fast.total("tokens") == slow.total("tokens") == sum(r.max_tokens for r in fast.requests)
    assert fast.total("prefill_tokens") >= sum(r.prompt_tokens for r in fast.requests)
    for metric in (ttft, e2e, tpot):
        assert fast.mean(metric) == pytest.approx(slow.mean(metric), rel=tolerance), metric
    assert fast.acceptance_length == pytest.approx(slow.acceptance_length, rel=0.01)
    busy = fast.total("busy_time") / slow.total("busy_time")
    assert busy == pytest.approx(1.0, rel=tolerance)
    if name == "high-load-kv-preemption":
        assert fast.core.preemptions > 0 and slow.core.preemptions > 0
    if name == "chunked-prefill-long-prompts":
        assert max(r.prompt_tokens for r in fast.requests) > fast.core.max_batched_tokens
    if name == "schedule-crossing-tiers":  # both K=5 and smaller Ks ran: mean K in between
        mean_k = fast.total("draft_tokens") / fast.total("drafts")
        assert 1 < mean_k < 5
        slow_k = slow.total("draft_tokens") / slow.total("drafts")
        assert mean_k == pytest.approx(slow_k, rel=0.05)


def certain(_method: str, _task: str) -> AcceptanceCurve:
    return AcceptanceCurve(1.0)


@pytest.mark.parametrize(
    "config",
    [SpecConfig(), TIERED, EAGLE3_K3],
    ids=["no-spec", "schedule-p1", "eagle3-p1"],
)
@pytest.mark.parametrize("kv_capacity", [None, 20_000], ids=["roomy", "kv-preemption"])
def test_deterministic_acceptance_agrees_exactly(
    config: SpecConfig, kv_capacity: int | None
) -> None:
    traffic = Traffic(500, 25.0, 512, 256, seed=7)
    engine: dict[str, object] = {"acceptance": certain, "kv_capacity_tokens": kv_capacity}
    fast = serve(config, traffic, event_driven, seed=3, **engine)
    slow = serve(config, traffic, advance_stepwise, seed=3, **engine)
    assert fast.core.preemptions == slow.core.preemptions
    if kv_capacity:
        assert fast.core.preemptions > 0
    for a, b in zip(fast.requests, slow.requests, strict=True):
        assert a.first_token_s == pytest.approx(b.first_token_s, rel=1e-9, abs=1e-12)
        assert a.finished_s == pytest.approx(b.finished_s, rel=1e-9, abs=1e-12)
    assert len(fast.progress) == len(slow.progress)
    for a_step, b_step in zip(fast.progress, slow.progress, strict=True):
        for name in ("tokens", "prefill_tokens", "drafts", "draft_tokens", "accepted", "steps"):
            assert getattr(a_step, name) == getattr(b_step, name), name
        assert a_step.accepted_per_position == b_step.accepted_per_position
        assert a_step.batch_time == pytest.approx(b_step.batch_time, rel=1e-9, abs=1e-12)
        assert a_step.busy_time == pytest.approx(b_step.busy_time, rel=1e-9, abs=1e-12)
        assert sorted(r.request_id for r in a_step.finished) == sorted(
            r.request_id for r in b_step.finished
        )
        np.testing.assert_array_equal(a_step.itl_weights, b_step.itl_weights)
        np.testing.assert_allclose(a_step.itl_gaps, b_step.itl_gaps, rtol=1e-9)


def test_same_seed_same_results_bit_for_bit() -> None:
    traffic = Traffic(600, 20.0, 512, 256)
    runs = [serve(TIERED, traffic, event_driven, seed=9) for _ in range(2)]
    first, second = runs
    assert [(r.first_token_s, r.finished_s) for r in first.requests] == [
        (r.first_token_s, r.finished_s) for r in second.requests
    ]
    for a, b in zip(first.progress, second.progress, strict=True):
        assert (a.tokens, a.accepted, a.accepted_per_position, a.batch_time) == (
            b.tokens,
            b.accepted,
            b.accepted_per_position,
            b.batch_time,
        )
        np.testing.assert_array_equal(a.itl_gaps, b.itl_gaps)
    other = serve(TIERED, traffic, event_driven, seed=10)
    assert [r.finished_s for r in other.requests] != [r.finished_s for r in first.requests]


def test_progress_adds_up_and_steps_start_before_until() -> None:
    core = EngineCore(config=EAGLE3_K3, performance=H100_8B, seed=2)
    requests = make_requests(Traffic(40, None, 300, 120))
    for request in requests:
        core.add_request(request)
    now, emitted, drafts, accepted = 0.0, 0, 0, 0
    while not core.idle:
        until = now + 0.05
        end, progress = core.advance(now, until)
        if progress.steps:
            assert end >= until > end - float(progress.itl_gaps[-1])  # the last step started in
        assert progress.busy_time == pytest.approx(float(progress.itl_gaps.sum()))
        assert progress.batch_time == pytest.approx(float(progress.itl_gaps @ progress.itl_weights))
        assert len(progress.itl_gaps) == len(progress.itl_weights) == progress.steps
        assert sum(progress.accepted_per_position) == progress.accepted
        assert progress.draft_tokens == 3 * progress.drafts
        emitted, drafts, accepted = (
            emitted + progress.tokens,
            drafts + progress.drafts,
            accepted + progress.accepted,
        )
        # between calls the Request objects are up to date: the KV the core reports is theirs
        assert core.kv_used_tokens == sum(r.prefilled + r.generated for r in core.running)
        assert all(r.generated < r.max_tokens for r in core.running)
        now = end
    assert emitted == sum(r.max_tokens for r in requests)
    assert 2.0 < 1 + accepted / drafts < 3.5


def test_idle_engine_returns_until() -> None:
    core = EngineCore(config=EAGLE3_K3, performance=H100_8B)
    end, progress = core.advance(1.0, 2.5)
    assert end == 2.5 and progress.steps == 0 and progress.tokens == 0


def test_step_and_advance_can_be_mixed() -> None:
    core = EngineCore(config=TIERED, performance=H100_8B, seed=4)
    requests = make_requests(Traffic(30, None, 200, 150))
    for request in requests:
        core.add_request(request)
    now = 0.0
    for _ in range(5):  # a few steps by hand, then event to event, then by hand again
        for _ in range(3):
            outcome = core.step(now)
            if outcome is not None:
                now += outcome.duration_s
        now, _ = core.advance(now, now + 0.1)
    while not core.idle:
        now, _ = core.advance(now, now + 1.0)
    assert all(r.generated == r.max_tokens and r.finished_s is not None for r in requests)


def test_sglang_adaptive_advances_stepwise() -> None:
    config = SpecConfig(
        method="eagle3", num_speculative_tokens=3, draft_model="d", engine_adaptive=True
    )
    fast = serve(config, Traffic(200, 10.0, 256, 128), event_driven, seed=1)
    slow = serve(config, Traffic(200, 10.0, 256, 128), advance_stepwise, seed=1)
    assert [r.finished_s for r in fast.requests] == [r.finished_s for r in slow.requests]


@dataclass(frozen=True)
class CurvedCost:
    """A step cost that is not affine in the KV tokens: the event-driven path must notice and
    compute every step exactly."""

    base: StepCost

    def step_time(
        self, *, method: str, decode_batch: int, k: int, prefill_tokens: int, kv_tokens: int
    ) -> float:
        plain = self.base.step_time(
            method=method,
            decode_batch=decode_batch,
            k=k,
            prefill_tokens=prefill_tokens,
            kv_tokens=kv_tokens,
        )
        return plain + 1e-12 * kv_tokens**1.5

    def kv_capacity_tokens(self, memory_utilization: float = 0.9) -> int:
        return self.base.kv_capacity_tokens(memory_utilization)


def test_a_step_time_not_affine_in_kv_is_computed_exactly() -> None:
    runs = []
    for advance in (event_driven, advance_stepwise):
        core = EngineCore(config=SpecConfig(), performance=CurvedCost(H100_8B))  # type: ignore[arg-type]
        requests = make_requests(Traffic(200, 20.0, 512, 256))
        now = 0.0
        for request in requests:
            if now < request.arrival_s:
                now, _ = advance(core, now, request.arrival_s)
            core.add_request(request)
        while not core.idle:
            now, _ = advance(core, now, now + 30.0)
        runs.append([r.finished_s for r in requests])
    assert runs[0] == runs[1]
