"""SpecConfig: the tuner's vocabulary for one speculative-decoding setting.

Contract: a `SpecConfig` is frozen, compared and hashed by value, and always valid on its own
terms (engine-independent rules). Whether a given engine can run it is decided by the engine
adapters in `specpilot.runtime.engines`. Construction normalises the few values that have a
default spelled two ways (an explicit `eagle_topk=1` is the chain default, stored as `None`), so
every setting has exactly one representation and render/parse round-trips are exact.

Every invalid value raises `ConfigError` (a `ValueError`) naming the field, the value and what is
allowed.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, Literal, get_args

SpecMethod = Literal["none", "ngram", "suffix", "draft_model", "eagle", "eagle3", "mtp", "dflash"]
SPEC_METHODS: tuple[str, ...] = get_args(SpecMethod)

MIN_SPECULATIVE_TOKENS = 1
MAX_SPECULATIVE_TOKENS = 16
MAX_PROMPT_LOOKUP = 64
MAX_EAGLE_TOPK = 16

# Methods whose draft comes from separate weights (a draft model or a head).
DRAFT_WEIGHT_METHODS: frozenset[str] = frozenset(
    {"draft_model", "eagle", "eagle3", "mtp", "dflash"}
)
# Methods that draft a tree (SGLang's topk / num_draft_tokens) rather than only a chain.
TREE_METHODS: frozenset[str] = frozenset({"ngram", "draft_model", "eagle", "eagle3", "mtp"})

ScheduleTier = tuple[int, int, int]
"""`(first_batch_size, last_batch_size, k)`, both batch sizes inclusive; k=0 means no drafts."""


SHOWN_VALUE_CHARS = 200
"""A value longer than this (as repr) is cut in messages, so the allowed values that follow it
survive the places that bound a message (a status condition keeps 1,024 characters)."""


def shown_value(value: object) -> str:
    """`repr(value)`, cut to its first characters and its length past SHOWN_VALUE_CHARS."""
    text = repr(value)
    if len(text) <= SHOWN_VALUE_CHARS:
        return text
    return f"{text[: SHOWN_VALUE_CHARS // 2]}... ({len(text)} characters)"


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the field, value and allowed values."""

    def __init__(self, field_name: str, value: object, allowed: str, hint: str = "") -> None:
        self.field = field_name
        self.value = value
        self.allowed = allowed
        message = f"{field_name}={shown_value(value)} is invalid: allowed {allowed}"
        if hint:
            message += f" ({hint})"
        super().__init__(message)


