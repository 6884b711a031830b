"""Real SGLang 0.5.23 (CPU, tiny local model): SpecPilot against static configs on a moving load.

Contract: the SGLang arm of the real-engine bench (the harness is bench/real_engine.py, shared
with bench/real_vllm.py). One run starts a real SGLang server per policy, all through
`LocalEngine` (the actuator `specpilot run` uses), keeps them all up and loads one at a time in
interleaved slots: for each phase, `--rounds` rounds of one slot per policy in rotating order.
A phase is a concurrency (closed-loop async users streaming /v1/completions) and a temperature:
the profile moves concurrency 1 -> 8 -> 1, greedy -> 0.7 -> greedy. Tokens are counted
client-side from SGLang's continuous usage stats as they stream. Policies: no speculation,
NGRAM at each K given (`--speculative-num-draft-tokens K+1`), a second no-speculation server
(its twin: the servers' noise per phase) and SpecPilot (ControlLoop + LocalEngine: real
decisions, real switches between NGRAM on/off and its draft-token counts).

The servers start as the live contract tests start them (tests/contract/sglang_live.py): the
command line SpecPilot's SGLang adapter renders, plus what a CPU needs, added here and never by
the adapter: `--device cpu`, an attention backend (torch_native without speculation;
intel_amx with NGRAM, the only CPU backend that verifies a draft tree), no CUDA graphs, bf16, a
small KV pool; `SGLANG_USE_CPU_ENGINE=1`; and the TEST-ONLY `sgl_kernel` stand-in on PYTHONPATH
(tests/contract/engine_side/sgl_kernel_standin: plain-torch versions of the nine CPU ops NGRAM
calls; it tells SGLang this CPU has AMX for speculative servers only). Two more flags for the
bench: `--sleep-on-idle` (SGLang's own; an idle scheduler otherwise polls and holds a core,
and all servers stay up) and `--random-seed` (recorded). Server, scheduler, metrics, HTTP API
and the n-gram drafter are SGLang's; the attention and verify kernels of NGRAM servers are the
stand-in's.

SGLang's own adaptive mode (`--speculative-adaptive`) cannot be a policy here: it supports only
EAGLE/EAGLE3 (`adaptive_unsupported_reason` in srt/speculative/adaptive_spec_params.py), and
there is no draft model for this tiny model; it stays emulated (`specpilot bench`). SGLang
refuses a per-batch K schedule for NGRAM, so the tuner does not synthesise schedules here.

The tuner uses a step-time fit measured in the same run on the plain server (c / tok/s at
c = 1, 2, 4, 8) and the `chat` acceptance prior (tuner/priors.py).

Run: HF_HUB_OFFLINE=1 .venv/bin/python bench/real_sglang.py   (--dry-run prints the plan and
the expected minutes; --phases N --rounds R --slot-seconds S make a smoke run)
Writes bench/results/real_sglang.json and .md after every phase, so a cut run keeps its part.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import httpx

from specpilot.runtime.engines import LaunchSettings, get_adapter
from specpilot.runtime.scrape import fetch_snapshot
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

SGLANG_PYTHON = ROOT / ".venvs" / "sglang" / "bin" / "python"
STANDIN = ROOT / "tests" / "contract" / "engine_side" / "sgl_kernel_standin"
SERVER_SEED = 0
PHASES = (
    Phase("c1 greedy", 1, 0.0),
    Phase("c8 greedy", 8, 0.0),
    Phase("c8 temp0.7", 8, 0.7),
    Phase("c1 temp0.7", 1, 0.7),
    Phase("c1 greedy (again)", 1, 0.0),
)
CALIBRATION_CONCURRENCY = (1, 2, 4, 8)
TYPICAL_START_S = 60.0
"""An SGLang CPU start on the shared host (30-130 s seen while writing this); --dry-run only."""
ADAPTIVE_UNSUPPORTED = (
    "SGLang's own adaptive speculative mode (--speculative-adaptive) supports only EAGLE/EAGLE3 "
    "(adaptive_unsupported_reason in sglang/srt/speculative/adaptive_spec_params.py returns "
    "'speculative_algorithm=NGRAM (only EAGLE/EAGLE3 are supported)'), and no EAGLE draft "
    "model exists for the tiny model: it is not a policy in this run and stays emulated "
    "(specpilot bench)."
)
STANDIN_NOTE = (
    "Kernel ops are a test-only stand-in: SGLang 0.5.23's server, scheduler, metrics, HTTP API "
    "and n-gram drafter are real; no CPU build of sgl-kernel is installable, so "
    "tests/contract/engine_side/sgl_kernel_standin supplies plain-torch versions of the nine "
    "CPU ops NGRAM calls (attention and tree verify) and tells SGLang the CPU has AMX on "
    "speculative servers, which therefore run the intel_amx attention backend over the "
    "stand-in's ops while the plain server runs SGLang's torch_native backend."
)
CPU_VERIFY_NOTE = (
    "On CPU SGLang's NGRAM verify commits the target's argmax whatever the temperature "
    "(sglang/srt/speculative/eagle_utils.py, _verify_uses_greedy returns True when is_cpu), so "
    "at temperature 0.7 the NGRAM servers sample only the first token (prefill) and decode "
    "greedily after it, while the plain server samples every token: NGRAM's temp0.7 figures "
    "are not those of sampled traffic (see the acceptance table)."
)
# SGLang's own verdict on its adaptive mode for NGRAM, asked in its environment at the start
ADAPTIVE_PROBE = """
from sglang.srt.server_args import ServerArgs
from sglang.srt.speculative.adaptive_spec_params import adaptive_unsupported_reason
args = ServerArgs(model_path=MODEL, speculative_algorithm="NGRAM", device="cpu")
print(adaptive_unsupported_reason(args))
"""


def cpu_flags(config: SpecConfig) -> tuple[str, ...]:
    """What a CPU needs, as tests/contract/sglang_live.py adds it, plus the bench's two."""
    backend = "intel_amx" if config.speculative else "torch_native"
    return (
        "--device",
        "cpu",
        "--attention-backend",
        backend,
        "--disable-cuda-graph",
        "--dtype",
        "bfloat16",
        # SGLang sizes its KV pool as the free memory after loading less (1 - this) of the free
        # memory before: the n-gram drafter's trie (10M nodes, 1.8 GB here) is allocated in
        # between, so with five servers up (10 GB free) 0.15 left no pool and every switch
        # into n-gram died at db29c6a (SGLang's ValueError "Loaded weights leave no GPU memory
        # for the KV cache", then its own SIGKILL of the server: exit -9; reproduced alone at
        # 0.05 with 21 GB free). --max-total-tokens caps the pool, so on a CPU the fraction
        # sizes nothing else.
        "--mem-fraction-static",
        "0.5",
        "--max-total-tokens",
        "65536",
        "--sleep-on-idle",
        "--random-seed",
        str(SERVER_SEED),
    )


