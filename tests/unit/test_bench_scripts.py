"""The benchmark scripts still import against the code they measure (they run outside pytest)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from specpilot.runtime.engines import LaunchSettings
from specpilot.runtime.scrape import ScrapeError

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.mark.parametrize("script", sorted(p.name for p in BENCH.glob("*.py")))
def test_bench_script_imports(script: str) -> None:
    spec = importlib.util.spec_from_file_location(f"bench_{script[:-3]}", BENCH / script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # dataclasses look their module up in sys.modules while the class is being defined
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)  # runs imports and definitions; main() is guarded
    finally:
        del sys.modules[spec.name]
    assert callable(module.main)


# --------------------------------------------------------------------------- real-engine bench
# bench/real_engine.py is the harness of bench/real_vllm.py and bench/real_sglang.py; these
# tests run their dry modes and pure parts (no engine starts here).

RESULTS = BENCH / "results"


def _load(script: str) -> Any:
    """A bench script as a module (it puts bench/ on sys.path for its harness)."""
    spec = importlib.util.spec_from_file_location(f"bench_{script[:-3]}_t", BENCH / script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    return module


def _dry_run(script: str, args: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    assert _load(script).main(["--dry-run", *args]) == 0
    plan: dict[str, Any] = json.loads(capsys.readouterr().out)
    return plan


def test_real_sglang_dry_run_renders_cpu_servers_from_the_adapter(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from specpilot.runtime.engines import get_adapter
    from specpilot.tuner import SpecConfig

    plan = _dry_run(
        "real_sglang.py", ["--phases", "3", "--log-dir", str(tmp_path), "--port", "19000"], capsys
    )
    servers = {s["policy"]: s for s in plan["servers"]}
    assert list(servers) == ["none", "ngram K=3", "ngram K=5", "none (twin)", "specpilot"]
    sglang = get_adapter("sglang")
    for name, config in [
        ("none", SpecConfig()),
        ("ngram K=3", SpecConfig(method="ngram", num_speculative_tokens=3)),
        ("ngram K=5", SpecConfig(method="ngram", num_speculative_tokens=5)),
        ("none (twin)", SpecConfig()),  # the servers' noise
        ("specpilot", SpecConfig()),  # the tuner starts with speculation off
    ]:
        command, env = servers[name]["command"], servers[name]["env"]
        assert command[1:3] == ["-m", "sglang.launch_server"]
        # the adapter reads back the config it rendered; the CPU flags are extra, not its own
        assert sglang.parse(command[3:]) == config
        backend = command[command.index("--attention-backend") + 1]
        assert backend == ("intel_amx" if config.speculative else "torch_native")
        assert env["SPECPILOT_STANDIN_CLAIM_AMX"] == ("1" if config.speculative else "0")
        assert env["PYTHONPATH"].endswith("tests/contract/engine_side/sgl_kernel_standin")
        assert env["SGLANG_USE_CPU_ENGINE"] == "1"
        for flag in ("--device", "--sleep-on-idle", "--enable-metrics", "--random-seed"):
            assert flag in command
    k3 = servers["ngram K=3"]["command"]
    assert k3[k3.index("--speculative-num-draft-tokens") + 1] == "4"
    assert [p["name"] for p in plan["phases"]] == ["c1 greedy", "c8 greedy", "c8 temp0.7"]
    assert {p["concurrency"] for p in plan["phases"]} == {1, 8}
    # SGLang refuses NGRAM schedules: the tuner must not propose one
    assert plan["tuner_settings_overrides"] == {"synthesize_schedules": False}
    assert plan["command"].endswith(
        f"bench/real_sglang.py --dry-run --phases 3 --log-dir {tmp_path} --port 19000"
    )
    assert plan["commit"]
    assert plan["seeds"]["server_random_seed"] == 0
    assert any("only EAGLE/EAGLE3" in note for note in plan["engine_notes"])


def test_real_vllm_dry_run_keeps_its_policies_and_profile(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = _dry_run("real_vllm.py", ["--log-dir", str(tmp_path)], capsys)
    assert [s["policy"] for s in plan["servers"]] == [
        "none",
        "ngram K=1",
        "ngram K=3",
        "ngram K=5",
        "table",
        "none (twin)",
        "specpilot",
    ]
    assert [p["concurrency"] for p in plan["phases"]] == [1, 32, 32, 1, 1]
    # the tuner is told the servers' --max-num-seqs (TunerSettings.max_batch; default 256)
    assert plan["tuner_settings_overrides"] == {"max_batch": 32}
    assert plan["calibration_concurrency"] == [1, 4, 16, 32]
    # closed-loop clients scored by tokens/s: the tuner is told that objective; on 2 cores a
    # surge start starves beside a serving engine, so SpecPilot's server restarts unless told
    assert (plan["objective"], plan["switch"]) == ("throughput", "restart")
    told = _dry_run(
        "real_vllm.py",
        ["--log-dir", str(tmp_path), "--objective", "latency", "--switch", "surge"],
        capsys,
    )
    assert (told["objective"], told["switch"]) == ("latency", "surge")
    assert told["tuner_settings_overrides"] == {"max_batch": 32}
    # a pool's servers are up and warm before the load: a move's first window is the config's
    pool = _dry_run("real_vllm.py", ["--log-dir", str(tmp_path), "--switch", "pool"], capsys)
    assert pool["tuner_settings_overrides"] == {
        "max_batch": 32,
        "synthesize_schedules": False,
        "warm_switches": True,
    }
    # shared: SpecPilot moves between the statics' own (warm) servers and starts none
    shared = _dry_run("real_vllm.py", ["--log-dir", str(tmp_path), "--switch", "shared"], capsys)
    assert "specpilot" not in [s["policy"] for s in shared["servers"]]
    assert shared["tuner_settings_overrides"] == pool["tuner_settings_overrides"]
    assert shared["expected_minutes_at_least"] < pool["expected_minutes_at_least"]


ONE_THREAD = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "OMP_NUM_THREADS": "1",
    "NUMBA_NUM_THREADS": "1",
}


def test_real_vllm_servers_run_their_model_on_one_thread_unless_told_mp(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM's CPU default (a worker process the engine core busy-waits on, numba on two
    threads) starved the API server at concurrency 32 (bench/results/engine_batch.md): every
    server of the bench starts without it unless told `--executor mp`, and the report says
    which."""
    for name in ONE_THREAD:
        monkeypatch.delenv(name, raising=False)
    plan = _dry_run("real_vllm.py", ["--log-dir", str(tmp_path)], capsys)
    assert plan["executor"] == "uni"
    assert all(ONE_THREAD.items() <= server["env"].items() for server in plan["servers"])
    told = _dry_run("real_vllm.py", ["--log-dir", str(tmp_path), "--executor", "mp"], capsys)
    assert told["executor"] == "mp"
    assert not any(set(ONE_THREAD) & set(server["env"]) for server in told["servers"])
    lines = _load("real_vllm.py").executor_lines
    assert lines({"executor": "uni"}) == [
        "Every server on the `uni` executor (VLLM_ENABLE_V1_MULTIPROCESSING=0, OMP_NUM_THREADS=1,"
        " NUMBA_NUM_THREADS=1): see `--executor`."
    ]
    assert lines({}) == []  # a report from before the option: vLLM's default, said elsewhere


