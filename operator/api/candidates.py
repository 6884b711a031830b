"""The `speculative` section of a SpecDeployment: candidates expanded into SpecConfigs.

Contract: `decode_speculative(reader, engine)` returns (candidates, allow_off, initial). Each
candidate's `maxK` becomes minK..maxK (or its explicit `k` list) and every resulting SpecConfig
passes the engine adapter's capability check; speculation off (`SpecConfig()`) comes first when
`allowOff` is true. Errors are `SpecError`s at the candidate's field, the same field the CRD's
CEL rules name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import cast, get_args

from specpilot.operator.api.fields import SpecError, SpecReader, or_default
from specpilot.runtime.engines import ADAPTERS, EngineCapabilityError
from specpilot.tuner import ConfigError, SpecConfig, SpecMethod

CANDIDATE_METHODS: tuple[str, ...] = tuple(m for m in get_args(SpecMethod) if m != "none")
ALLOW_OFF_DEFAULT = True
"""`allowOff`; SpecDeploymentSpec.allow_off defaults to it."""
DEFAULT_INITIAL_K = 3
"""Without `initial`, the first candidate starts at its K closest to this (ties: the smaller);
EAGLE-3 gains little past K=3 (REFERENCE.md section 5)."""

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
    r: SpecReader, engine: str
) -> tuple[tuple[SpecConfig, ...], bool, SpecConfig]:
    """(candidates, allow_off, initial); an absent section is a plain server."""
    if not r.data:
        return (SpecConfig(),), True, SpecConfig()
    r.known("allowOff", "candidates", "initial")
    allow_off = or_default(r.bool_("allowOff"), ALLOW_OFF_DEFAULT)
    items = r.items("candidates", 8)
    if not items:
        raise SpecError(f"{r.path}.candidates", r.data.get("candidates"), "1..8 candidates")
    by_method: dict[str, tuple[SpecConfig, ...]] = {}
    for item in items:
        method, configs = _candidate(item, engine)
        if method in by_method:
            raise SpecError(f"{item.path}.method", method, "each method at most once")
        by_method[method] = configs
    expanded = tuple(c for configs in by_method.values() for c in configs)
    candidates = ((SpecConfig(),) if allow_off else ()) + expanded
    initial = _initial(r, by_method, allow_off)
    return candidates, allow_off, initial


def _candidate(r: SpecReader, engine: str) -> tuple[str, tuple[SpecConfig, ...]]:
    r.known("method", "maxK", "minK", "k", "draftModel", "options")
    method = r.str_("method", choices=CANDIDATE_METHODS)
    if method is None:
        raise SpecError(f"{r.path}.method", None, " | ".join(CANDIDATE_METHODS))
    ks = _k_values(r)
    options = r.sub("options")
    options.known("promptLookupMin", "promptLookupMax", "eagleTopk", "numDraftTokens")
    _check_tree_options(options, engine, method)
    configs: list[SpecConfig] = []
    for k in ks:
        try:
            config = SpecConfig(
                method=cast(SpecMethod, method),
                num_speculative_tokens=k,
                draft_model=r.str_("draftModel", max_len=1024),
                prompt_lookup_min=options.int_("promptLookupMin", 1, 64),
                prompt_lookup_max=options.int_("promptLookupMax", 1, 64),
                eagle_topk=options.int_("eagleTopk", 1, 16),
                num_draft_tokens=options.int_("numDraftTokens", 2, 257),
            )
            ADAPTERS[engine].check(config)
        except ConfigError as exc:
            raise _candidate_error(r, exc, engine, k, bool(r.has("k"))) from exc
        configs.append(config)
    return method, tuple(configs)


def _check_tree_options(options: SpecReader, engine: str, method: str) -> None:
    """Tree options as the CRD states them; SpecConfig alone would quietly read eagleTopk 1 as
    a chain, even where the engine has no tree drafting at all."""
    topk = options.int_("eagleTopk", 1, 16)
    draft_tokens = options.int_("numDraftTokens", 2, 257)
    support = ADAPTERS[engine].capabilities.get(method)
    if (topk is not None or draft_tokens is not None) and support is not None and not support.tree:
        name = "eagleTopk" if topk is not None else "numDraftTokens"
        with_tree = [m for m, s in ADAPTERS[engine].capabilities.items() if s.tree]
        raise SpecError(
            f"{options.path}.{name}",
            topk if topk is not None else draft_tokens,
            "unset; tree drafting works with "
            + (", ".join(with_tree) or "no method")
            + f" on {engine}",
        )
    if draft_tokens is not None and (topk is None or topk == 1):
        raise SpecError(
            f"{options.path}.numDraftTokens", draft_tokens, "unset unless eagleTopk > 1 (a tree)"
        )
    if topk is not None and topk > 1 and draft_tokens is None:
        raise SpecError(f"{options.path}.numDraftTokens", None, "the tree size with eagleTopk > 1")


def _k_values(r: SpecReader) -> tuple[int, ...]:
    if r.has("maxK") == r.has("k"):
        raise SpecError(f"{r.path}.maxK", r.data.get("maxK"), "exactly one of maxK and k")
    if r.has("k"):
        if r.has("minK"):
            raise SpecError(f"{r.path}.minK", r.data["minK"], "unset when k lists the values")
        raw = r.data["k"]
        if (
            not isinstance(raw, list)
            or not 1 <= len(raw) <= 16
            or len(set(raw)) != len(raw)
            or not all(isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= 16 for v in raw)
        ):
            raise SpecError(f"{r.path}.k", raw, "1..16 distinct integers in 1..16")
        return tuple(sorted(raw))
    high = cast(int, r.int_("maxK", 1, 16))
    low = or_default(r.int_("minK", 1, 16), 1)
    if low > high:
        raise SpecError(f"{r.path}.minK", low, f"an integer in 1..maxK ({high})")
    return tuple(range(low, high + 1))


def _candidate_error(
    r: SpecReader, exc: ConfigError, engine: str, k: int, listed: bool
) -> SpecError:
    where = _CANDIDATE_FIELD.get(exc.field)
    if where is None:
        where = ("k" if listed else "maxK") if exc.field == "num_speculative_tokens" else "method"
    # A method the engine lacks is a mismatch between spec.engine and the candidate's method.
    hint = f"engine {engine}, K={k}: {exc}"
    if isinstance(exc, EngineCapabilityError) and exc.field == "method":
        hint = f"engine {engine} has no method {r.data.get('method')!r}"
    return SpecError(f"{r.path}.{where}", r.data.get(where.split(".")[0]), exc.allowed, hint)


def _initial(
    r: SpecReader, by_method: Mapping[str, tuple[SpecConfig, ...]], allow_off: bool
) -> SpecConfig:
    if not r.has("initial"):
        first = next(iter(by_method.values()))
        return min(first, key=lambda c: (abs(c.max_k - DEFAULT_INITIAL_K), c.max_k))
    init = r.sub("initial")
    init.known("method", "k")
    method = init.str_("method", choices=("none", *CANDIDATE_METHODS))
    if method is None or (method != "none" and method not in by_method):
        raise SpecError(
            f"{init.path}.method", method, " | ".join(["none", *by_method]) + " (the candidates)"
        )
    k = init.int_("k", 1, 16)
    if method == "none":
        if k is not None:
            raise SpecError(f"{init.path}.k", k, "unset with method none")
        if not allow_off:
            raise SpecError(
                f"{init.path}.method", method, " | ".join(by_method), "allowOff is false"
            )
        return SpecConfig()
    for config in by_method[method]:
        if config.max_k == k:
            return config
    allowed = ", ".join(str(c.max_k) for c in by_method[method])
    raise SpecError(f"{init.path}.k", k, f"one of {allowed} (the {method} candidate's K values)")
