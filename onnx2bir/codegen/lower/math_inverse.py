"""Inverse trigonometric and hyperbolic functions, Tan and Swish.

Registered through `LOWERINGS`, which `onnx2bir.codegen.lower.GENERIC_LOWERINGS` merges.
Each op is an `emit_elementwise` walk whose compute runs in fp32 scratch on VectorE (ALU steps,
each rounded to fp32) and ScalarE (exp, sin, sigmoid, sign, log through `act_range`), and writes
the output tile once, at the end (any float dtype: the last step casts). With a = |x|:

- Sinh: for a < 1 the odd Taylor series x + x·z·Q(z), z = x² (to x¹³, below fp32 resolution,
  no cancellation near 0); else sign(x)·(p − q), p = eᵃ/2 (exp(a)·½ below a = 88, past it
  E·(E/2), E = exp(a/2): finite as far as sinh is), q = ¼/p.
- Cosh: p + q.
- Tan: n = round(x·2/π), r = x − n·π/2 with π/2 split into six pieces of 12 bits and a rest
  (Cody–Waite) and n = high + fmod(n, 2¹²), so every product is exact for |n| < 2²⁴; sin r
  on ScalarE, cos r = 1 − 2·sin²(r/2) (no cancellation for |r| ≤ π/4); tan = sin r / cos r
  for even n, −cos r / sin r for odd n. Zeros and poles keep their relative accuracy (a few
  ulps) up to |x| ≈ 1e6; past 2²²·π/2 the rounding of n and the pieces lose it (no
  Payne–Hanek reduction): the result stays finite or NaN, never outside ScalarE's range.
- Atan: atan2 of two non-negative values (`_atan2_positive`): t = min/max ∈ [0, 1]; for
  t > tan(π/8), atan t = π/4 + atan((t − 1)/(t + 1)); atan u = u + u·z·Q(z) on
  |u| ≤ tan(π/8) (a relative minimax fit, 0.02 fp32 ulp); π/2 − θ when the numerator is the
  larger. π/4, π/2 and π are added as a hi + lo pair. Atan(x) = sign(x)·atan2(a, 1).
- Asin: sign(x)·atan2(a, w), Acos: atan2(w, a), or π − that for x < 0, with
  w = √((1 − a)(1 + a)) (1 − a exact near 1): accurate near |x| = 1, NaN outside [−1, 1].
- Atanh: sign(x)·½·log1p(2a/(1 − a)); Asinh: sign(x)·log1p(a + a²/(1 + √(1 + a²))), or
  log a + ln 2 for a > 2¹²; Acosh: log1p(t + √(t(t + 2))), t = x − 1, or log x + ln 2 for
  x > 2¹². log1p(v) is Kahan's log(u)·v/(u − 1), u = 1 + v (v itself where u = 1), with
  `act_range.natural_log` taking every u (±0, negatives, inf, NaN give what log gives).
- Swish: x · sigmoid(αx), ScalarE's sigmoid scaling its input by α.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from onnx2bir.bir.enums import ActFunc, AluOp, Dtype
from onnx2bir.bir.ir import AccessPattern
from onnx2bir.bir.opcodes import PI_FP32
from onnx2bir.codegen import act_range
from onnx2bir.codegen.driver import BirCodeGen
from onnx2bir.codegen.lower.elementwise import emit_elementwise, like, scratch_tile
from onnx2bir.graph import Node

AP = AccessPattern

_ROUNDING = 1.5 * 2.0**23  # t + this − this rounds |t| < 2^22 to an integer in fp32
_TAN_PI8 = 0.41421356237309503  # tan(π/8)
# atan(u) = u + u·z·Q(z), z = u², |u| ≤ tan(π/8): relative error 1.1e-9 (float64).
_ATAN_Q = (
    -0.3333331826034154,
    0.1999865111433364,
    -0.14246828306250203,
    0.10617669830621576,
    -0.06137605612785244,
)
# sinh(x) = x + x·z·Q(z), z = x², the Taylor series to x^13 (|x| < 1).
_SINH_Q = tuple(1.0 / math.factorial(2 * k + 1) for k in range(1, 7))
# π/2 as three pieces of 11 bits and a rest (Cody–Waite): n·piece is exact for |n| < 2^13.
_HALF_PI_PIECES = (
    1.5703125,
    0.0004837512969970703,
    7.549533620476723e-08,
    2.5632829192545614e-12,
    6.123031769111886e-17,
    2.0216294170795996e-21,
    6.36831716351095e-25,
)


def _split(value: float) -> tuple[float, float]:
    """value as fp32 hi + lo."""
    import numpy as np

    hi = float(np.float32(value))
    return hi, float(np.float32(value - hi))


_QUARTER_PI = _split(math.pi / 4)
_HALF_PI = _split(math.pi / 2)
_PI = _split(math.pi)
_LN2 = math.log(2.0)
_N_SPLIT = 2.0**12
_EXP_FINITE = 88.0  # eˣ is finite in fp32 below this
_LOG_BRANCH = 2.0**12  # past this, asinh a = log a + ln 2 (and acosh), to fp32 resolution


class _Scratch:
    """fp32 scratch tiles and uint8 mask tiles, addressed like the output tile."""

    def __init__(self, cg: BirCodeGen, floats: int, masks: int) -> None:
        self.floats = [scratch_tile(cg, f"f{i}") for i in range(floats)]
        self.masks = [scratch_tile(cg, f"m{i}", Dtype.UINT8) for i in range(masks)]

    def at(self, dst: AP) -> tuple[list[AP], list[AP]]:
        return [like(dst, t) for t in self.floats], [like(dst, t) for t in self.masks]


def _float_only(cg: BirCodeGen, node: Node) -> None:
    for name in (node.input(0), node.outputs[0]):
        if not cg.graph.tensors[name].dtype.is_float:
            raise cg.fail(
                f"{node.op_type} of a {cg.graph.tensors[name].dtype} tensor (floats only)"
            )


def _horner(cg: BirCodeGen, p: AP, z: AP, coefs: tuple[float, ...]) -> None:
    """p = Σ coefs[k]·z^k."""
    if len(coefs) == 1:
        cg.tensor_scalar(p, z, AluOp.MULTIPLY, 0.0, AluOp.ADD, coefs[0])
        return
    cg.tensor_scalar(p, z, AluOp.MULTIPLY, coefs[-1], AluOp.ADD, coefs[-2])
    for coef in reversed(coefs[:-2]):
        cg.tensor_tensor(p, p, z, AluOp.MULTIPLY)
        cg.tensor_scalar(p, p, AluOp.ADD, coef)


def _odd_series(cg: BirCodeGen, out: AP, u: AP, coefs, z: AP, p: AP) -> None:
    """out = u + u·z·Q(z), z = u²; `z` and `p` scratch (out may be neither)."""
    cg.tensor_tensor(z, u, u, AluOp.MULTIPLY)
    _horner(cg, p, z, coefs)
    cg.tensor_tensor(p, p, z, AluOp.MULTIPLY)
    cg.tensor_tensor(p, p, u, AluOp.MULTIPLY)
    cg.tensor_tensor(out, u, p, AluOp.ADD)


def _plus_constant(cg: BirCodeGen, out: AP, y: AP, pair: tuple[float, float], minus: bool) -> None:
    """out = constant + y (or constant − y), the constant as hi + lo."""
    hi, lo = pair
    cg.tensor_scalar(
        out, y, AluOp.SUBTRACT if minus else AluOp.ADD, lo, AluOp.ADD, hi, reverse0=minus
    )


def _atan2_positive(cg: BirCodeGen, out: AP, num: AP, den: AP, f: list[AP], m: list[AP]) -> None:
    """out = atan(num / den) ∈ [0, π/2] for num, den ≥ 0 (not both 0); NaN in, NaN out.
    Four fp32 scratch f[0..3], two masks m[0..1]; out may be none of them."""
    t, u, z, p = f[:4]
    inv, mid = m[:2]
    cg.tensor_tensor(t, num, den, AluOp.MIN)
    cg.tensor_tensor(u, num, den, AluOp.MAX)
    cg.tensor_tensor(t, t, u, AluOp.DIVIDE)  # t ∈ [0, 1]
    cg.tensor_tensor(inv, num, den, AluOp.IS_GT)
    cg.tensor_scalar(mid, t, AluOp.IS_GT, _TAN_PI8)
    cg.tensor_scalar(u, t, AluOp.SUBTRACT, 1.0)
    cg.tensor_scalar(z, t, AluOp.ADD, 1.0)
    cg.tensor_tensor(u, u, z, AluOp.DIVIDE)  # (t − 1)/(t + 1)
    cg.copy_predicated(t, mid, u)
    _odd_series(cg, out, t, _ATAN_Q, z, p)
    _plus_constant(cg, p, out, _QUARTER_PI, minus=False)
    cg.copy_predicated(out, mid, p)
    _plus_constant(cg, p, out, _HALF_PI, minus=True)
    cg.copy_predicated(out, inv, p)


def _log1p(
    cg: BirCodeGen, out: AP, v: AP, u: AP, f: list[AP], m: list[AP], big: AP | None = None
) -> None:
    """out = log1p(v) given u = 1 + v (Kahan): log(u)·v/(u − 1), v where u = 1; where `big`
    (a mask), log(u) + ln 2 instead. Four fp32 scratch f[0..3], one mask m[0]; out may be
    none of them, v, u and big stay."""
    ratio = f[0]
    act_range.natural_log(cg, out, u, tuple(f[1:4]), m[0])
    cg.tensor_scalar(ratio, u, AluOp.SUBTRACT, 1.0)
    cg.tensor_tensor(ratio, v, ratio, AluOp.DIVIDE)  # NaN where u = 1: replaced below
    cg.tensor_scalar(m[0], u, AluOp.IS_GE, 2.0**24)  # v/(u − 1) is 1; inf/inf would be NaN
    cg.copy_predicated(ratio, m[0], 1.0)
    if big is not None:
        cg.tensor_scalar(f[1], out, AluOp.ADD, _LN2)
    cg.tensor_tensor(out, out, ratio, AluOp.MULTIPLY)
    cg.tensor_scalar(m[0], u, AluOp.IS_EQUAL, 1.0)  # v below half an ulp of 1: log1p v = v
    cg.copy_predicated(out, m[0], v)
    if big is not None:
        cg.copy_predicated(out, big, f[1])


def _with_sign(cg: BirCodeGen, dst: AP, y: AP, x: AP, s: AP) -> None:
    """dst = sign(x)·y."""
    cg.activation(s, x, ActFunc.SIGN)
    cg.tensor_tensor(dst, y, s, AluOp.MULTIPLY)


# --- the computes: (cg, dst, x, fp32 scratch, masks) ---


def _sinh_cosh(cg, dst, x, f, m, cosh: bool) -> None:
    a, e, p, q = f[:4]
    cg.activation(a, x, ActFunc.ABS)
    cg.activation(e, a, ActFunc.EXP, scale=0.5)
    cg.tensor_scalar(p, e, AluOp.MULTIPLY, 0.5)
    cg.tensor_tensor(e, p, e, AluOp.MULTIPLY)  # eᵃ/2, finite as far as sinh is
    cg.tensor_scalar(q, a, AluOp.MIN, _EXP_FINITE)
    cg.activation(p, q, ActFunc.EXP)
    cg.tensor_scalar(p, p, AluOp.MULTIPLY, 0.5)  # eᵃ/2, rounded once, below 88
    cg.tensor_scalar(m[0], a, AluOp.IS_GT, _EXP_FINITE)
    cg.copy_predicated(p, m[0], e)
    cg.tensor_scalar(q, p, AluOp.DIVIDE, 0.25, reverse0=True)  # e⁻ᵃ/2
    if cosh:
        cg.tensor_tensor(dst, p, q, AluOp.ADD)
        return
    cg.tensor_tensor(p, p, q, AluOp.SUBTRACT)
    cg.activation(q, x, ActFunc.SIGN)
    cg.tensor_tensor(p, p, q, AluOp.MULTIPLY)
    _odd_series(cg, e, x, _SINH_Q, q, f[4])
    cg.tensor_scalar(m[0], a, AluOp.IS_LT, 1.0)
    cg.copy_predicated(p, m[0], e)
    cg.tensor_copy(dst, p)


def _tan(cg, dst, x, f, m) -> None:
    n, r, s, c, w, high, low = f[:7]
    cg.tensor_scalar(n, x, AluOp.MULTIPLY, 2.0 / math.pi, AluOp.ADD, _ROUNDING)
    cg.tensor_scalar(n, n, AluOp.SUBTRACT, _ROUNDING)
    # n = high + low, low = fmod(n, 2^12): each times a 12-bit piece is exact for |n| < 2^24.
    cg.tensor_scalar(low, n, AluOp.MOD, _N_SPLIT)
    cg.tensor_tensor(high, n, low, AluOp.SUBTRACT)
    cg.tensor_copy(r, x)
    for piece in _HALF_PI_PIECES:
        for part in (high, low):
            cg.tensor_scalar(w, part, AluOp.MULTIPLY, piece)
            cg.tensor_tensor(r, r, w, AluOp.SUBTRACT)
    # |r| ≤ π/4 for every finite |x| the reduction covers; the clamp keeps ScalarE's range
    # (rule ACT-RANGE) for any other input.
    cg.tensor_scalar(r, r, AluOp.MAX, -PI_FP32, AluOp.MIN, PI_FP32)
    cg.activation(s, r, ActFunc.SIN)
    cg.activation(c, r, ActFunc.SIN, scale=0.5)
    cg.tensor_tensor(c, c, c, AluOp.MULTIPLY)
    cg.tensor_scalar(c, c, AluOp.MULTIPLY, -2.0, AluOp.ADD, 1.0)  # cos r
    cg.tensor_scalar(m[0], n, AluOp.MOD, 2.0, AluOp.IS_EQUAL, 0.0)  # n even
    cg.tensor_tensor(w, c, s, AluOp.DIVIDE)
    cg.tensor_scalar(w, w, AluOp.MULTIPLY, -1.0)
    cg.tensor_tensor(r, s, c, AluOp.DIVIDE)
    cg.copy_predicated(w, m[0], r)
    cg.tensor_copy(dst, w)


def _root_one_minus_square(cg, w: AP, a: AP, q: AP) -> None:
    """w = √((1 − a)(1 + a)): NaN for a > 1."""
    cg.tensor_scalar(w, a, AluOp.SUBTRACT, 1.0, reverse0=True)
    cg.tensor_scalar(q, a, AluOp.ADD, 1.0)
    cg.tensor_tensor(w, w, q, AluOp.MULTIPLY)
    cg.tensor_scalar(w, w, AluOp.POW, 0.5)


def _atan(cg, dst, x, f, m) -> None:
    a, one, y = f[4:7]
    cg.activation(a, x, ActFunc.ABS)
    cg.memset(one, 1.0)
    _atan2_positive(cg, y, a, one, f, m)
    _with_sign(cg, dst, y, x, a)


def _asin(cg, dst, x, f, m) -> None:
    a, w, y = f[4:7]
    cg.activation(a, x, ActFunc.ABS)
    _root_one_minus_square(cg, w, a, y)
    _atan2_positive(cg, y, a, w, f, m)
    _with_sign(cg, dst, y, x, a)


def _acos(cg, dst, x, f, m) -> None:
    a, w, y = f[4:7]
    cg.activation(a, x, ActFunc.ABS)
    _root_one_minus_square(cg, w, a, y)
    _atan2_positive(cg, y, w, a, f, m)
    _plus_constant(cg, a, y, _PI, minus=True)
    cg.tensor_scalar(m[0], x, AluOp.IS_LT, 0.0)
    cg.copy_predicated(y, m[0], a)
    cg.tensor_copy(dst, y)


def _atanh(cg, dst, x, f, m) -> None:
    a, v, u, y = f[4:8]
    cg.activation(a, x, ActFunc.ABS)
    cg.tensor_scalar(v, a, AluOp.SUBTRACT, 1.0, reverse0=True)
    cg.tensor_tensor(v, a, v, AluOp.DIVIDE)
    cg.tensor_scalar(v, v, AluOp.MULTIPLY, 2.0)  # 2a/(1 − a)
    cg.tensor_scalar(u, v, AluOp.ADD, 1.0)
    _log1p(cg, y, v, u, f, m)
    cg.tensor_scalar(y, y, AluOp.MULTIPLY, 0.5)
    _with_sign(cg, dst, y, x, a)


def _log_or_log1p(cg, y: AP, v: AP, big_value: AP, big: AP, f, m) -> None:
    """y = log(big_value) + ln 2 where `big`, else log1p(v); f[0..4], v and big_value kept."""
    u = f[4]
    cg.tensor_scalar(u, v, AluOp.ADD, 1.0)
    cg.copy_predicated(u, big, big_value)
    _log1p(cg, y, v, u, f, m, big)


def _asinh(cg, dst, x, f, m) -> None:
    a, v, y, q = f[5:9]
    cg.activation(a, x, ActFunc.ABS)
    cg.tensor_scalar(m[1], a, AluOp.IS_GT, _LOG_BRANCH)
    cg.tensor_scalar(v, a, AluOp.MIN, _LOG_BRANCH)  # a² stays finite
    cg.tensor_tensor(v, v, v, AluOp.MULTIPLY)
    cg.tensor_scalar(q, v, AluOp.ADD, 1.0, AluOp.POW, 0.5)
    cg.tensor_scalar(q, q, AluOp.ADD, 1.0)
    cg.tensor_tensor(v, v, q, AluOp.DIVIDE)
    cg.tensor_tensor(v, v, a, AluOp.ADD)  # a + a²/(1 + √(1 + a²))
    _log_or_log1p(cg, y, v, a, m[1], f, m)
    _with_sign(cg, dst, y, x, a)


def _acosh(cg, dst, x, f, m) -> None:
    t, v, y, q = f[5:9]
    cg.tensor_scalar(m[1], x, AluOp.IS_GT, _LOG_BRANCH)
    cg.tensor_scalar(t, x, AluOp.MIN, _LOG_BRANCH, AluOp.SUBTRACT, 1.0)  # t = x − 1
    cg.tensor_scalar(q, t, AluOp.ADD, 2.0)
    cg.tensor_tensor(v, t, q, AluOp.MULTIPLY)
    cg.tensor_scalar(v, v, AluOp.POW, 0.5)  # NaN for −1 < x < 1
    cg.tensor_tensor(v, v, t, AluOp.ADD)
    cg.tensor_copy(q, x)
    _log_or_log1p(cg, y, v, q, m[1], f, m)
    cg.tensor_copy(dst, y)


_COMPUTES: dict[str, tuple[Callable, int, int]] = {
    # op: (compute, fp32 scratch, masks)
    "Sinh": (lambda cg, d, x, f, m: _sinh_cosh(cg, d, x, f, m, cosh=False), 5, 1),
    "Cosh": (lambda cg, d, x, f, m: _sinh_cosh(cg, d, x, f, m, cosh=True), 4, 1),
    "Tan": (_tan, 7, 1),
    "Atan": (_atan, 7, 2),
    "Asin": (_asin, 7, 2),
    "Acos": (_acos, 7, 2),
    "Atanh": (_atanh, 8, 1),
    "Asinh": (_asinh, 9, 2),
    "Acosh": (_acosh, 9, 2),
}


def lower_math_inverse(cg: BirCodeGen, node: Node) -> None:
    _float_only(cg, node)
    compute, floats, masks = _COMPUTES[node.op_type]
    scratch = _Scratch(cg, floats, masks)

    def run(cg: BirCodeGen, dst: AP, srcs: list[AP]) -> None:
        f, m = scratch.at(dst)
        compute(cg, dst, srcs[0], f, m)

    emit_elementwise(cg, node, run, direct=True)


def lower_swish(cg: BirCodeGen, node: Node) -> None:
    _float_only(cg, node)
    alpha = float(node.attr("alpha", 1.0))
    gate = scratch_tile(cg, "gate")

    def run(cg: BirCodeGen, dst: AP, srcs: list[AP]) -> None:
        g = like(dst, gate)
        cg.activation(g, srcs[0], ActFunc.SIGMOID, scale=alpha)
        cg.tensor_tensor(dst, srcs[0], g, AluOp.MULTIPLY)

    emit_elementwise(cg, node, run, direct=True)


LOWERINGS: dict[str, Callable] = {
    **{op: lower_math_inverse for op in _COMPUTES},
    "Swish": lower_swish,
}
