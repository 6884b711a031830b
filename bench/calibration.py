"""Emulator vs every published number it can be compared with; writes bench/results/.

Run: .venv/bin/python bench/calibration.py
Writes calibration.md and calibration.json (rows, each marked fitted or independent; the
evidence summary, which counts only the independent rows; tolerance, known gaps, seeds, the
commit and command that produced them, and the EAGLE-3 H100 speedup-by-concurrency curve).
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

from specpilot.runtime.emulator.calibration_checks import (
    KNOWN_GAPS,
    SEEDS,
    TOLERANCE,
    calibration_rows,
    crossover,
    evidence_line,
    evidence_summary,
    markdown_table,
)
from specpilot.tuner import SpecConfig

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results"
COMMAND = ".venv/bin/python bench/calibration.py"


def _git(*args: str) -> str | None:
    """Read-only git query (no optional locks: the index is not refreshed)."""
    try:
        return subprocess.run(
            ["git", "--no-optional-locks", *args],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def main() -> None:
    started = time.perf_counter()
    rows = calibration_rows()
    eagle3 = SpecConfig(method="eagle3", num_speculative_tokens=3, draft_model="draft")
    curve = crossover("H100", "llama-3.1-8b", eagle3, (1, 8, 32, 64, 128, 256))
    wall_s = time.perf_counter() - started
    commit = _git("rev-parse", "HEAD")
    changes = _git("status", "--porcelain", "--untracked-files=no")
    provenance = {
        "commit": commit,
        "uncommitted_changes": None if changes is None else bool(changes),
        "command": COMMAND,
        "argv": shlex.join([sys.executable, *sys.argv]),
        "seeds": SEEDS,
        "wall_s": round(wall_s, 1),
    }
    summary = evidence_summary(rows)
    line = evidence_line(rows)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "calibration.json").write_text(
        json.dumps(
            {
                **provenance,
                "tolerance": TOLERANCE,
                "evidence": summary,
                "known_gaps": KNOWN_GAPS,
                "rows": [row.to_dict() for row in rows],
                "eagle3_k3_h100_llama8b_chat_speedup": [
                    {"concurrency": c, "speedup": round(s, 4)} for c, s in curve
                ],
            },
            indent=2,
        )
        + "\n"
    )
    curve_lines = " | ".join(f"c={c}: {s:.2f}x" for c, s in curve)
    dirty = " (with uncommitted changes in the tree)" if provenance["uncommitted_changes"] else ""
    (RESULTS / "calibration.md").write_text(
        "# Emulator calibration\n\n"
        f"Produced by `{COMMAND}` at commit `{commit}`{dirty}; fast mode, seeds "
        + ", ".join(f"{name} {seed}" for name, seed in SEEDS.items())
        + f"; {wall_s:.0f} s.\n\n"
        f"**{line}**\n\n"
        "Kind: `fitted` means a parameter of the emulator or the priors was solved from that "
        "very number (alone, together with sibling numbers, or through a ratio), so agreement "
        "is by construction; the last column names it (tuner/priors.py, "
        "tuner/_model/step_cost.py, tuner/_model/hardware.py). `independent` means no "
        "parameter was solved from it. Only independent rows are evidence.\n\n"
        + markdown_table(rows)
        + "\nKnown gaps:"
        + ("".join(f"\n- {key}: {why}" for key, why in KNOWN_GAPS.items()) or " none")
        + "\n\nIndependent rows, and what they rest on:\n"
        "- eagle3-llama8b-h100-c1-base: the H100 roofline, anchored on SpecDecode-Bench's "
        "published affine fit (5.9 ms + 21 us/token + 39 ns/KV token, arXiv 2601.11580), not "
        "on this 158 tok/s.\n"
        "- dflash-qwen3-8b-b200-c32-speedup: the DFlash GSM8K length (fitted, above), the B200 "
        "step overhead (3.9 ms: SGLang's measured 4.36 ms TPOT on B200 for another model, "
        "Nemotron3-Nano-30B-A3B, less its weight streaming), the spec-path overhead (vLLM "
        "issue 49548) and the roofline. Nothing was solved from 2.8, but plainly: this row "
        "was a known gap (-32%) until the B200 overhead was taken from that TPOT, a choice "
        "made while looking at it.\n"
        "\nDFlash rows: SGLang's published DFlash runs for Qwen3-8B on B200 (PRs 16818, "
        "20547, 23000) are GSM8K with greedy decoding; REFERENCE's speedups do not name their "
        "task, so they are taken to be the same workload and run on the emulator's math task "
        "(prompt 256, output 384 tokens, each +-50%: an assumption, the published output "
        "lengths are not given). The acceptance curve is anchored on SGLang's measured length. "
        "The c=1 speedup is marked fitted: the decay r = 0.98 is what is left of an earlier "
        "(p, r) grid fit to that 5.1x (p has since been re-solved from the length; r now moves "
        "the row by under 1%), and the B200 overhead's cross-check solves it from 846 tok/s "
        "over that 5.1x.\n"
        + f"\nEAGLE-3 K=3, Llama-3.1-8B on H100, chat, speedup by concurrency: {curve_lines}\n"
    )
    print((RESULTS / "calibration.md").read_text())
    print(line)


if __name__ == "__main__":
    main()