@dataclass
class SglangCpuEngine(TimedEngine):
    """The local actuator for SGLang on this CPU: its CPU flags and the stand-in's AMX claim
    depend on whether the config speculates, so they are set per apply (LocalEngine takes
    them fixed)."""

    def prepare(self, config: SpecConfig) -> None:
        self.launch = replace(self.launch, extra_args=cpu_flags(config))
        self.env = {**self.env, "SPECPILOT_STANDIN_CLAIM_AMX": "1" if config.speculative else "0"}

    def apply(self, config: SpecConfig) -> None:
        self.prepare(config)
        super().apply(config)


THREADS: dict[str, dict[str, str]] = {
    "one": {"OMP_NUM_THREADS": "1"},
    "default": {},
}
"""How many threads each server's scheduler runs its model on, as environment: `one` holds
torch's OpenMP pool to one thread; `default` leaves SGLang's CPU default, one thread per core
of the NUMA node (both here), which spins on the core the tokenizer manager, the detokenizer and
the clients need: on this host its scheduler used 1.6-1.75 cores at concurrency 1 and 8 alike
(17.4-19.3 CPU s per 11 s slot, against 10.8-11.3 on one thread), and the server served 8-25%
fewer tokens/s than on one thread (no speculation 1020.5 against 1262.3 at concurrency 8,
ngram K=5 2365.4 against 3166.8: bench/results/sglang_threads.md at e643415)."""


