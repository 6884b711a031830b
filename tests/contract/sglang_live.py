"""A real SGLang 0.5.23 server on this CPU, started from the command line SpecPilot's adapter
renders, for the live contract tests.

Contract: `ServerPool.get(name)` returns a ready server for one of `CONFIGS`, started as
`SGLANG.program(python) + SGLANG.render(config, launch)`. The test adds only what a CPU needs,
as `LaunchSettings.extra_args` and environment: `--device cpu`, an attention backend, no CUDA
graphs, bf16 and a small KV pool; `SGLANG_USE_CPU_ENGINE=1`; and the test-only `sgl_kernel`
stand-in on PYTHONPATH (tests/contract/engine_side/sgl_kernel_standin). NGRAM verifies a draft
tree, which only SGLang's intel_amx attention backend does on CPU, so speculative servers ask
for it and the stand-in tells SGLang this CPU has AMX (its model layers still run plain torch).
An idle SGLang scheduler polls and holds one of the two cores, so the pool keeps at most one
server alive: asking for another stops the current one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from specpilot.runtime.engines import LaunchSettings, get_adapter
from specpilot.runtime.scrape import Snapshot, fetch_snapshot
from specpilot.tuner import SpecConfig

from conftest import (
    ENGINE_SIDE,
    MODELS,
    OFFLINE_ENV,
    ROOT,
    SGLANG_PYTHON,
    Process,
    free_port,
    require,
    start,
    wait_http_ok,
)

SGLANG = get_adapter("sglang")
SERVED = "tiny"
STANDIN = ENGINE_SIDE / "sgl_kernel_standin"
CONFIGS: dict[str, SpecConfig] = {
    "plain": SpecConfig(),
    "ngram-k3": SpecConfig(method="ngram", num_speculative_tokens=3),
    "ngram-k5": SpecConfig(method="ngram", num_speculative_tokens=5),
}
# Greedy, repetitive prompts: the random tiny model falls into loops the n-gram table matches.
PROMPTS = (
    "the quick brown fox jumps over the lazy dog " * 4,
    "one two three four five six seven eight nine ten " * 3,
    "to be or not to be that is the question " * 3,
)


def cpu_flags(config: SpecConfig) -> tuple[str, ...]:
    backend = "intel_amx" if config.speculative else "torch_native"
    return (
        "--device",
        "cpu",
        "--attention-backend",
        backend,
        "--disable-cuda-graph",
        "--dtype",
        "bfloat16",
        "--mem-fraction-static",
        "0.15",
        "--max-total-tokens",
        "65536",
    )


@dataclass
class LiveServer:
    name: str
    config: SpecConfig
    url: str
    process: Process
    command: list[str]


@dataclass
class ServerPool:
    """At most one live SGLang server; `get` starts the named one, stopping any other."""

    workdir: Path
    live: LiveServer | None = None
    greedy_outputs: dict[str, list[int]] = field(default_factory=dict)

    def get(self, name: str) -> LiveServer:
        live = self.live
        if live is not None and live.name == name and live.process.popen.poll() is None:
            return live
        self.stop()
        config = CONFIGS[name]
        port = free_port()
        folder = self.workdir / name
        folder.mkdir(parents=True, exist_ok=True)
        launch = LaunchSettings(
            model=str(require(MODELS / "llama")),
            served_model_name=SERVED,
            host="127.0.0.1",
            port=port,
            sidecar_dir=str(folder),
            extra_args=cpu_flags(config),
        )
        for path, content in SGLANG.sidecar_files(config, launch).items():
            Path(path).write_text(content)
        command = SGLANG.program(str(require(SGLANG_PYTHON))) + SGLANG.render(config, launch)
        env = {
            **OFFLINE_ENV,
            "SGLANG_USE_CPU_ENGINE": "1",
            # the n-gram matcher is compiled with g++ on first start; keep it between runs
            "SGLANG_CACHE_DIR": str(ROOT / ".cache/sglang-jit"),
            "PYTHONPATH": str(STANDIN),
            "SPECPILOT_STANDIN_CLAIM_AMX": "1" if config.speculative else "0",
        }
        process = start(command, folder / "server.log", env)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_http_ok(process, f"{url}/health", timeout_s=900)
        except BaseException:
            process.stop()
            raise
        self.live = LiveServer(name, config, url, process, command)
        return self.live

    def stop(self) -> None:
        if self.live is not None:
            self.live.process.stop()
            self.live = None

    def reference_outputs(self) -> dict[str, list[int]]:
        """Greedy output ids of the plain server for PROMPTS (started if not yet measured)."""
        if not self.greedy_outputs:
            plain = self.get("plain")
            with httpx.Client(timeout=300) as client:
                for prompt in PROMPTS:
                    self.greedy_outputs[prompt] = generate(client, plain.url, prompt, 48)[
                        "output_ids"
                    ]
        return self.greedy_outputs


def generate(
    client: httpx.Client, url: str, prompt: str, max_new_tokens: int, temperature: float = 0.0
) -> dict[str, Any]:
    """SGLang's native /generate; its meta_info carries the per-request speculative counts."""
    body = {
        "text": prompt,
        "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": temperature},
    }
    response = client.post(f"{url}/generate", json=body)
    response.raise_for_status()
    result: dict[str, Any] = response.json()
    return result


def run_concurrently(work: Callable[[httpx.Client, int], dict[str, Any]], jobs: int, workers: int):
    """Run `work(client, job)` for every job on `workers` threads; results in job order."""
    results: list[dict[str, Any] | None] = [None] * jobs
    queue = list(range(jobs))
    lock = threading.Lock()
    errors: list[BaseException] = []

    def worker() -> None:
        with httpx.Client(timeout=600) as client:
            while True:
                with lock:
                    if not queue or errors:
                        return
                    job = queue.pop(0)
                try:
                    results[job] = work(client, job)
                except BaseException as exc:  # surfaced in the caller's thread
                    with lock:
                        errors.append(exc)
                    return

    threads = [threading.Thread(target=worker) for _ in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return [r for r in results if r is not None]


class Scraper:
    """Scrapes /metrics every `interval_s` on its own thread while load runs."""

    def __init__(self, url: str, interval_s: float = 0.25) -> None:
        self.url = url
        self.interval_s = interval_s
        self.snapshots: list[Snapshot] = []
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run)

    def __enter__(self) -> Scraper:
        with httpx.Client(timeout=30) as client:
            self.snapshots.append(fetch_snapshot(client, f"{self.url}/metrics", time.time()))
        self._thread.start()
        return self

    def _run(self) -> None:
        with httpx.Client(timeout=30) as client:
            while not self._done.wait(self.interval_s):
                self.snapshots.append(fetch_snapshot(client, f"{self.url}/metrics", time.time()))

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()
        with httpx.Client(timeout=30) as client:
            self.snapshots.append(fetch_snapshot(client, f"{self.url}/metrics", time.time()))


def series_sum(snapshot: Snapshot, name: str) -> float:
    return sum(snapshot.series(name).values())


def gauge_values(snapshots: Sequence[Snapshot], name: str) -> list[float]:
    return [series_sum(s, name) for s in snapshots if s.series(name)]
