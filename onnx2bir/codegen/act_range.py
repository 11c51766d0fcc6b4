"""ScalarE's ranged functions kept inside their valid input ranges (docs/neuroncore.md#rules,
rule ACT-RANGE), for every fp32 input.

In: the code generator, the dst and src access patterns of one tile and fp32 scratch access
patterns of dst's shape (`like(dst, scratch_tile(...))` in an elementwise compute). Out: the
instructions that compute the function of src into dst, src left unchanged (dst may be src):

- `sine`: sin(x), or cos(x) = sin(x + π/2). ScalarE's sin takes [-π, π] and reduces nothing, so
  VectorE first computes r = x − 2π·m with a Cody–Waite split of 2π = C − δ (C = 2π rounded to
  fp32, δ ≈ 1.7e-7): fmod(x, C) = x − n·C is exact; adding (x − fmod(x, C))·δ/C = n·δ makes it
  x − n·2π; m = n + s, with s = round(t / C) (cos: round(t / C + ¼)) ∈ {-1, 0, 1} taken by the
  fp32 magic-number rounding (t + 1.5·2²³ − 1.5·2²³), moves the result into [-π, π] (cos:
  [-3π/2, π/2], then sin with bias π/2): r − s·C is exact, and n·δ is added again for the new
  multiple. The argument's error is about one fp32 ulp of π up to |x| ≈ 1e8; a final clamp to
  the range keeps the rule for any x (NaN and ±inf come out NaN, as sin does).
- `natural_log`: log takes [2^-64, 2^64]. x is scaled into it by an exact power of two,
  x · (2^-32)^(2e) with e = [x > 2^64] − [x < 2^-64] − [x < 2^-128] (every positive fp32, the
  subnormals too, lands inside), clamped, its log taken and e·64·ln 2 added back. Where the
  scaled x was outside the range (x ≤ 0, +inf, NaN) the result is h − 1/h, h = √max(x, −1):
  −inf at ±0, NaN below 0, +inf at +inf, NaN at NaN, as log has.
- `square_root`: x ^ 0.5 on VectorE (sqrt takes only [2^-116, 2^118]; 0 is outside).
- `reciprocal`: 1 / x on VectorE (reciprocal takes only ±[2^-42, 2^42]).
- `reciprocal_sqrt`: 1/√(x·scale + eps) for a sum of squares x ≥ 0: ScalarE's rsqrt when eps
  keeps the argument at or above its 2^-87, else VectorE's pow.
"""

from __future__ import annotations

import math

from onnx2bir.bir.enums import ActFunc, AluOp, Engine
from onnx2bir.bir.ir import AccessPattern
from onnx2bir.bir.opcodes import ACT_INPUT_RANGES, PI_FP32
from onnx2bir.codegen.driver import BirCodeGen

TWO_PI_FP32 = 6.2831854820251465  # 2π rounded to fp32, the C of the split
_DELTA_OVER_C = (TWO_PI_FP32 - 2 * math.pi) / TWO_PI_FP32  # δ / C
_ROUNDING = 1.5 * 2.0**23  # x + this − this rounds |x| < 2^22 to an integer in fp32
HALF_PI_FP32 = 1.5707963705062866  # π/2 rounded to fp32: exactly half of PI_FP32
THREE_HALVES_PI_FP32 = 4.71238899230957  # 3π/2 rounded to fp32

_LOG_LOW, _LOG_HIGH = ACT_INPUT_RANGES[ActFunc.LOG]
_RSQRT_LOW = ACT_INPUT_RANGES[ActFunc.RSQRT][0]


def sine(
    cg: BirCodeGen,
    dst: AccessPattern,
    x: AccessPattern,
    scratch: tuple[AccessPattern, AccessPattern, AccessPattern],
    cosine: bool = False,
) -> None:
    """dst = sin(x), or cos(x) with `cosine`; three fp32 scratch operands."""
    a, b, c = scratch
    phase, low, high, bias = (
        (0.25, -THREE_HALVES_PI_FP32, HALF_PI_FP32, HALF_PI_FP32)
        if cosine
        else (0.0, -PI_FP32, PI_FP32, 0.0)
    )
    cg.tensor_scalar(a, x, AluOp.MOD, TWO_PI_FP32)  # x − n·C, exact
    _plus_delta_multiples(cg, c, a, x, b)  # t = x − n·2π, only to choose s
    cg.tensor_scalar(c, c, AluOp.MULTIPLY, 1.0 / TWO_PI_FP32, AluOp.ADD, phase)
    # Each ALU step rounds to fp32 (docs/neuroncore.md#engines): s = round(t / C + phase).
    cg.tensor_scalar(c, c, AluOp.ADD, _ROUNDING, AluOp.SUBTRACT, _ROUNDING)
    cg.tensor_scalar(c, c, AluOp.MULTIPLY, TWO_PI_FP32)  # s·C, exact
    cg.tensor_tensor(a, a, c, AluOp.SUBTRACT)  # x − m·C, exact
    _plus_delta_multiples(cg, a, a, x, b)  # x − m·2π
    cg.tensor_scalar(a, a, AluOp.MAX, low, AluOp.MIN, high)
    cg.activation(dst, a, ActFunc.SIN, bias_value=bias)


