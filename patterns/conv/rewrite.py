"""The rewrite of TransformConvOp (docs/conv_selection.md#attributes): a conv whose kernel was
selected becomes a NativeKernel node.

In: the Graph, the conv's `ConvOp` and the selected registry row (`KernelInfo`). Out: the conv's
tensors bridged to the kernel's layouts (Transpose nodes, folded at once for constant weights,
inserted only when the bridge is not the identity or the row sets `insert_transpose`; a 1-D
conv first given its unit height by a Reshape), the conv replaced by a NativeKernel node whose
`func_name` is the kernel name and whose `attrs` are the row's marshalled attributes (also
returned), and the kernel's result brought back to the layout and rank of the conv's output.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import numpy as np

from onnx2bir.bir.enums import Dtype
from onnx2bir.graph import Graph, TensorInfo
from onnx2bir.patterns.conv.op import (
    CANONICAL_RESULT,
    ConvOp,
    Perm,
    apply_perm_to_dims,
    get_bridging_output_perm,
    invert_perm,
    is_identity,
    layout_bridge,
    layout_perm,
)

if TYPE_CHECKING:
    from onnx2bir.patterns.conv.selection import KernelInfo


def lower_to_conv_kernel(graph: Graph, op: ConvOp, info: KernelInfo) -> dict:
    """Bridge layouts, marshal attributes, replace the conv by a NativeKernel node, which with
    its bridges takes the conv's place in the node order."""
    with graph.in_place_of(op.node):
        return _lower(graph, op, info)


def _lower(graph: Graph, op: ConvOp, info: KernelInfo) -> dict:
    target_in, target_kern, target_out = info.in_perm(op), info.kern_perm(op), info.out_perm(op)
    x, w = op.inputs[:2]
    bias = op.inputs[2] if len(op.inputs) > 2 else ""
    x_name, w_name = _unit_height_views(graph, op, x, w)
    # The transposes that turn framework tensors into the kernel's layouts. Perms map a layout
    # to canonical, so the transpose is the bridge between the two canonical→layout maps.
    in_bridge = layout_bridge(op.in_perm, target_in)
    kern_bridge = layout_bridge(op.kern_perm, target_kern)
    out_bridge = get_bridging_output_perm(target_out, op.out_perm)
    always = info.insert_transpose
    if always or not is_identity(in_bridge):
        x_name = _transpose(graph, op, x_name, in_bridge, "input")
    if always or not is_identity(kern_bridge):
        w_name = _transpose(graph, op, w_name, kern_bridge, "kernel")
    op.in_shape = apply_perm_to_dims(op.in_shape, in_bridge)
    op.kern_shape = apply_perm_to_dims(op.kern_shape, kern_bridge)
    op.res_shape = apply_perm_to_dims(op.res_shape, invert_perm(out_bridge))
    op.in_perm, op.kern_perm, op.out_perm = target_in, target_kern, target_out
    attrs = info.get_kernel_attr(op)
    result = op.output
    bridge_out = (
        always
        or not is_identity(out_bridge)
        or op.res_shape != tuple(graph.tensors[op.output].shape)
    )
    if bridge_out:
        result = f"{op.output}@{info.out_layout}"
        graph.tensors[result] = TensorInfo(result, op.res_shape, op.dtype)
    graph.remove_node(op.node)
    graph.add_node(
        op.node,
        "NativeKernel",
        [x_name, w_name, bias],
        [result],
        {"func_name": info.name, "attrs": json.dumps(attrs)},
        domain="onnx2bir",
    )
    if bridge_out:
        final_shape = tuple(graph.tensors[op.output].shape)
        perm_out = out_bridge if len(final_shape) == len(op.res_shape) else None
        _emit_output(graph, op, result, perm_out)
    return attrs


def _unit_height_views(graph: Graph, op: ConvOp, x: str, w: str) -> tuple[str, str]:
    """1-D convs: give x and w their unit height (a Reshape, folded for constant weights)."""
    if len(graph.tensors[x].shape) == len(op.in_shape):
        return x, w
    x4 = f"{x}@{op.node}.2d"
    graph.tensors[x4] = TensorInfo(x4, op.in_shape, graph.tensors[x].dtype)
    shape_name = f"{op.node}/unit_height_shape"
    graph.tensors[shape_name] = TensorInfo(
        shape_name, (4,), Dtype.INT64, np.array(op.in_shape, np.int64)
    )
    graph.add_node(f"{op.node}/unit_height", "Reshape", [x, shape_name], [x4])
    return x4, _const_or_reshape(graph, op, w, op.kern_shape)


def _const_or_reshape(graph: Graph, op: ConvOp, tensor: str, shape: tuple[int, ...]) -> str:
    info = graph.tensors[tensor]
    name = f"{tensor}@{op.node}.2d"
    if not info.is_const:
        raise ValueError(f"conv {op.node!r}: 1-D conv with a computed weight is not supported")
    graph.tensors[name] = TensorInfo(name, shape, info.dtype, info.const.reshape(shape))
    return name


def _transpose(graph: Graph, op: ConvOp, tensor: str, perm: Perm, role: str) -> str:
    """Transpose `tensor` by `perm`: folded now for a constant, else an inserted Transpose."""
    info = graph.tensors[tensor]
    name = f"{tensor}@{op.node}.{role}"
    shape = apply_perm_to_dims(tuple(info.shape), perm)
    if info.is_const:
        # Named by the constant and the perm, so that convs sharing a weight (the per-image
        # clones of patterns/batch_split.py) share its one transposed copy.
        name = f"{tensor}@{role}{''.join(map(str, perm))}"
        if name not in graph.tensors:
            graph.tensors[name] = TensorInfo(
                name, shape, info.dtype, np.ascontiguousarray(info.const.transpose(perm))
            )
        return name
    graph.tensors[name] = TensorInfo(name, shape, info.dtype)
    graph.add_node(
        f"{op.node}/{role}_transpose", "Transpose", [tensor], [name], {"perm": list(perm)}
    )
    return name


def _emit_output(graph: Graph, op: ConvOp, result: str, perm: Perm | None) -> None:
    """Bring the kernel's result back to the framework layout (and rank) of the conv output."""
    final = graph.tensors[op.output]
    if perm is not None:
        graph.add_node(
            f"{op.node}/output_transpose", "Transpose", [result], [op.output], {"perm": list(perm)}
        )
        return
    # 1-D conv: the 4-D result loses its unit height after the layout bridge.
    staged = result
    if not is_identity(
        get_bridging_output_perm(op.out_perm, layout_perm(CANONICAL_RESULT, CANONICAL_RESULT))
    ):
        staged = f"{result}.nchw"
        nchw = apply_perm_to_dims(op.res_shape, op.out_perm)
        graph.tensors[staged] = TensorInfo(staged, nchw, op.dtype)
        graph.add_node(
            f"{op.node}/output_transpose",
            "Transpose",
            [result],
            [staged],
            {"perm": list(op.out_perm)},
        )
    shape_name = f"{op.node}/output_shape"
    graph.tensors[shape_name] = TensorInfo(
        shape_name, (len(final.shape),), Dtype.INT64, np.array(final.shape, np.int64)
    )
    graph.add_node(f"{op.node}/output_reshape", "Reshape", [staged, shape_name], [op.output])
