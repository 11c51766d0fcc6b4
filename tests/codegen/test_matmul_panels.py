"""The generic MatMul/Gemm lowering's panel path, per-batch b preloads and weights stored in the
autocast dtype (docs/buffers.md#lowerings, docs/autocast.md#weights).

Each case checks that the path under test was taken (its tiles exist in the BIR) and that the
numbers match onnxruntime, race-free under a random schedule.
"""

from __future__ import annotations

import copy
from dataclasses import replace

import ml_dtypes
import numpy as np
import pytest
from conftest import assert_matches_onnxruntime, make_model, one_node_model
from onnx import helper

from onnx2bir.bir.enums import Dtype
from onnx2bir.compiler import compile_graph, import_graph
from onnx2bir.options import CompileOptions
from onnx2bir.runtime.machine.schedule import parse_schedule, run_scheduled
from onnx2bir.runtime.machine.uninit import run_checked
from onnx2bir.runtime.oracle.ort import synthesize_inputs


def _compile(model, options: CompileOptions | None = None):
    return compile_graph(import_graph(model), options or CompileOptions(auto_cast="none"), [])


def _tiles(compiled) -> set[str]:
    """The tags of the SBUF tiles the lowering allocated ("b_whole" of "node/b_whole#3")."""
    names = compiled.module.functions[0].memory_locations
    return {name.split("/")[-1].split("#")[0] for name in names if "/" in name}


def _race_free(model) -> None:
    compiled = _compile(model)
    feeds = synthesize_inputs(compiled.graph, 0)
    run = run_scheduled(compiled.module, feeds, parse_schedule("random:1"), True)
    assert run.race_count == 0, run.races[:3]


def _weights(shape, seed=2):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)


PANEL_CASES = {
    # rows in several tiles, one column block
    "rows": ({"a": (300, 200)}, {"b": _weights((200, 96))}, {}),
    # one row tile, three column blocks (K over two tiles, the last partial)
    "columns": ({"a": (64, 150)}, {"b": _weights((150, 1100))}, {}),
    # a batched a against one weight: the batches are rows
    "batched_rows": ({"a": (2, 200, 256)}, {"b": _weights((256, 640))}, {}),
    # a batch of one (an encoder at batch 1): a unit batch dim is no stride to keep
    "unit_batch": ({"a": (1, 128, 256)}, {"b": _weights((256, 640))}, {}),
}


@pytest.mark.parametrize("case", list(PANEL_CASES))
def test_matmul_panels_match_onnxruntime(case):
    inputs, initializers, attrs = PANEL_CASES[case]
    model = one_node_model("MatMul", inputs, initializers=initializers, **attrs)
    assert {"b_whole", "panel"} <= _tiles(_compile(model))
    assert_matches_onnxruntime(model, passes=[], atol=1e-4)
    _race_free(model)


