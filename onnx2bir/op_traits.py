"""What the compiler knows about an ONNX op beyond its lowering, in one table.

In: an op type (a vendor op as "domain.OpType", `onnx2bir.codegen.registry.lowering_key`). Out:
its `OpTraits`. Read by the memory planner (which ops fix the row layout of their tensors,
which broadcast), the import contracts (which take an `axis` and its range), the front end
(vendor ops whose output is shaped like their first input), the cast plan (which inputs go to
PE operand tiles) and the tolerance (how long an op's reduction is). An op not in the table
has none of these traits. Adding an op: its lowering in `codegen/lower/`, and a row here when
it has a trait.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

STANDARD_DOMAINS = ("", "ai.onnx")  # the default ONNX domain, by its two spellings


def op_key(op_type: str, domain: str = "") -> str:
    """The key of an op in the tables: its type for the standard domain, "domain.OpType"
    otherwise (a vendor op is a different op from the standard one of the same name)."""
    return op_type if domain in STANDARD_DOMAINS else f"{domain}.{op_type}"


class Layout(enum.StrEnum):
    """The row length an op's lowering walks its tensors in (docs/memory_planner.md#layout)."""

    PLANE = "plane"  # a channel plane: conv, pool and norm ops put channels on partitions
    ROW = "row"  # the last dim: matrix ops put matrix rows on partitions


class Reduction(enum.StrEnum):
    """How long the sum behind one output element is (`runtime/oracle/tolerance.py`)."""

    CONV = "conv"  # C_in/group · kernel taps
    CONV_TRANSPOSE = "conv_transpose"
    MATMUL = "matmul"  # the last dim of A
    GEMM = "gemm"  # A's inner dim, by transA
    AXIS = "axis"  # the input's `axis` dim (Softmax)
    TO_OUTPUT = "to_output"  # input elements per output element (reductions, global pools)
    EINSUM = "einsum"  # the sizes of the letters the equation sums away


@dataclass(frozen=True, slots=True)
class OpTraits:
    layout: Layout | None = None
    broadcasts: bool = False  # elementwise, numpy broadcasting of its inputs
    # Takes an `axis` attribute: False in [-r, r), True in [-r, r] (Flatten); None: no axis.
    axis_inclusive: bool | None = None
    pe_operands: tuple[int, ...] = ()  # inputs loaded into PE operand tiles (the autocast)
    reduction: Reduction | None = None
    output_like_input: bool = False  # a vendor op whose output has its first input's type
    spatial: bool = False  # pads, strides and dilations over spatial dims (the contracts)


NONE = OpTraits()
_PLANE = OpTraits(layout=Layout.PLANE)
_SPATIAL_PLANE = OpTraits(layout=Layout.PLANE, spatial=True)
_ROW = OpTraits(layout=Layout.ROW)
_BROADCAST = OpTraits(broadcasts=True)
_AXIS = OpTraits(axis_inclusive=False)

TRAITS: dict[str, OpTraits] = {
    # Spatial ops: channel planes on partitions.
    "Conv": OpTraits(
        layout=Layout.PLANE, pe_operands=(0, 1), reduction=Reduction.CONV, spatial=True
    ),
    "ConvTranspose": OpTraits(
        layout=Layout.PLANE, pe_operands=(0, 1), reduction=Reduction.CONV_TRANSPOSE, spatial=True
    ),
    "MaxPool": _SPATIAL_PLANE,
    "AveragePool": _SPATIAL_PLANE,
    "GlobalAveragePool": OpTraits(layout=Layout.PLANE, reduction=Reduction.TO_OUTPUT),
    "GlobalMaxPool": _PLANE,
    "LpPool": _SPATIAL_PLANE,
    "BatchNormalization": _PLANE,
    "InstanceNormalization": _PLANE,
    "GroupNormalization": _PLANE,
    "LRN": _PLANE,
    "Resize": _PLANE,
    "Upsample": _PLANE,
    "DepthToSpace": _PLANE,
    "SpaceToDepth": _PLANE,
    "NativeKernel": _PLANE,  # a conv kernel the conv selection chose
    # Matrix ops: matrix rows on partitions.
    "MatMul": OpTraits(layout=Layout.ROW, pe_operands=(0, 1), reduction=Reduction.MATMUL),
    "Gemm": OpTraits(layout=Layout.ROW, pe_operands=(0, 1), reduction=Reduction.GEMM),
    "Einsum": OpTraits(layout=Layout.ROW, pe_operands=(0, 1), reduction=Reduction.EINSUM),
    "Softmax": OpTraits(layout=Layout.ROW, axis_inclusive=False, reduction=Reduction.AXIS),
    "LogSoftmax": OpTraits(layout=Layout.ROW, axis_inclusive=False, reduction=Reduction.AXIS),
    "LayerNormalization": OpTraits(layout=Layout.ROW, axis_inclusive=False),
    "RMSNormalization": _ROW,
    "SimplifiedLayerNormalization": _ROW,
    "SkipLayerNormalization": _ROW,
    "CustomCall": _ROW,  # an attention or MLP kernel the raises made
    # Elementwise ops with numpy broadcasting (lowered by `emit_elementwise`).
    **dict.fromkeys(
        (
            "Add",
            "Sub",
            "Mul",
            "Div",
            "Pow",
            "Max",
            "Min",
            "Sum",
            "Mean",
            "Mod",
            "PRelu",
            "Equal",
            "Less",
            "LessOrEqual",
            "Greater",
            "GreaterOrEqual",
            "And",
            "Or",
            "Xor",
            "Where",
        ),
        _BROADCAST,
    ),
    # Ops with an `axis` attribute the contracts check.
    **dict.fromkeys(
        ("Hardmax", "Concat", "Gather", "GatherElements", "Split", "ArgMax", "ArgMin"), _AXIS
    ),
    "Flatten": OpTraits(axis_inclusive=True),
    "ReduceSum": OpTraits(reduction=Reduction.TO_OUTPUT),
    "ReduceMean": OpTraits(reduction=Reduction.TO_OUTPUT),
    "com.microsoft.RotaryEmbedding": OpTraits(output_like_input=True),
}


def traits(op_type: str) -> OpTraits:
    """The traits of an op type (a vendor op as "domain.OpType"); NONE when it has none."""
    return TRAITS.get(op_type, NONE)


# Ops that only move elements: the output holds exactly the input's elements, none computed, so
# folding one on a constant costs no more memory than the constant itself.
ELEMENT_MOVES = frozenset({"Transpose", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity"})


def ops_with(**wanted) -> frozenset[str]:
    """The op types whose traits have the given values (`ops_with(layout=Layout.ROW)`)."""
    return frozenset(
        op
        for op, t in TRAITS.items()
        if all(getattr(t, key) == value for key, value in wanted.items())
    )
