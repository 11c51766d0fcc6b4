"""The emulating model of a model older than opset 13, raised to 13 so that its bf16 roundings
are Cast pairs (runtime/oracle/cast_opset.py, docs/validation.md#rounding-cost).

Two things must hold: the Cast pair rounds as the arithmetic form does, bit for bit (random bit
patterns, every kind of tie, subnormals, ±0, ±inf, NaN), and the raised model computes what
the model computed, bit for bit, or is not raised.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx2bir.bir.cast_plan import CastPlan, CastPoint
from onnx2bir.compiler import import_graph
from onnx2bir.runtime.oracle import emulating
from onnx2bir.runtime.oracle.cast_opset import CAST_OPSET, raised_to_cast_opset
from onnx2bir.runtime.oracle.emulating import (
    FORMATS,
    arithmetic_rounding,
    emulating_model,
    rounding_nodes,
    run_emulating,
)
from onnx2bir.runtime.oracle.ort import run_onnxruntime


def _values() -> np.ndarray:
    rng = np.random.default_rng(7)
    bits = rng.integers(0, 2**32, 1_000_000, dtype=np.uint64).astype(np.uint32)
    mantissa = rng.integers(0, 2**7, 20_000)
    exponent = rng.integers(-140, 128, 20_000)  # ties among subnormals and at the top too
    ties = ((2**7 + mantissa + 0.5) * 2.0 ** (exponent - 7.0)).astype(np.float32)
    ties = np.concatenate([ties, (mantissa + 0.5).astype(np.float32) * np.float32(2.0**-133)])
    edges = np.array(
        [0.0, np.inf, np.nan, 2**-149, 2**-134, 3 * 2**-134, 2**-126, 3.3895314e38, 3.4e38],
        np.float32,
    )
    edges = np.concatenate([edges, np.nextafter(edges, np.float32(np.inf))])
    return np.concatenate([bits.view(np.float32), ties, edges, -ties, -edges])


def _round(nodes, consts, x: np.ndarray, opset: int) -> np.ndarray:
    graph = helper.make_graph(
        nodes,
        "round",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [x.size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [x.size])],
        consts,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=7)
    return run_onnxruntime(model.SerializeToString(), {"x": x})["y"]


def _same_bits(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a.view(np.uint32) == b.view(np.uint32)) | (np.isnan(a) & np.isnan(b))


def _nearest_even(x: np.ndarray) -> np.ndarray:
    """bf16 rounding on the float32 bits, ties to even; NaN stays NaN."""
    bits = x.view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)
    return np.where(np.isnan(x), x, rounded.view(np.float32))


def test_the_cast_pair_at_opset_13_rounds_as_the_arithmetic_form():
    """Every float32 bit pattern was checked once (0 of 2^32 differ from `_nearest_even`, in
    122 s); here a million random patterns and the hard cases."""
    x = _values()
    cast_nodes, cast_consts = rounding_nodes("x", "y", "bfloat16", CAST_OPSET, "r")
    assert [n.op_type for n in cast_nodes] == ["Cast", "Cast"]
    cast = _round(cast_nodes, cast_consts, x, CAST_OPSET)
    arithmetic = _round(*arithmetic_rounding("x", "y", FORMATS["bfloat16"], "r"), x, 9)
    bad = np.flatnonzero(~_same_bits(cast, arithmetic))
    assert bad.size == 0, [(x[i], cast[i], arithmetic[i]) for i in bad[:5]]
    assert _same_bits(cast, _nearest_even(x)).all()


def test_a_wrong_rounding_is_told_apart():
    """The check above can fail: truncation, and ties away from zero, are not the Cast's."""
    x = _values()
    cast = _round(*rounding_nodes("x", "y", "bfloat16", CAST_OPSET, "r"), x, CAST_OPSET)
    truncated = (x.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)
    away = ((x.view(np.uint32).astype(np.uint64) + 0x8000) & 0xFFFF0000).astype(np.uint32)
    assert not _same_bits(cast, truncated).all()
    assert not _same_bits(cast, away.view(np.float32)).all()


