"""The QOperator ops that are not matmuls, and DynamicQuantizeLinear, as standard ops
(docs/quantization.md#qoperator).

In: a graph with com.microsoft QLinearAdd, QLinearMul, QLinearSigmoid, QLinearLeakyRelu,
QLinearConcat, QLinearGlobalAveragePool, QLinearAveragePool, QLinearSoftmax and standard
DynamicQuantizeLinear nodes. Out: each replaced by standard ops the generic lowerings take
(Cast, Mul, Add, Equal, Where, DequantizeLinear, QuantizeLinear, Sigmoid, …), its outputs
keeping their names; new tensors are named `<node>/…`.

What each computes is what onnxruntime's CPU kernels compute (docs/quantization.md#qoperator):

- QLinearMul: w = fl(fl((a − za)(b − zb) · fl(fl(sa·sb)/sc)) + zc), y = sat(rne(w)), as MLAS
  does; the integer product is exact in fp32, so every rounding is the same one.
- QLinearAdd: MLAS's AVX2 kernel computes w = fma(a, rA, fma(b, rB, F)) with rA = fl(sa/sc),
  rB = fl(sb/sc), F = fl(zc − fma(rA, za, fl(rB·zb))) (a broadcast operand folded into F
  first, `_add_reference`), and fp32 has no fused multiply-add here. The expansion computes the
  same sums with separate roundings, and since the result depends only on the pair of 8-bit
  inputs, the pass compares both formulas on all 65,536 pairs at compile time and overrides
  the pairs where they differ (`Equal` on a key a·256 + b, `Where`): exact for every input.
- QLinearSigmoid, QLinearLeakyRelu, QLinearSoftmax, QLinearGlobalAveragePool,
  QLinearAveragePool: DequantizeLinear → the float op → QuantizeLinear; QLinearConcat the
  same for each input whose scale or zero point is not the output's (a copy otherwise).
- DynamicQuantizeLinear: ReduceMin/ReduceMax with 0, scale = (max − min)/255 (1 when
  max = min), zero point sat(rne(0 − min/scale)), then QuantizeLinear.

Scales and zero points must be constants (per tensor); anything else is refused, naming the
node and the reason.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from onnx2bir.bir.enums import Dtype
from onnx2bir.errors import CompileError
from onnx2bir.graph import Graph, Node, TensorInfo
from onnx2bir.op_traits import op_key
from onnx2bir.options import CompileOptions
from onnx2bir.patterns.passes import PassResult, Statistic

MS = "com.microsoft"
F32 = np.float32
_RANGES = {np.dtype(np.uint8): (0, 255), np.dtype(np.int8): (-128, 127)}


class _Refused(Exception):
    """A node the pass cannot expand, with the reason."""


class _Emitter:
    """Adds the expansion of one node: constants and nodes named `<node>/…`."""

    def __init__(self, graph: Graph, node: Node):
        self.graph, self.node, self.count = graph, node, 0

    def fresh(self, label: str) -> str:
        self.count += 1
        return f"{self.node.name}/{label}_{self.count}"

    def const(self, label: str, value) -> str:
        array = np.asarray(value)
        name = self.fresh(label)
        self.graph.tensors[name] = TensorInfo(
            name, tuple(array.shape), Dtype.from_numpy(array.dtype), const=array
        )
        return name

    def op(
        self,
        op_type: str,
        inputs: list[str],
        shape: tuple[int, ...],
        dtype: Dtype,
        out: str | None = None,
        **attrs,
    ) -> str:
        name = self.fresh(op_type)
        out = out or f"{name}:0"
        if out not in self.graph.tensors:
            self.graph.tensors[out] = TensorInfo(out, tuple(shape), dtype)
        self.graph.add_node(name, op_type, inputs, [out], attrs)
        return out

    # --- the steps every expansion uses ------------------------------------------------------
    def to_float(self, tensor: str) -> str:
        return self.op("Cast", [tensor], self.shape(tensor), Dtype.FP32, to=1)

    def dequantize(self, x: str, scale: float, zero, label: str = "x") -> str:
        return self.op(
            "DequantizeLinear",
            [x, self.const(f"{label}_scale", F32(scale)), self.const(f"{label}_zero", zero)],
            self.shape(x),
            Dtype.FP32,
        )

    def quantize(self, x: str, scale: float, zero, out: str) -> str:
        return self.op(
            "QuantizeLinear",
            [x, self.const("y_scale", F32(scale)), self.const("y_zero", zero)],
            self.shape(x),
            Dtype.from_numpy(np.asarray(zero).dtype),
            out=out,
        )

    def shape(self, tensor: str) -> tuple[int, ...]:
        return tuple(self.graph.tensors[tensor].shape)


# --- reading a node's quantization parameters ------------------------------------------------
def _scale(graph: Graph, node: Node, index: int, what: str) -> float:
    name = node.input(index)
    info = graph.tensors.get(name) if name else None
    if info is None or not info.is_const:
        raise _Refused(f"its {what} (input {index}) is not a constant")
    value = np.asarray(info.const, dtype=np.float32)
    if value.size != 1:
        raise _Refused(f"its {what} (input {index}) has {value.size} values; only per-tensor")
    scale = F32(value.reshape(()))
    if not (np.isfinite(scale) and scale > 0):
        raise _Refused(f"its {what} (input {index}) is {float(scale)!r}, not a positive number")
    return scale


def _zero(graph: Graph, node: Node, index: int, what: str, like: str) -> np.ndarray:
    """The zero point as a 0-d array of its dtype; absent: 0 of `like`'s dtype."""
    name = node.input(index)
    if not name:
        return np.zeros((), graph.tensors[like].dtype.numpy)
    info = graph.tensors[name]
    if not info.is_const:
        raise _Refused(f"its {what} (input {index}) is not a constant")
    value = np.asarray(info.const)
    if value.size != 1:
        raise _Refused(f"its {what} (input {index}) has {value.size} values; only per-tensor")
    if value.dtype not in _RANGES:
        raise _Refused(f"its {what} (input {index}) is {value.dtype}; only uint8 and int8")
    return value.reshape(())


