"""Generic lowering of the elementwise math beyond one opcode: Sin, Cos, Floor, Ceil, Round,
Mod and Mean, tiled by `emit_elementwise`.

- Sin, Cos: ScalarE's sin of the argument reduced into [-π, π] on VectorE
  (`act_range.sine`: the sin table does no range reduction, rule ACT-RANGE).
- Floor, Ceil: r = fmod(x, 1) (VectorE `mod`, exact), then x − r, minus 1 where r < 0 (Floor) or
  plus 1 where r > 0 (Ceil). |x| ≥ 2²³ is already integral: r = 0.
- Round (halves to even): f = floor(x), d = x − f (exact); f + 1 where d > ½, or where d = ½
  and f is odd (fmod(f, 2) ≠ 0).
- Mod: fmod = 1 is `mod` itself; fmod = 0 (the sign of the divisor) replaces a nonzero
  remainder whose sign differs from the divisor's by remainder + divisor (CopyPredicated).
  Integer tiles stay exact.
- Mean: the sum of the (broadcast) inputs times 1/n.
"""

from __future__ import annotations

from onnx2bir.bir.enums import AluOp, Dtype
from onnx2bir.bir.ir import AccessPattern
from onnx2bir.codegen.act_range import sine
from onnx2bir.codegen.driver import BirCodeGen
from onnx2bir.codegen.lower.elementwise import emit_elementwise, like, scalar_op, scratch_tile
from onnx2bir.graph import Node


def lower_trig(cg: BirCodeGen, node: Node) -> None:
    cosine = node.op_type == "Cos"
    tiles = [scratch_tile(cg, tag) for tag in ("rem", "mult", "turns")]

    def compute(cg: BirCodeGen, dst: AccessPattern, srcs: list[AccessPattern]) -> None:
        a, b, c = (like(dst, tile) for tile in tiles)
        sine(cg, dst, srcs[0], (a, b, c), cosine)

    emit_elementwise(cg, node, compute, direct=True)


def _floor(
    cg: BirCodeGen, dst: AccessPattern, x: AccessPattern, rem: AccessPattern, flag: AccessPattern
) -> None:
    """dst = floor(x); `rem` and `flag` are scratch of the same shape."""
    cg.tensor_scalar(rem, x, AluOp.MOD, 1.0)
    cg.tensor_scalar(flag, rem, AluOp.IS_LT, 0.0)
    cg.tensor_tensor(dst, x, rem, AluOp.SUBTRACT)
    cg.tensor_tensor(dst, dst, flag, AluOp.SUBTRACT)


def lower_rounding(cg: BirCodeGen, node: Node) -> None:
    op_type = node.op_type
    if not cg.graph.tensors[node.inputs[0]].dtype.is_float:
        raise cg.fail(f"{op_type} of an integer tensor")
    rem_tile, flag_tile, more_tile = (scratch_tile(cg, t) for t in ("rem", "flag", "more"))

    def compute(cg: BirCodeGen, dst: AccessPattern, srcs: list[AccessPattern]) -> None:
        x = srcs[0]
        rem, flag, more = like(dst, rem_tile), like(dst, flag_tile), like(dst, more_tile)
        if op_type == "Floor":
            _floor(cg, dst, x, rem, flag)
        elif op_type == "Ceil":
            cg.tensor_scalar(rem, x, AluOp.MOD, 1.0)
            cg.tensor_scalar(flag, rem, AluOp.IS_GT, 0.0)
            cg.tensor_tensor(dst, x, rem, AluOp.SUBTRACT)
            cg.tensor_tensor(dst, dst, flag, AluOp.ADD)
        else:
            _floor(cg, dst, x, rem, flag)
            cg.tensor_tensor(rem, x, dst, AluOp.SUBTRACT)  # d = x − floor(x), in [0, 1)
            cg.tensor_scalar(flag, dst, AluOp.MOD, 2.0, AluOp.IS_EQUAL, 0.0)  # f even
            cg.tensor_scalar(more, rem, AluOp.IS_EQUAL, 0.5)  # a tie
            cg.tensor_tensor(flag, more, flag, AluOp.SUBTRACT)  # tie and odd: 1 (else ≤ 0)
            cg.tensor_scalar(flag, flag, AluOp.MAX, 0.0)
            cg.tensor_scalar(more, rem, AluOp.IS_GT, 0.5)
            cg.tensor_tensor(dst, dst, more, AluOp.ADD)
            cg.tensor_tensor(dst, dst, flag, AluOp.ADD)

    emit_elementwise(cg, node, compute, direct=True)


def lower_mod(cg: BirCodeGen, node: Node) -> None:
    dtype = cg.graph.tensors[node.outputs[0]].dtype
    integer = not dtype.is_float
    if node.attr("fmod", 0):
        emit_elementwise(
            cg,
            node,
            lambda cg, dst, srcs: cg.tensor_tensor(dst, srcs[0], srcs[1], AluOp.MOD),
            direct=True,
        )
        return
    sign_tile, other_tile = scratch_tile(cg, "sign", dtype), scratch_tile(cg, "other", dtype)
    pick_tile = scratch_tile(cg, "pick", Dtype.INT32)  # CopyPredicated wants an integer mask

    def compute(cg: BirCodeGen, dst: AccessPattern, srcs: list[AccessPattern]) -> None:
        a, b = srcs
        sign, other = like(dst, sign_tile), like(dst, other_tile)
        cg.tensor_tensor(dst, a, b, AluOp.MOD)  # r, with the sign of a
        scalar_op(cg, sign, dst, integer, AluOp.IS_LT, 0)
        scalar_op(cg, other, b, integer, AluOp.IS_LT, 0)
        cg.tensor_tensor(sign, sign, other, AluOp.IS_EQUAL)  # signs agree (or r = 0 below)
        scalar_op(cg, other, dst, integer, AluOp.IS_EQUAL, 0)
        cg.tensor_tensor(sign, sign, other, AluOp.ADD)
        scalar_op(cg, sign, sign, integer, AluOp.IS_EQUAL, 0)  # 1: add the divisor
        cg.tensor_tensor(other, dst, b, AluOp.ADD)
        pick = like(dst, pick_tile)
        cg.tensor_copy(pick, sign)
        cg.copy_predicated(dst, pick, other)  # not r + fix·b: 0·inf would be NaN

    emit_elementwise(cg, node, compute, direct=True)


def lower_mean(cg: BirCodeGen, node: Node) -> None:
    count = len([name for name in node.inputs if name])

    def compute(cg: BirCodeGen, dst: AccessPattern, srcs: list[AccessPattern]) -> None:
        if len(srcs) == 1:
            cg.tensor_copy(dst, srcs[0])
            return
        cg.tensor_tensor(dst, srcs[0], srcs[1], AluOp.ADD)
        for src in srcs[2:]:
            cg.tensor_tensor(dst, dst, src, AluOp.ADD)
        cg.tensor_scalar(dst, dst, AluOp.MULTIPLY, 1.0 / count)

    emit_elementwise(cg, node, compute, direct=True)
