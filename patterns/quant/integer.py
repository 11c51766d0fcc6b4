"""Convolutions and matmuls on 8-bit integers, exact on the PE array (docs/quantization.md).

In: the Graph after import. Every Conv, MatMul and Gemm whose two operands are 8-bit integers
made float by a DequantizeLinear (the QDQ form onnxruntime's quantizer writes), and every
QLinearConv, QLinearMatMul, com.microsoft QGemm, ConvInteger and MatMulInteger.

Pattern: `match(graph, node)` reads the operands back to their integers — the 8-bit tensor, its
scale and its zero point — and the bias (an int32 constant at scale x_scale · w_scale, or a
float tensor added after), giving an `IntegerMatmul`, or the reason it is not one.

Check: `exactness(graph, op)` proves that every partial sum of the integer products is an
integer below 2^24, so fp32 PSUM accumulates it exactly in any order: max |x − zx| times the
largest L1 norm of a weight row (Σ_k |w − zw| over the reduction of one output), plus the
largest |bias|. Operands are integers within ±255, exact in bf16. A matmul that fails the
check is split along its reduction into matmuls that pass it, their results added in exact
int32 (`reduction_groups`); one that cannot be split keeps the float path (QDQ) or is refused.

Rewrite: the node computes on the integers themselves —

    x − zx            (a Cast, or a DequantizeLinear of scale 1 when zx ≠ 0)
    Conv/MatMul/Gemm  (x − zx, w − zw, + bias as an integer)        → acc, exact
    acc · scale       (Mul by x_scale · w_scale, per output channel) → the float result (QDQ)
    or acc · M → QuantizeLinear(·, 1, zy)   with M = x_scale · w_scale / y_scale in fp32,
                      as onnxruntime's QLinearConv and QLinearMatMul requantize (QOperator)
    or Cast(acc, int32)                                                (ConvInteger)

The weight stays an int8 constant (with zw = 0): the conv or matmul loads it into bf16 tiles
and the DMA widens it on the way. The node's name joins `graph.integer_operands`, which
keeps its PE operands bf16 whatever the autocast (`codegen/casting.py pe_operand_dtype`) and
its operands out of the cast plan (exact: nothing to round).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from onnx2bir.bir.enums import Dtype
from onnx2bir.graph import Graph, TensorInfo
from onnx2bir.op_traits import STANDARD_DOMAINS
from onnx2bir.options import CompileOptions
from onnx2bir.patterns.passes import PassResult, Statistic
from onnx2bir.patterns.queries import const_value

INTEGER_VENDOR_OPS: frozenset[str] = frozenset({"com.microsoft.QGemm"})

EXACT_LIMIT = 2**24  # every integer of magnitude up to 2^24 is an fp32 value
EIGHT_BIT = (Dtype.INT8, Dtype.UINT8)
_RANGE = {Dtype.INT8: (-128, 127), Dtype.UINT8: (0, 255)}
PASS_NAME = "RaiseIntegerMatmuls"


@dataclass
class Operand:
    """An integer operand: the 8-bit tensor, its scale and zero point (scalars, or vectors
    along the output channels of a weight)."""

    tensor: str
    scale: np.ndarray
    zero_point: np.ndarray
    source: str | None = None  # the DequantizeLinear that made it float (QDQ)
    # a scalar zero point computed at run time (DynamicQuantizeLinear's), instead of the value
    runtime_zero_point: str = ""
    axis: int = 1  # the DequantizeLinear's axis, along which a vector scale varies

    def magnitude(self, graph: Graph) -> int:
        """The largest |q − zero_point| the dtype allows (any zero point of the dtype when it
        is computed at run time)."""
        low, high = _RANGE[graph.tensors[self.tensor].dtype]
        if self.runtime_zero_point:
            return high - low
        zero = self.zero_point.astype(np.int64)
        return int(max(np.max(np.abs(low - zero)), np.max(np.abs(high - zero))))


@dataclass
class IntegerMatmul:
    """One convolution or matmul the rewrite runs on integers."""

    node: str
    form: str  # QDQ, QLinearConv, QLinearMatMul, QGemm, ConvInteger, MatMulInteger
    op_type: str  # the float op it becomes: Conv, MatMul or Gemm
    x: Operand
    w: Operand
    output: str  # the node's output tensor, kept
    attrs: dict = field(default_factory=dict)
    bias_int: np.ndarray | None = None  # added to the integer accumulator
    bias_float: str = ""  # added after scaling
    requant: tuple[np.ndarray, np.ndarray] | None = None  # (y_scale, y_zero_point): QOperator
    to_int32: bool = False  # ConvInteger, MatMulInteger
    alpha: float = 1.0  # QGemm
    consumed: tuple[str, ...] = ()  # the DequantizeLinear nodes the rewrite may drop
    # ranges of the reduction run as separate exact matmuls and added in int32, when one
    # matmul's partial sums could pass 2^24 (`reduction_groups`); None: one matmul
    groups: list[tuple[int, int]] | None = None

    @property
    def scale(self) -> np.ndarray:
        """x_scale · w_scale (· alpha), fp32, as the float result's multiplier."""
        scale = np.float32(self.x.scale.reshape(())) * self.w.scale.astype(np.float32)
        return (scale * np.float32(self.alpha)).astype(np.float32)


