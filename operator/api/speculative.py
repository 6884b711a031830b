"""The `speculative` section of the SpecDeployment spec as typed models.

Contract: `Speculative.model_validate(data)` enforces the section's bounds, enums and CEL rules
(declared here for the CRD and checked here in Python, side by side): each candidate sets
exactly one of maxK and k, draft weights where its method needs them, tree and prompt-lookup
options only where the method has them; `initial` names a candidate and one of its K values (or
'none' with allowOff). `Candidate.k_values()` is the K values a candidate allows. What an engine
can run is the adapters' business (operator/api/candidates.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Literal, Self, get_args

from pydantic import Field, model_validator

from specpilot.operator.api.base import MODEL_REF_PATTERN, ApiModel, Violation, cel, dump, rules
from specpilot.tuner import SpecMethod

__all__ = [
    "CANDIDATE_METHODS",
    "CHAIN_ONLY_METHODS",
    "DRAFT_METHODS",
    "WEIGHTLESS_METHODS",
    "Candidate",
    "CandidateOptions",
    "Initial",
    "Speculative",
]

CANDIDATE_METHODS: tuple[str, ...] = tuple(m for m in get_args(SpecMethod) if m != "none")
DRAFT_METHODS = ("draft_model", "eagle", "eagle3", "dflash")
"""Methods that draft with separate weights (`draftModel` required)."""
WEIGHTLESS_METHODS = ("ngram", "suffix")
"""Methods that draft without weights (`draftModel` refused)."""
CHAIN_ONLY_METHODS = ("suffix", "dflash")
"""Methods without tree drafting on any engine."""

if TYPE_CHECKING:
    CandidateMethod = SpecMethod
else:  # SpecMethod less "none", so the CRD's enum follows the tuner's methods.
    CandidateMethod = Literal[CANDIDATE_METHODS]
InitialMethod = SpecMethod


def _cel_list(values: tuple[str, ...]) -> str:
    return "[" + ", ".join(f"'{v}'" for v in values) + "]"


class CandidateOptions(ApiModel):
    """Method-specific options."""

    model_config = rules(
        cel(
            "!has(self.promptLookupMin) || !has(self.promptLookupMax)"
            " || self.promptLookupMin <= self.promptLookupMax",
            "promptLookupMin must be at most promptLookupMax",
            ".promptLookupMin",
        ),
        cel(
            "!has(self.numDraftTokens) || (has(self.eagleTopk) && self.eagleTopk > 1)",
            "numDraftTokens sizes a tree; it needs eagleTopk greater than 1",
            ".numDraftTokens",
        ),
        cel(
            "!has(self.eagleTopk) || self.eagleTopk == 1 || has(self.numDraftTokens)",
            "a tree (eagleTopk greater than 1) needs numDraftTokens",
            ".numDraftTokens",
        ),
    )

    prompt_lookup_min: int | None = Field(default=None, ge=1, le=64)
    """ngram on vLLM, smallest n-gram window to match."""
    prompt_lookup_max: int | None = Field(default=None, ge=1, le=64)
    """ngram on vLLM, largest n-gram window to match."""
    eagle_topk: int | None = Field(default=None, ge=1, le=16)
    """SGLang tree drafting, branches per step (1 is a chain)."""
    num_draft_tokens: int | None = Field(default=None, ge=2, le=257)
    """SGLang tree drafting, tokens verified per step (at most eagleTopk * K + 1)."""

    @model_validator(mode="after")
    def _cross_field(self) -> Self:
        low, high = self.prompt_lookup_min, self.prompt_lookup_max
        if low is not None and high is not None and low > high:
            raise Violation("promptLookupMin", low, f"an integer in 1..promptLookupMax ({high})")
        topk, size = self.eagle_topk, self.num_draft_tokens
        if size is not None and (topk is None or topk == 1):
            raise Violation("numDraftTokens", size, "unset unless eagleTopk > 1 (a tree)")
        if topk is not None and topk > 1 and size is None:
            raise Violation("numDraftTokens", None, "the tree size with eagleTopk > 1")
        return self

    @property
    def prompt_lookup(self) -> bool:
        return self.prompt_lookup_min is not None or self.prompt_lookup_max is not None

    @property
    def tree(self) -> bool:
        return self.eagle_topk is not None or self.num_draft_tokens is not None


K = Annotated[int, Field(ge=1, le=16, description="One K value.")]


class Candidate(ApiModel):
    """One speculative method and the K values the tuner may try."""

    model_config = rules(
        cel(
            "has(self.maxK) != has(self.k)",
            "set exactly one of maxK (a range minK..maxK) and k (a list of K values)",
            ".maxK",
        ),
        cel(
            "!has(self.maxK) || !has(self.minK) || self.minK <= self.maxK",
            "minK must be at most maxK",
            ".minK",
        ),
        cel("!has(self.k) || !has(self.minK)", "minK goes with maxK, not with a k list", ".minK"),
        cel(
            f"!(self.method in {_cel_list(DRAFT_METHODS)}) || has(self.draftModel)",
            "methods draft_model, eagle, eagle3 and dflash need a draftModel",
            ".draftModel",
        ),
        cel(
            f"!(self.method in {_cel_list(WEIGHTLESS_METHODS)}) || !has(self.draftModel)",
            "methods ngram and suffix draft without weights; remove draftModel",
            ".draftModel",
        ),
        cel(
            "self.method == 'ngram' || !has(self.options)"
            " || (!has(self.options.promptLookupMin) && !has(self.options.promptLookupMax))",
            "options.promptLookupMin/promptLookupMax are for method ngram only",
            ".options",
        ),
        cel(
            f"!(self.method in {_cel_list(CHAIN_ONLY_METHODS)}) || !has(self.options)"
            " || (!has(self.options.eagleTopk) && !has(self.options.numDraftTokens))",
            "options.eagleTopk/numDraftTokens (tree drafting) are for methods ngram, draft_model,"
            " eagle, eagle3, mtp only",
            ".options",
        ),
        cel(
            "!has(self.options) || !has(self.options.numDraftTokens)"
            " || !has(self.options.eagleTopk) || (has(self.k)"
            " ? self.k.all(x, self.options.numDraftTokens <= self.options.eagleTopk * x + 1)"
            " : self.options.numDraftTokens"
            " <= self.options.eagleTopk * (has(self.minK) ? self.minK : 1) + 1)",
            "options.numDraftTokens must be at most eagleTopk * K + 1 for every K",
            ".options.numDraftTokens",
        ),
    )

    method: CandidateMethod
    """Speculative method. ngram (prompt lookup) and suffix need no weights; draft_model, eagle,
    eagle3 and dflash need draftModel; mtp uses the target's own heads (draftModel optional)."""
    max_k: int | None = Field(default=None, ge=1, le=16)
    """Largest number of speculative tokens per step; the tuner tries minK..maxK."""
    min_k: int | None = Field(default=None, ge=1, le=16)
    """Smallest K the tuner tries with maxK (default 1)."""
    k: list[K] | None = Field(
        default=None,
        min_length=1,
        max_length=16,
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )
    """Exactly the K values the tuner may try (instead of minK..maxK)."""
    draft_model: str | None = Field(
        default=None, min_length=1, max_length=1024, pattern=MODEL_REF_PATTERN
    )
    """Draft model or head (repo id or path) for draft_model, eagle, eagle3, dflash, mtp."""
    options: CandidateOptions | None = None

    @model_validator(mode="after")
    def _cross_field(self) -> Self:
        if (self.max_k is None) == (self.k is None):
            raise Violation(
                "maxK", self.max_k, "exactly one of maxK (a range minK..maxK) and k (a K list)"
            )
        if self.min_k is not None and self.k is not None:
            raise Violation("minK", self.min_k, "unset when k lists the values")
        if self.min_k is not None and self.max_k is not None and self.min_k > self.max_k:
            raise Violation("minK", self.min_k, f"an integer in 1..maxK ({self.max_k})")
        if self.method in DRAFT_METHODS and self.draft_model is None:
            raise Violation(
                "draftModel", None, "a draft model or head", f"method {self.method} needs one"
            )
        if self.method in WEIGHTLESS_METHODS and self.draft_model is not None:
            raise Violation(
                "draftModel", self.draft_model, "unset", f"method {self.method} needs no weights"
            )
        options = self.options
        if options is None:
            return self
        if self.method != "ngram" and options.prompt_lookup:
            raise Violation(
                "options", dump(options), "no promptLookupMin/promptLookupMax but with ngram"
            )
        if self.method in CHAIN_ONLY_METHODS and options.tree:
            raise Violation(
                "options",
                dump(options),
                "no eagleTopk/numDraftTokens with " + " or ".join(CHAIN_ONLY_METHODS),
                "tree drafting works with "
                + ", ".join(m for m in CANDIDATE_METHODS if m not in CHAIN_ONLY_METHODS),
            )
        size, topk, smallest = options.num_draft_tokens, options.eagle_topk, self.k_values()[0]
        if size is not None and topk is not None and size > topk * smallest + 1:
            raise Violation(
                "options.numDraftTokens",
                size,
                f"at most eagleTopk * K + 1 = {topk * smallest + 1} for every K (smallest K "
                f"{smallest})",
            )
        return self

    def k_values(self) -> tuple[int, ...]:
        """The K values the tuner may try, ascending."""
        if self.k is not None:
            return tuple(sorted(self.k))
        return tuple(range(self.min_k or 1, (self.max_k or 0) + 1))


