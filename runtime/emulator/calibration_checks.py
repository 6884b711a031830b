"""Calibration: the emulator against every published number in REFERENCE.md section 5 that fits
one of its GPU x model profiles, with the relative error of each.

Contract: `calibration_rows()` runs the fast simulator (seeded with `SEEDS`) and returns one
`Row` per published number; `TOLERANCE` is the agreement the tests hold every row to, except
the rows named in `KNOWN_GAPS`, which the tests hold to being outside it (so a gap cannot
silently close or silently open).

Each row says whether it is evidence. `kind="fitted"`: a parameter of the emulator or of the
priors was solved from that very number (alone, with its siblings, or through a ratio), so its
agreement is by construction, and `fitted` names the parameter. `kind="independent"`: no
parameter was solved from it; only these count as evidence (`evidence_summary`).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from specpilot.runtime.emulator.fast_sweep import simulate
from specpilot.tuner import SpecConfig, SpecMethod, StepCost, acceptance_curve

TOLERANCE = 0.15
KNOWN_GAPS: dict[str, str] = {}
"""Rows outside TOLERANCE, each with the reason; none at present."""

SEEDS: dict[str, int] = {"acceptance_length": 7, "throughput": 11, "acceptance_rate": 3}
"""The simulator seeds of each kind of row (fixed: the same tree gives the same table)."""

Kind = Literal["fitted", "independent"]


@dataclass(frozen=True, slots=True)
class Row:
    key: str
    what: str
    source: str
    published: float
    emulated: float
    kind: Kind
    fitted: str | None = None
    """For a fitted row, the parameter solved from this number and how; None when independent."""

    def __post_init__(self) -> None:
        if self.kind not in ("fitted", "independent"):
            raise ValueError(f"{self.key}: kind {self.kind!r} is not fitted | independent")
        if (self.kind == "fitted") != bool(self.fitted):
            raise ValueError(f"{self.key}: a fitted row names its parameter, an independent none")

    @property
    def within_tolerance(self) -> bool:
        return abs(self.relative_error) <= TOLERANCE

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
            "within_tolerance": self.within_tolerance,
            "known_gap": KNOWN_GAPS.get(self.key),
            "kind": self.kind,
            "fitted": self.fitted,
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
        seed=SEEDS["acceptance_length"],
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
        seed=SEEDS["throughput"],
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
            # the H100 roofline is anchored on SpecDecode-Bench's affine fit, not on this
            "independent",
        )
    )
    rows.append(
        Row(
            "eagle3-llama8b-h100-c1-spec",
            "Llama-3.1-8B H100 batch 1, EAGLE-3 K=3 (tok/s)",
            "EAGLE-3 in SGLang, REFERENCE 5",
            373.0,
            _throughput("H100", "llama-3.1-8b", eagle3_sglang, 1),
            "fitted",
            "DRAFT_PASS_OVERHEAD_S (20 us per drafting pass, tuner/_model/step_cost.py) fitted "
            "so EAGLE-3 K=3 at batch 1 gives this 373 tok/s",
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
            "fitted",
            "dflash math p solved (r = DFLASH_DECAY 0.98) for this mean length, K=15; dflash's "
            "other tasks are scaled from it",
        )
    )
    dflash_fits: dict[int, str | None] = {
        # r is what is left of commit 8430af5's (p, r) grid fit to this 5.1x (p was since
        # re-solved from the 6.345 length; r now moves this row by under 1%); the B200
        # overhead was taken from a B200 TPOT but also solved from 846 tok/s over this 5.1x
        # as its cross-check. Strictly, then, not evidence.
        1: "DFLASH_DECAY r = 0.98 kept from a (p, r) grid fit to this 5.1x (p since re-solved "
        "from the 6.345 length); B200_STEP_OVERHEAD_S cross-checked by solving it from "
        "846 tok/s / this 5.1x (~4.0 ms vs the 3.9 ms taken from a B200 TPOT)",
        # nothing was solved from 2.8 (it was a known gap, -32%, until the B200 overhead
        # was taken from a measured TPOT; that choice was made seeing this row)
        32: None,
    }
    for concurrency, published in ((1, 5.1), (32, 2.8)):
        fit = dflash_fits[concurrency]
        rows.append(
            Row(
                f"dflash-qwen3-8b-b200-c{concurrency}-speedup",
                f"DFlash block 16, Qwen3-8B B200, GSM8K, concurrency {concurrency} (speedup)",
                "arXiv 2602.06036 via REFERENCE 5",
                published,
                _speedup("B200", "qwen3-8b", dflash, concurrency, "math"),
                "independent" if fit is None else "fitted",
                fit,
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
                "fitted",
                "eagle3 chat (p, r) least-squares on these K=2..7 lengths (r = EAGLE3_DECAY, "
                "reused by eagle and mtp)",
            )
        )
    for method, table, how in (
        ("ngram", {"code": 2.03, "chat": 1.39, "summarize": 1.33, "math": 1.16}, "r = 1"),
        (
            "eagle",
            {"code": 2.25, "chat": 2.34, "summarize": 2.32, "math": 2.38},
            "r = EAGLE3_DECAY; eagle3's task ratios come from these",
        ),
    ):
        for task, published in table.items():
            rows.append(
                Row(
                    f"{method}-k3-{task}",
                    f"{method} K=3 acceptance length, {task}",
                    "Llama-3.1-8B (InstructCoder/ShareGPT/CNN-DM/GSM8K), REFERENCE 5",
                    published,
                    _measured_length(method, 3, task),  # type: ignore[arg-type]
                    "fitted",
                    f"{method} {task} p solved for this K=3 length ({how})",
                )
            )
    mtp_tasks: dict[str, tuple[str, float, str]] = {
        "code_python": ("code", 0.947, "mtp code p = mean of code_python and code_cpp"),
        "code_cpp": ("code", 0.925, "mtp code p = mean of code_python and code_cpp"),
        "stepwise_math": ("math", 0.826, "mtp math p = this rate"),
        "qa_factual": ("chat", 0.826, "mtp chat p = mean of qa_factual and explain_concept"),
        "explain_concept": ("chat", 0.750, "mtp chat p = mean of qa_factual and explain_concept"),
        "summarize": ("summarize", 0.800, "mtp summarize p = this rate"),
        "creative_short": (
            "creative",
            0.694,
            "mtp creative p = this rate (its ratio to mtp chat also sets every other "
            "method's creative p)",
        ),
    }
    for name, (task, published, fit) in mtp_tasks.items():
        rows.append(
            Row(
                f"mtp-rate-{name}",
                f"MTP acceptance rate, {name} (as task {task})",
                "Qwen3.6 llama.cpp mtp-bench, REFERENCE 5",
                published,
                _acceptance_rate("mtp", task),
                "fitted",
                fit,
            )
        )
    return rows


def _acceptance_rate(method: SpecMethod, task: str) -> float:
    """Accepted over drafted tokens at K=1, measured by drawing 20,000 drafts."""
    rng = random.Random(SEEDS["acceptance_rate"])
    curve = acceptance_curve(method, task)
    draws = 20_000
    return sum(curve.draw(rng, 1) for _ in range(draws)) / draws


def evidence_summary(rows: list[Row]) -> dict[str, object]:
    """What the table is evidence of: only the independent rows count (fitted ones agree by
    construction), with how many are within TOLERANCE and the worst relative error."""
    independent = [row for row in rows if row.kind == "independent"]
    worst = max(independent, key=lambda row: abs(row.relative_error), default=None)
    return {
        "rows": len(rows),
        "fitted": len(rows) - len(independent),
        "independent": len(independent),
        "independent_within_tolerance": sum(row.within_tolerance for row in independent),
        "worst_independent_key": None if worst is None else worst.key,
        "worst_independent_error": None if worst is None else round(worst.relative_error, 4),
    }


def evidence_line(rows: list[Row]) -> str:
    """`evidence_summary` as one sentence."""
    s = evidence_summary(rows)
    worst = (
        "none"
        if s["worst_independent_key"] is None
        else f"{s['worst_independent_error']:+.1%} ({s['worst_independent_key']})"
    )
    return (
        f"Evidence (independent rows only): {s['independent_within_tolerance']} of "
        f"{s['independent']} independent rows within {TOLERANCE:.0%}, worst independent error "
        f"{worst}; the other {s['fitted']} of {s['rows']} rows are fitted (a parameter was "
        "solved from that very number) and agree by construction, so they are not counted."
    )


def crossover(
    gpu: str, profile: str, config: SpecConfig, concurrencies: tuple[int, ...]
) -> list[tuple[int, float]]:
    """Speedup over no speculation at each concurrency."""
    return [(c, _speedup(gpu, profile, config, c)) for c in concurrencies]


def markdown_table(rows: list[Row], render: Callable[[float], str] = "{:.3g}".format) -> str:
    lines = [
        f"| key | what | published | emulated | error | within {TOLERANCE:.0%} | kind "
        "| fitted from this number |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        ok = "yes" if row.within_tolerance else "NO (known gap)" if row.key in KNOWN_GAPS else "NO"
        lines.append(
            f"| {row.key} | {row.what} | {render(row.published)} | {render(row.emulated)} "
            f"| {row.relative_error:+.1%} | {ok} | {row.kind} | {row.fitted or '-'} |"
        )
    return "\n".join(lines) + "\n"
