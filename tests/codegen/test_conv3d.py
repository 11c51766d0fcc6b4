"""3-D Conv against onnxruntime over a seeded sweep of kernels, strides, pads, dilations and
groups (the depth taps folded into channels of the generic 2-D conv)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import assert_matches_onnxruntime, make_model
from onnx import helper

CASES = {
    "3x3x3_pad1": ((1, 3, 4, 6, 6), (5, 3, 3, 3, 3), True, {"pads": [1, 1, 1, 1, 1, 1]}),
    "stride2": ((1, 2, 5, 7, 7), (4, 2, 3, 3, 3), False, {"strides": [2, 2, 2]}),
    "r2plus1d_temporal": ((2, 4, 6, 3, 3), (6, 4, 3, 1, 1), True, {"pads": [1, 0, 0, 1, 0, 0]}),
    "spatial_only": ((1, 3, 2, 8, 8), (4, 3, 1, 3, 3), True, {"pads": [0, 1, 1, 0, 1, 1]}),
    "dilated_grouped": (
        (1, 4, 6, 6, 6),
        (6, 2, 2, 3, 3),
        True,
        {"group": 2, "dilations": [2, 1, 2], "pads": [1, 1, 2, 0, 1, 2]},
    ),
    "same_upper": ((1, 2, 5, 5, 5), (3, 2, 3, 3, 3), False, {"auto_pad": "SAME_UPPER"}),
    "cin160": ((1, 160, 3, 4, 4), (8, 160, 3, 3, 3), True, {"pads": [1, 1, 1, 1, 1, 1]}),
}


@pytest.mark.parametrize("name", list(CASES))
def test_conv3d(name):
    x_shape, w_shape, bias, attrs = CASES[name]
    rng = np.random.default_rng(len(name))
    inits = {"w": rng.standard_normal(w_shape).astype(np.float32) * 0.3}
    inputs = ["x", "w"]
    if bias:
        inits["b"] = rng.standard_normal(w_shape[0]).astype(np.float32)
        inputs.append("b")
    node = helper.make_node("Conv", inputs, ["y"], **attrs)
    model = make_model(node, {"x": x_shape}, {"y": None}, initializers=inits)
    assert_matches_onnxruntime(model, passes=[])
