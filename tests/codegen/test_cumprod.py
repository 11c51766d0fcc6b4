"""CumProd against onnxruntime: axes, exclusive, reverse, float and int64."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import assert_matches_onnxruntime
from onnx import TensorProto, helper, numpy_helper

RNG = np.random.default_rng(3)


@pytest.mark.parametrize("shape, axis", [((5,), 0), ((3, 6), 1), ((4, 3, 5), 1), ((130, 7), 0)])
@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
@pytest.mark.parametrize("elem", [TensorProto.FLOAT, TensorProto.INT64])
def test_cumprod(shape, axis, exclusive, reverse, elem):
    node = helper.make_node("CumProd", ["x", "axis"], ["y"], exclusive=exclusive, reverse=reverse)
    graph = helper.make_graph(
        [node],
        "cumprod",
        [helper.make_tensor_value_info("x", elem, list(shape))],
        [helper.make_tensor_value_info("y", elem, list(shape))],
        [numpy_helper.from_array(np.array(axis, np.int64), "axis")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 26)])
    if elem == TensorProto.FLOAT:
        x = RNG.uniform(0.8, 1.25, shape).astype(np.float32) * RNG.choice([-1, 1], shape)
        x = x.astype(np.float32)
    else:
        x = RNG.integers(-3, 4, shape).astype(np.int64)
    assert_matches_onnxruntime(model, feeds={"x": x}, rtol=1e-5, atol=1e-6)
