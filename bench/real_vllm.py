"""Real vLLM (CPU build, tiny local model): SpecPilot against static configs on a moving load.

Contract: one run starts a real vLLM server per policy, all through `LocalEngine` (the actuator
`specpilot run` uses), keeps them all up, and loads one at a time in interleaved slots so that
load from other jobs on the shared CPU lands on every policy alike: for each phase, `--rounds`
rounds of one slot per policy in rotating order. A phase is a concurrency (closed-loop async
users streaming /v1/completions) and a traffic kind: repetitive prompts at temperature 0 (high
n-gram acceptance) or at 0.7 (low); the profile moves concurrency 1 -> 32 -> 1 and back to
greedy. Tokens are counted client-side from vLLM's continuous usage stats as they stream.
Policies: no speculation, ngram at each K given, a hand-set per-batch K table, a second
no-speculation server (its twin: the servers' noise per phase) and SpecPilot (ControlLoop +
LocalEngine: real decisions, real switches).

SpecPilot's slot is one tick of its loop: load starts, the loop observes a window, decides and,
on a switch, restarts its server (`--switch restart`, the default) or starts the new config's
server on a second port beside the serving one (`--switch surge`, the operator's default
rollout on one machine), or moves the clients to the server of its warm pool that runs the new
config (`--switch pool`: one server per candidate, all up before the load), inside the slot.
Switches count against it: per phase,
`tokens_per_s_wall` is tokens over the slots' whole time (a restart's = zero tokens; a surge's
served by the old config while the new one starts on the same cores) and
`tokens_per_s_serving` over the time a server was up; both are reported.

The tuner on this CPU uses a step-time fit measured in the same run on the plain server (step
time = c / tokens per second at c = 1, 4, 16, 32, fitted by the probe's `fit_step_time`), fed
through `StepCost.from_fit` as `specpilot run --step-time-fit` does: the GPU catalog's roofline
says nothing about a CPU. The harness (slots, calibration, the loop, the report) is shared with
bench/real_sglang.py in bench/real_engine.py.

Run: HF_HUB_OFFLINE=1 .venv/bin/python bench/real_vllm.py   (~26 min on 2 shared cores)
Writes bench/results/real_vllm.json and .md after every phase, so a cut run keeps its part.
`--dry-run` prints the plan and starts nothing; `--phases N` runs the first N phases.
"""

from __future__ import annotations

import argparse
import calendar
import os
import platform
import re
import sys
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

from specpilot.runtime.engines import LaunchSettings, get_adapter
from specpilot.runtime.engines.vllm import CPU_ONE_CORE_ENV
from specpilot.tuner import SpecConfig

BENCH = str(Path(__file__).resolve().parent)
if BENCH not in sys.path:  # imported by path (the tests): the shared harness lives beside it
    sys.path.insert(0, BENCH)

from real_engine import (  # noqa: E402
    MAX_TOKENS,
    MODEL,
    RESULTS,
    ROOT,
    SERVED,
    Phase,
    Plan,
    TimedEngine,
    add_arguments,
    command_line,
    environment_lines,
    git_commit,
    main_for,
    overall_line,
    parse_ks,
    pilot_slot_line,
    provenance_lines,
    servers_phrase,
    summary_table,
    tail_lines,
    with_twin,
)

VLLM_PYTHON = ROOT / ".venvs" / "vllm" / "bin" / "python"
TABLE = ((1, 4, 3), (5, 16, 1), (17, 256, 0))
"""A hand-set per-batch K table (ngram, max K 3), as REFERENCE.md section 6 measured."""

PHASES = (
    Phase("c1 greedy", 1, 0.0),
    Phase("c32 greedy", 32, 0.0),
    Phase("c32 temp0.7", 32, 0.7),
    Phase("c1 temp0.7", 1, 0.7),
    Phase("c1 greedy (again)", 1, 0.0),
)
CALIBRATION_CONCURRENCY = (1, 4, 16, 32)
MAX_NUM_SEQS = 32
"""vLLM's --max-num-seqs on every server here; the tuner is told it (TunerSettings.max_batch,
256 unless told), so its capacity reads stop where the engine's do."""
TYPICAL_START_S = 30.0
"""A vLLM CPU start on the shared host (real_vllm.json at 1f96d7e: 25.9-30.5 s to healthy);
only --dry-run uses it."""


