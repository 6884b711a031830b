"""Acceptance: how many drafted tokens the target keeps, per method x task, drawn per step.

Contract: the chain model of `specpilot.tuner._model.acceptance` (q_i = min(1, p x r^(i-1))), with a
(p, r) per method x task that the emulator treats as ground truth.

Calibration (REFERENCE.md section 5; `bench/calibration.py` checks every anchored number):
- eagle3 chat: (p, r) least-squares fitted to vLLM's EAGLE-3 MT-bench lengths for K=2..7
  (2.36, 2.79, 3.08, 3.32, 3.46, 3.54); the fit is within 0.5% of each.
- eagle by task: p solved so K=3 gives the published lengths (code 2.25, chat 2.34,
  summarize 2.32, math 2.38), with eagle3's decay r.
- eagle3 other tasks: eagle3's chat p scaled by eagle's task/chat ratio (derived, not anchored).
- ngram by task: r = 1 (a matched n-gram tends to continue), p solved for the K=3 lengths
  (code 2.03, chat 1.39, summarize 1.33, math 1.16).
- mtp: p is the published per-token acceptance rate by task (Qwen3.6 mtp-bench: code = mean of
  code_python 0.947 and code_cpp 0.925; chat = mean of qa_factual 0.826 and explain_concept
  0.750; summarize 0.800; math = stepwise_math 0.826; creative = creative_short 0.694), with
  eagle3's decay r for repeated use of the head.
- creative for eagle/eagle3/ngram: chat scaled by mtp's creative/chat ratio (derived).
- suffix and draft_model have no published number here: they reuse ngram's and eagle3's
  tables (unanchored; say so wherever their numbers are shown).
- dflash math: p solved (with a slow decay r = 0.98 along the block) for the mean acceptance
  length 6.345 that SGLang measured for Qwen3-8B with the DFlash-b16 drafter on GSM8K, greedy,
  concurrency 1 (SGLang PR 23000, v1 run; 6.487 at concurrency 32); code and chat take the
  length ratios a DFlash drafter measured by benchmark on another target (derived), summarize
  and creative chat's p scaled by mtp's task ratios (derived).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal, get_args

from specpilot.tuner import ConfigError
from specpilot.tuner._model.acceptance import AcceptanceCurve, p_for_length

Task = Literal["chat", "code", "summarize", "math", "creative"]
TASKS: tuple[str, ...] = get_args(Task)

EAGLE3_DECAY = 0.973
_CREATIVE_OVER_CHAT = 0.694 / ((0.826 + 0.750) / 2)


def _by_task(
    chat: float, code: float, summarize: float, math: float, r: float
) -> dict[str, AcceptanceCurve]:
    curves = {
        "chat": AcceptanceCurve(chat, r),
        "code": AcceptanceCurve(code, r),
        "summarize": AcceptanceCurve(summarize, r),
        "math": AcceptanceCurve(math, r),
    }
    curves["creative"] = AcceptanceCurve(chat * _CREATIVE_OVER_CHAT, r, anchored=False)
    return curves


_EAGLE = _by_task(chat=0.6575, code=0.6310, summarize=0.6517, math=0.6689, r=EAGLE3_DECAY)
_EAGLE3_CHAT_P = 0.775
_EAGLE3 = {
    task: AcceptanceCurve(
        _EAGLE3_CHAT_P * curve.p / _EAGLE["chat"].p, EAGLE3_DECAY, anchored=task == "chat"
    )
    for task, curve in _EAGLE.items()
}
_NGRAM = _by_task(chat=0.2853, code=0.5537, summarize=0.2511, math=0.1382, r=1.0)
_MTP = {
    "chat": AcceptanceCurve((0.826 + 0.750) / 2, EAGLE3_DECAY),
    "code": AcceptanceCurve((0.947 + 0.925) / 2, EAGLE3_DECAY),
    "summarize": AcceptanceCurve(0.800, EAGLE3_DECAY),
    "math": AcceptanceCurve(0.826, EAGLE3_DECAY),
    "creative": AcceptanceCurve(0.694, EAGLE3_DECAY),
}
# DFlash drafts a whole block in one pass; acceptance along the block decays slowly (r).
DFLASH_DECAY = 0.98
DFLASH_BLOCK_K = 15
DFLASH_GSM8K_LENGTH = 6.345
# Length by task relative to GSM8K, from a DFlash drafter measured benchmark by benchmark (ROCm
# ATOM PR 1881, Qwen3.5 MoE target, run 1: GSM8K 5.74, HumanEval 6.89, MBPP 5.25, MT-Bench
# 3.60); applied to Qwen3-8B's measured GSM8K length, an assumption (no per-task lengths are
# published for this pair).
_DFLASH_OVER_GSM8K = {"code": (6.89 + 5.25) / 2 / 5.74, "chat": 3.60 / 5.74}


def _dflash_by_task() -> dict[str, AcceptanceCurve]:
    def solved(ratio: float) -> float:
        return p_for_length(DFLASH_GSM8K_LENGTH * ratio, DFLASH_BLOCK_K, DFLASH_DECAY)

    p = {"math": solved(1.0), **{t: solved(x) for t, x in _DFLASH_OVER_GSM8K.items()}}
    # summarize and creative: chat scaled by MTP's task ratios (derived, like the others')
    for task in ("summarize", "creative"):
        p[task] = p["chat"] * _MTP[task].p / _MTP["chat"].p
    return {t: AcceptanceCurve(p[t], DFLASH_DECAY, anchored=t == "math") for t in TASKS}


_DFLASH = _dflash_by_task()


def _unanchored(table: Mapping[str, AcceptanceCurve]) -> dict[str, AcceptanceCurve]:
    return {task: AcceptanceCurve(c.p, c.r, anchored=False) for task, c in table.items()}


ACCEPTANCE: Mapping[str, Mapping[str, AcceptanceCurve]] = {
    "ngram": _NGRAM,
    "suffix": _unanchored(_NGRAM),
    "eagle": _EAGLE,
    "eagle3": _EAGLE3,
    "draft_model": _unanchored(_EAGLE3),
    "mtp": _MTP,
    "dflash": _DFLASH,
}


def acceptance_curve(method: str, task: str) -> AcceptanceCurve:
    if method not in ACCEPTANCE:
        raise ConfigError("method", method, " | ".join(ACCEPTANCE))
    if task not in TASKS:
        raise ConfigError("task", task, " | ".join(TASKS))
    return ACCEPTANCE[method][task]
