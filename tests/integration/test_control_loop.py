"""The control loop end to end on one machine: the local actuator runs the emulator as a real
process, the loop reads its /metrics over HTTP, the tuner decides, the engine restarts."""

from __future__ import annotations

import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from specpilot.operator.loop import ControlLoop
from specpilot.runtime.engines import LaunchSettings
from specpilot.runtime.local_engine import EngineStartError, LocalEngine
from specpilot.tuner import SpecConfig, StepCost, TunerSettings, TunerState, acceptance_curve

EMULATE = [
    sys.executable,
    "-m",
    "specpilot.operator.app.cli",
    "emulate",
    "--engine",
    "vllm",
    "--load-delay",
    "0.2",
]
EAGLE3 = [SpecConfig(method="eagle3", num_speculative_tokens=k, draft_model="/d") for k in (1, 3)]
# A stand-in engine that crashes on any speculative config and emulates a plain one.
CRASHES_ON_SPECULATION = [
    sys.executable,
    "-c",
    "import sys, runpy\n"
    "if '--speculative-config' in sys.argv: sys.exit('unsupported draft head')\n"
    "sys.argv = ['specpilot', 'emulate', '--engine', 'vllm', '--load-delay', '0.2',"
    " *sys.argv[1:]]\n"
    "runpy.run_module('specpilot.operator.app.cli', run_name='__main__')\n",
]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def engine_factory(tmp_path: Path) -> Iterator:
    engines: list[LocalEngine] = []

    def make(program: list[str], surge: bool = False, standby: int = 0) -> LocalEngine:
        launch = LaunchSettings(
            model="/models/llama",
            served_model_name="llama",
            host="127.0.0.1",
            port=free_port(),
            sidecar_dir=str(tmp_path),
        )
        engine = LocalEngine(
            engine="vllm",
            program=program,
            launch=launch,
            start_timeout_s=120,  # generous: ends when the engine answers; loaded hosts are slow
            scrape_interval_s=0.25,
            log_dir=tmp_path,
            surge_port=free_port() if surge else None,
            standby_ports=tuple(free_port() for _ in range(standby)),
        )
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        engine.stop()


class Load:
    """`users` closed-loop clients against whatever engine listens on the port."""

    def __init__(
        self, url: str | Callable[[], str], users: int, connect_after_s: float = 0.0
    ) -> None:
        self.url_of = url if callable(url) else lambda: url
        self.connect_after_s = connect_after_s
        """Pause between reading the url and sending: a slow client, or a proxy's stale
        endpoint list."""
        self.stop_event = threading.Event()
        self.served, self.failed = 0, 0
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._user, daemon=True) for _ in range(users)]
        for thread in self.threads:
            thread.start()

    def _user(self) -> None:
        body = {"model": "llama", "prompt": "word " * 100, "max_tokens": 48}
        while not self.stop_event.is_set():
            url = self.url_of()
            time.sleep(self.connect_after_s)
            try:
                response = httpx.post(f"{url}/v1/completions", json=body, timeout=30)
                response.raise_for_status()
                with self.lock:
                    self.served += 1
            except httpx.HTTPError:
                with self.lock:
                    self.failed += 1
                time.sleep(0.1)  # the engine is restarting

    def stop(self) -> None:
        self.stop_event.set()
        for thread in self.threads:
            thread.join(timeout=35)


def switch_under_load(
    engine: LocalEngine, first: SpecConfig, second: SpecConfig
) -> tuple[Load, int]:
    """Two switches while two clients that read `url` per request keep the engine busy; (the
    stopped load, requests served by the first switch)."""
    load = Load(lambda: engine.url, users=2)
    try:
        time.sleep(1.0)
        engine.apply(first)
        served_at_switch = load.served
        time.sleep(1.0)
        engine.apply(second)
        time.sleep(0.5)
    finally:
        load.stop()
    return load, served_at_switch


def make_loop(engine: LocalEngine) -> ControlLoop:
    settings = TunerSettings(
        candidates=(SpecConfig(), *EAGLE3),
        min_dwell_s=0,
        synthesize_schedules=False,
        restart_downtime_s=1.0,
    )
    priors = {"eagle3": acceptance_curve("eagle3", "chat")}
    return ControlLoop(
        actuator=engine,
        settings=settings,
        cost=StepCost.for_hardware("H100", "llama-3.1-8b"),
        state=TunerState.initial(SpecConfig(), 0.0, priors),
        window_s=2.0,
    )


def test_low_load_switches_to_speculation_and_the_engine_restarts(engine_factory) -> None:
    engine = engine_factory(EMULATE)
    loop = make_loop(engine)
    loop.start()
    load = Load(engine.url, users=2)
    try:
        records = [loop.tick(now=100.0 * i) for i in range(1, 4)]
    finally:
        load.stop()
    switched = [r for r in records if r.applied]
    assert switched and switched[0].decision.config.method == "eagle3"
    assert switched[0].decision.regime == "memory-bound"
    assert engine.restarts == 2 and engine.config == switched[0].decision.config
    after = [r for r in records if r.now > switched[0].now]
    assert after and after[0].observation.acceptance_length is not None  # it speculates now
    assert "eagle3" in switched[0].decision.reason


