"""Lowerings of the ops real exports added (LogSoftmax, Sin/Cos, Floor/Ceil/Round, Mod, Mean,
DepthToSpace/SpaceToDepth, ArgMax/ArgMin) against onnxruntime over a seeded sweep of shapes and
attributes; each case is one node through its generic lowering on the machine."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import assert_matches_onnxruntime, make_model, one_node_model
from onnx import TensorProto, helper

SWEEP = np.random.default_rng(13)


def check(model, **kwargs):
    return assert_matches_onnxruntime(model, passes=[], **kwargs)


def _shapes(count: int, rank: int, low: int = 1, high: int = 9) -> list[tuple[int, ...]]:
    return [tuple(int(d) for d in SWEEP.integers(low, high, rank)) for _ in range(count)]


@pytest.mark.parametrize(
    "shape, axis",
    [
        (shape, axis)
        for shape in [(3, 7), (2, 5, 9), (130, 40), (4, 3000), (1, 9000)]
        for axis in (-1, 0, 1)
        if axis < len(shape)  # every axis these ranks have
    ],
)
def test_log_softmax(shape, axis):
    check(one_node_model("LogSoftmax", {"x": shape}, axis=axis, opset=13))


def test_log_softmax_opset11_flattens():
    check(one_node_model("LogSoftmax", {"x": (2, 3, 5)}, axis=1, opset=11))


@pytest.mark.parametrize("op", ["Sin", "Cos"])
@pytest.mark.parametrize("shape", _shapes(2, 3) + [(129, 2100)])
def test_trig(op, shape):
    feeds = {"x": SWEEP.uniform(-20, 20, shape).astype(np.float32)}
    # fp32 rounding of an argument up to 20 is 1e-6: that is the error near the zeros
    check(one_node_model(op, {"x": shape}), feeds=feeds, atol=2e-6)


def _rounding_inputs(shape) -> np.ndarray:
    x = SWEEP.uniform(-6, 6, shape).astype(np.float32)
    flat = x.reshape(-1)
    ties = np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 3.0, -3.0, 0.49999997, 1e9, -1e9])
    flat[: min(len(ties), flat.size)] = ties[: flat.size]
    return x


@pytest.mark.parametrize("op", ["Floor", "Ceil", "Round"])
@pytest.mark.parametrize("shape", [(4, 9), (3, 130, 5), (20000,)])
def test_rounding(op, shape):
    feeds = {"x": _rounding_inputs(shape)}
    check(one_node_model(op, {"x": shape}), feeds=feeds, atol=0, rtol=0)


@pytest.mark.parametrize("fmod", [0, 1])
@pytest.mark.parametrize("shapes", [((4, 6), (4, 6)), ((3, 5, 7), (7,)), ((130, 3), (1, 3))])
def test_mod_float_and_integer(fmod, shapes):
    a_shape, b_shape = shapes
    a = SWEEP.integers(-50, 50, a_shape)
    b = SWEEP.integers(1, 9, b_shape) * SWEEP.choice([-1, 1], b_shape)
    node = helper.make_node("Mod", ["a", "b"], ["y"], fmod=fmod)
    ints = make_model(node, {"a": a_shape, "b": b_shape}, {"y": None}, elem_type=TensorProto.INT64)
    check(ints, feeds={"a": a.astype(np.int64), "b": b.astype(np.int64)}, atol=0, rtol=0)
    # a float Mod with fmod=0 (floor mod) is valid from opset 28
    floats = make_model(node, {"a": a_shape, "b": b_shape}, {"y": None}, opset=28)
    feeds = {"a": (a * 0.37).astype(np.float32), "b": (b * 0.5).astype(np.float32)}
    check(floats, feeds=feeds)


def test_mod_edge_cases_follow_the_divisor_sign():
    a = np.array([3.0, -3.0, 3.0, -3.0, 0.0, -0.0, 5.5, -5.5], np.float32)
    b = np.array([np.inf, np.inf, -np.inf, -np.inf, 2.0, -2.0, 2.0, 2.0], np.float32)
    node = helper.make_node("Mod", ["a", "b"], ["y"], fmod=0)
    model = make_model(node, {"a": (8,), "b": (8,)}, {"y": None}, opset=28)
    check(model, feeds={"a": a, "b": b})


@pytest.mark.parametrize("count", [1, 2, 3])
def test_mean_broadcasts(count):
    shapes = [(2, 3, 4), (3, 1), (4,)][:count]
    names = [f"x{i}" for i in range(count)]
    node = helper.make_node("Mean", names, ["y"])
    check(make_model(node, dict(zip(names, shapes, strict=True)), {"y": None}))


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
@pytest.mark.parametrize("shape, block", [((1, 8, 3, 4), 2), ((2, 18, 2, 3), 3), ((1, 4, 1, 1), 2)])
def test_depth_to_space(mode, shape, block):
    check(one_node_model("DepthToSpace", {"x": shape}, blocksize=block, mode=mode))


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
@pytest.mark.parametrize("shape, block", [((1, 2, 4, 6), 2), ((2, 3, 6, 3), 3), ((1, 1, 2, 2), 2)])
def test_space_to_depth(mode, shape, block):
    if mode == "DCR":  # the default, and the only mode before opset 28: no attribute
        check(one_node_model("SpaceToDepth", {"x": shape}, blocksize=block))
        return
    model = one_node_model("SpaceToDepth", {"x": shape}, blocksize=block, mode=mode, opset=28)
    check(model)


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("shape, axis", [((5, 7), 1), ((5, 7), 0), ((2, 3, 4), 1), ((300, 6), -1)])
@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("last", [0, 1])
def test_arg_extreme(op, shape, axis, keepdims, last):
    # few distinct values, so that ties (first versus last index) really occur
    feeds = {"x": SWEEP.integers(-3, 4, shape).astype(np.float32)}
    node = helper.make_node(op, ["x"], ["y"], axis=axis, keepdims=keepdims, select_last_index=last)
    graph = helper.make_graph(
        [node],
        "arg",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("y", TensorProto.INT64, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    check(model, feeds=feeds, atol=0, rtol=0)


# ScalarE takes sin on [-pi, pi], log on [2^-64, 2^64], sqrt from 2^-116, reciprocal from 2^-42
# (docs/neuroncore.md#rules, ACT-RANGE): the lowerings must be right on the whole line.
SPECIALS = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, 1e-40, 2.0**-64, 2.0**64, 3e38, -3e38]


def _whole_line(shape, low, high) -> np.ndarray:
    x = SWEEP.uniform(low, high, shape).astype(np.float32).reshape(-1)
    x[: len(SPECIALS)] = SPECIALS
    return x.reshape(shape)


@pytest.mark.parametrize("op", ["Sin", "Cos"])
def test_trig_of_large_arguments_and_special_values(op):
    x = _whole_line((64, 300), -1000, 1000)
    x[1, :9] = [np.pi, -np.pi, 2 * np.pi, 3 * np.pi, -5 * np.pi / 2, 1e5, -1e6, 1e7, 16777216.0]
    # The reduction is exact to about 1e8 (docs/neuroncore.md#rules): 2^64 and ±3e38 are out
    x[0, 8:11] = 0.0
    check(one_node_model(op, {"x": x.shape}), feeds={"x": x}, atol=2e-6)


@pytest.mark.parametrize("op", ["Log", "Sqrt", "Reciprocal"])
def test_ranged_functions_on_the_whole_line(op):
    x = np.concatenate([_whole_line((32, 100), 1e-3, 1e3), _whole_line((32, 100), -1e3, 1e3)])
    x[1, :6] = [1e-30, 1e30, 2.0**-43, 2.0**43, 2.0**-120, 2.0**120]
    check(one_node_model(op, {"x": x.shape}), feeds={"x": x})
