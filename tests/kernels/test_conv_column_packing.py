"""The column-packing conv kernels against onnxruntime, and the selector rows that reach them.

Each case is a one-node ONNX model compiled with the default passes; the test asserts that
TransformConvOp chose the expected kernel, that the BIR carries instructions of rule
`kernel.<name>` and passes the verifier, and that the machine model matches onnxruntime on
seeded inputs (atol 1e-4, rtol 1e-3).

- conv2d_column_packing: dense convs the higher-priority rep_nhwc row refuses, either because
  C_in·kH > 128 (C_in ≤ 32) or because the replicated input overflows its SBUF budget (wide).
- conv2d_column_packing_1: depthwise ConvTranspose as ONNX stores it (io01 weights): the
  bridge to the row's oi01 layout only relabels the unit axis (docs/conv_backward.md).
- conv2d_column_packing_io10: a depthwise ConvTranspose whose weight is computed and arrives
  through a Transpose that swaps its spatial axes: read through that transpose, the kernel is
  io10, which reaches oi01 only by moving every tap, so row 2 refuses and row 4 takes it.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import make_model
from onnx import helper

from onnx2bir.bir.enums import Opcode
from onnx2bir.bir.verify import verify_module
from onnx2bir.compiler import compile_model, import_graph
from onnx2bir.kernels.conv.column_packing import TapBlock, tap_groups
from onnx2bir.options import CompileOptions
from onnx2bir.patterns.conv.op import conv_op_from_node
from onnx2bir.patterns.conv.selection import (
    COLUMN_PACKING,
    COLUMN_PACKING_1,
    COLUMN_PACKING_IO10,
    match_conv_depthwise_backward,
    select_kernel,
)
from onnx2bir.runtime.machine.interpreter import run_function
from onnx2bir.runtime.oracle.compare import compare_output
from onnx2bir.runtime.oracle.ort import run_onnxruntime, synthesize_inputs

FP32 = CompileOptions(auto_cast="none")  # compared at fp32 tolerance: no autocast

ATOL, RTOL = 1e-4, 1e-3


def conv_model(op_type: str, x_shape, w_shape, bias: bool, seed: int = 0, **attrs):
    """y = op_type(x, w[, b]) with seeded constant weights."""
    rng = np.random.default_rng(seed)
    inits = {"w": rng.standard_normal(w_shape).astype(np.float32)}
    if bias:
        channels = w_shape[0] if op_type == "Conv" else w_shape[1] * attrs.get("group", 1)
        inits["b"] = rng.standard_normal(channels).astype(np.float32)
    node = helper.make_node(op_type, ["x", *inits], ["y"], **attrs)
    return make_model(node, {"x": x_shape}, {"y": None}, initializers=inits)


def run_and_compare(model, compilation, kernel: str, seed: int = 0):
    """Kernel emitted, BIR well formed, outputs equal to onnxruntime's; returns the module."""
    rule = f"kernel.{kernel}"
    emitted = [i for i in compilation.module.functions[0].instructions() if i.origin.rule == rule]
    assert emitted, f"no instruction of rule {rule}"
    problems = verify_module(compilation.module)
    assert not problems, "\n".join(problems[:10])
    feeds = synthesize_inputs(compilation.graph, seed)
    got = run_function(compilation.module, feeds)
    ref = run_onnxruntime(model, feeds)
    result = compare_output("y", got["y"], ref["y"], ATOL, RTOL)
    assert result.passed, result.to_json()
    return emitted


def check(model, kernel: str, seed: int = 0):
    compilation = compile_model(model, FP32)
    findings = compilation.passes.result_of("TransformConvOp").findings
    assert [f["kernel"] for f in findings] == [kernel], findings
    return run_and_compare(model, compilation, kernel, seed)


