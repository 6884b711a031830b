"""The demo's summary: the real-time SpecPilot run against static configs replayed in fast mode.

Contract: `fast_mode_results(...)` replays the demo's trace, same seed and so the same request
sequence, in fast mode (`runtime/emulator/fast_replay.py`) for every static config in the space,
vLLM's documented EAGLE-3 per-batch table, and the same tuner with the same settings (a
cross-check of the real-time run). `build_summary(...)` puts those rows beside the real-time
SpecPilot row and labels each with its mode: fast-mode numbers are simulated time, the
real-time row is measured by the load generator (tokens/s, end-to-end latency: requests
finished before the trace ended, as fast mode counts them) and by the engine's per-token
latency histogram; the real-time run has no per-request SLO-goodput (it would need each
request's per-token latency, which a non-streaming client does not see). `summary_markdown`
renders the tables.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from specpilot.operator.app.bench_command import VLLM_EAGLE3_TABLE
from specpilot.operator.app.demo.actuator import LatencyHistogram, Switch
from specpilot.operator.app.demo.load import LoadStats
from specpilot.runtime.emulator.fast_replay import Policy, TraceResult, run_trace, static
from specpilot.runtime.traces import Trace
from specpilot.tuner import (
    AcceptanceCurve,
    Observation,
    SpecConfig,
    StepCost,
    TunerSettings,
    TunerState,
    decide,
)

FAST, REAL_TIME = "fast mode (simulated)", "real time (measured)"


def fast_mode_results(
    trace: Trace,
    *,
    cost: StepCost,
    settings: TunerSettings,
    priors: Mapping[str, AcceptanceCurve],
    initial: SpecConfig,
    window_s: float,
    slo_s: float,
    seed: int,
) -> list[TraceResult]:
    def replay(policy: Policy, start: SpecConfig, name: str) -> TraceResult:
        return run_trace(
            trace,
            policy,
            start,
            cost,
            name=name,
            window_s=window_s,
            restart_downtime_s=settings.restart_downtime_s,
            slo_tpot_s=slo_s,
            seed=seed,
        )

    statics = [c for c in settings.candidates if c.schedule is None]
    results = [replay(static(c), c, c.describe()) for c in statics]
    results.append(replay(static(VLLM_EAGLE3_TABLE), VLLM_EAGLE3_TABLE, "vllm-eagle3-table"))
    holder = {"state": TunerState.initial(initial, 0.0, priors)}

    def tuner(obs: Observation, _current: SpecConfig, now: float) -> SpecConfig:
        decision, holder["state"] = decide(obs, holder["state"], settings, cost, now)
        return decision.config

    results.append(replay(tuner, initial, "specpilot"))
    return results


def realtime_row(
    load: LoadStats, tpot: LatencyHistogram, switches: Sequence[Switch], duration_s: float
) -> dict[str, Any]:
    done = [c for c in load.completed if c.finished_s <= duration_s]
    e2e = [c.finished_s - c.arrival_s for c in done]
    mean, p95 = tpot.mean_s, tpot.quantile(0.95)
    return {
        "policy": "specpilot",
        "mode": REAL_TIME,
        "goodput_tok_s": None,
        "tokens_per_s": round(sum(c.tokens for c in done) / duration_s, 2),
        "tpot_ms_mean": None if mean is None else round(mean * 1e3, 3),
        "tpot_ms_p95": None if p95 is None else round(p95 * 1e3, 3),
        "e2e_s_mean": round(statistics.fmean(e2e), 3) if e2e else None,
        "restarts": max(0, len(switches) - 1),
        "completed": len(done),
    }


def build_summary(
    *,
    setup: Mapping[str, Any],
    fast: Sequence[TraceResult],
    realtime: Mapping[str, Any],
    ticks: Sequence[Mapping[str, Any]],
    switches: Sequence[Switch],
    load: LoadStats,
) -> dict[str, Any]:
    rows = [{**r.to_dict(), "mode": FAST} for r in fast]
    rows.append(dict(realtime))
    statics = [r for r in fast if r.name != "specpilot"]
    # Every static serves nearly all requests of a trace that ends quiet, so goodput ties are
    # common: the lower mean per-token latency breaks them.
    best = max(statics, key=lambda r: (round(r.goodput_tok_s), -(r.tpot_ms_mean or math.inf)))
    restarts = [s.ready_s - s.started_s for s in switches[1:]]
    return {
        "setup": dict(setup),
        "policies": rows,
        "best_static_fast_mode": best.name,
        "measured_restart_s_mean": round(statistics.fmean(restarts), 2) if restarts else None,
        "requests": {
            "sent": load.sent,
            "completed_in_time": realtime["completed"],
            "resent_after_restart": load.resent,
            "http_errors": load.errors,
        },
        "switches": [
            {
                "started_s": round(s.started_s, 2),
                "ready_s": round(s.ready_s, 2),
                "config": s.config.describe(),
            }
            for s in switches
        ],
        "ticks": list(ticks),
    }


def _cell(value: object) -> str:
    return "n/a" if value is None else str(value)


def summary_markdown(summary: Mapping[str, Any]) -> str:
    setup = summary["setup"]
    lines = [
        "# SpecPilot demo",
        "",
        f"{setup['gpu']} x {setup['model_profile']}, emulated {setup['engine']} dialect; trace "
        f"`{setup['trace']}` over {setup['duration_s']:.0f} s, seed {setup['seed']}; "
        f"SLO per-token latency {setup['slo_tpot_ms']:.0f} ms; tuner window "
        f"{setup['window_s']:.0f} s, minimum dwell {setup['min_dwell_s']:.0f} s, restart "
        f"budget {setup['restart_budget']}.",
        "",
        "Fast-mode rows are the same trace and request sequence replayed in simulated time; the "
        "real-time row is SpecPilot driving the emulator in real time through the local "
        "actuator (process restarts included), measured by the load generator and the "
        "engine's histogram.",
        "",
        "| policy | mode | tok/s | SLO-goodput tok/s | TPOT mean ms | TPOT p95 ms "
        "| e2e mean s | restarts | completed |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in summary["policies"]:
        cells = [
            row["policy"],
            row["mode"],
            row["tokens_per_s"],
            row["goodput_tok_s"],
            row["tpot_ms_mean"],
            row["tpot_ms_p95"],
            row["e2e_s_mean"],
            row["restarts"],
            row["completed"],
        ]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    requests = summary["requests"]
    cpus, load = setup.get("host_cpus") or 1, setup.get("host_load_avg_1m_end")
    if load is not None and load > cpus:
        lines += [
            "",
            f"Note: the host was oversubscribed (1-minute load {load} on {cpus} CPUs at the end): "
            "the real-time emulator wakes late between steps and falls behind its physics, so "
            "the real-time row is pessimistic against the fast-mode rows.",
        ]
    lines += [
        "",
        "Best static config in fast mode (SLO-goodput, then mean TPOT): "
        f"{summary['best_static_fast_mode']}. "
        f"Real-time restarts took {_cell(summary['measured_restart_s_mean'])} s on average; "
        f"{requests['resent_after_restart']} sends were repeated after a restart dropped them.",
        "",
        "## Switches (real time)",
        "",
    ]
    lines += [
        f"- t={s['started_s']}s -> {s['config']} (ready t={s['ready_s']}s)"
        for s in summary["switches"]
    ]
    decisions = [t for t in summary["ticks"] if t["action"] != "stay" or t.get("rolled_back")]
    lines += ["", "## Decisions that changed the config", ""]
    lines += [f"- t={t['t']}s {t['action']}: {t['reason']}" for t in decisions] or ["- none"]
    return "\n".join(lines) + "\n"
