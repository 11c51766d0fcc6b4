"""LpNormalization, LpPool, Hardmax and EyeLike (codegen/lower/norm_lp.py) against onnxruntime
through the public API: one-node models, seeded inputs, `onnx2bir.api.validate`."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import IR_VERSION, one_node_model
from onnx import TensorProto, helper

from onnx2bir import api
from onnx2bir.codegen.driver import CodegenError
from onnx2bir.codegen.lower import norm_lp


def passes(model, **feeds: np.ndarray) -> bool:
    result = api.validate(model, inputs=feeds or None)
    return result.passed


def normal(seed: int, *shape: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


# --- LpNormalization ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("shape", "axis", "p"),
    [
        ((3, 4, 5), -1, 2),
        ((3, 4, 5), 1, 1),
        ((3, 4, 5), 0, 2),
        ((3, 4, 5), -3, 1),
        ((2, 3, 130), 1, 2),  # inner 130: inner positions on partitions, an outer block a time
        ((200, 7), 1, 1),  # two row tiles
        ((2, 9000), -1, 2),  # longer than NORM_CHUNK: partial sums, then a second pass
    ],
    ids=str,
)
def test_lp_normalization(shape, axis, p):
    model = one_node_model("LpNormalization", {"x": shape}, opset=22, axis=axis, p=p)
    x = normal(0, *shape)
    x.reshape(-1, shape[-1])[0] = 0.0  # a zero row (axis -1): onnxruntime leaves zeros
    assert passes(model, x=x)


def test_lp_normalization_refuses_p3():
    model = one_node_model("LpNormalization", {"x": (2, 3)}, opset=22, p=2)
    model.graph.node[0].attribute[0].i = 3
    with pytest.raises(CodegenError, match="p=3"):
        api.validate(model)


# --- LpPool -------------------------------------------------------------------------------

POOLS = [
    ("1d_p3", (1, 3, 32), 18, dict(kernel_shape=[2], p=3)),
    ("1d_pads_strides", (2, 3, 17), 11, dict(kernel_shape=[3], pads=[1, 2], strides=[2], p=2)),
    ("2d_p1", (1, 2, 9, 9), 18, dict(kernel_shape=[3, 3], p=1)),
    ("2d_pads", (1, 3, 10, 8), 11, dict(kernel_shape=[3, 3], p=3, pads=[2, 1, 2, 1])),
    ("2d_strides", (1, 3, 16, 16), 18, dict(kernel_shape=[5, 5], p=2, strides=[3, 3])),
    ("2d_dilations", (1, 2, 8, 8), 18, dict(kernel_shape=[2, 2], p=2, dilations=[2, 2])),
    ("2d_same_upper", (1, 3, 9, 9), 18, dict(kernel_shape=[2, 3], p=2, auto_pad="SAME_UPPER")),
    ("2d_same_lower", (1, 3, 9, 9), 11, dict(kernel_shape=[2, 2], p=4, auto_pad="SAME_LOWER")),
    (
        "2d_valid",
        (1, 1, 7, 7),
        18,
        dict(kernel_shape=[2, 2], p=2, auto_pad="VALID", strides=[2, 2]),
    ),
    ("2d_ceil", (1, 2, 7, 7), 18, dict(kernel_shape=[2, 2], p=2, strides=[2, 2], ceil_mode=1)),
    ("3d", (1, 2, 5, 6, 6), 18, dict(kernel_shape=[2, 2, 2], p=3, pads=[1, 0, 1, 0, 1, 1])),
    ("planes_130", (2, 65, 5, 5), 18, dict(kernel_shape=[2, 2], p=2)),  # two plane tiles
]


@pytest.mark.parametrize(
    ("shape", "opset", "attrs"), [c[1:] for c in POOLS], ids=[c[0] for c in POOLS]
)
def test_lp_pool(shape, opset, attrs):
    model = one_node_model("LpPool", {"x": shape}, opset=opset, **attrs)
    assert passes(model, x=normal(1, *shape))


def test_lp_pool_wrong_root_fails(monkeypatch):
    """The bound is tight enough to catch a 1/p exponent off by 0.002: the right program
    passes, the same program with the perturbed root fails."""
    model = one_node_model("LpPool", {"x": (1, 2, 8, 8)}, opset=18, kernel_shape=[3, 3], p=3)
    x = normal(2, 1, 2, 8, 8)
    assert passes(model, x=x)

    def off_root(cg, p):
        def compute(tile):
            cg.tensor_scalar(tile, tile, "pow", 1.0 / p + 0.002)

        return compute

    monkeypatch.setattr(norm_lp, "_lp_root", off_root)
    assert not passes(model, x=x)


# --- Hardmax ------------------------------------------------------------------------------


def ties(*shape: int) -> np.ndarray:
    """Small integers: many rows hold their maximum more than once."""
    return np.random.default_rng(3).integers(0, 3, shape).astype(np.float32)


@pytest.mark.parametrize(
    ("shape", "axis", "opset"),
    [
        ((3, 4, 5), None, 13),
        ((3, 4, 5), 0, 13),
        ((3, 4, 5), 1, 13),
        ((3, 4, 5), -2, 13),
        ((2, 70, 3), 1, 13),  # inner 3: outer blocks side by side on partitions
        ((2, 6, 150), 1, 13),  # inner 150: an outer block at a time
        ((300, 9), -1, 13),  # three row tiles
        ((3, 4, 5), None, 11),  # flattened at axis 1: rows of 20
        ((3, 4, 5), 0, 11),  # one row of 60
        ((3, 4, 5), 2, 11),
        ((3, 4, 5), -1, 11),
    ],
    ids=str,
)
def test_hardmax_first_of_ties(shape, axis, opset):
    attrs = {} if axis is None else {"axis": axis}
    model = one_node_model("Hardmax", {"x": shape}, opset=opset, **attrs)
    x = ties(*shape)
    result = api.validate(model, inputs={"x": x})
    assert result.passed
    (y,) = result.outputs.values()
    assert set(np.unique(y)) <= {0.0, 1.0}
    default = -1 if opset >= 13 else 1
    at = (default if axis is None else axis) % len(shape)
    rows = x.size // shape[at] if opset >= 13 else int(np.prod(shape[:at]))
    assert y.sum() == rows  # one 1 a row


def test_hardmax_ties_go_to_the_first():
    model = one_node_model("Hardmax", {"x": (3, 4)}, opset=13)
    x = np.array([[1, 3, 3, 2], [5, 5, 5, 5], [-np.inf] * 4], np.float32)
    result = api.validate(model, inputs={"x": x})
    assert result.passed
    (y,) = result.outputs.values()
    np.testing.assert_array_equal(y, [[0, 1, 0, 0], [1, 0, 0, 0], [1, 0, 0, 0]])


# --- EyeLike ------------------------------------------------------------------------------


def eye_like(shape, in_type, dtype=None, **attrs):
    if dtype is not None:
        attrs["dtype"] = dtype
    node = helper.make_node("EyeLike", ["x"], ["y"], **attrs)
    graph = helper.make_graph(
        [node],
        "test",
        [helper.make_tensor_value_info("x", in_type, list(shape))],
        [helper.make_tensor_value_info("y", dtype or in_type, list(shape))],
    )
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 22)], ir_version=IR_VERSION
    )


@pytest.mark.parametrize(
    ("shape", "in_type", "dtype", "k"),
    [
        ((4, 4), TensorProto.FLOAT, None, 0),
        ((4, 5), TensorProto.INT32, TensorProto.FLOAT, 1),
        ((5, 3), TensorProto.FLOAT, TensorProto.INT64, -2),
        ((3, 4), TensorProto.INT64, None, 7),  # past the last column: all zeros
        ((200, 150), TensorProto.FLOAT, TensorProto.INT32, -60),  # two row tiles
        ((6, 6), TensorProto.INT64, TensorProto.FLOAT, -1),
    ],
    ids=str,
)
def test_eye_like(shape, in_type, dtype, k):
    model = eye_like(shape, in_type, dtype, k=k)
    result = api.validate(model)
    assert result.passed
    (y,) = result.outputs.values()
    np.testing.assert_array_equal(y, np.eye(*shape, k=k))
