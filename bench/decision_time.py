"""Tuner decision time over 1,000 observations; writes bench/results/decision_time.json.

(decision_time_averaged.json with `--averaged-prefill`.)

Run: .venv/bin/python bench/decision_time.py [--averaged-prefill]
The observations come from the tuner's own physics at loads cycling from batch 1 to 300, so
the residual store fills up as it would over a long run, with the Azure conversation trace's
traffic shape (PROMPT_RATIO prompt tokens per output token, OUTPUT_TOKENS per request): the
tuner learns the mean prompt, and its step times take the expectation over lumpy prefill
(`StepCost.serving_step_time`; spread over every step with `--averaged-prefill`)."""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

from specpilot.tuner import (
    Observation,
    SpecConfig,
    StepCost,
    Surrogate,
    TunerSettings,
    TunerState,
    acceptance_curve,
    decide,
)

BENCH = str(Path(__file__).resolve().parent)
if BENCH not in sys.path:  # imported by path (the tests): the shared harness lives beside it
    sys.path.insert(0, BENCH)

from real_engine import git_commit  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
PROMPT_RATIO, OUTPUT_TOKENS = 5.47, 211
"""bench/traces/azure_conv_2023.csv: mean ContextTokens 1154.7 over mean GeneratedTokens 211.1."""


def main() -> None:
    cost = StepCost.for_hardware("H100", "llama-3.1-8b")
    space = (
        SpecConfig(),
        *(
            SpecConfig(method="eagle3", num_speculative_tokens=k, draft_model="d")
            for k in (1, 3, 5)
        ),
        SpecConfig(method="ngram", num_speculative_tokens=3),
    )
    priors = {m: acceptance_curve(m, "chat") for m in ("eagle3", "ngram")}
    lumpy = "--averaged-prefill" not in sys.argv[1:]
    settings = TunerSettings(
        candidates=space, min_dwell_s=0, restart_budget_per_hour=10_000, lumpy_prefill=lumpy
    )
    state = TunerState.initial(SpecConfig(), 0.0, priors)
    decide(_observation(state, cost, 1.0), state, settings, cost, 0.0)  # imports, warm-up
    timings = []
    load_before = round(os.getloadavg()[0], 2)  # a busy host slows every decision alike
    for tick in range(1000):
        batch = 1 + (tick * 37) % 300
        obs = _observation(state, cost, float(batch))
        started = time.perf_counter()
        _, state = decide(obs, state, settings, cost, 60.0 * (tick + 1))
        timings.append(time.perf_counter() - started)
    report = {
        "commit": git_commit(),
        "command": ".venv/bin/python bench/decision_time.py"
        + ("" if lumpy else " --averaged-prefill"),
        "seeds": "none drawn: the observations are the tuner's own physics at batches "
        "1 + (37 x tick) mod 300",
        "load_average_1m_before_after": [load_before, round(os.getloadavg()[0], 2)],
        "cpus": os.cpu_count(),
        "observations": len(timings),
        "median_ms": round(statistics.median(timings) * 1e3, 3),
        "p95_ms": round(sorted(timings)[int(0.95 * len(timings))] * 1e3, 3),
        "state_bytes": len(state.to_json().encode()),
        "residual_summaries": len(state.residuals),
    }
    RESULTS.mkdir(exist_ok=True)
    name = "decision_time.json" if lumpy else "decision_time_averaged.json"
    (RESULTS / name).write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


def _observation(state: TunerState, cost: StepCost, batch: float) -> Observation:
    prediction = Surrogate(cost, state.acceptance_curves()).prior(state.current, batch, 1024.0)
    return Observation(
        engine="vllm",
        window_s=60.0,
        pods=("p",),
        acceptance_length=None,
        acceptance_rate=None,
        acceptance_per_position=None,
        running_requests=batch,
        waiting_requests=0.0,
        kv_cache_usage=None,
        generation_tokens_per_s=prediction.tokens_per_s * 0.9,
        prompt_tokens_per_s=prediction.tokens_per_s * 0.9 * PROMPT_RATIO,
        requests_per_s=prediction.tokens_per_s * 0.9 / OUTPUT_TOKENS,
        tpot_p50_s=None,
        tpot_p95_s=None,
        ttft_p95_s=None,
    )


if __name__ == "__main__":
    main()
