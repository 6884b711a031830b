"""The test-only sgl_kernel stand-in (engine_side/sgl_kernel_standin) on small hand-computed
cases: each of the nine plain-torch CPU ops the live SGLang tests rely on, and the rule that
every other name raises when called. Runs on the project venv's CPU torch (the ops import only
torch); the ops' end-to-end check is test_sglang_server.py (NGRAM's greedy output equals the
plain server's)."""

from __future__ import annotations

import importlib.util
import math
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType

import pytest
import torch  # the project's test extra pins CPU torch: a missing torch fails, never skips

STANDIN = Path(__file__).resolve().parent / "engine_side" / "sgl_kernel_standin"


@pytest.fixture(scope="module")
def ops() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "standin_cpu_ops", STANDIN / "sgl_kernel" / "cpu_ops.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def req_to_token() -> torch.Tensor:
    # row r, column c holds 10 * r + c
    return torch.tensor([[10 * r + c for c in range(6)] for r in range(3)], dtype=torch.int32)


def test_assign_extend_cache_locs_gathers_request_after_request(ops: ModuleType) -> None:
    out = torch.full((4,), -1, dtype=torch.int64)
    ops.assign_extend_cache_locs_cpu(
        torch.tensor([2, 0]), req_to_token(), torch.tensor([1, 3]), torch.tensor([3, 5]), out, 6
    )
    assert out.tolist() == [21, 22, 3, 4]


def test_assign_req_to_token_pool_scatters_request_after_request(ops: ModuleType) -> None:
    table = req_to_token()
    ops.assign_req_to_token_pool_cpu(
        torch.tensor([2, 0]),
        table,
        torch.tensor([1, 3]),
        torch.tensor([3, 5]),
        torch.tensor([100, 101, 102, 103]),
        6,
    )
    assert table[2].tolist() == [20, 100, 101, 23, 24, 25]
    assert table[0].tolist() == [0, 1, 2, 102, 103, 5]
    assert table[1].tolist() == [10, 11, 12, 13, 14, 15]


def test_fill_accept_out_cache_loc_compacts_accepted_slots(ops: ModuleType) -> None:
    out = torch.zeros(3, dtype=torch.int64)
    ops.fill_accept_out_cache_loc_cpu(
        torch.tensor([[0, 2, -1], [3, -1, -1]], dtype=torch.int32),
        torch.tensor([100, 101, 102, 103, 104, 105]),
        out,
    )
    assert out.tolist() == [100, 102, 103]


def test_fill_bonus_tokens_takes_each_requests_last_accepted_token(ops: ModuleType) -> None:
    bonus = torch.zeros(2, dtype=torch.int64)
    ops.fill_bonus_tokens_cpu(
        torch.tensor([[5, 6, 7], [8, 9, 10]]), torch.tensor([2, 3], dtype=torch.int32), bonus, 3
    )
    assert bonus.tolist() == [6, 10]


def test_copy_all_layer_kv_cache_moves_rows_in_every_buffer(ops: ModuleType) -> None:
    layers = [torch.arange(10, dtype=torch.float32).reshape(5, 2) + 100 * i for i in range(2)]
    pointers = torch.tensor([t.data_ptr() for t in layers], dtype=torch.int64)
    strides = torch.tensor([t.stride(0) * t.element_size() for t in layers], dtype=torch.int64)
    # row 1 <- old row 3 and row 3 <- old row 0: the second move reads row 3 before it changes
    ops.copy_all_layer_kv_cache_cpu(pointers, strides, torch.tensor([1, 3]), torch.tensor([3, 0]))
    for i, layer in enumerate(layers):
        base = 100 * i
        assert layer.tolist() == [
            [base + 0, base + 1],
            [base + 6, base + 7],
            [base + 4, base + 5],
            [base + 0, base + 1],
            [base + 8, base + 9],
        ]


# A 4-node draft tree: 0 is the root, 1 and 2 its children, 3 the child of 1.
TREE = [[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]]
CHAIN = [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]]


def test_reconstruct_indices_from_tree_mask(ops: ModuleType) -> None:
    mask = torch.tensor([TREE, CHAIN], dtype=torch.bool).flatten()
    positions = torch.zeros(8, dtype=torch.int64)
    index, first_child, sibling = (torch.zeros(2, 4, dtype=torch.int64) for _ in range(3))
    ops.reconstruct_indices_from_tree_mask(
        mask, torch.tensor([10, 20]), positions, index, first_child, sibling, 2, 4
    )
    assert positions.tolist() == [10, 11, 11, 12, 20, 21, 22, 23]
    assert index.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert first_child.tolist() == [[1, 3, -1, -1], [1, 2, 3, -1]]
    assert sibling.tolist() == [[-1, 2, -1, -1], [-1, -1, -1, -1]]


