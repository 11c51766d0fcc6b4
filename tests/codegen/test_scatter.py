"""ScatterElements against onnxruntime: axes, negative indices, every reduction."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import assert_matches_onnxruntime
from onnx import TensorProto, helper

RNG = np.random.default_rng(23)


@pytest.mark.parametrize(
    "data_shape, idx_shape, axis",
    [
        ((6,), (3,), 0),
        ((4, 5), (4, 2), 1),
        ((5, 3), (2, 3), 0),
        ((3, 6, 4), (3, 2, 4), 1),
        ((140, 9), (140, 4), 1),
    ],
)
@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
def test_scatter_elements(data_shape, idx_shape, axis, reduction):
    node = helper.make_node(
        "ScatterElements", ["data", "idx", "upd"], ["y"], axis=axis, reduction=reduction
    )
    graph = helper.make_graph(
        [node],
        "scatter",
        [
            helper.make_tensor_value_info("data", TensorProto.FLOAT, list(data_shape)),
            helper.make_tensor_value_info("idx", TensorProto.INT64, list(idx_shape)),
            helper.make_tensor_value_info("upd", TensorProto.FLOAT, list(idx_shape)),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(data_shape))],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    length = data_shape[axis]
    # distinct targets along the axis for "none" (duplicates are unordered there in ONNX)
    idx = np.empty(idx_shape, np.int64)
    for pos in np.ndindex(*[s for a, s in enumerate(idx_shape) if a != axis]):
        chosen = RNG.permutation(length)[: idx_shape[axis]]
        if reduction != "none":
            chosen = RNG.integers(0, length, idx_shape[axis])
        chosen = np.where(RNG.random(chosen.shape) < 0.3, chosen - length, chosen)
        where = list(pos)
        where.insert(axis, slice(None))
        idx[tuple(where)] = chosen
    feeds = {
        "data": RNG.standard_normal(data_shape).astype(np.float32),
        "idx": idx,
        "upd": RNG.standard_normal(idx_shape).astype(np.float32),
    }
    assert_matches_onnxruntime(model, feeds=feeds)