def _const(graph: Graph, tensor: str) -> np.ndarray | None:
    value = const_value(graph, tensor) if tensor else None
    return None if value is None else np.asarray(value)


def _zero_point(graph: Graph, tensor: str, like: str) -> np.ndarray | None:
    """A constant zero point (0 of the operand's dtype when absent); None when computed at
    run time."""
    if not tensor:
        return np.zeros((), graph.tensors[like].dtype.numpy)
    return _const(graph, tensor)


def _operand(graph: Graph, tensor: str, scale: str, zero: str, what: str) -> Operand | str:
    info = graph.tensors[tensor]
    if info.dtype not in EIGHT_BIT:
        return f"{what} is {info.dtype}, not an 8-bit integer"
    scale_value = _const(graph, scale) if scale else np.ones((), np.float32)
    if scale_value is None:
        return f"{what}'s scale is computed at run time"
    zero_value = _zero_point(graph, zero, tensor)
    if zero_value is None:
        if math.prod(graph.tensors[zero].shape) != 1:
            return f"{what}'s zero point is a vector computed at run time"
        return Operand(tensor, scale_value.astype(np.float32), np.zeros(()), None, zero)
    return Operand(tensor, scale_value.astype(np.float32), zero_value)


def _dequantized(graph: Graph, tensor: str, what: str) -> Operand | str:
    """The integer operand behind a float tensor a DequantizeLinear makes, or why not."""
    producer = graph.producer(tensor)
    data = graph.node(producer) if producer else None
    if data is None or data["op_type"] != "DequantizeLinear":
        return f"{what} is not dequantized from integers"
    if data["attrs"].get("block_size", 0):
        return f"{what} is dequantized by blocks (block_size)"
    inputs = data["inputs"] + ["", "", ""]
    operand = _operand(graph, inputs[0], inputs[1], inputs[2], what)
    if isinstance(operand, Operand):
        operand.source = producer
        rank = len(graph.tensors[inputs[0]].shape)
        axis = int(data["attrs"].get("axis", 1)) % max(rank, 1)
        operand.axis = axis
    return operand


def _per_tensor(operand: Operand) -> bool:
    return operand.scale.size == 1 and operand.zero_point.size == 1


def _weight_axis_ok(operand: Operand, out_axis: int, graph: Graph) -> bool:
    """A weight's scale and zero point are scalars or vary along its output axis only (a
    QOperator op's vectors always do)."""
    if _per_tensor(operand) or operand.source is None:
        return True
    return operand.axis == out_axis % len(graph.tensors[operand.tensor].shape)


