"""Ops without a lowering replaced by their ONNX function bodies, and models older than
opset 9 upgraded (frontend/function_expansion.py, frontend/opset_upgrade.py).

The expanded MeanVarianceNormalization is judged against numpy (an independent reference)
as well as onnxruntime's kernel; the upgraded opset-6 model against the answer opset 6
defines (a per-channel PRelu slope)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import onnx2bir
from onnx2bir.frontend.function_expansion import expand_functions
from onnx2bir.frontend.opset_upgrade import upgrade_old_opset


def _mvn_model() -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("MeanVarianceNormalization", ["x"], ["y"], axes=[0, 2])],
        "mvn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 2, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def test_op_without_lowering_is_expanded_and_matches_numpy_and_onnxruntime():
    x = np.random.default_rng(0).standard_normal((3, 2, 5)).astype(np.float32) * 4 + 1
    result = onnx2bir.validate(_mvn_model(), {"x": x}, auto_cast="none")
    assert result.passed
    assert any("MeanVarianceNormalization x1 replaced by the function body" in n["message"]
               for n in result.document["notes"])  # fmt: skip
    wide = x.astype(np.float64)
    mean, std = wide.mean((0, 2), keepdims=True), wide.std((0, 2), keepdims=True)
    np.testing.assert_allclose(result.outputs["y"], (wide - mean) / std, rtol=1e-5, atol=1e-5)
    # The same check rejects normalising over the default axes (0, 2, 3 -> here 0, 2 of
    # another layout): an attribute lost in the expansion would be caught.
    other = (wide - wide.mean((0, 1), keepdims=True)) / wide.std((0, 1), keepdims=True)
    assert not np.allclose(result.outputs["y"], other, rtol=1e-5, atol=1e-5)


def test_lowered_and_raised_ops_are_not_expanded():
    model = _mvn_model()
    assert expand_functions(model, frozenset({"MeanVarianceNormalization"})) == {}
    assert [n.op_type for n in model.graph.node] == ["MeanVarianceNormalization"]
    assert expand_functions(model)["MeanVarianceNormalization"] == 1
    assert "MeanVarianceNormalization" not in {n.op_type for n in model.graph.node}
    # Attention is the attention passes' to raise or decompose: kept whole.
    node = helper.make_node("Attention", ["q", "k", "v"], ["y"])
    graph = helper.make_graph(
        [node],
        "attention",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 2, 4, 8]) for n in "qkv"],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    attention = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    assert expand_functions(attention) == {}


def _prelu_opset6() -> onnx.ModelProto:
    slope = helper.make_tensor("slope", TensorProto.FLOAT, [3], [0.1, -0.5, 2.0])
    graph = helper.make_graph(
        [helper.make_node("PRelu", ["x", "slope"], ["y"])],
        "prelu6",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 4])],
        [slope],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 6)], ir_version=3)


def test_opset6_model_is_upgraded_with_its_meaning_kept():
    x = np.linspace(-3, 3, 24, dtype=np.float32).reshape(2, 3, 4)
    result = onnx2bir.validate(_prelu_opset6(), {"x": x}, auto_cast="none")
    assert result.passed
    assert any("opset 6 upgraded to opset 9" in n["message"] for n in result.document["notes"])
    # Opset 6's meaning: the [3] slope is per channel (axis 1), not broadcast on the last axis.
    slope = np.array([0.1, -0.5, 2.0], np.float32).reshape(1, 3, 1)
    np.testing.assert_allclose(result.outputs["y"], np.where(x >= 0, x, x * slope), rtol=1e-6)


def test_upgrade_leaves_new_models_alone():
    model = _mvn_model()
    assert upgrade_old_opset(model) == (model, None)


def test_an_old_model_the_converter_cannot_upgrade_is_refused_with_exit_1():
    # opset 1's BatchNormalization has a consumed_inputs attribute the converter cannot map
    # when the model is otherwise broken for it: a graph reading an undefined tensor.
    graph = helper.make_graph(
        [helper.make_node("Relu", ["missing"], ["y"])],
        "broken",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 5)], ir_version=3)
    with pytest.raises(onnx2bir.errors.CompileError, match="version_converter cannot upgrade"):
        upgrade_old_opset(model)


def test_a_wrong_function_body_fails_validation_by_itself(monkeypatch):
    """The emulating oracle runs the expanded model, so a wrong body would agree with itself;
    the validation's import-rewrite check runs the model as given in onnxruntime too."""
    from onnx2bir.frontend import importer

    x = np.random.default_rng(0).standard_normal((3, 2, 5)).astype(np.float32) * 4 + 1
    right = onnx2bir.validate(_mvn_model(), {"x": x}, auto_cast="none")
    assert [c["passed"] for c in right.document["import_rewrite_check"]] == [True]

    def wrong_expansion(model):  # the body with its division turned into a product
        counts = expand_functions(model)
        for node in model.graph.node:
            if node.op_type == "Div":
                node.op_type = "Mul"
        return counts

    monkeypatch.setattr(importer, "expand_functions", wrong_expansion)
    wrong = onnx2bir.validate(_mvn_model(), {"x": x}, auto_cast="none")
    assert not wrong.passed
    assert [c["passed"] for c in wrong.document["import_rewrite_check"]] == [False]
