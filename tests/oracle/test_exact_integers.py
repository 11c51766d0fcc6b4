"""The oracle's MatMulInteger is exact integer arithmetic whatever the CPU
(runtime/oracle/exact_integers.py, docs/quantization.md#oracle-integers).

onnxruntime's u8s8 kernel sums pairs of products in int16 with saturation on x86-64 CPUs
without VNNI. Each case here is one where that saturation would change the answer — stated
in numpy (`_int16_pairs`, the pair sums of the raw operands clipped to int16, the zero points
applied after, as MLAS does) — and the oracle must give the exact numpy int64 product instead.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from onnx2bir import api
from onnx2bir.runtime.oracle import exact_integers
from onnx2bir.runtime.oracle.ort import run_onnxruntime

U8, I8, I32 = TensorProto.UINT8, TensorProto.INT8, TensorProto.INT32


def _model(a_shape, b, a_zero=None, b_zero=None, opset=13) -> onnx.ModelProto:
    """MatMulInteger(a, b constant, a_zero as a graph input, b_zero constant)."""
    inputs = [helper.make_tensor_value_info("a", U8, list(a_shape))]
    inits = [numpy_helper.from_array(b, "b")]
    names = ["a", "b", "", ""]
    if a_zero is not None:
        inputs.append(helper.make_tensor_value_info("az", U8, list(np.shape(a_zero))))
        names[2] = "az"
    if b_zero is not None:
        inits.append(numpy_helper.from_array(b_zero, "bz"))
        names[3] = "bz"
    while names and not names[-1]:
        names.pop()
    node = helper.make_node("MatMulInteger", names, ["y"], name="mm")
    out = helper.make_tensor_value_info("y", I32, None)
    graph = helper.make_graph([node], "g", inputs, [out], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def _exact(a, b, a_zero=0, b_zero=0) -> np.ndarray:
    return (a.astype(np.int64) - np.int64(a_zero)) @ (b.astype(np.int64) - np.int64(b_zero))


def _int16_pairs(a, b, a_zero=0) -> np.ndarray:
    """What a u8s8 kernel without VNNI computes: Σ over pairs k of sat16(a[2k]·b[2k] +
    a[2k+1]·b[2k+1]) of the raw operands, then − a_zero · Σ b (b's zero point 0)."""
    a64, b64 = a.astype(np.int64), b.astype(np.int64)
    pairs = a64[..., 0::2, None] * b64[0::2] + a64[..., 1::2, None] * b64[1::2]
    return np.clip(pairs, -32768, 32767).sum(axis=-2) - np.int64(a_zero) * b64.sum(axis=0)


def _extreme(rows=4, k=64, n=8):
    """uint8 activations near 255 against int8 weights at ±127/−128: every pair of products
    passes 32767 in some column."""
    rng = np.random.default_rng(0)
    a = rng.integers(200, 256, (1, rows, k)).astype(np.uint8)
    b = np.where(rng.random((k, n)) < 0.5, 127, -128).astype(np.int8)
    b[:, 0], b[:, 1] = 127, -128
    return a, b


def test_saturating_pairs_are_computed_exactly():
    a, b = _extreme()
    zero = np.array(117, np.uint8)  # a run-time zero point, as DynamicQuantizeLinear gives it
    result = run_onnxruntime(_model(a.shape, b, zero, np.array(0, np.int8)), {"a": a, "az": zero})
    exact = _exact(a, b, zero)
    assert not np.array_equal(_int16_pairs(a, b, zero), exact)  # the case saturates
    assert result["y"].dtype == np.int32 and np.array_equal(result["y"], exact)


def test_per_column_weight_zero_points_and_no_zero_points():
    a, b = _extreme()
    b_zero = np.arange(-4, 4).astype(np.int8)
    result = run_onnxruntime(_model(a.shape, b, None, b_zero), {"a": a})
    assert np.array_equal(result["y"], _exact(a, b, 0, b_zero))
    result = run_onnxruntime(_model(a.shape, b), {"a": a})
    assert np.array_equal(result["y"], _exact(a, b))


def test_the_machine_against_the_exact_oracle_passes():
    a, b = _extreme(rows=16, k=96, n=24)
    zero = np.array(200, np.uint8)
    model = _model(a.shape, b, zero, np.array(0, np.int8))
    doc = api.validate(model, inputs={"a": a, "az": zero}).document
    [out] = doc["outputs"]
    assert doc["passed"] and out["bound"] == "exact" and out["max_abs_err"] == 0


def test_a_model_without_matmul_integer_is_run_as_it_is(tmp_path):
    node = helper.make_node("Relu", ["x"], ["y"])
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    data = model.SerializeToString()
    path = tmp_path / "relu.onnx"
    path.write_bytes(data)
    assert exact_integers.prepared(model) == (model, None)
    assert exact_integers.prepared(data) == (data, None)
    assert exact_integers.prepared(str(path)) == (str(path), None)


def test_the_rewrite_keeps_the_output_name_and_reaches_subgraphs(tmp_path):
    a, b = _extreme()
    model = _model(a.shape, b, np.array(3, np.uint8))
    path = tmp_path / "mm.onnx"
    onnx.save(model, path)
    rewritten, folder = exact_integers.prepared(str(path))
    assert folder == tmp_path.resolve()
    ops = [n.op_type for n in rewritten.graph.node]
    assert "MatMulInteger" not in ops and rewritten.graph.node[-1].output[0] == "y"
    # inside an If branch
    branch = helper.make_graph(
        list(model.graph.node), "branch", [], [helper.make_tensor_value_info("y", I32, None)]
    )
    node = helper.make_node("If", ["c"], ["z"], then_branch=branch, else_branch=branch)
    outer = helper.make_graph(
        [node],
        "outer",
        [*model.graph.input, helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("z", I32, None)],
        list(model.graph.initializer),
    )
    nested = helper.make_model(outer, opset_imports=[helper.make_opsetid("", 13)], ir_version=10)
    assert exact_integers.exact_matmul_integers(nested) == 2
    feeds = {"a": a, "az": np.array(3, np.uint8), "c": np.array(True)}
    assert np.array_equal(run_onnxruntime(nested, feeds)["z"], _exact(a, b, 3))


def test_a_per_row_input_zero_point_is_left_to_onnxruntime():
    a, b = _extreme()
    model = _model(a.shape[1:], b)
    model.graph.input.append(helper.make_tensor_value_info("az", U8, [a.shape[1]]))
    model.graph.node[0].input.append("az")
    assert exact_integers.exact_matmul_integers(model) == 0
