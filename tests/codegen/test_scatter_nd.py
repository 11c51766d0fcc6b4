"""ScatterND against onnxruntime: index depths, slices, negative indices, none and add."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import assert_matches_onnxruntime
from onnx import TensorProto, helper

RNG = np.random.default_rng(31)

CASES = [
    ((8,), (4, 1)),  # elements of a vector
    ((4, 5, 6), (2, 1)),  # whole [5, 6] slices
    ((4, 5, 6), (3, 2)),  # rows of 6
    ((3, 4), (2, 3, 2)),  # a batch of element indices
    ((300, 40), (150, 1)),  # more than one tile of rows and of updates
    ((2, 700), (2, 1)),  # wider than one PSUM bank
]


@pytest.mark.parametrize("data_shape, idx_shape", CASES)
@pytest.mark.parametrize("reduction", ["none", "add"])
def test_scatter_nd(data_shape, idx_shape, reduction):
    k = idx_shape[-1]
    upd_shape = idx_shape[:-1] + data_shape[k:]
    node = helper.make_node("ScatterND", ["data", "idx", "upd"], ["y"], reduction=reduction)
    graph = helper.make_graph(
        [node],
        "scatter_nd",
        [
            helper.make_tensor_value_info("data", TensorProto.FLOAT, list(data_shape)),
            helper.make_tensor_value_info("idx", TensorProto.INT64, list(idx_shape)),
            helper.make_tensor_value_info("upd", TensorProto.FLOAT, list(upd_shape)),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(data_shape))],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    count = int(np.prod(idx_shape[:-1]))
    rows = int(np.prod(data_shape[:k]))
    flat = RNG.permutation(rows)[:count] if reduction == "none" else RNG.integers(0, rows, count)
    idx = np.stack(np.unravel_index(flat, data_shape[:k]), axis=-1).reshape(idx_shape)
    idx = np.where(RNG.random(idx.shape) < 0.3, idx - np.array(data_shape[:k]), idx)
    feeds = {
        "data": RNG.standard_normal(data_shape).astype(np.float32),
        "idx": idx.astype(np.int64),
        "upd": RNG.standard_normal(upd_shape).astype(np.float32),
    }
    assert_matches_onnxruntime(model, feeds=feeds)
