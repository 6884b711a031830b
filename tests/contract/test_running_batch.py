"""The running batch SpecPilot reads from a real vLLM 0.32 server (CPU build) over a window of
exactly two scrapes (its start and its end), against the concurrency the client keeps in
flight (closed-loop users, wide_model.py).

Contract: `Observation.running_requests`, the request-seconds vLLM accumulated in the window
over its length (engine_metrics.running_estimate: the inter-token-latency sum plus prefill
time), agrees within 20% with an independent reading of the same two snapshots (the decode
batch per engine step: inter-token observations over `vllm:iteration_tokens_total`'s step
count), is within 20% of the client's concurrency at 1 user, and at 32 users is what the engine
holds: 30.75 measured on a quiet host (`pytest tests/contract/test_running_batch.py -s`), fewer
on a starved one, where the rest wait in the HTTP layer, so only a bound a loaded host cannot
cross (a quarter of the clients) is asserted against the client there. The sampled
`vllm:num_requests_running` gauge (what the tuner used to read) is printed beside them, not
asserted. Read through a real Prometheus (PromQLReader) the same window gives the same batch
as the direct two scrapes, also when a starved Prometheus scraped late (the reader divides
by the span Prometheus' samples cover, not the window asked).
A random model wider than the tiny one keeps the engine, not the HTTP front end, the
bottleneck (wide_model.py says why). ~3 minutes on two cores, most of it vLLM's start.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from wide_model import ClosedLoop, write_wide_model

from specpilot.runtime.engine_metrics import observe
from specpilot.runtime.engines import LaunchSettings, get_adapter
from specpilot.runtime.promql import PromQLReader
from specpilot.runtime.scrape import Snapshot, fetch_snapshot, window_stats
from specpilot.tuner import SpecConfig

from conftest import (
    OFFLINE_ENV,
    VLLM_PYTHON,
    Process,
    free_port,
    require,
    start,
    start_prometheus,
    wait_http_ok,
)

pytestmark = pytest.mark.engines
SERVED = "wide"
WINDOW_S = 8.0
TOLERANCE = 0.20


@pytest.fixture(scope="module")
def vllm_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    model = write_wide_model(tmp_path_factory.mktemp("wide-llama"))
    vllm = get_adapter("vllm")
    port = free_port()
    launch = LaunchSettings(
        model=str(model),
        served_model_name=SERVED,
        host="127.0.0.1",
        port=port,
        extra_args=("--max-model-len", "1024", "--max-num-seqs", "32"),
    )
    command = vllm.program(str(require(VLLM_PYTHON))) + vllm.render(SpecConfig(), launch)
    log = tmp_path_factory.mktemp("vllm-wide") / "server.log"
    process = start(command, log, {**OFFLINE_ENV, "VLLM_CPU_KVCACHE_SPACE": "1"})
    try:
        wait_http_ok(process, f"http://127.0.0.1:{port}/health", timeout_s=600)
        yield f"http://127.0.0.1:{port}"
    finally:
        process.stop()


def total(snapshot: Snapshot, name: str) -> float:
    return sum(snapshot.series(name).values())


@pytest.mark.parametrize("users", [1, 32])
def test_two_scrapes_read_the_clients_concurrency(vllm_url: str, users: int) -> None:
    url = f"{vllm_url}/metrics"
    with ClosedLoop(vllm_url, SERVED, users) as load, httpx.Client(timeout=60) as client:
        time.sleep(2.0 + users / 8)  # every user has a request in flight
        # exactly two scrapes, stamped as each request starts (as runtime/window.py does)
        first = fetch_snapshot(client, url, time.monotonic())
        time.sleep(WINDOW_S)
        last = fetch_snapshot(client, url, time.monotonic())
    assert not load.errors, load.errors[:3]
    stats = window_stats("vllm", "server", [first, last])
    observation = observe("vllm", [stats])
    batch = observation.running_requests

    def delta(name: str) -> float:
        return total(last, name) - total(first, name)

    steps = delta("vllm:iteration_tokens_total_count")
    per_step = delta("vllm:inter_token_latency_seconds_count") / steps
    finished = delta("vllm:request_inference_time_seconds_count")
    print(
        f"\nvLLM, {users} users: window {stats.window_s:.2f} s, {finished:.0f} completions, "
        f"{steps:.0f} steps; running (integral) {batch:.2f}, decode batch per step "
        f"{per_step:.2f}, gauge at the two instants {observation.running_requests_gauge}"
    )
    assert batch is not None
    # The engine's own truth, read independently from the same two snapshots (requests per
    # step, not request-seconds per second): the integral must agree with it on a quiet host.
    # A starved one steps irregularly, and the integral weighs each step by its length (and
    # counts the stalls between steps) where the per-step count does not, so there it reads
    # more (6.02 against 3.36 per step beside stress-ng --cpu 2), never less.
    assert per_step == pytest.approx(batch, rel=TOLERANCE) or per_step < batch
    if users == 1:
        assert batch == pytest.approx(users, rel=TOLERANCE)
    else:
        # On a quiet host the engine holds the clients' concurrency (30.75 of 32 measured,
        # see the module docstring); a starved 2-core host holds fewer in the engine while the
        # rest wait in the HTTP layer, which no engine metric sees, so against the client only
        # a bound a loaded host cannot cross is asserted; the gauge's instants read ~0 here.
        assert batch > users / 4


@pytest.fixture
def prometheus(
    prometheus_binary: Path, vllm_url: str, tmp_path: Path, stopper: list[Process]
) -> PromQLReader:
    target = vllm_url.removeprefix("http://")
    url = start_prometheus(prometheus_binary, "vllm", target, tmp_path, stopper)
    return PromQLReader(url, pod_label="instance", selector='job="vllm"')


def test_promql_reads_the_same_batch(vllm_url: str, prometheus: PromQLReader) -> None:
    users = 32
    url = f"{vllm_url}/metrics"
    with ClosedLoop(vllm_url, SERVED, users) as load, httpx.Client(timeout=60) as client:
        time.sleep(6.0)  # every user in flight, and Prometheus has scraped the load
        first = fetch_snapshot(client, url, time.monotonic())
        time.sleep(WINDOW_S)
        end = time.time()
        last = fetch_snapshot(client, url, time.monotonic())
        time.sleep(2.5)  # a scrape after the window's end
    assert not load.errors, load.errors[:3]
    [stats] = prometheus.window_stats("vllm", WINDOW_S, end)
    observation = observe("vllm", [stats])
    direct = observe("vllm", [window_stats("vllm", "server", [first, last])]).running_requests
    print(
        f"\nvLLM through Prometheus, {users} users: running {observation.running_requests}, "
        f"directly {direct}, gauge averaged over its 1 s scrapes "
        f"{observation.running_requests_gauge}; increase() spoke for {stats.window_s:.2f} s of "
        f"the {WINDOW_S} s window"
    )
    assert observation.running_requests is not None and direct is not None
    assert observation.running_requests == pytest.approx(direct, rel=TOLERANCE)
    assert observation.running_requests > users / 4  # see the two-scrape test
