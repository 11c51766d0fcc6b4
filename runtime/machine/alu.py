"""ALU and activation math of the compute engines: the numpy functions behind the opcodes.

In: numpy arrays, and the AluOp or ActFunc of an instruction. Out: arrays in the math dtype
`math_dtype` picks for the engine (docs/neuroncore.md#integers): fp32 on ScalarE and VectorE,
whatever the operands (an int32 beyond 2^24 rounds on the way in, as on the device); exact
int32 on GpSimd when every operand is an integer (wrapping past 2^31 like the hardware's
lanes); a bitvec operator (bitwise, shifts) computes on int32 bit patterns on VectorE and
GpSimd alike (`op_math_dtype`). No engine computes in int64. Integer divide truncates toward
zero; fp32 to integer truncates (`cast`, docs/neuroncore.md#dma). `alu` applies an AluOp
(comparisons give 1 or 0), `ACTIVATIONS` maps each ActFunc to its function, `REDUCTIONS` each
AluOp TensorReduce accepts to its ufunc; `erf` is a Maclaurin series accurate to fp32
resolution. The instruction semantics (`runtime/machine/semantics.py`) bind operands and call
these.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from onnx2bir.bir.dtypes import F32, int_like
from onnx2bir.bir.enums import ActFunc, AluOp, Engine
from onnx2bir.bir.opcodes import BITVEC_OPS

I32 = np.dtype(np.int32)


def math_dtype(engine: Engine, *operand_dtypes: np.dtype) -> np.dtype:
    """The dtype an engine computes in: int32 on GpSimd when every operand is an integer (its
    native integer lanes), fp32 everywhere else (docs/neuroncore.md#integers)."""
    if engine is Engine.POOL and all(int_like(dtype) for dtype in operand_dtypes):
        return I32
    return F32


def _int_divide(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    quotient = np.abs(a) // np.abs(b)  # a zero divisor gives 0, as numpy's integer division does
    return np.where((a < 0) != (b < 0), -quotient, quotient)


def _int_pow(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    exact = np.power(a, np.maximum(b, 0))
    return np.where(b >= 0, exact, np.trunc(np.power(np.asarray(a, np.float64), b)))


_ALU: dict[AluOp, Callable] = {
    AluOp.ADD: np.add,
    AluOp.SUBTRACT: np.subtract,
    AluOp.MULTIPLY: np.multiply,
    AluOp.DIVIDE: np.divide,
    AluOp.MAX: np.maximum,
    AluOp.MIN: np.minimum,
    AluOp.POW: np.power,
    AluOp.IS_EQUAL: np.equal,
    AluOp.IS_LT: np.less,
    AluOp.IS_LE: np.less_equal,
    AluOp.IS_GT: np.greater,
    AluOp.IS_GE: np.greater_equal,
    AluOp.LOGICAL_AND: np.logical_and,  # nonzero (and NaN) is true
    AluOp.LOGICAL_OR: np.logical_or,
    AluOp.BYPASS: lambda a, b: a,
    AluOp.MOD: np.fmod,  # exact for integers and floats; x mod 0 is NaN (0 for integers)
}
_LANE_MASK = 0xFFFFFFFF  # a 32-bit lane, read unsigned


def _shift_amount(s: np.ndarray) -> np.ndarray:
    """A shift amount as an unsigned 32-bit lane, capped at 32: every larger shift gives 0."""
    return np.minimum(np.asarray(s, np.int64) & _LANE_MASK, 32)


def _left_shift(a: np.ndarray, s: np.ndarray) -> np.ndarray:
    """`a << s` on 32-bit lanes: bits shifted past bit 31 are lost, a shift of 32 or more gives
    0 (ONNX BitShift); `alu` wraps the int64 result back to int32."""
    return np.left_shift(np.asarray(a, np.int64) & _LANE_MASK, _shift_amount(s)) & _LANE_MASK


def _right_shift(a: np.ndarray, s: np.ndarray) -> np.ndarray:
    """Logical `a >> s`: the lane read unsigned (a uint32 above 2^31 sits in an int32 lane as
    its bit pattern), zeros shifted in; a shift of 32 or more gives 0."""
    return np.right_shift(np.asarray(a, np.int64) & _LANE_MASK, _shift_amount(s))


# Bitvec operators (`opcodes.BITVEC_OPS`) exist on integer lanes only: the semantics refuse
# them with a float operand (rule ALU-BITVEC), so the fp32 table has none.
_BITVEC_ALU = {
    AluOp.BITWISE_AND: np.bitwise_and,
    AluOp.BITWISE_OR: np.bitwise_or,
    AluOp.BITWISE_XOR: np.bitwise_xor,
    AluOp.INVERT: lambda a, b: np.invert(a),  # one operand; the second is ignored
    AluOp.LEFT_SHIFT: _left_shift,
    AluOp.RIGHT_SHIFT: _right_shift,
}
_INT_ALU = {**_ALU, AluOp.DIVIDE: _int_divide, AluOp.POW: _int_pow, **_BITVEC_ALU}


def op_math_dtype(engine: Engine, ops, *operand_dtypes: np.dtype) -> np.dtype:
    """The dtype an instruction computes in: int32 lanes for bitvec operators on any engine
    that runs them (bit patterns, never fp32; the operands are integers by rule ALU-BITVEC),
    else `math_dtype`."""
    if any(op in BITVEC_OPS for op in ops):
        return I32
    return math_dtype(engine, *operand_dtypes)


def alu(op: AluOp, a, b, math_dtype: np.dtype) -> np.ndarray:
    """`a op b` in math_dtype (fp32, or int32 on GpSimd's integer lanes); comparisons give 1
    or 0. int32 arithmetic wraps past 2^31, as the hardware's does."""
    with np.errstate(over="ignore"):
        result = np.asarray((_INT_ALU if math_dtype == I32 else _ALU)[op](a, b))
    return result if result.dtype == math_dtype else result.astype(math_dtype)


# erf by its Maclaurin series in float64, Horner form in x². Past |x| = 4, 1 - erf(x) < 2e-8 is
# below fp32 resolution, so clipping there costs nothing; inside, 64 terms and the float64
# cancellation (~1e-10) keep the error under 1e-7.
_ERF_COEFS = [(-1) ** k / (math.factorial(k) * (2 * k + 1)) for k in reversed(range(64))]


_ERF_CHUNK = 16384  # elements per pass: the 126 passes of the series stay in the L2 cache


def erf(x: np.ndarray) -> np.ndarray:
    """Error function, fp32 result accurate to about 2e-8."""
    x64 = np.clip(np.asarray(x, np.float64), -4.0, 4.0)
    flat = x64.reshape(-1)
    z = flat * flat
    acc = np.empty_like(z)
    # Element by element the same operations in the same order as one pass over the whole
    # array, so chunking changes no bit; it only keeps each chunk in cache.
    for start in range(0, z.size, _ERF_CHUNK):
        zc, ac = z[start : start + _ERF_CHUNK], acc[start : start + _ERF_CHUNK]
        ac.fill(_ERF_COEFS[0])
        for coef in _ERF_COEFS[1:]:
            ac *= zc
            ac += coef
    return (acc.reshape(x64.shape) * x64 * (2.0 / math.sqrt(math.pi))).astype(F32)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    e = np.exp(-np.abs(x))  # never overflows
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e)).astype(F32)


ACTIVATIONS: dict[ActFunc, Callable[[np.ndarray], np.ndarray]] = {
    ActFunc.COPY: lambda x: x,
    ActFunc.RELU: lambda x: np.maximum(x, np.float32(0.0)),
    ActFunc.SIGMOID: _sigmoid,
    ActFunc.TANH: np.tanh,
    ActFunc.EXP: np.exp,
    ActFunc.LOG: np.log,
    ActFunc.SQRT: np.sqrt,
    ActFunc.RSQRT: lambda x: np.float32(1.0) / np.sqrt(x),
    ActFunc.RECIPROCAL: lambda x: np.float32(1.0) / x,
    ActFunc.SQUARE: np.square,
    ActFunc.ABS: np.abs,
    ActFunc.SIGN: np.sign,
    ActFunc.ERF: erf,
    ActFunc.GELU: lambda x: 0.5 * x * (1.0 + erf(x * np.float32(1.0 / math.sqrt(2.0)))),
    ActFunc.GELU_TANH: lambda x: (
        0.5 * x * (1.0 + np.tanh(np.float32(math.sqrt(2.0 / math.pi)) * (x + 0.044715 * x**3)))
    ),
    ActFunc.SILU: lambda x: x * _sigmoid(x),
    ActFunc.SOFTPLUS: lambda x: np.log1p(np.exp(-np.abs(x))) + np.maximum(x, np.float32(0.0)),
    ActFunc.SIN: np.sin,
    ActFunc.COS: np.cos,
}

REDUCTIONS = {
    AluOp.ADD: np.add,
    AluOp.MAX: np.maximum,
    AluOp.MIN: np.minimum,
    AluOp.MULTIPLY: np.multiply,
}


# Max and min pick one of their inputs, so any order of visiting a window gives the same
# value; only the sign of a zero and the payload of a NaN can depend on the order (numpy's own
# reduction uses SIMD on some layouts). A pooling window (3 x 3 over strided rows) is reduced
# by numpy one tiny inner loop per output element, about 20x slower than one call per window
# position; `fold_window` does that, and keeps its result only where it is provably the
# reduction's: no NaN in the result and no -0 anywhere in the windows.
ORDER_FREE = (np.maximum, np.minimum)
FOLD_MAX_WINDOW = 64  # window positions (one numpy call each); larger windows reduce well


def fold_window(ufunc, values: np.ndarray, first_axis: int) -> np.ndarray | None:
    """`ufunc.reduce` over the trailing axes from `first_axis`, one call per window position;
    None where the result might differ from numpy's reduction in a zero's sign or a NaN."""
    lead = (slice(None),) * first_axis
    positions = np.ndindex(*values.shape[first_axis:])
    out = values[lead + next(positions)].copy()
    floating = values.dtype.kind == "f"
    negative_zero = False
    if floating:
        negative_zero = bool(np.any((out == 0) & np.signbit(out)))
    for position in positions:
        window = values[lead + position]
        ufunc(out, window, out=out)
        if floating and not negative_zero:
            negative_zero = bool(np.any((window == 0) & np.signbit(window)))
    if floating and (negative_zero or np.isnan(out).any()):
        return None
    return out
