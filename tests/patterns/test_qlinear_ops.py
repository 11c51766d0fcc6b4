"""QOperator ops and DynamicQuantizeLinear expanded into standard ops
(patterns/quant/qlinear_ops.py), checked against onnxruntime by `validate` (integer outputs
must be equal), most on every input value or pair of values;
and the verdict shown to catch an expansion one step off."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper as h

from onnx2bir import api
from onnx2bir.compiler import import_graph
from onnx2bir.errors import UserError
from onnx2bir.frontend.vendor_shapes import add_vendor_shapes
from onnx2bir.options import CompileOptions
from onnx2bir.patterns.quant import qlinear_ops
from onnx2bir.patterns.quant.qlinear_ops import ExpandQLinearOps

MS = "com.microsoft"
RANGES = {np.uint8: (0, 255), np.int8: (-128, 127)}


def _elem(dtype) -> int:
    return TP.UINT8 if dtype == np.uint8 else TP.INT8


def _model(nodes, inputs, outputs, inits, opset=17) -> onnx.ModelProto:
    graph = h.make_graph(nodes, "g", inputs, outputs, inits)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", opset), h.make_opsetid(MS, 1)])
    model.ir_version = 10
    return model


def _scalars(dtype, **values) -> list[onnx.TensorProto]:
    inits = []
    for name, value in values.items():
        if name.startswith("s"):
            inits.append(h.make_tensor(name, TP.FLOAT, [], [value]))
        else:
            inits.append(h.make_tensor(name, _elem(dtype), [], [value]))
    return inits


def binary_model(op, a_shape, b_shape, dtype, sa, za, sb, zb, sc, zc) -> onnx.ModelProto:
    out_shape = list(np.broadcast_shapes(tuple(a_shape), tuple(b_shape)))
    node = h.make_node(
        op, ["a", "sa", "za", "b", "sb", "zb", "sc", "zc"], ["c"], domain=MS, name="q"
    )
    t = _elem(dtype)
    return _model(
        [node],
        [h.make_tensor_value_info("a", t, a_shape), h.make_tensor_value_info("b", t, b_shape)],
        [h.make_tensor_value_info("c", t, out_shape)],
        _scalars(dtype, sa=sa, sb=sb, sc=sc, za=za, zb=zb, zc=zc),
    )


def unary_model(op, shape, dtype, sx, zx, sy, zy, out_shape=None, **attrs) -> onnx.ModelProto:
    node = h.make_node(op, ["x", "sx", "zx", "sy", "zy"], ["y"], domain=MS, name="q", **attrs)
    t = _elem(dtype)
    return _model(
        [node],
        [h.make_tensor_value_info("x", t, shape)],
        [h.make_tensor_value_info("y", t, out_shape or shape)],
        _scalars(dtype, sx=sx, sy=sy, zx=zx, zy=zy),
    )


def every_pair(dtype) -> tuple[np.ndarray, np.ndarray]:
    low, high = RANGES[dtype]
    values = np.arange(low, high + 1).astype(dtype)
    return np.repeat(values, 256).reshape(256, 256), np.tile(values, 256).reshape(256, 256)


def every_value(dtype, rows=1) -> np.ndarray:
    low, high = RANGES[dtype]
    return np.tile(np.arange(low, high + 1), rows).reshape(rows, 256).astype(dtype)


def passes(model, inputs) -> bool:
    return api.validate(model, inputs=inputs).passed


def expand(model) -> tuple:
    graph = import_graph(model)
    result = ExpandQLinearOps().run(graph, CompileOptions())
    return graph, result


# A configuration where fp32 mul-then-add differs from MLAS's fused multiply-adds on 4 pairs.
NEEDS_OVERRIDES = dict(sa=0.0517, za=19, sb=0.023, zb=4, sc=0.0052, zc=44)


# --- QLinearAdd ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "dtype, a_shape, b_shape",
    [
        (np.uint8, [256, 256], [256, 256]),  # both spans vectors
        (np.int8, [256, 1], [256, 256]),  # A one value per span
        (np.uint8, [256, 256], [256, 1]),  # B one value per span
    ],
)
def test_qlinear_add_every_pair_exact(dtype, a_shape, b_shape):
    low, high = RANGES[dtype]
    rng = np.random.default_rng(len(a_shape) + a_shape[-1])
    sa, sb, sc = (float(np.float32(v)) for v in rng.uniform(0.002, 0.08, 3))
    za, zb, zc = (int(v) for v in rng.integers(low, high, 3))
    model = binary_model("QLinearAdd", a_shape, b_shape, dtype, sa, za, sb, zb, sc, zc)
    a, b = every_pair(dtype)
    if a_shape[1] == 1:
        a = a[:, :1]
    if b_shape[1] == 1:
        b = b[:1].T
    assert passes(model, {"a": a, "b": b})


def test_qlinear_add_overrides_make_it_exact_and_are_needed(monkeypatch):
    model = binary_model("QLinearAdd", [256, 256], [256, 256], np.uint8, **NEEDS_OVERRIDES)
    a, b = every_pair(np.uint8)
    graph, result = expand(model)
    stats = {s.name: s.value for s in result.statistics}
    assert stats == {"qoperator_nodes_expanded": 1, "qlinear_add_overrides": 4}
    assert result.findings[0]["overrides"] == 4
    assert passes(model, {"a": a, "b": b})
    # Without the overrides the expansion is one step off on those pairs: the verdict says so.
    monkeypatch.setattr(qlinear_ops, "_add_reference", qlinear_ops._add_expanded)
    assert not passes(model, {"a": a, "b": b})


def test_wrong_zero_point_is_caught(monkeypatch):
    model = binary_model("QLinearAdd", [4, 64], [64], np.int8, 0.02, 3, 0.03, -5, 0.04, 1)
    rng = np.random.default_rng(0)
    inputs = {
        k: rng.integers(-128, 128, s).astype(np.int8) for k, s in (("a", (4, 64)), ("b", (64,)))
    }
    assert passes(model, inputs)
    real = qlinear_ops._zero

    def off_by_one(graph, node, index, what, like):
        value = real(graph, node, index, what, like)
        return value + np.int8(1) if index == 7 else value

    monkeypatch.setattr(qlinear_ops, "_zero", off_by_one)
    assert not passes(model, inputs)


# --- QLinearMul ---------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_qlinear_mul_every_pair_exact(dtype):
    low, high = RANGES[dtype]
    model = binary_model(
        "QLinearMul", [256, 256], [256, 256], dtype, 0.021, low + 7, 0.033, high - 9, 0.047, 5
    )
    a, b = every_pair(dtype)
    assert passes(model, {"a": a, "b": b})
    _, result = expand(model)
    assert result.findings[0]["overrides"] == 0


# --- the table ops --------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize(
    "op, attrs", [("QLinearSigmoid", {}), ("QLinearLeakyRelu", {"alpha": 0.1})]
)
def test_unary_every_value(op, attrs, dtype):
    low, high = RANGES[dtype]
    model = unary_model(op, [2, 256], dtype, 0.043, low + 100, 0.0071, low + 3, **attrs)
    assert passes(model, {"x": every_value(dtype, 2)})


def test_qlinear_softmax_last_axis():
    rng = np.random.default_rng(1)
    model = unary_model(
        "QLinearSoftmax", [8, 64], np.uint8, 0.05, 128, 1 / 256, 0, opset=13, axis=-1
    )
    assert passes(model, {"x": rng.integers(0, 256, (8, 64)).astype(np.uint8)})


def test_qlinear_softmax_old_opset_inner_axis_refused():
    model = unary_model(
        "QLinearSoftmax", [2, 4, 8], np.uint8, 0.05, 128, 1 / 256, 0, opset=1, axis=1
    )
    with pytest.raises(UserError, match=r"QLinearSoftmax 'q': opset 1 softmax over axes 1"):
        expand(model)


@pytest.mark.parametrize("channels_last", [0, 1])
def test_qlinear_global_average_pool(channels_last):
    shape, out = ([2, 8, 7, 7], [2, 8, 1, 1]) if not channels_last else ([2, 7, 7, 8], [2, 1, 1, 8])
    model = unary_model(
        "QLinearGlobalAveragePool",
        shape,
        np.int8,
        0.03,
        -4,
        0.02,
        6,
        out_shape=out,
        channels_last=channels_last,
    )
    rng = np.random.default_rng(2)
    assert passes(model, {"x": rng.integers(-128, 128, shape).astype(np.int8)})


def test_qlinear_concat_requantizes_only_what_differs():
    t = TP.UINT8
    inits = _scalars(np.uint8, sy=0.05, zy=3, s0=0.02, z0=120, s1=0.05, z1=3)
    node = h.make_node(
        "QLinearConcat",
        ["sy", "zy", "x0", "s0", "z0", "x1", "s1", "z1"],
        ["y"],
        domain=MS,
        name="q",
        axis=1,
    )
    model = _model(
        [node],
        [h.make_tensor_value_info("x0", t, [2, 128]), h.make_tensor_value_info("x1", t, [2, 5])],
        [h.make_tensor_value_info("y", t, [2, 133])],
        inits,
    )
    x0 = every_value(np.uint8, 2)[:, :128] + np.array([[0], [128]], np.uint8)
    rng = np.random.default_rng(3)
    assert passes(model, {"x0": x0, "x1": rng.integers(0, 256, (2, 5)).astype(np.uint8)})
    _, result = expand(model)
    assert result.findings[0]["requantized_inputs"] == 1


# --- DynamicQuantizeLinear ------------------------------------------------------------------
def _dynamic_model() -> onnx.ModelProto:
    node = h.make_node("DynamicQuantizeLinear", ["x"], ["y", "ys", "yz"], name="q")
    return _model(
        [node],
        [h.make_tensor_value_info("x", TP.FLOAT, [8, 32])],
        [
            h.make_tensor_value_info("y", TP.UINT8, [8, 32]),
            h.make_tensor_value_info("ys", TP.FLOAT, []),
            h.make_tensor_value_info("yz", TP.UINT8, []),
        ],
        [],
    )


@pytest.mark.parametrize("kind", ["mixed", "positive", "negative", "zeros"])
def test_dynamic_quantize_linear(kind):
    rng = np.random.default_rng(4)
    x = (rng.standard_normal((8, 32)) * 3 + 0.7).astype(np.float32)
    x = {"mixed": x, "positive": np.abs(x), "negative": -np.abs(x), "zeros": 0 * x}[kind]
    assert passes(_dynamic_model(), {"x": x})


# --- refusals and shapes ------------------------------------------------------------------------
def test_non_constant_scale_refused():
    model = binary_model("QLinearAdd", [4], [4], np.uint8, 0.1, 1, 0.1, 1, 0.1, 1)
    model.graph.initializer.remove(next(i for i in model.graph.initializer if i.name == "sb"))
    model.graph.input.append(h.make_tensor_value_info("sb", TP.FLOAT, []))
    with pytest.raises(
        UserError, match=r"QLinearAdd 'q': its B scale \(input 4\) is not a constant"
    ):
        expand(model)


def test_vendor_shapes_of_qgemm_and_average_pool():
    t = TP.UINT8
    qgemm = h.make_node(
        "QGemm", ["a", "sa", "za", "b", "sb", "zb", "", "sy", "zy"], ["g"], domain=MS, transB=1
    )
    pool = h.make_node(
        "QLinearAveragePool",
        ["x", "sa", "za", "sy", "zy"],
        ["p"],
        domain=MS,
        kernel_shape=[3, 3],
        strides=[2, 2],
        pads=[1, 1, 1, 1],
        ceil_mode=1,
    )
    inits = _scalars(np.uint8, sa=0.1, sb=0.1, sy=0.1, za=1, zb=1, zy=1)
    model = _model(
        [qgemm, pool],
        [
            h.make_tensor_value_info("a", t, [5, 7]),
            h.make_tensor_value_info("b", t, [3, 7]),
            h.make_tensor_value_info("x", t, [1, 2, 8, 8]),
        ],
        [h.make_tensor_value_info("g", t, None), h.make_tensor_value_info("p", t, None)],
        inits,
    )
    del model.graph.output[:]
    assert add_vendor_shapes(model)
    shapes = {
        v.name: [d.dim_value for d in v.type.tensor_type.shape.dim] for v in model.graph.value_info
    }
    assert shapes == {"g": [5, 3], "p": [1, 2, 5, 5]}
