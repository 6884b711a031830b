"""The `speculative` section of a SpecDeployment: candidates expanded into SpecConfigs.

Contract: `decode_speculative(speculative, engine)` takes the validated `Speculative` model
(None: a plain server) and returns (candidates, allow_off, initial). Each candidate's K values
(minK..maxK or its `k` list) become one SpecConfig each, and every SpecConfig passes the engine
adapter's capability check; speculation off (`SpecConfig()`) comes first when `allowOff` is
true. A capability error is a `SpecError` at the candidate's field, where the CRD's
engine-dependent CEL rules report it too. The spec's own rules were checked by the models.
"""

from __future__ import annotations

from collections.abc import Mapping

from specpilot.operator.api.errors import SpecError
from specpilot.operator.api.speculative import Candidate, CandidateOptions, Speculative
from specpilot.runtime.engines import ADAPTERS, EngineCapabilityError
from specpilot.tuner import ConfigError, SpecConfig

__all__ = ["DEFAULT_INITIAL_K", "decode_speculative"]

DEFAULT_INITIAL_K = 3
"""Without `initial`, the first candidate starts at its K closest to this (ties: the smaller);
EAGLE-3 gains little past K=3 (REFERENCE.md section 5)."""
PATH = "spec.speculative"

# SpecConfig field -> where it comes from in a candidate, for error paths.
_CANDIDATE_FIELD = {
    "method": "method",
    "draft_model": "draftModel",
    "prompt_lookup_min": "options",
    "prompt_lookup_max": "options",
    "prompt_lookup_min/prompt_lookup_max": "options",
    "eagle_topk": "options.eagleTopk",
    "num_draft_tokens": "options.numDraftTokens",
}


def decode_speculative(
    speculative: Speculative | None, engine: str
) -> tuple[tuple[SpecConfig, ...], bool, SpecConfig]:
    """(candidates, allow_off, initial); an absent section is a plain server."""
    if speculative is None:
        return (SpecConfig(),), True, SpecConfig()
    by_method: dict[str, tuple[SpecConfig, ...]] = {}
    for index, candidate in enumerate(speculative.candidates):
        by_method[candidate.method] = _configs(candidate, engine, f"{PATH}.candidates[{index}]")
    expanded = tuple(c for configs in by_method.values() for c in configs)
    allow_off = speculative.allow_off
    candidates = ((SpecConfig(),) if allow_off else ()) + expanded
    return candidates, allow_off, _initial(speculative, by_method)


def _configs(candidate: Candidate, engine: str, path: str) -> tuple[SpecConfig, ...]:
    options = candidate.options or CandidateOptions()
    _check_tree_support(options, engine, candidate.method, f"{path}.options")
    configs: list[SpecConfig] = []
    for k in candidate.k_values():
        try:
            config = SpecConfig(
                method=candidate.method,
                num_speculative_tokens=k,
                draft_model=candidate.draft_model,
                prompt_lookup_min=options.prompt_lookup_min,
                prompt_lookup_max=options.prompt_lookup_max,
                eagle_topk=options.eagle_topk,
                num_draft_tokens=options.num_draft_tokens,
            )
            ADAPTERS[engine].check(config)
        except ConfigError as exc:
            raise _candidate_error(candidate, path, exc, engine, k) from exc
        configs.append(config)
    return tuple(configs)


def _check_tree_support(options: CandidateOptions, engine: str, method: str, path: str) -> None:
    """Tree options where the engine has no tree drafting for the method; SpecConfig alone would
    quietly read eagleTopk 1 as a chain."""
    support = ADAPTERS[engine].capabilities.get(method)
    if not options.tree or support is None or support.tree:
        return
    name = "eagleTopk" if options.eagle_topk is not None else "numDraftTokens"
    with_tree = [m for m, s in ADAPTERS[engine].capabilities.items() if s.tree]
    raise SpecError(
        f"{path}.{name}",
        options.eagle_topk if options.eagle_topk is not None else options.num_draft_tokens,
        f"unset; tree drafting works with {', '.join(with_tree) or 'no method'} on {engine}",
    )


def _candidate_error(
    candidate: Candidate, path: str, exc: ConfigError, engine: str, k: int
) -> SpecError:
    where = _CANDIDATE_FIELD.get(exc.field)
    if where is None:
        listed = candidate.k is not None
        where = ("k" if listed else "maxK") if exc.field == "num_speculative_tokens" else "method"
    # A method the engine lacks is a mismatch between spec.engine and the candidate's method.
    hint = f"engine {engine}, K={k}: {exc}"
    if isinstance(exc, EngineCapabilityError) and exc.field == "method":
        hint = f"engine {engine} has no method {candidate.method!r}"
    data = candidate.model_dump(by_alias=True, exclude_none=True)
    return SpecError(f"{path}.{where}", data.get(where.split(".")[0]), exc.allowed, hint)


def _initial(
    speculative: Speculative, by_method: Mapping[str, tuple[SpecConfig, ...]]
) -> SpecConfig:
    """The configuration to start with; the model checked that `initial` names one."""
    initial = speculative.initial
    if initial is None:
        first = next(iter(by_method.values()))
        return min(first, key=lambda c: (abs(c.max_k - DEFAULT_INITIAL_K), c.max_k))
    if initial.method == "none":
        return SpecConfig()
    for config in by_method[initial.method]:
        if config.max_k == initial.k:
            return config
    raise AssertionError(f"Speculative's validator admitted initial.k={initial.k}")
