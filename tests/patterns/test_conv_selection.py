"""TransformConvOp: every predicate (match and no-match per reason), dispatch order, the
experimental gate, statistics, the perm algebra and the rewrite."""

from __future__ import annotations

import logging
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import onnx2bir.patterns.conv.selection as conv
from onnx2bir.bir.enums import Dtype
from onnx2bir.frontend.importer import import_model
from onnx2bir.options import CompileOptions
from onnx2bir.patterns.conv.op import (
    ConvOp,
    apply_perm_to_dims,
    compose_perm,
    conv_op_from_node,
    get_bridging_output_perm,
    get_bridging_perm,
    invert_perm,
    layout_perm,
)

NCHW = (0, 1, 2, 3)


def make_op(c_in=16, c_out=32, k=(3, 3), hw=(16, 16), groups=1, stride=(1, 1), **changes):
    out_hw = tuple((size - kk) // s + 1 for size, kk, s in zip(hw, k, stride, strict=True))
    op = ConvOp(
        node="conv",
        op_type="Conv",
        in_perm=NCHW,
        kern_perm=NCHW,
        out_perm=NCHW,
        feature_group_count=groups,
        batch_group_count=1,
        stride=list(stride),
        lhs_dilation=[1, 1],
        rhs_dilation=[1, 1],
        padding=[(0, 0), (0, 0)],
        rhs_reversal=False,
        in_shape=(1, c_in, *hw),
        kern_shape=(c_out, c_in // groups, *k),
        res_shape=(1, c_out, *out_hw),
        spatial_dims=2,
        dtype=Dtype.FP32,
    )
    return replace(op, **changes)


def depthwise(c=32, **changes):
    return make_op(c_in=c, c_out=c, groups=c, **changes)


# --- perm algebra ----------------------------------------------------------------------------
perms = st.integers(1, 5).flatmap(lambda n: st.permutations(list(range(n))).map(tuple))


@given(perms)
def test_invert_is_an_inverse(perm):
    assert compose_perm(perm, invert_perm(perm)) == tuple(range(len(perm)))
    assert compose_perm(invert_perm(perm), perm) == tuple(range(len(perm)))


@given(
    st.integers(1, 5).flatmap(
        lambda n: st.tuples(*[st.permutations(list(range(n))).map(tuple)] * 3)
    )
)
def test_compose_applies_in_order_and_bridges_close(triple):
    first, second, third = triple
    data = np.arange(np.prod(range(2, len(first) + 2))).reshape(range(2, len(first) + 2))
    assert np.array_equal(
        data.transpose(first).transpose(second), data.transpose(compose_perm(first, second))
    )
    bridge = get_bridging_perm(first, third)
    assert np.array_equal(data.transpose(first).transpose(bridge), data.transpose(third))
    assert apply_perm_to_dims(data.shape, first) == data.transpose(first).shape


def test_layout_perms_and_output_bridge():
    assert layout_perm("fb01", "bf01") == (1, 0, 2, 3)
    assert layout_perm("01bf", "bf01") == (2, 3, 0, 1)
    y_nchw = np.arange(2 * 3 * 4 * 5).reshape(2, 3, 4, 5)
    y_hwnc = y_nchw.transpose(2, 3, 0, 1)  # what a 01bf kernel writes
    bridge = get_bridging_output_perm(layout_perm("01bf", "bf01"), NCHW)
    assert np.array_equal(y_hwnc.transpose(bridge), y_nchw)


# --- predicates: one match and one no-match per reason ---------------------------------------
REP = conv.match_Conv2d_dw_fb01_io01_01bf_rep_nhwc_Pcinh


def test_rep_nhwc_matches_a_dense_conv_that_fits():
    assert REP(make_op(c_in=16, k=(3, 3))) is None


@pytest.mark.parametrize(
    "op, reason",
    [
        (make_op(is_pglt=True), "partition-group-local"),
        (make_op(c_in=32, c_out=32, groups=4), "feature_group_count 4 != 1"),
        (make_op(batch_group_count=2), "batch_group_count 2 != 1"),
        (make_op(lhs_dilation=[2, 2]), "lhs_dilation"),
        (make_op(rhs_reversal=True), "reversed kernel"),
        (make_op(dtype=Dtype.INT32), "dtype int32"),
        (make_op(c_in=64, k=(3, 3)), "C_in x kH = 64 x 3 > 128"),
        (make_op(c_in=3, k=(3, 3), hw=(600, 16000)), "replicated input"),
    ],
)
def test_rep_nhwc_refusals(op, reason):
    assert reason in REP(op)


def test_rep_nhwc_stride_gate_follows_allow_stride():
    strided = make_op(stride=(2, 2))
    assert REP(strided, allow_stride=True) is None
    assert "stride [2, 2] not allowed" in REP(strided, allow_stride=False)


def transposed_depthwise(c=8, layout="io01", k=(3, 3)):
    """A depthwise ConvTranspose in the backward encoding: stride 2 as rhs_dilation, groups on
    batch_group_count, the kernel stored in `layout` (ONNX stores io01)."""
    perm = layout_perm(layout, "oi01")
    canonical = (1, c, *k)  # o = C_out / group, i = C
    stored = [0] * 4
    for position, axis in enumerate(perm):
        stored[axis] = canonical[position]
    return replace(
        depthwise(c, k=k),
        feature_group_count=1,
        batch_group_count=c,
        rhs_dilation=[2, 2],
        rhs_reversal=True,
        kern_perm=perm,
        kern_shape=tuple(stored),
    )


@pytest.mark.parametrize(
    ("layout", "k", "accepted"),
    [
        ("io01", (3, 3), {"oi01"}),  # the ONNX layout: a data-free bridge to oi01
        ("io10", (3, 3), {"io10"}),  # spatial axes swapped: only io10 is data-free
        ("io01", (1, 3), {"oi01", "io10"}),  # one unit spatial axis: both are data-free
        ("oi01", (3, 3), {"oi01"}),
    ],
)
def test_depthwise_backward_rows_take_the_data_free_bridge(layout, k, accepted):
    op = transposed_depthwise(layout=layout, k=k)
    for row in ("oi01", "io10"):
        reason = conv.match_conv_depthwise_backward(op, kernel_layout=row)
        if row in accepted:
            assert reason is None, reason
        else:
            assert "only by moving data" in reason


@pytest.mark.parametrize(
    "op, reason",
    [
        (replace(transposed_depthwise(), batch_group_count=2), "not depthwise"),
        (replace(transposed_depthwise(), rhs_reversal=False), "not a backward"),
        (replace(transposed_depthwise(), feature_group_count=8), "feature_group_count 8"),
        (depthwise(8, kern_perm=(1, 0, 2, 3)), "not a backward"),
    ],
)
def test_depthwise_backward_refusals(op, reason):
    assert reason in conv.match_conv_depthwise_backward(op, kernel_layout="oi01")


def conv1d_depthwise(c=8, **changes):
    return depthwise(c, k=(1, 5), hw=(1, 40), **changes)


def test_conv1d_depthwise_match_and_refusals():
    assert conv.match_Conv1d_depthwise_bf01_oi01_bf01(conv1d_depthwise()) is None
    cases = [
        (depthwise(8), "not 1-D"),
        (make_op(c_in=8, c_out=8, k=(1, 5), hw=(1, 40)), "not depthwise"),
        (conv1d_depthwise(batch_group_count=2), "batch_group_count"),
        (conv1d_depthwise(rhs_reversal=True), "backward form"),
        (conv1d_depthwise(padding=[(1, 0), (0, 0)]), "unit axis"),
    ]
    for op, reason in cases:
        assert reason in conv.match_Conv1d_depthwise_bf01_oi01_bf01(op)


def test_conv2d_depthwise_match_and_refusals():
    assert conv.match_conv2d_depthwise_f01b_o01i_bf01(depthwise(32)) is None
    cases = [
        (depthwise(32, lhs_dilation=[2, 2]), "lhs_dilation"),
        (depthwise(32, batch_group_count=2), "batch_group_count"),
        (make_op(c_in=32, c_out=32), "feature_group_count 1 != C_in 32"),
        (make_op(c_in=32, c_out=64, groups=32), "C_in 32 != kernel O 64"),
        (depthwise(32, rhs_reversal=True), "reversed"),
    ]
    for op, reason in cases:
        assert reason in conv.match_conv2d_depthwise_f01b_o01i_bf01(op)


def test_depthwise_forward_needs_stride_3():
    assert conv.match_conv_depthwise_forward(depthwise(16, stride=(3, 3))) is None
    cases = [
        (depthwise(16, stride=(2, 2)), "stride [2, 2] != [3, 3]"),
        (depthwise(16, stride=(3, 3), lhs_dilation=[2, 2]), "lhs_dilation"),
        (depthwise(16, stride=(3, 3), rhs_dilation=[2, 2]), "rhs_dilation"),
        (make_op(c_in=16, c_out=16, stride=(3, 3)), "not depthwise"),
    ]
    for op, reason in cases:
        assert reason in conv.match_conv_depthwise_forward(op)


def test_low_channel_gate_and_its_assertions():
    assert conv.is_low_channel_conv_1(make_op(c_in=3, k=(3, 3))) is True
    assert conv.is_low_channel_conv_1(make_op(c_in=128)) is False
    assert conv.is_low_channel_conv_1(make_op(c_in=3, k=(1, 1))) is False
    messages = {
        "Convolution output batch must match input batch": make_op(res_shape=(2, 32, 14, 14)),
        "Convolution input channels must match kernel input channels": make_op(
            kern_shape=(32, 8, 3, 3)
        ),
        "Convolution output channels must match kernel output channels": make_op(
            kern_shape=(64, 16, 3, 3)
        ),
    }
    for message, op in messages.items():
        with pytest.raises(conv.ConvOpInvariantError, match=message):
            conv.is_low_channel_conv_1(op)


# Boundaries worked out by hand from the rule "stacking taps at least halves the matmuls":
# fit = 128 // C_in taps per matmul, ceil(taps / fit) matmuls, low iff 2·that <= taps.
@pytest.mark.parametrize(
    ("kernel", "largest_low"),
    [
        ((3, 3), 42),  # 42: fit 3 → 3 matmuls of 9; 43: fit 2 → 5 > 4.5
        ((7, 7), 42),  # 42: fit 3 → 17 ≤ 24.5; 43: fit 2 → 25 > 24.5
        ((2, 2), 64),  # 64: fit 2 → 2 ≤ 2; 65: fit 1
        ((5, 2), 64),  # 64: fit 2 → 5 ≤ 5
        ((1, 3), 42),  # 42: fit 3 → 1 ≤ 1.5; 43: fit 2 → 2 > 1.5
        ((11, 11), 42),  # 42: 41 ≤ 60.5; 43: 61 > 60.5
        ((1, 2), 64),
    ],
)
def test_low_channel_boundary_is_derived_from_taps_and_partitions(kernel, largest_low):
    low = make_op(c_in=largest_low, c_out=8, k=kernel, hw=(16, 16))
    high = make_op(c_in=largest_low + 1, c_out=8, k=kernel, hw=(16, 16))
    assert conv.is_low_channel_conv_1(low) is True
    assert conv.is_low_channel_conv_1(high) is False
    assert "is not low" in conv.match_low_channel_conv(high)


def test_low_channel_never_for_a_single_tap_or_a_full_tap():
    assert conv.is_low_channel_conv_1(make_op(c_in=1, k=(1, 1))) is False
    assert conv.is_low_channel_conv_1(make_op(c_in=129, k=(3, 3))) is False
    assert "a 1x1 kernel" in conv.match_low_channel_conv(make_op(c_in=3, k=(1, 1)))


def test_low_channel_match_and_refusals():
    assert conv.match_low_channel_conv(make_op(c_in=3)) is None
    assert "C_in 128 is not low" in conv.match_low_channel_conv(make_op(c_in=128))
    assert "feature_group_count" in conv.match_low_channel_conv(depthwise(8))
    assert "backward" in conv.match_low_channel_conv(make_op(c_in=3, rhs_reversal=True))


def test_replication_match_and_refusals():
    assert conv.match_replication_conv(make_op(c_in=64)) is None
    assert "C_in 96 > 64" in conv.match_replication_conv(make_op(c_in=96))
    assert "kernel height 1" in conv.match_replication_conv(make_op(c_in=32, k=(1, 1)))
    assert "feature_group_count" in conv.match_replication_conv(depthwise(8))


def test_alt_shape_layout_predicate():
    nhwc = make_op(
        in_perm=layout_perm("b01f", "bf01"),
        kern_perm=layout_perm("01io", "oi01"),
        out_perm=layout_perm("b01f", "bf01"),
        in_shape=(1, 16, 16, 16),
    )
    assert conv.match_Conv2d_dw_fb01_io01_01bf_rep_nhwc_Pcinh2(nhwc) is None
    assert "input is not NHWC" in conv.match_Conv2d_dw_fb01_io01_01bf_rep_nhwc_Pcinh2(make_op())


def test_pbp_matchers_never_match():
    for op in (make_op(), depthwise(), make_op(c_in=3)):
        assert conv.match_Conv2d_pbp_0f1b_0i1o_01fb_experimental_1(op)
        assert conv.match_Conv2d_pbp_fb01_io01_01bf_experimental_1(op)


# --- dispatch ------------------------------------------------------------------------------------
def test_first_match_wins_dense_low_channel_conv_takes_rep_nhwc():
    op = make_op(c_in=3, k=(3, 3))
    accepting = [
        info.label
        for info in conv.FUNCTIONAL_KERNEL_REGISTRY
        if info.match[0](op, **info.match[1]) is None
    ]
    assert accepting == ["rep_nhwc", "column_packing", "replication"]
    assert conv.select_kernel(op, CompileOptions()).kernel.label == "rep_nhwc"


def test_stride_3_depthwise_takes_the_earlier_depthwise_row():
    op = depthwise(16, stride=(3, 3))
    selection = conv.select_kernel(op, CompileOptions())
    assert selection.kernel.label == "conv2d_depthwise"
    assert "depthwise_forward_s3" not in [label for label, _ in selection.refusals]


def test_experimental_registry_is_never_consulted_with_the_flag_off(monkeypatch):
    calls = []

    def spy(op):
        calls.append(op.node)
        return "spy"

    spied = [replace(conv.EXPERIMENTAL_KERNEL_REGISTRY[0], match=(spy, {}))]
    monkeypatch.setattr(conv, "EXPERIMENTAL_KERNEL_REGISTRY", spied)
    op = make_op(c_in=32, c_out=32, groups=4)  # nothing functional takes a grouped conv
    selection = conv.select_kernel(op, CompileOptions())
    assert selection.kernel is None and calls == []
    selection = conv.select_kernel(op, CompileOptions(experimental_convolution_kernel_match=True))
    assert selection.kernel is None and calls == ["conv"]


def test_flag_on_still_matches_nothing_and_logs_the_debug_line(caplog):
    op = make_op(c_in=32, c_out=32, groups=4)
    with caplog.at_level(logging.DEBUG, logger="onnx2bir.TransformConvOp"):
        selection = conv.select_kernel(
            op, CompileOptions(experimental_convolution_kernel_match=True)
        )
    assert selection.kernel is None
    assert [label for label, _ in selection.refusals][-2:] == ["pbp_0f1b", "pbp_fb01"]
    assert any(r.getMessage().startswith("DIDN'T MATCH KERNEL FOR: ") for r in caplog.records)


def test_get_kernel_attr_key_order():
    keys = list(conv.get_kernel_attr(make_op()))
    assert keys[:7] == [
        "stride",
        "padding",
        "rhs_dilation",
        "lhs_dilation",
        "in_perm",
        "kern_perm",
        "out_perm",
    ]
    assert keys[-3:-1] == ["batch_group_count", "feature_group_count"]
    same = conv.get_kernel_attr_same_hl_pad(make_op(padding=[(1, 1), (0, 1)]))
    assert same["padding"] == [[1, 1], [0, 1]] and same["same_hl_pad"] is False


# --- on a real graph ------------------------------------------------------------------------------
def _conv_model(convs, c_in=3, hw=8):
    nodes, inits, current = [], [], "x"
    channels = c_in
    for index, (c_out, k, groups, extra) in enumerate(convs):
        w = f"w{index}"
        inits.append(
            numpy_helper.from_array(
                np.random.default_rng(index)
                .standard_normal((c_out, channels // groups, k, k))
                .astype(np.float32),
                w,
            )
        )
        nodes.append(
            helper.make_node(
                "Conv",
                [current, w],
                [f"y{index}"],
                name=f"conv{index}",
                group=groups,
                pads=[k // 2] * 4,
                **extra,
            )
        )
        current, channels = f"y{index}", c_out
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c_in, hw, hw])],
        [helper.make_tensor_value_info(current, TensorProto.FLOAT, [1, channels, hw, hw])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def test_statistics_follow_the_seed_wording():
    model = _conv_model([(16, 3, 1, {}), (16, 3, 4, {}), (16, 3, 16, {})])
    graph = import_model(model)
    result = conv.TransformConvOp().run(graph, CompileOptions())
    stats = {s.description: s.value for s in result.statistics}
    assert stats["Total number of convolution operations processed"] == 3
    assert stats["Number of convolution operations matched to kernels"] == 2
    assert stats["Percentage of convolution operations matched to kernels"] == "66.67"
    per_kernel = {d: v for d, v in stats.items() if d.startswith("Number of times kernel")}
    assert len(per_kernel) == 8
    assert per_kernel[f"Number of times kernel {conv.REP_NHWC} is matched"] == 1
    assert per_kernel[f"Number of times kernel {conv.CONV2D_DEPTHWISE} is matched"] == 1
    assert sum(per_kernel.values()) == 2


def test_rewrite_bridges_only_what_differs():
    graph = import_model(_conv_model([(16, 3, 1, {})]))
    conv.TransformConvOp().run(graph, CompileOptions())
    node = graph.node("conv0")
    assert node["op_type"] == "NativeKernel" and node["attrs"]["func_name"] == conv.REP_NHWC
    # rep_nhwc wants fb01 input (one Transpose) and 01bf output (one Transpose back); the
    # constant weight is transposed at compile time, not by a node.
    transposes = [(n, d["attrs"]["perm"]) for n, d in graph.nodes() if d["op_type"] == "Transpose"]
    assert transposes == [
        ("conv0/input_transpose", [1, 0, 2, 3]),
        ("conv0/output_transpose", [2, 3, 0, 1]),
    ]
    weight = graph.tensors[node["inputs"][1]]
    assert weight.is_const and weight.shape == (3, 16, 3, 3)


def test_rewrite_inserts_no_transposes_for_an_already_matching_layout():
    graph = import_model(_conv_model([(3, 3, 3, {})], c_in=3))  # depthwise → conv2d_depthwise
    conv.TransformConvOp().run(graph, CompileOptions())
    assert graph.node("conv0")["attrs"]["func_name"] == conv.CONV2D_DEPTHWISE
    ops = [d["op_type"] for _, d in graph.nodes()]
    assert ops.count("Transpose") == 1  # input to f01b; the bf01 output needs no bridge


def test_insert_transpose_forces_the_bridge(monkeypatch):
    forced = [replace(info, insert_transpose=True) for info in conv.FUNCTIONAL_KERNEL_REGISTRY]
    monkeypatch.setattr(conv, "FUNCTIONAL_KERNEL_REGISTRY", forced)
    graph = import_model(_conv_model([(3, 3, 3, {})], c_in=3))
    conv.TransformConvOp().run(graph, CompileOptions())
    ops = [d["op_type"] for _, d in graph.nodes()]
    assert ops.count("Transpose") == 2  # the identity output bridge is emitted too


def test_one_d_conv_reaches_the_selector_as_2d_with_unit_height():
    model = helper.make_model(
        helper.make_graph(
            [helper.make_node("Conv", ["x", "w"], ["y"], name="c", group=4, pads=[1, 1])],
            "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 20])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 20])],
            [numpy_helper.from_array(np.ones((4, 1, 3), np.float32), "w")],
        ),
        opset_imports=[helper.make_opsetid("", 17)],
        ir_version=9,
    )
    graph = import_model(model)
    op = conv_op_from_node(graph, "c")
    assert op.spatial_dims == 2 and op.in_shape == (1, 4, 1, 20)
    assert op.kern_shape == (4, 1, 1, 3) and op.padding == [(0, 0), (1, 1)]
    assert conv.select_kernel(op, CompileOptions()).kernel.name == conv.CONV1D_DEPTHWISE


def test_conv_transpose_canonicalizes_to_backward_form():
    model = helper.make_model(
        helper.make_graph(
            [
                helper.make_node(
                    "ConvTranspose",
                    ["x", "w"],
                    ["y"],
                    name="up",
                    group=4,
                    strides=[2, 2],
                    pads=[1, 1, 1, 1],
                    output_padding=[1, 1],
                )
            ],
            "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 5, 5])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 10, 10])],
            [numpy_helper.from_array(np.ones((4, 1, 3, 3), np.float32), "w")],
        ),
        opset_imports=[helper.make_opsetid("", 17)],
        ir_version=9,
    )
    op = conv_op_from_node(import_model(model), "up")
    # The backward encoding: stride as rhs_dilation, dilation as lhs_dilation, groups on
    # batch_group_count.
    assert op.rhs_dilation == [2, 2] and op.lhs_dilation == [1, 1] and op.stride == [1, 1]
    assert op.batch_group_count == 4 and op.feature_group_count == 1 and op.rhs_reversal
    assert op.padding == [(1, 2), (1, 2)] and op.kern_perm == (1, 0, 2, 3)
    assert conv.select_kernel(op, CompileOptions()).kernel.name == conv.COLUMN_PACKING_1