def make_engine(port: int, log_dir: Path, threads: str = "one") -> TimedEngine:
    launch = LaunchSettings(
        model=str(MODEL),
        served_model_name=SERVED,
        host="127.0.0.1",
        port=port,
        sidecar_dir=f"/tmp/specpilot-bench-{port}",
    )
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "SGLANG_USE_CPU_ENGINE": "1",
        # the n-gram matcher is compiled with g++ on first start; the tests keep it here too
        "SGLANG_CACHE_DIR": str(ROOT / ".cache" / "sglang-jit"),
        "PYTHONPATH": str(STANDIN),
        **THREADS[threads],
    }
    log_dir.mkdir(parents=True, exist_ok=True)
    return SglangCpuEngine(
        engine="sglang",
        program=get_adapter("sglang").program(str(SGLANG_PYTHON)),
        launch=launch,
        env=env,
        log_dir=log_dir,
    )


COUNTERS = {
    "generation_tokens": "sglang:generation_tokens_total",
    "verify_calls": "sglang:spec_verify_calls_total",
    "requests": "sglang:e2e_request_latency_seconds_count",
}


def read_counters(engine: TimedEngine) -> dict[str, float]:
    """The server's own cumulative counters (SGLang adds a request's tokens and verifies when
    it finishes or is aborted)."""
    with httpx.Client(timeout=30) as client:
        snapshot = fetch_snapshot(client, f"{engine.url}/metrics", time.time())
    return {key: sum(snapshot.series(name).values()) for key, name in COUNTERS.items()}


def acceptance_length(counters: dict[str, float]) -> float | None:
    """Mean tokens per verify over the slots: each request's first token comes from prefill,
    every verify yields its accepted drafts plus one, so (tokens - requests) / verifies; None
    when nothing was verified (no speculation)."""
    verifies = counters.get("verify_calls", 0.0)
    if verifies <= 0:
        return None
    return round((counters["generation_tokens"] - counters["requests"]) / verifies, 3)


def threads_lines(report: dict[str, Any]) -> list[str]:
    """How the servers ran their model (absent from runs before `--threads`: SGLang's default)."""
    subject = "server's scheduler on `{}` thread setting"
    return environment_lines(report, "threads", THREADS, subject, "SGLang")


def markdown(report: dict[str, Any]) -> str:
    lines = [
        "# Real SGLang 0.5.23 (CPU, tiny local model): tokens/s per phase",
        "",
        *provenance_lines(report),
        f"Started {report['started_utc']}, {report['wall_min']:.1f} min wall; {report['machine']}.",
        f"Seeds: `{json.dumps(report['seeds'])}`.",
        *threads_lines(report),
        "",
        "All policies ran in this one run, on the same shared 2-core machine, "
        f"{servers_phrase(report, 'SGLang')}, all servers up at once (`--sleep-on-idle`) and "
        "loaded one at a time in interleaved slots: each phase is "
        f"{report['rounds']} rounds of one {report['slot_seconds']:.0f} s slot per policy, "
        "the order rotating, so load from elsewhere spreads over all policies and ratios within "
        "the run compare; absolute figures move with that load. Idle servers burned "
        f"{report.get('idle_cores_all_servers', '?')} cores together. Closed-loop streaming "
        f"clients, {MAX_TOKENS} output tokens per request (ignore_eos), tokens counted as they "
        "stream (SGLang's continuous usage stats).",
        "",
        pilot_slot_line(report) + " Best/worst static are "
        "over no speculation and the NGRAM Ks. Tokens/s below are per policy's slots (static: "
        "serving = wall).",
        "",
        *summary_table(report),
    ]
    accept = {
        p["policy"]: {ph["name"]: ph.get("acceptance_length") for ph in p["phases"]}
        for p in report.get("policies", [])
    }
    if accept:
        names = list(accept)
        lines += [
            "",
            "Mean acceptance length per phase, from each server's own counters over its slots "
            "((generation tokens - requests) / verify calls; SpecPilot's only over slots "
            "without a restart):",
            "",
            "| phase | " + " | ".join(names) + " |",
            "|---" * (len(names) + 1) + "|",
        ]
        for phase in report["phases"]:
            cells = [str(accept[n].get(phase["name"], "-")) for n in names]
            lines.append(f"| {phase['name']} | " + " | ".join(cells) + " |")
    lines += overall_line(report)
    lines += ["", "## What is real here", "", *[f"- {s}" for s in report["engine_notes"]]]
    lines += tail_lines(report)
    return "\n".join(lines) + "\n"