def _out_axis(op: IntegerMatmul, graph: Graph) -> int:
    """The axis of the weight that indexes output channels."""
    if op.op_type == "Conv":
        return 0
    if op.op_type == "Gemm":
        return 0 if op.attrs.get("transB", 0) else 1
    return len(graph.tensors[op.w.tensor].shape) - 1


def match(graph: Graph, name: str) -> IntegerMatmul | str | None:
    """The integer matmul at node `name`; a reason when it is one of the forms but cannot be
    taken; None when the node is none of them."""
    data = graph.node(name)
    op_type, inputs = data["op_type"], list(data["inputs"]) + [""] * 9
    output = data["outputs"][0]
    attrs = dict(data["attrs"])
    if data["domain"] == "com.microsoft":
        return _qgemm(graph, name, inputs, output, attrs) if op_type == "QGemm" else None
    if data["domain"] not in STANDARD_DOMAINS:
        return None
    if op_type in ("Conv", "MatMul", "Gemm"):
        return _qdq(graph, name, op_type, inputs, output, attrs)
    if op_type in ("QLinearConv", "QLinearMatMul"):
        x = _operand(graph, inputs[0], inputs[1], inputs[2], "input A")
        w = _operand(graph, inputs[3], inputs[4], inputs[5], "input B")
        if isinstance(x, str) or isinstance(w, str):
            return x if isinstance(x, str) else w
        requant = _requant(graph, inputs[6], inputs[7])
        if isinstance(requant, str):
            return requant
        bias = _const(graph, inputs[8]) if op_type == "QLinearConv" and inputs[8] else None
        if op_type == "QLinearConv" and inputs[8] and bias is None:
            return "the bias is computed at run time"
        float_op = "Conv" if op_type == "QLinearConv" else "MatMul"
        return IntegerMatmul(name, op_type, float_op, x, w, output, attrs, bias, requant=requant)
    if op_type in ("ConvInteger", "MatMulInteger"):
        x = _operand(graph, inputs[0], "", inputs[2], "input A")
        w = _operand(graph, inputs[1], "", inputs[3], "input B")
        if isinstance(x, str) or isinstance(w, str):
            return x if isinstance(x, str) else w
        float_op = "Conv" if op_type == "ConvInteger" else "MatMul"
        return IntegerMatmul(name, op_type, float_op, x, w, output, attrs, to_int32=True)
    return None


def _requant(graph: Graph, scale: str, zero: str) -> tuple[np.ndarray, np.ndarray] | str:
    scale_value = _const(graph, scale)
    zero_value = _const(graph, zero) if zero else None
    if scale_value is None or (zero and zero_value is None):
        return "the output's scale or zero point is computed at run time"
    if zero_value is None:
        zero_value = np.zeros((), np.uint8)
    if scale_value.size != 1 or zero_value.size != 1:
        return "the output is quantized per channel"
    return scale_value.astype(np.float32).reshape(()), zero_value.reshape(())


def _qdq(graph, name, op_type, inputs, output, attrs) -> IntegerMatmul | str | None:
    if op_type == "Gemm" and attrs.get("transA", 0):
        return "Gemm with transA"
    producers = [graph.producer(t) for t in inputs[:2]]
    if not any(p and graph.node(p)["op_type"] == "DequantizeLinear" for p in producers):
        return None  # not a quantized op at all
    x = _dequantized(graph, inputs[0], "input A")
    w = _dequantized(graph, inputs[1], "input B")
    if isinstance(x, str) or isinstance(w, str):
        return x if isinstance(x, str) else w
    if not _per_tensor(x):
        return "input A is quantized per channel"
    op = IntegerMatmul(name, "QDQ", op_type, x, w, output, attrs)
    op.consumed = tuple(p for p in (x.source, w.source) if p)  # the bias's joins below
    if op_type == "Gemm":
        op.alpha = float(attrs.get("alpha", 1.0))
        if float(attrs.get("beta", 1.0)) != 1.0 and inputs[2]:
            return "Gemm with beta ≠ 1"
    bias = inputs[2] if op_type in ("Conv", "Gemm") else ""
    if bias:
        integer = _integer_bias(graph, bias, op)
        if integer is None and op_type == "Conv":
            value = _const(graph, bias)
            if value is None:
                return "the float bias is computed at run time"
            # added after the scale, along the channels of the [N, C, …] result
            rank = len(graph.tensors[output].shape)
            shape = (value.size,) + (1,) * (rank - 2)
            op.bias_float = _new_const(graph, f"{name}/bias_float", value.reshape(shape))
        elif integer is None:
            op.bias_float = bias
        else:
            op.bias_int = integer
    return op


