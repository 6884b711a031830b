"""LocalEngine's failed starts: each attempt keeps its own log, and the error names it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from specpilot.runtime.engines import LaunchSettings
from specpilot.runtime.local_engine import EngineStartError, LocalEngine
from specpilot.tuner import SpecConfig

CRASH = "import sys; print('attempt failed: no KV pool', flush=True); sys.exit(3)"


def test_a_failed_start_keeps_its_log_when_the_next_start_runs(tmp_path: Path) -> None:
    # A rollback after a failed switch is the next start: writing its log over the failed
    # one's lost the real SGLang bench the reason its n-gram servers died (db29c6a).
    engine = LocalEngine(
        engine="vllm",
        program=[sys.executable, "-c", CRASH],
        launch=LaunchSettings(model="m", host="127.0.0.1", port=9, sidecar_dir=str(tmp_path)),
        log_dir=tmp_path,
        start_timeout_s=30.0,
    )
    config = SpecConfig(method="ngram", num_speculative_tokens=3)
    for attempt in range(2):
        with pytest.raises(EngineStartError) as failed:
            engine.apply(config)
        log = tmp_path / f"engine-{attempt}.log"
        assert f"engine exited with 3 (log: {log})" in str(failed.value)
        assert "no KV pool" in str(failed.value)
    assert sorted(p.name for p in tmp_path.glob("engine-*.log")) == ["engine-0.log", "engine-1.log"]
    assert all("no KV pool" in p.read_text() for p in tmp_path.glob("engine-*.log"))
    assert engine.restarts == 0 and engine.config is None  # nothing became healthy


def test_a_window_scrapes_a_third_as_often_as_its_length_unless_told() -> None:
    # Each scrape renders /metrics on the cores that serve; the batch needs only the window's
    # two end scrapes, and four rounds keep the gauge's cross-check (bench/scrape_cost.py).
    launch = LaunchSettings(model="m", host="127.0.0.1", port=9)
    engine = LocalEngine(engine="vllm", program=[], launch=launch)
    assert engine.window_reader(12.0).interval_s == pytest.approx(4.0)
    assert engine.window_reader(3.0).interval_s == pytest.approx(1.0)
    told = LocalEngine(engine="vllm", program=[], launch=launch, scrape_interval_s=0.25)
    assert told.window_reader(12.0).interval_s == 0.25


def test_a_pool_refuses_a_surge_port_and_more_configs_than_ports() -> None:
    launch = LaunchSettings(model="m", host="127.0.0.1", port=9)
    with pytest.raises(ValueError, match="either a surge_port or standby_ports"):
        LocalEngine(engine="vllm", program=[], launch=launch, surge_port=10, standby_ports=(11,))
    pool = LocalEngine(engine="vllm", program=[], launch=launch, standby_ports=(11,))
    configs = [SpecConfig(method="ngram", num_speculative_tokens=k) for k in (1, 3, 5)]
    with pytest.raises(ValueError, match=r"2 free port\(s\) for 3 config\(s\)"):
        pool.prewarm(configs)  # refused before anything starts
    assert pool.starts == 0 and pool.standby == ()
