"""Node contracts that need static shapes: attribute values and ranges, convolution channels,
constant gather indices. Checked on the folded model, before the graph is built.

onnx's shape inference does not check everything onnxruntime (or the lowerings) rely on: a
Conv whose weight disagrees with its input channels, a `group` that does not divide them, an
`auto_pad` value that does not exist, a LayerNormalization axis out of range, a constant Gather
index far outside its table, a Reshape to a shape of another element count. Each is refused
here with one line naming the node and the attribute or input (`docs/input_contracts.md#model`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
from onnx import numpy_helper

from onnx2bir.errors import UserError
from onnx2bir.frontend.contracts import node_label
from onnx2bir.op_traits import STANDARD_DOMAINS, TRAITS, ops_with

AUTO_PAD = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")
_SPATIAL = ops_with(spatial=True)
# Ops whose `axis` is an axis of input 0, in [-r, r) or, for Flatten, [-r, r] (the op traits).
_AXIS_OPS = {op: t.axis_inclusive for op, t in TRAITS.items() if t.axis_inclusive is not None}


class _Node:
    """One node with what the checks read: attributes, input shapes, constant values."""

    def __init__(self, node, index, shapes, constant: Callable[[str], np.ndarray | None]):
        self.proto, self.label = node, node_label(node, index)
        self.attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        self.shapes, self.constant = shapes, constant

    def shape(self, position: int) -> tuple[int, ...] | None:
        inputs = self.proto.input
        if position >= len(inputs) or not inputs[position]:
            return None
        return self.shapes.get(inputs[position])

    def refuse(self, what: str) -> None:
        raise UserError(f"{self.label}: {what}")


def _check_spatial(n: _Node) -> None:
    auto_pad = n.attrs.get("auto_pad", b"NOTSET")
    auto_pad = auto_pad.decode(errors="replace") if isinstance(auto_pad, bytes) else auto_pad
    if auto_pad not in AUTO_PAD:
        n.refuse(f"auto_pad {auto_pad!r} is not one of {', '.join(AUTO_PAD)}")
    if auto_pad != "NOTSET" and "pads" in n.attrs:
        n.refuse(f"pads and auto_pad {auto_pad!r} are both given; the op takes one or the other")
    x = n.shape(0)
    rank = len(x) - 2 if x is not None and len(x) >= 2 else None
    for name, low in (("kernel_shape", 1), ("strides", 1), ("dilations", 1), ("pads", 0)):
        values = n.attrs.get(name)
        if values is None:
            continue
        bad = [v for v in values if v < low]
        if bad:
            n.refuse(f"{name} {list(values)}: every value must be >= {low}")
        want = None if rank is None else (2 * rank if name == "pads" else rank)
        if want is not None and len(values) != want:
            n.refuse(
                f"{name} has {len(values)} values; the input's {rank} spatial axes need {want}"
            )
    if x is not None and len(x) < 3:
        n.refuse(
            f"input {n.proto.input[0]!r} has rank {len(x)}; it needs a batch, a channel "
            "and at least one spatial axis"
        )


def _check_conv(n: _Node) -> None:
    x, w = n.shape(0), n.shape(1)
    group = n.attrs.get("group", 1)
    if group < 1:
        n.refuse(f"group {group} must be >= 1")
    if x is None or w is None:
        return
    if len(w) != len(x):
        n.refuse(f"weight {n.proto.input[1]!r} has rank {len(w)}; the input has rank {len(x)}")
    channels = x[1]
    transpose = n.proto.op_type == "ConvTranspose"
    if channels % group:
        n.refuse(f"group {group} does not divide the input's {channels} channels")
    if transpose:
        if w[0] != channels:
            n.refuse(
                f"weight {n.proto.input[1]!r} {list(w)} has {w[0]} input channels; the "
                f"input has {channels}"
            )
    else:
        if w[1] * group != channels:
            n.refuse(
                f"weight {n.proto.input[1]!r} {list(w)} takes {w[1]} channels per group "
                f"x group {group}; the input has {channels}"
            )
        if w[0] % group:
            n.refuse(f"group {group} does not divide the weight's {w[0]} output channels")
    kernel = n.attrs.get("kernel_shape")
    if kernel is not None and list(kernel) != list(w[2:]):
        n.refuse(f"kernel_shape {list(kernel)} disagrees with weight shape {list(w)}")
    bias = n.shape(2)
    out_channels = w[1] * group if transpose else w[0]
    if bias is not None and tuple(bias) != (out_channels,):
        n.refuse(f"bias {n.proto.input[2]!r} has shape {list(bias)}; expected [{out_channels}]")


def _check_axis(n: _Node) -> None:
    if "axis" not in n.attrs:
        return
    x = n.shape(0)
    if x is None:
        return
    rank, axis = len(x), n.attrs["axis"]
    high = rank + 1 if _AXIS_OPS[n.proto.op_type] else rank
    if not -rank <= axis < high:
        n.refuse(f"axis {axis} is out of range for input {n.proto.input[0]!r} of rank {rank}")


def _check_transpose(n: _Node) -> None:
    x, perm = n.shape(0), n.attrs.get("perm")
    if x is not None and perm is not None and sorted(perm) != list(range(len(x))):
        n.refuse(f"perm {list(perm)} is not a permutation of the input's {len(x)} axes")


def _out_of_range(indices: np.ndarray, size: int) -> int | None:
    bad = indices[(indices < -size) | (indices >= size)]
    return int(bad.flat[0]) if bad.size else None


def _check_gather(n: _Node) -> None:
    data, indices = n.shape(0), n.constant(n.proto.input[1]) if len(n.proto.input) > 1 else None
    if data is None or indices is None or not len(data):
        return
    indices = np.asarray(indices).astype(np.int64, copy=False)
    op = n.proto.op_type
    if op in ("Gather", "GatherElements"):
        axis = n.attrs.get("axis", 0) % len(data)
        bad = _out_of_range(indices, data[axis])
        if bad is not None:
            n.refuse(
                f"constant index {bad} in {n.proto.input[1]!r} is outside [-{data[axis]}, "
                f"{data[axis]}) along axis {axis} of {n.proto.input[0]!r}"
            )
        return
    batch = n.attrs.get("batch_dims", 0)
    depth = indices.shape[-1] if indices.ndim else 0
    if depth > len(data) - batch:
        n.refuse(
            f"indices {n.proto.input[1]!r} index {depth} axes; the data has only "
            f"{len(data) - batch} after batch_dims {batch}"
        )
    for j in range(depth):
        size = data[batch + j]
        bad = _out_of_range(indices[..., j], size)
        if bad is not None:
            n.refuse(
                f"constant index {bad} in {n.proto.input[1]!r} is outside [-{size}, {size}) "
                f"along axis {batch + j} of {n.proto.input[0]!r}"
            )


def _check_reshape(n: _Node) -> None:
    """A constant target shape keeps the element count (0 copies the input's dim unless
    `allowzero`; one -1 takes what is left): onnxruntime refuses the model otherwise."""
    x = n.shape(0)
    target = n.constant(n.proto.input[1]) if len(n.proto.input) > 1 else None
    if x is None or target is None:
        return
    wanted = [int(v) for v in np.asarray(target).reshape(-1)]
    keep_zero = n.attrs.get("allowzero", 0)
    dims = [x[i] if v == 0 and not keep_zero and i < len(x) else v for i, v in enumerate(wanted)]
    count = int(np.prod(x, dtype=np.int64))
    known = int(np.prod([d for d in dims if d != -1], dtype=np.int64))
    if dims.count(-1) > 1 or any(d < -1 for d in dims):
        n.refuse(f"shape {wanted} in {n.proto.input[1]!r} is not a valid Reshape target")
    if -1 in dims and (known == 0 or count % known) or -1 not in dims and known != count:
        n.refuse(
            f"cannot reshape {list(x)} ({count} elements) to {wanted} in "
            f"{n.proto.input[1]!r}: the number of elements changes"
        )


_CHECKS: dict[str, list[Callable[[_Node], None]]] = {}
for _op in _SPATIAL:
    _CHECKS.setdefault(_op, []).append(_check_spatial)
for _op in ("Conv", "ConvTranspose"):
    _CHECKS[_op].append(_check_conv)
for _op in _AXIS_OPS:
    _CHECKS.setdefault(_op, []).append(_check_axis)
_CHECKS["Transpose"] = [_check_transpose]
_CHECKS["Reshape"] = [_check_reshape]
for _op in ("Gather", "GatherElements", "GatherND"):
    _CHECKS.setdefault(_op, []).append(_check_gather)


def check_nodes(
    model: onnx.ModelProto, shapes: dict[str, tuple[int, ...]], weights: dict[str, np.ndarray]
) -> None:
    """Every standard-domain node of `model` against the contracts above."""
    initializers = {init.name: init for init in model.graph.initializer}

    def constant(name: str) -> np.ndarray | None:
        if name in weights:
            return weights[name]
        if name in initializers:
            return numpy_helper.to_array(initializers[name])
        return None

    for index, node in enumerate(model.graph.node):
        if node.domain not in STANDARD_DOMAINS:
            continue
        checks = _CHECKS.get(node.op_type)
        if checks:
            wrapped = _Node(node, index, shapes, constant)
            for check in checks:
                check(wrapped)
