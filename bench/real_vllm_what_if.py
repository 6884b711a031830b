"""What the tuner's physics prior predicts for the real vLLM bench, against what the run measured.

Contract: reads bench/results/real_vllm.json (a committed real run: its step-time fit, its
measured tokens/s per static config and acceptance lengths per phase, SpecPilot's observed
batch) and, for each greedy phase at concurrency 1, prints and writes what the tuner's
`Surrogate.prior` predicts for every static config under two step-time models: the run's
decode-only fit, and the same fit with each token a sequence adds beyond its first priced at
`--per-extra-ms` (default: what the run's own ngram K=5 servers imply, (step at K=5 - step at
K=0) / 5 from measured tokens/s and acceptance; a real run measures it with the prefill probe,
bench/real_engine.py). Each model is shown with the chat prior's acceptance (what the tuner
starts from) and with the run's measured acceptance (what it would know after one window of that
config). Measured acceptance and per-config tokens/s come from the run: this is a check of the
cost model against measurements, not a tuner benchmark. Then `decide` on SpecPilot's first tick
of each such phase (its observed batch and tokens/s, speculation off, the run's settings), under
each cost model, from the chat prior and from a prior set to the acceptance ngram K=5 measured
there: whether the tuner would move if it knew; and, for each `--ngram-p-sd` given, from the
chat prior with that spread on ngram's p in place of the published one (priors.PRIOR_P_SD, set
for this process only): whether a wider prior alone would make it try ngram.

Run: .venv/bin/python bench/real_vllm_what_if.py   (a second; writes
bench/results/real_vllm_what_if.json and .md)
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from specpilot.tuner import (
    AcceptanceCurve,
    Observation,
    SpecConfig,
    StepCost,
    StepTimeModel,
    TunerSettings,
    TunerState,
    acceptance_curve,
    decide,
    p_for_length,
)
from specpilot.tuner._model.surrogate import Surrogate
from specpilot.tuner.policy.settings import DEFAULT_MAX_BATCH
from specpilot.tuner.priors import PRIOR_P_SD

BENCH = str(Path(__file__).resolve().parent)
if BENCH not in sys.path:  # imported by path (the tests): the shared harness lives beside it
    sys.path.insert(0, BENCH)

from real_engine import RESULTS, ROOT, git_commit  # noqa: E402


def ngram(k: int) -> SpecConfig:
    """ngram at K; K = 0 is no speculation."""
    return SpecConfig(method="ngram", num_speculative_tokens=k) if k else SpecConfig()


def run_max_batch(run: dict[str, Any]) -> int:
    """The batch limit the run told its tuner (runs before it was recorded: the library's)."""
    return int(run["specpilot"]["settings"].get("max_batch", DEFAULT_MAX_BATCH))


def measured_step_ms(tok_s: float, length: float) -> float:
    """ms per engine step at concurrency 1: tokens per step over tokens per second."""
    return 1e3 * length / tok_s


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", default=str(RESULTS / "real_vllm.json"))
    parser.add_argument("--per-extra-ms", type=float, default=None)
    parser.add_argument("--out", default=str(RESULTS / "real_vllm_what_if.json"))
    parser.add_argument(
        "--ngram-p-sd",
        default="0.25,0.5",
        help="comma-separated spreads of ngram's prior p to decide from (chat prior)",
    )
    ns = parser.parse_args(argv)
    run = json.loads(Path(ns.run).read_text())
    fit = run["step_time_fit"]
    statics = {p["policy"]: p for p in run["policies"] if p["kind"] == "static"}
    lengths = run["acceptance_length_from_engine_logs"]
    greedy_c1 = [ph for ph in run["phases"] if ph["concurrency"] == 1 and ph["temperature"] == 0]
    ngram_ks = sorted(int(name.split("=")[1]) for name in statics if name.startswith("ngram K="))
    first = greedy_c1[0]["name"]
    tok_s = {n: _phase(p, first)["tokens_per_s_wall"] for n, p in statics.items()}
    k_top = ngram_ks[-1]
    implied = (
        measured_step_ms(tok_s[f"ngram K={k_top}"], lengths[f"ngram_K={k_top}"][first])
        - measured_step_ms(tok_s["none"], 1.0)
    ) / k_top
    per_extra_ms = implied if ns.per_extra_ms is None else ns.per_extra_ms
    decode_only = StepTimeModel.from_fit_json(fit, source="the run's decode-only fit")
    priced = StepTimeModel.from_fit_json(
        {**fit, "per_extra_token_s": per_extra_ms * 1e-3}, source="extra tokens priced apart"
    )
    chat = {"ngram": acceptance_curve("ngram", "chat")}
    max_batch = run_max_batch(run)
    capacity_batches = [b for b in (2 ** (i / 2) for i in range(17)) if b <= max_batch]
    rows: list[dict[str, Any]] = []
    for phase in greedy_c1:
        name = phase["name"]
        measured = {n: _phase(p, name)["tokens_per_s_wall"] for n, p in statics.items()}
        batch = 1.0
        for label, model in (("decode-only fit", decode_only), ("extra tokens priced", priced)):
            cost = StepCost.from_fit(model, "H100", "llama-3.1-8b")
            for prior_label in ("chat prior", "measured acceptance"):
                for k in [0, *ngram_ks]:
                    config = ngram(k)
                    policy = "none" if k == 0 else f"ngram K={k}"
                    if prior_label == "chat prior" or k == 0:
                        acceptance = chat
                    else:
                        length = lengths[f"ngram_K={k}"][name]
                        acceptance = {"ngram": AcceptanceCurve(p_for_length(length, k, 1.0), 1.0)}
                    surrogate = Surrogate(cost, acceptance)
                    predicted = surrogate.prior(config, batch, 0.0)
                    capacity = max(
                        surrogate.prior(config, b, 0.0).tokens_per_s for b in capacity_batches
                    )
                    rows.append(
                        {
                            "phase": name,
                            "cost": label,
                            "acceptance": prior_label,
                            "config": policy,
                            "predicted_tok_s": round(predicted.tokens_per_s, 1),
                            "predicted_capacity_tok_s": round(capacity, 1),
                            "measured_tok_s": measured[policy],
                        }
                    )
    # A phase whose first tick ran speculation (the tuner had moved already) has no "speculation
    # off" tick to replay.
    replayed = [p["name"] for p in greedy_c1 if _first_tick(run, p["name"]) is not None]
    decisions = [
        decision_row(run, phase, label, model, prior_label, ngram_ks)
        for phase in replayed
        for label, model in (("decode-only fit", decode_only), ("extra tokens priced", priced))
        for prior_label in ("chat prior", "measured acceptance")
    ]
    published_sd = PRIOR_P_SD["ngram"]
    try:
        for sd in (float(text) for text in ns.ngram_p_sd.split(",") if text):
            PRIOR_P_SD["ngram"] = sd
            for label, model in (("decode-only fit", decode_only), ("extra tokens priced", priced)):
                row = decision_row(run, replayed[0], label, model, "chat prior", ngram_ks)
                decisions.append({**row, "acceptance": f"chat prior, ngram p sd {sd}"})
    finally:
        PRIOR_P_SD["ngram"] = published_sd
    report = {
        "command": " ".join(
            [".venv/bin/python", "bench/real_vllm_what_if.py", *(argv or sys.argv[1:])]
        ),
        "commit": git_commit(),
        "run": {
            "file": _relative(Path(ns.run)),
            "commit": run.get("commit"),
            "command": run.get("command"),
        },
        "max_batch": max_batch,
        "decide_settings": {
            "objective": run["specpilot"]["settings"].get("objective", "latency"),
            "exploration": 0.0,
        },
        "per_extra_token_ms": round(per_extra_ms, 4),
        "per_extra_token_source": (
            f"implied by the run's ngram K={k_top} and none servers in '{first}'"
            if ns.per_extra_ms is None
            else "--per-extra-ms"
        ),
        "rows": rows,
        "decisions": decisions,
        "phases_not_replayed": [p["name"] for p in greedy_c1 if p["name"] not in replayed],
    }
    out = Path(ns.out)
    out.write_text(json.dumps(report, indent=1) + "\n")
    out.with_suffix(".md").write_text(markdown(report))
    print(markdown(report))
    return 0


def decision_row(
    run: dict[str, Any],
    phase: str,
    label: str,
    model: StepTimeModel,
    prior_label: str,
    ks: list[int],
) -> dict[str, Any]:
    """`decide` on SpecPilot's first tick of `phase`, as the run's loop saw it."""
    tick = _first_tick(run, phase)
    assert tick is not None, f"{phase}: SpecPilot's first tick ran speculation"
    chosen = run["specpilot"]["settings"]
    # As the run's loop decided: its objective and batch limit, and no trials (the control loop
    # sets exploration to 0 for an actuator without a canary: operator/loop.py).
    settings = TunerSettings(
        candidates=tuple(ngram(k) for k in [0, *ks]),
        objective=chosen.get("objective", "latency"),
        max_batch=run_max_batch(run),
        exploration=0.0,
        min_dwell_s=chosen["min_dwell_s"],
        restart_budget_per_hour=chosen["restart_budget_per_hour"],
        restart_downtime_s=chosen["restart_downtime_s"],
        expected_dwell_s=chosen["expected_dwell_s"],
        hysteresis=chosen["hysteresis"],
        # the tuner's window, where the run recorded it (its loop observed `window_s`)
        window_s=chosen.get("tuner_window_s", chosen["window_s"]),
    )
    k_top = ks[-1]
    if prior_label == "chat prior":
        curve = acceptance_curve("ngram", "chat")
    else:
        length = run["acceptance_length_from_engine_logs"][f"ngram_K={k_top}"][phase]
        curve = AcceptanceCurve(p_for_length(length, k_top, 1.0), 1.0)
    state = TunerState.initial(SpecConfig(), 0.0, {"ngram": curve}, task="chat")
    observation = Observation(
        engine="vllm",
        window_s=chosen["window_s"],
        pods=("pilot",),
        acceptance_length=None,
        acceptance_rate=None,
        acceptance_per_position=None,
        running_requests=tick["batch"],
        waiting_requests=0.0,
        kv_cache_usage=None,
        generation_tokens_per_s=tick["tokens_per_s"],
        tpot_p50_s=None,
        tpot_p95_s=None,
        ttft_p95_s=None,
    )
    cost = StepCost.from_fit(model, "H100", "llama-3.1-8b")
    decision, _ = decide(observation, state, settings, cost, 3600.0)
    return {
        "phase": phase,
        "cost": label,
        "acceptance": prior_label,
        "batch": tick["batch"],
        "tokens_per_s": tick["tokens_per_s"],
        "action": decision.action,
        "config": decision.config.describe(),
        "reason": decision.reason,
    }


def markdown(report: dict[str, Any]) -> str:
    lines = [
        "# The tuner's prior against the real vLLM run it would have served",
        "",
        f"Command: `{report['command']}`  ",
        f"Commit: `{report['commit']}`  ",
        f"Inputs: `{report['run']['file']}` (run at `{report['run']['commit']}`, "
        f"`{report['run']['command']}`)",
        "",
        f"Extra-token price: {report['per_extra_token_ms']} ms "
        f"({report['per_extra_token_source']}). Predictions are `Surrogate.prior` at batch 1, no "
        "residual learned; capacity is the prior's most tokens/s over batches 1 to the run's "
        f"max_batch ({report['max_batch']}) (the "
        "latency objective prices a config whose capacity is below the demand, 1.2x with its "
        "margin, as overloaded); measured is the run's tokens/s for that static config in that "
        "phase at concurrency 1.",
        "",
        "| phase | step cost | acceptance | config | predicted tok/s | predicted capacity tok/s "
        "| measured tok/s |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in report["rows"]:
        lines.append(
            f"| {r['phase']} | {r['cost']} | {r['acceptance']} | {r['config']} | "
            f"{r['predicted_tok_s']} | {r['predicted_capacity_tok_s']} | {r['measured_tok_s']} |"
        )
    lines += [
        "",
        "## What `decide` does on SpecPilot's first tick of the phase",
        "",
        f"Under the run's settings (objective {report['decide_settings']['objective']}, no "
        "trials: the control loop sets exploration to 0 for an actuator without a canary). "
        "Not replayed (SpecPilot's first tick there ran speculation): "
        f"{', '.join(report['phases_not_replayed']) or 'none'}.",
        "",
        "| phase | step cost | acceptance | batch | tok/s | action -> config | reason |",
        "|---|---|---|---|---|---|---|",
    ]
    for d in report["decisions"]:
        lines.append(
            f"| {d['phase']} | {d['cost']} | {d['acceptance']} | {d['batch']} | "
            f"{d['tokens_per_s']} | {d['action']} -> {d['config']} | {d['reason']} |"
        )
    return "\n".join(lines) + "\n"


def _first_tick(run: dict[str, Any], phase: str) -> dict[str, Any] | None:
    """SpecPilot's first tick of `phase` when it ran with speculation off, else None."""
    tick = next(t for t in run["specpilot"]["ticks"] if t["phase"] == phase)
    return tick if tick.get("running_config", "no speculation") == "no speculation" else None


def _phase(policy: dict[str, Any], name: str) -> dict[str, Any]:
    return next(p for p in policy["phases"] if p["name"] == name)


def _relative(path: Path) -> str:
    resolved = path.resolve()
    return str(resolved.relative_to(ROOT)) if resolved.is_relative_to(ROOT) else str(path)


if __name__ == "__main__":
    raise SystemExit(main())
