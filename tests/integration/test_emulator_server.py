"""The emulator in real-time mode, as a container would run it: a `specpilot emulate` process
started with an engine's own command line, spoken to over real HTTP, its /metrics read by
SpecPilot's own metrics reader."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from specpilot.runtime.engine_metrics import observe
from specpilot.runtime.engines import LaunchSettings, get_adapter
from specpilot.runtime.scrape import fetch_snapshot, window_stats
from specpilot.tuner import SpecConfig

SPECPILOT = str(Path(sys.executable).parent / "specpilot")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_emulator(engine: str, config: SpecConfig, tmp_path: Path) -> Iterator[str]:
    port = free_port()
    adapter = get_adapter(engine)
    base = LaunchSettings(
        model="/models/llama-3.1-8b",
        served_model_name="llama",
        host="127.0.0.1",
        port=port,
        sidecar_dir=str(tmp_path),
    )
    for path, content in adapter.sidecar_files(config, base).items():
        Path(path).write_text(content)
    command = [
        SPECPILOT,
        "emulate",
        "--engine",
        engine,
        "--load-delay",
        "0.3",
        *adapter.render(config, base),
    ]
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )
    url = f"http://127.0.0.1:{port}"
    try:
        # generous: the loop ends as soon as the server answers; a loaded host starts it slowly
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert process.poll() is None, process.stdout.read().decode() if process.stdout else ""
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        yield url
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=10)


@pytest.fixture
def vllm_emulator(tmp_path: Path) -> Iterator[str]:
    config = SpecConfig(method="eagle3", num_speculative_tokens=3, draft_model="/models/eagle3")
    yield from start_emulator("vllm", config, tmp_path)


@pytest.fixture
def sglang_emulator(tmp_path: Path) -> Iterator[str]:
    config = SpecConfig(
        method="eagle3",
        num_speculative_tokens=3,
        draft_model="/models/eagle3",
        schedule=[(1, 8, 3), (9, 256, 0)],
    )
    yield from start_emulator("sglang", config, tmp_path)


def load(url: str, requests: int, concurrency: int, max_tokens: int, chat: bool = False) -> int:
    total, lock, queue = [0], threading.Lock(), list(range(requests))

    def worker() -> None:
        with httpx.Client(timeout=60) as client:
            while True:
                with lock:
                    if not queue:
                        return
                    queue.pop()
                if chat:
                    body = {
                        "model": "llama",
                        "max_tokens": max_tokens,
                        "messages": [{"role": "user", "content": "tell me a story"}],
                    }
                    response = client.post(f"{url}/v1/chat/completions", json=body)
                else:
                    body = {"model": "llama", "prompt": "word " * 200, "max_tokens": max_tokens}
                    response = client.post(f"{url}/v1/completions", json=body)
                response.raise_for_status()
                with lock:
                    total[0] += response.json()["usage"]["completion_tokens"]

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return total[0]


def test_vllm_dialect_serves_and_reads_back(vllm_emulator: str) -> None:
    url = vllm_emulator
    models = httpx.get(f"{url}/v1/models").json()
    assert models["data"][0]["id"] == "llama"
    with httpx.Client(timeout=30) as client:
        snapshots = [fetch_snapshot(client, f"{url}/metrics", time.time())]
        done = threading.Event()

        def scrape() -> None:
            with httpx.Client(timeout=30) as scraper:
                while not done.is_set():
                    snapshots.append(fetch_snapshot(scraper, f"{url}/metrics", time.time()))
                    time.sleep(0.05)

        thread = threading.Thread(target=scrape)
        thread.start()
        produced = load(url, requests=48, concurrency=16, max_tokens=64)
        done.set()
        thread.join()
        snapshots.append(fetch_snapshot(client, f"{url}/metrics", time.time()))
    assert produced == 48 * 64
    obs = observe("vllm", [window_stats("vllm", "emulator", snapshots)])
    # EAGLE-3 K=3 on chat is calibrated to 2.79 (vLLM's MT-bench figure)
    assert obs.acceptance_length is not None and 2.4 < obs.acceptance_length < 3.2
    assert obs.acceptance_per_position is not None and len(obs.acceptance_per_position) == 3
    peak = max(
        s.series("vllm:num_requests_running").get((("engine", "0"), ("model_name", "llama")), 0.0)
        for s in snapshots
    )
    assert peak > 4
    assert obs.tpot_p50_s is not None and obs.ttft_p95_s is not None
    assert obs.generation_tokens_per_s is not None and obs.generation_tokens_per_s > 0


def test_streaming_chat_delivers_every_token(vllm_emulator: str) -> None:
    body = {
        "model": "llama",
        "stream": True,
        "max_tokens": 12,
        "messages": [{"role": "user", "content": "hi"}],
    }
    words = []
    with httpx.stream("POST", f"{vllm_emulator}/v1/chat/completions", json=body, timeout=30) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line.removeprefix("data: "))
            words += chunk["choices"][0]["delta"].get("content", "").split()
    assert len(words) == 12


def test_bad_requests_name_the_field(vllm_emulator: str) -> None:
    bad = httpx.post(
        f"{vllm_emulator}/v1/completions", json={"model": "llama", "prompt": "x", "max_tokens": 0}
    )
    assert bad.status_code == 400 and "max_tokens" in bad.json()["error"]["message"]
    wrong = httpx.post(f"{vllm_emulator}/v1/completions", json={"model": "gpt", "prompt": "x"})
    assert wrong.status_code == 404 and "llama" in wrong.json()["error"]["message"]


def test_sglang_dialect_windowed_gauges(sglang_emulator: str) -> None:
    url = sglang_emulator
    with httpx.Client(timeout=30) as client:
        # like SGLang, the acceptance gauge reads 0 until a first 40-batch window completes
        assert "sglang:spec_accept_length{" in client.get(f"{url}/metrics").text
        load(url, requests=4, concurrency=4, max_tokens=100, chat=True)
        first = fetch_snapshot(client, f"{url}/metrics", time.time())
        load(url, requests=8, concurrency=4, max_tokens=200, chat=True)
        last = fetch_snapshot(client, f"{url}/metrics", time.time())
    stats = window_stats("sglang", "emulator", [first, last])
    obs = observe("sglang", [stats])
    # at batch <= 8 the adaptive bucket drafts K=3: chat acceptance around 2.79
    assert obs.acceptance_length is not None and 2.3 < obs.acceptance_length < 3.3
    assert stats.counters["verify_calls"] > 0
    text = httpx.get(f"{url}/metrics").text
    assert "sglang:spec_num_steps" in text
    # like SGLang 0.5.23, inter-token latency only for streamed requests
    assert "sglang:inter_token_latency_seconds_bucket" not in text
    body = {"model": "llama", "prompt": "word " * 50, "max_tokens": 20, "stream": True}
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=30) as response:
        response.raise_for_status()
        response.read()
    text = httpx.get(f"{url}/metrics").text
    assert 'sglang:inter_token_latency_seconds_count{engine_type="unified",model_name="llama"}' in (
        text
    )
