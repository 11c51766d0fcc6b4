"""GroupNormalization and RMSNormalization against onnxruntime over a seeded sweep."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import assert_matches_onnxruntime, make_model
from onnx import helper

RNG = np.random.default_rng(21)


@pytest.mark.parametrize(
    "shape, groups", [((1, 8, 5, 5), 4), ((2, 6, 7), 3), ((1, 32, 4, 4), 32), ((3, 12, 2, 3), 1)]
)
def test_group_norm(shape, groups):
    channels = shape[1]
    inits = {
        "scale": RNG.uniform(0.5, 1.5, channels).astype(np.float32),
        "bias": RNG.uniform(-0.5, 0.5, channels).astype(np.float32),
    }
    node = helper.make_node(
        "GroupNormalization", ["x", "scale", "bias"], ["y"], num_groups=groups, epsilon=1e-4
    )
    model = make_model(node, {"x": shape}, {"y": shape}, opset=21, initializers=inits)
    assert_matches_onnxruntime(model, passes=[])


@pytest.mark.parametrize(
    "shape, axis", [((2, 5, 16), -1), ((3, 40), 1), ((130, 24), -1), ((2, 3, 4, 5), 2)]
)
def test_rms_norm(shape, axis):
    scale_shape = shape[axis:]
    inits = {"scale": RNG.uniform(0.5, 1.5, scale_shape).astype(np.float32)}
    node = helper.make_node("RMSNormalization", ["x", "scale"], ["y"], axis=axis, epsilon=1e-5)
    model = make_model(node, {"x": shape}, {"y": None}, opset=23, initializers=inits)
    assert_matches_onnxruntime(model, passes=[])
