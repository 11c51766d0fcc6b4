"""Bitwise ops: BitShift, BitwiseAnd, BitwiseOr, BitwiseXor, BitwiseNot.

Registered through `LOWERINGS`, which `onnx2bir.codegen.lower.GENERIC_LOWERINGS` merges.

Each is one instruction per tile (a signed right shift four) of an `emit_elementwise` walk
(numpy broadcasting, direct operands in SBUF homes), with a bitvec ALU operator
(docs/neuroncore.md#bitvec, rule ALU-BITVEC): the operands' bit patterns are combined in 32-bit
lanes, never through fp32, so every value of every integer dtype is exact. A narrower integer
enters its lane sign- or zero-extended and the result is stored back wrapping, which is what
each op wants: and, or, xor and invert of extended values are the extended results; a left
shift keeps the low bits (uint8 200 << 1 = 144, int8 64 << 1 = -128); a uint32 above 2^31 sits
in an int32 lane as its bit pattern, and the right shift is logical, so it shifts in zeros.
BitShift-28 also takes signed types, whose right shift is arithmetic: NKI has no such operator,
so it is built from xor and the logical shift (`_arithmetic_right_shift`). A shift by the lane
width or more (or by a negative amount, read unsigned) gives 0, or the sign alone for a signed
right shift, as ONNX wants for any amount outside [0, bits of T); a lane value of a narrower T
shifted past its bits is that already. An int64 or uint64 tensor is 32 bits on the device
(docs/neuroncore.md#integers): its results are the low 32 bits, exact while they fit, as
everywhere else.

The instructions are emitted for VectorE; the code generator moves integer work to GpSimd's
integer lanes (`_integer_lanes`, docs/neuroncore.md#integers), and both engines run bitvec
operators. A one-element constant operand beside an input of the output's shape rides as an
immediate (no tile of it is loaded); a constant shift amount outside [0, 32) is given as 32.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from onnx2bir.bir.enums import AluOp
from onnx2bir.bir.ir import AccessPattern
from onnx2bir.codegen.driver import BirCodeGen
from onnx2bir.codegen.lower.elementwise import emit_elementwise, like, scratch_tile
from onnx2bir.graph import Node

LANE_BITS = 32
_BINARY = {
    "BitwiseAnd": AluOp.BITWISE_AND,
    "BitwiseOr": AluOp.BITWISE_OR,
    "BitwiseXor": AluOp.BITWISE_XOR,
}
_DIRECTIONS = {"LEFT": AluOp.LEFT_SHIFT, "RIGHT": AluOp.RIGHT_SHIFT}


def _integer_operands(cg: BirCodeGen, node: Node) -> None:
    """Refuse a float operand: bitvec operators combine integer bit patterns (ALU-BITVEC)."""
    for name in [*node.inputs, *node.outputs]:
        dtype = cg.graph.tensors[name].dtype
        if dtype.is_float:
            raise cg.fail(
                f"{node.op_type} of {name!r}, {dtype}: bitvec operators take integers only "
                "(rule ALU-BITVEC)"
            )


def _lane_value(value: int) -> int:
    """An integer as the two's-complement bit pattern of a 32-bit lane (a uint32 above 2^31
    becomes the negative int32 with its bits)."""
    return (int(value) + 2**31) % 2**32 - 2**31


def _constant_operand(cg: BirCodeGen, node: Node, positions: tuple[int, ...]):
    """(position, value, other input) when the input at one of `positions` is a one-element
    constant and the other input has the output's shape; else None."""
    out_shape = tuple(cg.graph.tensors[node.outputs[0]].shape)
    for position in positions:
        info = cg.graph.tensors[node.inputs[position]]
        other = node.inputs[1 - position]
        if (
            info.is_const
            and math.prod(info.shape) == 1
            and tuple(cg.graph.tensors[other].shape) == out_shape
        ):
            return position, int(info.const.reshape(-1)[0]), other
    return None


def _emit_binary(
    cg: BirCodeGen,
    node: Node,
    op: AluOp,
    positions: tuple[int, ...],
    immediate: Callable[[int, int], int],
) -> None:
    """One TensorTensor per tile, or one TensorScalar with the constant operand as an
    immediate (`immediate(position, value)` gives its lane value)."""
    constant = _constant_operand(cg, node, positions)
    if constant is not None:
        position, value, other = constant
        imm = immediate(position, value)
        emit_elementwise(
            cg,
            {**node, "inputs": [other]},
            lambda cg, dst, srcs: cg.tensor_scalar(dst, srcs[0], op, imm, reverse0=position == 0),
            direct=True,
        )
        return

    def compute(cg: BirCodeGen, dst: AccessPattern, srcs: list[AccessPattern]) -> None:
        cg.tensor_tensor(dst, srcs[0], srcs[1], op)

    emit_elementwise(cg, node, compute, direct=True)


def lower_bitwise_binary(cg: BirCodeGen, node: Node) -> None:
    """BitwiseAnd, BitwiseOr, BitwiseXor. In: A, B (one integer dtype, broadcasting). Out: C.

    One TensorTensor of bitwise_and / bitwise_or / bitwise_xor per tile; a one-element
    constant operand (a mask) as the immediate of one TensorScalar instead."""
    _integer_operands(cg, node)
    _emit_binary(cg, node, _BINARY[node.op_type], (1, 0), lambda _, value: _lane_value(value))


