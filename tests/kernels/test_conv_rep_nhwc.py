"""The rep-NHWC dense conv kernel (C_in x kH rows on partitions) against onnxruntime.

Rows 1 (rep_nhwc: C_in·kH ≤ 128) and 9 (replication: C_in ≤ 64, kernel rows taken in groups)
both select this kernel; the sweep covers both, and a direct rewrite covers C_in > 128
(channel tiles), which no registry row sends to it from an NCHW model.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx2bir.bir.enums import Opcode
from onnx2bir.bir.verify import verify_module
from onnx2bir.compiler import compile_graph, compile_model, import_graph
from onnx2bir.options import CompileOptions
from onnx2bir.patterns.conv.op import conv_op_from_node
from onnx2bir.patterns.conv.selection import (
    FUNCTIONAL_KERNEL_REGISTRY,
    REP_NHWC,
    lower_to_conv_kernel,
)
from onnx2bir.runtime.machine.interpreter import run_function
from onnx2bir.runtime.oracle.compare import compare_output
from onnx2bir.runtime.oracle.ort import run_onnxruntime, synthesize_inputs

FP32 = CompileOptions(auto_cast="none")  # compared at fp32 tolerance: no autocast


def conv_model(x_shape, c_out, kernel, bias, seed, **attrs) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    inits = {"w": rng.standard_normal((c_out, x_shape[1], *kernel)).astype(np.float32)}
    if bias:
        inits["b"] = rng.standard_normal(c_out).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", *inits], ["y"], name="conv", **attrs)],
        "dense",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    return onnx.shape_inference.infer_shapes(model, strict_mode=True)


def run_and_compare(compilation, model, seed=0):
    assert not verify_module(compilation.module)
    rule = f"kernel.{REP_NHWC}"
    matmuls = [
        i
        for i in compilation.module.functions[0].instructions()
        if i.origin.rule == rule and i.opcode is Opcode.MATMULT
    ]
    assert matmuls, "the kernel emitted no matmul"
    feeds = synthesize_inputs(compilation.graph, seed)
    got = run_function(compilation.module, feeds)["y"]
    result = compare_output("y", got, run_onnxruntime(model, feeds)["y"], 1e-4, 1e-3)
    assert result.passed, result.to_json()
    return matmuls


CASES = [
    # x_shape, c_out, kernel, bias, attrs, registry row
    ((1, 3, 32, 32), 16, (3, 3), True, {"pads": [1, 1, 1, 1]}, "rep_nhwc"),
    ((1, 3, 64, 64), 24, (7, 7), True, {"pads": [3, 3, 3, 3], "strides": [2, 2]}, "rep_nhwc"),
    ((2, 16, 15, 17), 40, (3, 3), False, {"pads": [0, 1, 2, 1]}, "rep_nhwc"),
    ((1, 8, 20, 20), 130, (5, 5), True, {"dilations": [2, 2], "pads": [4, 4, 4, 4]}, "rep_nhwc"),
    ((1, 128, 9, 9), 200, (1, 1), True, {}, "rep_nhwc"),
    ((1, 4, 3, 700), 8, (3, 3), False, {"pads": [1, 1, 1, 1]}, "rep_nhwc"),
    ((1, 4, 30, 30), 8, (3, 3), True, {"strides": [3, 2], "auto_pad": "SAME_UPPER"}, "rep_nhwc"),
    ((1, 64, 12, 12), 64, (3, 3), True, {"pads": [1, 1, 1, 1]}, "replication"),
    ((2, 48, 10, 11), 96, (5, 3), False, {"pads": [2, 1, 2, 1], "strides": [2, 1]}, "replication"),
    # C_in 44 with 49 taps is not low (2 taps a matmul: 25 > 49 / 2), so K-replication.
    ((1, 44, 8, 8), 32, (7, 7), True, {"pads": [3, 3, 3, 3]}, "replication"),
]


@pytest.mark.parametrize("x_shape, c_out, kernel, bias, attrs, row", CASES)
def test_rep_nhwc_matches_onnxruntime(x_shape, c_out, kernel, bias, attrs, row):
    model = conv_model(x_shape, c_out, kernel, bias, seed=sum(x_shape), **attrs)
    compilation = compile_model(model, FP32)
    (finding,) = compilation.passes.result_of("TransformConvOp").findings
    assert (finding["kernel"], finding["registry_entry"]) == (REP_NHWC, row), finding["walk"]
    matmuls = run_and_compare(compilation, model)
    rows_per_matmul = {m.srcs["moving"].num_partitions for m in matmuls}
    c_in, k_h = x_shape[1], kernel[0]
    # Replication: every matmul contracts over whole groups of kernel rows x all channels.
    assert max(rows_per_matmul) == min(k_h, 128 // c_in) * c_in


def test_one_matmul_per_column_tap_when_all_rows_fit():
    model = conv_model((1, 3, 16, 16), 8, (3, 5), False, seed=1, pads=[1, 2, 1, 2])
    compilation = compile_model(model, FP32)
    matmuls = run_and_compare(compilation, model)
    # 16x16 output = 256 pixels, one PSUM tile: kW = 5 matmuls in all (the generic path: 15).
    assert len(matmuls) == 5


def test_wide_channels_take_channel_tiles():
    """C_in = 200 > 128: no row selects rep_nhwc, so force it to cover the channel tiles."""
    model = conv_model((1, 200, 6, 6), 20, (3, 3), True, seed=3, pads=[1, 1, 1, 1])
    graph = import_graph(model)
    op = conv_op_from_node(graph, "conv")
    lower_to_conv_kernel(graph, op, FUNCTIONAL_KERNEL_REGISTRY[0])
    compilation = compile_graph(graph, FP32, passes=[])
    matmuls = run_and_compare(compilation, model)
    assert {m.srcs["moving"].num_partitions for m in matmuls} == {128, 72}


@pytest.mark.parametrize(
    "x_shape, kernel",
    [((1, 64, 40, 40), (3, 3)), ((1, 200, 6, 6), (3, 3))],
    ids=["two row groups", "two channel tiles"],
)
def test_band_loads_do_not_wait_for_the_other_bands_matmuls(x_shape, kernel):
    """C_in 64 x kH 3: kernel rows in groups of 2 and 1; C_in 200: channel tiles of 128 and
    72 (forced onto the kernel: no registry row sends C_in > 128 to it). Each (row group,
    channel tile) has a band of its own, so within an output tile no band load waits for a
    matmul: its only waits are for the matmuls that read its copy trips before (edges
    carried by the output-tile loop). Sharing one band, the second group's load would wait
    for the first group's matmuls, once per output tile."""
    model = conv_model(x_shape, 32, kernel, True, seed=5, pads=[1, 1, 1, 1])
    graph = import_graph(model)
    lower_to_conv_kernel(graph, conv_op_from_node(graph, "conv"), FUNCTIONAL_KERNEL_REGISTRY[0])
    compilation = compile_graph(graph, FP32, passes=[])
    run_and_compare(compilation, model)
    fn = compilation.module.functions[0]
    by_id = {i.id: i for i in fn.instructions()}
    # DMAs, or engine copies when the input is resident in SBUF
    band_loads = [i for i in fn.instructions() if i.dst is not None and "/band" in i.dst.loc]
    assert len({i.dst.offset for i in band_loads}) >= 2
    for load in band_loads:
        for dep in load.deps:
            if by_id[dep.source].opcode is Opcode.MATMULT:
                assert dep.carried_by is not None, f"{load} waits for {by_id[dep.source]}"


def test_whole_weights_read_each_band_once_for_every_output_block():
    """C_out 200 takes two 128-channel blocks; the weights (200 x 128 of a 1x1 conv) fit whole,
    so the output tile's band is read once and serves both blocks, each evicted on its own
    rotating copy. Held per block instead, the band was read once per block."""
    model = conv_model((1, 128, 9, 9), 200, (1, 1), True, seed=7)
    compilation = compile_model(model, FP32)
    matmuls = run_and_compare(compilation, model)
    fn = compilation.module.functions[0]
    band_reads = [
        i
        for i in fn.instructions()
        if i.origin.rule == f"kernel.{REP_NHWC}" and any(ap.loc == "x" for ap in i.srcs.values())
    ]
    # 81 output pixels: one output tile, one row group of one kernel row: one read of x.
    assert len(band_reads) == 1
    assert {m.dst.num_partitions for m in matmuls} == {128, 72}
