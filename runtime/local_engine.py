"""Local actuator: one engine process (the emulator or a real vLLM) run from rendered args.

Contract: `LocalEngine.apply(config)` renders the engine's command line for `config` with the
adapter (writing its sidecar files), stops the running process, starts the new one and waits
until /health answers; `observe(window_s)` reads one window of /metrics
(`specpilot.runtime.window`) and returns the Observation, or raises `ScrapeError` when the
engine gave fewer than two snapshots. A process that exits or never gets healthy raises
`EngineStartError` with its log's path and tail (each start attempt keeps its own log), and
the previous config is not restored silently: the loop decides.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from specpilot.runtime.engine_metrics import observe
from specpilot.runtime.engines import LaunchSettings, get_adapter
from specpilot.runtime.window import WindowReader, round_interval
from specpilot.tuner import Observation, SpecConfig

LOCAL_ROUNDS = 3
"""Scrape intervals in a local engine's window: its two end snapshots and two between."""


class EngineStartError(RuntimeError):
    """The engine process did not become healthy."""


@dataclass(kw_only=True)
class LocalEngine:
    engine: str
    program: Sequence[str]
    """Command before the engine arguments, e.g. `specpilot emulate --engine vllm ...`."""
    launch: LaunchSettings
    env: dict[str, str] = field(default_factory=lambda: dict(os.environ))
    start_timeout_s: float = 600.0
    scrape_interval_s: float | None = None
    """Seconds between scrapes inside a window; None: LOCAL_ROUNDS rounds a window
    (`round_interval`). On a CPU server a scrape is a /metrics render on the cores that serve:
    at concurrency 32 on 2 cores, tokens/s with a scraper every 1 s was 0.776 of no scraper's
    (median of 8 rounds), every 3.3 s 0.947 (bench/results/scrape_cost.md at 730f23f; a
    4-round run at 1bc7b68 read 1.319 and 1.118: the slots' noise is of that size)."""
    log_dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="specpilot-")))
    config: SpecConfig | None = None
    restarts: int = 0
    starts: int = 0
    """Start attempts, failed ones included: each writes its own log, so a failed start's log
    outlives the rollback that follows it."""
    _process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.launch.host}:{self.launch.port}"

    def apply(self, config: SpecConfig) -> None:
        adapter = get_adapter(self.engine)
        args = adapter.render(config, self.launch)
        for path, content in adapter.sidecar_files(config, self.launch).items():
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(content, encoding="utf-8")
        self.stop()
        log = self.log_dir / f"engine-{self.starts}.log"
        self.starts += 1
        with log.open("wb") as handle:
            try:
                self._process = subprocess.Popen(
                    [*self.program, *args],
                    stdout=handle,
                    stderr=subprocess.STDOUT,
                    env=self.env,
                    start_new_session=True,
                )
            except OSError as exc:  # no such interpreter, not executable
                raise EngineStartError(f"cannot start {self.program[0]!r}: {exc}") from exc
        self._wait_healthy(log)
        self.config = config
        self.restarts += 1

    def _wait_healthy(self, log: Path) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            assert self._process is not None
            if self._process.poll() is not None:
                raise EngineStartError(
                    f"engine exited with {self._process.returncode} (log: {log}): "
                    f"{log.read_text(errors='replace')[-2000:]}"
                )
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise EngineStartError(
            f"engine not healthy after {self.start_timeout_s}s (log: {log}): "
            f"{log.read_text(errors='replace')[-2000:]}"
        )

    def window_reader(self, window_s: float) -> WindowReader:
        interval = (
            round_interval(window_s, LOCAL_ROUNDS)
            if self.scrape_interval_s is None
            else self.scrape_interval_s
        )
        return WindowReader(interval_s=interval, timeout_s=10.0, fail_fast=True)

    def observe(self, window_s: float) -> Observation:
        reader = self.window_reader(window_s)
        window = reader.read(self.engine, {self.url: f"{self.url}/metrics"}, window_s)
        return observe(self.engine, window.complete())

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
