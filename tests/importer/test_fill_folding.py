"""A large ConstantOfShape is never materialised: consumers fold against a view of its value,
and a fill read at run time stays a node that the machine writes (a Memset)."""

from __future__ import annotations

import tracemalloc

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from onnx2bir.compiler import compile_model
from onnx2bir.frontend.importer import import_parts
from onnx2bir.runtime.machine.interpreter import run_function
from onnx2bir.runtime.oracle.ort import run_onnxruntime


def _fill_model(shape, value, consumer_nodes, x_shape, dtype=TensorProto.FLOAT):
    fill = helper.make_node(
        "ConstantOfShape",
        ["fill_shape"],
        ["fill"],
        value=helper.make_tensor("value", dtype, [1], [value]),
    )
    graph = helper.make_graph(
        [fill, *consumer_nodes],
        "fill",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.array(shape, np.int64), "fill_shape")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _run_both(model):
    compilation = compile_model(model)
    x = np.random.default_rng(0).standard_normal(compilation.graph.tensors["x"].shape)
    feeds = {"x": x.astype(np.float32)}
    return run_function(compilation.module, feeds)["y"], run_onnxruntime(model, feeds)["y"]


def test_a_large_fill_read_at_run_time_stays_a_node_the_machine_writes():
    model = _fill_model([96, 200], 0.25, [helper.make_node("Add", ["x", "fill"], ["y"])], (96, 200))
    imported = import_parts(model)
    ops = [data["op_type"] for _, data in imported.graph.nodes()]
    assert ops == ["ConstantOfShape", "Add"]
    assert "fill" not in imported.weights and not imported.graph.tensors["fill"].is_const
    actual, expected = _run_both(model)
    np.testing.assert_allclose(actual, expected, rtol=1e-6, atol=1e-6)


def test_an_integer_fill_is_exact():
    nodes = [
        helper.make_node("Cast", ["fill"], ["fill_f"], to=TensorProto.FLOAT),
        helper.make_node("Add", ["x", "fill_f"], ["y"]),
    ]
    model = _fill_model([70, 130], 7, nodes, (70, 130), TensorProto.INT64)
    actual, expected = _run_both(model)
    np.testing.assert_array_equal(actual, expected)


def test_consumers_of_a_large_fill_fold_and_the_fill_disappears():
    nodes = [
        helper.make_node("ReduceSum", ["fill"], ["total"], keepdims=0),
        helper.make_node("Mul", ["x", "total"], ["y"]),
    ]
    model = _fill_model([64, 128], 0.5, nodes, (4,))
    imported = import_parts(model)
    assert [data["op_type"] for _, data in imported.graph.nodes()] == ["Mul"]
    actual, expected = _run_both(model)
    np.testing.assert_allclose(actual, expected, rtol=1e-6)


def test_a_folded_fill_is_never_allocated():
    """32 MiB of fp32 if materialised; the import holds a zero-stride view and sums it."""
    nodes = [
        helper.make_node("ReduceSum", ["fill"], ["total"], keepdims=0),
        helper.make_node("Mul", ["x", "total"], ["y"]),
    ]
    model = _fill_model([2048, 4096], 1.0, nodes, (4,))
    tracemalloc.start()
    imported = import_parts(model)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 8 << 20, peak
    assert imported.graph.tensors["total"].const == 2048 * 4096
