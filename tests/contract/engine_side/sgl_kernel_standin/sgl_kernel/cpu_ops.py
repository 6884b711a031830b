"""TEST-ONLY plain-torch stand-ins for the nine sgl-kernel CPU ops SGLang's NGRAM path calls.

Never deploy this. PyPI carries no CPU build of sgl-kernel, so SpecPilot's contract tests run a
real SGLang 0.5.23 server on CPU with these slow, simple versions instead. Each function keeps
the CPU op's argument order and names (as SGLang 0.5.23 calls them: kernels/ops/speculative/,
mem_cache/allocation.py, kernels/ops/kvcache/cache_move.py, layers/attention/
intel_amx_backend.py), mutates the same outputs in place, and was written here from the op's
documented contract, not from its code. What an op supports beyond what the tiny test models
need (sliding windows, attention sinks, cross-attention) raises NotImplementedError instead of
guessing.

This module imports only torch and ctypes, so the tests can load it with any torch build.
"""

from __future__ import annotations

import ctypes

import torch

Tensor = torch.Tensor


def _flat_list(tensor: Tensor) -> list[int]:
    return [int(v) for v in tensor.reshape(-1).tolist()]


# --------------------------------------------------------------------------- cache bookkeeping


def assign_extend_cache_locs_cpu(
    req_pool_indices: Tensor,
    req_to_token: Tensor,
    start_offset: Tensor,
    end_offset: Tensor,
    out_cache_loc: Tensor,
    pool_len: int,
) -> None:
    """Gather: out_cache_loc, packed request after request, receives
    req_to_token[req_pool_indices[i], start_offset[i]:end_offset[i]]."""
    rows = req_to_token.reshape(-1, pool_len)
    cursor = 0
    for row, start, end in zip(
        _flat_list(req_pool_indices), _flat_list(start_offset), _flat_list(end_offset), strict=True
    ):
        width = end - start
        out_cache_loc[cursor : cursor + width] = rows[row, start:end].to(out_cache_loc.dtype)
        cursor += width


def assign_req_to_token_pool_cpu(
    req_pool_indices: Tensor,
    req_to_token: Tensor,
    start_offset: Tensor,
    end_offset: Tensor,
    out_cache_loc: Tensor,
    pool_len: int,
) -> None:
    """Scatter, the inverse of `assign_extend_cache_locs_cpu`:
    req_to_token[req_pool_indices[i], start_offset[i]:end_offset[i]] takes the next
    end - start entries of out_cache_loc."""
    rows = req_to_token.view(-1, pool_len)
    cursor = 0
    for row, start, end in zip(
        _flat_list(req_pool_indices), _flat_list(start_offset), _flat_list(end_offset), strict=True
    ):
        width = end - start
        rows[row, start:end] = out_cache_loc[cursor : cursor + width].to(rows.dtype)
        cursor += width


def fill_accept_out_cache_loc_cpu(
    accept_index: Tensor, out_cache_loc: Tensor, accept_out_cache_loc: Tensor
) -> None:
    """Compact: the k-th accepted slot (accept_index != -1, row-major) gets
    out_cache_loc[accept_index]."""
    flat = accept_index.reshape(-1).to(torch.int64)
    kept = flat[flat != -1]
    accept_out_cache_loc[: kept.numel()] = out_cache_loc[kept].to(accept_out_cache_loc.dtype)


def fill_bonus_tokens_cpu(
    accept_tokens: Tensor, accept_lens: Tensor, bonus_tokens: Tensor, accept_stride: int
) -> None:
    """bonus_tokens[i] = the last accepted token of request i (accept_lens counts the bonus)."""
    flat = accept_tokens.reshape(-1)
    for i, length in enumerate(_flat_list(accept_lens)):
        bonus_tokens[i] = flat[i * accept_stride + length - 1]


def copy_all_layer_kv_cache_cpu(
    data_ptrs: Tensor, strides: Tensor, tgt_loc: Tensor, src_loc: Tensor
) -> None:
    """For every KV buffer (given by its address and its row size in bytes): row tgt_loc[j]
    becomes the old row src_loc[j]. All source rows are read before any row is written, so
    overlapping moves are safe."""
    sources = src_loc.reshape(-1).to(torch.int64)
    targets = tgt_loc.reshape(-1).to(torch.int64)
    if sources.numel() == 0:
        return
    highest = int(torch.maximum(sources.max(), targets.max()))
    for address, stride in zip(_flat_list(data_ptrs), _flat_list(strides), strict=True):
        window = (ctypes.c_uint8 * (stride * (highest + 1))).from_address(address)
        rows = torch.frombuffer(window, dtype=torch.uint8).view(highest + 1, stride)
        rows[targets] = rows[sources].clone()


