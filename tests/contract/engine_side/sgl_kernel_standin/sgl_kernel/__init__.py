"""TEST-ONLY stand-in for the `sgl_kernel` package, for SpecPilot's contract tests. Never deploy.

Why it exists: SGLang 0.5.23 on CPU (`SGLANG_USE_CPU_ENGINE=1`) imports `sgl_kernel`
unconditionally, and PyPI carries only CUDA builds of sgl-kernel, which need libcuda. The
contract tests put this folder on the SGLang server's PYTHONPATH (and nowhere else) so that a
real SGLang server, scheduler, metrics and HTTP API run here.

Contract:
- Every name, in this package or any `sgl_kernel.<submodule>`, that is not one of the nine ops
  below is a `MissingKernel`: importing it works, calling it raises `NotImplementedError` naming
  the op. Nothing is silently faked.
- The nine ops SGLang's NGRAM path calls on CPU are plain-torch versions (see `cpu_ops`): seven
  as Python functions, and `decode_attention_cpu` / `extend_attention_cpu` as the torch
  operators `torch.ops.sgl_kernel.*` that SGLang's intel_amx attention backend looks up.
- With `SPECPILOT_STANDIN_CLAIM_AMX=1`, importing this package tells SGLang's platform context
  `has_amx=True`, so `--attention-backend intel_amx` (the only CPU backend that can verify an
  n-gram draft tree) is kept instead of being turned back into torch_native on a CPU without
  AMX. The model layers still ask `cpu_has_amx_support()` directly, which stays False, so they
  run their native torch code and never reach a packed-weight kernel.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import types
from collections.abc import Sequence
from typing import Any, NoReturn

import torch

from sgl_kernel.cpu_ops import (
    assign_extend_cache_locs_cpu,
    assign_req_to_token_pool_cpu,
    copy_all_layer_kv_cache_cpu,
    decode_attention_cpu,
    extend_attention_cpu,
    fill_accept_out_cache_loc_cpu,
    fill_bonus_tokens_cpu,
    reconstruct_indices_from_tree_mask,
    verify_tree_greedy_cpu,
)

__all__ = [
    "MissingKernel",
    "assign_extend_cache_locs_cpu",
    "assign_req_to_token_pool_cpu",
    "copy_all_layer_kv_cache_cpu",
    "fill_accept_out_cache_loc_cpu",
    "fill_bonus_tokens_cpu",
    "reconstruct_indices_from_tree_mask",
    "verify_tree_greedy_cpu",
]
__version__ = "0.0.0+specpilot.test.standin"


class MissingKernel:
    """A kernel this stand-in does not provide: any attribute is another MissingKernel (so
    module-level tables that name kernels still import); calling one raises."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __call__(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise NotImplementedError(
            f"{self._name} is not in SpecPilot's test-only sgl_kernel stand-in "
            "(tests/contract/engine_side/sgl_kernel_standin): only the NGRAM CPU ops are"
        )

    def __getattr__(self, name: str) -> MissingKernel:
        if name.startswith("__"):
            raise AttributeError(name)
        return MissingKernel(f"{self._name}.{name}")

    def __repr__(self) -> str:
        return f"<MissingKernel {self._name}>"


def __getattr__(name: str) -> MissingKernel:
    if name.startswith("__"):
        raise AttributeError(name)
    return MissingKernel(f"sgl_kernel.{name}")


class _MissingSubmodules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """`sgl_kernel.<anything>` that has no file here imports as a module of MissingKernels;
    `sgl_kernel.speculative` also carries the NGRAM tree op SGLang imports from there."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith(__name__ + ".") or fullname == __name__ + ".cpu_ops":
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = types.ModuleType(spec.name, "TEST-ONLY: every name raises when called.")
        module.__path__ = []
        module.__getattr__ = _missing_names(spec.name)  # type: ignore[method-assign]
        if spec.name == __name__ + ".speculative":
            module.reconstruct_indices_from_tree_mask = reconstruct_indices_from_tree_mask  # type: ignore[attr-defined]
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


def _missing_names(module_name: str) -> Any:
    def lookup(name: str) -> MissingKernel:
        if name.startswith("__"):
            raise AttributeError(name)
        return MissingKernel(f"{module_name}.{name}")

    return lookup


def _register_attention_ops() -> None:
    """The two torch operators SGLang's intel_amx backend calls as torch.ops.sgl_kernel.*,
    with the argument lists SGLang 0.5.23 passes (outputs and the caches are mutated)."""
    library = torch.library.Library("sgl_kernel", "FRAGMENT")
    library.define(
        "decode_attention_cpu(Tensor query, Tensor(a!) k_cache, Tensor(b!) v_cache, "
        "float key_scale, float value_scale, Tensor(c!) output, Tensor? key, Tensor? value, "
        "Tensor loc, Tensor attn_logits, Tensor req_to_token, Tensor req_pool_indices, "
        "Tensor seq_lens, float sm_scale, float logit_cap, bool is_cross_attention, "
        "int sliding_window_size, Tensor? encoder_lens, Tensor? sinks) -> ()"
    )
    library.define(
        "extend_attention_cpu(Tensor q_extend, Tensor? k_extend, Tensor? v_extend, "
        "Tensor(a!) o_extend, Tensor k_buffer, Tensor v_buffer, float key_scale, "
        "float value_scale, Tensor req_to_token, Tensor req_pool_indices, Tensor seq_lens, "
        "Tensor extend_seq_lens, Tensor extend_start_loc, int? max_len_extend, float sm_scale, "
        "float logit_cap, bool is_cross_attention, int sliding_window_size, "
        "Tensor? encoder_lens, Tensor? sinks, Tensor? tree_mask, bool is_causal) -> ()"
    )
    library.impl("decode_attention_cpu", decode_attention_cpu, "CPU")
    library.impl("extend_attention_cpu", extend_attention_cpu, "CPU")
    _LIBRARIES.append(library)  # a Library deregisters its ops when collected


def _claim_amx() -> None:
    if os.environ.get("SPECPILOT_STANDIN_CLAIM_AMX") != "1":
        return
    from sglang.srt.runtime_context import override_platform

    override_platform(has_amx=True).install()


_LIBRARIES: list[torch.library.Library] = []
if not any(isinstance(f, _MissingSubmodules) for f in sys.meta_path):
    sys.meta_path.append(_MissingSubmodules())
_register_attention_ops()
_claim_amx()
