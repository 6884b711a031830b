"""SGLang 0.5.23 adapter: `--speculative-algorithm` and its steps / topk / draft-token rules.

Facts from SGLang 0.5.23's source (srt/arg_groups/fields/spec.py, speculative_hook.py,
srt/speculative/adaptive_spec_params.py):
- NEXTN is an alias of EAGLE (used for MTP heads); STANDALONE is a separate draft model.
- EAGLE family: with topk 1, num_draft_tokens is forced to num_steps + 1; without steps, topk
  and draft tokens SGLang auto-chooses them, so SpecPilot always writes them.
- NGRAM: topk is taken from `--speculative-ngram-max-bfs-breadth` (default 10), draft tokens
  default 12, steps default draft_tokens // topk.
- DFLASH: needs a draft path, forces steps = topk = 1; draft tokens = block size (the verify
  window, K + 1 here).
- `--speculative-adaptive` works for EAGLE/EAGLE3 (NEXTN included) with topk 1 only; the JSON
  file maps a batch-size start ("1", "8", ...) to `candidate_steps`; a batch is routed to the
  largest start not above it; `--speculative-num-steps` must be one of the candidates. Keys
  SGLang does not know are ignored, so each bucket also records its last batch size.
- Metrics exist only with `--enable-metrics`, which SpecPilot always sets.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any, cast

from specpilot.runtime.engines.base import (
    EngineArgsError,
    EngineCapabilityError,
    EngineName,
    FoundFlag,
    LaunchSettings,
    MethodSupport,
    check_capability,
    find_flags,
    launch_args,
    parse_int_flag,
    refuse_speculative_flags,
)
from specpilot.tuner import ConfigError, ScheduleTier, SpecConfig, SpecMethod

CAPABILITIES: Mapping[str, MethodSupport] = {
    "ngram": MethodSupport("NGRAM", "forbidden", tree=True),
    "draft_model": MethodSupport("STANDALONE", "required", tree=True),
    "eagle": MethodSupport("EAGLE", "required", schedule=True, tree=True, engine_adaptive=True),
    "eagle3": MethodSupport("EAGLE3", "required", schedule=True, tree=True, engine_adaptive=True),
    "mtp": MethodSupport("NEXTN", "optional", schedule=True, tree=True, engine_adaptive=True),
    "dflash": MethodSupport("DFLASH", "required"),
}
_METHOD_BY_ALGORITHM = {s.engine_name: m for m, s in CAPABILITIES.items()}

ADAPTIVE_CONFIG_FILE = "sglang-speculative-adaptive.json"
BUCKET_END_KEY = "specpilot_last_batch_size"
# SGLang resets --max-running-requests to this whenever speculation is on and it is unset.
SPECULATIVE_DEFAULT_MAX_RUNNING = 48
NGRAM_DEFAULT_BFS_BREADTH = 10
# SGLang's default adaptive buckets (srt/speculative/adaptive_spec_params.py): start -> steps.
DEFAULT_ADAPTIVE_BUCKETS: dict[int, tuple[int, ...]] = {
    1: (1, 3, 5, 7),
    8: (0, 1, 3),
    32: (0, 1),
    64: (0,),
}
NGRAM_DEFAULT_DRAFT_TOKENS = 12

_VALUE_FLAGS = {
    "--speculative-algorithm": "algorithm",
    "--speculative-draft-model-path": "draft",
    "--speculative-draft-model": "draft",
    "--speculative-num-steps": "steps",
    "--speculative-eagle-topk": "topk",
    "--speculative-num-draft-tokens": "draft_tokens",
    "--speculative-dflash-block-size": "block_size",
    "--speculative-ngram-max-bfs-breadth": "bfs_breadth",
    "--speculative-adaptive-config": "adaptive_config",
    "--max-running-requests": "max_running",
}
_BOOL_FLAGS = {"--speculative-adaptive": "adaptive"}


class SglangAdapter:
    """Renders and parses SGLang 0.5.23 `sglang.launch_server` command lines."""

    name: EngineName = "sglang"
    version = "0.5.23"
    capabilities = CAPABILITIES
    max_batch_flags: tuple[str, ...] = ("--max-running-requests",)
    # SGLang 0.5.23 drains on SIGTERM by itself, until its last request finishes
    # (TokenizerManager.sigterm_watchdog); only the pod's grace period bounds it
    drain_flags: tuple[str, ...] = ()

    def check(self, config: SpecConfig) -> None:
        check_capability("SGLang", CAPABILITIES, config)
        candidates = _adaptive_candidates(config)
        if candidates is None:
            return
        if config.eagle_topk is not None:
            raise EngineCapabilityError(
                "eagle_topk",
                config.eagle_topk,
                "None (chain) in adaptive mode (a schedule or engine_adaptive)",
                "SGLang adaptive mode runs with topk 1 only",
            )
        if config.num_speculative_tokens not in candidates:
            raise EngineCapabilityError(
                "num_speculative_tokens",
                config.num_speculative_tokens,
                "one of the adaptive candidate steps " + str(candidates),
                "SGLang requires --speculative-num-steps among the candidates",
            )

    def adaptive_config_path(self, base: LaunchSettings) -> str:
        return os.path.join(base.sidecar_dir, ADAPTIVE_CONFIG_FILE)

    def render(self, config: SpecConfig, base: LaunchSettings) -> list[str]:
        refuse_speculative_flags(base.extra_args, ("--speculative",))
        self.check(config)
        args = [*launch_args(base, "--model-path"), "--enable-metrics"]
        if config.speculative:
            args += self._speculative_args(config, base)
        return [*args, *base.extra_args]

    def _speculative_args(self, config: SpecConfig, base: LaunchSettings) -> list[str]:
        support = CAPABILITIES[config.method]
        k = config.max_k
        args = ["--speculative-algorithm", support.engine_name]
        if config.draft_model is not None:
            args += ["--speculative-draft-model-path", config.draft_model]
        if config.method == "dflash":
            return [*args, "--speculative-num-draft-tokens", str(k + 1)]
        topk = config.eagle_topk or 1
        draft_tokens = config.num_draft_tokens or k + 1
        args += ["--speculative-num-steps", str(k)]
        if config.method == "ngram":
            args += ["--speculative-ngram-max-bfs-breadth", str(topk)]
        else:
            args += ["--speculative-eagle-topk", str(topk)]
        args += ["--speculative-num-draft-tokens", str(draft_tokens)]
        if config.schedule is not None:
            args += [
                "--speculative-adaptive",
                "--speculative-adaptive-config",
                self.adaptive_config_path(base),
            ]
        if config.engine_adaptive:
            args.append("--speculative-adaptive")
        return args

    def sidecar_files(self, config: SpecConfig, base: LaunchSettings) -> dict[str, str]:
        self.check(config)
        if config.schedule is None:
            return {}
        return {self.adaptive_config_path(base): adaptive_config_json(config.schedule)}

    def parse(self, args: Sequence[str], files: Mapping[str, str] | None = None) -> SpecConfig:
        _refuse_unmodelled_flags(args)
        found = find_flags(args, _VALUE_FLAGS, _BOOL_FLAGS)
        algorithm_flag = found.get("algorithm")
        if algorithm_flag is None:
            if "adaptive" in found:
                raise EngineArgsError(
                    "--speculative-adaptive", True, "only with --speculative-algorithm"
                )
            return SpecConfig()
        algorithm = (algorithm_flag.value or "").upper()
        method = _METHOD_BY_ALGORITHM.get(algorithm)
        if method is None:
            raise EngineArgsError(
                "--speculative-algorithm", algorithm_flag.value, " | ".join(_METHOD_BY_ALGORITHM)
            )
        try:
            config = _config_from_flags(method, found, files)
        except EngineArgsError:
            raise
        except ConfigError as exc:
            raise EngineArgsError(exc.field, exc.value, exc.allowed) from exc
        self.check(config)
        return config

    def program(self, python: str) -> list[str]:
        return [python, "-m", "sglang.launch_server"]


def _adaptive_candidates(config: SpecConfig) -> list[int] | None:
    """The steps SGLang's adaptive mode may pick for this config; None when it is not adaptive."""
    if config.schedule is not None:
        return sorted({k for _, _, k in config.schedule})
    if config.engine_adaptive:
        return sorted({k for ks in DEFAULT_ADAPTIVE_BUCKETS.values() for k in ks if k})
    return None


