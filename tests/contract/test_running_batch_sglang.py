"""The running batch SpecPilot reads from a real SGLang 0.5.23 server on CPU (sglang_live.py
says what the test adds to the rendered command line) over a window of exactly two scrapes,
against the concurrency the client keeps in flight (closed-loop users, wide_model.py).

Contract: `Observation.running_requests` (engine_metrics.running_estimate: the mean time a
request spends in the server minus its queueing, times the mean of the window's starts and
completions, over the window) is within 20% of the client's concurrency at 1 and 8 users. The
sampled `sglang:num_running_reqs` gauge is printed beside it, not asserted. The window is 12 s:
SGLang's per-request series are observed when a request starts or finishes, so a window
holding few requests reads them in whole requests' worth. ~2 minutes on two cores.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest
from sglang_live import SGLANG, STANDIN, cpu_flags
from wide_model import ClosedLoop, write_wide_model

from specpilot.runtime.engine_metrics import observe
from specpilot.runtime.engines import LaunchSettings
from specpilot.runtime.scrape import fetch_snapshot, window_stats
from specpilot.tuner import SpecConfig

from conftest import OFFLINE_ENV, ROOT, SGLANG_PYTHON, free_port, require, start, wait_http_ok

pytestmark = pytest.mark.engines
SERVED = "wide"
WINDOW_S = 12.0
TOLERANCE = 0.20


@pytest.fixture(scope="module")
def sglang_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    model = write_wide_model(tmp_path_factory.mktemp("wide-llama"))
    folder = tmp_path_factory.mktemp("sglang-wide")
    port = free_port()
    config = SpecConfig()
    launch = LaunchSettings(
        model=str(model),
        served_model_name=SERVED,
        host="127.0.0.1",
        port=port,
        sidecar_dir=str(folder),
        extra_args=cpu_flags(config),
    )
    command = SGLANG.program(str(require(SGLANG_PYTHON))) + SGLANG.render(config, launch)
    env = {
        **OFFLINE_ENV,
        "SGLANG_USE_CPU_ENGINE": "1",
        "SGLANG_CACHE_DIR": str(ROOT / ".cache/sglang-jit"),
        "PYTHONPATH": str(STANDIN),
        "SPECPILOT_STANDIN_CLAIM_AMX": "0",
    }
    process = start(command, folder / "server.log", env)
    try:
        wait_http_ok(process, f"http://127.0.0.1:{port}/health", timeout_s=900)
        yield f"http://127.0.0.1:{port}"
    finally:
        process.stop()


@pytest.mark.parametrize("users", [1, 8])
def test_two_scrapes_read_the_clients_concurrency(sglang_url: str, users: int) -> None:
    url = f"{sglang_url}/metrics"
    with ClosedLoop(sglang_url, SERVED, users) as load, httpx.Client(timeout=60) as client:
        time.sleep(3.0)  # every user has a request in flight
        first = fetch_snapshot(client, url, time.monotonic())
        time.sleep(WINDOW_S)
        last = fetch_snapshot(client, url, time.monotonic())
    assert not load.errors, load.errors[:3]
    stats = window_stats("sglang", "server", [first, last])
    observation = observe("sglang", [stats])
    batch = observation.running_requests
    print(
        f"\nSGLang, {users} users: window {stats.window_s:.2f} s, "
        f"{stats.histogram_counts.get('queue_s', 0):.0f} starts, "
        f"{stats.histogram_counts.get('e2e_s', 0):.0f} completions; running {batch:.2f}, "
        f"gauge at the two instants {observation.running_requests_gauge}"
    )
    assert batch is not None
    assert batch == pytest.approx(users, rel=TOLERANCE)
