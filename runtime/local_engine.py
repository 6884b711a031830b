"""Local actuator: one engine process (the emulator or a real vLLM) run from rendered args.

Contract: `LocalEngine.apply(config)` renders the engine's command line for `config` with the
adapter (writing its sidecar files), stops the running process, starts the new one and waits
until /health answers; `observe(window_s)` reads one window of /metrics
(`specpilot.runtime.window`) and returns the Observation, or raises `ScrapeError` when the
engine gave fewer than two snapshots. A process that exits or never gets healthy raises
`EngineStartError` with its log's path and tail (each start attempt keeps its own log), and
the previous config is not restored silently: the loop decides.

With `surge_port` set a switch keeps serving, as the operator's default surge rollout
(maxUnavailable 0) does: the new config starts on the other of the two ports beside the
running engine, `url` moves to it once it is healthy, and the old process is stopped
`retire_grace_s` later, once its requests in flight have finished (at most `drain_s`). A start
that fails leaves the old engine serving its config, so the loop's rollback (an apply of that
config) has nothing to do. Clients must read `url` per request: the port moves with each switch.
Both engines share the machine's cores meanwhile: on 2 cores a vLLM CPU start beside a serving
vLLM wrote no log line in over 6 minutes (alone: 35 s), so the real-engine benches restart
unless told `--switch surge`.

With `standby_ports` set the engine keeps a warm pool: `prewarm(configs)` starts one engine per
config on those ports before any switch, and they wait there idle; a switch to a config of the
pool moves `url` to its engine without a start, and the engine left keeps running on its port as
the pool's standby for its own config (its requests in flight finish where they are). A config
outside the pool starts beside the serving engine on a free port, or on the port of the standby
served least recently, which is stopped. Every engine keeps its memory while it waits: vLLM's
sleep mode, which frees an idle engine's GPU memory, is a no-op on its CPU build (its CPU worker
says so), so this pool is only tried here as idle processes holding RAM. Clients read `url`
per request, as with a surge.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import httpx

from specpilot.runtime.engine_metrics import engine_metrics, observe
from specpilot.runtime.engines import LaunchSettings, get_adapter
from specpilot.runtime.scrape import ScrapeError, fetch_snapshot
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
    at concurrency 32 on 2 cores, tokens/s with a scraper every 1 s read 1.072 of no scraper's
    and every 3.3 s 0.945 (medians of 8 rounds whose single ratios spread 0.85-1.14:
    bench/results/scrape_cost.md at a3ab795, on bench/real_vllm.py's servers)."""
    log_dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="specpilot-")))
    surge_port: int | None = None
    """The second port of a switch without downtime (module docstring); None: a switch stops
    the engine, then starts the new one."""
    drain_s: float = 30.0
    """Longest wait, after a surge switch, for the old engine's requests in flight."""
    retire_grace_s: float = 2.0
    """How long the old engine keeps serving after `url` moves, before its in-flight count is
    trusted: a client that read the old `url` just before the switch may not have reached it
    yet, and an engine that counts nothing in flight would be stopped under its connect (a
    Kubernetes preStop sleep covers the same gap while endpoints drop a pod). Seen in CI: one
    failed request in 1126 tests without it."""
    standby_ports: tuple[int, ...] = ()
    """Ports of the warm pool's waiting engines (module docstring); empty: no pool."""
    config: SpecConfig | None = None
    serving_since: float | None = None
    """`time.monotonic()` when the engine serving now took the load (`url` moved to it): with a
    surge, `apply` returns later, once the old engine has finished what it held."""
    restarts: int = 0
    starts: int = 0
    """Start attempts, failed ones included: each writes its own log, so a failed start's log
    outlives the rollback that follows it."""
    _process: subprocess.Popen[bytes] | None = None
    _port: int | None = None
    """The port serving now (None: `launch.port`)."""
    _standby: dict[SpecConfig, tuple[subprocess.Popen[bytes], int]] = field(default_factory=dict)
    """The pool's waiting engines and their ports, the one served least recently first."""

    def __post_init__(self) -> None:
        if self.surge_port is not None and self.standby_ports:
            raise ValueError("a LocalEngine has either a surge_port or standby_ports, not both")

    @property
    def url(self) -> str:
        return self._url(self.launch.port if self._port is None else self._port)

    @property
    def keeps_serving(self) -> bool:
        """Whether the next apply leaves an engine serving until the new config serves (a
        surge, or a pool) instead of stopping it first."""
        return (self.surge_port is not None or bool(self.standby_ports)) and self._serving()

    @property
    def standby(self) -> tuple[SpecConfig, ...]:
        """The configs the pool holds warm beside the serving one."""
        return tuple(self._standby)

    def standby_urls(self) -> dict[SpecConfig, str]:
        """Where each of the pool's waiting engines listens."""
        return {config: self._url(port) for config, (_, port) in self._standby.items()}

    @property
    def process_groups(self) -> tuple[int, ...]:
        """The process groups of the engines this actuator runs, serving and waiting (each
        engine starts its own session: its group id is its pid)."""
        running = [self._process] if self._process is not None else []
        return tuple(p.pid for p in (*running, *(w for w, _ in self._standby.values())))

    def prewarm(self, configs: Sequence[SpecConfig]) -> None:
        """Start an engine for each of `configs` not yet running, on the pool's free ports, and
        leave it waiting; ValueError without a free port for each."""
        wanted = [c for c in dict.fromkeys(configs) if c != self.config and c not in self._standby]
        free = self._free_ports()
        if len(wanted) > len(free):
            raise ValueError(
                f"standby_ports has {len(free)} free port(s) for {len(wanted)} config(s) to prewarm"
            )
        for config, port in zip(wanted, free, strict=False):
            self._standby[config] = (self._start(config, port), port)

    def apply(self, config: SpecConfig) -> None:
        if self.standby_ports:
            if config == self.config and self._serving():
                return  # a rollback after a failed start: the serving engine never stopped
            self._apply_pooled(config)
            self.serving_since = time.monotonic()
        elif not self.surging:
            self.stop()
            self._process = self._start(config, self.launch.port)
            self._port = self.launch.port
            self.serving_since = time.monotonic()
        elif config == self.config:
            return  # a rollback after a failed surge: the old engine never stopped
        else:
            old, old_url = self._process, self.url
            port = self.launch.port if self._port == self.surge_port else self.surge_port
            assert port is not None
            self._process, self._port = self._start(config, port), port
            self.serving_since = time.monotonic()
            self._retire(old, old_url)
        self.config = config
        self.restarts += 1

    @property
    def surging(self) -> bool:
        """Whether the next apply starts beside a serving engine on the surge port."""
        return self.surge_port is not None and self._serving()

    def _apply_pooled(self, config: SpecConfig) -> None:
        """Serve `config` from the pool's waiting engine, or from a new one started beside the
        serving engine; the engine left waits in the pool."""
        waiting = self._standby.pop(config, None)
        if waiting is not None:
            process, port = waiting
            if not self._healthy(process, port):
                _terminate(process)
                raise EngineStartError(
                    f"the pool's engine for {config.describe()} on port {port} stopped answering"
                )
        else:
            port = self._port_for_start()
            process = self._start(config, port)
        if self._process is not None and self._serving() and self.config is not None:
            self._standby[self.config] = (self._process, self._port or self.launch.port)
        self._process, self._port = process, port

    def _free_ports(self) -> list[int]:
        used = {port for _, port in self._standby.values()}
        if self._serving():
            used.add(self.launch.port if self._port is None else self._port)
        return [p for p in (self.launch.port, *self.standby_ports) if p not in used]

    def _port_for_start(self) -> int:
        """A free port of the pool, or the port of the standby served least recently (stopped
        to make room)."""
        free = self._free_ports()
        if free:
            return free[0]
        oldest = next(iter(self._standby))
        process, port = self._standby.pop(oldest)
        _terminate(process)
        return port

    def _healthy(self, process: subprocess.Popen[bytes], port: int) -> bool:
        if process.poll() is not None:
            return False
        try:
            return httpx.get(f"{self._url(port)}/health", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    def _start(self, config: SpecConfig, port: int) -> subprocess.Popen[bytes]:
        """A healthy engine process for `config` on `port`, or `EngineStartError`."""
        launch = self.launch
        if port != launch.port:  # the old engine may still read its own files
            launch = replace(launch, port=port, sidecar_dir=f"{launch.sidecar_dir}-{port}")
        adapter = get_adapter(self.engine)
        args = adapter.render(config, launch)
        for path, content in adapter.sidecar_files(config, launch).items():
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(content, encoding="utf-8")
        log = self.log_dir / f"engine-{self.starts}.log"
        self.starts += 1
        with log.open("wb") as handle:
            try:
                process = subprocess.Popen(
                    [*self.program, *args],
                    stdout=handle,
                    stderr=subprocess.STDOUT,
                    env=self.env,
                    start_new_session=True,
                )
            except OSError as exc:  # no such interpreter, not executable
                raise EngineStartError(f"cannot start {self.program[0]!r}: {exc}") from exc
        try:
            self._wait_healthy(process, self._url(port), log)
        except BaseException:  # a failed start, or the caller stopping us: no orphan engine
            _terminate(process)
            raise
        return process

    def _url(self, port: int) -> str:
        return f"http://{self.launch.host}:{port}"

    def _serving(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def _wait_healthy(self, process: subprocess.Popen[bytes], url: str, log: Path) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise EngineStartError(
                    f"engine exited with {process.returncode} (log: {log}): "
                    f"{log.read_text(errors='replace')[-2000:]}"
                )
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise EngineStartError(
            f"engine not healthy after {self.start_timeout_s}s (log: {log}): "
            f"{log.read_text(errors='replace')[-2000:]}"
        )

    def _retire(self, process: subprocess.Popen[bytes] | None, url: str) -> None:
        """Stop the engine a surge replaced once nothing runs or waits on it (clients moved to
        the new `url` with their next request), or after `drain_s`."""
        time.sleep(self.retire_grace_s)
        deadline = time.monotonic() + self.drain_s
        while time.monotonic() < deadline and self._in_flight(url) > 0:
            time.sleep(0.5)
        if process is not None:
            _terminate(process)

    def _in_flight(self, url: str) -> float:
        """Requests running or waiting on the engine at `url` (0 once it cannot be read)."""
        names = {s.name for s in engine_metrics(self.engine) if s.key in ("running", "waiting")}
        try:
            with httpx.Client(timeout=5.0) as client:
                snapshot = fetch_snapshot(client, f"{url}/metrics", time.time(), keep=names)
        except ScrapeError:
            return 0.0
        return sum(sum(snapshot.series(name).values()) for name in names)

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
        if process is not None:
            _terminate(process)
        standby, self._standby = self._standby, {}
        for waiting, _ in standby.values():
            _terminate(waiting)


def _terminate(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM the engine's process group, SIGKILL it after 30 s."""
    if process.poll() is not None:
        return
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)