def _integer_bias(graph: Graph, bias: str, op: IntegerMatmul) -> np.ndarray | None:
    """The int32 bias behind a DequantizeLinear at scale x_scale · w_scale and zero point 0,
    which the integer accumulator can take as it is; None otherwise."""
    producer = graph.producer(bias)
    if producer is None or graph.node(producer)["op_type"] != "DequantizeLinear":
        return None
    inputs = graph.node(producer)["inputs"] + ["", ""]
    values, scale = _const(graph, inputs[0]), _const(graph, inputs[1])
    zero = _const(graph, inputs[2]) if inputs[2] else np.zeros(())
    if values is None or scale is None or zero is None or values.dtype != np.int32:
        return None
    if np.any(zero != 0) or op.alpha != 1.0:
        return None
    if not np.array_equal(
        np.broadcast_to(scale.astype(np.float32), values.shape),
        np.broadcast_to(op.scale, values.shape),
    ):
        return None
    op.consumed = (*op.consumed, producer)
    return values


def _qgemm(graph, name, inputs, output, attrs) -> IntegerMatmul | str:
    """com.microsoft QGemm: A, a_scale, a_zp, B, b_scale, b_zp, C (int32 at a_scale · b_scale),
    y_scale, y_zp; a float output when y_scale is absent."""
    if attrs.get("transA", 0):
        return "QGemm with transA"
    x = _operand(graph, inputs[0], inputs[1], inputs[2], "input A")
    w = _operand(graph, inputs[3], inputs[4], inputs[5], "input B")
    if isinstance(x, str) or isinstance(w, str):
        return x if isinstance(x, str) else w
    op = IntegerMatmul(name, "QGemm", "Gemm", x, w, output, attrs)
    op.alpha = float(attrs.get("alpha", 1.0))
    if inputs[6]:
        bias = _const(graph, inputs[6])
        if bias is None:
            return "the bias is computed at run time"
        op.bias_int = bias
    if inputs[7]:
        requant = _requant(graph, inputs[7], inputs[8])
        if isinstance(requant, str):
            return requant
        op.requant = requant
    return op


def exactness(graph: Graph, op: IntegerMatmul) -> tuple[int, str | None]:
    """The largest magnitude a partial sum of `op` can reach, and why it is not exact (None
    when it is: below 2^24, with operands within ±256)."""
    out_axis = _out_axis(op, graph)
    if not _weight_axis_ok(op.w, out_axis, graph):
        return 0, "input B's scale varies along the reduction, not the output channels"
    x_max = op.x.magnitude(graph)
    w_max = op.w.magnitude(graph)
    weights = _const(graph, op.w.tensor)
    if weights is None:  # both operands at run time: every product may be the largest
        shape = graph.tensors[op.w.tensor].shape
        k = shape[-2] if op.op_type == "MatMul" else 0
        if op.op_type == "Conv":  # [C_out, C_in / group, *kernel]: one output's reduction
            k = math.prod(shape[1:])
        if op.op_type == "Gemm":
            shape = graph.tensors[op.w.tensor].shape
            k = shape[1] if op.attrs.get("transB", 0) else shape[0]
        row = k * w_max
    else:
        centred = np.abs(weights.astype(np.int64) - _along(op.w.zero_point, out_axis, weights.ndim))
        axes = tuple(a for a in range(weights.ndim) if a != out_axis % weights.ndim)
        row = int(np.max(np.sum(centred, axis=axes))) if centred.size else 0
    bias = int(np.max(np.abs(op.bias_int.astype(np.int64)))) if op.bias_int is not None else 0
    bound = x_max * row + bias
    if bound >= EXACT_LIMIT:
        return bound, (
            f"a partial sum may reach {bound:,} (2^{math.log2(bound):.1f}), past 2^24 where fp32 "
            "PSUM stops counting integers exactly"
        )
    return bound, None


