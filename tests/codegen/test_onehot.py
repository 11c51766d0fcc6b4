"""OneHot against onnxruntime: axes, negative indices, int and float outputs."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import assert_matches_onnxruntime
from onnx import TensorProto, helper, numpy_helper

RNG = np.random.default_rng(9)


@pytest.mark.parametrize(
    "shape, depth, axis", [((5,), 7, -1), ((3, 4), 10, 1), ((2, 3), 6, 0), ((200,), 3, -1)]
)
@pytest.mark.parametrize("out_type", [TensorProto.FLOAT, TensorProto.INT64])
def test_one_hot(shape, depth, axis, out_type):
    values = np.array([2, 9], np.float32 if out_type == TensorProto.FLOAT else np.int64)
    node = helper.make_node("OneHot", ["idx", "depth", "values"], ["y"], axis=axis)
    graph = helper.make_graph(
        [node],
        "onehot",
        [helper.make_tensor_value_info("idx", TensorProto.INT64, list(shape))],
        [helper.make_tensor_value_info("y", out_type, None)],
        [
            numpy_helper.from_array(np.array([depth], np.int64), "depth"),
            numpy_helper.from_array(values, "values"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)])
    idx = RNG.integers(-depth, depth, shape).astype(np.int64)
    assert_matches_onnxruntime(model, feeds={"idx": idx}, atol=0, rtol=0)