def _check_8bit(graph: Graph, node: Node, *tensors: str) -> None:
    for tensor in tensors:
        dtype = graph.tensors[tensor].dtype.numpy
        if dtype not in _RANGES:
            raise _Refused(f"{tensor!r} is {dtype}; only uint8 and int8")


# --- QLinearAdd and QLinearMul ---------------------------------------------------------------
def _fma(x: np.ndarray, y, z: np.ndarray) -> np.ndarray:
    """fp32 fused multiply-add x·y + z with one rounding. x is an 8-bit integer and y fp32, so
    the product (at most 32 significant bits) is exact in float64; the float64 sum s and its
    error e (TwoSum) are then exact, and rounding s to fp32 is right except where s sits
    exactly half-way between two fp32 values and e pushes the true sum off the tie."""
    product = np.asarray(x, np.float64) * np.float64(y)
    z64 = np.asarray(z, np.float64)
    total = product + z64
    back = total - product
    error = (product - (total - back)) + (z64 - back)
    rounded = total.astype(F32)
    off = total - rounded.astype(np.float64)
    toward = np.nextafter(rounded, np.where(off > 0, np.inf, -np.inf).astype(F32))
    half = (toward.astype(np.float64) - rounded.astype(np.float64)) / 2
    past_tie = (off != 0) & (off == half) & (error != 0) & (np.sign(error) == np.sign(off))
    return np.where(past_tie, toward, rounded).astype(F32)


def _span_case(a_shape, b_shape, out_shape) -> str:
    """How onnxruntime's broadcaster feeds the kernel: "general" (both spans vectors),
    "scalar_a" or "scalar_b" (that input is one value per span): decided by the innermost
    output dim longer than 1."""
    rank = len(out_shape)
    a = (1,) * (rank - len(a_shape)) + tuple(a_shape)
    b = (1,) * (rank - len(b_shape)) + tuple(b_shape)
    for axis in reversed(range(rank)):
        if out_shape[axis] == 1:
            continue
        if a[axis] == 1:
            return "scalar_a"
        if b[axis] == 1:
            return "scalar_b"
        return "general"
    return "scalar_a"


