"""Elementwise ops with broadcast operands (lower_elementwise, lower_logic): an operand that
repeats along a loop is loaded once before it or read from its SBUF home, ops compute straight
from and into SBUF homes, and a mask shaped [B, 1, T, T] runs on 128 partitions. Every model is
checked against onnxruntime and run race-free under a random schedule."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import FP32_ATOL, FP32_RTOL, IR_VERSION
from onnx import TensorProto, helper, numpy_helper

from onnx2bir.bir.enums import MemoryType, Opcode
from onnx2bir.bir.ir import Loop
from onnx2bir.bir.verify import verify_module
from onnx2bir.codegen.residency import preferred_row
from onnx2bir.compiler import compile_model, import_graph
from onnx2bir.options import CompileOptions
from onnx2bir.runtime.machine.interpreter import run_function
from onnx2bir.runtime.machine.schedule import parse_schedule, run_scheduled
from onnx2bir.runtime.oracle.ort import run_onnxruntime

B, H, T, D = 2, 4, 128, 64


def _attention_scores(mask_from_graph: bool):
    """scores = (q @ k) * 0.125 + mask, softmax over the last dim. The mask [B, 1, T, T] is a
    graph input, or built as BERT builds it: And of a [1, 1, T, 1] and a [B, 1, 1, T] bool,
    then Where(cond, 0, -10000)."""
    f32 = TensorProto.FLOAT
    nodes = [
        helper.make_node("MatMul", ["q", "k"], ["scores"], name="qk"),
        helper.make_node("Mul", ["scores", "scale"], ["scaled"], name="scale_mul"),
        helper.make_node("Add", ["scaled", "mask"], ["masked"], name="mask_add"),
        helper.make_node("Softmax", ["masked"], ["y"], axis=-1, name="softmax"),
    ]
    inputs = [
        helper.make_tensor_value_info("q", f32, [B, H, T, D]),
        helper.make_tensor_value_info("k", f32, [B, H, D, T]),
    ]
    inits = [numpy_helper.from_array(np.array(0.125, np.float32), "scale")]
    if mask_from_graph:
        rows = np.arange(T) % 3 != 1  # some rows keep nothing of the second factor
        inits += [
            numpy_helper.from_array(rows.reshape(1, 1, T, 1), "rows"),
            numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
            numpy_helper.from_array(np.array(-10000.0, np.float32), "low"),
        ]
        inputs.append(helper.make_tensor_value_info("keep", TensorProto.BOOL, [B, 1, 1, T]))
        nodes[:0] = [
            helper.make_node("And", ["rows", "keep"], ["cond"], name="cond_and"),
            helper.make_node("Where", ["cond", "zero", "low"], ["mask"], name="mask_where"),
        ]
    else:
        inputs.append(helper.make_tensor_value_info("mask", f32, [B, 1, T, T]))
    graph = helper.make_graph(
        nodes, "scores", inputs, [helper.make_tensor_value_info("y", f32, None)], inits
    )
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=IR_VERSION
    )


def _feeds(mask_from_graph: bool) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    feeds = {
        "q": rng.standard_normal((B, H, T, D)).astype(np.float32),
        "k": rng.standard_normal((B, H, D, T)).astype(np.float32),
    }
    if mask_from_graph:
        feeds["keep"] = rng.random((B, 1, 1, T)) < 0.7
    else:
        feeds["mask"] = np.where(rng.random((B, 1, T, T)) < 0.7, 0.0, -10000.0).astype(np.float32)
    return feeds


def _compile_and_check(model, feeds, **options):
    # fp32 matmuls (no autocast to bf16), so the comparison can be tight.
    compilation = compile_model(model, CompileOptions(auto_cast="none", **options))
    assert not verify_module(compilation.module)
    got = run_function(compilation.module, feeds)
    want = run_onnxruntime(model, feeds)
    np.testing.assert_allclose(got["y"], want["y"], rtol=FP32_RTOL, atol=FP32_ATOL)
    scheduled = run_scheduled(compilation.module, feeds, parse_schedule("random:1"), True)
    assert scheduled.race_count == 0, scheduled.races[:3]
    np.testing.assert_array_equal(scheduled.outputs["y"], got["y"])
    return compilation


def _instances(block, node: str, trips: int = 1, found=None) -> list[tuple[object, int]]:
    """(instruction, how many times it runs) for every instruction of `node`."""
    found = [] if found is None else found
    for item in block.items:
        if isinstance(item, Loop):
            _instances(item.body, node, trips * item.trip_count, found)
        elif item.origin.node == node:
            found.append((item, trips))
    return found


@pytest.mark.parametrize("memory_plan", [True, False], ids=["plan", "no_plan"])
def test_a_mask_shared_by_the_heads_is_loaded_once_per_batch(memory_plan):
    model = _attention_scores(mask_from_graph=False)
    compilation = _compile_and_check(model, _feeds(False), memory_plan=memory_plan)
    add = _instances(compilation.module.functions[0].entry, "mask_add")
    loads = [(i, n) for i, n in add if i.opcode is Opcode.DMA_COPY and i.srcs["in"].loc == "mask"]
    # One [T, T] load per batch, not one per (batch, head).
    assert sum(n for _, n in loads) == B
    assert all(i.dst.num_partitions == T for i, _ in loads)


def test_the_scores_scale_and_mask_compute_in_their_sbuf_homes():
    model = _attention_scores(mask_from_graph=True)
    compilation = _compile_and_check(model, _feeds(True))
    function = compilation.module.functions[0]
    for tensor in ("scaled", "mask", "cond"):
        assert function.memory_locations[tensor].memory is MemoryType.SB, tensor
    entry = function.entry
    # The scale Mul runs on the product's eviction (patterns/matmul_scale.py): no pass of
    # its own; each of qk's output tiles is evicted times 0.125 straight into scaled's home.
    assert not _instances(entry, "scale_mul")
    evictions = [
        (i, n)
        for i, n in _instances(entry, "qk")
        if i.opcode is Opcode.ACTIVATION and i.dst.loc == "scaled"
    ]
    assert sum(n for _, n in evictions) == B * H * T * T // (128 * 128)
    assert all(i.attrs["scale"] == 0.125 for i, _ in evictions)
    # The mask Add: one TensorTensor per tile, the mask read in its home by every head.
    add = _instances(entry, "mask_add")
    assert {i.opcode for i, _ in add} == {Opcode.TENSOR_TENSOR}
    assert all(i.srcs["in1"].loc == "mask" for i, _ in add)
    # The Where: on 128 partitions (rows of T), the condition and result in their homes.
    where = [i for i, _ in _instances(entry, "mask_where")]
    computed = [i for i in where if i.opcode in (Opcode.TENSOR_COPY, Opcode.COPY_PREDICATED)]
    assert computed and all(i.dst.loc == "mask" for i in computed)
    assert all(i.dst.num_partitions == 128 for i in computed)
    predicated = [i for i in computed if i.opcode is Opcode.COPY_PREDICATED]
    assert all(i.srcs["predicate"].loc == "cond" for i in predicated)
    # Its constant branches are filled as wide as one tile, not a whole double-buffered tile.
    fills = [i for i in where if i.opcode is Opcode.MEMSET]
    assert len(fills) == 2 and all(math.prod(n for _, n in i.dst.pattern) == T for i in fills)


def test_the_mask_on_128_partitions_without_the_plan_matches_onnxruntime():
    model = _attention_scores(mask_from_graph=True)
    compilation = _compile_and_check(model, _feeds(True), memory_plan=False)
    where = [i for i, _ in _instances(compilation.module.functions[0].entry, "mask_where")]
    assert all(i.dst.num_partitions == 128 for i in where if i.opcode is Opcode.COPY_PREDICATED)


def test_a_broadcast_operand_keeps_the_rows_of_the_output_it_is_combined_into():
    graph = import_graph(_attention_scores(mask_from_graph=True))
    # The mask and its condition are [B, 1, T, T]: rows of T next to the softmax, not the
    # canonical [T, T] plane that would put only B rows on partitions.
    assert preferred_row(graph, "mask") == T
    assert preferred_row(graph, "cond") == T


def test_a_broadcast_with_other_trailing_dims_is_not_followed():
    # [B, H, T, 1] (a row statistic) broadcast into [B, H, T, T] has other rows.
    f32 = TensorProto.FLOAT
    nodes = [
        helper.make_node("Neg", ["s"], ["n"]),
        helper.make_node("Sub", ["x", "n"], ["d"]),
        helper.make_node("Softmax", ["d"], ["y"], axis=-1),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info("x", f32, [B, H, T, T]),
            helper.make_tensor_value_info("s", f32, [B, H, T, 1]),
        ],
        [helper.make_tensor_value_info("y", f32, [B, H, T, T])],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=IR_VERSION
    )
    imported = import_graph(model)
    assert preferred_row(imported, "d") == T
    # Canonical (the dims after the second, T x 1), not the last dim 1 that following the
    # broadcast to the softmax's rows would give.
    assert preferred_row(imported, "n") == T


def _bias_add(rows: int, cols: int, bias: np.ndarray, op: str = "Add"):
    f32 = TensorProto.FLOAT
    graph = helper.make_graph(
        [helper.make_node(op, ["x", "b"], ["y"], name="bias")],
        "bias",
        [helper.make_tensor_value_info("x", f32, [4, rows // 4, cols])],
        [helper.make_tensor_value_info("y", f32, [4, rows // 4, cols])],
        [numpy_helper.from_array(bias, "b")],
    )
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=IR_VERSION
    )


@pytest.mark.parametrize("memory_plan", [True, False], ids=["plan", "no_plan"])
@pytest.mark.parametrize("op", ["Add", "Mul"])
def test_a_bias_row_is_loaded_once_and_copied_down_the_partitions_on_the_pe(memory_plan, op):
    rng = np.random.default_rng(3)
    bias = rng.standard_normal(768).astype(np.float32)
    bias[:3] = [np.inf, 0.0, np.nan]  # copied bit for bit: 1 · x, rounded once
    model = _bias_add(512, 768, bias, op)
    x = rng.standard_normal((4, 128, 768)).astype(np.float32)
    compilation = compile_model(model, CompileOptions(memory_plan=memory_plan))
    assert not verify_module(compilation.module)
    got = run_function(compilation.module, {"x": x})["y"]
    want = run_onnxruntime(model, {"x": x})["y"]
    # One fp32 op per element, as onnxruntime: the same bits.
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    scheduled = run_scheduled(compilation.module, {"x": x}, parse_schedule("random:1"), True)
    assert scheduled.race_count == 0, scheduled.races[:3]
    np.testing.assert_array_equal(scheduled.outputs["y"], got)
    found = _instances(compilation.module.functions[0].entry, "bias")
    loads = [(i, n) for i, n in found if i.opcode is Opcode.DMA_COPY and i.srcs["in"].loc == "b"]
    # The row crosses DMA once, 768 elements on one partition (not 128 copies of it) ...
    assert [(i.dst.num_partitions, n) for i, n in loads] == [(1, 1)]
    # ... and two matmuls (512 + 256 columns, one PSUM bank each) copy it down 128 partitions.
    matmuls = [i for i, _ in found if i.opcode is Opcode.MATMULT]
    assert [i.dst.num_partitions for i in matmuls] == [128, 128]
    computed = [i for i, _ in found if i.opcode is Opcode.TENSOR_TENSOR]
    memories = compilation.module.functions[0].memory_locations
    assert computed and all(memories[i.srcs["in1"].loc].memory is MemoryType.PSUM for i in computed)


def test_a_small_bias_row_keeps_its_broadcast_load():
    # 128 x 64 elements: below the size where the PE copy pays; one partition-broadcast DMA.
    model = _bias_add(512, 64, np.arange(64, dtype=np.float32))
    x = np.random.default_rng(4).standard_normal((4, 128, 64)).astype(np.float32)
    compilation = compile_model(model, CompileOptions())
    got = run_function(compilation.module, {"x": x})["y"]
    np.testing.assert_array_equal(got, run_onnxruntime(model, {"x": x})["y"])
    found = _instances(compilation.module.functions[0].entry, "bias")
    assert not [i for i, _ in found if i.opcode is Opcode.MATMULT]
    loads = [(i, n) for i, n in found if i.opcode is Opcode.DMA_COPY and i.srcs["in"].loc == "b"]
    assert [(i.dst.num_partitions, n) for i, n in loads] == [(128, 1)]


def test_a_bias_with_a_negative_zero_keeps_its_broadcast_load():
    # The PE's sum would turn -0 into +0 (x · -0 would lose its sign): the DMA copies bits.
    bias = np.random.default_rng(5).standard_normal(768).astype(np.float32)
    bias[7] = -0.0
    model = _bias_add(512, 768, bias, "Mul")
    x = np.random.default_rng(6).standard_normal((4, 128, 768)).astype(np.float32)
    compilation = compile_model(model, CompileOptions())
    got = run_function(compilation.module, {"x": x})["y"]
    want = run_onnxruntime(model, {"x": x})["y"]
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    found = _instances(compilation.module.functions[0].entry, "bias")
    assert not [i for i, _ in found if i.opcode is Opcode.MATMULT]


def test_an_output_does_not_take_its_rows_from_a_broadcast_operand():
    # y = x * c with c [1, 1, 16, 16] also feeding a MatMul: c's rows are its last dim, but
    # y [1, 2, 16, 16] keeps its own canonical 16 x 16 planes (as llama's rotary products).
    f32 = TensorProto.FLOAT
    nodes = [
        helper.make_node("Mul", ["x", "c"], ["y"]),
        helper.make_node("MatMul", ["c", "w"], ["z"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info("x", f32, [1, 2, 16, 16]),
            helper.make_tensor_value_info("c", f32, [1, 1, 16, 16]),
            helper.make_tensor_value_info("w", f32, [16, 16]),
        ],
        [
            helper.make_tensor_value_info("y", f32, [1, 2, 16, 16]),
            helper.make_tensor_value_info("z", f32, [1, 1, 16, 16]),
        ],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=IR_VERSION
    )
    imported = import_graph(model)
    assert preferred_row(imported, "c") == 16  # next to the MatMul
    assert preferred_row(imported, "y") == 256