def test_real_vllm_markdown_still_renders_the_committed_result() -> None:
    """The refactor onto the shared harness left the vLLM report's Markdown as it was."""
    report = json.loads((RESULTS / "real_vllm.json").read_text())
    markdown = _load("real_vllm.py").markdown(report)
    assert markdown == (RESULTS / "real_vllm.md").read_text()


def _k_at(described: str, batch: int) -> int:
    """The K a config's description (`SpecConfig.describe`) runs at `batch`: its schedule's
    tier holding the batch, else its K."""
    for low, high, k in re.findall(r"(\d+)-(\d+):(\d+)", described):
        if int(low) <= batch <= int(high):
            return int(k)
    found = re.search(r"K=(\d+)", described)
    return int(found[1]) if found else 0


def test_what_if_replays_the_first_decision_the_real_run_made(tmp_path: Path) -> None:
    """Under the run's own cost model (its decode-only fit) and the chat prior, the what-if's
    `decide` is the decision the run's loop made on its first tick (same objective, no trials),
    and a phase whose first tick already ran speculation is not replayed as if it were off."""
    out = tmp_path / "what_if.json"
    assert _load("real_vllm_what_if.py").main(["--out", str(out)]) == 0
    report = json.loads(out.read_text())
    run = json.loads((RESULTS / "real_vllm.json").read_text())
    first = run["specpilot"]["ticks"][0]
    replayed = next(
        d
        for d in report["decisions"]
        if d["phase"] == first["phase"]
        and d["cost"] == "decode-only fit"
        and d["acceptance"] == "chat prior"
    )
    # the same method and K at the batch the tick saw. A synthesised schedule's tiers at
    # other batches may differ: the replay has only the tick row, not the window the run's
    # loop read (at 2563be3 the run's K=4 schedule held K=3 to batch 7, the replay's to 3;
    # giving the replay prompt tokens, requests or the run's tuner window changed nothing)
    batch = max(1, round(first["batch"]))
    assert _k_at(replayed["config"], batch) == _k_at(first["config"], batch)
    assert replayed["config"].split(" K=")[0] == first["config"].split(" K=")[0]
    # the same move for the same reason; its predicted gain within a point (the run's window
    # also carried the traffic's prompt tokens, which the tick row does not keep)
    gain = re.compile(r"([+-]\d+\.\d)%")
    tiers = re.compile(r"sched\[[^\]]*\]")
    opening = [tiers.sub("sched[...]", gain.split(d["reason"])[0]) for d in (replayed, first)]
    assert opening[0] == opening[1]
    replayed_gain, run_gain = (float(gain.search(d["reason"])[1]) for d in (replayed, first))
    assert abs(replayed_gain - run_gain) <= 1.0
    for phase in report["phases_not_replayed"]:
        tick = next(t for t in run["specpilot"]["ticks"] if t["phase"] == phase)
        assert tick["running_config"] != "no speculation"
        assert all(d["phase"] != phase for d in report["decisions"])


