"""The published priors: acceptance per method x task, and the task names, from published numbers.

Contract: the chain model of `specpilot.tuner._model.acceptance` (q_i = min(1, p x r^(i-1))), with
a (p, r) per method x task taken from published acceptance lengths and rates. This is what the
tuner may know before a method has run, as it would in a user's cluster. The emulator draws its
hidden world around these numbers (it imports them from `specpilot.tuner`, never the other way
round). `acceptance_curve(method, task)` looks one up, rejecting an unknown method or task with
a `ConfigError`; `prior_curves(configs, task)` gives the per-method priors of a config space;
`acceptance_table()` is the whole table, built on first use (solving DFlash's p needs scipy,
which importing the tuner must not load). `method_prior(method, anchor, task)` is one
method's prior as the acceptance posterior starts from it, with its spread (`prior_p_sd`);
`task_of(priors)` names the task a set of per-method priors was taken from.

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

import functools
from collections.abc import Iterable, Mapping
from typing import Literal, get_args

from specpilot.tuner._model.acceptance import AcceptanceCurve, p_for_length
from specpilot.tuner._model.acceptance_posterior import MethodPrior
from specpilot.tuner.spec_config import ConfigError, SpecConfig

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
    curves["creative"] = AcceptanceCurve(chat * _CREATIVE_OVER_CHAT, r)
    return curves


_EAGLE = _by_task(chat=0.6575, code=0.6310, summarize=0.6517, math=0.6689, r=EAGLE3_DECAY)
_EAGLE3_CHAT_P = 0.775
_EAGLE3 = {
    task: AcceptanceCurve(_EAGLE3_CHAT_P * curve.p / _EAGLE["chat"].p, EAGLE3_DECAY)
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
    return {t: AcceptanceCurve(p[t], DFLASH_DECAY) for t in TASKS}


@functools.cache
def acceptance_table() -> Mapping[str, Mapping[str, AcceptanceCurve]]:
    """Method -> task -> published prior (suffix and draft_model unanchored, see above)."""
    return {
        "ngram": _NGRAM,
        "suffix": dict(_NGRAM),
        "eagle": _EAGLE,
        "eagle3": _EAGLE3,
        "draft_model": dict(_EAGLE3),
        "mtp": _MTP,
        "dflash": _dflash_by_task(),
    }


def acceptance_curve(method: str, task: str) -> AcceptanceCurve:
    """The published prior of `method` on `task`; ConfigError names an unknown one."""
    table = acceptance_table()
    if method not in table:
        raise ConfigError("method", method, " | ".join(table))
    if task not in TASKS:
        raise ConfigError("task", task, " | ".join(TASKS))
    return table[method][task]


def prior_curves(configs: Iterable[SpecConfig], task: str = "chat") -> dict[str, AcceptanceCurve]:
    """Each speculative config's method -> its published prior on `task` (what
    `TunerState.initial` starts from)."""
    return {c.method: acceptance_curve(c.method, task) for c in configs if c.speculative}


PRIOR_P_SD: dict[str, float] = {"ngram": 0.25, "suffix": 0.25}
"""How far a method's true p may sit from its prior before it has run (the prior's strength:
`acceptance_posterior.prior_drafts`). Copying drafters depend on the traffic most: n-gram's
published K=3 lengths span 1.16 (math) to 2.03 (code), and repetitive greedy traffic on the
CPU bench gave 3.6 (REFERENCE.md sections 5-6)."""
LEARNED_DRAFTER_P_SD = 0.08
"""Model-based drafters (EAGLE, MTP, draft models, DFlash) move less with the task: MTP's
published per-token rates span 0.83 to 0.95 across tasks (REFERENCE.md section 5)."""


def prior_p_sd(method: str) -> float:
    """The prior's standard deviation of p for `method`."""
    return PRIOR_P_SD.get(method, LEARNED_DRAFTER_P_SD)


def method_prior(method: str, anchor: AcceptanceCurve, task: str) -> MethodPrior:
    """`method`'s prior as the posterior starts from it: the table's per-task chains (a method
    the table lacks is the same on every task), `anchor` (the chain the state was given, for
    traffic that is all `task`), and the prior's spread."""
    table = acceptance_table().get(method)
    tasks = tuple(table[t] for t in TASKS) if table is not None else (anchor,) * len(TASKS)
    return MethodPrior(
        tasks=tasks,
        anchor=anchor,
        anchor_mix=tuple(1.0 if t == task else 0.0 for t in TASKS),
        p_sd=prior_p_sd(method),
    )


def task_of(priors: Mapping[str, AcceptanceCurve]) -> str:
    """The task whose published priors these are (all methods alike), else chat: the task
    mix the tuner starts from."""
    table = acceptance_table()
    for task in TASKS:
        if priors and all(
            m in table and abs(table[m][task].p - c.p) < 1e-9 and abs(table[m][task].r - c.r) < 1e-9
            for m, c in priors.items()
        ):
            return task
    return "chat"