# --- conv2d_column_packing: dense, low C_in --------------------------------------------------
# (x shape, w shape, bias, attributes)
DENSE_CASES = {
    # C_in·kH > 128: rep_nhwc refuses.
    "c16_k9": ((1, 16, 12, 12), (4, 16, 9, 9), True, {}),
    "c16_k9x3_pads": ((1, 16, 10, 8), (6, 16, 9, 3), False, {"pads": [4, 1, 4, 1]}),
    "c32_k5_stride2_asym": (
        (2, 32, 11, 10),
        (8, 32, 5, 5),
        True,
        {"strides": [2, 2], "pads": [2, 1, 1, 2]},
    ),
    "c20_k7x3_dil_cout140": (
        (1, 20, 14, 9),
        (140, 20, 7, 3),
        True,
        {"strides": [1, 2], "dilations": [2, 1], "pads": [3, 1, 0, 2]},
    ),
    "c24_k6_same_upper": (
        (1, 24, 9, 9),
        (5, 24, 6, 4),
        True,
        {"auto_pad": "SAME_UPPER", "strides": [2, 1]},
    ),
    "c16_k9_out32x32": ((1, 16, 40, 40), (3, 16, 9, 9), False, {}),
    # Replicated input over the rep_nhwc SBUF budget (out_h · padded_w · 4 > 176 KiB).
    "wide_3x3": ((1, 3, 8, 30000), (4, 3, 3, 3), False, {"pads": [1, 1, 1, 1]}),
    "wide_stride_dil_batch2": (
        (2, 2, 9, 24000),
        (3, 2, 3, 3),
        True,
        {"strides": [1, 2], "dilations": [2, 1], "pads": [1, 0, 2, 1]},
    ),
    "wide_1d": ((1, 4, 50000), (3, 4, 5), True, {"pads": [2, 1]}),
}


@pytest.mark.parametrize("case", DENSE_CASES)
def test_column_packing_dense(case):
    x_shape, w_shape, bias, attrs = DENSE_CASES[case]
    check(conv_model("Conv", x_shape, w_shape, bias, **attrs), COLUMN_PACKING)