def adaptive_config_json(schedule: Sequence[ScheduleTier]) -> str:
    """SGLang adaptive config with one candidate per bucket: SpecPilot's K for that range."""
    body = {str(start): {"candidate_steps": [k], BUCKET_END_KEY: end} for start, end, k in schedule}
    return json.dumps(body, indent=2, sort_keys=False) + "\n"


def _refuse_unmodelled_flags(args: Sequence[str]) -> None:
    modelled = set(_VALUE_FLAGS) | set(_BOOL_FLAGS)
    for token in args:
        spelling = token.partition("=")[0]
        if spelling.startswith("--speculative-") and spelling not in modelled:
            raise EngineArgsError(
                spelling,
                token,
                "the speculative flags " + ", ".join(sorted(f for f in modelled if "spec" in f)),
                "SpecPilot does not model this one and will not drop it silently",
            )


def _config_from_flags(
    method: str, found: Mapping[str, FoundFlag], files: Mapping[str, str] | None
) -> SpecConfig:
    draft_flag = found.get("draft")
    draft = draft_flag.value if draft_flag is not None else None
    steps = parse_int_flag(found.get("steps"))
    draft_tokens = parse_int_flag(found.get("draft_tokens"))
    if method == "dflash":
        block = parse_int_flag(found.get("block_size"))
        window = draft_tokens or block
        if window is None:
            raise EngineArgsError(
                "--speculative-num-draft-tokens",
                None,
                "the DFlash block size (K + 1)",
                "SGLang would infer it from the draft checkpoint; SpecPilot needs it explicit",
            )
        return SpecConfig(method="dflash", num_speculative_tokens=window - 1, draft_model=draft)
    if method == "ngram":
        topk = parse_int_flag(found.get("bfs_breadth")) or NGRAM_DEFAULT_BFS_BREADTH
        draft_tokens = draft_tokens or NGRAM_DEFAULT_DRAFT_TOKENS
        steps = steps or draft_tokens // topk
    else:
        topk = parse_int_flag(found.get("topk")) or 1
        if steps is None:
            raise EngineArgsError(
                "--speculative-num-steps",
                None,
                "an integer (K)",
                "SGLang would auto-choose steps/topk/draft tokens; SpecPilot needs them explicit",
            )
        if topk == 1:
            draft_tokens = None  # SGLang forces steps + 1 for a chain
    schedule = _read_schedule(found, files)
    engine_adaptive = "adaptive" in found and schedule is None
    return SpecConfig(
        method=cast(SpecMethod, method),
        num_speculative_tokens=steps,
        draft_model=draft,
        eagle_topk=topk,
        num_draft_tokens=draft_tokens,
        schedule=schedule,
        engine_adaptive=engine_adaptive,
    )


