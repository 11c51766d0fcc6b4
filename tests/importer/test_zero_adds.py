"""Adds of a constant zero are dropped at import (folding.drop_zero_adds): the eager attention's
zero mask, a zero bias. An Add that broadcasts its runtime input to a bigger shape, adds a
constant that is not all zero, or writes a graph output stays. Checked against onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import FP32_ATOL, FP32_RTOL, OnnxWriter

from onnx2bir.compiler import compile_model, import_graph
from onnx2bir.options import CompileOptions
from onnx2bir.runtime.machine.interpreter import run_function
from onnx2bir.runtime.oracle.ort import run_onnxruntime


def _scores_with_mask(mask: np.ndarray):
    w = OnnxWriter()
    s = w.input("s", (1, 2, 5, 5))
    masked = w.op("Add", [s, w.const(mask)], name="mask_add")
    return w.model(w.op("Softmax", [masked], axis=-1, name="softmax"))


def _ops(model) -> list[str]:
    graph = import_graph(model)
    return sorted(graph.node(n)["op_type"] for n in graph.topological_order())


def _matches_onnxruntime(model, shape) -> None:
    feeds = {"s": np.random.default_rng(0).standard_normal(shape).astype(np.float32)}
    got = run_function(compile_model(model, CompileOptions(auto_cast="none")).module, feeds)
    want = run_onnxruntime(model, feeds)
    for name, value in want.items():
        np.testing.assert_allclose(got[name], value, rtol=FP32_RTOL, atol=FP32_ATOL)


def test_a_zero_mask_add_is_dropped():
    model = _scores_with_mask(np.zeros((1, 1, 5, 5)))
    assert _ops(model) == ["Softmax"]
    _matches_onnxruntime(model, (1, 2, 5, 5))


@pytest.mark.parametrize(
    "mask",
    [np.triu(np.full((1, 1, 5, 5), -1e4), 1), np.full((1, 1, 5, 5), 1e-30)],
    ids=["causal", "tiny"],
)
def test_a_mask_that_is_not_all_zero_is_kept(mask):
    model = _scores_with_mask(mask)
    assert _ops(model) == ["Add", "Softmax"]
    _matches_onnxruntime(model, (1, 2, 5, 5))


def test_an_add_that_broadcasts_its_input_to_a_bigger_shape_is_kept():
    w = OnnxWriter()
    s = w.input("s", (5,))
    wide = w.op("Add", [s, w.const(np.zeros((3, 5)))], name="widen")
    model = w.model(w.op("Relu", [wide]))
    assert _ops(model) == ["Add", "Relu"]
    _matches_onnxruntime(model, (5,))


def test_an_add_writing_a_graph_output_keeps_its_name():
    w = OnnxWriter()
    s = w.input("s", (4, 6))
    out = w.op("Add", [w.op("Relu", [s]), w.const(np.zeros(6))], name="bias")
    model = w.model(out)
    assert _ops(model) == ["Add", "Relu"]
    _matches_onnxruntime(model, (4, 6))


def test_a_zero_bias_in_a_chain_is_dropped_and_its_readers_read_the_input():
    w = OnnxWriter()
    s = w.input("s", (4, 6))
    biased = w.op("Add", [w.const(np.zeros(6)), w.op("Relu", [s])], name="bias")
    model = w.model(w.op("Sigmoid", [biased]))
    assert _ops(model) == ["Relu", "Sigmoid"]
    _matches_onnxruntime(model, (4, 6))