@pytest.mark.parametrize("script", ["real_sglang.py", "real_vllm.py"])
@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--phases", "0"], "--phases must be between 1 and 5"),
        (["--phases", "6"], "--phases must be between 1 and 5"),
        (["--rounds", "0"], "--rounds must be at least 1"),
        (["--ks", "3,x"], "--ks must be comma-separated positive integers"),
        (["--slot-seconds", "1"], "--slot-seconds must be at least 2"),
    ],
)
def test_bad_options_end_with_a_message_naming_them(
    script: str, args: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        _load(script).main(["--dry-run", *args])
    assert exit_.value.code == 2
    assert named in capsys.readouterr().err


def test_overall_tok_s_counts_specpilot_restarts_as_time_without_tokens() -> None:
    harness = _load("real_sglang.py") and sys.modules["real_engine"]
    phases = [harness.Phase("c1", 1, 0.0), harness.Phase("c8", 8, 0.0)]
    static, pilot = [harness.Tally(), harness.Tally()], [harness.Tally(), harness.Tally()]
    counts = {"tokens": 1000, "requests": 10, "errors": 0}
    static[0].add(counts, 10.0, 0.0)
    static[1].add({**counts, "tokens": 3000}, 10.0, 0.0)
    pilot[0].add(counts, 10.0, 0.0)
    pilot[1].add({**counts, "tokens": 2000}, 20.0, 10.0)  # a 10 s restart inside its slot
    policies = [
        {
            "policy": "none",
            "kind": "static",
            "phases": [t.to_dict(p) for t, p in zip(static, phases, strict=True)],
        },
        {
            "policy": "specpilot",
            "kind": "specpilot",
            "phases": [t.to_dict(p) for t, p in zip(pilot, phases, strict=True)],
        },
    ]
    assert harness.overall_tok_s(policies) == {"none": 200.0, "specpilot": 100.0}
    rows = harness.summarize(policies, phases)
    assert rows[1]["ratio_wall"] == 0.333 and rows[1]["ratio_serving"] == 0.667
    assert rows[1]["specpilot_downtime_s"] == 10.0


def test_the_twin_measures_noise_and_the_bound_prices_each_change_of_config() -> None:
    harness = _load("real_vllm.py") and sys.modules["real_engine"]
    phases = [harness.Phase("c1", 1, 0.0), harness.Phase("c32", 32, 0.0)]

    def policy(name: str, config: str, tokens: tuple[int, int], kind: str = "static") -> dict:
        tallies = [harness.Tally(), harness.Tally()]
        for tally, made in zip(tallies, tokens, strict=True):
            tally.add({"tokens": made, "requests": 1, "errors": 0}, 10.0, 0.0)
        rows = [t.to_dict(p) for t, p in zip(tallies, phases, strict=True)]
        return {"policy": name, "kind": kind, "config": config, "start_s": 40.0, "phases": rows}

    policies = [
        policy("none", "no speculation", (1000, 3000)),
        policy("ngram K=3", "ngram K=3", (2000, 2000)),
        policy(harness.TWIN, "no speculation", (1100, 2400)),  # never ranked: 2400 < 3000
        policy("specpilot", "tuned", (1900, 2800), kind="specpilot"),
    ]
    rows = harness.summarize(policies, phases)
    assert [r["best_static"] for r in rows] == ["ngram K=3", "none"]
    assert [r["server_noise"] for r in rows] == [0.1, 0.2]
    # 1900 / 2000 = 0.95 clears a noise of 0.1; 2800 / 3000 = 0.933 clears 0.2
    assert [r["specpilot_within_noise"] for r in rows] == [True, True]
    report = {
        "summary": rows,
        "policies": policies,
        "specpilot": {"restart_intervals_s": [[5.0, 10.0], [30.0, 30.0]]},
    }
    # staying on none: 4000 tokens in 20 s; none -> ngram K=3 -> none: 5000 tokens in 20 s
    # and two changes at the mean measured restart of 20 s
    assert harness.switching_bound(report) == {
        "restart_s": 20.0,
        "sequence": ["none", "none"],
        "changes": 0,
        "tokens_per_s": 200.0,
    }
    report["specpilot"]["restart_intervals_s"] = [[5.0, 1.0]]  # a restart of 1 s pays
    bound = harness.switching_bound(report)
    assert bound["sequence"] == ["ngram K=3", "none"] and bound["changes"] == 2
    assert bound["tokens_per_s"] == round(5000 / 22, 2)
    report["specpilot"]["restart_intervals_s"] = []  # none measured: the statics' start
    assert harness.switching_bound(report)["restart_s"] == 40.0
    # a surge switch serves throughout: each phase's best static, changes for free
    report["specpilot"] = {"switch": "surge", "restart_intervals_s": []}
    bound = harness.switching_bound(report)
    assert bound["restart_s"] == 0.0 and bound["sequence"] == ["ngram K=3", "none"]
    assert bound["tokens_per_s"] == 250.0


def test_a_restart_charged_at_the_duty_takes_its_share_of_the_phases_wall_clock() -> None:
    """SpecPilot loaded 10 s of a 70 s phase (60 s of it other policies' slots) and restarted
    for 14 s inside its slot: the bench charges the 14 s whole, the duty's figure at 10/70 of
    it (2 s), what it would take from a server loaded all 70 s; the bound prices a change the
    same way."""
    harness = _load("real_vllm.py") and sys.modules["real_engine"]
    phases = [harness.Phase("c1", 1, 0.0), harness.Phase("c32", 32, 0.0)]
    pilot, static = [harness.Tally(), harness.Tally()], [harness.Tally(), harness.Tally()]
    pilot[0].add({"tokens": 1000, "requests": 1, "errors": 0}, 24.0, 14.0)
    pilot[1].add({"tokens": 3000, "requests": 1, "errors": 0}, 10.0, 0.0)
    for tally, made in zip(static, (1000, 3000), strict=True):
        tally.add({"tokens": made, "requests": 1, "errors": 0}, 10.0, 0.0)
    report = {
        "policies": [
            {
                "policy": "none",
                "kind": "static",
                "config": "no speculation",
                "start_s": 40.0,
                "phases": [t.to_dict(p) for t, p in zip(static, phases, strict=True)],
            },
            {
                "policy": "specpilot",
                "kind": "specpilot",
                "phases": [t.to_dict(p) for t, p in zip(pilot, phases, strict=True)],
            },
        ],
        # the first phase ran 84 s: 70 s of slots and SpecPilot's 14 s restart
        "phase_windows_utc": [["c1", 100.0, 184.0], ["c32", 184.0, 254.0]],
        "specpilot": {"restart_intervals_s": [[5.0, 14.0]]},
    }
    report["overall_tok_s"] = harness.overall_tok_s(report["policies"])
    report["summary"] = harness.summarize(report["policies"], phases)
    assert report["overall_tok_s"]["specpilot"] == round(4000 / 34, 2)
    duty = harness.duty_cycle_overall(report)
    assert duty == {
        "tokens_per_s": round(4000 / 22, 2),
        "duty": round((10 / 70 + 10 / 70) / 2, 4),
        "downtime_s": 14.0,
        "charged_downtime_s": 2.0,
    }
    assert harness.switching_bound(report)["restart_s"] == 14.0
    assert harness.switching_bound(report, duty["duty"])["restart_s"] == 2.0
    line = "".join(harness.overall_line(report))
    assert f"{duty['tokens_per_s']} tok/s" in line and "(`duty_cycle_overall`)" in line
    # a run without phase windows (or without SpecPilot) has no such figure
    assert harness.duty_cycle_overall({**report, "phase_windows_utc": []}) is None
    assert harness.duty_cycle_overall({**report, "policies": report["policies"][:1]}) is None


def test_a_surge_switch_is_timed_but_not_counted_as_downtime(tmp_path: Path) -> None:
    """SpecPilot's engine under `--switch surge` serves while the next one starts (here the
    emulator as a real process on two ports): the switch is recorded, its time is not time
    without tokens; the first start, with nothing serving, is."""
    harness = _load("real_vllm.py") and sys.modules["real_engine"]
    ports = []
    for _ in range(2):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            ports.append(int(sock.getsockname()[1]))
    engine = harness.TimedEngine(
        engine="vllm",
        program=[
            *(sys.executable, "-m", "specpilot.operator.app.cli", "emulate", "--engine", "vllm"),
            *("--load-delay", "0.2"),
        ],
        launch=LaunchSettings(
            model="m", host="127.0.0.1", port=ports[0], sidecar_dir=str(tmp_path / "side")
        ),
        log_dir=tmp_path,
        start_timeout_s=120.0,
        surge_port=ports[1],
    )
    try:
        engine.apply(harness.SpecConfig())
        engine.apply(harness.SpecConfig(method="ngram", num_speculative_tokens=3))
    finally:
        engine.stop()
    assert len(engine.switches) == 2 and len(engine.downtime) == 1
    start, end = engine.switches[1]
    assert end is not None and end > start and engine.down_between(start, end) == 0.0
    assert engine.url.endswith(f":{ports[1]}")


def test_shared_servers_move_specpilot_onto_the_static_server_of_each_config(
    tmp_path: Path,
) -> None:
    """`--switch shared`: a switch moves SpecPilot's url to the static policy's server of that
    config (the twin's is not used), a window is read from that server, and a config no static
    server runs is refused as a failed start would be."""
    harness = _load("real_vllm.py") and sys.modules["real_engine"]
    ngram = harness.SpecConfig(method="ngram", num_speculative_tokens=3)
    statics = [("none", harness.SpecConfig()), ("ngram K=3", ngram)]
    engines = {}
    try:
        for name, config in [*statics, (harness.TWIN, harness.SpecConfig())]:
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", 0))
                port = int(sock.getsockname()[1])
            engine = harness.TimedEngine(
                engine="vllm",
                program=[
                    *(sys.executable, "-m", "specpilot.operator.app.cli", "emulate"),
                    *("--load-delay", "0.2"),
                ],
                launch=LaunchSettings(
                    model="m", host="127.0.0.1", port=port, sidecar_dir=str(tmp_path / name)
                ),
                log_dir=tmp_path,
                start_timeout_s=120.0,
            )
            engine.apply(config)
            engines[name] = engine
        shared = harness.SharedServers.of(engines, [*statics, (harness.TWIN, harness.SpecConfig())])
        shared.apply(harness.SpecConfig())
        assert shared.url == engines["none"].url
        shared.apply(ngram)
        assert shared.url == engines["ngram K=3"].url and shared.restarts == 2
        assert shared.observe(0.6).pods == (engines["ngram K=3"].url,)
        with pytest.raises(harness.EngineStartError, match="ngram K=5"):
            shared.apply(harness.SpecConfig(method="ngram", num_speculative_tokens=5))
        assert shared.config == ngram and shared.down_between(0.0, 1e12) == 0.0
    finally:
        for engine in engines.values():
            engine.stop()


def test_slot_counters_are_kept_only_without_a_restart() -> None:
    sglang = _load("real_sglang.py")
    harness = sys.modules["real_engine"]
    engine = sglang.make_engine(19999, Path("/tmp/specpilot-unit-bench-logs"))
    reads = iter([{"verify_calls": 5.0}, {"verify_calls": 9.0}, {"verify_calls": 9.0}])

    def meter(_: Any) -> dict[str, float]:
        return next(reads)

    assert harness.metered(meter, engine, lambda: "slot") == ("slot", {"verify_calls": 4.0})

    def restarting_slot() -> str:
        engine.restarts += 1  # SpecPilot switched: the new process counts from zero
        return "slot"

    assert harness.metered(meter, engine, restarting_slot) == ("slot", None)
    assert harness.metered(None, engine, lambda: "slot") == ("slot", None)


def test_a_server_that_cannot_be_read_after_its_slot_does_not_end_the_bench() -> None:
    """A real SGLang run died here: the pilot's switch failed to start (no memory left for its
    KV cache) and the read after the slot was refused."""
    sglang = _load("real_sglang.py")
    harness = sys.modules["real_engine"]
    engine = sglang.make_engine(19999, Path("/tmp/specpilot-unit-bench-logs"))
    answers: list[dict[str, float] | None] = [{"verify_calls": 5.0}, None, None, None]

    def meter(_: Any) -> dict[str, float]:
        answer = answers.pop(0)
        if answer is None:
            raise ScrapeError("cannot scrape 'http://127.0.0.1:1/metrics': Connection refused")
        return answer

    assert harness.metered(meter, engine, lambda: "slot") == ("slot", None)  # after refused
    assert harness.metered(meter, engine, lambda: "slot") == ("slot", None)  # before refused


def test_sglang_acceptance_length_from_its_counters() -> None:
    sglang = _load("real_sglang.py")
    # 2 requests: each 1 prefill token, then 10 verifies that accepted 15 drafts in all
    counters = {"generation_tokens": 2 + 10 + 15, "requests": 2, "verify_calls": 10}
    assert sglang.acceptance_length(counters) == 2.5
    assert sglang.acceptance_length({**counters, "verify_calls": 0}) is None


def test_commit_names_head_and_says_when_the_tree_differs(tmp_path: Path) -> None:
    harness = _load("real_sglang.py") and sys.modules["real_engine"]

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t", *args],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()

    git("init", "-q")
    (tmp_path / "a.txt").write_text("a\n")
    git("add", "a.txt")
    git("commit", "-q", "-m", "one")
    head = git("rev-parse", "HEAD")
    assert harness.git_commit(tmp_path) == head
    (tmp_path / "a.txt").write_text("b\n")
    assert harness.git_commit(tmp_path) == f"{head} (tree dirty: 1 paths modified or untracked)"


def test_prefill_probe_prices_a_token_by_the_difference_of_two_prompt_lengths() -> None:
    """Against a server whose request costs 3 ms plus 0.7 ms per prompt token (a simulated
    clock the transport advances), the slope is the per-token price; every prompt is fresh
    token ids (prefix caching would serve a repeated one for free) and asks for one token."""
    harness = _load("real_vllm.py") and sys.modules["real_engine"]
    now = [0.0]
    prompts: list[tuple[int, ...]] = []

    def serve(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        assert body["max_tokens"] == 1 and request.url.path == "/v1/completions"
        prompts.append(tuple(body["prompt"]))
        now[0] += 3e-3 + 0.7e-3 * len(body["prompt"])
        return httpx.Response(200, json={"choices": [{"text": "x"}]})

    slope, probe = harness.prefill_slope(
        "http://engine", (8, 40, 5), transport=httpx.MockTransport(serve), clock=lambda: now[0]
    )
    assert slope == pytest.approx(0.7e-3)
    assert probe["short_median_ms"] == pytest.approx(3 + 0.7 * 8)
    assert probe["long_median_ms"] == pytest.approx(3 + 0.7 * 40)
    assert len(prompts) == 10 and len(set(prompts)) == 10
    assert sorted({len(p) for p in prompts}) == [8, 40]


# --------------------------------------------------------------------------- stress runner


def test_a_stress_run_killed_at_its_timeout_names_the_test_that_was_running() -> None:
    stress_run = _load("stress_run.py")
    cut_off = (
        "tests/a.py::test_x PASSED    [  1%]\n"
        "tests/a.py::test_y FAILED    [  2%]\n"
        "tests/b.py::test_z[1] PASSED [  3%]\n"
        "tests/b.py::test_w "
    )
    counts = stress_run.progress_counts(cut_off)
    assert counts["running_at_timeout"] == "tests/b.py::test_w"
    assert counts["outcomes_before_timeout"] == {"FAILED": 1, "PASSED": 2}
    finished = stress_run.progress_counts(cut_off.replace("test_w ", "test_w PASSED [  4%]"))
    assert finished["running_at_timeout"] is None


def test_scrape_cost_ratios_are_per_round_against_the_quiet_slot() -> None:
    summarize = _load("scrape_cost.py").summarize
    rounds = [
        {"quiet": {"tokens_per_s": 100.0}, "every 1 s": {"tokens_per_s": 80.0}},
        {"quiet": {"tokens_per_s": 50.0}, "every 1 s": {"tokens_per_s": 55.0}},
        {"quiet": {"tokens_per_s": 200.0}, "every 1 s": {"tokens_per_s": 170.0}},
    ]
    summary = summarize(rounds)
    assert list(summary) == ["every 1 s"]  # the quiet arm is the reference, not an arm
    assert summary["every 1 s"]["ratios_to_quiet"] == [0.8, 1.1, 0.85]
    assert summary["every 1 s"]["median_ratio"] == 0.85
    assert summary["every 1 s"]["rounds_below_quiet"] == 2


def test_sglang_servers_run_their_model_on_one_thread_unless_told_default(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """SGLang's CPU default (a thread per core) spins on the cores the rest of the server and
    the clients need (bench/results/sglang_threads.md): the bench's servers get one thread."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # the servers inherit the caller's
    args = ["--log-dir", str(tmp_path), "--phases", "1"]
    one = _dry_run("real_sglang.py", args, capsys)
    told = _dry_run("real_sglang.py", [*args, "--threads", "default"], capsys)
    assert {s["env"].get("OMP_NUM_THREADS") for s in one["servers"]} == {"1"}
    assert all("OMP_NUM_THREADS" not in s["env"] for s in told["servers"])
    report = _load("real_sglang.py")
    assert report.threads_lines({"threads": "one"}) == [
        "Every server's scheduler on `one` thread setting (OMP_NUM_THREADS=1): see `--threads`."
    ]
    assert report.threads_lines({}) == []  # a run from before the option: SGLang's default


def test_cpu_seconds_by_process_reads_each_process_of_the_groups() -> None:
    import os
    import time

    cpu_seconds_by_process = (
        _load("real_sglang.py") and sys.modules["real_engine"]
    ).cpu_seconds_by_process
    key = f"{Path('/proc/self/comm').read_text().strip()}:{os.getpid()}"
    before = cpu_seconds_by_process({os.getpgrp()})
    deadline = time.process_time() + 0.3
    while time.process_time() < deadline:  # CPU time, not wall time: a loaded host only waits
        pass
    after = cpu_seconds_by_process({os.getpgrp()})
    assert after[key] - before[key] >= 0.2
    assert cpu_seconds_by_process(set()) == {}


@pytest.mark.parametrize("probe", ["scrape_cost", "engine_batch", "tick_cost"])
def test_one_server_probes_still_render_their_committed_results(probe: str) -> None:
    """The one-server probes share their report's head (real_engine.probe_head); their
    Markdown is still what their committed runs wrote."""
    report = json.loads((RESULTS / f"{probe}.json").read_text())
    assert _load(f"{probe}.py").markdown(report) == (RESULTS / f"{probe}.md").read_text()


def test_slot_noise_is_twice_the_standard_error_of_a_ratio_of_two_slot_means() -> None:
    harness = _load("real_vllm.py") and sys.modules["real_engine"]
    # two servers whose slots spread 10% about their mean: 2 x 0.1 x sqrt(2/3)
    noise = harness.slot_noise([[100.0, 110.0, 90.0], [200.0, 220.0, 180.0]])
    assert noise == {"slot_cv": 0.1, "slot_noise": 0.163}
    assert harness.slot_noise([[100.0], [200.0]]) is None  # one slot says nothing of spread


def test_overall_noise_adds_each_phase_slot_spread_at_its_best_static_speed() -> None:
    harness = _load("real_vllm.py") and sys.modules["real_engine"]
    report = {
        "rounds": 3,
        "summary": [
            {"best_static": "a", "slot_cv": 0.1, "tokens_per_s": {"a": 100.0}},
            {"best_static": "a", "slot_cv": 0.1, "tokens_per_s": {"a": 300.0}},
        ],
        "policies": [
            {"policy": "a", "kind": "static"},
            {"policy": harness.TWIN, "kind": "static"},
            {"policy": "specpilot", "kind": "specpilot"},
        ],
        "overall_tok_s": {"a": 200.0, harness.TWIN: 250.0, "specpilot": 210.0},
    }
    # phase sds 10 and 30 over 3 slots, a difference of two policies, the mean of 2 phases
    expected = 2 * ((2 * 10.0**2 / 3 + 2 * 30.0**2 / 3) / 4) ** 0.5 / 200.0
    assert harness.overall_noise(report) == round(expected, 3)
    recorded = json.loads((RESULTS / "real_vllm-shared-repeat.json").read_text())
    line = "".join(harness.overall_line(recorded))
    # the ranked statics: no speculation and the plain ngram Ks (not the table, not the twin)
    statics = {k: v for k, v in recorded["overall_tok_s"].items() if k == "none" or "K=" in k}
    best = max(statics, key=lambda k: statics[k])
    ratio = recorded["overall_tok_s"]["specpilot"] / statics[best]
    assert f"SpecPilot / best static ({best}) overall: {ratio:.3f}" in line
    assert f"by up to {harness.overall_noise(recorded):.1%}" in line
    del report["summary"][0]["slot_cv"]  # a run from before slots were recorded
    assert harness.overall_noise(report) is None


def test_arm_rounds_measures_every_arm_per_round_in_the_round_s_order(tmp_path: Path) -> None:
    harness = _load("real_vllm.py") and sys.modules["real_engine"]
    ns = argparse.Namespace(concurrency=[1, 4], rounds=2, out=tmp_path / "probe.json")
    report: dict[str, Any] = {"concurrencies": []}
    measured: list[tuple[str, int]] = []

    def measure(arm: str, phase: Any) -> dict[str, Any]:
        measured.append((arm, phase.concurrency))
        return {"tokens_per_s": float(len(measured))}

    harness.arm_rounds(
        ns,
        report,
        0.0,
        lambda r: ("a", "b") if r % 2 == 0 else ("b", "a"),
        measure,
        lambda rounds: {"rounds": len(rounds)},
        lambda rep: f"{len(rep['concurrencies'])} concurrencies\n",
    )
    per_concurrency = [("a", "b"), ("b", "a")]
    assert measured == [(arm, c) for c in (1, 4) for order in per_concurrency for arm in order]
    assert [c["summary"] for c in report["concurrencies"]] == [{"rounds": 2}, {"rounds": 2}]
    assert json.loads(ns.out.read_text())["concurrencies"][1]["rounds"][1]["a"] == {
        "tokens_per_s": 8.0
    }
    assert ns.out.with_suffix(".md").read_text() == "2 concurrencies\n"


def _cell(e2el_ms: dict[str, float]) -> dict[str, dict[str, float]]:
    """One world's policies at one traffic: each policy's mean E2E latency, 100 requests."""
    return {name: {"e2el_ms_mean": v, "requests": 100} for name, v in e2el_ms.items()}


def test_the_yardstick_counts_worlds_below_every_fixed_policy_per_rate_and_pooled() -> None:
    yardstick = _load("yardstick.py")
    # hindsight and SpecPilot's variants are not fixed policies: beating them is not required
    sp, ns, k3 = "specpilot", "no-spec", "static:eagle3 K=3"
    hs, explore = "hindsight", "specpilot:exploration"
    low = [
        _cell({sp: 90.0, ns: 100.0, k3: 95.0, hs: 80.0}),
        _cell({sp: 96.0, ns: 100.0, k3: 95.0, hs: 95.0, explore: 50.0}),
    ]
    high = [
        _cell({sp: 1000.0, ns: 1000.0, k3: 3000.0, hs: 900.0}),
        _cell({sp: 1000.0, ns: 1000.0, k3: 3000.0}),
    ]
    traffics = [
        {"name": "poisson-0.1", "worlds": [{"policies": c} for c in low]},
        {"name": "poisson-1.3", "worlds": [{"policies": c} for c in high]},
    ]
    rows = {
        line.split(" | ")[0].lstrip("| "): line
        for line in yardstick.against_fixed_lines(traffics)
        if line.startswith("| poisson") or line.startswith("| all rates")
    }
    # room: hindsight more than 1% below every fixed policy in world 0 only (80 vs 95)
    # and SpecPilot won there: 1 of the 1 world with room
    assert "| 1 of 2 | 0.947 | 0.979 | 1.011 | 1 of 2 | 0.921 | 1 of 1 |" in rows["poisson-0.1"]
    # one world without a hindsight run: the room counts the world that has one, which
    # SpecPilot only tied
    assert "| 0 of 2 | 1.000 | 1.000 | 1.000 | 1 of 1 | 0.900 | 0 of 1 |" in rows["poisson-1.3"]
    # pooled per world over both rates, requests-weighted: world 0 545 against no-spec's 550
    pooled = yardstick.pool([low[0], high[0]])
    assert pooled["specpilot"]["e2el_ms_mean"] == pytest.approx(545.0)
    assert next(r for k, r in rows.items() if k.startswith("all rates")).count("2 of 2") == 1
    # one traffic: no pooled row
    single = yardstick.against_fixed_lines(traffics[:1])
    assert not any(line.startswith("| all rates") for line in single)


def test_the_yardstick_reads_a_settled_half_only_in_poisson_cells() -> None:
    yardstick = _load("yardstick.py")
    policies = {
        "specpilot": {"windows": [{"requests": 10, "tpot_ms_mean": 9.0, "e2el_ms_mean": 900.0}]},
        "no-spec": {"windows": [{"requests": 10, "tpot_ms_mean": 10.0, "e2el_ms_mean": 1e3}]},
    }
    cell = {
        "name": "poisson-0.1",
        "rate_fraction_of_capacity": 0.1,
        "worlds": [{"policies": policies}],
    }
    rows = [line for line in yardstick.settled_lines([cell]) if line.startswith("| poisson")]
    assert rows == ["| poisson-0.1 | 1 of 1 | 0.900 | 0.900 | 0.900 | 0.900 |"]
    # a trace (its rate is None: the load moves) has no settled half
    trace = {**cell, "name": "azure_conv_2023", "rate_fraction_of_capacity": None}
    assert yardstick.settled_lines([trace]) == []


def test_the_committed_yardstick_markdown_renders_from_its_json() -> None:
    yardstick = _load("yardstick.py")
    for name in yardstick.RUNS:
        report = json.loads((RESULTS / f"yardstick-{name}.json").read_text())
        rendered = re.sub(r"at [0-9a-f]{7,}\.", "at HEAD.", yardstick.render(name, report))
        committed = re.sub(
            r"at [0-9a-f]{7,}\.", "at HEAD.", (RESULTS / f"yardstick-{name}.md").read_text()
        )
        assert rendered == committed, name
    index = (RESULTS / "yardstick.md").read_text()
    assert yardstick.index(yardstick.committed_reports()) == index
    assert index.count("| poisson-vllm (") == 7  # one line per rate of the sweep


def test_the_ablations_tell_a_trial_that_moved_from_canaries_that_were_all_rejected() -> None:
    ablations = _load("ablations.py")
    rejected = "t=60s exploring (...): eagle3 K=3 ...; not applied: CanaryRejected: canary ..."
    promoted = "t=120s exploring (...): eagle3 K=3 ...; the canary ran eagle3 K=3 at batch 3.3"
    instead = "t=180s predicted faster: eagle3 K=4 ...; the canary of eagle3 K=3 taught: ..."
    plain = "t=0s predicted faster for users: eagle3 K=5 +127.3% over no speculation"
    assert ablations.trial_outcome([plain]) == "none"
    assert ablations.trial_outcome([plain, rejected, rejected]) == "rejected"
    assert ablations.trial_outcome([rejected, promoted]) == "moved"
    assert ablations.trial_outcome([instead]) == "moved"
    cells = [[rejected], [promoted], [plain], [rejected]]
    report = {
        "setup": {"replicas": 1},
        "traffics": [
            {"worlds": [{"policies": {ablations.EXPLORATION: {"decisions": d}}} for d in cells]}
        ],
    }
    lines = ablations.trial_lines(report, [1.2, 0.9, 1.0, 1.001])
    assert "| a move (canary promoted, or the judge's move instead) | 1 | 0 | 1 |" in lines
    assert "| every canary rejected | 2 | 1 | 0 |" in lines
    assert "| no trial | 1 | 0 | 0 |" in lines
    assert any("spare GPU" in line for line in lines)  # beside one replica, says so
    four = {**report, "setup": {"replicas": 4}}
    assert not any("spare GPU" in line for line in ablations.trial_lines(four, [1.0] * 4))


def test_the_committed_demo_drivers_result_is_what_the_code_computes_now() -> None:
    """Its fast-mode half is simulated time: the same code gives the same figures, so a
    change that moves them must regenerate the file (its real-time half is the measurement)."""
    drivers = _load("demo_drivers.py")
    committed = json.loads((RESULTS / "demo_drivers.json").read_text())
    assert drivers.markdown(committed) == (RESULTS / "demo_drivers.md").read_text()
    assert drivers.timings(committed["seed"]) == committed["timings"]
    fast = {row["config"]: row["fast"] for row in drivers.drivers(committed["seed"], False)}
    assert fast == {row["config"]: row["fast"] for row in committed["drivers"]}
    for row in committed["drivers"]:  # the two drivers agree on a static config
        assert row["real_time_over_fast"] == pytest.approx(1.0, abs=0.02)
