"""TopK against onnxruntime: axes, largest and smallest, ties (the lower index first)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import assert_matches_onnxruntime
from onnx import TensorProto, helper, numpy_helper

RNG = np.random.default_rng(17)


@pytest.mark.parametrize(
    "shape, k, axis", [((4, 10), 3, -1), ((3, 7, 5), 2, 1), ((6, 4), 6, 0), ((200, 33), 5, 1)]
)
@pytest.mark.parametrize("largest", [1, 0])
def test_topk(shape, k, axis, largest):
    node = helper.make_node("TopK", ["x", "k"], ["values", "indices"], axis=axis, largest=largest)
    graph = helper.make_graph(
        [node],
        "topk",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
        [
            helper.make_tensor_value_info("values", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("indices", TensorProto.INT64, None),
        ],
        [numpy_helper.from_array(np.array([k], np.int64), "k")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)])
    x = RNG.integers(-4, 5, shape).astype(np.float32)  # ties on purpose
    assert_matches_onnxruntime(model, feeds={"x": x}, atol=0, rtol=0)
