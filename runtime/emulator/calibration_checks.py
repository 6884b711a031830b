"""Calibration: the emulator against every published number in REFERENCE.md section 5 that fits
one of its GPU x model profiles, with the relative error of each.

Contract: `calibration_rows()` runs the fast simulator (seeded) and returns one `Row` per
published number; `TOLERANCE` is the agreement the tests hold every row to, except the rows
named in `KNOWN_GAPS`, which the tests hold to being outside it (so a gap cannot silently close
or silently open).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from specpilot.runtime.emulator.fast_sweep import simulate
from specpilot.tuner import SpecConfig, SpecMethod, StepCost, acceptance_curve

TOLERANCE = 0.15
KNOWN_GAPS: dict[str, str] = {}
"""Rows outside TOLERANCE, each with the reason; none at present."""


@dataclass(frozen=True, slots=True)
class Row:
    key: str
    what: str
    source: str
    published: float
    emulated: float

    @property
    def relative_error(self) -> float:
        return (self.emulated - self.published) / self.published

    def to_dict(self) -> dict[str, object]:
        return {
            "key": self.key,
            "what": self.what,
            "source": self.source,
            "published": self.published,
            "emulated": round(self.emulated, 4),
            "relative_error": round(self.relative_error, 4),
            "within_tolerance": abs(self.relative_error) <= TOLERANCE,
            "known_gap": KNOWN_GAPS.get(self.key),
        }


def _config(method: SpecMethod, k: int) -> SpecConfig:
    draft = "draft" if method in ("draft_model", "eagle", "eagle3", "dflash") else None
    return SpecConfig(method=method, num_speculative_tokens=k, draft_model=draft)


def _measured_length(method: SpecMethod, k: int, task: str) -> float:
    """Acceptance length measured by running the engine at batch 1 (draws, not the formula)."""
    result = simulate(
        config=_config(method, k),
        performance=StepCost.for_hardware("H100", "llama-3.1-8b"),
        task=task,
        concurrency=1,
        duration_s=120.0,
        warmup_s=0.0,
        seed=7,
    )
    assert result.acceptance_length is not None
    return result.acceptance_length


def _throughput(
    gpu: str, profile: str, config: SpecConfig, concurrency: int, task: str = "chat"
) -> float:
    return simulate(
        config=config,
        performance=StepCost.for_hardware(gpu, profile),
        task=task,
        concurrency=concurrency,
        duration_s=90.0,
        warmup_s=10.0,
        seed=11,
    ).tokens_per_s


def _speedup(
    gpu: str, profile: str, config: SpecConfig, concurrency: int, task: str = "chat"
) -> float:
    return _throughput(gpu, profile, config, concurrency, task) / _throughput(
        gpu, profile, SpecConfig(), concurrency, task
    )


def calibration_rows() -> list[Row]:
    rows: list[Row] = []
    eagle3_sglang = _config("eagle3", 3)
    rows.append(
        Row(
            "eagle3-llama8b-h100-c1-base",
            "Llama-3.1-8B H100 batch 1, no speculation (tok/s)",
            "EAGLE-3 in SGLang, REFERENCE 5",
            158.0,
            _throughput("H100", "llama-3.1-8b", SpecConfig(), 1),
        )
    )
    rows.append(
        Row(
            "eagle3-llama8b-h100-c1-spec",
            "Llama-3.1-8B H100 batch 1, EAGLE-3 K=3 (tok/s)",
            "EAGLE-3 in SGLang, REFERENCE 5",
            373.0,
            _throughput("H100", "llama-3.1-8b", eagle3_sglang, 1),
        )
    )
    # DFlash's published runs are GSM8K (SGLang's DFlash sweep, greedy): the "math" task
    dflash = _config("dflash", 15)
    rows.append(
        Row(
            "dflash-qwen3-8b-gsm8k-length",
            "DFlash block 16, Qwen3-8B, GSM8K acceptance length",
            "SGLang PR 23000 (v1 run, concurrency 1)",
            6.345,
            _measured_length("dflash", 15, "math"),
        )
    )
    for concurrency, published in ((1, 5.1), (32, 2.8)):
        rows.append(
            Row(
                f"dflash-qwen3-8b-b200-c{concurrency}-speedup",
                f"DFlash block 16, Qwen3-8B B200, GSM8K, concurrency {concurrency} (speedup)",
                "arXiv 2602.06036 via REFERENCE 5",
                published,
                _speedup("B200", "qwen3-8b", dflash, concurrency, "math"),
            )
        )
    for k, published in zip(range(2, 8), (2.36, 2.79, 3.08, 3.32, 3.46, 3.54), strict=True):
        rows.append(
            Row(
                f"eagle3-mtbench-k{k}",
                f"EAGLE-3 chat acceptance length, K={k}",
                "vLLM EAGLE-3 on MT-bench, REFERENCE 5",
                published,
                _measured_length("eagle3", k, "chat"),
            )
        )
    for method, table in (
        ("ngram", {"code": 2.03, "chat": 1.39, "summarize": 1.33, "math": 1.16}),
        ("eagle", {"code": 2.25, "chat": 2.34, "summarize": 2.32, "math": 2.38}),
    ):
        for task, published in table.items():
            rows.append(
                Row(
                    f"{method}-k3-{task}",
                    f"{method} K=3 acceptance length, {task}",
                    "Llama-3.1-8B (InstructCoder/ShareGPT/CNN-DM/GSM8K), REFERENCE 5",
                    published,
                    _measured_length(method, 3, task),  # type: ignore[arg-type]
                )
            )
    mtp_tasks: dict[str, tuple[str, float]] = {
        "code_python": ("code", 0.947),
        "code_cpp": ("code", 0.925),
        "stepwise_math": ("math", 0.826),
        "qa_factual": ("chat", 0.826),
        "explain_concept": ("chat", 0.750),
        "summarize": ("summarize", 0.800),
        "creative_short": ("creative", 0.694),
    }
    for name, (task, published) in mtp_tasks.items():
        rows.append(
            Row(
                f"mtp-rate-{name}",
                f"MTP acceptance rate, {name} (as task {task})",
                "Qwen3.6 llama.cpp mtp-bench, REFERENCE 5",
                published,
                _acceptance_rate("mtp", task),
            )
        )
    return rows


def _acceptance_rate(method: SpecMethod, task: str) -> float:
    """Accepted over drafted tokens at K=1, measured by drawing 20,000 drafts."""
    rng = random.Random(3)
    curve = acceptance_curve(method, task)
    draws = 20_000
    return sum(curve.draw(rng, 1) for _ in range(draws)) / draws


def crossover(
    gpu: str, profile: str, config: SpecConfig, concurrencies: tuple[int, ...]
) -> list[tuple[int, float]]:
    """Speedup over no speculation at each concurrency."""
    return [(c, _speedup(gpu, profile, config, c)) for c in concurrencies]


def markdown_table(rows: list[Row], render: Callable[[float], str] = "{:.3g}".format) -> str:
    lines = [
        "| key | what | published | emulated | error | within 15% |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        ok = (
            "yes"
            if abs(row.relative_error) <= TOLERANCE
            else "NO (known gap)"
            if row.key in KNOWN_GAPS
            else "NO"
        )
        lines.append(
            f"| {row.key} | {row.what} | {render(row.published)} | {render(row.emulated)} "
            f"| {row.relative_error:+.1%} | {ok} |"
        )
    return "\n".join(lines) + "\n"