def test_a_config_that_crashes_is_rolled_back(engine_factory) -> None:
    engine = engine_factory(CRASHES_ON_SPECULATION)
    loop = make_loop(engine)
    loop.start()
    load = Load(engine.url, users=2)
    try:
        first = loop.tick(now=100.0)
        second = loop.tick(now=200.0)
    finally:
        load.stop()
    assert first.decision.config.method == "eagle3" and not first.applied
    assert first.error is not None and "unsupported draft head" in first.error
    assert loop.state.current == SpecConfig() and engine.config == SpecConfig()
    # the failed config is not tried again while it is backed off
    assert second.decision.config != first.decision.config


def test_a_surge_switch_serves_throughout_and_retires_the_old_engine(engine_factory) -> None:
    """With a second port the new config starts beside the serving engine (the operator's
    surge rollout on one machine): clients that read `url` per request see no failure, the
    replaced process is stopped, and the next switch goes back to the first port."""
    engine = engine_factory(EMULATE, surge=True)
    engine.apply(SpecConfig())
    first_url, first = engine.url, engine._process
    load, served_at_switch = switch_under_load(engine, EAGLE3[0], EAGLE3[1])
    assert load.failed == 0 and load.served > served_at_switch > 0
    assert first is not None and first.poll() is not None  # retired, not left running
    assert engine.url == first_url and engine.config == EAGLE3[1] and engine.restarts == 3
    assert engine.starts == 3


def test_a_surge_switch_serves_a_client_that_read_the_old_url_just_before_it(
    engine_factory,
) -> None:
    """A client that read `url` before the switch and connects a moment later still reaches the
    old engine: it is retired only after `retire_grace_s`, not as soon as it counts nothing in
    flight (CI once saw one such request fail)."""
    engine = engine_factory(EMULATE, surge=True)
    engine.apply(SpecConfig())
    load = Load(lambda: engine.url, users=2, connect_after_s=0.5)
    try:
        time.sleep(1.0)
        called = time.monotonic()
        engine.apply(EAGLE3[0])
        returned = time.monotonic()
        time.sleep(1.0)
    finally:
        load.stop()
    # the new engine took the load before apply returned: apply then waits out the old one's
    # retire grace (the demo's switch record counts from `serving_since`)
    assert engine.serving_since is not None
    assert called < engine.serving_since <= returned - engine.retire_grace_s
    assert load.failed == 0 and load.served > 0
    assert engine.retire_grace_s > 0.5  # the margin this test relies on


def test_a_surge_that_fails_to_start_leaves_the_old_engine_serving(engine_factory) -> None:
    engine = engine_factory(CRASHES_ON_SPECULATION, surge=True)
    loop = make_loop(engine)
    loop.start()
    serving = engine._process
    load = Load(lambda: engine.url, users=2)
    try:
        first = loop.tick(now=100.0)
    finally:
        load.stop()
    assert first.decision.config.method == "eagle3" and not first.applied
    assert first.error is not None and "unsupported draft head" in first.error
    # the rollback found its config still serving: no second start, no failed request
    assert engine._process is serving and engine.config == SpecConfig()
    assert engine.starts == 2 and engine.restarts == 1 and load.failed == 0


def test_a_warm_pool_switches_without_a_start_and_keeps_the_engine_it_left(
    engine_factory,
) -> None:
    """Prewarmed engines wait on their own ports: a switch moves `url` to the config's engine
    (no start, no failed request), the engine left keeps running for the next switch back, and
    a config outside the full pool takes the port of the standby served least recently."""
    engine = engine_factory(EMULATE, standby=2)
    engine.apply(SpecConfig())
    first_url, first = engine.url, engine._process
    engine.prewarm([SpecConfig(), EAGLE3[0], EAGLE3[1]])
    assert engine.starts == 3 and engine.standby == (EAGLE3[0], EAGLE3[1])
    load, served_at_switch = switch_under_load(engine, EAGLE3[0], SpecConfig())
    assert load.failed == 0 and load.served > served_at_switch > 0
    assert engine.starts == 3 and engine.restarts == 3  # two switches, no start
    assert engine.url == first_url and engine._process is first and first.poll() is None
    assert engine.standby == (EAGLE3[1], EAGLE3[0])  # EAGLE3[1] waited longest
    oldest = engine._standby[EAGLE3[1]][0]
    outside = SpecConfig(method="eagle3", num_speculative_tokens=5, draft_model="/d")
    engine.apply(outside)
    assert engine.starts == 4 and oldest.poll() is not None  # its port went to the new config
    assert engine.standby == (EAGLE3[0], SpecConfig()) and engine.config == outside


def test_a_pool_engine_that_died_is_refused_and_the_serving_one_stays(engine_factory) -> None:
    engine = engine_factory(EMULATE, standby=1)
    loop = make_loop(engine)
    loop.start()
    target = EAGLE3[0]
    engine.prewarm([target])
    serving, url = engine._process, engine.url
    dead = engine._standby[target][0]
    dead.kill()
    dead.wait(timeout=10)
    with pytest.raises(EngineStartError, match="stopped answering"):
        engine.apply(target)
    assert engine._process is serving and engine.url == url and engine.standby == ()
    engine.apply(SpecConfig())  # the loop's rollback: nothing to do
    assert engine.starts == 2 and engine.restarts == 1 and serving.poll() is None