def _along(values: np.ndarray, axis: int, rank: int) -> np.ndarray:
    """A per-axis vector shaped to broadcast along `axis` of a rank-`rank` array."""
    values = np.asarray(values).astype(np.int64)
    if values.size == 1:
        return values.reshape(())
    shape = [1] * rank
    shape[axis % rank] = values.size
    return values.reshape(shape)


def reduction_groups(graph: Graph, op: IntegerMatmul) -> list[tuple[int, int]] | None:
    """Ranges of the reduction's input channels (Conv) or K (matmul) such that each range's
    partial sums stay below 2^24; None when even one channel's cannot (or the conv is
    grouped, whose reduction is already split by group)."""
    if op.op_type == "Conv" and int(op.attrs.get("group", 1)) != 1:
        return None
    x_max, w_max = op.x.magnitude(graph), op.w.magnitude(graph)
    weights = _const(graph, op.w.tensor)
    k_axis = _k_axis(op, graph)
    size = graph.tensors[op.w.tensor].shape[k_axis]
    if weights is None:
        shape = graph.tensors[op.w.tensor].shape
        taps = math.prod(shape[2:]) if op.op_type == "Conv" else 1  # per input channel
        per = (EXACT_LIMIT - 1) // max(x_max * w_max * taps, 1)
        return [(s, min(s + per, size)) for s in range(0, size, per)] if per else None
    out_axis = _out_axis(op, graph)
    centred = np.abs(weights.astype(np.int64) - _along(op.w.zero_point, out_axis, weights.ndim))
    # contribution[c_out, k]: Σ |w| over the taps of one input channel k
    other = tuple(a for a in range(weights.ndim) if a not in (out_axis, k_axis))
    contribution = np.moveaxis(centred.sum(axis=other, keepdims=True), (out_axis, k_axis), (0, 1))
    contribution = contribution.reshape(contribution.shape[0], contribution.shape[1])
    groups, start, running = [], 0, np.zeros(contribution.shape[0], np.int64)
    for k in range(size):
        column = contribution[:, k]
        if x_max * int(column.max()) >= EXACT_LIMIT:
            return None
        if x_max * int((running + column).max()) >= EXACT_LIMIT:
            groups.append((start, k))
            start, running = k, np.zeros_like(running)
        running += column
    groups.append((start, size))
    return groups


def _k_axis(op: IntegerMatmul, graph: Graph) -> int:
    """The axis of the weight the matmul reduces over."""
    rank = len(graph.tensors[op.w.tensor].shape)
    if op.op_type == "Conv":
        return 1
    if op.op_type == "Gemm":
        return 1 if op.attrs.get("transB", 0) else 0
    return rank - 2