@pytest.mark.parametrize("trans_a, trans_b", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_gemm_panels_with_transposes_alpha_and_bias(trans_a, trans_b):
    a_shape = (96, 260) if trans_a else (260, 96)
    b = _weights((600, 96) if trans_b else (96, 600))
    c = _weights((600,), seed=5)
    model = one_node_model(
        "Gemm",
        {"a": a_shape},
        initializers={"b": b, "c": c},
        transA=trans_a,
        transB=trans_b,
        alpha=0.5,
        beta=2.0,
    )
    assert {"b_whole", "panel", "addend"} <= _tiles(_compile(model))
    assert_matches_onnxruntime(model, passes=[], atol=1e-4)
    _race_free(model)


HEAD_CASES = {
    # attention's Q·Kᵀ and P·V: [batch, heads, 128, 64] x [batch, heads, 64, 128] and back
    "scores": ((2, 3, 128, 64), (2, 3, 64, 128)),
    "values": ((2, 3, 128, 128), (2, 3, 128, 64)),
    # one batch dim (no loop around the heads), sizes off the tile edges
    "one_dim": ((5, 40, 24), (5, 24, 72)),
    # three batch dims; a broadcast along the outermost
    "broadcast_a": ((1, 2, 3, 16, 8), (2, 2, 3, 8, 16)),
}


@pytest.mark.parametrize("case", list(HEAD_CASES))
def test_per_head_products_load_their_operands_once_per_pass(case):
    a, b = HEAD_CASES[case]
    model = one_node_model("MatMul", {"a": a, "b": b})
    compiled = _compile(model)
    assert {"aT_heads", "b_heads"} <= _tiles(compiled)
    b_loads = [
        ins
        for ins in compiled.module.functions[0].instructions()
        if ins.opcode.value == "DmaCopy" and ins.srcs["in"].loc == "b"
    ]
    assert len(b_loads) == 1  # one DMA instruction, once per pass (not per head)
    assert_matches_onnxruntime(model, passes=[])
    _race_free(model)


def _gemm_with_bias():
    return one_node_model(
        "Gemm", {"a": (200, 96)}, initializers={"b": _weights((96, 300)), "c": _weights((300,))}
    )


def test_weights_read_only_as_bf16_operands_are_stored_in_bf16():
    model = _gemm_with_bias()
    compiled = _compile(model, CompileOptions())  # the default autocast: matmult -> bf16
    fn, constants = compiled.module.functions[0], compiled.module.constants
    assert fn.memory_locations["b"].dtype is Dtype.BF16
    expected = _weights((96, 300)).astype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(
        np.asarray(constants["b"]).reshape(96, 300).view(np.uint16), expected.view(np.uint16)
    )
    # The bias is added in fp32 on VectorE: it keeps its dtype.
    assert fn.memory_locations["c"].dtype is Dtype.FP32


def test_casting_weights_at_compile_time_changes_no_output_bit():
    model = _gemm_with_bias()
    compiled = _compile(model, CompileOptions())
    feeds = synthesize_inputs(compiled.graph, 0)
    cast_run = run_checked(compiled.module, feeds)
    # The same program with the weight left in fp32: its loads do the cast instead.
    module = copy.deepcopy(compiled.module)
    fn = module.functions[0]
    fn.memory_locations["b"] = replace(fn.memory_locations["b"], dtype=Dtype.FP32)
    module.constants["b"] = _weights((96, 300))
    fp32_run = run_checked(module, feeds)
    for name, values in cast_run.items():
        np.testing.assert_array_equal(values, fp32_run[name])


def test_no_weight_is_cast_without_the_autocast():
    compiled = _compile(_gemm_with_bias(), CompileOptions(auto_cast="none"))
    locations = compiled.module.functions[0].memory_locations
    assert locations["b"].dtype is Dtype.FP32 and locations["c"].dtype is Dtype.FP32


def test_an_intermediate_read_only_by_matmul_loads_is_stored_in_bf16_with_the_same_result():
    # K transposed by its own node, then Q·Kᵀ: without the memory plan the transpose's result
    # goes through DRAM, written by DMA and read only into bf16 operand tiles.
    nodes = [
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q", "kt"], ["y"]),
    ]
    model = make_model(nodes, {"q": (2, 3, 128, 64), "k": (2, 3, 128, 64)}, {"y": None})
    compiled = _compile(model, CompileOptions(memory_plan=False))
    fn = compiled.module.functions[0]
    assert fn.memory_locations["kt"].dtype is Dtype.BF16
    feeds = synthesize_inputs(compiled.graph, 0)
    cast_run = run_checked(compiled.module, feeds)
    module = copy.deepcopy(compiled.module)
    locations = module.functions[0].memory_locations
    locations["kt"] = replace(locations["kt"], dtype=Dtype.FP32)
    fp32_run = run_checked(module, feeds)
    for name, values in cast_run.items():
        np.testing.assert_array_equal(values, fp32_run[name])


def test_a_constant_weight_read_transposed_is_stored_transposed_in_bf16():
    # A classifier's Linear: Gemm(x, W, c, transB=1) with W [N, K] constant.
    w = _weights((300, 96))
    c = _weights((300,), seed=5)
    model = one_node_model("Gemm", {"a": (200, 96)}, initializers={"b": w, "c": c}, transB=1)
    compiled = _compile(model, CompileOptions())
    locations = compiled.module.functions[0].memory_locations
    stored = [loc for name, loc in locations.items() if name.endswith("/b.T")]
    assert "b" not in locations and len(stored) == 1
    assert stored[0].dtype is Dtype.BF16 and stored[0].shape == (96, 300)
    # The same product spelled with the weight already transposed computes the same bits.
    plain = one_node_model(
        "Gemm", {"a": (200, 96)}, initializers={"b": np.ascontiguousarray(w.T), "c": c}
    )
    feeds = synthesize_inputs(compiled.graph, 0)
    got = run_checked(compiled.module, feeds)
    expected = run_checked(_compile(plain, CompileOptions()).module, feeds)
    for name, values in got.items():
        np.testing.assert_array_equal(values, expected[name])


def test_successive_projections_load_their_weights_into_alternate_copies():
    """Three projections in a row ([1, 128, 256] through 256 x 640 and two 640 x 640 weights,
    the encoder form at batch 1): each holds b in two copies and loads the one away from the
    previous node's weights (docs/buffers.md#weights), or its arena is apart from the previous
    node's (docs/memory_planner.md#allocation); either way the bytes it loads a weight into
    are not those the node before read its weight from, so no weight DMA waits for a matmul
    of the node before it; the chain matches onnxruntime, race-free under a random schedule."""
    nodes = [
        helper.make_node("MatMul", ["x", "w0"], ["h0"], name="p0"),
        helper.make_node("MatMul", ["h0", "w1"], ["h1"], name="p1"),
        helper.make_node("MatMul", ["h1", "w2"], ["y"], name="p2"),
    ]
    weights = {f"w{i}": _weights((256 if i == 0 else 640, 640), seed=i) for i in range(3)}
    model = make_model(nodes, {"x": (1, 128, 256)}, {"y": None}, initializers=weights)
    fn = _compile(model).module.functions[0]
    instructions = {ins.id: ins for ins in fn.instructions()}
    spans: dict[str, set[tuple[int, int]]] = {}  # SBUF bytes of each weight's copy
    for ins in instructions.values():
        source = ins.srcs.get("in")
        if ins.opcode.value != "DmaCopy" or source is None or source.loc not in weights:
            continue
        index = int(source.loc[1:])
        tile = fn.memory_locations[ins.dst.loc]
        half = tile.bytes_per_partition // 2
        start = tile.address + (half if ins.dst.offset >= tile.shape[1] // 2 else 0)
        spans.setdefault(source.loc, set()).add((start, start + half))
        waited = [instructions[d.source] for d in ins.deps]
        assert not [
            w for w in waited if w.opcode.value == "Matmult" and w.origin.node == f"p{index - 1}"
        ]
    assert sorted(len(c) for c in spans.values()) == [1, 1, 1]  # one copy per node
    for before, after in (("w0", "w1"), ("w1", "w2")):  # neighbours' copies apart
        ((a0, a1),), ((b0, b1),) = spans[before], spans[after]
        assert a1 <= b0 or b1 <= a0
    assert_matches_onnxruntime(model, passes=[], atol=1e-4)
    _race_free(model)