# --------------------------------------------------------------------------- draft tree


def reconstruct_indices_from_tree_mask(
    tree_mask: Tensor,
    verified_seq_len: Tensor,
    positions: Tensor,
    retrive_index: Tensor,
    retrive_next_token: Tensor,
    retrive_next_sibling: Tensor,
    batch_size: int,
    draft_token_num: int,
) -> None:
    """From each request's n x n draft mask (row i, column j: node j is visible from node i;
    j < i means an ancestor) derive: positions = verified length + number of ancestors; the
    flat index b * n + i; the first child (smallest later node whose ancestors include i) and
    the next sibling (smallest later node with the same parent; -1 for the root)."""
    n = draft_token_num
    if batch_size == 0:
        return
    masks = tree_mask.reshape(-1)[: batch_size * n * n].reshape(batch_size, n, n).to(torch.bool)
    lower = torch.ones(n, n, dtype=torch.bool).tril(diagonal=-1)
    lengths = _flat_list(verified_seq_len[:batch_size])
    positions_view = positions.reshape(-1)
    for b in range(batch_size):
        ancestors = masks[b] & lower  # [node, ancestor]
        depth = _flat_list(ancestors.sum(dim=1))
        parents = [max((j for j in range(i) if ancestors[i, j]), default=-1) for i in range(n)]
        for i in range(n):
            positions_view[b * n + i] = lengths[b] + depth[i]
            retrive_index[b, i] = b * n + i
            children = [k for k in range(i + 1, n) if ancestors[k, i]]
            retrive_next_token[b, i] = children[0] if children else -1
            siblings = [k for k in range(i + 1, n) if parents[k] == parents[i]]
            retrive_next_sibling[b, i] = siblings[0] if siblings and parents[i] >= 0 else -1


def verify_tree_greedy_cpu(
    predicts: Tensor,
    accept_index: Tensor,
    accept_token_num: Tensor,
    candidates: Tensor,
    retrive_index: Tensor,
    retrive_next_token: Tensor,
    retrive_next_sibling: Tensor,
    target_predict: Tensor,
) -> None:
    """Greedy walk down each request's draft tree: at every level take the first child (then
    its siblings) whose draft token equals the target's argmax at the last accepted node.
    Writes the accepted flat indices into accept_index (root first), the number of accepted
    drafts (bonus excluded) into accept_token_num, and the target's token at every accepted
    node, the bonus one included, into predicts."""
    batch_size = candidates.shape[0]
    steps = accept_index.shape[1]
    cand = candidates.tolist()
    index = retrive_index.tolist()
    first_child = retrive_next_token.tolist()
    sibling = retrive_next_sibling.tolist()
    target = _flat_list(target_predict)
    for b in range(batch_size):
        last = int(index[b][0])
        accept_index[b, 0] = last
        accepted = 0
        node = 0
        for _ in range(1, steps):
            node = int(first_child[b][node])
            while node != -1 and int(cand[b][node]) != target[last]:
                node = int(sibling[b][node])
            if node == -1:
                break
            predicts[last] = target[last]
            accepted += 1
            last = int(index[b][node])
            accept_index[b, accepted] = last
        accept_token_num[b] = accepted
        predicts[last] = target[last]


# --------------------------------------------------------------------------- attention


def _refuse(sinks: Tensor | None, is_cross_attention: bool, sliding_window_size: int) -> None:
    if sinks is not None:
        raise NotImplementedError("test-only sgl_kernel stand-in: attention sinks")
    if is_cross_attention:
        raise NotImplementedError("test-only sgl_kernel stand-in: cross-attention")
    if sliding_window_size > 0:
        raise NotImplementedError("test-only sgl_kernel stand-in: sliding-window attention")


