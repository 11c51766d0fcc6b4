"""MaxPool and AveragePool over 3-D windows, and the global pools on 5-D inputs, against
onnxruntime over a seeded sweep of shapes and attributes."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import assert_matches_onnxruntime, make_model
from onnx import helper

RNG = np.random.default_rng(33)

# (shape, kernel, attributes)
CASES = [
    ((1, 2, 4, 5, 6), [2, 2, 2], {}),
    ((2, 3, 5, 6, 7), [3, 3, 3], {"strides": [2, 2, 2], "pads": [1, 1, 1, 1, 1, 1]}),
    ((1, 4, 6, 5, 5), [3, 2, 2], {"strides": [2, 1, 2], "ceil_mode": 1}),
    ((1, 2, 7, 6, 6), [2, 3, 3], {"pads": [1, 0, 1, 0, 1, 1], "strides": [3, 2, 2]}),
    ((1, 3, 5, 5, 5), [3, 3, 3], {"auto_pad": "SAME_UPPER", "strides": [2, 2, 2]}),
    ((1, 1, 4, 4, 4), [1, 2, 2], {"auto_pad": "VALID", "strides": [1, 2, 2]}),
    ((1, 130, 3, 4, 4), [2, 2, 2], {"pads": [0, 1, 1, 1, 0, 0]}),
    # A 128x128 plane is longer than one depth band chunk.
    ((1, 1, 3, 128, 128), [2, 1, 1], {"strides": [1, 64, 64]}),
]


@pytest.mark.parametrize("shape, kernel, attrs", CASES)
def test_max_pool_3d(shape, kernel, attrs):
    extra = {"dilations": [2, 1, 1]} if "auto_pad" not in attrs and shape[2] >= 6 else {}
    node = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=kernel, **attrs, **extra)
    assert_matches_onnxruntime(make_model(node, {"x": shape}, {"y": None}), passes=[])


@pytest.mark.parametrize("count_include_pad", [0, 1])
@pytest.mark.parametrize("shape, kernel, attrs", CASES)
def test_average_pool_3d(shape, kernel, attrs, count_include_pad):
    node = helper.make_node(
        "AveragePool",
        ["x"],
        ["y"],
        kernel_shape=kernel,
        count_include_pad=count_include_pad,
        **attrs,
    )
    opset = 19
    assert_matches_onnxruntime(make_model(node, {"x": shape}, {"y": None}, opset), passes=[])


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool"])
def test_global_pool_5d(op):
    node = helper.make_node(op, ["x"], ["y"])
    model = make_model(node, {"x": (2, 3, 4, 5, 6)}, {"y": None})
    assert_matches_onnxruntime(model, passes=[])