class Initial(ApiModel):
    """The configuration to start with. Default the first candidate at the K closest to 3."""

    model_config = rules(
        cel(
            "self.method == 'none' ? !has(self.k) : has(self.k)",
            "initial.k is required unless method is 'none', and forbidden with it",
            ".k",
        )
    )

    method: InitialMethod
    """Method to start with ('none' starts a plain server)."""
    k: int | None = Field(default=None, ge=1, le=16)
    """K to start with."""

    @model_validator(mode="after")
    def _k_with_method(self) -> Self:
        if self.method == "none" and self.k is not None:
            raise Violation("k", self.k, "unset with method none")
        if self.method != "none" and self.k is None:
            raise Violation("k", None, "an integer in 1..16 (required unless method is none)")
        return self


class Speculative(ApiModel):
    """The speculative configurations SpecPilot may choose from. Unset, the engine runs without
    speculation."""

    model_config = rules(
        cel(
            "!has(self.initial) || self.initial.method == 'none'"
            " || self.candidates.exists(c, c.method == self.initial.method)",
            "initial.method must be 'none' or the method of one of the candidates",
            ".initial.method",
        ),
        cel(
            "!has(self.initial) || self.initial.method == 'none'"
            " || self.candidates.exists(c, c.method == self.initial.method && (has(c.k)"
            " ? self.initial.k in c.k : (has(c.maxK)"
            " && self.initial.k >= (has(c.minK) ? c.minK : 1) && self.initial.k <= c.maxK)))",
            "initial.k must be one of the K values its candidate allows",
            ".initial.k",
        ),
        cel(
            "self.allowOff || !has(self.initial) || self.initial.method != 'none'",
            "initial.method 'none' needs allowOff true",
            ".initial.method",
        ),
    )

    allow_off: bool = True
    """The tuner may turn speculation off (a plain server beats any speculation at large
    batches)."""
    candidates: list[Candidate] = Field(
        min_length=1,
        max_length=8,
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["method"],
        },
    )
    """Allowed speculative methods, one entry per method, with their K range."""
    initial: Initial | None = None

    @model_validator(mode="after")
    def _initial_is_a_candidate(self) -> Self:
        initial = self.initial
        if initial is None:
            return self
        by_method = {c.method: c for c in self.candidates}
        if initial.method == "none":
            if not self.allow_off:
                raise Violation(
                    "initial.method", "none", " | ".join(by_method), "allowOff is false"
                )
            return self
        candidate = by_method.get(initial.method)
        if candidate is None:
            allowed = " | ".join(["none", *by_method]) + " (the candidates)"
            raise Violation("initial.method", initial.method, allowed)
        if initial.k not in candidate.k_values():
            allowed = ", ".join(map(str, candidate.k_values()))
            raise Violation(
                "initial.k", initial.k, f"one of {allowed} (the {initial.method} candidate's K)"
            )
        return self
