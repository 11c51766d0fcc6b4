"""A weight's Transpose or Reshape folds whatever its size (docs/input_contracts.md#folding):
a tied embedding read as the head's weight is laid out once, at compile time, not on every
run; a node that computes a large value still does not fold."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from onnx2bir.compiler import compile_model
from onnx2bir.frontend import folding
from onnx2bir.options import CompileOptions
from onnx2bir.runtime.machine.interpreter import run_function
from onnx2bir.runtime.oracle.ort import run_onnxruntime

VOCAB, HIDDEN, TOKENS = 512, 64, 8


def tied_embedding_model():
    """Gather from an embedding E [V, H], then logits = x · Transpose(E): the tied head."""
    table = np.random.default_rng(0).standard_normal((VOCAB, HIDDEN)).astype(np.float32)
    nodes = [
        helper.make_node("Gather", ["embedding", "ids"], ["hidden"]),
        helper.make_node("Transpose", ["embedding"], ["head"], perm=[1, 0]),
        helper.make_node("MatMul", ["hidden", "head"], ["logits"]),
    ]
    graph = helper.make_graph(
        nodes,
        "tied",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [TOKENS])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [TOKENS, VOCAB])],
        [numpy_helper.from_array(table, "embedding")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_large_weight_transpose_folds_and_matches_onnxruntime(monkeypatch):
    monkeypatch.setattr(folding, "_FOLD_MAX_ELEMENTS", VOCAB * HIDDEN // 4)
    model = tied_embedding_model()
    compilation = compile_model(model, CompileOptions(auto_cast="none"))  # fp32: the fp32 bound
    ops = sorted(data["op_type"] for _, data in compilation.graph.nodes())
    assert "Transpose" not in ops, ops
    (head,) = [
        name
        for name, info in compilation.graph.tensors.items()
        if info.is_const and tuple(info.shape) == (HIDDEN, VOCAB)
    ]
    table = numpy_helper.to_array(model.graph.initializer[0])
    np.testing.assert_array_equal(np.asarray(compilation.graph.tensors[head].const), table.T)
    ids = np.random.default_rng(1).integers(0, VOCAB, TOKENS).astype(np.int64)
    got = run_function(compilation.module, {"ids": ids})["logits"]
    want = run_onnxruntime(model, {"ids": ids})["logits"]
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4)


def test_a_large_computed_value_still_does_not_fold(monkeypatch):
    """An Expand of a small constant to a large shape would hold a tensor no initializer
    did: it stays a node."""
    monkeypatch.setattr(folding, "_FOLD_MAX_ELEMENTS", 1024)
    nodes = [
        helper.make_node("Expand", ["row", "shape"], ["wide"]),
        helper.make_node("Add", ["x", "wide"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "expand",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 64])],
        [
            numpy_helper.from_array(np.arange(64, dtype=np.float32)[None], "row"),
            numpy_helper.from_array(np.array([64, 64], np.int64), "shape"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    compilation = compile_model(model)
    ops = [data["op_type"] for _, data in compilation.graph.nodes()]
    assert "Expand" in ops, ops