def _check_int(name: str, value: object, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigError(name, value, f"an integer in {low}..{high}")
    return value


@dataclass(frozen=True, slots=True, kw_only=True)
class SpecConfig:
    """One speculative-decoding setting, independent of the engine that runs it."""

    method: SpecMethod = "none"
    """Speculative method; "none" is a plain server without speculation."""

    num_speculative_tokens: int | None = None
    """K: tokens drafted per step (1..16); required unless method is "none". For SGLang this is
    `--speculative-num-steps` (chain depth) for tree methods and the block size minus one for
    DFlash."""

    draft_model: str | None = None
    """Draft model / head path or repo id (draft_model, eagle, eagle3, dflash; optional for mtp,
    which defaults to the target's own heads)."""

    prompt_lookup_min: int | None = None
    """n-gram only (vLLM): smallest n-gram window to match; vLLM defaults it to the max."""

    prompt_lookup_max: int | None = None
    """n-gram only (vLLM): largest n-gram window to match; vLLM defaults both to 5."""

    eagle_topk: int | None = None
    """SGLang tree drafting: branches per step (2..16); None is a chain (topk 1)."""

    num_draft_tokens: int | None = None
    """SGLang tree drafting: verified tree size; only with eagle_topk, in 2..topk*K+1. A chain
    always verifies K+1 tokens, so it is None there."""

    schedule: tuple[ScheduleTier, ...] | None = None
    """Per-batch-size K: contiguous tiers starting at batch size 1, each k in 0..K. vLLM's
    `num_speculative_tokens_per_batch_size`, SGLang's adaptive buckets (one candidate each)."""

    engine_adaptive: bool = False
    """Let the engine pick K per batch itself with its own default rules (SGLang's
    `--speculative-adaptive` without a config: buckets 1:[1,3,5,7], 8:[0,1,3], 32:[0,1],
    64:[0] switched by an EMA of accepted drafts). K is where it starts. Not with `schedule`."""

    def __post_init__(self) -> None:
        if self.method not in SPEC_METHODS:
            raise ConfigError("method", self.method, " | ".join(SPEC_METHODS))
        if self.method == "none":
            self._check_plain()
            return
        k = _check_int(
            "num_speculative_tokens",
            self.num_speculative_tokens,
            MIN_SPECULATIVE_TOKENS,
            MAX_SPECULATIVE_TOKENS,
        )
        self._check_draft_model()
        self._check_prompt_lookup()
        self._normalise_tree(k)
        if self.schedule is not None:
            object.__setattr__(self, "schedule", _normalise_schedule(self.schedule, k))
        if not isinstance(self.engine_adaptive, bool):
            raise ConfigError("engine_adaptive", self.engine_adaptive, "true | false")
        if self.engine_adaptive and self.schedule is not None:
            raise ConfigError(
                "engine_adaptive",
                True,
                "false when a schedule is set",
                "the engine's own rules and SpecPilot's schedule would both pick K",
            )

    def _check_plain(self) -> None:
        for f in fields(self):
            if f.name == "method" or (
                f.name == "engine_adaptive" and self.engine_adaptive is False
            ):
                continue
            if getattr(self, f.name) is not None:
                raise ConfigError(
                    f.name, getattr(self, f.name), "None", "method 'none' takes no other field"
                )

    def _check_draft_model(self) -> None:
        if self.draft_model is None:
            return
        if self.method not in DRAFT_WEIGHT_METHODS:
            raise ConfigError(
                "draft_model",
                self.draft_model,
                "None",
                f"method {self.method!r} drafts without weights; a draft model is used only by "
                + ", ".join(sorted(DRAFT_WEIGHT_METHODS)),
            )
        if not isinstance(self.draft_model, str) or not self.draft_model.strip():
            raise ConfigError("draft_model", self.draft_model, "a non-empty path or repo id")

    def _check_prompt_lookup(self) -> None:
        for name in ("prompt_lookup_min", "prompt_lookup_max"):
            value = getattr(self, name)
            if value is None:
                continue
            if self.method != "ngram":
                raise ConfigError(name, value, "None", "only method 'ngram' uses prompt lookup")
            _check_int(name, value, 1, MAX_PROMPT_LOOKUP)
        low, high = self.prompt_lookup_min, self.prompt_lookup_max
        if low is not None and high is not None and low > high:
            raise ConfigError("prompt_lookup_min", low, f"a value <= prompt_lookup_max ({high})")

    def _normalise_tree(self, k: int) -> None:
        topk, draft_tokens = self.eagle_topk, self.num_draft_tokens
        if (topk is not None or draft_tokens is not None) and self.method not in TREE_METHODS:
            name = "eagle_topk" if topk is not None else "num_draft_tokens"
            raise ConfigError(
                name,
                topk if topk is not None else draft_tokens,
                "None",
                f"method {self.method!r} drafts a chain; tree drafting exists for "
                + ", ".join(sorted(TREE_METHODS)),
            )
        if topk is not None:
            _check_int("eagle_topk", topk, 1, MAX_EAGLE_TOPK)
            if topk == 1:
                topk = None
        if topk is None:
            if draft_tokens is not None and draft_tokens != k + 1:
                raise ConfigError(
                    "num_draft_tokens",
                    draft_tokens,
                    f"None or {k + 1} (K+1)",
                    "a chain (eagle_topk 1) always verifies K+1 tokens",
                )
            draft_tokens = None
        else:
            if draft_tokens is None:
                raise ConfigError(
                    "num_draft_tokens",
                    None,
                    f"an integer in 2..{topk * k + 1}",
                    "a tree (eagle_topk > 1) needs its size",
                )
            _check_int("num_draft_tokens", draft_tokens, 2, topk * k + 1)
        object.__setattr__(self, "eagle_topk", topk)
        object.__setattr__(self, "num_draft_tokens", draft_tokens)

    @property
    def speculative(self) -> bool:
        """True unless this is a plain server."""
        return self.method != "none"

    @property
    def max_k(self) -> int:
        """Tokens drafted per step at most (0 for a plain server)."""
        return self.num_speculative_tokens or 0

    def k_for_batch(self, batch_size: int) -> int:
        """K the engine drafts at this batch size, honouring the schedule (an engine-adaptive
        config's K moves at run time; this gives its starting value)."""
        if self.schedule is None:
            return self.max_k
        for start, end, k in self.schedule:
            if start <= batch_size <= end:
                return k
        return self.schedule[-1][2]

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict holding only the fields that are set."""
        out: dict[str, Any] = {"method": self.method}
        for f in fields(self):
            if f.name == "method":
                continue
            value = getattr(self, f.name)
            if value is None or value is False:
                continue
            out[f.name] = [list(t) for t in value] if f.name == "schedule" else value
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SpecConfig:
        """Inverse of `to_dict`; unknown keys are an error naming the allowed ones."""
        if not isinstance(data, Mapping):
            raise ConfigError("spec config", data, "a mapping of field names to values")
        allowed = [f.name for f in fields(cls)]
        for key in data:
            if key not in allowed:
                raise ConfigError(str(key), data[key], "one of the fields " + ", ".join(allowed))
        values = dict(data)
        if values.get("schedule") is not None:
            values["schedule"] = _coerce_schedule(values["schedule"])
        return cls(**values)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> SpecConfig:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError("spec config", text, "a JSON object", str(exc)) from exc
        return cls.from_dict(data)

    def describe(self) -> str:
        """Short human label, e.g. 'eagle3 K=5' or 'ngram K=3 sched[1-8:3,9-32:1,33-256:0]'."""
        if not self.speculative:
            return "no speculation"
        label = f"{self.method} K={self.num_speculative_tokens}"
        if self.eagle_topk is not None:
            label += f" tree(topk={self.eagle_topk},tokens={self.num_draft_tokens})"
        if self.schedule is not None:
            label += " sched[" + ",".join(f"{s}-{e}:{k}" for s, e, k in self.schedule) + "]"
        if self.engine_adaptive:
            label += " engine-adaptive"
        return label


def _coerce_schedule(raw: object) -> tuple[ScheduleTier, ...]:
    if not isinstance(raw, Iterable) or isinstance(raw, str | bytes | Mapping):
        raise ConfigError("schedule", raw, "a list of [first_batch, last_batch, k] triples")
    tiers: list[ScheduleTier] = []
    for tier in raw:
        if not isinstance(tier, Sequence) or isinstance(tier, str) or len(tier) != 3:
            raise ConfigError("schedule", raw, "a list of [first_batch, last_batch, k] triples")
        start, end, k = tier
        tiers.append((start, end, k))
    return tuple(tiers)


def _normalise_schedule(raw: object, max_k: int) -> tuple[ScheduleTier, ...]:
    tiers = _coerce_schedule(raw)
    if not tiers:
        raise ConfigError("schedule", raw, "None or at least one [first_batch, last_batch, k] tier")
    expected_start = 1
    for index, (start, end, k) in enumerate(tiers):
        where = f"schedule[{index}]"
        if start != expected_start:
            raise ConfigError(
                where + ".first_batch",
                start,
                str(expected_start),
                "tiers are sorted, contiguous and the first starts at batch size 1",
            )
        _check_int(where + ".last_batch", end, start, 1 << 20)
        _check_int(where + ".k", k, 0, max_k)
        expected_start = end + 1
    return tiers
