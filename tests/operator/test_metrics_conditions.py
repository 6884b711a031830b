"""When a tick cannot observe, status and one Event say why, and the next tick tries again:
a prometheusUrl outside the allow-list is never fetched; a Prometheus that is down ends the
tick without a decision. `tune()` against the mock API server (tests/kube, a MOCK); the
Prometheus URLs are real sockets on this host: one that records every request, one closed."""

from __future__ import annotations

import http.server
import threading
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

ANSWERS: dict[str, tuple[int, bytes]] = {"404": (404, b"not found"), "garbage": (200, b"\xff{[")}


@pytest.fixture(params=["404"])
def recorder(request: pytest.FixtureRequest) -> Iterator[tuple[str, list[str]]]:
    """An HTTP server that records each request's path and answers one way (404 unless a test
    asks for another of ANSWERS: "garbage" is a 200 whose body is not JSON)."""
    seen: list[str] = []
    code, body = ANSWERS[request.param]

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.path)
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
