"""Generic lowering of comparisons, boolean logic, Where and the NaN/inf tests, on VectorE.

All of them are elementwise with numpy broadcasting (`emit_elementwise`). A comparison is one
TensorTensor whose 1/0 result lands in a bool tile; int32 operands compare exactly (on
GpSimd's integer lanes, docs/neuroncore.md#integers). Boolean tensors are 0/1 bytes, so Not
is `x == 0` and Xor is `(a == b) == 0`. IsNaN uses x ≠ x: `is_equal(x, x)` is 0 exactly for NaN.

Where is a TensorCopy of y and a CopyPredicated of x where the condition holds: bits are
copied, never combined arithmetically, so ±inf and NaN in either branch come out exactly as
ONNX says (masked_fill with -inf, and the NaN guard `Where(IsNaN(P), 0, P)`).
"""

from __future__ import annotations

import math

from onnx2bir.bir.enums import ActFunc, AluOp, Engine
from onnx2bir.bir.ir import AccessPattern, MemoryLocation
from onnx2bir.bir.opcodes import NUM_PARTITIONS
from onnx2bir.codegen.driver import BirCodeGen
from onnx2bir.codegen.lower.elementwise import (
    emit_elementwise,
    fill_exact,
    like,
    scratch_tile,
    tile_width,
)
from onnx2bir.graph import Node

INF = float("inf")


def select_bounds(
    cg: BirCodeGen, high: AccessPattern, low: AccessPattern, cond: AccessPattern
) -> None:
    """high = +inf where cond is 1, -inf where 0; low = -high (for `select`)."""
    cg.tensor_scalar(high, cond, AluOp.SUBTRACT, 0.5, AluOp.MULTIPLY, INF)
    cg.tensor_scalar(low, cond, AluOp.SUBTRACT, 0.5, AluOp.MULTIPLY, -INF)


def select(
    cg: BirCodeGen,
    dst: AccessPattern,
    a: AccessPattern,
    b: AccessPattern,
    high: AccessPattern,
    low: AccessPattern,
    tmp: AccessPattern,
) -> None:
    """dst = a where the condition behind (high, low) holds, else b; inf-safe."""
    cg.tensor_tensor(tmp, a, high, AluOp.MIN)
    cg.tensor_tensor(dst, b, low, AluOp.MIN)
    cg.tensor_tensor(dst, dst, tmp, AluOp.MAX)


_COMPARISONS = {
    "Equal": AluOp.IS_EQUAL,
    "Less": AluOp.IS_LT,
    "LessOrEqual": AluOp.IS_LE,
    "Greater": AluOp.IS_GT,
    "GreaterOrEqual": AluOp.IS_GE,
    "And": AluOp.LOGICAL_AND,
    "Or": AluOp.LOGICAL_OR,
}


def lower_comparison(cg: BirCodeGen, node: Node) -> None:
    """One TensorTensor per tile, the 1/0 result stored as bool."""
    op = _COMPARISONS[node.op_type]
    emit_elementwise(cg, node, lambda cg, dst, srcs: cg.tensor_tensor(dst, *srcs, op), direct=True)


def lower_xor(cg: BirCodeGen, node: Node) -> None:
    def compute(cg: BirCodeGen, dst: AccessPattern, srcs: list[AccessPattern]) -> None:
        cg.tensor_tensor(dst, srcs[0], srcs[1], AluOp.IS_EQUAL)
        cg.tensor_scalar(dst, dst, AluOp.IS_EQUAL, 0.0)

    emit_elementwise(cg, node, compute, direct=True)


def lower_not(cg: BirCodeGen, node: Node) -> None:
    emit_elementwise(
        cg,
        node,
        lambda cg, dst, srcs: cg.tensor_scalar(dst, srcs[0], AluOp.IS_EQUAL, 0.0),
        direct=True,
    )


def lower_isnan(cg: BirCodeGen, node: Node) -> None:
    def compute(cg: BirCodeGen, dst: AccessPattern, srcs: list[AccessPattern]) -> None:
        cg.tensor_tensor(dst, srcs[0], srcs[0], AluOp.IS_EQUAL)
        cg.tensor_scalar(dst, dst, AluOp.IS_EQUAL, 0.0)

    emit_elementwise(cg, node, compute, direct=True)


def lower_isinf(cg: BirCodeGen, node: Node) -> None:
    positive = node.attr("detect_positive", 1)
    negative = node.attr("detect_negative", 1)
    magnitude = scratch_tile(cg, "abs")

    def compute(cg: BirCodeGen, dst: AccessPattern, srcs: list[AccessPattern]) -> None:
        if positive and negative:
            cg.activation(like(dst, magnitude), srcs[0], ActFunc.ABS)
            cg.tensor_scalar(dst, like(dst, magnitude), AluOp.IS_EQUAL, INF)
        elif positive or negative:
            cg.tensor_scalar(dst, srcs[0], AluOp.IS_EQUAL, INF if positive else -INF)
        else:
            cg.memset(dst, 0.0, engine=Engine.DVE)

    emit_elementwise(cg, node, compute, direct=True)


def lower_where(cg: BirCodeGen, node: Node) -> None:
    """out = y, then x copied over it where cond holds (CopyPredicated): exact for every
    dtype, and a NaN or inf in the branch not taken cannot leak. Scalar constant branches (the
    usual 0 / -inf of a mask) are filled once into a tile as wide as the walk's tiles
    (`tile_width`), which every tile reads from its start, instead of being read per tile;
    the condition and the result are read and written straight in their SBUF homes."""
    dtype = cg.graph.tensors[node.outputs[0]].dtype
    integer = not dtype.is_float
    loaded = [
        name
        for index, name in enumerate(node.inputs)
        if index == 0 or not _scalar_constant(cg, name)
    ]
    width = tile_width(cg, {**node, "inputs": loaded})
    filled: dict[int, MemoryLocation] = {}
    for index in (1, 2):
        info = cg.graph.tensors[node.inputs[index]]
        if _scalar_constant(cg, node.inputs[index]):
            filled[index] = cg.sb_tile(f"branch{index}", NUM_PARTITIONS, width, dtype)
            fill_exact(cg, cg.ap(filled[index]), info.const.reshape(-1)[0].item(), integer)

    def operands(dst: AccessPattern, srcs: list[AccessPattern]) -> list[AccessPattern]:
        loaded_tiles = iter(srcs)
        return [
            _constant_operand(dst, filled[index]) if index in filled else next(loaded_tiles)
            for index in range(3)
        ]

    def compute(cg: BirCodeGen, dst: AccessPattern, srcs: list[AccessPattern]) -> None:
        cond, x, y = operands(dst, srcs)
        cg.tensor_copy(dst, y)
        cg.copy_predicated(dst, cond, x)

    emit_elementwise(cg, {**node, "inputs": loaded}, compute, direct=True)


def _scalar_constant(cg: BirCodeGen, name: str) -> bool:
    info = cg.graph.tensors[name]
    return info.is_const and info.const.size == 1


def _constant_operand(dst: AccessPattern, tile: MemoryLocation) -> AccessPattern:
    """A tile filled with one value, read as an operand beside `dst`: the same partitions and
    element count, from the tile's start (every element is the same)."""
    count = math.prod(n for _, n in dst.pattern)
    return AccessPattern(tile.name, ((1, count),), 0, (), dst.partition_start, dst.num_partitions)
