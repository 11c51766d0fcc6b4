"""Every generic lowering against onnxruntime, over a small seeded sweep of shapes.

Each case is a one-node model (one is a chain) compiled to BIR without the pattern passes, so
every node takes its generic lowering, then run on the machine model with seeded standard-normal
inputs (or a transform of them where the op needs a domain, e.g. Log's positive inputs) and
compared with onnxruntime at the fp32 tolerances.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import assert_matches_onnxruntime, make_model, one_node_model
from onnx import TensorProto, helper

from onnx2bir.compiler import import_graph
from onnx2bir.runtime.oracle.ort import synthesize_inputs


def check(model, **kwargs) -> None:
    """No pattern passes: every node goes through its generic lowering."""
    assert_matches_onnxruntime(model, passes=[], **kwargs)


def weights(seed: int, *shape: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def transformed_feeds(model, seed: int, transform) -> dict[str, np.ndarray]:
    """Seeded inputs passed through `transform` (e.g. to keep them in an op's domain)."""
    feeds = synthesize_inputs(import_graph(model), seed)
    return {name: transform(value).astype(np.float32) for name, value in feeds.items()}


def positive(x: np.ndarray) -> np.ndarray:
    return np.asarray(np.abs(x) + 0.1, np.float32)


def away_from_zero(x: np.ndarray) -> np.ndarray:
    return np.asarray(np.where(x < 0, -1.0, 1.0) * (np.abs(x) + 0.5), np.float32)


# --- Conv ---------------------------------------------------------------------------------------

# (x shape, w shape, bias, attributes)
CONV_CASES = {
    "3x3_pad1": ((1, 4, 8, 8), (6, 4, 3, 3), True, {"pads": [1, 1, 1, 1]}),
    "stride2": ((1, 3, 9, 9), (5, 3, 3, 3), True, {"strides": [2, 2], "pads": [1, 1, 1, 1]}),
    "stride3": ((1, 3, 11, 10), (4, 3, 3, 3), False, {"strides": [3, 3]}),
    "stride_2x1": ((1, 3, 8, 7), (4, 3, 3, 3), True, {"strides": [2, 1], "pads": [1, 0, 1, 0]}),
    "asym_pads": ((1, 3, 7, 8), (4, 3, 3, 2), True, {"pads": [0, 1, 2, 1]}),
    "same_upper": ((1, 3, 7, 8), (4, 3, 3, 3), True, {"auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    "same_upper_even": ((1, 3, 6, 6), (4, 3, 2, 2), False, {"auto_pad": "SAME_UPPER"}),
    "same_lower": ((1, 3, 7, 8), (4, 3, 3, 3), True, {"auto_pad": "SAME_LOWER", "strides": [2, 2]}),
    "same_lower_even": ((1, 3, 6, 6), (4, 3, 2, 2), False, {"auto_pad": "SAME_LOWER"}),
    "valid": ((1, 3, 8, 9), (4, 3, 3, 3), True, {"auto_pad": "VALID"}),
    "dilation2": ((1, 3, 9, 9), (4, 3, 3, 3), True, {"dilations": [2, 2], "pads": [2, 2, 2, 2]}),
    "dilation2_stride2": (
        (1, 3, 11, 10),
        (4, 3, 3, 3),
        False,
        {"dilations": [2, 2], "strides": [2, 2], "pads": [1, 2, 1, 0]},
    ),
    "group2": ((1, 4, 6, 6), (6, 2, 3, 3), True, {"group": 2, "pads": [1, 1, 1, 1]}),
    "depthwise": ((1, 8, 6, 6), (8, 1, 3, 3), True, {"group": 8, "pads": [1, 1, 1, 1]}),
    "depthwise_x2": ((1, 4, 6, 6), (8, 1, 3, 3), True, {"group": 4, "pads": [1, 1, 1, 1]}),
    "depthwise_300": ((1, 300, 4, 4), (300, 1, 3, 3), True, {"group": 300, "pads": [1, 1, 1, 1]}),
    "depthwise_160": ((1, 160, 5, 5), (160, 1, 3, 3), True, {"group": 160, "pads": [1, 1, 1, 1]}),
    "group3_mixed": ((1, 96, 4, 4), (60, 32, 3, 3), True, {"group": 3, "pads": [1, 1, 1, 1]}),
    "cin160_cout200": ((1, 160, 6, 6), (200, 160, 3, 3), True, {"pads": [1, 1, 1, 1]}),
    "cin160_cout200_nobias": ((1, 160, 5, 5), (200, 160, 1, 1), False, {}),
    "group2_wide": ((1, 320, 3, 3), (300, 160, 1, 1), True, {"group": 2}),
    "group2_wide_out": ((1, 128, 4, 4), (600, 64, 3, 3), True, {"group": 2}),
    "1x1": ((1, 8, 5, 7), (3, 8, 1, 1), False, {}),
    "5x5": ((1, 3, 9, 9), (4, 3, 5, 5), True, {"pads": [2, 2, 2, 2]}),
    "7x7_stride2_rgb": (
        (1, 3, 32, 32),
        (8, 3, 7, 7),
        True,
        {"strides": [2, 2], "pads": [3, 3, 3, 3]},
    ),
    "wide_600": ((1, 4, 3, 600), (5, 4, 3, 3), True, {"pads": [1, 1, 1, 1]}),
    "pixels_900": ((1, 3, 30, 30), (4, 3, 3, 3), True, {"pads": [1, 1, 1, 1]}),
    "resnet_3x3": ((1, 64, 28, 28), (64, 64, 3, 3), True, {"pads": [1, 1, 1, 1]}),
    "downsample_1x1_s2": ((1, 64, 14, 14), (128, 64, 1, 1), False, {"strides": [2, 2]}),
    "batch2": ((2, 3, 6, 6), (4, 3, 3, 3), True, {"pads": [1, 1, 1, 1]}),
    "batch2_group2": ((2, 4, 5, 5), (4, 2, 3, 3), False, {"group": 2}),
    "1d": ((1, 4, 20), (6, 4, 3), True, {"pads": [1, 1]}),
    "1d_stride_dilation": (
        (2, 4, 21),
        (6, 4, 3),
        True,
        {"strides": [2], "dilations": [2], "pads": [1, 2]},
    ),
    "1d_groups": ((1, 6, 17), (6, 2, 3), False, {"group": 3, "pads": [1, 1]}),
    "1d_depthwise_same": ((1, 5, 16), (5, 1, 4), True, {"group": 5, "auto_pad": "SAME_UPPER"}),
}


@pytest.mark.parametrize("case", list(CONV_CASES))
def test_conv(case: str) -> None:
    x_shape, w_shape, bias, attrs = CONV_CASES[case]
    inits = {"w": weights(1, *w_shape)}
    if bias:
        inits["b"] = weights(2, w_shape[0])
    model = one_node_model(
        "Conv", {"x": x_shape}, initializers=inits, kernel_shape=list(w_shape[2:]), **attrs
    )
    check(model)


def test_conv_runtime_weights() -> None:
    """Weights and bias fed as graph inputs rather than constants."""
    model = one_node_model(
        "Conv", {"x": (1, 3, 6, 6), "w": (4, 3, 3, 3), "b": (4,)}, pads=[1, 1, 1, 1]
    )
    check(model, seed=3)


# --- unary elementwise --------------------------------------------------------------------------

UNARY = {
    "Relu": None,
    "Sigmoid": None,
    "Tanh": None,
    "Exp": None,
    "Log": positive,
    "Sqrt": positive,
    "Abs": None,
    "Reciprocal": away_from_zero,
    "Erf": None,
    "Softplus": None,
    "Sign": None,
    "Neg": None,
}
UNARY_SHAPES = [(1000,), (131073,), (2, 3, 4, 5), (3, 129, 7)]


@pytest.mark.parametrize("shape", UNARY_SHAPES, ids=str)
@pytest.mark.parametrize("op", list(UNARY))
def test_unary(op: str, shape: tuple[int, ...]) -> None:
    model = one_node_model(op, {"x": shape}, shape)
    transform = UNARY[op]
    feeds = transformed_feeds(model, 0, transform) if transform else None
    check(model, feeds=feeds)


# --- binary and variadic elementwise ------------------------------------------------------------

BROADCASTS = {
    "same": ((2, 3, 4, 5), (2, 3, 4, 5)),
    "scalar": ((2, 3, 4, 5), ()),
    "scalar_first": ((), (2, 3, 4, 5)),
    "channel": ((2, 3, 4, 5), (3, 1, 1)),
    "channel_first": ((3, 1, 1), (2, 3, 4, 5)),
    "last_dim": ((2, 3, 4, 5), (5,)),
    "cross": ((2, 1, 4, 1), (1, 3, 1, 5)),
    "rank1_odd": ((1001,), (1001,)),
    "rows_gt_128": ((3, 200, 7), (200, 1)),
    "cols_gt_2048": ((3, 5000), (5000,)),
    "column_vs_row": ((1000, 1), (1, 300)),
    "unit_dims": ((1, 1), ()),
    "scalars": ((), ()),
    "rank5_cross": ((2, 1, 4, 1, 6), (1, 3, 1, 5, 1)),
    "size1_vs_vector": ((1001,), (1,)),
}
BINARY_OPS = ["Add", "Sub", "Mul", "Div", "Pow", "Max", "Min"]


def binary_feeds(op: str, model, seed: int) -> dict[str, np.ndarray]:
    feeds = synthesize_inputs(import_graph(model), seed)
    if op == "Pow":  # a positive base keeps real results; exponents stay standard normal
        feeds["a"] = positive(feeds["a"])
    elif op == "Div" and "b" in feeds:
        feeds["b"] = away_from_zero(feeds["b"])
    return feeds


@pytest.mark.parametrize("case", list(BROADCASTS))
@pytest.mark.parametrize("op", BINARY_OPS)
def test_binary(op: str, case: str) -> None:
    a_shape, b_shape = BROADCASTS[case]
    model = one_node_model(op, {"a": a_shape, "b": b_shape})
    check(model, feeds=binary_feeds(op, model, 0))


@pytest.mark.parametrize("op", BINARY_OPS)
def test_binary_constant_operand(op: str) -> None:
    value = away_from_zero(weights(4, 3, 1, 5)).astype(np.float32)
    model = one_node_model(op, {"a": (2, 3, 4, 5)}, initializers={"b": value})
    check(model, feeds=binary_feeds(op, model, 1))


@pytest.mark.parametrize("op", ["Sum", "Max", "Min"])
def test_variadic(op: str) -> None:
    model = one_node_model(op, {"a": (2, 3, 4, 5), "b": (3, 1, 1), "c": (5,)})
    check(model)


def test_sum_single_input() -> None:
    check(one_node_model("Sum", {"a": (3, 7)}))


# --- MatMul and Gemm ----------------------------------------------------------------------------

MATMUL_CASES = {
    "2d_unaligned": ((130, 300), (300, 600)),
    "2d_small": ((7, 5), (5, 3)),
    "batched_3d": ((3, 20, 30), (3, 30, 40)),
    "batched_4d": ((2, 3, 20, 30), (2, 3, 30, 40)),
    "broadcast_batch": ((2, 1, 9, 17), (3, 17, 11)),
    "3d_by_2d": ((2, 5, 30), (30, 20)),
    "2d_by_3d": ((5, 30), (2, 30, 20)),
    "vec_by_mat": ((30,), (30, 20)),
    "mat_by_vec": ((20, 30), (30,)),
    "vec_by_batched": ((17,), (2, 17, 9)),
    "k_gt_128": ((10, 260), (260, 20)),
    "batched_by_vec": ((2, 5, 30), (30,)),
    "vec_by_vec": ((30,), (30,)),
    "k_1": ((5, 1), (1, 7)),
}


@pytest.mark.parametrize("case", list(MATMUL_CASES))
def test_matmul(case: str) -> None:
    a_shape, b_shape = MATMUL_CASES[case]
    check(one_node_model("MatMul", {"a": a_shape, "b": b_shape}))


def test_matmul_constant_weight() -> None:
    model = one_node_model("MatMul", {"a": (2, 40, 30)}, initializers={"w": weights(5, 30, 50)})
    check(model)


# (M, K, N, transA, transB, C shape or None, alpha, beta)
GEMM_CASES = {
    "plain": (20, 30, 40, 0, 0, None, 1.0, 1.0),
    "transA": (20, 30, 40, 1, 0, (40,), 1.0, 1.0),
    "transB": (20, 30, 40, 0, 1, (40,), 1.0, 1.0),
    "transAB": (20, 30, 40, 1, 1, (20, 40), 1.0, 1.0),
    "c_column": (20, 30, 40, 0, 1, (20, 1), 1.0, 1.0),
    "c_scalar": (20, 30, 40, 0, 0, (), 1.0, 1.0),
    "c_scalar_1": (20, 30, 40, 0, 0, (1,), 1.0, 1.0),
    "c_row": (20, 30, 40, 0, 0, (1, 40), 1.0, 1.0),
    "alpha_beta": (20, 30, 40, 0, 1, (20, 40), 0.5, 2.0),
    "beta_zero": (20, 30, 40, 0, 0, (40,), 1.5, 0.0),
    "large_transB": (130, 140, 520, 0, 1, (520,), 1.0, 1.0),
    "large_transA": (130, 140, 50, 1, 0, (130, 50), 0.25, -1.0),
}


@pytest.mark.parametrize("case", list(GEMM_CASES))
def test_gemm(case: str) -> None:
    m, k, n, trans_a, trans_b, c_shape, alpha, beta = GEMM_CASES[case]
    inputs = {"a": (k, m) if trans_a else (m, k), "b": (n, k) if trans_b else (k, n)}
    if c_shape is not None:
        inputs["c"] = c_shape
    model = one_node_model(
        "Gemm", inputs, (m, n), opset=13, transA=trans_a, transB=trans_b, alpha=alpha, beta=beta
    )
    check(model)


def test_gemm_constant_weights() -> None:
    model = one_node_model(
        "Gemm",
        {"a": (4, 30)},
        (4, 20),
        initializers={"w": weights(6, 20, 30), "bias": weights(7, 20)},
        transB=1,
    )
    check(model)


# --- data movement ------------------------------------------------------------------------------


def int64(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int64)


# (op, input shapes, int64 initializers, attributes, opset)
DATA_CASES = {
    "reshape": ("Reshape", {"x": (2, 3, 4)}, {"shape": int64(4, -1)}, {}, 18),
    "reshape_zero": ("Reshape", {"x": (2, 3, 4)}, {"shape": int64(0, 12)}, {}, 18),
    "flatten_0": ("Flatten", {"x": (2, 3, 4)}, {}, {"axis": 0}, 18),
    "flatten_1": ("Flatten", {"x": (2, 3, 4)}, {}, {"axis": 1}, 18),
    "flatten_2": ("Flatten", {"x": (2, 3, 4)}, {}, {"axis": 2}, 18),
    "flatten_negative": ("Flatten", {"x": (2, 3, 4)}, {}, {"axis": -1}, 18),
    "squeeze": ("Squeeze", {"x": (2, 1, 3, 1)}, {"axes": int64(1, 3)}, {}, 18),
    "squeeze_all": ("Squeeze", {"x": (1, 5, 1)}, {}, {}, 18),
    "unsqueeze": ("Unsqueeze", {"x": (2, 3)}, {"axes": int64(0, 3)}, {}, 18),
    "identity": ("Identity", {"x": (3, 5, 7)}, {}, {}, 18),
    "dropout": ("Dropout", {"x": (3, 5, 7)}, {}, {}, 18),
    "dropout_opset11": ("Dropout", {"x": (3, 5, 7)}, {}, {"ratio": 0.3}, 11),
    "concat_axis0": (
        "Concat",
        {"a": (2, 3, 4), "b": (1, 3, 4), "c": (3, 3, 4)},
        {},
        {"axis": 0},
        18,
    ),
    "concat_axis1": (
        "Concat",
        {"a": (2, 3, 4), "b": (2, 1, 4), "c": (2, 5, 4)},
        {},
        {"axis": 1},
        18,
    ),
    "concat_last": (
        "Concat",
        {"a": (2, 3, 4), "b": (2, 3, 1), "c": (2, 3, 6)},
        {},
        {"axis": 2},
        18,
    ),
    "concat_1d": ("Concat", {"a": (5,), "b": (7,), "c": (1,)}, {}, {"axis": 0}, 18),
    "concat_negative": (
        "Concat",
        {"a": (2, 3, 4), "b": (2, 2, 4), "c": (2, 1, 4)},
        {},
        {"axis": -2},
        18,
    ),
}


@pytest.mark.parametrize("case", list(DATA_CASES))
def test_data_movement(case: str) -> None:
    op, inputs, inits, attrs, opset = DATA_CASES[case]
    model = one_node_model(op, inputs, opset=opset, initializers=inits, **attrs)
    check(model)


def test_concat_with_constant() -> None:
    model = one_node_model("Concat", {"a": (2, 3)}, initializers={"k": weights(8, 2, 4)}, axis=1)
    check(model)


def test_large_reshape() -> None:
    """More elements than one DMA chunk (1 << 20)."""
    model = one_node_model("Reshape", {"x": (1100, 1000)}, initializers={"s": int64(-1)})
    check(model)


# --- pooling ------------------------------------------------------------------------------------

MAXPOOL_CASES = {
    "k2s2": ((1, 3, 8, 8), {"kernel_shape": [2, 2], "strides": [2, 2]}),
    "k3s1_pad": ((1, 3, 7, 7), {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),
    "k3s2_pad": ((2, 4, 9, 9), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    "asym_pads": ((1, 2, 7, 8), {"kernel_shape": [3, 2], "pads": [0, 1, 2, 0]}),
    "ceil_mode": ((1, 3, 8, 8), {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
    "dilation2": ((1, 3, 9, 9), {"kernel_shape": [2, 2], "dilations": [2, 2]}),
    "dilation2_stride2": (
        (1, 2, 10, 11),
        {"kernel_shape": [3, 3], "dilations": [2, 2], "strides": [2, 2], "pads": [1, 1, 1, 1]},
    ),
    "same_upper": (
        (1, 3, 7, 7),
        {"kernel_shape": [2, 2], "strides": [2, 2], "auto_pad": "SAME_UPPER"},
    ),
    "same_lower": (
        (1, 3, 7, 7),
        {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_LOWER"},
    ),
    "planes_gt_128": ((2, 80, 6, 6), {"kernel_shape": [2, 2], "strides": [2, 2]}),
    "wide_1100": ((1, 2, 2, 1100), {"kernel_shape": [1, 2], "strides": [1, 1]}),
    "tall": ((1, 2, 70, 40), {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),
    "1d": ((2, 3, 20), {"kernel_shape": [3], "strides": [2], "pads": [1, 1]}),
    "1d_ceil_dilation": (
        (1, 3, 17),
        {"kernel_shape": [2], "strides": [2], "dilations": [2], "ceil_mode": 1},
    ),
}


MAXPOOL_PARAMS = [pytest.param(*case, id=name) for name, case in MAXPOOL_CASES.items()]


@pytest.mark.parametrize("declared", [[1, 3, 4, 5], None], ids=["pytorch_shape", "undeclared"])
def test_maxpool_ceil_mode_window_starting_in_the_padding(declared) -> None:
    """7 rows + 2 pads, kernel 2, stride 2: onnx's shape inference keeps a fifth window that
    would start in the high padding; PyTorch and onnxruntime drop it (4 rows). The importer
    rewrites the pool to ceil_mode 0 with the padding that gives onnxruntime's count."""
    node = helper.make_node(
        "MaxPool", ["x"], ["y"], kernel_shape=[2, 2], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1
    )
    graph = helper.make_graph(
        [node],
        "pool",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 7, 9])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, declared)],
    )
    if declared is None:
        graph.output[0].type.tensor_type.ClearField("shape")
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    check(model)


@pytest.mark.parametrize(("shape", "attrs"), MAXPOOL_PARAMS)
def test_maxpool(shape: tuple[int, ...], attrs: dict) -> None:
    check(one_node_model("MaxPool", {"x": shape}, **attrs))


@pytest.mark.parametrize(
    "shape", [(2, 3, 5, 5), (1, 3, 100, 100), (1, 130, 4, 4), (2, 3, 17)], ids=str
)
def test_global_average_pool(shape: tuple[int, ...]) -> None:
    check(one_node_model("GlobalAveragePool", {"x": shape}))


# --- Softmax ------------------------------------------------------------------------------------

# (shape, axis or None for the default, opset)
SOFTMAX_CASES = {
    "op11_default_4d": ((2, 3, 4, 5), None, 11),
    "op11_axis1_4d": ((2, 3, 4, 5), 1, 11),
    "op11_axis2_4d": ((2, 3, 4, 5), 2, 11),
    "op11_axis_last": ((3, 7), -1, 11),
    "op11_axis0": ((3, 7), 0, 11),
    "op13_default": ((2, 3, 4, 5), None, 13),
    "op13_axis_last": ((3, 7), -1, 13),
    "op13_axis1_4d": ((2, 3, 4, 5), 1, 13),
    "op13_axis0": ((6, 5), 0, 13),
    "op13_rows_gt_128": ((130, 50), -1, 13),
    "op13_inner_gt_128": ((2, 7, 130), 1, 13),
    "op13_long_row": ((2, 20000), -1, 13),
    "op13_1d": ((1000,), 0, 13),
    "op13_long_strided": ((2, 9000, 3), 1, 13),
    "op11_long_flattened": ((2, 3, 3000), 1, 11),
}


@pytest.mark.parametrize("case", list(SOFTMAX_CASES))
def test_softmax(case: str) -> None:
    shape, axis, opset = SOFTMAX_CASES[case]
    attrs = {} if axis is None else {"axis": axis}
    model = one_node_model("Softmax", {"x": shape}, shape, opset=opset, **attrs)
    check(model)


def test_softmax_large_values() -> None:
    """Stability: inputs of magnitude 100 overflow a naive exp."""
    model = one_node_model("Softmax", {"x": (4, 33)}, (4, 33), opset=13)
    feeds = transformed_feeds(model, 2, lambda x: x * 100)
    check(model, feeds=feeds)


# --- reductions ---------------------------------------------------------------------------------

REDUCE_OPS = ["ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin"]
# (shape, axes or None for all)
REDUCE_AXES = {
    "last": ((2, 3, 4, 5), [-1]),
    "axes_2_3": ((2, 3, 4, 5), [2, 3]),
    "axis1": ((2, 3, 4, 5), [1]),
    "axes_0_2": ((2, 3, 4, 5), [0, 2]),
    "all": ((2, 3, 4, 5), None),
    "rows_gt_128": ((300, 6), [1]),
    "long_row": ((3, 10000), [1]),
    "axis0_long": ((9000, 3), [0]),
    "unit_axis": ((2, 1, 3), [1]),
    "strided_long": ((100, 3, 100), [0, 2]),
    "batch_stats": ((2, 8, 60, 80), [0, 2, 3]),
    "long_strided_pieces": ((3, 9000, 2, 5), [1, 3]),
    "outer_run_loops": ((20, 3, 9000), [0, 2]),
}


@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("case", list(REDUCE_AXES))
@pytest.mark.parametrize("op", REDUCE_OPS)
def test_reduce(op: str, case: str, keepdims: int) -> None:
    shape, axes = REDUCE_AXES[case]
    inits = {} if axes is None else {"axes": int64(*axes)}
    model = one_node_model(op, {"x": shape}, initializers=inits, keepdims=keepdims)
    check(model)


def test_reduce_opset13_axes_attribute() -> None:
    model = one_node_model("ReduceMax", {"x": (2, 3, 4)}, opset=13, axes=[1], keepdims=0)
    check(model)


# --- a small chain ------------------------------------------------------------------------------


def test_conv_relu_pool_chain() -> None:
    """Several lowerings in one function: each node's tiles are scoped to that node."""
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("GlobalAveragePool", ["p"], ["y"]),
    ]
    model = make_model(
        nodes,
        {"x": (1, 3, 8, 8)},
        {"y": None},
        initializers={"w": weights(9, 6, 3, 3, 3), "b": weights(10, 6)},
    )
    check(model)


def test_reduce_noop_with_empty_axes() -> None:
    model = one_node_model("ReduceSum", {"x": (2, 3, 4)}, noop_with_empty_axes=1)
    check(model)


# --- other dtypes -------------------------------------------------------------------------------

# (op, input shapes, element type, attributes); fp16 results carry fp16 rounding (2^-11
# relative) of the output and of onnxruntime's own fp16 intermediates, hence 1e-2 there.
DTYPE_CASES = {
    "add_int32": ("Add", {"a": (3, 4), "b": (4,)}, TensorProto.INT32, {}),
    "mul_int64": ("Mul", {"a": (2, 3, 4), "b": (3, 1)}, TensorProto.INT64, {}),
    "concat_int64": ("Concat", {"a": (3, 4), "b": (3, 2)}, TensorProto.INT64, {"axis": 1}),
    "reducesum_int64": ("ReduceSum", {"a": (3, 40)}, TensorProto.INT64, {}),
    "add_fp16": ("Add", {"a": (3, 4), "b": (4,)}, TensorProto.FLOAT16, {}),
    "softmax_fp16": ("Softmax", {"a": (3, 40)}, TensorProto.FLOAT16, {}),
    "maxpool_fp16": ("MaxPool", {"a": (1, 2, 6, 6)}, TensorProto.FLOAT16, {"kernel_shape": [2, 2]}),
    "matmul_fp16": ("MatMul", {"a": (3, 40), "b": (40, 5)}, TensorProto.FLOAT16, {}),
    "gemm_fp16_transB": (
        "Gemm",
        {"a": (3, 40), "b": (5, 40), "c": (5,)},
        TensorProto.FLOAT16,
        {"transB": 1},
    ),
}


@pytest.mark.parametrize("case", list(DTYPE_CASES))
def test_other_dtypes(case: str) -> None:
    op, inputs, elem_type, attrs = DTYPE_CASES[case]
    node = helper.make_node(op, list(inputs), ["y"], **attrs)
    model = make_model(node, inputs, {"y": None}, elem_type=elem_type)
    tolerance = 1e-2 if elem_type == TensorProto.FLOAT16 else 0.0
    check(model, atol=tolerance, rtol=tolerance)
