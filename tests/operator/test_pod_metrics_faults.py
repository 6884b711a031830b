"""An engine pod's /metrics misbehaving, read by the operator's own tick: `tune()` with the
real Kubernetes actuator scraping over real HTTP a local server that stands in for the pod's
engine (a pod in the mock API server, tests/kube, a MOCK, whose IP and port point at it).

Each fault has one clear outcome: the tick ends (no exception), status holds no NaN or
infinity (a strict JSON parse), and nothing is learned from a window that measures nothing
(500, an empty body, NaN or infinite counters, a frozen endpoint whose counters never move,
counters that went backwards as an engine restart makes them): the tuner's acceptance counts
stay what they were. A healthy endpoint, the control, does teach it."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from kube.apiserver import ApiServer
from tuning_helpers import create, later, spd

from specpilot.operator.api.names import CONFIG_ANNOTATION
from specpilot.operator.kube.children import selector_labels
from specpilot.operator.kube.client import KubeRest
from specpilot.operator.kube.reconcile import reconcile
from specpilot.operator.kube.tuning_daemon import tune
from specpilot.tuner import SpecConfig

PODS = "/api/v1/namespaces/default/pods"
MERGE = {"Content-Type": "application/merge-patch+json"}
RUNNING = SpecConfig(method="ngram", num_speculative_tokens=4)


def exposition(tokens: float | str, drafts: float | str, accepted: float | str) -> str:
    draft_tokens = drafts if isinstance(drafts, str) else drafts * 4
    return (
        "# TYPE vllm:generation_tokens counter\n"
        f"vllm:generation_tokens_total {tokens}\n"
        "# TYPE vllm:spec_decode_num_drafts counter\n"
        f"vllm:spec_decode_num_drafts_total {drafts}\n"
        "# TYPE vllm:spec_decode_num_draft_tokens counter\n"
        f"vllm:spec_decode_num_draft_tokens_total {draft_tokens}\n"
        "# TYPE vllm:spec_decode_num_accepted_tokens counter\n"
        f"vllm:spec_decode_num_accepted_tokens_total {accepted}\n"
        "# TYPE vllm:num_requests_running gauge\n"
        "vllm:num_requests_running 4\n"
    )


def healthy(n: int) -> tuple[int, str]:  # acceptance length 2.5 per window
    return 200, exposition(100.0 * n, 40.0 * n, 60.0 * n)


FAULTS: dict[str, Callable[[int], tuple[int, str]]] = {
    "http-500": lambda n: (500, "internal error"),
    "empty": lambda n: (200, ""),
    "nan": lambda n: (200, exposition("NaN", "NaN", "NaN")),
    "inf": lambda n: (200, exposition("+Inf", "+Inf", "+Inf")),
    "frozen": lambda n: healthy(5),  # the same numbers on every scrape
}


@pytest.fixture
def engine() -> Iterator[tuple[int, dict[str, Callable[[int], tuple[int, str]]]]]:
    """A /metrics endpoint answering `answer["now"](n)` to its n-th request."""
    answer: dict[str, Callable[[int], tuple[int, str]]] = {"now": healthy}
    served = [0]

    class Metrics(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            served[0] += 1
            code, text = answer["now"](served[0])
            body = text.encode()
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1], answer
    server.shutdown()
    server.server_close()


def engine_pod(api: ApiServer, name: str, port: int) -> None:
    meta = {
        "name": f"{name}-0",
        "labels": selector_labels(name, "main"),
        "annotations": {CONFIG_ANNOTATION: RUNNING.to_json(), "prometheus.io/port": str(port)},
    }
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
           "spec": {"containers": [{"name": "engine", "image": "engine"}]}}  # fmt: skip
    assert httpx.post(api.url + PODS, json=pod).status_code == 201
    status = {"podIP": "127.0.0.1", "conditions": [{"type": "Ready", "status": "True"}]}
    patched = httpx.patch(f"{api.url}{PODS}/{name}-0/status", json={"status": status},
                          headers=MERGE)  # fmt: skip
    assert patched.status_code == 200


def strict_status(api: ApiServer, name: str) -> dict[str, Any]:
    """The status as strict JSON allows it: a NaN or an infinity anywhere raises."""

    def refuse(constant: str) -> None:
        raise AssertionError(f"{constant} in status")

    text = json.dumps(spd(api, name)["status"])
    status: dict[str, Any] = json.loads(text, parse_constant=refuse)
    state = status.get("tunerState")
    if state:
        json.loads(state, parse_constant=refuse)
    return status


def learned(status: dict[str, Any]) -> Any:
    return json.loads(status["tunerState"]).get("acceptance_counts")


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_a_pod_serving_bad_metrics_teaches_the_tuner_nothing_and_breaks_nothing(
    api: ApiServer,
    rest: KubeRest,
    engine: tuple[int, dict[str, Callable[[int], tuple[int, str]]]],
    fault: str,
) -> None:
    port, answer = engine
    name = f"bad-{fault}"
    before, now = healthy_tick(api, rest, name, port)
    answer["now"] = FAULTS[fault]
    outcome = tune(rest, spd(api, name), now=now + 5)
    assert outcome is not None, "the tick ends with a decision"
    status = strict_status(api, name)
    assert learned(status) == before, f"{fault}: learned from a window that measured nothing"
    assert "acceptanceLength" not in (status.get("observed") or {}), status["observed"]
    if fault in ("http-500", "empty"):
        condition = next(c for c in status["conditions"] if c["type"] == "MetricsAvailable")
        assert condition["status"] == "False", condition


def test_counters_going_backwards_are_an_engine_restart_counted_from_zero(
    api: ApiServer,
    rest: KubeRest,
    engine: tuple[int, dict[str, Callable[[int], tuple[int, str]]]],
) -> None:
    """After a restart the counters count from zero again: the window measures what the new
    engine did (acceptance 2.5 as before), never a negative or huge figure from the drop."""
    port, answer = engine
    _, now = healthy_tick(api, rest, "restarted", port)
    served = {"n": 0}

    def after_restart(_: int) -> tuple[int, str]:
        served["n"] += 1  # the first answer is the old engine's last, far above
        return healthy(10_000) if served["n"] == 1 else healthy(served["n"] - 1)

    answer["now"] = after_restart
    assert tune(rest, spd(api, "restarted"), now=now + 5) is not None
    status = strict_status(api, "restarted")
    assert status["observed"].get("acceptanceLength") in (None, 2.5), status["observed"]


def healthy_tick(api: ApiServer, rest: KubeRest, name: str, port: int) -> tuple[Any, float]:
    """A SpecDeployment in mode recommend (it decides, never rolls out) whose one pod is the
    local endpoint; one healthy tick (the control): what it learned, and when."""
    reconcile(rest, create(api, name, "recommend"))
    engine_pod(api, name, port)
    now = later()
    assert tune(rest, spd(api, name), now=now) is not None
    status = strict_status(api, name)
    assert status["observed"]["acceptanceLength"] == 2.5, status["observed"]
    return learned(status), now