def _split_accumulate(graph, op, prefix, x, w, attrs, shape, groups) -> str:
    """acc as the int32 sum of one matmul per range of the reduction (each exact in fp32
    PSUM), added on GpSimd's exact int32 lanes (docs/neuroncore.md#integers); returns the
    int32 sum's tensor."""
    x_axis = 1 if op.op_type == "Conv" else len(graph.tensors[x].shape) - 1
    k_axis = _k_axis(op, graph)
    weights = _const(graph, w)
    total = ""
    for index, (start, end) in enumerate(groups):
        part = f"{prefix}/part{index}"
        x_part = _slice(graph, f"{part}/x", x, x_axis, start, end)
        if weights is not None:
            w_part = _new_const(graph, f"{part}/w", np.take(weights, range(start, end), k_axis))
        else:
            w_part = _slice(graph, f"{part}/w", w, k_axis, start, end)
        acc = f"{part}/acc"
        graph.tensors[acc] = TensorInfo(acc, shape, Dtype.FP32)
        graph.add_node(part, op.op_type, [x_part, w_part], [acc], attrs)
        graph.integer_operands = graph.integer_operands | {part}
        exact = f"{part}/int32"
        graph.tensors[exact] = TensorInfo(exact, shape, Dtype.INT32)
        graph.add_node(exact, "Cast", [acc], [exact], {"to": 6})
        if total:
            summed = f"{part}/sum"
            graph.tensors[summed] = TensorInfo(summed, shape, Dtype.INT32)
            graph.add_node(summed, "Add", [total, exact], [summed])
            exact = summed
        total = exact
    return total


def _slice(graph, name, tensor, axis, start, end) -> str:
    info = graph.tensors[tensor]
    shape = list(info.shape)
    shape[axis] = end - start
    graph.tensors[name] = TensorInfo(name, tuple(shape), info.dtype)
    bounds = [
        _new_const(graph, f"{name}/{key}", np.array([value], np.int64))
        for key, value in (("starts", start), ("ends", end), ("axes", axis))
    ]
    graph.add_node(name, "Slice", [tensor, *bounds], [name])
    return name


def rewrite(graph: Graph, op: IntegerMatmul) -> str:
    """Replace the node by the integer form (module docstring); returns the new matmul's name
    (the node's own)."""
    out_info = graph.tensors[op.output]
    graph.remove_node(op.node)
    prefix = op.node
    x = _centred_input(graph, op, prefix)
    w = _centred_weight(graph, op, prefix)
    attrs = {k: v for k, v in op.attrs.items() if k in _FLOAT_ATTRS.get(op.op_type, ())}
    if op.op_type == "Gemm":
        attrs.pop("alpha", None)
        attrs["transB"] = int(op.attrs.get("transB", 0))
    acc = f"{prefix}/acc"
    rank = len(out_info.shape)
    channel_axis = 1 if op.op_type == "Conv" else rank - 1
    graph.tensors[acc] = TensorInfo(acc, out_info.shape, Dtype.FP32)
    if op.groups:
        total = _split_accumulate(graph, op, prefix, x, w, attrs, out_info.shape, op.groups)
        if op.bias_int is not None:
            bias = op.bias_int.astype(np.int32)
            if op.op_type == "Conv":
                bias = bias.reshape((bias.size,) + (1,) * (rank - 2))
            biased = f"{prefix}/biased"
            graph.tensors[biased] = TensorInfo(biased, out_info.shape, Dtype.INT32)
            constant = _new_const(graph, f"{prefix}/bias_int", bias)
            graph.add_node(biased, "Add", [total, constant], [biased])
            total = biased
        if op.to_int32:
            graph.add_node(f"{prefix}/result", "Identity", [total], [op.output])
            _drop_unread(graph, op.consumed)
            return op.node
        graph.add_node(acc, "Cast", [total], [acc], {"to": 1})
    else:
        matmul_inputs = [x, w]
        if op.bias_int is not None:
            bias = _new_const(graph, f"{prefix}/bias_int", op.bias_int.astype(np.float32))
            matmul_inputs.append(bias)
        graph.add_node(op.node, op.op_type, matmul_inputs, [acc], attrs)
        graph.integer_operands = graph.integer_operands | {op.node}
    if op.to_int32:
        graph.add_node(f"{prefix}/to_int32", "Cast", [acc], [op.output], {"to": 6})
    elif op.requant is not None:
        y_scale, y_zero = op.requant
        multiplier = (op.scale / y_scale).astype(np.float32)  # x_scale · w_scale / y_scale
        scaled = _scale(graph, prefix, acc, multiplier, channel_axis, rank, out_info.shape)
        one = _new_const(graph, f"{prefix}/unit_scale", np.ones((), np.float32))
        zero = _new_const(graph, f"{prefix}/y_zero_point", y_zero)
        graph.add_node(f"{prefix}/requantize", "QuantizeLinear", [scaled, one, zero], [op.output])
    else:
        target = op.output if not op.bias_float else f"{prefix}/scaled"
        if op.bias_float:
            graph.tensors[target] = TensorInfo(target, out_info.shape, Dtype.FP32)
        _scale(graph, prefix, acc, op.scale, channel_axis, rank, out_info.shape, target)
        if op.bias_float:
            graph.add_node(f"{prefix}/bias", "Add", [target, op.bias_float], [op.output])
    _drop_unread(graph, op.consumed)
    return op.node


