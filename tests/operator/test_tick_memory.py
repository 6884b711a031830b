"""A long-running operator's memory does not grow with its ticks: the control loop cached per
SpecDeployment (tuning_daemon._loops) keeps no history of its own, status holds the record.
Found by bench/operator_load.py: ~1.5 kB per tick per object, about 0.9 GB a day at 200
SpecDeployments ticking every 30 s."""

from __future__ import annotations

from typing import Any

from kube.apiserver import ApiServer
from tuning_helpers import create, later, spd

from specpilot.operator.kube import tuning_daemon
from specpilot.operator.kube.client import KubeRest
from specpilot.operator.kube.reconcile import reconcile
from specpilot.tuner import Observation


class Steady:
    """The same memory-bound window every tick: the tuner stays."""

    def apply(self, config: Any) -> None:
        raise AssertionError("no switch expected")

    def observe(self, window_s: float) -> Observation:
        return Observation(
            engine="vllm", window_s=4.0, pods=("p-0",), acceptance_length=3.0,
            acceptance_rate=0.5, acceptance_per_position=None, running_requests=2.0,
            waiting_requests=0.0, kv_cache_usage=0.1, generation_tokens_per_s=300.0,
            tpot_p50_s=0.01, tpot_p95_s=0.012, ttft_p95_s=0.05,
        )  # fmt: skip


def test_the_cached_loop_keeps_no_tick_history(api: ApiServer, rest: KubeRest) -> None:
    reconcile(rest, create(api, "steady", "auto"))
    now = later()
    for tick in range(4):
        outcome = tuning_daemon.tune(
            rest, spd(api, "steady"), now=now + 10.0 * tick, make_actuator=lambda *_: Steady()
        )
        assert outcome is not None
    loop = tuning_daemon._loops[("default", "steady")]
    assert loop.history == []
    assert "lastDecision" in spd(api, "steady")["status"]