KV_CACHE_GIB = 1.0
"""Each server's KV cache (`--kv-cache-memory-bytes`, in GiB; VLLM_CPU_KVCACHE_SPACE, which
would override it, takes whole GiB only): 1 GiB holds 2,097,152 tokens of this model
(vLLM's log), far beyond 32 requests of 1024. On `--executor mp` each server held about 2.1 GB
of RAM (`free` with four up: 10.3 GB used against 1.9 idle), so eleven (a pool run) need less:
at 0.25 GiB one server's worker held 0.97 GB against 1.76."""


EXECUTORS: dict[str, dict[str, str]] = {"uni": dict(CPU_ONE_CORE_ENV), "mp": {}}
"""How each server's engine core runs its model, as environment: `uni` keeps the model inside
the engine-core process on one thread (`CPU_ONE_CORE_ENV`, which says why); `mp` is vLLM's CPU
default, a worker process bound to one core whose engine core busy-waits on it for every
step's output: on 2 cores a concurrency-32 phase then measured the frontend
(bench/results/engine_batch.md, which measures each variant)."""


def make_engine(
    port: int, log_dir: Path, kv_cache_gib: float = KV_CACHE_GIB, executor: str = "uni"
) -> TimedEngine:
    launch = LaunchSettings(
        model=str(MODEL),
        served_model_name=SERVED,
        host="127.0.0.1",
        port=port,
        extra_args=(
            "--max-model-len",
            "1024",
            "--max-num-seqs",
            str(MAX_NUM_SEQS),
            "--kv-cache-memory-bytes",
            str(int(kv_cache_gib * 2**30)),
        ),
        sidecar_dir=f"/tmp/specpilot-bench-{port}",
    )
    env = {
        **{k: v for k, v in os.environ.items() if k != "VLLM_CPU_KVCACHE_SPACE"},
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        **EXECUTORS[executor],
    }
    log_dir.mkdir(parents=True, exist_ok=True)
    return TimedEngine(
        engine="vllm",
        program=get_adapter("vllm").program(str(VLLM_PYTHON)),
        launch=launch,
        env=env,
        log_dir=log_dir,
    )


def markdown(report: dict[str, Any]) -> str:
    lines = [
        "# Real vLLM (CPU build, tiny local model): tokens/s per phase",
        "",
        *provenance_lines(report),
        f"Started {report['started_utc']}, {report['wall_min']:.1f} min wall; {report['machine']}.",
        *executor_lines(report),
        "",
        "All policies ran in this one run, on the same shared 2-core machine, "
        f"{servers_phrase(report, 'vLLM')}, all servers up at once and loaded "
        "one at a time in interleaved slots: each phase is "
        f"{report['rounds']} rounds of one {report['slot_seconds']:.0f} s slot per policy, "
        "the order rotating, so load from elsewhere spreads over all policies and ratios within "
        "the run compare; absolute figures move with that load. Idle servers burned "
        f"{report.get('idle_cores_all_servers', '?')} cores together. Closed-loop streaming "
        f"clients, {MAX_TOKENS} output tokens per request (ignore_eos), tokens counted as they "
        "stream (vLLM's continuous usage stats).",
        "",
        pilot_slot_line(report)
        + " Best/worst static are over no speculation and the plain ngram Ks; the "
        "hand-set per-batch table is shown beside them. Tokens/s below are per policy's slots "
        "(static: serving = wall).",
        "",
        *summary_table(report),
    ]
    accept = report.get("acceptance_length_from_engine_logs")
    if accept:
        folders = sorted(accept)
        lines += [
            "",
            "Mean acceptance length per phase, from each server's own vLLM log lines "
            "(SpecDecoding metrics, weighted by drafted tokens"
            + (
                "; a static server's lines include SpecPilot's slots on it"
                if report.get("specpilot", {}).get("switch") == "shared"
                else ""
            )
            + "):",
            "",
            "| phase | " + " | ".join(folders) + " |",
            "|---" * (len(folders) + 1) + "|",
        ]
        for name in [p.name for p in PHASES]:
            cells = [str(accept[f].get(name, "-")) for f in folders]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += overall_line(report)
    lines += tail_lines(report)
    return "\n".join(lines) + "\n"


def executor_lines(report: dict[str, Any]) -> list[str]:
    """How the servers ran their model (absent from runs before `--executor`: vLLM's `mp`)."""
    return environment_lines(report, "executor", EXECUTORS, "server on the `{}` executor", "vLLM")