def _plus_delta_multiples(
    cg: BirCodeGen, out: AccessPattern, r: AccessPattern, x: AccessPattern, scratch: AccessPattern
) -> None:
    """out = r + m·δ, where r = x − m·C: x − m·2π."""
    cg.tensor_tensor(scratch, x, r, AluOp.SUBTRACT)  # m·C, to fp32 precision
    cg.tensor_scalar(scratch, scratch, AluOp.MULTIPLY, _DELTA_OVER_C)
    cg.tensor_tensor(out, r, scratch, AluOp.ADD)


def natural_log(
    cg: BirCodeGen,
    dst: AccessPattern,
    x: AccessPattern,
    scratch: tuple[AccessPattern, AccessPattern, AccessPattern],
    valid: AccessPattern,
) -> None:
    """dst = log(x); three fp32 scratch operands and `valid`, an integer one."""
    e, y, v = scratch
    cg.tensor_scalar(e, x, AluOp.IS_GT, _LOG_HIGH)
    for below in (_LOG_LOW, _LOG_LOW * _LOG_LOW):
        cg.tensor_scalar(y, x, AluOp.IS_LT, below)
        cg.tensor_tensor(e, e, y, AluOp.SUBTRACT)
    # v = x · f · f, f = (2^-32)^e: two exact steps, as 2^128 is no fp32.
    cg.tensor_scalar(y, e, AluOp.POW, 2.0**-32, reverse0=True)
    cg.tensor_tensor(v, x, y, AluOp.MULTIPLY)
    cg.tensor_tensor(v, v, y, AluOp.MULTIPLY)
    cg.tensor_scalar(y, v, AluOp.MAX, _LOG_LOW, AluOp.MIN, _LOG_HIGH)
    cg.tensor_tensor(valid, v, y, AluOp.IS_EQUAL)  # 0 for x ≤ 0, +inf, NaN
    cg.activation(y, y, ActFunc.LOG)
    cg.tensor_scalar(e, e, AluOp.MULTIPLY, 64 * math.log(2.0))
    cg.tensor_tensor(y, y, e, AluOp.ADD)
    # The special values: h − 1/h, h = √max(x, −1).
    cg.tensor_scalar(v, x, AluOp.MAX, -1.0, AluOp.POW, 0.5)
    # 1 / (h + 0): h + 0 is +0 where h is ±0, so log(±0) is −inf whatever pow gives −0.
    cg.tensor_scalar(e, v, AluOp.ADD, 0.0, AluOp.DIVIDE, 1.0, reverse1=True)
    cg.tensor_tensor(v, v, e, AluOp.SUBTRACT)
    cg.copy_predicated(y, valid, v, reverse=True)
    cg.tensor_copy(dst, y)


def square_root(cg: BirCodeGen, dst: AccessPattern, x: AccessPattern) -> None:
    """dst = √x (x ^ 0.5 on VectorE: NaN below 0, as sqrt)."""
    cg.tensor_scalar(dst, x, AluOp.POW, 0.5)


def reciprocal(cg: BirCodeGen, dst: AccessPattern, x: AccessPattern) -> None:
    """dst = 1 / x on VectorE (±inf at ±0)."""
    cg.tensor_scalar(dst, x, AluOp.DIVIDE, 1.0, reverse0=True)


def reciprocal_sqrt(
    cg: BirCodeGen,
    dst: AccessPattern,
    x: AccessPattern,
    scale: float,
    eps: float,
    engine: Engine = Engine.DVE,
) -> None:
    """dst = 1/√(x·scale + eps) for x ≥ 0 (a sum of squares, a variance). With eps ≥ 2^-87
    ScalarE's rsqrt takes the argument; else `engine` raises it to the power −½."""
    if eps >= _RSQRT_LOW:
        cg.activation(dst, x, ActFunc.RSQRT, scale=scale, bias_value=eps)
        return
    cg.tensor_scalar(dst, x, AluOp.MULTIPLY, scale, AluOp.ADD, eps, engine=engine)
    cg.tensor_scalar(dst, dst, AluOp.POW, -0.5, engine=engine)
