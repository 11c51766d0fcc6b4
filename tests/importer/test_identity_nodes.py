"""Nodes that return their input as it is are dropped at import (folding.drop_identity_nodes):
an Identity, a Cast to the input's own type (the TorchScript exporter's pair of float Casts
after an eager attention's softmax), an inference Dropout whose mask nothing reads. A Cast to
another type, a Dropout whose mask is read and a node writing a graph output stay. Checked
against onnxruntime."""

from __future__ import annotations

import numpy as np
from conftest import FP32_ATOL, FP32_RTOL, OnnxWriter
from onnx import TensorProto, helper

from onnx2bir.compiler import compile_model, import_graph
from onnx2bir.options import CompileOptions
from onnx2bir.runtime.machine.interpreter import run_function
from onnx2bir.runtime.oracle.ort import run_onnxruntime


def _ops(model) -> list[str]:
    graph = import_graph(model)
    return sorted(graph.node(n)["op_type"] for n in graph.topological_order())


def _matches_onnxruntime(model, shape) -> None:
    feeds = {"s": np.random.default_rng(0).standard_normal(shape).astype(np.float32)}
    got = run_function(compile_model(model, CompileOptions(auto_cast="none")).module, feeds)
    want = run_onnxruntime(model, feeds)
    for name, value in want.items():
        np.testing.assert_allclose(got[name], value, rtol=FP32_RTOL, atol=FP32_ATOL)


def _softmax_then(*ops: tuple[str, dict]):
    """s → Softmax → each (op, attrs) in turn → MatMul by a constant (the scores' reader)."""
    w = OnnxWriter()
    x = w.op("Softmax", [w.input("s", (2, 5, 5))], axis=-1, name="softmax")
    for index, (op, attrs) in enumerate(ops):
        x = w.op(op, [x], name=f"{op.lower()}_{index}", **attrs)
    weight = np.random.default_rng(1).standard_normal((5, 3))
    return w.model(w.op("MatMul", [x, w.const(weight)], name="pv"))


def test_a_pair_of_float_casts_after_a_softmax_is_dropped():
    model = _softmax_then(("Cast", {"to": TensorProto.FLOAT}), ("Cast", {"to": TensorProto.FLOAT}))
    assert _ops(model) == ["MatMul", "Softmax"]
    _matches_onnxruntime(model, (2, 5, 5))


def test_identity_and_an_inference_dropout_are_dropped():
    model = _softmax_then(("Identity", {}), ("Dropout", {}))
    assert _ops(model) == ["MatMul", "Softmax"]
    _matches_onnxruntime(model, (2, 5, 5))


def test_a_cast_to_another_type_is_kept():
    w = OnnxWriter()
    half = w.op("Cast", [w.op("Relu", [w.input("s", (4, 6))])], to=TensorProto.FLOAT16)
    model = w.model(w.op("Cast", [w.op("Sigmoid", [half])], to=TensorProto.FLOAT))
    assert _ops(model) == ["Cast", "Cast", "Relu", "Sigmoid"]
    _matches_onnxruntime(model, (4, 6))


def test_a_cast_writing_a_graph_output_stays():
    model = _softmax_then()
    cast = helper.make_node("Cast", [model.graph.output[0].name], ["out"], to=TensorProto.FLOAT)
    model.graph.node.append(cast)
    model.graph.output[0].name = "out"
    assert _ops(model) == ["Cast", "MatMul", "Softmax"]
    _matches_onnxruntime(model, (2, 5, 5))


def test_a_dropout_whose_mask_is_read_stays():
    w = OnnxWriter()
    x = w.op("Relu", [w.input("s", (4, 6))])
    w.nodes.append(helper.make_node("Dropout", [x], ["kept", "mask"], name="dropout"))
    mask = w.op("Cast", ["mask"], to=TensorProto.FLOAT)
    model = w.model(w.op("Add", ["kept", mask]))
    assert "Dropout" in _ops(model)