_FLOAT_ATTRS = {
    "Conv": ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides"),
    "Gemm": ("transB",),
    "MatMul": (),
}


def _centred_input(graph: Graph, op: IntegerMatmul, prefix: str) -> str:
    """x − zx as float integers: a Cast when zx = 0, else a DequantizeLinear of scale 1."""
    x = op.x
    info = graph.tensors[x.tensor]
    out = f"{prefix}/x_int"
    graph.tensors[out] = TensorInfo(out, info.shape, Dtype.FP32)
    if not np.any(x.zero_point) and not x.runtime_zero_point:
        graph.add_node(f"{prefix}/x_int", "Cast", [x.tensor], [out], {"to": 1})
    else:
        one = _new_const(graph, f"{prefix}/x_unit_scale", np.ones((), np.float32))
        zero = x.runtime_zero_point or _new_const(
            graph, f"{prefix}/x_zero_point", x.zero_point.reshape(())
        )
        graph.add_node(f"{prefix}/x_int", "DequantizeLinear", [x.tensor, one, zero], [out])
    return out


def _centred_weight(graph: Graph, op: IntegerMatmul, prefix: str) -> str:
    """w − zw: the int8 weight itself when zw = 0 (the DMA widens it into bf16 tiles); with a
    zero point, the centred integers as an fp32 constant; a run-time operand like the input."""
    w = op.w
    weights = _const(graph, w.tensor)
    if weights is None:
        if w.zero_point.size != 1:
            return _centred_runtime_weight(graph, op, prefix)
        centred = Operand(
            w.tensor, np.ones((), np.float32), w.zero_point.reshape(()), None, w.runtime_zero_point
        )
        return _centred_input(graph, IntegerMatmul(prefix, "", "", centred, w, ""), f"{prefix}/b")
    if not np.any(w.zero_point):
        return w.tensor
    axis = _out_axis(op, graph)
    values = weights.astype(np.int64) - _along(w.zero_point, axis, weights.ndim)
    return _new_const(graph, f"{prefix}/w_int", values.astype(np.float32))


def _centred_runtime_weight(graph: Graph, op: IntegerMatmul, prefix: str) -> str:
    """w − zw for a run-time weight whose zero point is a constant vector along its output
    channels (ConvInteger's, MatMulInteger's per-channel w_zero_point): a Cast to fp32, then a
    Sub of the zero points shaped to broadcast along the output axis. Exact: both operands
    are integers within ±255.
    """
    w = op.w
    info = graph.tensors[w.tensor]
    rank = len(info.shape)
    axis = _out_axis(op, graph) % rank
    if w.zero_point.size != info.shape[axis]:
        raise _refusal(
            op.node,
            op.form,
            f"input B's zero point has {w.zero_point.size} values, not one per output channel "
            f"({info.shape[axis]})",
        )
    widened = f"{prefix}/b/w_fp32"
    graph.tensors[widened] = TensorInfo(widened, info.shape, Dtype.FP32)
    graph.add_node(widened, "Cast", [w.tensor], [widened], {"to": 1})
    zero = _new_const(
        graph, f"{prefix}/b/w_zero_point", _along(w.zero_point, axis, rank).astype(np.float32)
    )
    out = f"{prefix}/b/w_int"
    graph.tensors[out] = TensorInfo(out, info.shape, Dtype.FP32)
    graph.add_node(out, "Sub", [widened, zero], [out])
    return out


