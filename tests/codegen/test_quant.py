"""QuantizeLinear and DequantizeLinear against onnxruntime: per tensor and per axis, int8 and
uint8, with and without a zero point, ties rounding to even, saturation."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import assert_matches_onnxruntime
from onnx import TensorProto, helper, numpy_helper

RNG = np.random.default_rng(5)


def _model(op, x_shape, x_type, y_type, scale, zero, axis=1):
    inits = [numpy_helper.from_array(np.asarray(scale, np.float32), "scale")]
    inputs = ["x", "scale"]
    if zero is not None:
        inits.append(numpy_helper.from_array(zero, "zero"))
        inputs.append("zero")
    node = helper.make_node(op, inputs, ["y"], axis=axis)
    graph = helper.make_graph(
        [node],
        "q",
        [helper.make_tensor_value_info("x", x_type, list(x_shape))],
        [helper.make_tensor_value_info("y", y_type, list(x_shape))],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])


@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
@pytest.mark.parametrize("per_axis", [False, True])
@pytest.mark.parametrize("with_zero", [False, True])
def test_quantize(dtype, per_axis, with_zero):
    shape = (2, 4, 5, 6)
    scale = RNG.uniform(0.02, 0.1, 4) if per_axis else np.float32(0.05)
    zero = None
    if with_zero:
        values = RNG.integers(-5, 5, 4) + (128 if dtype == np.uint8 else 0)
        zero = (values if per_axis else values[:1].reshape(())).astype(dtype)
    y_type = TensorProto.INT8 if dtype == np.int8 else TensorProto.UINT8
    if zero is None and dtype == np.int8:
        zero = np.zeros(4 if per_axis else (), np.int8)  # without it the output is uint8
    model = _model("QuantizeLinear", shape, TensorProto.FLOAT, y_type, scale, zero)
    x = RNG.uniform(-8, 8, shape).astype(np.float32)
    x.reshape(-1)[:6] = [0.025, -0.025, 0.075, 0.125, 100.0, -100.0]  # ties, saturation
    assert_matches_onnxruntime(model, feeds={"x": x}, atol=0, rtol=0)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
@pytest.mark.parametrize("per_axis", [False, True])
def test_dequantize(dtype, per_axis):
    shape = (3, 4, 7)
    scale = RNG.uniform(0.02, 0.1, 4) if per_axis else np.float32(0.05)
    zero = RNG.integers(0, 20, 4 if per_axis else ()).astype(dtype)
    x_type = TensorProto.INT8 if dtype == np.int8 else TensorProto.UINT8
    model = _model("DequantizeLinear", shape, x_type, TensorProto.FLOAT, scale, zero)
    info = np.iinfo(dtype)
    x = RNG.integers(info.min, info.max + 1, shape).astype(dtype)
    assert_matches_onnxruntime(model, feeds={"x": x})
