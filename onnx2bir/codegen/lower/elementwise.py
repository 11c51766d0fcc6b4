"""Generic lowering of elementwise ops with numpy broadcasting: unary math on ScalarE (ACT),
two-input arithmetic on VectorE (DVE), each an `emit_elementwise` walk
(codegen/elementwise_walk.py: tiling, broadcast operands, direct operands in SBUF homes).

Also the emission helpers other lowerings share: TensorScalar with exact integer immediates
(`scalar_op`), an exact integer Memset (`fill_exact`) and Iota (`iota`).
"""

from __future__ import annotations

import math

from onnx2bir.bir.enums import ActFunc, AluOp, Dtype, Engine, Opcode
from onnx2bir.bir.ir import AccessPattern, Instruction
from onnx2bir.codegen import act_range
from onnx2bir.codegen.driver import BirCodeGen
from onnx2bir.codegen.elementwise_walk import (  # noqa: F401 (the walk's API, imported from here)
    COPIES,
    FREE_TILE,
    Compute,
    emit_elementwise,
    like,
    scratch_tile,
    tile_width,
)
from onnx2bir.graph import Node

# --- emission helpers: exact integer immediates and Iota, which the driver has no call for ---


def scalar_op(
    cg: BirCodeGen,
    dst: AccessPattern,
    src: AccessPattern,
    integer: bool,
    op0: str,
    operand0: AccessPattern | float,
    op1: str | None = None,
    operand1: AccessPattern | float | None = None,
    engine: Engine = Engine.DVE,
) -> Instruction:
    """TensorScalar whose immediates stay integers when `integer`.

    Integer immediates fp32 cannot hold become exact steps in the driver (`emit`), and the
    arithmetic of int32 tiles runs on GpSimd (docs/neuroncore.md#integers).
    Operands are immediates or [P, 1] access patterns.
    """
    srcs = {"in": src}
    attrs: dict[str, object] = {"op0": str(op0), "reverse0": False}
    for index, operand in ((0, operand0), (1, operand1)):
        if isinstance(operand, AccessPattern):
            srcs[f"scalar{index}"] = operand
        elif operand is not None:
            attrs[f"imm{index}"] = int(operand) if integer else float(operand)
    if op1 is not None:
        attrs.update(op1=str(op1), reverse1=False)
    return cg.emit(Opcode.TENSOR_SCALAR, engine, dst, srcs, **attrs)


def fill_exact(cg: BirCodeGen, dst: AccessPattern, value: float | int, integer: bool) -> None:
    """Memset that keeps an integer fill exact (the driver's `memset` stores a float)."""
    if integer:
        cg.emit(Opcode.MEMSET, Engine.POOL, dst, {}, value=int(value))
    else:
        cg.memset(dst, float(value))


def iota(
    cg: BirCodeGen, dst: AccessPattern, base: int, channel_multiplier: int, steps: list[int]
) -> None:
    """dst[p, i…] = base + p · channel_multiplier + Σ i_k · steps[k] (GpSimd)."""
    cg.emit(
        Opcode.IOTA,
        Engine.POOL,
        dst,
        {},
        base=int(base),
        channel_multiplier=int(channel_multiplier),
        steps=[int(s) for s in steps],
    )


_ACTIVATIONS = {
    "Relu": ActFunc.RELU,
    "Sigmoid": ActFunc.SIGMOID,
    "Tanh": ActFunc.TANH,
    "Exp": ActFunc.EXP,
    "Abs": ActFunc.ABS,
    "Erf": ActFunc.ERF,
    "Softplus": ActFunc.SOFTPLUS,
    "Sign": ActFunc.SIGN,
}
# The functions ScalarE takes only on part of the line (rule ACT-RANGE), lowered to keep it.
_RANGED = {"Sqrt": act_range.square_root, "Reciprocal": act_range.reciprocal}


def lower_activation(cg: BirCodeGen, node: Node) -> None:
    """Unary math on ScalarE's lookup table; Sqrt and Reciprocal on VectorE, Log scaled into
    the table's range (`act_range`)."""
    if node.op_type == "Log":
        tiles = [scratch_tile(cg, tag) for tag in ("exponent", "scaled", "special")]
        valid_tile = scratch_tile(cg, "in_range", Dtype.UINT8)

        def log(cg: BirCodeGen, dst: AccessPattern, srcs: list[AccessPattern]) -> None:
            scratch = tuple(like(dst, tile) for tile in tiles)
            act_range.natural_log(cg, dst, srcs[0], scratch, like(dst, valid_tile))

        emit_elementwise(cg, node, log, direct=True)
        return
    ranged = _RANGED.get(node.op_type)
    if ranged is not None:
        emit_elementwise(cg, node, lambda cg, dst, srcs: ranged(cg, dst, srcs[0]), direct=True)
        return
    func = _ACTIVATIONS[node.op_type]
    emit_elementwise(cg, node, lambda cg, dst, srcs: cg.activation(dst, srcs[0], func), direct=True)


def lower_neg(cg: BirCodeGen, node: Node) -> None:
    emit_elementwise(
        cg,
        node,
        lambda cg, dst, srcs: cg.activation(dst, srcs[0], ActFunc.COPY, scale=-1.0),
        direct=True,
    )


_BINARY = {
    "Add": AluOp.ADD,
    "Sub": AluOp.SUBTRACT,
    "Mul": AluOp.MULTIPLY,
    "Div": AluOp.DIVIDE,
    "Pow": AluOp.POW,
    "Max": AluOp.MAX,
    "Min": AluOp.MIN,
    "Sum": AluOp.ADD,
}


def _constant_scalar_operand(cg: BirCodeGen, node: Node) -> tuple[int, float, str] | None:
    """(position, value, other input) when a two-input fp32 op has a one-element constant
    operand and the other input already has the output's shape."""
    inputs = [t for t in node.inputs if t]
    out = cg.graph.tensors[node.outputs[0]]
    if len(inputs) != 2 or out.dtype is not Dtype.FP32:
        return None
    for position, name in enumerate(inputs):
        info, other = cg.graph.tensors[name], inputs[1 - position]
        if (
            info.is_const
            and math.prod(info.shape) == 1
            and info.dtype is Dtype.FP32
            and tuple(cg.graph.tensors[other].shape) == tuple(out.shape)
            and cg.graph.tensors[other].dtype is Dtype.FP32
        ):
            return position, float(info.const.reshape(-1)[0]), other
    return None


def lower_binary(cg: BirCodeGen, node: Node) -> None:
    """Two-input arithmetic on VectorE; Sum/Max/Min with more inputs fold left."""
    op = _BINARY[node.op_type]
    scalar = _constant_scalar_operand(cg, node)
    if scalar is not None:
        position, value, other = scalar
        # x op c (or c op x): the constant rides as an immediate, no tile of it is loaded.
        emit_elementwise(
            cg,
            {**node, "inputs": [other]},
            lambda cg, dst, srcs: cg.tensor_scalar(dst, srcs[0], op, value, reverse0=position == 0),
            direct=True,
        )
        return

    def compute(cg: BirCodeGen, dst: AccessPattern, srcs: list[AccessPattern]) -> None:
        if len(srcs) == 1:
            cg.tensor_copy(dst, srcs[0])
            return
        cg.tensor_tensor(dst, srcs[0], srcs[1], op)
        for src in srcs[2:]:
            cg.tensor_tensor(dst, dst, src, op)

    emit_elementwise(cg, node, compute, direct=True, psum_rows=True)