def _scale(graph, prefix, acc, scale, channel_axis, rank, shape, target=None) -> str:
    scale = np.asarray(scale, np.float32)
    if scale.size > 1:
        view = [1] * rank
        view[channel_axis] = scale.size
        scale = scale.reshape(view)
    else:
        scale = scale.reshape(())
    out = target or f"{prefix}/scaled"
    if out not in graph.tensors:
        graph.tensors[out] = TensorInfo(out, tuple(shape), Dtype.FP32)
    factor = _new_const(graph, f"{prefix}/scale", scale)
    graph.add_node(f"{prefix}/scale", "Mul", [acc, factor], [out])
    return out


def _new_const(graph: Graph, name: str, value: np.ndarray) -> str:
    value = np.asarray(value)
    graph.tensors[name] = TensorInfo(name, tuple(value.shape), Dtype.from_numpy(value.dtype), value)
    return name


def _drop_unread(graph: Graph, nodes: tuple[str, ...]) -> None:
    """Remove the DequantizeLinear nodes nothing reads any more."""
    for node in nodes:
        if node not in graph.nx:
            continue
        outputs = graph.node(node)["outputs"]
        if any(graph.consumers(t) or t in graph.outputs for t in outputs):
            continue
        graph.remove_node(node)


@dataclass(frozen=True)
class RaiseIntegerMatmuls:
    name: str = PASS_NAME

    def run(self, graph: Graph, options: CompileOptions) -> PassResult:
        findings: list[dict] = []
        forms: dict[str, int] = {}
        for name in list(graph.nx):
            if name not in graph.nx:
                continue
            op = match(graph, name)
            if op is None:
                continue
            data = graph.node(name)
            finding = {"node": name, "op_type": data["op_type"]}
            if isinstance(op, str):
                if _form_of(data) != "QDQ":  # no float path to fall back to
                    raise _refusal(name, data["op_type"], op)
                findings.append({**finding, "form": "QDQ", "path": "float", "reason": op})
                continue
            bound, reason = exactness(graph, op)
            finding.update(form=op.form, bound=bound)
            if reason is not None:
                op.groups = reduction_groups(graph, op)
                if op.groups is not None:
                    finding["split"] = len(op.groups)
                    reason = None
            if reason is not None:
                if op.form != "QDQ":
                    raise _refusal(name, data["op_type"], reason)
                findings.append({**finding, "path": "float", "reason": reason})
                continue
            weight = graph.tensors[op.w.tensor]
            rewrite(graph, op)
            findings.append(
                {
                    **finding,
                    "path": "integer",
                    "reason": None,
                    "weight": op.w.tensor,
                    "weight_dtype": str(weight.dtype),
                    "weight_bytes": int(np.prod(weight.shape)) * weight.dtype.itemsize
                    if weight.is_const
                    else 0,
                }
            )
            forms[op.form] = forms.get(op.form, 0) + 1
        integer = sum(1 for f in findings if f["path"] == "integer")
        stats = [
            Statistic(
                PASS_NAME,
                "integer_matmuls",
                "Number of quantized convs and matmuls run on integers",
                integer,
            ),
            Statistic(
                PASS_NAME,
                "float_quantized_matmuls",
                "Number of quantized convs and matmuls left on the float path",
                len(findings) - integer,
            ),
        ]
        return PassResult(integer > 0, stats, findings)


def _form_of(data: dict) -> str:
    return "QDQ" if data["op_type"] in ("Conv", "MatMul", "Gemm") else data["op_type"]


def _refusal(node: str, op_type: str, reason: str):
    from onnx2bir.errors import CompileError

    return CompileError(
        f"node {node!r} ({op_type}): cannot run on the integer path: {reason} "
        "(docs/quantization.md#exactness)"
    )