SPEC_LOG = re.compile(
    r"(\d\d-\d\d \d\d:\d\d:\d\d) \[metrics\.py:\d+\] SpecDecoding metrics: Mean acceptance "
    r"length: ([\d.]+).*?Drafted: (\d+) tokens"
)


def acceptance_from_logs(
    log_dir: Path, windows: list[tuple[str, float, float]], year: int
) -> dict[str, dict[str, float | None]]:
    """Mean acceptance length per policy per phase from vLLM's own periodic log lines (each
    covers the ~10 s before it; weighted by drafted tokens), for the static servers, whose
    slots the tuner does not observe. {policy dir: {phase: length or None}}."""
    out: dict[str, dict[str, float | None]] = {}
    for folder in sorted(p for p in log_dir.iterdir() if p.is_dir()):
        sums = {name: [0.0, 0.0] for name, _, _ in windows}
        for log in folder.glob("engine-*.log"):
            for match in SPEC_LOG.finditer(log.read_text(errors="replace")):
                stamp = time.strptime(f"{year}-{match.group(1)}", "%Y-%m-%d %H:%M:%S")
                t = calendar.timegm(stamp) - 5.0  # the middle of the interval it reports
                for name, t0, t1 in windows:
                    if t0 <= t < t1:
                        drafted = float(match.group(3))
                        sums[name][0] += float(match.group(2)) * drafted
                        sums[name][1] += drafted
        out[folder.name] = {name: (round(a / d, 3) if d else None) for name, (a, d) in sums.items()}
    return out


def plan_for(ns: argparse.Namespace, argv: Sequence[str]) -> Plan:
    ks = parse_ks(ns.ks)
    statics: list[tuple[str, SpecConfig]] = [("none", SpecConfig())]
    statics += [(f"ngram K={k}", SpecConfig(method="ngram", num_speculative_tokens=k)) for k in ks]
    if not ns.no_table:
        statics.append(
            ("table", SpecConfig(method="ngram", num_speculative_tokens=3, schedule=TABLE))
        )
    started = time.time()
    log_dir = Path(ns.log_dir)

    def after_phase(
        report: dict[str, Any], windows: list[tuple[str, float, float]], t0: float
    ) -> None:
        report["acceptance_length_from_engine_logs"] = acceptance_from_logs(
            log_dir, windows, time.gmtime(t0).tm_year
        )

    return Plan(
        engine_label="vLLM CPU",
        make_engine=partial(make_engine, kv_cache_gib=ns.kv_cache_gib, executor=ns.executor),
        statics=with_twin(statics),
        candidates=(
            SpecConfig(),
            *(SpecConfig(method="ngram", num_speculative_tokens=k) for k in ks),
        ),
        phases=PHASES[: ns.phases],
        calibration_concurrency=CALIBRATION_CONCURRENCY,
        markdown=markdown,
        report_head={
            "command": command_line(argv),
            "commit": git_commit(),
            "started_utc": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(started)),
            "machine": f"{os.cpu_count()} CPUs ({platform.machine()}, shared), vLLM 0.32 CPU "
            f"build, model {MODEL.relative_to(ROOT)}",
            "executor": ns.executor,
        },
        after_phase=after_phase,
        settings_overrides={"max_batch": MAX_NUM_SEQS},
    )


def positive_gib(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0:
        raise argparse.ArgumentTypeError(
            f"must be a positive number of GiB, e.g. 0.25; got {text!r}"
        )
    return value


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    add_arguments(
        parser,
        phases=len(PHASES),
        out=RESULTS / "real_vllm",
        log_dir="/tmp/specpilot-real-vllm-bench",
    )
    parser.add_argument("--no-table", action="store_true")
    parser.add_argument(
        "--kv-cache-gib",
        type=positive_gib,
        default=KV_CACHE_GIB,
        help="KV cache of every server (GiB, --kv-cache-memory-bytes); a pool run's eleven "
        "servers at the default 1 would not fit this host's 24 GB",
    )
    parser.add_argument(
        "--executor",
        choices=sorted(EXECUTORS),
        default="uni",
        help="uni (default): each server's model runs in its engine-core process on one thread; "
        "mp: vLLM's CPU default, a worker process the engine core busy-waits on, which on 2 "
        "cores starves the API server at concurrency 32 (bench/results/engine_batch.md)",
    )
    return main_for(plan_for, parser, len(PHASES), argv, "bench/real_vllm.py", TYPICAL_START_S)


if __name__ == "__main__":
    sys.exit(main())