def ask_adaptive_reason(report: dict[str, Any]) -> None:
    """Records what SGLang's `adaptive_unsupported_reason` says of an NGRAM server."""
    done = subprocess.run(
        [str(SGLANG_PYTHON), "-c", ADAPTIVE_PROBE.replace("MODEL", repr(str(MODEL)))],
        capture_output=True,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(STANDIN)},
        timeout=300,
        check=False,
    )
    lines = done.stdout.strip().splitlines()
    report["adaptive_unsupported_reason"] = (
        lines[-1] if done.returncode == 0 and lines else f"not asked: {done.stderr[-300:]}"
    )


def with_acceptance(report: dict[str, Any]) -> None:
    """Each policy's phases get the acceptance length their server's counters give."""
    for policy in report["policies"]:
        for phase in policy["phases"]:
            counters = phase.get("server_counters")
            phase["acceptance_length"] = acceptance_length(counters) if counters else None


def plan_for(ns: argparse.Namespace, argv: Sequence[str]) -> Plan:
    ks = parse_ks(ns.ks)
    statics: list[tuple[str, SpecConfig]] = [("none", SpecConfig())]
    statics += [(f"ngram K={k}", SpecConfig(method="ngram", num_speculative_tokens=k)) for k in ks]
    started = time.time()
    return Plan(
        engine_label="SGLang CPU",
        make_engine=partial(make_engine, threads=ns.threads),
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
            "machine": f"{os.cpu_count()} CPUs ({platform.machine()}, shared), SGLang 0.5.23 "
            f"(CPU, test-only sgl_kernel stand-in), model {MODEL.relative_to(ROOT)}",
            "seeds": {
                "server_random_seed": SERVER_SEED,
                "tuner": "fixed in its code (residual GP random_state=0)",
                "clients": "none drawn: user u sends prompt (u + n) mod 8 as its n-th request",
            },
            "engine_notes": [STANDIN_NOTE, ADAPTIVE_UNSUPPORTED, CPU_VERIFY_NOTE],
            "threads": ns.threads,
        },
        preflight=ask_adaptive_reason,
        # SGLang refuses a per-batch K schedule for NGRAM (its adapter's capability table):
        # a synthesised schedule would fail at apply and cost a rollback restart
        settings_overrides={"synthesize_schedules": False},
        meter=read_counters,
        after_phase=lambda report, _windows, _started: with_acceptance(report),
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    add_arguments(
        parser,
        phases=len(PHASES),
        out=RESULTS / "real_sglang",
        log_dir="/tmp/specpilot-real-sglang-bench",
    )
    parser.set_defaults(ks="3,5", port=18831)
    parser.add_argument(
        "--threads",
        choices=sorted(THREADS),
        default="one",
        help="one (default): each server's scheduler runs its model on one OpenMP thread; "
        "default: SGLang's, a thread per core, which on 2 cores spins on the core the rest of "
        "the server and the clients need (bench/results/sglang_threads.md)",
    )
    return main_for(plan_for, parser, len(PHASES), argv, "bench/real_sglang.py", TYPICAL_START_S)


if __name__ == "__main__":
    sys.exit(main())
