"""Two `--standalone` operators: the second refuses loudly; a killed one's replacement starts.

The guard's rules run in-process against the mock API server (KMock with the realism layer:
resourceVersion conflicts, the chart's ClusterRole enforced) on a fake clock; the last test runs
the real `specpilot operator --standalone` processes.
"""

from __future__ import annotations

import datetime
import os
import signal
from pathlib import Path
from typing import Any

import httpx
import pytest
from kube.apiserver import ApiServer, running_apiserver
from kube.chart import operator_rules
from kube.operator_process import running_operator, start_operator, stop, wait_for
from tuning_helpers import create

from specpilot.operator.kube.client import KubeRest
from specpilot.operator.kube.standalone_guard import (
    STANDALONE_PRIORITY,
    GuardRefused,
    StandaloneGuard,
)

START = datetime.datetime(2026, 12, 2, 8, 0, tzinfo=datetime.UTC)


class FakeClock:
    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> datetime.datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += datetime.timedelta(seconds=seconds)


def guard(rest: KubeRest, identity: str, clock: FakeClock, **kw: Any) -> StandaloneGuard:
    return StandaloneGuard(rest, "specpilot", None, identity=identity, lifetime_s=60,
                           clock=clock, sleep=clock.advance, **kw)  # fmt: skip


def entries(api: ApiServer) -> dict[str, Any]:
    # The API server drops `status` from a create; the entries arrive with the first
    # status patch, so a peering caught in between has none yet.
    peering = api.get("kopf.dev", "clusterkopfpeerings", "", "specpilot") or {}
    return dict(peering.get("status") or {})


def test_a_second_standalone_is_refused_while_the_first_refreshes(
    api: ApiServer, rest: KubeRest
) -> None:
    clock = FakeClock()
    first = guard(rest, "pod-a", clock)
    first.acquire()
    assert entries(api)["pod-a"]["priority"] == STANDALONE_PRIORITY

    def tick(seconds: float) -> None:  # time passes; the first operator refreshes meanwhile
        clock.advance(seconds)
        assert first._refresh() is None

    second = StandaloneGuard(rest, "specpilot", None, identity="pod-b", clock=clock, sleep=tick)
    with pytest.raises(GuardRefused, match="held by a standalone operator 'pod-a'"):
        second.acquire()
    assert clock.now - START < datetime.timedelta(seconds=60)  # refused on evidence, not later
    assert set(entries(api)) == {"pod-a"}


def test_a_killed_operators_entry_is_taken_over_once_its_lifetime_ends(
    api: ApiServer, rest: KubeRest
) -> None:
    clock = FakeClock()
    guard(rest, "pod-a", clock).acquire()  # then killed: it never refreshes again
    clock.advance(10)
    replacement = guard(rest, "pod-b", clock)
    replacement.acquire()
    assert clock.now >= START + datetime.timedelta(seconds=60)  # waited for the deadline
    assert set(entries(api)) == {"pod-b"}  # the dead entry is gone


def test_a_restarted_container_in_the_same_pod_takes_its_entry_at_once(
    api: ApiServer, rest: KubeRest
) -> None:
    clock = FakeClock()
    guard(rest, "pod-a", clock).acquire()
    guard(rest, "pod-a", clock).acquire()
    assert clock.now == START


def test_of_two_starting_at_once_the_one_that_wrote_second_judges_again(
    api: ApiServer, rest: KubeRest
) -> None:
    clock = FakeClock()
    seen_by_b = rest.get("kopf.dev/v1", "clusterkopfpeerings", None, "specpilot") or {}
    guard(rest, "pod-a", clock).acquire()
    assert seen_by_b == {} or not guard(rest, "pod-b", clock)._write(seen_by_b, [])
    assert set(entries(api)) == {"pod-a"}


def test_a_hold_lost_to_a_replacement_stops_the_stalled_operator(
    api: ApiServer, rest: KubeRest
) -> None:
    clock = FakeClock()
    stalled = guard(rest, "pod-a", clock)
    stalled.acquire()
    guard(rest, "pod-b", clock).acquire()  # pod-a missed its refreshes for a whole lifetime
    lost = stalled._refresh()
    assert lost is not None and "was removed" in lost
    assert set(entries(api)) == {"pod-b"}


def test_a_live_kopf_peering_operator_refuses_a_standalone_one(
    api: ApiServer, rest: KubeRest
) -> None:
    clock = FakeClock()
    peer = {"priority": 7, "lifetime": 60, "lastseen": START.isoformat()}
    rest.create({"apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering",
                 "metadata": {"name": "specpilot"}, "status": {"peer-1": peer}})  # fmt: skip

    def tick(seconds: float) -> None:
        clock.advance(seconds)
        fresh = {**peer, "lastseen": clock.now.isoformat()}
        rest.patch("kopf.dev/v1", "clusterkopfpeerings", None, "specpilot",
                   {"status": {"peer-1": fresh}})  # fmt: skip

    refused = StandaloneGuard(rest, "specpilot", None, identity="pod-b", clock=clock, sleep=tick)
    with pytest.raises(GuardRefused, match="kopf peering operator 'peer-1'"):
        refused.acquire()


def test_two_standalone_operator_processes(tmp_path: Path) -> None:
    """The real command: the second exits 2 with one error line naming the first; after a
    SIGKILL of the first, a third starts once the entry's lifetime has passed and serves; a
    fourth whose entry is taken from it stops with one error line."""
    lifetime = ("--standalone", "--standalone-lifetime", "4")
    with (
        running_apiserver(tmp_path, operator_rules=operator_rules(tmp_path)) as api,
        httpx.Client(base_url=api.url, timeout=10) as http,
    ):
        first = start_operator(api, tmp_path / "a.log", *lifetime, env={"POD_ID": "pod-a"})
        try:
            wait_for(lambda: "pod-a" in (entries(api) if _peering(api) else {}), 30)
            second = start_operator(api, tmp_path / "b.log", *lifetime, env={"POD_ID": "pod-b"})
            assert second.process.wait(60 * 4) == 2
            errors = [ln for ln in second.text().splitlines() if ln.startswith("error:")]
            assert errors and "held by a standalone operator 'pod-a'" in errors[0]
            assert "Traceback" not in second.text()
            assert "reconcile_spec" not in second.text()
        finally:
            os.kill(first.process.pid, signal.SIGKILL)
            first.process.wait(10)
        with running_operator(api, tmp_path / "c.log", *lifetime, env={"POD_ID": "pod-c"}) as third:
            wait_for(lambda: set(entries(api)) == {"pod-c"}, 30)
            create(api, "after", mode="off")
            wait_for(lambda: api.get("apps", "deployments", "default", "after"), 30)
            stop(third.process)
            assert third.process.returncode == 0
            assert entries(api) == {}  # a graceful exit withdraws the entry
        fourth_log = tmp_path / "d.log"
        with running_operator(api, fourth_log, *lifetime, env={"POD_ID": "pod-d"}) as fourth:
            wait_for(lambda: set(entries(api)) == {"pod-d"}, 30)
            # what a replacement does to an entry it found dead (this one stalled, say)
            http.patch(
                "/apis/kopf.dev/v1/clusterkopfpeerings/specpilot",
                json={"status": {"pod-d": None}},
                headers={"Content-Type": "application/merge-patch+json"},
            ).raise_for_status()
            assert fourth.process.wait(60) == 1  # kopf stopped gracefully, loudly
            assert "error: this operator's entry in ClusterKopfPeering" in fourth.text()
        assert api.denials() == []


def _peering(api: ApiServer) -> bool:
    return api.get("kopf.dev", "clusterkopfpeerings", "", "specpilot") is not None
