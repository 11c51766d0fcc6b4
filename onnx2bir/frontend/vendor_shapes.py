"""Output shapes of the vendor ops onnx2bir lowers or expands, which onnx's shape inference
cannot give.

onnx knows no `com.microsoft` schema, so the output of such a node has no inferred shape and
neither has anything downstream of it. `add_vendor_shapes` writes the output's type into the
model's value_info, so the next round of inference carries it on (`folding._infer` alternates
the two until nothing changes):

- the vendor ops with a lowering whose output has the type and shape of their first input (the
  op traits' `output_like_input`: com.microsoft RotaryEmbedding);
- the com.microsoft QOperator ops onnxruntime's quantization tool writes
  (docs/quantization.md#qoperator), by the rules in `_QOP_RULES`: QLinearAdd and QLinearMul
  broadcast A (input 0) with B (input 3); QLinearSigmoid, QLinearLeakyRelu and QLinearSoftmax
  are shaped like X; QLinearConcat joins its (X, scale, zero point) triples along `axis`;
  QLinearGlobalAveragePool keeps N and C (`channels_last`: N, 1…, C); QLinearAveragePool
  follows AveragePool's arithmetic; QLinearWhere broadcasts its three data inputs; QGemm is
  M x N (transA, transB). The element type is the output zero point's, or when that is absent
  the quantized input's (QGemm without y_zero_point gives float32).

QLinearConv and QLinearMatMul are standard ONNX: onnx infers them itself.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import onnx

from onnx2bir.frontend.nbits_shapes import add_nbits_shapes
from onnx2bir.op_traits import op_key, traits

_MS = "com.microsoft"


def _typed(model: onnx.ModelProto) -> dict[str, onnx.TypeProto]:
    graph = model.graph
    types = {
        value.name: value.type
        for value in [*graph.input, *graph.value_info, *graph.output]
        if value.type.tensor_type.HasField("shape")
    }
    for init in graph.initializer:
        types.setdefault(init.name, onnx.helper.make_tensor_type_proto(init.data_type, init.dims))
    return types


# --- the QOperator rules ---------------------------------------------------------------------
Shape = tuple[int, ...]


def _shape(types: dict[str, onnx.TypeProto], name: str) -> Shape | None:
    """The static shape of `name`, None when unknown or symbolic."""
    if not name or name not in types:
        return None
    dims = types[name].tensor_type.shape.dim
    if not all(dim.HasField("dim_value") for dim in dims):
        return None
    return tuple(dim.dim_value for dim in dims)


def _elem(types: dict[str, onnx.TypeProto], node: onnx.NodeProto, *indices: int) -> int | None:
    """The element type of the first of `indices` that names a typed input."""
    for index in indices:
        name = node.input[index] if index < len(node.input) else ""
        if name and name in types:
            return types[name].tensor_type.elem_type
    return None


def _attrs(node: onnx.NodeProto) -> dict:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def _broadcast(*shapes: Shape | None) -> Shape | None:
    if any(shape is None for shape in shapes):
        return None
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        return None  # onnx2bir's contracts report the mismatch, not the shape rule


def _binary(types, node) -> tuple[Shape | None, int | None]:
    shape = _broadcast(_shape(types, node.input[0]), _shape(types, _input(node, 3)))
    return shape, _elem(types, node, 7, 0)


def _like_x(types, node) -> tuple[Shape | None, int | None]:
    return _shape(types, node.input[0]), _elem(types, node, 4, 0)


def _concat(types, node) -> tuple[Shape | None, int | None]:
    shapes = [_shape(types, name) for name in node.input[2::3]]
    if not shapes or any(shape is None for shape in shapes):
        return None, None
    rank = len(shapes[0])
    axis = int(_attrs(node).get("axis", 0))
    if rank == 0 or not -rank <= axis < rank or any(len(s) != rank for s in shapes):
        return None, None
    axis %= rank
    out = list(shapes[0])
    out[axis] = sum(shape[axis] for shape in shapes)
    return tuple(out), _elem(types, node, 1, 2)


def _global_pool(types, node) -> tuple[Shape | None, int | None]:
    shape = _shape(types, node.input[0])
    if shape is None or len(shape) < 3:
        return None, None
    if int(_attrs(node).get("channels_last", 0)):
        out = (shape[0],) + (1,) * (len(shape) - 2) + (shape[-1],)
    else:
        out = shape[:2] + (1,) * (len(shape) - 2)
    return out, _elem(types, node, 4, 0)


def pool_output_dims(
    spatial: Shape,
    kernel: list[int],
    strides: list[int],
    pads: list[int],
    auto_pad: str,
    ceil_mode: bool,
) -> Shape:
    """AveragePool's output spatial dims (the ONNX operator's formula, dilations 1)."""
    out = []
    for i, size in enumerate(spatial):
        k, s = kernel[i], strides[i]
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            out.append(math.ceil(size / s))
        elif auto_pad == "VALID":
            out.append(math.ceil((size - k + 1) / s))
        else:
            total = size + pads[i] + pads[i + len(spatial)] - k
            steps = math.ceil(total / s) if ceil_mode else total // s
            if ceil_mode and steps * s >= size + pads[i]:
                steps -= 1  # the last window would start in the end padding
            out.append(steps + 1)
    return tuple(out)


def _avg_pool(types, node) -> tuple[Shape | None, int | None]:
    shape = _shape(types, node.input[0])
    attrs = _attrs(node)
    kernel = [int(k) for k in attrs.get("kernel_shape", [])]
    if shape is None or len(shape) < 3 or len(kernel) != len(shape) - 2:
        return None, None
    channels_last = int(attrs.get("channels_last", 0))
    spatial = shape[1:-1] if channels_last else shape[2:]
    rank = len(spatial)
    strides = [int(s) for s in attrs.get("strides", [1] * rank)]
    pads = [int(p) for p in attrs.get("pads", [0] * 2 * rank)]
    auto_pad = attrs.get("auto_pad", b"NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else str(auto_pad)
    dims = pool_output_dims(
        spatial, kernel, strides, pads, auto_pad, bool(attrs.get("ceil_mode", 0))
    )
    out = (shape[0], *dims, shape[-1]) if channels_last else (*shape[:2], *dims)
    return out, _elem(types, node, 4, 0)


def _where(types, node) -> tuple[Shape | None, int | None]:
    shape = _broadcast(*(_shape(types, _input(node, i)) for i in (0, 1, 4)))
    return shape, _elem(types, node, 8, 1)


def _qgemm(types, node) -> tuple[Shape | None, int | None]:
    a, b = _shape(types, node.input[0]), _shape(types, _input(node, 3))
    if a is None or b is None or len(a) != 2 or len(b) != 2:
        return None, None
    attrs = _attrs(node)
    m = a[1] if int(attrs.get("transA", 0)) else a[0]
    n = b[0] if int(attrs.get("transB", 0)) else b[1]
    elem = _elem(types, node, 8) if _input(node, 8) else onnx.TensorProto.FLOAT
    return (m, n), elem


def _input(node: onnx.NodeProto, index: int) -> str:
    return node.input[index] if index < len(node.input) else ""


_QOP_RULES: dict[str, Callable] = {
    "QLinearAdd": _binary,
    "QLinearMul": _binary,
    "QLinearSigmoid": _like_x,
    "QLinearLeakyRelu": _like_x,
    "QLinearSoftmax": _like_x,
    "QLinearConcat": _concat,
    "QLinearGlobalAveragePool": _global_pool,
    "QLinearAveragePool": _avg_pool,
    "QLinearWhere": _where,
    "QGemm": _qgemm,
}


def _rule_type(types, node: onnx.NodeProto) -> onnx.TypeProto | None:
    """The output type a rule gives `node`, or None (no rule, or an input not yet known)."""
    if traits(op_key(node.op_type, node.domain)).output_like_input:
        return types.get(node.input[0]) if node.input else None
    rule = _QOP_RULES.get(node.op_type) if node.domain == _MS else None
    if rule is None:
        return None
    shape, elem = rule(types, node)
    if shape is None:
        return None
    if elem is None:
        elem = onnx.TensorProto.UINT8
    return onnx.helper.make_tensor_type_proto(elem, shape)


def add_vendor_shapes(model: onnx.ModelProto) -> bool:
    """Give each unshaped output of a vendor op with a rule (module docstring) its type;
    True if any."""
    types = _typed(model)
    changed = add_nbits_shapes(model, types)  # com.microsoft MatMulNBits: A [.., K] → [.., N]
    for node in model.graph.node:
        if not node.output or not node.output[0] or node.output[0] in types:
            continue
        found = _rule_type(types, node)
        if found is None:
            continue
        value = onnx.ValueInfoProto(name=node.output[0])
        value.type.CopyFrom(found)
        model.graph.value_info.append(value)
        types[node.output[0]] = value.type
        changed = True
    return changed