@pytest.mark.parametrize(
    ("targets", "accepted", "accept_index", "predicts"),
    [
        # root predicts 8: child 1 drafted 7 (no), its sibling 2 drafted 8 (yes); 2 is a leaf
        ([8, 0, 5, 0], 1, [0, 2, -1, -1], [8, 0, 5, 0]),
        # root predicts 7 (node 1), node 1 predicts 9 (node 3), node 3 gives the bonus 4
        ([7, 9, 0, 4], 2, [0, 1, 3, -1], [7, 9, 0, 4]),
        # nothing matches: only the bonus token at the root
        ([6, 0, 0, 0], 0, [0, -1, -1, -1], [6, 0, 0, 0]),
    ],
)
def test_verify_tree_greedy(
    ops: ModuleType,
    targets: list[int],
    accepted: int,
    accept_index: list[int],
    predicts: list[int],
) -> None:
    predict = torch.zeros(4, dtype=torch.int32)
    index = torch.full((1, 4), -1, dtype=torch.int32)
    count = torch.zeros(1, dtype=torch.int32)
    ops.verify_tree_greedy_cpu(
        predicts=predict,
        accept_index=index,
        accept_token_num=count,
        candidates=torch.tensor([[1, 7, 8, 9]]),
        retrive_index=torch.tensor([[0, 1, 2, 3]]),
        retrive_next_token=torch.tensor([[1, 3, -1, -1]]),
        retrive_next_sibling=torch.tensor([[-1, 2, -1, -1]]),
        target_predict=torch.tensor([targets]),
    )
    assert count.tolist() == [accepted]
    assert index.tolist() == [accept_index]
    assert predict.tolist() == predicts


def test_decode_attention_writes_the_new_token_then_attends(ops: ModuleType) -> None:
    # one request whose tokens live in slots 2, 0 and (new) 3; two query heads, one KV head
    k_cache = torch.zeros(4, 1, 2)
    v_cache = torch.zeros(4, 1, 2)
    k_cache[0, 0] = torch.tensor([math.log(3.0), 0.0])
    v_cache[2, 0] = torch.tensor([1.0, 0.0])
    v_cache[0, 0] = torch.tensor([0.0, 1.0])
    query = torch.tensor([[[1.0, 0.0], [0.0, 0.0]]])
    output = torch.zeros(1, 2, 2)
    table = torch.tensor([[2, 0, 3, 1]], dtype=torch.int32)
    ops.decode_attention_cpu(
        query,
        k_cache,
        v_cache,
        1.0,
        1.0,
        output,
        torch.zeros(1, 1, 2),  # new key
        torch.full((1, 1, 2), 5.0),  # new value
        torch.tensor([3]),
        torch.zeros(1, 2, 8, 3),
        table,
        torch.tensor([0]),
        torch.tensor([3]),
        1.0,
        0.0,
        False,
        0,
        None,
        None,
    )
    assert v_cache[3, 0].tolist() == [5.0, 5.0]
    # head 0: scores 0, ln 3, 0 -> weights 1/5, 3/5, 1/5; head 1: uniform thirds
    assert output[0, 0].tolist() == pytest.approx([1.2, 1.6])
    assert output[0, 1].tolist() == pytest.approx([2.0, 2.0])


@pytest.mark.parametrize(
    ("mask", "expected"),
    [
        # causal: token 0 sees prefix and itself (1/2, 1/2); token 1 sees all (1/4, 1/4, 1/2)
        (None, [3.0, 5.5]),
        # a tree mask where token 1 does not see token 0: prefix 1/3, itself 2/3
        ([[True, False], [False, True]], [3.0, 6.0]),
    ],
)
def test_extend_attention_prefix_plus_new_tokens(
    ops: ModuleType, mask: list[list[bool]] | None, expected: list[float]
) -> None:
    k_buffer = torch.zeros(4, 1, 1)
    v_buffer = torch.zeros(4, 1, 1)
    v_buffer[1, 0, 0] = 2.0  # the cached prefix token lives in slot 1
    k_extend = torch.tensor([[[0.0]], [[math.log(2.0)]]])
    v_extend = torch.tensor([[[4.0]], [[8.0]]])
    out = torch.zeros(2, 1, 1)
    ops.extend_attention_cpu(
        torch.ones(2, 1, 1),
        k_extend,
        v_extend,
        out,
        k_buffer,
        v_buffer,
        1.0,
        1.0,
        torch.tensor([[1, 2, 3, 0]], dtype=torch.int32),
        torch.tensor([0]),
        torch.tensor([3]),
        torch.tensor([2]),
        torch.tensor([0]),
        2,
        1.0,
        0.0,
        False,
        0,
        None,
        None,
        None if mask is None else torch.tensor(mask).flatten(),
        True,
    )
    assert out.flatten().tolist() == pytest.approx(expected)


def test_every_other_name_raises_and_the_torch_ops_are_registered() -> None:
    script = textwrap.dedent(
        """
        import torch, sgl_kernel
        from sgl_kernel.kvcacheio import transfer_kv_all_layer
        from sgl_kernel.scalar_type import scalar_types
        table = {scalar_types.uint4b8: 1}  # module-level tables that name kernels still import
        for missing in (sgl_kernel.rmsnorm, transfer_kv_all_layer):
            try:
                missing(torch.zeros(1))
            except NotImplementedError as exc:
                assert "test-only" in str(exc), exc
            else:
                raise SystemExit("a missing kernel ran")
        from sgl_kernel.speculative import reconstruct_indices_from_tree_mask
        assert reconstruct_indices_from_tree_mask is sgl_kernel.reconstruct_indices_from_tree_mask
        assert hasattr(torch.ops.sgl_kernel, "decode_attention_cpu")
        assert hasattr(torch.ops.sgl_kernel, "extend_attention_cpu")
        assert not hasattr(torch.ops.sgl_kernel, "convert_weight_packed")
        print("ok")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        env={"PYTHONPATH": str(STANDIN), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]
