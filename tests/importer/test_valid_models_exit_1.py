"""Valid models onnx2bir cannot compile exit 1 with every reason; inputs the program needs as
constants are fixed from the inputs given; reductions of an empty set give their identity.

The models are the kind onnx's node suite holds (benchmarks/conformance.py); the answers are
onnxruntime's."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import onnx2bir
from onnx2bir.cli import main
from onnx2bir.errors import CompileError


def _model(nodes, inputs, outputs, opset=18) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def test_types_the_machine_lacks_are_listed_at_once_exit_1(tmp_path, capsys):
    model = _model(
        [helper.make_node("Identity", ["a"], ["s"]), helper.make_node("Identity", ["b"], ["n"])],
        [helper.make_tensor_value_info("a", TensorProto.FLOAT8E4M3FNUZ, [2]),
         helper.make_tensor_value_info("b", TensorProto.STRING, [2])],
        [helper.make_tensor_value_info("s", TensorProto.FLOAT8E4M3FNUZ, [2]),
         helper.make_tensor_value_info("n", TensorProto.STRING, [2])],
        opset=21,
    )  # fmt: skip
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    assert main(["convert", str(path), "-o", str(tmp_path / "out.json")]) == 1
    err = capsys.readouterr().err
    assert "float8e4m3fnuz ('a', 's')" in err and "string ('b', 'n')" in err
    assert not (tmp_path / "out.json").exists()


def test_sequence_input_is_refused_before_its_file_is_read():
    seq = helper.make_tensor_sequence_value_info("seq", TensorProto.FLOAT, None)
    model = _model(
        [helper.make_node("SequenceLength", ["seq"], ["n"])],
        [seq],
        [helper.make_tensor_value_info("n", TensorProto.INT64, [])],
    )
    with pytest.raises(CompileError, match=r"sequence values \('seq'\)"):
        onnx2bir.validate(model, {"seq": np.zeros(1, np.float32)})


def _reduce_with_axes_input() -> onnx.ModelProto:
    return _model(
        [helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=0)],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4, 5]),
         helper.make_tensor_value_info("axes", TensorProto.INT64, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )  # fmt: skip


def test_axes_given_as_an_input_are_fixed_from_the_inputs_given():
    x = np.random.default_rng(0).standard_normal((3, 4, 5)).astype(np.float32)
    feeds = {"x": x, "axes": np.array([-2], np.int64)}
    result = onnx2bir.validate(_reduce_with_axes_input(), feeds, auto_cast="none")
    assert result.passed
    assert any("input 'axes' fixed to its value" in n["message"] for n in result.document["notes"])
    np.testing.assert_allclose(result.outputs["y"], x.sum(1), rtol=1e-5, atol=1e-5)
    # Without the inputs there is no value: refused, exit 1, naming the operand.
    with pytest.raises(CompileError, match="--input-value axes=V"):
        onnx2bir.compile(_reduce_with_axes_input())


def test_a_data_input_read_through_shape_is_not_fixed():
    from onnx2bir.frontend.compile_time_inputs import compile_time_inputs

    model = _model(
        [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Reshape", ["x", "s"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    assert compile_time_inputs(model) == {}
    assert set(compile_time_inputs(_reduce_with_axes_input())) == {"axes"}


@pytest.mark.parametrize(
    ("op", "dtype", "expected"),
    [("ReduceSum", TensorProto.FLOAT, 0.0), ("ReduceProd", TensorProto.FLOAT, 1.0),
     ("ReduceMax", TensorProto.FLOAT, -np.inf), ("ReduceMin", TensorProto.INT32, 2**31 - 1),
     ("ReduceLogSumExp", TensorProto.FLOAT, -np.inf)],
)  # fmt: skip
def test_reduction_of_an_empty_set_is_its_identity(op, dtype, expected):
    np_dtype = helper.tensor_dtype_to_np_dtype(dtype)
    axes = helper.make_tensor("axes", TensorProto.INT64, [1], [1])
    graph = helper.make_graph(
        [helper.make_node(op, ["x", "axes"], ["y"], keepdims=1)],
        "g",
        [helper.make_tensor_value_info("x", dtype, [2, 0, 3])],
        [helper.make_tensor_value_info("y", dtype, [2, 1, 3])],
        [axes],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    result = onnx2bir.validate(model, {"x": np.zeros((2, 0, 3), np_dtype)}, auto_cast="none")
    assert result.passed
    got = result.outputs["y"]
    assert got.shape == (2, 1, 3) and np.all(got == np.asarray(expected, got.dtype))
