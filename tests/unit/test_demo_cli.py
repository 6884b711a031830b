"""`specpilot demo` refuses what no demo could use (a window of 0, a negative dwell, load delay
or restart budget, a TPOT target of 0, an unknown GPU or model, an output folder that is a
file) with one `error:` line naming the flag, before anything starts. The engine is replaced by
a stand-in that fails the test if the demo gets as far as making it."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from specpilot.operator.app.cli import main
from specpilot.operator.app.demo import command
from specpilot.runtime.local_engine import LocalEngine as RealLocalEngine


class EngineReached(Exception):
    """The demo got past its checks to the point of starting the emulator."""


@pytest.fixture(autouse=True)
def no_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(**_: object) -> None:
        raise EngineReached

    monkeypatch.setattr(command, "LocalEngine", refuse)


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--window", "0"], "--window"),
        (["--window", "nan"], "--window"),
        (["--min-dwell", "-1"], "--min-dwell"),
        (["--load-delay", "-0.5"], "--load-delay"),
        (["--load-delay", "inf"], "--load-delay"),
        (["--restart-budget", "-1"], "--restart-budget"),
        (["--slo-tpot-ms", "0"], "--slo-tpot-ms"),
        (["--gpu", "H1000"], "H100 | H200"),
        (["--model-profile", "llama-9"], "llama-3.1-8b"),
    ],
)
def test_a_demo_no_run_could_use_is_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, flags: list[str], named: str
) -> None:
    assert main(["demo", "--out", str(tmp_path / "out"), *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    assert named in err, err


def test_an_output_folder_that_is_a_file_is_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    taken = tmp_path / "summary.md"
    taken.write_text("mine", encoding="utf-8")
    assert main(["demo", "--out", str(taken)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --out") and err.count("\n") == 1, err
    assert taken.read_text(encoding="utf-8") == "mine"


def test_the_edges_that_make_sense_pass_the_checks(tmp_path: Path) -> None:
    """A dwell of 0, no load delay and no restarts are runs (they reach the engine)."""
    flags = ["--min-dwell", "0", "--load-delay", "0", "--restart-budget", "0"]
    with pytest.raises(EngineReached):
        main(["demo", "--out", str(tmp_path / "out"), *flags])


@pytest.mark.parametrize("rollout", ["surge", "restart"])
def test_the_rollout_picks_how_the_local_engine_switches(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, rollout: str
) -> None:
    """Surge (the default, as a SpecDeployment's) gives the engine a second port of its own;
    a restart has none."""
    seen: dict[str, object] = {}

    def record(**kwargs: object) -> None:
        seen.update(kwargs)
        raise EngineReached

    monkeypatch.setattr(command, "LocalEngine", record)
    flags = [] if rollout == "surge" else ["--rollout", "restart"]
    with pytest.raises(EngineReached):
        main(["demo", "--out", str(tmp_path / "out"), *flags])
    launch = seen["launch"]
    assert isinstance(launch, command.LaunchSettings)
    if rollout == "surge":
        assert isinstance(seen["surge_port"], int) and seen["surge_port"] != launch.port
    else:
        assert seen["surge_port"] is None


@pytest.mark.parametrize("rollout", ["surge", "restart"])
def test_fast_mode_rolls_as_the_local_engine_does(tmp_path: Path, rollout: str) -> None:
    """No preStop sleep for a local process; a restart drops what it holds (drain 0), a surge's
    old engine finishes it within the engine's own drain."""
    ns = command_line(["--out", str(tmp_path), "--rollout", rollout])
    launch = command.LaunchSettings(model="m", served_model_name="m", port=1, sidecar_dir="d")
    engine = RealLocalEngine(
        engine="vllm", program=[], launch=launch, surge_port=2 if rollout == "surge" else None
    )
    trace = command.stretch(command.parse_trace(command.DEMO_DAY, "demo-day"), 40.0)
    setup = command.fast_mode_setup(ns, trace, engine)
    assert setup.rollout == rollout and setup.pre_stop_s == 0.0 and setup.replicas == 1
    assert setup.drain_s == (engine.drain_s if rollout == "surge" else 0.0)
    assert setup.duration_s == 40.0 and setup.requests


def command_line(flags: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    command.add_parser(parser.add_subparsers())
    return parser.parse_args(["demo", *flags])