def _attend(
    query: Tensor,
    keys: Tensor,
    values: Tensor,
    visible: Tensor | None,
    sm_scale: float,
    logit_cap: float,
) -> Tensor:
    """query [q, H, D], keys/values [k, Hkv, D], visible [q, k] -> [q, H, Dv] in float32.
    Query head h reads key/value head h // (H / Hkv) (grouped-query attention)."""
    group = query.shape[1] // keys.shape[1]
    k = keys.float().repeat_interleave(group, dim=1)
    v = values.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", query.float(), k) * sm_scale
    if logit_cap > 0:
        scores = logit_cap * torch.tanh(scores / logit_cap)
    if visible is not None:
        scores = scores.masked_fill(~visible.unsqueeze(0), float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return torch.einsum("hqk,khd->qhd", weights, v)


def decode_attention_cpu(
    query: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    key_scale: float,
    value_scale: float,
    output: Tensor,
    key: Tensor | None,
    value: Tensor | None,
    loc: Tensor,
    attn_logits: Tensor,
    req_to_token: Tensor,
    req_pool_indices: Tensor,
    seq_lens: Tensor,
    sm_scale: float,
    logit_cap: float,
    is_cross_attention: bool,
    sliding_window_size: int,
    encoder_lens: Tensor | None,
    sinks: Tensor | None,
) -> None:
    """One new token per request: first store its key/value (when given) at loc[i] in the
    caches, then attend over the request's first seq_lens[i] cached tokens, which include it.
    attn_logits is the real kernel's scratch space and is not used here."""
    _refuse(sinks, is_cross_attention, sliding_window_size)
    if key is not None and value is not None:
        slots = loc.reshape(-1).to(torch.int64)
        k_cache[slots] = key.reshape(slots.numel(), *k_cache.shape[1:]).to(k_cache.dtype)
        v_cache[slots] = value.reshape(slots.numel(), *v_cache.shape[1:]).to(v_cache.dtype)
    rows = _flat_list(req_pool_indices)
    for i, length in enumerate(_flat_list(seq_lens)):
        slots = req_to_token[rows[i], :length].to(torch.int64)
        keys = k_cache[slots] * key_scale
        values = v_cache[slots] * value_scale
        out = _attend(query[i : i + 1], keys, values, None, sm_scale, logit_cap)
        output[i] = out[0].to(output.dtype)


def extend_attention_cpu(
    q_extend: Tensor,
    k_extend: Tensor | None,
    v_extend: Tensor | None,
    o_extend: Tensor,
    k_buffer: Tensor,
    v_buffer: Tensor,
    key_scale: float,
    value_scale: float,
    req_to_token: Tensor,
    req_pool_indices: Tensor,
    seq_lens: Tensor,
    extend_seq_lens: Tensor,
    extend_start_loc: Tensor,
    max_len_extend: int | None,
    sm_scale: float,
    logit_cap: float,
    is_cross_attention: bool,
    sliding_window_size: int,
    encoder_lens: Tensor | None,
    sinks: Tensor | None,
    tree_mask: Tensor | None,
    is_causal: bool,
) -> None:
    """Request i adds extend_seq_lens[i] tokens (rows extend_start_loc[i]... of q/k/v_extend)
    after a cached prefix of seq_lens[i] - extend_seq_lens[i] tokens (read through
    req_to_token). Every new token sees the whole prefix; among the new tokens it sees, with a
    tree_mask (flat [requests, e, e], speculative verify), the ones its row marks; otherwise
    itself and earlier ones when is_causal, all of them when not."""
    _refuse(sinks, is_cross_attention, sliding_window_size)
    rows = _flat_list(req_pool_indices)
    starts = _flat_list(extend_start_loc)
    widths = _flat_list(extend_seq_lens)
    for i, total in enumerate(_flat_list(seq_lens)):
        width, start = widths[i], starts[i]
        prefix = total - width
        slots = req_to_token[rows[i], :total].to(torch.int64)
        if k_extend is not None and v_extend is not None:
            keys = torch.cat([k_buffer[slots[:prefix]], k_extend[start : start + width]])
            values = torch.cat([v_buffer[slots[:prefix]], v_extend[start : start + width]])
        else:
            keys, values = k_buffer[slots], v_buffer[slots]
        if tree_mask is not None:
            new = tree_mask.reshape(-1)[i * width * width : (i + 1) * width * width]
            new = new.reshape(width, width).to(torch.bool)
        elif is_causal:
            new = torch.ones(width, width, dtype=torch.bool).tril()
        else:
            new = torch.ones(width, width, dtype=torch.bool)
        visible = torch.cat([torch.ones(width, prefix, dtype=torch.bool), new], dim=1)
        out = _attend(
            q_extend[start : start + width],
            keys * key_scale,
            values * value_scale,
            visible,
            sm_scale,
            logit_cap,
        )
        o_extend[start : start + width] = out.to(o_extend.dtype)
