"""Fast-mode speed: one hour of traffic at 20 requests/s, timed; writes bench/results/.

Run: .venv/bin/python bench/fast_mode.py
"""

from __future__ import annotations

import json
import platform
import time
from pathlib import Path

from specpilot.runtime.emulator.fast_sweep import simulate
from specpilot.tuner import SpecConfig, StepCost

RESULTS = Path(__file__).resolve().parent / "results"


def main() -> None:
    runs = []
    for name, config in (
        ("none", SpecConfig()),
        ("eagle3-k3", SpecConfig(method="eagle3", num_speculative_tokens=3, draft_model="d")),
    ):
        started = time.perf_counter()
        result = simulate(
            config=config,
            performance=StepCost.for_hardware("H100", "llama-3.1-8b"),
            rps=20.0,
            duration_s=3600.0,
            warmup_s=60.0,
            seed=0,
        )
        wall = time.perf_counter() - started
        runs.append({"config": name, "wall_s": round(wall, 2), **result.to_dict()})
    report = {
        "what": "1 h of simulated chat traffic at 20 req/s, H100 x llama-3.1-8b",
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "runs": runs,
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "fast_mode.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
