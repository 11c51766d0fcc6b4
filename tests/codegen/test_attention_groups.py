"""Attention whose sequence is not a whole number of partition chunks (ViT's 197 tokens): the
per-head tensors live in SBUF homes in groups of rows (residency._translate_grouped), the
per-head products take several row and contraction tiles (matmul_heads), the key transpose
flips on the PE array (lower_data._transpose_on_pe), and the softmax and elementwise walks go
one head at a time. Every model is checked against onnxruntime and run race-free under a
random schedule (docs/memory_planner.md#groups)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import FP32_ATOL, FP32_RTOL, OnnxWriter

from onnx2bir.bir.enums import MemoryType, Opcode
from onnx2bir.bir.ir import AccessPattern, Loop
from onnx2bir.bir.verify import verify_module
from onnx2bir.codegen.residency import Home, group_rows, translate
from onnx2bir.compiler import compile_model
from onnx2bir.options import CompileOptions
from onnx2bir.runtime.machine.interpreter import run_function
from onnx2bir.runtime.machine.schedule import parse_schedule, run_scheduled
from onnx2bir.runtime.oracle.ort import run_onnxruntime

H, D = 6, 8  # heads (more than copy_strided unrolls, as in ViT-base), head dim


def _vit_attention(tokens: int, heads: int = H):
    """ViT's eager self-attention as exported: Q, K, V projections, heads split by Reshape and
    Transpose(0, 2, 1, 3), Kᵀ by Transpose(0, 2, 3, 1), scale Mul, Softmax, P·V, heads merged."""
    rng = np.random.default_rng(0)
    w = OnnxWriter()
    x = w.input("x", (1, tokens, H * D))

    def projection():
        weight = w.const(rng.standard_normal((H * D, H * D)) * 0.2)
        return w.reshape(w.op("MatMul", [x, weight]), [1, tokens, heads, H * D // heads])

    q = w.op("Transpose", [projection()], perm=[0, 2, 1, 3], name="q_heads")
    k = w.op("Transpose", [projection()], perm=[0, 2, 3, 1], name="k_transpose")
    v = w.op("Transpose", [projection()], perm=[0, 2, 1, 3], name="v_heads")
    scores = w.op("MatMul", [q, k], name="qk")  # scaled on its eviction
    scaled = w.op("Mul", [scores, w.const(0.25)], name="scale")
    probs = w.op("Softmax", [scaled], axis=-1, name="softmax")
    context = w.op("MatMul", [probs, v], name="pv")
    merged = w.op("Transpose", [context], perm=[0, 2, 1, 3], name="merge")
    out = w.op("Relu", [w.reshape(merged, [1, tokens, H * D])], name="out")
    # The scale runs on qk's eviction (patterns/matmul_scale.py): qk writes `scaled` itself.
    names = {"scores": scaled, "probs": probs, "k": k, "q": q, "context": context}
    return w.model(out), names


def _run(model, tokens: int, **options):
    feeds = {"x": np.random.default_rng(1).standard_normal((1, tokens, H * D)).astype(np.float32)}
    compilation = compile_model(model, CompileOptions(auto_cast="none", **options))
    assert not verify_module(compilation.module)
    got = run_function(compilation.module, feeds)
    want = run_onnxruntime(model, feeds)
    (name,) = want
    np.testing.assert_allclose(got[name], want[name], rtol=FP32_RTOL, atol=FP32_ATOL)
    scheduled = run_scheduled(compilation.module, feeds, parse_schedule("random:1"), True)
    assert scheduled.race_count == 0, scheduled.races[:3]
    np.testing.assert_array_equal(scheduled.outputs[name], got[name])
    return compilation


def _instructions(block, node: str, found=None) -> list:
    found = [] if found is None else found
    for item in block.items:
        if isinstance(item, Loop):
            _instructions(item.body, node, found)
        elif item.origin.node == node:
            found.append(item)
    return found


@pytest.mark.parametrize("tokens", [197, 300])
def test_scores_and_probabilities_of_each_head_stay_on_chip_in_groups(tokens):
    model, names = _vit_attention(tokens)
    compilation = _run(model, tokens)
    function = compilation.module.functions[0]
    plan = compilation.memory_plan
    for role in ("scores", "probs", "q", "context"):
        tensor = names[role]
        assert function.memory_locations[tensor].memory is MemoryType.SB, role
        assert plan.homes[tensor].group == tokens, role
    # The key transpose [1, H, D, T]: groups of D rows, one head per partition chunk.
    assert plan.homes[names["k"]].group == D
    # No DMA of the block touches a DRAM tensor of the program's own.
    for node in ("qk", "scale", "softmax", "pv", "k_transpose"):
        for inst in _instructions(function.entry, node):
            if inst.opcode is Opcode.DMA_COPY:
                for ap in (inst.dst, *inst.srcs.values()):
                    assert function.memory_locations[ap.loc].memory is not MemoryType.DRAM


def test_the_key_transpose_flips_on_the_pe_array():
    model, _ = _vit_attention(197)
    compilation = _run(model, 197)
    flips = _instructions(compilation.module.functions[0].entry, "k_transpose")
    assert any(inst.opcode is Opcode.MATMULT for inst in flips)


def test_one_block_key_transposes_rotate_over_the_heads():
    # 64 tokens: each head's key [64, 8] is one block, so the flips rotate over the heads'
    # loop, a PSUM bank and a staging tile per copy (TRANSPOSE_COPIES), so that a head's
    # flip need not wait for the previous head's store; the random schedule in _run finds no
    # race between a head's copy-out and the next flips, and the result matches onnxruntime.
    from onnx2bir.codegen.lower.data import TRANSPOSE_COPIES
    from onnx2bir.codegen.matmul_tiles import BANK_FP32

    model, _ = _vit_attention(64)
    compilation = _run(model, 64)
    flips = [
        i
        for i in compilation.module.functions[0].instructions()
        if i.origin.node == "k_transpose" and i.opcode is Opcode.MATMULT
    ]
    banks = {i.dst.offset // BANK_FP32 for i in flips if not i.dst.offset_terms}
    assert TRANSPOSE_COPIES == 4 and banks == {0, 1, 2, 3}


@pytest.mark.parametrize("tokens", [197, 300])
def test_head_split_and_merge_are_one_copy_per_partition_chunk(tokens):
    # [1, T, H, D] <-> [1, H, T, D], both sides in SBUF: one copy [rows, H, D] per 128 rows
    # (every head at once), not one per head and 128 rows; _run checks the numbers against
    # onnxruntime and the schedule for races.
    model, _ = _vit_attention(tokens)
    compilation = _run(model, tokens)
    chunks = -(-tokens // 128)
    for node in ("q_heads", "v_heads", "merge"):
        copies = _instructions(compilation.module.functions[0].entry, node)
        assert copies and all(i.opcode is not Opcode.DMA_COPY for i in copies), node
        assert _executed(compilation.module.functions[0].entry, node) == chunks, node


def _executed(block, node: str) -> int:
    """How many instructions of `node` run, loop trips counted."""
    count = 0
    for item in block.items:
        if isinstance(item, Loop):
            count += item.trip_count * _executed(item.body, node)
        elif item.origin.node == node:
            count += 1
    return count


def test_without_the_plan_the_grouped_walks_match_onnxruntime():
    model, _ = _vit_attention(197)
    _run(model, 197, memory_plan=False)


def test_three_heads_whose_split_is_unrolled_match_onnxruntime():
    model, names = _vit_attention(197, heads=3)
    compilation = _run(model, 197)
    assert compilation.memory_plan.homes[names["scores"]].group == 197


def test_group_rows_only_for_a_batch_of_matrices_not_whole_chunks():
    assert group_rows((1, 12, 197, 197)) == 197
    assert group_rows((1, 12, 64, 197)) == 64
    assert group_rows((1, 12, 128, 128)) == 0  # whole chunks: flat rows serve
    assert group_rows((1, 197, 768)) == 0  # one matrix
    assert group_rows((197, 768)) == 0


def test_translate_in_groups_starts_each_group_at_partition_zero():
    # 3 groups of 197 rows of 8: group g's rows 0..127 in chunk 2g, 128..196 in chunk 2g + 1.
    home = Home("t", 8, 3 * 197 * 8, 4, group=197)
    assert home.chunks == 6 and home.partitions == 128
    pieces = translate(AccessPattern("t", ((8, 197), (1, 8)), 197 * 8), home, {})
    assert [(p.first, p.count) for p in pieces] == [(0, 128), (128, 69)]
    assert [(p.ap.partition_start, p.ap.offset) for p in pieces] == [(0, 2 * 8), (0, 3 * 8)]
    # A loop over the groups moves by two chunks a trip.
    ap = AccessPattern("t", ((8, 128), (1, 8)), 0, (("g", 197 * 8),))
    (piece,) = translate(ap, home, {"g": (0, 2)})
    assert piece.ap.offset_terms == (("g", 2 * 8),)


def test_translate_in_groups_refuses_rows_that_cross_into_the_next_group():
    # Flat rows 128..255 are rows 128..196 of group 0 and 0..58 of group 1: in the padding of
    # group 0's second chunk they would read the wrong values, so the access is refused.
    home = Home("t", 8, 3 * 197 * 8, 4, group=197)
    reason = translate(AccessPattern("t", ((8, 128), (1, 8)), 128 * 8), home, {})
    assert isinstance(reason, str) and "crosses the end of a group" in reason
    # So is a loop of 128-row steps that runs past the group, and a predicated edge tile.
    ap = AccessPattern("t", ((8, 128), (1, 8)), 0, (("r", 128 * 8),))
    assert isinstance(translate(ap, home, {"r": (0, 2)}), str)
    assert isinstance(translate(AccessPattern("t", ((8, 128), (1, 8))), home, {}, True), str)