def _read_schedule(
    found: Mapping[str, FoundFlag], files: Mapping[str, str] | None
) -> tuple[ScheduleTier, ...] | None:
    if "adaptive" not in found:
        return None
    path_flag = found.get("adaptive_config")
    if path_flag is None or not path_flag.value:
        return None  # SGLang's default buckets: the engine adapts on its own
    path = path_flag.value
    try:
        text = files[path] if files is not None and path in files else _read_text(path)
        body: Any = json.loads(text)
    except (OSError, KeyError, json.JSONDecodeError) as exc:
        raise EngineArgsError(
            "--speculative-adaptive-config", path, "a readable JSON file"
        ) from exc
    max_running = parse_int_flag(found.get("max_running")) or SPECULATIVE_DEFAULT_MAX_RUNNING
    return schedule_from_adaptive_config(body, max_running)


def _read_text(path: str) -> str:
    with open(path, encoding="utf-8") as handle:
        return handle.read()


def schedule_from_adaptive_config(body: object, max_running: int) -> tuple[ScheduleTier, ...]:
    """Buckets -> contiguous tiers; a bucket without SpecPilot's end marker ends where the next
    one starts, the last at the engine's maximum batch."""
    if not isinstance(body, dict):
        raise EngineArgsError("--speculative-adaptive-config", body, "a JSON object")
    buckets = sorted((int(key), entry) for key, entry in body.items() if str(key).isdigit())
    if not buckets:
        raise EngineArgsError(
            "--speculative-adaptive-config", body, 'batch-size keys such as "1", "8"'
        )
    tiers: list[ScheduleTier] = []
    for index, (start, entry) in enumerate(buckets):
        steps = entry.get("candidate_steps") if isinstance(entry, dict) else None
        if not isinstance(steps, list) or len(set(steps)) != 1:
            raise EngineArgsError(
                f"adaptive config bucket {start}.candidate_steps",
                steps,
                "exactly one K",
                "SpecPilot's schedule fixes K per batch-size range",
            )
        if index + 1 < len(buckets):
            end = buckets[index + 1][0] - 1
        else:
            end = int(entry.get(BUCKET_END_KEY, max(max_running, start)))
        tiers.append((start, end, int(steps[0])))
    return tuple(tiers)