def lower_bitwise_not(cg: BirCodeGen, node: Node) -> None:
    """BitwiseNot. In: X (an integer dtype). Out: Y = ~X.

    One TensorScalar of invert per tile (its immediate is ignored). An unsigned result wraps
    on the store: ~200 in a lane is -201, which uint8 stores as 55 = 255 - 200."""
    _integer_operands(cg, node)
    emit_elementwise(
        cg,
        node,
        lambda cg, dst, srcs: cg.tensor_scalar(dst, srcs[0], AluOp.INVERT, 0),
        direct=True,
    )


def _shift_amount(value: int) -> int:
    """A constant shift amount as an immediate: a negative amount, or one of 32 or more,
    shifts every bit out (BitShift-28: only the sign extension is left), as a shift of 32
    does."""
    return value if 0 <= value < LANE_BITS else LANE_BITS


def _arithmetic_right_shift(cg: BirCodeGen, node: Node, constant) -> None:
    """A signed right shift from logical ones (NKI has no arithmetic shift right): with m the
    sign mask (-1 where x < 0, else 0), x >> y = ((x ^ m) >>> y) ^ m. x ^ m is never
    negative, so the logical shift fills zeros where the sign bits belong, and the last xor
    turns them into copies of the sign. A shift past the lane gives m: -1 for a negative x, 0
    otherwise, as BitShift-28 wants for an amount negative or at least the bits of T (a
    narrower lane value past its bits is that already)."""
    dtype = cg.graph.tensors[node.outputs[0]].dtype
    if constant is not None and constant[0] == 0:
        # x a constant: m is known. ~x is not negative where x is, so one TensorScalar.
        _, value, other = constant
        value = _lane_value(value)
        emit_elementwise(
            cg,
            {**node, "inputs": [other]},
            lambda cg, dst, srcs: (
                cg.tensor_scalar(
                    dst, srcs[0], AluOp.RIGHT_SHIFT, ~value, AluOp.INVERT, 0, reverse0=True
                )
                if value < 0
                else cg.tensor_scalar(dst, srcs[0], AluOp.RIGHT_SHIFT, value, reverse0=True)
            ),
            direct=True,
        )
        return
    sign_tile = scratch_tile(cg, "sign", dtype)
    inputs = node.inputs if constant is None else [node.inputs[0]]

    def compute(cg: BirCodeGen, dst: AccessPattern, srcs: list[AccessPattern]) -> None:
        x, sign = srcs[0], like(dst, sign_tile)
        cg.tensor_scalar(sign, x, AluOp.IS_LT, 0, AluOp.MULTIPLY, -1)  # m: -1 or 0
        cg.tensor_tensor(dst, x, sign, AluOp.BITWISE_XOR)
        if constant is None:
            cg.tensor_tensor(dst, dst, srcs[1], AluOp.RIGHT_SHIFT)
        else:
            cg.tensor_scalar(dst, dst, AluOp.RIGHT_SHIFT, _shift_amount(constant[1]))
        cg.tensor_tensor(dst, dst, sign, AluOp.BITWISE_XOR)

    emit_elementwise(cg, {**node, "inputs": inputs}, compute, direct=True)


def lower_bit_shift(cg: BirCodeGen, node: Node) -> None:
    """BitShift. In: X, Y (one integer dtype, broadcasting), `direction` LEFT or RIGHT.
    Out: Z = X << Y, or X >> Y: logical for an unsigned T, arithmetic (sign-extending) for a
    signed one (BitShift-28).

    One TensorTensor of left_shift / right_shift per tile; a one-element constant amount Y
    (or value X) as the immediate of one TensorScalar, an amount outside [0, 32) given as
    32. A left shift drops the bits past T's on the store, whatever the sign; a signed right
    shift takes four instructions (`_arithmetic_right_shift`)."""
    direction = node.attr("direction", "")
    if isinstance(direction, bytes):
        direction = direction.decode()
    op = _DIRECTIONS.get(direction)
    if op is None:
        raise cg.fail(f"BitShift direction {direction!r}: ONNX defines LEFT and RIGHT")
    _integer_operands(cg, node)
    dtype = cg.graph.tensors[node.outputs[0]].dtype
    if op is AluOp.RIGHT_SHIFT and dtype.numpy.kind == "i":  # a signed T
        _arithmetic_right_shift(cg, node, _constant_operand(cg, node, (1, 0)))
        return

    def immediate(position: int, value: int) -> int:
        return _shift_amount(value) if position == 1 else _lane_value(value)

    _emit_binary(cg, node, op, (1, 0), immediate)


LOWERINGS: dict[str, Callable] = {
    "BitShift": lower_bit_shift,
    "BitwiseAnd": lower_bitwise_binary,
    "BitwiseNot": lower_bitwise_not,
    "BitwiseOr": lower_bitwise_binary,
    "BitwiseXor": lower_bitwise_binary,
}
