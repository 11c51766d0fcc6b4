"""What every conv kernel tracer reads from its NativeKernel node.

The selector (`onnx2bir.patterns.conv.selection`) writes `func_name` and the JSON of
`get_kernel_attr`;
`conv_attrs_with_out_shape` reads it back and adds the output shape, the counterpart of the
reference codegen's `_get_conv_attrs_with_out_shape`. `ConvKernelArgs` then gives the
geometry in canonical terms (batch, channels, spatial sizes), whatever layout the kernel's
tensors are stored in, plus the element strides of each canonical axis in that layout.

Inputs of the node: x and w already in the kernel's layouts, then an optional bias [C_out];
the output is in the kernel's result layout. Spatial dims are always two (1-D convs carry a
unit height).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from onnx2bir.bir.enums import ActFunc
from onnx2bir.codegen.driver import BirCodeGen
from onnx2bir.codegen.lower.conv import FUSED_ACTIVATION
from onnx2bir.codegen.spatial import WindowGeometry
from onnx2bir.codegen.tiling import contiguous_strides
from onnx2bir.graph import Node


def conv_attrs_with_out_shape(cg: BirCodeGen, node: Node) -> dict:
    attrs = json.loads(node.attr("attrs"))
    attrs["out_shape"] = list(cg.graph.tensors[node.outputs[0]].shape)
    return attrs


def _canonical(shape: list[int], perm: list[int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(canonical sizes, element stride of each canonical axis in the stored layout)."""
    strides = contiguous_strides(tuple(shape))
    return tuple(shape[a] for a in perm), tuple(strides[a] for a in perm)


@dataclass(frozen=True)
class ConvKernelArgs:
    x: str  # DRAM location names
    w: str
    bias: str | None
    y: str
    batch: int
    c_in: int
    c_out: int
    groups: int
    in_h: int
    in_w: int
    k_h: int
    k_w: int
    out_h: int
    out_w: int
    stride: tuple[int, int]
    # By role, decoded from the attributes (`conv_geometry`): a backward-form op carries the
    # input dilation in its rhs_dilation attribute and the kernel dilation in lhs_dilation.
    rhs_dilation: tuple[int, int]  # kernel tap spacing
    lhs_dilation: tuple[int, int]  # input dilation (a transposed conv's stride)
    padding: tuple[tuple[int, int], tuple[int, int]]
    rhs_reversal: bool  # transposed conv: tap (i, j) reads weight (kH-1-i, kW-1-j)
    x_strides: tuple[int, ...]  # element strides of canonical (b, f, 0, 1) in x's layout
    w_strides: tuple[int, ...]  # of canonical (o, i, 0, 1) in w's layout
    y_strides: tuple[int, ...]  # of canonical (b, f, 0, 1) in y's layout
    activation: ActFunc = ActFunc.COPY  # applied on the PSUM eviction (FUSED_ACTIVATION)

    @property
    def c_in_group(self) -> int:
        return self.c_in // self.groups

    @property
    def c_out_group(self) -> int:
        return self.c_out // self.groups

    @property
    def taps(self) -> int:
        return self.k_h * self.k_w


def conv_kernel_args(cg: BirCodeGen, node: Node) -> ConvKernelArgs:
    attrs = conv_attrs_with_out_shape(cg, node)
    x_name, w_name = node.inputs[:2]
    bias = node.inputs[2] if len(node.inputs) > 2 and node.inputs[2] else None
    (batch, c_in, in_h, in_w), x_strides = _canonical(attrs["input_shape"], attrs["in_perm"])
    (c_out, _, k_h, k_w), w_strides = _canonical(attrs["kernel_shape"], attrs["kern_perm"])
    (_, _, out_h, out_w), y_strides = _canonical(attrs["out_shape"], attrs["out_perm"])
    padding = tuple(tuple(pair) for pair in attrs["padding"])
    geometry = conv_geometry(
        attrs["lhs_dilation"],
        attrs["rhs_dilation"],
        attrs["feature_group_count"],
        attrs["batch_group_count"],
        bool(attrs.get("rhs_reversal", False)),
    )
    return ConvKernelArgs(
        x=cg.dram(x_name).name,
        w=cg.dram(w_name).name,
        bias=cg.dram(bias).name if bias else None,
        y=cg.dram(node.outputs[0]).name,
        batch=batch,
        c_in=c_in,
        c_out=c_out,
        groups=geometry.groups,
        in_h=in_h,
        in_w=in_w,
        k_h=k_h,
        k_w=k_w,
        out_h=out_h,
        out_w=out_w,
        stride=tuple(attrs["stride"]),
        rhs_dilation=tuple(geometry.kernel_dilation),
        lhs_dilation=tuple(geometry.input_dilation),
        padding=padding,
        rhs_reversal=bool(attrs.get("rhs_reversal", False)),
        x_strides=x_strides,
        w_strides=w_strides,
        y_strides=y_strides,
        activation=ActFunc(attrs.get(FUSED_ACTIVATION, ActFunc.COPY.value)),
    )


@dataclass(frozen=True, slots=True)
class ConvGeometry:
    """The dilations and group count by role, whatever the form the op is written in."""

    input_dilation: list[int]  # zeros inserted between input pixels (a transposed conv's stride)
    kernel_dilation: list[int]  # spacing of the kernel taps
    groups: int


def conv_geometry(
    lhs_dilation, rhs_dilation, feature_group_count: int, batch_group_count: int, backward: bool
) -> ConvGeometry:
    """Decode the attribute encoding: forward ops dilate the input by lhs_dilation and the
    kernel by rhs_dilation, group on feature_group_count; backward ops (rhs_reversal) swap the
    dilations and group on batch_group_count."""
    if backward:
        return ConvGeometry(list(rhs_dilation), list(lhs_dilation), batch_group_count)
    return ConvGeometry(list(lhs_dilation), list(rhs_dilation), feature_group_count)


def kernel_geometry(args: ConvKernelArgs) -> WindowGeometry:
    """The window of a kernel's conv, canonical (rows, columns), its leading pads."""
    (pad_top, _), (pad_left, _) = args.padding
    return WindowGeometry(
        args.in_h,
        args.in_w,
        args.out_h,
        args.out_w,
        args.k_h,
        args.k_w,
        args.stride[0],
        args.stride[1],
        args.rhs_dilation[0],
        args.rhs_dilation[1],
        pad_top,
        pad_left,
    )
