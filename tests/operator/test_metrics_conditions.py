"""When a tick cannot observe, status and one Event say why, and the next tick tries again:
a prometheusUrl outside the allow-list is never fetched; a Prometheus that is down ends the
tick without a decision. `tune()` against the mock API server (tests/kube, a MOCK); the
Prometheus URLs are real sockets on this host: one that records every request, one closed."""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kube.apiserver import ApiServer
from kube.operator_process import free_port
from tuning_helpers import create, events, later, spd

from specpilot.operator.kube.client import KubeRest
from specpilot.operator.kube.reconcile import reconcile
from specpilot.operator.kube.tuning_daemon import tune
from specpilot.operator.kube.url_policy import FIELD, UrlAllowList

ANSWERS: dict[str, tuple[int, bytes]] = {
    "404": (404, b"not found"),
    "garbage": (200, b"\xff{["),
    "slow": (200, b'{"status":"success","data":{"resultType":"vector","result":[]}}'),
}
SLOW_S = 60.0
"""How long the "slow" Prometheus takes to answer: far past the reader's timeout (10 s)."""


@pytest.fixture(params=["404"])
def recorder(request: pytest.FixtureRequest) -> Iterator[tuple[str, list[str]]]:
    """An HTTP server that records each request's path and answers one way (404 unless a test
    asks for another of ANSWERS: "garbage" is a 200 whose body is not JSON, "slow" a valid
    answer SLOW_S seconds late)."""
    seen: list[str] = []
    code, body = ANSWERS[request.param]
    released = threading.Event()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.path)
            if request.param == "slow":
                released.wait(SLOW_S)
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", seen
    released.set()
    server.shutdown()
    server.server_close()


def metrics_condition(api: ApiServer, name: str) -> dict[str, Any]:
    conditions = spd(api, name)["status"]["conditions"]
    found: dict[str, Any] = next(c for c in conditions if c["type"] == "MetricsAvailable")
    return found


def no_wait(_: float) -> None:
    pass


def test_a_url_outside_the_allow_list_is_never_fetched(
    api: ApiServer, rest: KubeRest, recorder: tuple[str, list[str]]
) -> None:
    url, seen = recorder
    metrics = {"source": "prometheus", "prometheusUrl": url}
    reconcile(rest, create(api, "nosy", metrics=metrics))
    policy = UrlAllowList(("http://prometheus.monitoring:9090",))
    assert tune(rest, spd(api, "nosy"), now=later(), sleep=no_wait, url_policy=policy) is None
    assert seen == []  # not one request reached the URL
    condition = metrics_condition(api, "nosy")
    assert (condition["status"], condition["reason"]) == ("False", "PrometheusUrlNotAllowed")
    assert FIELD in condition["message"] and url in condition["message"]
    assert "http://prometheus.monitoring:9090" in condition["message"]
    assert events(api, "nosy")["PrometheusUrlNotAllowed"]["type"] == "Warning"
    assert "lastDecision" not in spd(api, "nosy")["status"]


@pytest.mark.parametrize("recorder", ["404", "garbage"], indirect=True)
def test_a_url_the_allow_list_names_is_fetched_and_a_bad_answer_is_unavailable(
    api: ApiServer, rest: KubeRest, recorder: tuple[str, list[str]]
) -> None:
    url, seen = recorder
    reconcile(rest, create(api, "allowed", metrics={"source": "prometheus", "prometheusUrl": url}))
    policy = UrlAllowList.configured([url], env={})
    tune(rest, spd(api, "allowed"), now=later(), sleep=no_wait, url_policy=policy)
    assert seen and seen[0].startswith("/api/v1/query")  # it asked; that is no Prometheus
    condition = metrics_condition(api, "allowed")
    assert (condition["status"], condition["reason"]) == ("False", "PrometheusUnavailable")


def test_prometheus_down_is_a_condition_and_one_event_and_ticking_goes_on(
    api: ApiServer, rest: KubeRest
) -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    reconcile(rest, create(api, "blind", metrics={"source": "prometheus", "prometheusUrl": url}))
    policy = UrlAllowList((url,))
    now = later()
    for tick in range(2):  # one tick per interval (5 s), each one trying again
        when = now + 5 * tick
        assert tune(rest, spd(api, "blind"), now=when, sleep=no_wait, url_policy=policy) is None
        condition = metrics_condition(api, "blind")
        assert (condition["status"], condition["reason"]) == ("False", "PrometheusUnavailable")
        assert FIELD in condition["message"] and url in condition["message"]
    warned = [
        e for e in api.list("", "events", "default") if e["reason"] == "PrometheusUnavailable"
    ]
    assert [(e["type"], e.get("count", 1)) for e in warned] == [("Warning", 1)]  # one, deduplicated
    assert spd(api, "blind")["status"]["phase"] != "Degraded"


@pytest.mark.parametrize("recorder", ["slow"], indirect=True)
def test_a_slow_prometheus_times_out_into_a_condition_and_ticking_goes_on(
    api: ApiServer, rest: KubeRest, recorder: tuple[str, list[str]]
) -> None:
    """A Prometheus that answers after the reader's timeout: the tick ends without a decision
    (MetricsAvailable False, one Warning Event) after one timeout, not after a retry of every
    timed-out read, and the next tick asks again. The bound is wide: 10 s timeouts, so one
    tick takes about 10 s; four reads (the client's retries) took over 40 s."""
    url, seen = recorder
    reconcile(rest, create(api, "slow", metrics={"source": "prometheus", "prometheusUrl": url}))
    policy = UrlAllowList((url,))
    now = later()
    for tick in range(2):
        started = time.monotonic()
        done: list[Any] = []

        def one_tick(when: float = now + 5 * tick, into: list[Any] = done) -> None:
            into.append(tune(rest, spd(api, "slow"), now=when, sleep=no_wait, url_policy=policy))

        thread = threading.Thread(target=one_tick, daemon=True)
        thread.start()
        thread.join(SLOW_S)
        took = time.monotonic() - started
        assert done == [None], f"tick {tick} still waiting after {took:.0f}s: a hang"
        assert took < 30.0, f"one tick took {took:.0f}s"
        condition = metrics_condition(api, "slow")
        assert (condition["status"], condition["reason"]) == ("False", "PrometheusUnavailable")
        assert "timed out" in condition["message"].lower(), condition["message"]
    assert len(seen) == 2  # each tick asked once, and gave up at the timeout
    warned = [
        e for e in api.list("", "events", "default") if e["reason"] == "PrometheusUnavailable"
    ]
    assert [(e["type"], e.get("count", 1)) for e in warned] == [("Warning", 1)]
