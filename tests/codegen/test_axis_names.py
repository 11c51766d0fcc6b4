"""Loop axes are unique in a function whatever the hints: "h" counted to 20 and "h2" counted
from 0 once both made "h20", which the verifier refuses (an MLP kernel in a model with 20
other "h" loops)."""

from __future__ import annotations

from onnx import TensorProto, helper

from onnx2bir.codegen.driver import BirCodeGen
from onnx2bir.frontend.importer import import_model
from onnx2bir.options import CompileOptions


def test_axes_stay_unique_when_one_hint_ends_in_digits_of_another():
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    cg = BirCodeGen(import_model(model), CompileOptions(), {}, {})
    cg.before_function()
    axes = []
    for hint in ["h"] * 5 + ["h2"] + ["h"] * 20 + ["h2", "h1"] + ["h"] * 3:
        with cg.loop(hint, 0, 2) as axis:
            axes.append(axis)
    assert len(set(axes)) == len(axes), axes
    assert axes[:3] == ["h0", "h1", "h2"] and axes[5] == "h20"
