"""Contract with the real vLLM 0.32 (CPU build): its own parser accepts what SpecPilot renders,
a live server started from `render()` speculates, and SpecPilot reads its numbers right, both
from /metrics directly and through a real Prometheus."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from specpilot.runtime.engine_metrics import observe
from specpilot.runtime.engines import LaunchSettings, get_adapter
from specpilot.runtime.promql import PromQLReader
from specpilot.runtime.scrape import Snapshot, fetch_snapshot, parse_snapshot, window_stats
from specpilot.tuner import SpecConfig

from conftest import (
    OFFLINE_ENV,
    VLLM_PYTHON,
    Process,
    free_port,
    require,
    run_engine_script,
    start,
    start_prometheus,
    wait_http_ok,
)

pytestmark = pytest.mark.engines
VLLM = get_adapter("vllm")
SERVED = "tiny"
PROMPT = "the quick brown fox jumps over the lazy dog " * 4


def validation_cases(models: Path) -> list[tuple[SpecConfig, LaunchSettings]]:
    """Every method vLLM has, over a sample of K and schedules, each against a local model
    that vLLM accepts for it (config files suffice: no weights are loaded)."""
    llama = str(models / "llama")
    drafts = {
        "draft_model": llama,
        "eagle": llama,
        "eagle3": llama,
        "dflash": str(models / "dflash-draft"),
    }
    targets = {"mtp": str(models / "deepseek-mtp")}
    cases = []
    for method in VLLM.capabilities:
        for k in (1, 4, 16):
            for schedule in (None, ((1, 4, k), (5, 16, max(0, k - 2)), (17, 256, 0))):
                config = SpecConfig(
                    method=method,  # type: ignore[arg-type]
                    num_speculative_tokens=k,
                    draft_model=drafts.get(method),
                    schedule=schedule,
                )
                base = LaunchSettings(model=targets.get(method, llama), port=8000)
                cases.append((config, base))
    cases.append(
        (
            SpecConfig(
                method="ngram", num_speculative_tokens=3, prompt_lookup_min=2, prompt_lookup_max=6
            ),
            LaunchSettings(model=llama),
        )
    )
    return cases


def test_vllm_accepts_every_rendered_config(models: Path) -> None:
    cases = validation_cases(models)
    results = run_engine_script(
        VLLM_PYTHON, "vllm_validate.py", [VLLM.render(c, b) for c, b in cases]
    )
    for (config, _), result in zip(cases, results, strict=True):
        if config.method == "suffix":
            # vLLM validates the JSON, then needs the arctic-inference proposer, which has no
            # CPU wheel: the config is accepted up to that import.
            assert not result["ok"] and "Arctic Inference is required" in result["error"]
            continue
        assert result["ok"], f"{config.describe()}: {result['error']}"
        resolved = result["speculative"]
        assert resolved["method"] == config.method
        assert resolved["num_speculative_tokens"] == config.num_speculative_tokens
        expected_schedule = None if config.schedule is None else [list(t) for t in config.schedule]
        assert resolved["num_speculative_tokens_per_batch_size"] == expected_schedule
        if config.draft_model is not None:
            assert resolved["model"] == config.draft_model
        if config.prompt_lookup_max is not None:
            assert (resolved["prompt_lookup_min"], resolved["prompt_lookup_max"]) == (2, 6)


def test_vllm_rejects_what_specpilot_refuses(models: Path) -> None:
    """The replaced `disable_by_batch_size` key really is gone from vLLM 0.32, so SpecPilot's
    parse refusing it matches the engine."""
    llama = str(models / "llama")
    args = [
        "--model",
        llama,
        "--speculative-config",
        '{"method":"ngram","num_speculative_tokens":3,"disable_by_batch_size":4}',
    ]
    [result] = run_engine_script(VLLM_PYTHON, "vllm_validate.py", [args])
    assert not result["ok"] and "disable_by_batch_size" in result["error"]


@pytest.fixture(scope="module")
def vllm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    models = require(Path(__file__).resolve().parents[2] / ".cache/tiny-models/llama")
    port = free_port()
    config = SpecConfig(
        method="ngram", num_speculative_tokens=3, prompt_lookup_min=2, prompt_lookup_max=4
    )
    base = LaunchSettings(
        model=str(models),
        served_model_name=SERVED,
        host="127.0.0.1",
        port=port,
        extra_args=("--max-model-len", "1024", "--max-num-seqs", "32"),
    )
    command = VLLM.program(str(require(VLLM_PYTHON))) + VLLM.render(config, base)
    env = {**OFFLINE_ENV, "VLLM_CPU_KVCACHE_SPACE": "1"}
    log = tmp_path_factory.mktemp("vllm") / "server.log"
    process = start(command, log, env)
    try:
        wait_http_ok(process, f"http://127.0.0.1:{port}/health", timeout_s=600)
        yield f"http://127.0.0.1:{port}"
    finally:
        process.stop()


def send_load(url: str, requests: int, concurrency: int) -> int:
    """Greedy completions of a repetitive prompt (high n-gram acceptance); returns tokens."""
    tokens: list[int] = []
    lock = threading.Lock()
    queue = list(range(requests))

    def worker() -> None:
        with httpx.Client(timeout=300) as client:
            while True:
                with lock:
                    if not queue:
                        return
                    queue.pop()
                body = {"model": SERVED, "prompt": PROMPT, "max_tokens": 48, "temperature": 0}
                response = client.post(f"{url}/v1/completions", json=body)
                response.raise_for_status()
                with lock:
                    tokens.append(response.json()["usage"]["completion_tokens"])

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(tokens)


def raw_counter(text: str, name: str) -> float:
    """The test's own reading of one unlabelled-by-position counter: sum of its lines."""
    pattern = re.compile(rf"^{re.escape(name)}(\{{[^}}]*\}})? (\S+)$", re.MULTILINE)
    return sum(float(match.group(2)) for match in pattern.finditer(text))