def dense_sweep(seed: int):
    """A random dense conv with 15 ≤ C_in ≤ 32 and C_in·kH > 128 (so rep_nhwc refuses)."""
    rng = np.random.default_rng(seed)
    c_in = int(rng.integers(15, 33))
    k_h = int(rng.integers(-(-129 // c_in), 10))
    k_w = int(rng.integers(1, 5))
    strides = [int(s) for s in rng.integers(1, 3, 2)]
    dilations = [int(d) for d in rng.integers(1, 3, 2)]
    extent = [d * (k - 1) + 1 for d, k in zip(dilations, (k_h, k_w), strict=True)]
    pads = [int(rng.integers(0, e)) for e in extent + extent]  # begins, then ends
    spatial = [e + int(rng.integers(0, 8)) for e in extent]
    attrs = {"strides": strides, "dilations": dilations, "pads": pads}
    batch = int(rng.integers(1, 3))
    c_out = int(rng.choice([3, 17, 130]))
    return (batch, c_in, *spatial), (c_out, c_in, k_h, k_w), bool(rng.integers(0, 2)), attrs


@pytest.mark.parametrize("seed", range(12))
def test_column_packing_dense_sweep(seed):
    x_shape, w_shape, bias, attrs = dense_sweep(seed)
    check(conv_model("Conv", x_shape, w_shape, bias, seed, **attrs), COLUMN_PACKING, seed)


def test_column_packing_dense_uses_minimum_matmuls():
    """81 taps x 16 channels = 1296 partitions: ⌈1296 / 128⌉ = 11 matmuls per output tile."""
    emitted = check(conv_model("Conv", (1, 16, 12, 12), (4, 16, 9, 9), False), COLUMN_PACKING)
    matmuls = [i for i in emitted if i.opcode is Opcode.MATMULT]
    assert len(matmuls) == 11
    assert [i.srcs["moving"].num_partitions for i in matmuls] == [128] * 10 + [16]


# --- conv2d_column_packing_1: depthwise ConvTranspose -------------------------------------------
# (x shape, kernel (kH, kW), bias, attributes); w is [C, 1, kH, kW], group = C.
TRANSPOSED_CASES = {
    "s2_k3_p1": ((1, 6, 5, 5), (3, 3), True, {"strides": [2, 2], "pads": [1, 1, 1, 1]}),
    "s1_k3_p0": ((2, 5, 6, 7), (3, 3), False, {}),
    "s3_k2x3_outpad": (
        (2, 20, 4, 5),
        (2, 3),
        False,
        {"strides": [3, 2], "pads": [0, 1, 1, 0], "output_padding": [1, 1]},
    ),
    "s2_k4_c40": ((1, 40, 6, 6), (4, 4), True, {"strides": [2, 2], "pads": [1, 2, 2, 1]}),
    "negative_padding": ((1, 4, 5, 5), (2, 2), True, {"strides": [2, 2], "pads": [2, 2, 1, 2]}),
    "negative_padding_s3": ((1, 3, 6, 7), (3, 3), True, {"strides": [3, 3], "pads": [3, 3, 3, 3]}),
    "same_upper": ((1, 5, 5, 6), (3, 3), True, {"strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    "same_lower": ((1, 5, 5, 6), (3, 3), True, {"strides": [2, 2], "auto_pad": "SAME_LOWER"}),
    "1d": ((2, 5, 17), (4,), True, {"strides": [3], "pads": [1, 2]}),
    "big_output_tiles": ((1, 3, 20, 30), (3, 3), True, {"strides": [2, 2], "pads": [0, 1, 1, 0]}),
    "k12_two_groups": ((1, 3, 6, 7), (12, 12), True, {"strides": [4, 4], "pads": [3, 3, 4, 4]}),
    "k5x50_multiblock": ((1, 2, 3, 4), (5, 50), True, {}),
}


def transposed_model(x_shape, kernel, bias, seed=0, **attrs):
    channels = x_shape[1]
    return conv_model(
        "ConvTranspose", x_shape, (channels, 1, *kernel), bias, seed, group=channels, **attrs
    )


@pytest.mark.parametrize("case", TRANSPOSED_CASES)
def test_column_packing_1(case):
    x_shape, kernel, bias, attrs = TRANSPOSED_CASES[case]
    check(transposed_model(x_shape, kernel, bias, **attrs), COLUMN_PACKING_1)


def transposed_sweep(seed: int):
    """A random depthwise ConvTranspose: stride 1-3, kernel 2-4, pads 0..k (k − 1 < pad gives
    a negative backward padding), output_padding < stride, batch 1-2, up to 40 channels."""
    rng = np.random.default_rng(1000 + seed)
    kernel = [int(k) for k in rng.integers(2, 5, 2)]
    strides = [int(s) for s in rng.integers(1, 4, 2)]
    pads = [int(rng.integers(0, k + 1)) for k in kernel + kernel]  # begins, then ends
    output_padding = [int(rng.integers(0, s)) for s in strides]
    # Output size s·(in − 1) + output_padding + k − pads must be positive.
    spatial = [
        max(int(rng.integers(2, 8)), 2 + (pads[a] + pads[a + 2] - kernel[a]) // strides[a])
        for a in range(2)
    ]
    x_shape = (int(rng.integers(1, 3)), int(rng.integers(1, 40)), *spatial)
    attrs = {"strides": strides, "pads": pads, "output_padding": output_padding}
    return x_shape, tuple(kernel), bool(rng.integers(0, 2)), attrs


@pytest.mark.parametrize("seed", range(16))
def test_column_packing_1_sweep(seed):
    x_shape, kernel, bias, attrs = transposed_sweep(seed)
    check(transposed_model(x_shape, kernel, bias, seed, **attrs), COLUMN_PACKING_1, seed)


def test_column_packing_1_packs_channels():
    """9 taps: 14 channels (126 partitions) per matmul, 20 channels in two matmuls."""
    emitted = check(transposed_model((1, 20, 4, 4), (3, 3), True, strides=[2, 2]), COLUMN_PACKING_1)
    matmuls = [i for i in emitted if i.opcode is Opcode.MATMULT]
    assert [
        (i.srcs["stationary"].num_partitions, i.srcs["stationary"].free_size) for i in matmuls
    ] == [(126, 14), (54, 6)]


def test_column_packing_1_dilated():
    """A dilated depthwise ConvTranspose: dilation rides in lhs_dilation (backward form)."""
    model = transposed_model((1, 4, 3, 3), (3, 3), True, strides=[2, 2], dilations=[2, 2])
    graph = import_graph(model)
    op = conv_op_from_node(graph, "ConvTranspose_0")
    assert op.lhs_dilation == [2, 2] and op.rhs_dilation == [2, 2]
    check(model, COLUMN_PACKING_1)


def test_onnx_weights_bridge_to_row_2_without_moving_data():
    """ONNX's io01 depthwise kernel reaches oi01 by relabeling; io10 would move the taps."""
    graph = import_graph(transposed_model((1, 4, 3, 3), (3, 3), False))
    op = conv_op_from_node(graph, "ConvTranspose_0")
    assert match_conv_depthwise_backward(op, kernel_layout="oi01") is None
    assert "only by moving data" in match_conv_depthwise_backward(op, kernel_layout="io10")
    selection = select_kernel(op, CompileOptions())
    assert selection.kernel.name == COLUMN_PACKING_1
    assert [label for label, _ in selection.refusals] == ["rep_nhwc"]


# --- conv2d_column_packing_io10: the kernel arrives with swapped spatial axes -------------------
def predicted_filter_model(x_shape, kernel, bias: bool, seed: int = 0, **attrs):
    """y = ConvTranspose(x, Transpose(f, [0, 1, 3, 2])): the filter f [C, 1, kW, kH] is an input
    (a predicted, per-call filter), so the transpose stays in the graph."""
    rng = np.random.default_rng(seed)
    channels = x_shape[1]
    k_h, k_w = kernel
    inits = {}
    inputs = ["x", "w"]
    if bias:
        inits["b"] = rng.standard_normal(channels).astype(np.float32)
        inputs.append("b")
    nodes = [
        helper.make_node("Transpose", ["f"], ["w"], perm=[0, 1, 3, 2]),
        helper.make_node("ConvTranspose", inputs, ["y"], group=channels, **attrs),
    ]
    return make_model(
        nodes, {"x": x_shape, "f": (channels, 1, k_w, k_h)}, {"y": None}, initializers=inits
    )


@pytest.mark.parametrize(
    "case", ["s2_k3_p1", "s3_k2x3_outpad", "negative_padding", "s2_k4_c40", "k5x50_multiblock"]
)
def test_column_packing_io10(case):
    x_shape, kernel, bias, attrs = TRANSPOSED_CASES[case]
    model = predicted_filter_model(x_shape, kernel, bias, **attrs)
    graph = import_graph(model)
    op = conv_op_from_node(graph, "ConvTranspose_1")
    assert op.kern_perm == (1, 0, 3, 2) and op.inputs[1] == "f"  # read through the transpose
    check(model, COLUMN_PACKING_IO10)


def test_io10_row_refusal_reason_names_the_bridge():
    graph = import_graph(predicted_filter_model((1, 4, 3, 3), (3, 2), False, strides=[2, 2]))
    selection = select_kernel(conv_op_from_node(graph, "ConvTranspose_1"), CompileOptions())
    refusals = dict(selection.refusals)
    assert "only by moving data (transpose [1, 0, 3, 2])" in refusals["column_packing_1"]
    assert selection.kernel.name == COLUMN_PACKING_IO10


@pytest.mark.parametrize(
    ("x_shape", "w_shape", "winner", "refused"),
    [
        # Narrow: the replicated input fits, so rep_nhwc (priority 1) wins before column packing.
        ((1, 3, 8, 30), (4, 3, 3, 3), "rep_nhwc", None),
        # 27 taps: C_in 43 stacks 2 per matmul (14 matmuls), not half of 27: replication.
        ((1, 43, 8, 8), (4, 43, 9, 3), "replication", "C_in 43 is not low"),
        # Wide 1x1: rep_nhwc is over budget, nothing to pack or replicate: generic path.
        ((1, 16, 4, 30000), (4, 16, 1, 1), None, "a 1x1 kernel"),
    ],
)
def test_no_match_dense(x_shape, w_shape, winner, refused):
    graph = import_graph(conv_model("Conv", x_shape, w_shape, False))
    selection = select_kernel(conv_op_from_node(graph, "Conv_0"), CompileOptions())
    assert (selection.kernel.label if selection.kernel else None) == winner
    if refused is not None:
        assert refused in dict(selection.refusals)["column_packing"]


# --- tap grouping --------------------------------------------------------------------------------
def test_tap_groups_whole_rows():
    """kW·C_in ≤ 128 and rows cost no extra matmul: one rectangle per group, balanced rows."""
    assert tap_groups(7, 3, 20) == [
        (TapBlock(0, 2, 0, 3, 0),),
        (TapBlock(2, 2, 0, 3, 0),),
        (TapBlock(4, 2, 0, 3, 0),),
        (TapBlock(6, 1, 0, 3, 0),),
    ]
    assert tap_groups(3, 3, 1) == [(TapBlock(0, 3, 0, 3, 0),)]


def test_tap_groups_runs():
    """Rows would waste matmuls (or do not fit): runs of 128 // C_in taps across rows."""
    groups = tap_groups(9, 9, 16)
    assert len(groups) == 11
    assert groups[1] == (TapBlock(0, 1, 8, 1, 0), TapBlock(1, 1, 0, 7, 1))
    for k_h, k_w, width in [(9, 9, 16), (9, 3, 16), (5, 50, 1), (5, 5, 32), (12, 12, 1)]:
        groups = tap_groups(k_h, k_w, width)
        covered = sorted(
            (block.row + r, block.col + c)
            for group in groups
            for block in group
            for r in range(block.rows)
            for c in range(block.cols)
        )
        assert covered == [(i, j) for i in range(k_h) for j in range(k_w)]
        assert all(sum(b.taps for b in g) * width <= 128 for g in groups)


def test_committed_depthwise_upsample_model_selects_both_rows(capsys):
    """models/depthwise_upsample.onnx: the fixed filter takes row 2, the predicted one row 4;
    the model validates and `report --explain` shows the backward encoding."""
    from pathlib import Path

    from onnx2bir.cli.commands import main

    path = Path(__file__).parents[2] / "models" / "depthwise_upsample.onnx"
    compilation = compile_model(path)
    findings = compilation.passes.result_of("TransformConvOp").findings
    assert {f["node"]: f["kernel"] for f in findings} == {
        "up_fixed": COLUMN_PACKING_1,
        "up_predicted": COLUMN_PACKING_IO10,
    }
    assert main(["validate", str(path)]) == 0
    assert "PASS" in capsys.readouterr().out
    assert main(["report", str(path), "--explain", "up_fixed"]) == 0
    text = capsys.readouterr().out
    assert "stride [1, 1]" in text and "rhs_dilation [2, 2] lhs_dilation [1, 1]" in text
    assert "feature_group_count 1 batch_group_count 8" in text
    assert "MATCHED -> conv2d_column_packing_1" in text


# --- the low-channel boundary (docs/conv_low_channel.md) ---------------------------------------
@pytest.mark.parametrize(
    ("c_in", "kernel", "winner"),
    [
        # 7x3 = 21 taps. C_in 42: 3 taps a matmul, 7 matmuls <= 21 / 2: low, column packing.
        # C_in 43: 2 taps a matmul, 11 matmuls > 10.5: not low; C_in·kH > 128 refuses rep_nhwc
        # and K-replication (C_in <= 64, kH > 1) takes it.
        (42, (7, 3), "column_packing"),
        (43, (7, 3), "replication"),
        # 5x2 = 10 taps: two a matmul (C_in <= 64) gives 5 matmuls = 10 / 2: low.
        (64, (5, 2), "column_packing"),
        (65, (5, 2), "generic"),
    ],
)
def test_low_channel_boundary_selects_and_validates(c_in, kernel, winner):
    model = conv_model("Conv", (1, c_in, 9, 8), (6, c_in, *kernel), True, seed=c_in)
    graph = import_graph(model)
    selection = select_kernel(conv_op_from_node(graph, "Conv_0"), CompileOptions())
    label = selection.kernel.label if selection.kernel else None
    if winner == "generic":
        # C_in 65 > 64: neither column packing nor K-replication; the generic path runs it.
        assert label is None
        assert "C_in 65 is not low" in dict(selection.refusals)["column_packing"]
        return
    assert label == winner
    kernel_name = COLUMN_PACKING if winner == "column_packing" else selection.kernel.name
    check(model, kernel_name, seed=c_in)