def _grid(dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    low, high = _RANGES[dtype]
    values = np.arange(low, high + 1, dtype=np.float32)
    return np.meshgrid(values, values, indexing="ij")  # [v, s]: v row, s column


def _add_reference(v, s, rv, rs, fixed) -> np.ndarray:
    """MLAS's AVX2 QLinearAdd on the grid before its final rounding: v the input the kernel
    walks as a vector, s the other (a broadcast one is folded into the constant part by the
    same fused multiply-add)."""
    return _fma(v, rv, _fma(s, rs, np.full_like(s, fixed)))


def _add_expanded(v, s, rv, rs, fixed) -> np.ndarray:
    """What the expansion computes, in fp32 with a rounding per op."""
    return F32(F32(v * rv) + F32(F32(s * rs) + fixed))


def _expand_binary(graph: Graph, node: Node) -> dict:
    a, b, out = node.input(0), node.input(3), node.output(0)
    _check_8bit(graph, node, a, b, out)
    sa, sb, sc = (
        _scale(graph, node, i, w) for i, w in ((1, "A scale"), (4, "B scale"), (6, "C scale"))
    )
    za, zb = _zero(graph, node, 2, "A zero point", a), _zero(graph, node, 5, "B zero point", b)
    zc = _zero(graph, node, 7, "C zero point", out)
    dtype = graph.tensors[out].dtype.numpy
    if not (graph.tensors[a].dtype.numpy == graph.tensors[b].dtype.numpy == dtype):
        raise _Refused("A, B and C are not of one type")
    low, high = _RANGES[dtype]
    out_shape = tuple(graph.tensors[out].shape)
    graph.remove_node(node.name)
    em = _Emitter(graph, node)
    af, bf = em.to_float(a), em.to_float(b)
    if node.op_type == "QLinearMul":
        ratio = F32(F32(sa * sb) / sc)
        da = em.op("Sub", [af, em.const("a_zero", F32(za))], em.shape(af), Dtype.FP32)
        db = em.op("Sub", [bf, em.const("b_zero", F32(zb))], em.shape(bf), Dtype.FP32)
        product = em.op("Mul", [da, db], out_shape, Dtype.FP32)
        scaled = em.op("Mul", [product, em.const("ratio", ratio)], out_shape, Dtype.FP32)
        w = em.op("Add", [scaled, em.const("c_zero", F32(zc))], out_shape, Dtype.FP32)
        em.quantize(w, 1.0, np.zeros((), dtype), out)
        return {"formula": "exact: MLAS's own roundings", "overrides": 0}

    case = _span_case(em.shape(a), em.shape(b), out_shape)
    # The kernel's A is the vector operand; a scalar A is passed as its B (qlinear_binary_op.cc).
    vec, oth = (bf, af) if case == "scalar_a" else (af, bf)
    (rv, zv), (rs, zs) = ((F32(sb / sc), zb), (F32(sa / sc), za))
    if case != "scalar_a":
        (rv, zv), (rs, zs) = (rs, zs), (rv, zv)
    fixed = F32(F32(zc) - _fma(np.float32(zv), rv, F32(rs * F32(zs))))
    vs = em.op("Mul", [vec, em.const("ratio", rv)], em.shape(vec), Dtype.FP32)
    os_ = em.op("Mul", [oth, em.const("ratio", rs)], em.shape(oth), Dtype.FP32)
    part = em.op("Add", [os_, em.const("fixed", fixed)], em.shape(oth), Dtype.FP32)
    w = em.op("Add", [vs, part], out_shape, Dtype.FP32)

    v, s = _grid(dtype)
    want = np.clip(np.rint(_add_reference(v, s, rv, rs, fixed)), low, high)
    have = np.clip(np.rint(_add_expanded(v, s, rv, rs, fixed)), low, high)
    wrong = np.argwhere(want != have)
    if len(wrong):
        k1 = em.op("Mul", [vec, em.const("radix", F32(256))], em.shape(vec), Dtype.FP32)
        key = em.op("Add", [k1, oth], out_shape, Dtype.FP32)
        for i, j in wrong:
            pair = F32(v[i, j] * 256 + s[i, j])
            hit = em.op("Equal", [key, em.const("pair", pair)], out_shape, Dtype.BOOL)
            fix = em.const("value", F32(want[i, j]))
            w = em.op("Where", [hit, fix, w], out_shape, Dtype.FP32)
    em.quantize(w, 1.0, np.zeros((), dtype), out)
    return {
        "formula": f"exact: MLAS's AVX2 roundings, {case} spans, checked on all input pairs",
        "overrides": len(wrong),
    }


# --- table ops: dequantize, the float op, quantize --------------------------------------------
def _expand_unary(graph: Graph, node: Node) -> dict:
    x, out = node.input(0), node.output(0)
    _check_8bit(graph, node, x, out)
    sx = _scale(graph, node, 1, "X scale")
    zx = _zero(graph, node, 2, "X zero point", x)
    sy = _scale(graph, node, 3, "Y scale")
    zy = _zero(graph, node, 4, "Y zero point", out)
    attrs: dict = {}
    op = node.op_type.removeprefix("QLinear")
    note = "approximate: onnxruntime's 256-entry table from MLAS's own function"
    if op == "LeakyRelu":
        attrs["alpha"] = float(node.attr("alpha", 0.01))
        note = "exact: the same fp32 roundings as onnxruntime's table"
    elif op == "Softmax":
        rank = len(graph.tensors[x].shape)
        opset = int(node.attr("opset", 1))
        axis = int(node.attr("axis", -1 if opset >= 13 else 1))
        if not -rank <= axis < rank:
            raise _Refused(f"axis {axis} is out of range for rank {rank}")
        if opset < 13 and axis % rank != rank - 1:
            raise _Refused(f"opset {opset} softmax over axes {axis}.. (only the last axis)")
        attrs["axis"] = axis
        note = "approximate: onnxruntime sums a table of exponentials, then divides"
    elif op == "GlobalAveragePool":
        if int(node.attr("channels_last", 0)):
            rank = len(graph.tensors[x].shape)
            op, attrs = "ReduceMean", {"axes": list(range(1, rank - 1)), "keepdims": 1}
        note = "approximate: onnxruntime sums integers, then scales once"
    elif op == "AveragePool":
        if int(node.attr("channels_last", 0)):
            raise _Refused("channels_last average pooling is not supported")
        for key in (
            "auto_pad",
            "ceil_mode",
            "count_include_pad",
            "kernel_shape",
            "pads",
            "strides",
        ):
            if node.attr(key) is not None:
                attrs[key] = node.attr(key)
        note = "approximate: onnxruntime averages in its own order"
    graph.remove_node(node.name)
    em = _Emitter(graph, node)
    xf = em.dequantize(x, sx, zx)
    if op == "ReduceMean":
        shape = tuple(graph.tensors[out].shape)
        yf = em.op("ReduceMean", [xf], shape, Dtype.FP32, **attrs)
    elif op == "GlobalAveragePool":
        yf = em.op(op, [xf], tuple(graph.tensors[out].shape), Dtype.FP32, **attrs)
    elif op == "AveragePool":
        # qlinear_pool.cc quantizes as nearbyint(y / y_scale + y_zero_point): the zero point
        # is added before the rounding, in fp32.
        yf = em.op(op, [xf], tuple(graph.tensors[out].shape), Dtype.FP32, **attrs)
        yf = em.op("Div", [yf, em.const("y_scale", sy)], em.shape(yf), Dtype.FP32)
        yf = em.op("Add", [yf, em.const("y_zero", F32(zy))], em.shape(yf), Dtype.FP32)
        em.quantize(yf, 1.0, np.zeros((), zy.dtype), out)
        return {"formula": note, "overrides": 0}
    else:
        yf = em.op(op, [xf], em.shape(xf), Dtype.FP32, **attrs)
    em.quantize(yf, sy, zy, out)
    return {"formula": note, "overrides": 0}


def _expand_concat(graph: Graph, node: Node) -> dict:
    out = node.output(0)
    sy = _scale(graph, node, 0, "Y scale")
    zy = _zero(graph, node, 1, "Y zero point", out)
    triples = node.inputs[2:]
    if len(triples) % 3 or not triples:
        raise _Refused(f"{len(triples)} inputs after Y's scale and zero point, not triples")
    parts, requantized = [], 0
    plans = []
    for k in range(0, len(triples), 3):
        x = triples[k]
        _check_8bit(graph, node, x)
        sx = _scale(graph, node, 2 + k + 1, f"input {k // 3} scale")
        zx = _zero(graph, node, 2 + k + 2, f"input {k // 3} zero point", x)
        plans.append((x, sx, zx))
    axis = int(node.attr("axis", 0))
    graph.remove_node(node.name)
    em = _Emitter(graph, node)
    for x, sx, zx in plans:
        if sx == sy and int(zx) == int(zy) and zx.dtype == zy.dtype:
            parts.append(x)
            continue
        requantized += 1
        parts.append(em.quantize(em.dequantize(x, sx, zx), sy, zy, em.fresh("requantized")))
    em.op(
        "Concat",
        parts,
        tuple(graph.tensors[out].shape),
        graph.tensors[out].dtype,
        out=out,
        axis=axis,
    )
    return {
        "formula": "exact: a copy, or onnxruntime's requantization roundings",
        "overrides": 0,
        "requantized_inputs": requantized,
    }


def _expand_dynamic(graph: Graph, node: Node) -> dict:
    x = node.input(0)
    y, y_scale, y_zero = (node.output(i) for i in range(3))
    if graph.tensors[x].dtype is not Dtype.FP32:
        raise _Refused(f"its input is {graph.tensors[x].dtype}; only float32")
    graph.remove_node(node.name)
    em = _Emitter(graph, node)
    scalar = ()
    low = em.op("ReduceMin", [x], scalar, Dtype.FP32, keepdims=0)
    high = em.op("ReduceMax", [x], scalar, Dtype.FP32, keepdims=0)
    zero = em.const("zero", F32(0))
    low = em.op("Min", [low, zero], scalar, Dtype.FP32)
    high = em.op("Max", [high, zero], scalar, Dtype.FP32)
    span = em.op("Sub", [high, low], scalar, Dtype.FP32)
    ratio = em.op("Div", [span, em.const("levels", F32(255))], scalar, Dtype.FP32)
    flat = em.op("Equal", [high, low], scalar, Dtype.BOOL)
    scale = em.op(
        "Where", [flat, em.const("one", F32(1)), ratio], scalar, Dtype.FP32, out=y_scale or None
    )
    shift = em.op("Div", [low, scale], scalar, Dtype.FP32)
    initial = em.op("Sub", [zero, shift], scalar, Dtype.FP32)
    zp = em.quantize(initial, 1.0, np.zeros((), np.uint8), y_zero or em.fresh("zero_point"))
    em.op("QuantizeLinear", [x, scale, zp], em.shape(x), Dtype.UINT8, out=y)
    return {
        "formula": "exact: onnxruntime's min, max, scale and zero point roundings",
        "overrides": 0,
    }


_EXPANSIONS = {
    op_key("QLinearAdd", MS): _expand_binary,
    op_key("QLinearMul", MS): _expand_binary,
    op_key("QLinearSigmoid", MS): _expand_unary,
    op_key("QLinearLeakyRelu", MS): _expand_unary,
    op_key("QLinearSoftmax", MS): _expand_unary,
    op_key("QLinearGlobalAveragePool", MS): _expand_unary,
    op_key("QLinearAveragePool", MS): _expand_unary,
    op_key("QLinearConcat", MS): _expand_concat,
    op_key("DynamicQuantizeLinear"): _expand_dynamic,
}

QLINEAR_VENDOR_OPS: frozenset[str] = frozenset(k for k in _EXPANSIONS if "." in k)


@dataclass(frozen=True)
class ExpandQLinearOps:
    """QOperator ops and DynamicQuantizeLinear as standard ops (module docstring)."""

    name: str = "ExpandQLinearOps"

    def run(self, graph: Graph, options: CompileOptions) -> PassResult:
        findings, expanded, overrides = [], 0, 0
        for name in graph.topological_order():
            node = Node.of(graph.node(name))
            expand = _EXPANSIONS.get(op_key(node.op_type, node.domain))
            if expand is None:
                continue
            try:
                finding = expand(graph, node)
            except _Refused as exc:
                raise CompileError(f"{node.op_type} {name!r}: {exc}") from None
            expanded += 1
            overrides += finding["overrides"]
            findings.append({"nodes": [name], "source": node.op_type, **finding})
        stats = [
            Statistic(
                self.name,
                "qoperator_nodes_expanded",
                "Number of QOperator nodes expanded into standard ops",
                expanded,
            ),
            Statistic(
                self.name,
                "qlinear_add_overrides",
                "Number of QLinearAdd input pairs overridden to match MLAS's fused roundings",
                overrides,
            ),
        ]
        return PassResult(expanded > 0, stats, findings)