def _old_model(opset: int, softmax_axis: int | None = None) -> onnx.ModelProto:
    """Conv → Relu → MaxPool → ReduceSum(axes) → Unsqueeze(axes) → Squeeze(axes) → Flatten →
    Gemm → Softmax, at `opset` (9 to 12)."""
    rng = np.random.default_rng(3)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    g = rng.standard_normal((5, 4)).astype(np.float32)
    attrs = {} if softmax_axis is None else {"axis": softmax_axis}
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2], name="mp"),
        helper.make_node("ReduceSum", ["p"], ["s"], axes=[3], keepdims=0, name="sum"),
        helper.make_node("Unsqueeze", ["s"], ["u"], axes=[3], name="unsq"),
        helper.make_node("Squeeze", ["u"], ["q"], axes=[3], name="sq"),
        helper.make_node("ReduceMean", ["q"], ["m"], axes=[2], keepdims=0, name="mean"),
        helper.make_node("Gemm", ["m", "g", "b"], ["gm"], transB=1, name="gemm"),
        helper.make_node("Softmax", ["gm"], ["y"], name="softmax", **attrs),
    ]
    graph = helper.make_graph(
        nodes,
        "old",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5])],
        [
            numpy_helper.from_array(w, "w"),
            numpy_helper.from_array(g, "g"),
            numpy_helper.from_array(rng.standard_normal(5).astype(np.float32), "b"),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=7)


@pytest.mark.parametrize("opset", [9, 11, 12])
def test_a_raised_model_computes_what_the_model_computed_bit_for_bit(opset):
    model = _old_model(opset)
    raised = raised_to_cast_opset(model, lambda t: 2 if t == "gm" else None)
    assert raised is not None
    assert raised.opset_import[0].version == CAST_OPSET
    assert len(raised.graph.node) == len(model.graph.node)  # one node for one node
    onnx.checker.check_model(raised)
    x = np.random.default_rng(0).standard_normal((2, 3, 8, 8)).astype(np.float32)
    before = run_onnxruntime(model.SerializeToString(), {"x": x})["y"]
    after = run_onnxruntime(raised.SerializeToString(), {"x": x})["y"]
    assert np.array_equal(before.view(np.uint32), after.view(np.uint32))


def test_a_node_whose_meaning_changed_keeps_the_model_at_its_opset():
    """A Softmax over an axis that is not the last (it coerced its input to 2-D before 13), a
    Softmax whose input's rank is not known, an Upsample (gone at 13)."""
    assert raised_to_cast_opset(_old_model(9, softmax_axis=0), lambda t: 2) is None
    assert raised_to_cast_opset(_old_model(9), lambda t: None) is None
    upsample = helper.make_model(
        helper.make_graph(
            [helper.make_node("Upsample", ["x", "s"], ["y"])],
            "up",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 2, 2])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
            [numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "s")],
        ),
        opset_imports=[helper.make_opsetid("", 9)],
    )
    assert raised_to_cast_opset(upsample, lambda t: 4) is None


def test_the_emulating_model_of_an_opset_9_model_rounds_with_cast_pairs(monkeypatch):
    """Its activations' bf16 roundings are Cast pairs, and the emulation gives the bits the
    arithmetic rounding gives (the model kept at opset 9)."""
    rng = np.random.default_rng(5)
    w = rng.standard_normal((8, 8)).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"], name="mm1"),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("MatMul", ["r", "w"], ["y"], name="mm2"),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])],
        [numpy_helper.from_array(w, "w")],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 9)], ir_version=7)
    imported = import_graph(proto)
    plan = CastPlan(
        points=(
            CastPoint(node="mm2", input="r", dtype="bfloat16", kind="operand"),
            CastPoint(node="mm1", input="x", dtype="bfloat16", kind="operand"),
        )
    )
    model = emulating_model(proto, imported, plan)
    assert model.opset_import[0].version == CAST_OPSET
    assert "Pow" not in {n.op_type for n in model.graph.node}
    assert sum(n.op_type == "Cast" for n in model.graph.node) == 4
    x = (rng.standard_normal((4, 8)) * 3).astype(np.float32)
    got = run_emulating(proto, imported, {}, plan, {"x": x})["y"]
    monkeypatch.setattr(emulating, "raised_to_cast_opset", lambda model, rank: None)
    arithmetic = emulating_model(proto, imported, plan)
    assert "Pow" in {n.op_type for n in arithmetic.graph.node}
    assert arithmetic.opset_import[0].version == 9
    want = run_emulating(proto, imported, {}, plan, {"x": x})["y"]
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