def test_live_server_serves_and_metrics_read_right(vllm_server: str) -> None:
    with httpx.Client(timeout=30) as client:
        idle = [fetch_snapshot(client, f"{vllm_server}/metrics", time.time()) for _ in range(2)]
        start_text = client.get(f"{vllm_server}/metrics").text
        during: list[Snapshot] = [parse_snapshot(start_text, time.time())]
        done = threading.Event()

        def scrape_while_loaded() -> None:
            with httpx.Client(timeout=30) as scraper:
                while not done.is_set():
                    during.append(fetch_snapshot(scraper, f"{vllm_server}/metrics", time.time()))
                    time.sleep(0.1)

        scraper = threading.Thread(target=scrape_while_loaded)
        scraper.start()
        # enough requests that, even on a loaded 2-core machine, scrapes land mid-batch
        generated = send_load(vllm_server, requests=96, concurrency=16)
        done.set()
        scraper.join()
        end_text = client.get(f"{vllm_server}/metrics").text
        during.append(parse_snapshot(end_text, time.time()))

    assert generated > 0
    observation = observe("vllm", [window_stats("vllm", "server", during)])
    accepted = raw_counter(end_text, "vllm:spec_decode_num_accepted_tokens_total") - raw_counter(
        start_text, "vllm:spec_decode_num_accepted_tokens_total"
    )
    drafts = raw_counter(end_text, "vllm:spec_decode_num_drafts_total") - raw_counter(
        start_text, "vllm:spec_decode_num_drafts_total"
    )
    assert drafts > 0
    by_hand = 1 + accepted / drafts
    assert observation.acceptance_length == pytest.approx(by_hand, rel=1e-12)
    assert 1.0 < by_hand <= 4.0  # K=3: at most 3 accepted plus the bonus token
    idle_running = observe("vllm", [window_stats("vllm", "server", idle)]).running_requests
    # The batch is an integral over the window, not the gauge at scrape instants (which a busy
    # CPU engine answers between steps): 16 clients keep requests in the engine (several on a
    # quiet host; under stress-ng 0.48 was read, so only a bound a loaded host cannot cross).
    assert idle_running == 0.0
    assert observation.running_requests is not None and observation.running_requests > 0.0
    peak_running = observation.running_requests
    assert (
        observation.generation_tokens_per_s is not None and observation.generation_tokens_per_s > 0
    )
    assert observation.tpot_p50_s is not None and observation.ttft_p95_s is not None
    print(f"live vLLM ngram K=3: acceptance length {by_hand:.4f}, mean batch {peak_running:.2f}")


@pytest.fixture
def prometheus(
    prometheus_binary: Path, vllm_server: str, tmp_path: Path, stopper: list[Process]
) -> str:
    target = vllm_server.removeprefix("http://")
    return start_prometheus(prometheus_binary, "vllm", target, tmp_path, stopper)


def wait_for_samples(reader: PromQLReader, minimum: int, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = reader.query("count_over_time(vllm:num_requests_running[5m])", time.time())
        if found and found[0][1] >= minimum:
            return
        time.sleep(0.5)
    pytest.fail("Prometheus did not scrape the vLLM server")


def test_promql_reader_matches_raw_counters(vllm_server: str, prometheus: str) -> None:
    reader = PromQLReader(prometheus, pod_label="instance", selector='job="vllm"')
    wait_for_samples(reader, minimum=3)
    window_start = time.time()
    time.sleep(1.5)
    # long enough (several 1 s scrapes) for the running gauge to be caught mid-load
    send_load(vllm_server, requests=128, concurrency=16)
    time.sleep(3.0)  # let at least two scrapes land after the load
    window_end = time.time()
    [stats] = reader.window_stats("vllm", window_end - window_start, window_end)
    observation = observe("vllm", [stats])

    def at(name: str, t: float) -> float:
        return sum(v for _, v in reader.query(f'sum({name}{{job="vllm"}})', t))

    accepted = at("vllm:spec_decode_num_accepted_tokens_total", window_end) - at(
        "vllm:spec_decode_num_accepted_tokens_total", window_start
    )
    drafts = at("vllm:spec_decode_num_drafts_total", window_end) - at(
        "vllm:spec_decode_num_drafts_total", window_start
    )
    assert drafts > 0
    assert observation.acceptance_length == pytest.approx(1 + accepted / drafts, rel=1e-6)
    assert observation.pods == (vllm_server.removeprefix("http://"),)
    # The batch is an integral over the window (engine_metrics.running_estimate), not the
    # gauge at scrape instants, which a busy CPU engine answers between steps: with 16 clients
    # the engine holds requests whenever Prometheus happened to scrape (several on a quiet host;
    # a starved one holds fewer, so only a bound a loaded host cannot cross).
    assert observation.running_requests is not None and observation.running_requests > 0.0
    assert (
        observation.generation_tokens_per_s is not None and observation.generation_tokens_per_s > 0
    )
