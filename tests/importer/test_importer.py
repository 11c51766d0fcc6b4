"""The importer: static shapes, folding of shape arithmetic, the graph's edges and order."""

from __future__ import annotations

import contextlib

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx2bir.errors import UserError
from onnx2bir.frontend.importer import import_model
from onnx2bir.graph import TensorInfo


def _model(nodes, inputs, outputs, initializers=(), opset=17):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=9)


def test_mul_of_a_tensor_by_itself_keeps_both_edges():
    model = _model(
        [
            helper.make_node("Relu", ["x"], ["r"], name="relu"),
            helper.make_node("Mul", ["r", "r"], ["y"], name="square"),
        ],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
    )
    graph = import_model(model)
    edges = sorted((u, v, d["tensor"], d["index"]) for u, v, d in graph.nx.edges(data=True))
    assert edges == [("relu", "square", "r", 0), ("relu", "square", "r", 1)]
    assert graph.consumers("r") == [("square", 0), ("square", 1)]


def test_shape_subgraph_folds_to_a_constant_reshape_target():
    # Reshape(x, Concat(Gather(Shape(x), 0), [-1])): the classic exported flatten.
    model = _model(
        [
            helper.make_node("Shape", ["x"], ["s"]),
            helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
            helper.make_node("Unsqueeze", ["n", "zero_axes"], ["n1"]),
            helper.make_node("Concat", ["n1", "minus_one"], ["target"], axis=0),
            helper.make_node("Reshape", ["x", "target"], ["y"], name="flatten"),
        ],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["d0", "d1"])],
        [
            numpy_helper.from_array(np.array(0, np.int64), "zero"),
            numpy_helper.from_array(np.array([0], np.int64), "zero_axes"),
            numpy_helper.from_array(np.array([-1], np.int64), "minus_one"),
        ],
    )
    graph = import_model(model, dims={"batch": 5})
    assert dict(graph.op_counts()) == {"Reshape": 1}
    target = graph.tensors["target"]
    assert target.is_const and target.const.tolist() == [5, -1]
    assert graph.tensors["y"].shape == (5, 12)


def test_constant_of_shape_and_range_fold():
    model = _model(
        [
            helper.make_node(
                "ConstantOfShape",
                ["shape"],
                ["ones"],
                value=numpy_helper.from_array(np.array([1.0], np.float32)),
            ),
            helper.make_node("Range", ["start", "limit", "delta"], ["r"]),
            helper.make_node("Cast", ["r"], ["rf"], to=TensorProto.FLOAT),
            helper.make_node("Add", ["ones", "rf"], ["c"]),
            helper.make_node("Add", ["x", "c"], ["y"], name="add"),
        ],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
        [
            numpy_helper.from_array(np.array([4], np.int64), "shape"),
            numpy_helper.from_array(np.array(0, np.int64), "start"),
            numpy_helper.from_array(np.array(4, np.int64), "limit"),
            numpy_helper.from_array(np.array(1, np.int64), "delta"),
        ],
    )
    graph = import_model(model)
    assert list(graph.op_counts()) == ["Add"]
    np.testing.assert_array_equal(graph.tensors["c"].const, [1, 2, 3, 4])


def test_input_shape_option_replaces_the_declared_shape():
    model = _model(
        [helper.make_node("Relu", ["x"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", "c"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", "c"])],
    )
    graph = import_model(model, input_shapes={"x": (2, 7)})
    assert graph.tensors["x"].shape == (2, 7)
    assert graph.tensors["y"].shape == (2, 7)


def test_unset_symbolic_dimension_is_named_with_the_fix():
    model = _model(
        [helper.make_node("Relu", ["x"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])],
    )
    with pytest.raises(UserError) as info:
        import_model(model)
    message = str(info.value)
    assert "'x'" in message and "'batch'" in message
    assert "--dim batch=N" in message and "--input-shape x=" in message


def test_input_shape_for_an_unknown_input_lists_the_real_ones():
    model = _model(
        [helper.make_node("Relu", ["x"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])],
    )
    with pytest.raises(UserError, match="model's inputs are: x"):
        import_model(model, input_shapes={"data": (3,)})


def test_node_names_are_unique_and_order_is_topological():
    model = _model(
        [
            helper.make_node("Relu", ["x"], ["a"], name="n"),
            helper.make_node("Relu", ["a"], ["b"], name="n"),
            helper.make_node("Relu", ["b"], ["y"]),
        ],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])],
    )
    graph = import_model(model)
    assert [name for name, _ in graph.nodes()] == ["n", "n_1", "Relu_2"]
    assert graph.topological_order() == ["n", "n_1", "Relu_2"]


def test_a_node_replaced_in_place_keeps_its_place_in_the_order():
    # a and b are independent; a rewrite replaces a (remove, add a helper and the new a).
    # Inside in_place_of they keep a's place; added plainly they would run after b.
    model = _model(
        [
            helper.make_node("Relu", ["x"], ["a"], name="a"),
            helper.make_node("Neg", ["x"], ["b"], name="b"),
            helper.make_node("Add", ["a", "b"], ["y"], name="add"),
        ],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])],
    )

    def replaced(graph, in_place: bool) -> list[str]:
        graph.tensors["x2"] = TensorInfo("x2", (3,), graph.tensors["x"].dtype)
        with graph.in_place_of("a") if in_place else contextlib.nullcontext():
            graph.remove_node("a")
            graph.add_node("a/pre", "Abs", ["x"], ["x2"])
            graph.add_node("a", "Relu", ["x2"], ["a"])
        return graph.topological_order()

    assert replaced(import_model(model), True) == ["a/pre", "a", "b", "add"]
    assert replaced(import_model(model), False) == ["b", "a/pre", "a", "add"]


def test_attributes_are_plain_python_values():
    model = _model(
        [
            helper.make_node(
                "Conv", ["x", "w"], ["y"], name="conv", pads=[1, 1, 1, 1], auto_pad="NOTSET"
            )
        ],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 4, 4])],
        [numpy_helper.from_array(np.ones((1, 1, 3, 3), np.float32), "w")],
    )
    attrs = import_model(model).node("conv")["attrs"]
    assert attrs == {"pads": [1, 1, 1, 1], "auto_pad": "NOTSET"}
    assert isinstance(attrs["auto_pad"], str)


def test_a_model_failing_the_checker_is_a_user_error():
    model = _model(
        [helper.make_node("Relu", ["missing"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])],
    )
    with pytest.raises(UserError, match="fails the ONNX checker"):
        import_model(model)


def test_external_data_outside_the_model_folder_is_refused(tmp_path):
    model = _model(
        [helper.make_node("Add", ["x", "w"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64])],
        [numpy_helper.from_array(np.ones(64, np.float32), "w")],
    )
    inside = tmp_path / "model"
    inside.mkdir()
    (tmp_path / "secret.bin").write_bytes(np.ones(64, np.float32).tobytes())
    weight = model.graph.initializer[0]
    weight.ClearField("raw_data")
    weight.data_location = onnx.TensorProto.EXTERNAL
    entry = weight.external_data.add()
    entry.key, entry.value = "location", "../secret.bin"
    path = inside / "m.onnx"
    path.write_bytes(model.SerializeToString())
    with pytest.raises(UserError, match="outside the model's folder"):
        import_model(path)
