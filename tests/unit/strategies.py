"""Hypothesis strategies for valid SpecConfigs, in general or for one engine's capabilities."""

from __future__ import annotations

from collections.abc import Mapping

from hypothesis import strategies as st

from specpilot.runtime.engines import MethodSupport
from specpilot.tuner import (
    DRAFT_WEIGHT_METHODS,
    SPEC_METHODS,
    TREE_METHODS,
    ScheduleTier,
    SpecConfig,
)

draft_paths = st.sampled_from(
    ["/models/draft", "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", "z-lab/Qwen3-8B-DFlash-b16"]
)


@st.composite
def schedules(
    draw: st.DrawFn, max_k: int, must_include_k: bool = False
) -> tuple[ScheduleTier, ...]:
    count = draw(st.integers(1, 4))
    ends = sorted(draw(st.sets(st.integers(1, 512), min_size=count, max_size=count)))
    ks = [draw(st.integers(0, max_k)) for _ in ends]
    if must_include_k:
        ks[draw(st.integers(0, len(ks) - 1))] = max_k
    tiers, start = [], 1
    for end, k in zip(ends, ks, strict=True):
        tiers.append((start, end, k))
        start = end + 1
    return tuple(tiers)


@st.composite
def spec_configs(
    draw: st.DrawFn, capabilities: Mapping[str, MethodSupport] | None = None, engine: str = ""
) -> SpecConfig:
    """A valid SpecConfig; with `capabilities`, one that engine can run."""
    methods = ["none", *(capabilities or SPEC_METHODS[1:])]
    method = draw(st.sampled_from(methods))
    if method == "none":
        return SpecConfig()
    support = capabilities[method] if capabilities else None
    k = draw(st.integers(1, 16))
    fields: dict[str, object] = {"method": method, "num_speculative_tokens": k}
    needs_draft = support.draft if support else None
    wants_draft = needs_draft == "required" or draw(st.booleans())
    if method in DRAFT_WEIGHT_METHODS and wants_draft and needs_draft != "forbidden":
        fields["draft_model"] = draw(draft_paths)
    if method == "ngram" and (support is None or support.prompt_lookup) and draw(st.booleans()):
        low = draw(st.integers(1, 8))
        fields["prompt_lookup_min"] = low
        fields["prompt_lookup_max"] = draw(st.integers(low, 16))
    tree = method in TREE_METHODS and (support is None or support.tree) and draw(st.booleans())
    if tree:
        topk = draw(st.integers(2, 8))
        fields["eagle_topk"] = topk
        fields["num_draft_tokens"] = draw(st.integers(2, topk * k + 1))
    schedule_ok = support is None or support.schedule
    if engine == "sglang" and tree:
        schedule_ok = False  # SGLang's adaptive mode runs chains only
    adaptive_ok = (support is None or support.engine_adaptive) and not tree
    if engine == "sglang" and k not in (1, 3, 5, 7):
        adaptive_ok = False  # SGLang starts from one of its default candidates
    if schedule_ok and draw(st.booleans()):
        fields["schedule"] = draw(schedules(k, must_include_k=engine == "sglang"))
    elif adaptive_ok and draw(st.booleans()):
        fields["engine_adaptive"] = True
    return SpecConfig(**fields)  # type: ignore[arg-type]
