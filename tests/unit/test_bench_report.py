"""The bench's one loop and its report: fast mode's SpecPilot is the operator's ControlLoop
(the same decisions on the same observations), every policy gets the yardstick's figures,
hindsight is a reference built from the statics, and the summary has the documented keys."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest

from specpilot.operator.app.bench.policies import (
    HINDSIGHT,
    NO_SPEC,
    SPECPILOT,
    StaticPolicy,
    space_for,
)
from specpilot.operator.app.bench.report import (
    settled_against_static,
    settled_mean,
    summary,
    world_report,
)
from specpilot.operator.app.bench.run import Setup, Tuning, control_loop, run_policy
from specpilot.operator.app.bench.traffic import requests_from_rates
from specpilot.runtime.traces import parse_trace
from specpilot.tuner import Observation, SpecConfig

# Quiet, then past one replica's no-spec capacity, then quiet: both regimes in ten minutes.
TRACE = parse_trace("t,rps,chat\n0,2,1\n200,60,1\n400,2,1\n600,0,1\n", "shift")
SETUP = Setup(
    gpu="H100",
    profile="llama-3.1-8b",
    engine="vllm",
    requests=requests_from_rates(TRACE, seed=3),
    duration_s=TRACE.duration_s,
    window_s=60.0,
)


@dataclass
class Replay:
    """An actuator that hands back recorded observations and records what it is told."""

    observations: list[Observation]
    applied: list[SpecConfig] = field(default_factory=list)

    def apply(self, config: SpecConfig) -> None:
        self.applied.append(config)

    def observe(self, window_s: float) -> Observation:
        return self.observations.pop(0)


@pytest.fixture(scope="module")
def pilot() -> object:
    return run_policy(SETUP, 0, SPECPILOT)


def test_fast_mode_specpilot_is_the_control_loop_on_the_same_observations(pilot: object) -> None:
    ticks = list(pilot.observations)  # type: ignore[attr-defined]
    assert len(ticks) >= 5
    assert len(set(pilot.configs_by_window)) >= 2  # type: ignore[attr-defined]  # it switched
    replay = Replay([obs for _, obs in ticks])
    loop = control_loop(SETUP, replay)
    # a tick records the observation it decided on (its probe's, or the whole window joined
    # from two): the replay hands that back whole
    loop.probe_first_window = False
    configs = []
    for now, _ in ticks:
        loop.tick(now)
        configs.append(loop.state.current.describe())
    assert configs == pilot.configs_by_window  # type: ignore[attr-defined]


def test_every_policy_is_scored_and_the_summary_has_the_documented_keys(pilot: object) -> None:
    space = space_for("vllm")
    statics = [StaticPolicy(NO_SPEC, space[0]), StaticPolicy("static:eagle3 K=3", space[3])]
    runs = [run_policy(SETUP, 0, p) for p in statics] + [pilot]
    report = world_report(runs, duration_s=SETUP.duration_s, window_s=SETUP.window_s)  # type: ignore[arg-type]
    assert set(report) == {NO_SPEC, "static:eagle3 K=3", SPECPILOT, HINDSIGHT}
    for figures in report.values():
        assert figures["requests"] == len(SETUP.requests)
        assert set(figures["slo_attainment"]) == {"tight", "standard", "relaxed"}
        assert len(figures["windows"]) == 10
    # hindsight takes, per window, the static with the lowest mean E2E latency there
    chosen = report[HINDSIGHT]["configs_by_window"]
    assert set(chosen) <= {NO_SPEC, "static:eagle3 K=3"} and len(chosen) == 10
    entries = summary([report])
    keys = {
        "policy", "e2el_ms_mean", "e2el_ms_p99", "tpot_ms_mean", "ttft_ms_p99", "slo_attainment",
        "restarts", "worst_world_e2el_ratio_vs_no_spec",
    }  # fmt: skip
    assert all(set(e) == keys for e in entries)
    by_name = {e["policy"]: e for e in entries}
    assert by_name[NO_SPEC]["worst_world_e2el_ratio_vs_no_spec"] == 1.0
    assert by_name[NO_SPEC]["restarts"] == 0


def test_the_same_inputs_give_the_same_run() -> None:
    policy = StaticPolicy("static:eagle3 K=3", space_for("vllm")[3])
    a, b = run_policy(SETUP, 4, policy), run_policy(SETUP, 4, policy)
    assert a.records == b.records and a.itl == b.itl


def test_specpilot_starts_from_the_initial_config_it_is_given() -> None:
    eagle = space_for("vllm")[3]
    assert eagle.method == "eagle3" and eagle.num_speculative_tokens == 3
    started_on = run_policy(replace(SETUP, tuning=Tuning(initial=eagle)), 0, SPECPILOT)
    started_off = run_policy(SETUP, 0, SPECPILOT)
    # the first window is served by the config it started with: only EAGLE-3 accepts drafts
    assert started_on.observations[0][1].acceptance_length is not None
    assert started_off.observations[0][1].acceptance_length is None


def _windows(*cells: tuple[int, float]) -> dict[str, object]:
    """A policy's windows, each (requests, mean TPOT ms = mean E2E ms)."""
    return {"windows": [{"requests": n, "tpot_ms_mean": v, "e2el_ms_mean": v} for n, v in cells]}


def test_settled_figures_are_the_later_half_of_the_windows_weighed_by_requests() -> None:
    # the first half (the start on no speculation) does not count; an empty window neither
    start = _windows((10, 30.0), (10, 30.0), (0, 0.0), (30, 10.0), (10, 14.0))
    assert settled_mean(start, "tpot_ms_mean") == pytest.approx((30 * 10.0 + 10 * 14.0) / 40)
    assert settled_mean(_windows((5, 1.0), (0, 0.0)), "tpot_ms_mean") is None
    eagle = "static:eagle3 K=3"
    worlds = [
        {SPECPILOT: start, NO_SPEC: _windows((10, 20.0)), eagle: _windows((10, 10.5)),
         # an engine baseline, a tuner variant and hindsight are not static configs
         "tuned-schedule": _windows((10, 1.0)), "specpilot:no-gp": _windows((10, 1.0)),
         HINDSIGHT: _windows((10, 1.0))},
        {SPECPILOT: _windows((10, 12.0)), NO_SPEC: _windows((10, 10.0))},
    ]  # fmt: skip
    found = settled_against_static(worlds, "tpot_ms_mean")
    assert found is not None
    # world 0: 11/10.5 = 1.048 (within 5%); world 1: 12/10 = 1.2 (not)
    assert found["worlds"] == 2 and found["within"] == 1
    assert found["ratio_to_best_static"] == {"median": 1.124, "max": 1.2}
    assert settled_against_static([{NO_SPEC: _windows((1, 1.0))}], "tpot_ms_mean") is None
