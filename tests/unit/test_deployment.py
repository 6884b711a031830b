"""The emulated Deployment (runtime/emulator/deployment.py) in simulated time: the balancer
spreads arrivals over ready replicas, each rollout mode keeps (or loses) the capacity it should,
a stopped replica finishes what it holds within its drain and holds its GPU until it exits,
what the drain cannot finish (all of it, with none) is retried from the start with its wait
counted, a surge counted without its drain hands what the old replica holds to the new one, and
`observe` reports a window as a scrape of the ready replicas would, and a trial runs on a canary
beside two or more replicas as the Kubernetes actuator runs it. No wall clock anywhere."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from specpilot.runtime.emulator.core import EngineCore, Request
from specpilot.runtime.emulator.deployment import CanaryRejected, EmulatedDeployment
from specpilot.tuner import AcceptanceCurve, Observation, SpecConfig, StepCost, acceptance_curve

COST = StepCost.for_hardware("H100", "llama-3.1-8b")
EAGLE3 = SpecConfig(method="eagle3", num_speculative_tokens=3, draft_model="d")


def steady(rate_rps: float, until_s: float, output: int = 64) -> Iterator[Request]:
    """Evenly spaced arrivals (deterministic, unlike Poisson)."""
    n = 0
    while n / rate_rps < until_s:
        yield Request(
            request_id=f"r{n}",
            task="chat",
            prompt_tokens=128,
            max_tokens=output,
            arrival_s=n / rate_rps,
        )
        n += 1


def deployment(**kwargs: object) -> EmulatedDeployment:
    args: dict[str, object] = {
        "config": SpecConfig(),
        "cost": COST,
        "acceptance": acceptance_curve,
        "arrivals": steady(4.0, 600.0),
        "start_time_s": 60.0,
    }
    args.update(kwargs)
    return EmulatedDeployment(**args)  # type: ignore[arg-type]


def test_observe_serves_a_window_and_reports_it_as_a_scrape_would() -> None:
    d = deployment(replicas=2)
    obs = d.observe(60.0)
    assert d.now == pytest.approx(60.0, abs=0.1)
    assert obs.pods == ("replica-0", "replica-1") and obs.engines == 2
    assert obs.generation_tokens_per_s is not None and obs.generation_tokens_per_s > 0
    assert obs.running_requests is not None and 0 < obs.running_requests < 4
    assert obs.acceptance_length is None  # no speculation, no drafts
    finished = [r for r in d.records() if r.finished_s is not None]
    assert len(finished) >= 200  # 4 req/s for a minute, short requests
    # summed over replicas, as a scrape of both would; the mean prompt is the requests' 128
    assert obs.requests_per_s == pytest.approx(len(finished) / 60.0, rel=0.02)
    assert obs.prompt_tokens_per_s is not None
    assert obs.prompt_tokens_per_s / obs.requests_per_s == pytest.approx(128, rel=0.05)


def test_the_running_and_kv_gauges_are_read_at_the_same_instant() -> None:
    # the mean batch is a window's integral; the two gauges are one scrape instant's, so
    # their ratio is the KV per running request at that instant whatever the mean batch was
    d = deployment(replicas=2, arrivals=steady(40.0, 600.0, output=256))
    obs = d.observe(60.0)
    cores = [r.core for r in d._replicas.values()]
    running = [len(c.running) for c in cores]
    assert obs.running_requests_gauge == pytest.approx(sum(running) / len(running))
    assert obs.running_requests_gauge is not None and obs.running_requests_gauge >= 1
    assert obs.kv_cache_usage == pytest.approx(sum(c.kv_usage for c in cores) / len(cores))
    held = sum(c.kv_used_tokens for c in cores) / sum(running)
    per_request = obs.kv_cache_usage * cores[0].kv_capacity_tokens / obs.running_requests_gauge
    assert per_request == pytest.approx(held)
    assert 128 < per_request < 128 + 256  # a prompt and part of its output


def test_the_balancer_spreads_arrivals_over_ready_replicas() -> None:
    d = deployment(replicas=2, arrivals=steady(20.0, 600.0))
    d.observe(30.0)
    loads = [len(r.core.running) + len(r.core.waiting) for _, r in d._ready()]
    assert len(loads) == 2 and abs(loads[0] - loads[1]) <= 2


@pytest.mark.parametrize(
    ("rollout", "replicas", "served_meanwhile"),
    [("restart", 1, False), ("surge", 1, True), ("one-at-a-time", 2, True)],
)
def test_a_rollout_takes_the_start_time_and_serves_only_where_kubernetes_would(
    rollout: str, replicas: int, served_meanwhile: bool
) -> None:
    d = deployment(rollout=rollout, replicas=replicas)
    d.observe(60.0)
    before = sum(1 for r in d.records() if r.finished_s is not None)
    d.apply(EAGLE3)
    assert d.config == EAGLE3 and d.restarts == 1
    assert d.rollout_s == pytest.approx(60.0 * replicas, abs=0.5)
    during = [
        r for r in d.records() if r.finished_s is not None and 60.0 <= r.finished_s < d.now - 1
    ]
    assert (len(during) > before / 2) is served_meanwhile
    assert all(r.core.config == EAGLE3 for _, r in d._ready())
    after = d.observe(60.0)
    assert after.acceptance_length is not None and after.acceptance_length > 1.5


def test_a_restart_makes_arrivals_wait_at_the_client_and_counts_their_wait() -> None:
    d = deployment(rollout="restart")
    d.observe(60.0)
    d.apply(EAGLE3)
    d.observe(120.0)
    waited = [r for r in d.records() if 60.0 < r.arrival_s < 110.0]
    assert waited and all(r.first_token_s is not None and r.first_token_s >= 120.0 for r in waited)


def test_requests_in_flight_on_a_stopped_replica_are_retried_from_the_start() -> None:
    d = deployment(rollout="restart", arrivals=steady(2.0, 600.0, output=4000))
    d.observe(30.0)
    in_flight = [r for r in d.records() if r.finished_s is None]
    assert in_flight and any(r.generated > 0 for r in in_flight)
    d.apply(EAGLE3)  # the new replica is ready at 90 s; nothing has run on it yet
    for request in in_flight:  # to be sent again from the start, arrival unchanged
        assert request.generated == 0 and request.first_token_s is None
        assert request.arrival_s <= 30.0
    d.observe(60.0)
    assert all(r.first_token_s is not None and r.first_token_s >= 90.0 for r in in_flight)


def test_a_stopped_replica_finishes_what_it_holds_and_is_not_scraped_meanwhile() -> None:
    d = deployment(
        rollout="surge", arrivals=steady(4.0, 600.0, output=600), pre_stop_s=10.0, drain_s=45.0
    )
    d.observe(30.0)
    d.apply(EAGLE3)  # the new replica is ready at 90 s; the old one stops then
    stopped_at = d.now
    held = [r for r in d.records() if r.finished_s is None and r.first_token_s is not None]
    assert held
    first_tokens = {r.request_id: r.first_token_s for r in held}
    observed = d.observe(30.0)
    assert observed.pods == ("replica-1",)  # a terminating pod is not scraped
    for request in held:  # finished where they ran, never sent again
        assert request.first_token_s == first_tokens[request.request_id]
        assert request.finished_s is not None and request.finished_s <= stopped_at + 55.0
    assert len(d._replicas) == 1  # gone once empty


def test_what_the_drain_cannot_finish_is_retried_at_its_end() -> None:
    d = deployment(rollout="surge", arrivals=steady(2.0, 600.0, output=20000), drain_s=5.0)
    d.observe(30.0)
    d.apply(EAGLE3)
    stopped_at = d.now
    held = [r for r in d.records() if r.finished_s is None and r.first_token_s is not None]
    assert held and all(r.first_token_s is not None and r.first_token_s < stopped_at for r in held)
    d.observe(30.0)
    for request in held:  # sent again from the start once the drain ran out
        assert request.first_token_s is not None and request.first_token_s >= stopped_at + 5.0


def _queue_then_switch(surge_handover: bool) -> tuple[EmulatedDeployment, list[Request], float]:
    """One replica past saturation for a minute, then a surge switch to the same speed class:
    what it held at the switch, and its mean wait at the end."""
    d = deployment(
        rollout="surge",
        arrivals=steady(60.0, 600.0, output=400),
        pre_stop_s=10.0,
        drain_s=45.0,
        surge_handover=surge_handover,
    )
    d.observe(60.0)
    d.apply(EAGLE3)  # ready at 120 s, the queue deeper by then
    held = [r for r in d.records() if r.finished_s is None]
    d.observe(120.0)
    waits = [(r.finished_s or d.now) - r.arrival_s for r in d.records()]
    return d, held, sum(waits) / len(waits)


def test_a_surge_handover_moves_what_the_old_replica_holds_with_its_progress() -> None:
    _, _, drained_wait = _queue_then_switch(surge_handover=False)
    handed, held, handed_wait = _queue_then_switch(surge_handover=True)
    started = [r for r in held if r.first_token_s is not None and r.first_token_s < 120.0]
    assert started and all(r.generated > 0 for r in started)  # progress kept, not retried
    assert len(handed._replicas) == 1  # the old replica's GPU is free at once
    assert all(r.finished_s is not None for r in started)  # finished on the replacement
    # the drain served the queue on a second GPU; the handover leaves one GPU's capacity
    assert drained_wait < handed_wait * 0.95


@pytest.mark.parametrize("rollout", ["one-at-a-time", "surge"])
def test_a_replacement_waits_for_the_gpu_a_stopped_replica_holds(rollout: str) -> None:
    d = deployment(replicas=2, rollout=rollout, pre_stop_s=10.0, drain_s=45.0)
    d.observe(30.0)
    d.apply(EAGLE3)
    # each replica's pod waits at least the pre-stop sleep for the GPU the one before frees,
    # except a surge's first, which starts on the spare GPU
    waits = 2 if rollout == "one-at-a-time" else 1
    assert d.rollout_s >= 2 * 60.0 + waits * 10.0 - 0.5


def test_applying_the_running_config_is_a_no_op() -> None:
    d = deployment()
    d.apply(SpecConfig())
    assert d.restarts == 0 and d.now == 0.0


def test_every_arrival_is_kept_and_late_ones_are_drained() -> None:
    d = deployment(arrivals=steady(4.0, 100.0))
    d.observe(50.0)
    d.drain_arrivals()
    assert len(d.records()) == 400


def test_bad_settings_are_refused_with_the_allowed_values() -> None:
    with pytest.raises(ValueError, match="replicas=0"):
        deployment(replicas=0)
    with pytest.raises(ValueError, match=r"surge \| one-at-a-time \| restart"):
        deployment(rollout="blue-green")


def test_a_trial_runs_on_a_canary_in_a_replicas_place_and_is_promoted_when_it_keeps_pace() -> None:
    d = deployment(replicas=2, arrivals=steady(8.0, 900.0))
    assert d.canary_share() == pytest.approx(1 / 2)
    d.observe(60.0)
    d.apply_trial(EAGLE3)
    # a canary start in replica 1's place, its comparison window, then the rollout of both
    # slots (surge-free "restart" rollout here: the default)
    assert d.config == EAGLE3 and d.restarts == 1 and d.canaries == 1
    served = d.trial_observation()
    assert served is not None and served.pods == ("replica-2",)
    assert served.acceptance_length is not None and served.acceptance_length > 1.5
    assert served.generation_tokens_per_s is not None and served.generation_tokens_per_s > 0
    assert sorted(rid for rid, _ in d._ready()) == [3, 4]  # the canary is gone


def test_a_canary_slower_than_the_replicas_is_rejected_and_leaves_them_untouched() -> None:
    # a drafter that is nearly always wrong: every verify step costs more and gains nothing
    d = deployment(
        replicas=2,
        arrivals=steady(8.0, 900.0),
        acceptance=lambda method, task: AcceptanceCurve(0.02, 0.5),
    )
    d.observe(60.0)
    finished_before = sum(1 for r in d.records() if r.finished_s is not None)
    with pytest.raises(CanaryRejected, match="rejected"):
        d.apply_trial(EAGLE3)
    assert d.config == SpecConfig() and d.restarts == 0 and d.canaries == 1
    # replica 0 never stopped; the canary's slot went back to the running config
    assert sorted(rid for rid, _ in d._ready()) == [0, 3]
    assert all(r.core.config == SpecConfig() for r in d._replicas.values())
    served = d.trial_observation()
    assert served is not None and served.acceptance_length is not None
    assert served.acceptance_length < 1.1
    # the main replicas kept serving through the trial (two starts + warm-up + window:
    # 200 s at 8 req/s)
    assert sum(1 for r in d.records() if r.finished_s is not None) > finished_before + 1000


@pytest.mark.parametrize(
    ("rollout", "fewest_serving"), [("surge", 3), ("one-at-a-time", 2), ("restart", 2)]
)
def test_a_canary_never_serves_beside_all_the_replicas(rollout: str, fewest_serving: int) -> None:
    """The canary takes a replica's place: a trial never has more replicas serving than the
    static configs it is compared with; with a spare GPU (surge) never fewer either."""
    d = deployment(replicas=3, rollout=rollout, arrivals=steady(8.0, 1200.0))
    d.observe(60.0)
    serving: list[int] = []
    run_until = d.run_until

    def counting(until: float) -> None:  # each wait ends as a replica turns ready
        serving.append(len(d._ready()))
        run_until(until)

    d.run_until = counting  # type: ignore[method-assign]
    with pytest.raises(CanaryRejected):
        d.apply_trial(EAGLE3, lambda served: "judged out")
    assert max(serving) == 3 and min(serving) == fewest_serving
    assert len(d._replicas) == 3 and d.config == SpecConfig() and d.restarts == 0


def test_with_one_replica_and_no_spare_gpu_a_trial_is_a_rollout() -> None:
    d = deployment(replicas=1)
    assert d.canary_share() is None
    d.observe(60.0)
    d.apply_trial(EAGLE3)
    assert d.config == EAGLE3 and d.restarts == 1 and d.canaries == 0
    assert d.trial_observation() is None


def test_beside_one_replica_a_trial_takes_all_of_the_load_and_a_rejection_stops_only_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    d = deployment(
        replicas=1,
        rollout="surge",
        arrivals=steady(8.0, 900.0),
        # an EAGLE-3 that accepts almost nothing: slower per request than no speculation
        acceptance=lambda method, task: AcceptanceCurve(0.02, 0.5),
    )
    assert d.canary_share() == pytest.approx(1 / 2)
    d.observe(60.0)
    replica = d._replicas[0].core
    to_replica: list[float] = []
    add_request = EngineCore.add_request

    def recording(core: EngineCore, request: Request) -> None:
        if core is replica:
            to_replica.append(d.now)
        add_request(core, request)

    monkeypatch.setattr(EngineCore, "add_request", recording)
    serving: list[int] = []
    run_until = d.run_until

    def counting(until: float) -> None:
        serving.append(len(d._ready()))
        run_until(until)

    d.run_until = counting  # type: ignore[method-assign]
    started = d.now
    with pytest.raises(CanaryRejected, match=r"congested|s against"):
        d.apply_trial(EAGLE3)
    # the one replica stayed up throughout, the canary beside it once ready; then only it
    assert min(serving) == 1 and max(serving) == 2
    assert sorted(d._replicas) == [0] and d.config == SpecConfig() and d.restarts == 0
    served = d.trial_observation()
    assert served is not None and served.pods == ("replica-1",)
    # from the warm-up's end to the verdict the replica got no new request: it idled, warm
    full_load_from = started + 60.0 + d.canary_warmup_s
    assert not [t for t in to_replica if full_load_from < t < full_load_from + served.window_s]
    assert [t for t in to_replica if t > full_load_from + served.window_s]  # then it took over
    # every request of the trial's window went to the canary: the whole 8/s
    assert served.requests_per_s == pytest.approx(8.0, rel=0.05)
    # stopped before its window ran out, at a probe
    assert d.now - started < 60.0 + d.canary_warmup_s + d.full_load_window_s


def test_beside_one_replica_a_promoted_canary_serves_on_while_the_replica_is_replaced(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    d = deployment(replicas=1, rollout="surge", arrivals=steady(8.0, 900.0))
    d.observe(60.0)
    sent: list[tuple[float, SpecConfig]] = []
    add_request = EngineCore.add_request

    def recording(core: EngineCore, request: Request) -> None:
        sent.append((d.now, core.config))
        add_request(core, request)

    monkeypatch.setattr(EngineCore, "add_request", recording)
    started = d.now
    d.apply_trial(EAGLE3)
    assert d.config == EAGLE3 and d.restarts == 1 and d.canaries == 1
    # the canary (replica 1) is gone; replica 2 runs the config, started after the verdict:
    # a canary start, warm-up and the whole window at all of the load, then its own start
    assert sorted(d._replicas) == [2] and d._replicas[2].core.config == EAGLE3
    verdict = started + 60.0 + d.canary_warmup_s + d.full_load_window_s
    assert d.now >= verdict + 60.0
    # from the full load on, no request went back to no speculation: the canary held it all
    # while the replica was replaced on its GPU
    assert not [t for t, config in sent if t > verdict - d.full_load_window_s and config != EAGLE3]
    served = d.trial_observation()
    assert served is not None and served.requests_per_s == pytest.approx(8.0, rel=0.05)


def test_a_canary_the_judge_turns_down_is_rejected_with_its_reason() -> None:
    d = deployment(replicas=2, arrivals=steady(8.0, 900.0))
    d.observe(60.0)
    judged: list[float | None] = []

    def judge(served: Observation) -> str | None:
        judged.append(served.acceptance_length)
        return "its capacity falls short of the load ahead"

    with pytest.raises(CanaryRejected, match="falls short of the load ahead"):
        d.apply_trial(EAGLE3, judge)
    # the judge saw the canary's own window, and the main replicas never left their config
    assert len(judged) == 1 and judged[0] is not None and judged[0] > 1.5
    assert d.config == SpecConfig() and d.restarts == 0 and d.canaries == 1


def test_beside_one_replica_no_trial_starts_without_a_window_of_the_replica_to_compare() -> None:
    d = deployment(replicas=1, rollout="surge", arrivals=steady(8.0, 900.0))
    with pytest.raises(CanaryRejected, match="no window of the replica's"):
        d.apply_trial(EAGLE3)
    assert d.canaries == 0 and sorted(d._replicas) == [0] and d.now == 0.0
