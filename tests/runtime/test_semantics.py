"""Each opcode of the semantics table against an independent numpy computation, and its rules."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from onnx2bir.bir.enums import ActFunc, AluOp, Dtype, Engine, MemoryKind, MemoryType, Opcode
from onnx2bir.bir.ir import AccessPattern, Function, Instruction, MemoryLocation, Origin
from onnx2bir.bir.opcodes import ACT_INPUT_RANGES, ACT_RANGE_ON_MAGNITUDE, BITVEC_OPS
from onnx2bir.errors import MachineError
from onnx2bir.runtime.machine.machine import Machine
from onnx2bir.runtime.machine.semantics import SEMANTICS, erf

ORIGIN = Origin("node_under_test", "rule.under_test")
BF16 = ml_dtypes.bfloat16
RNG = np.random.default_rng(0)


def tile(name, partitions, elems, dtype=Dtype.FP32, memory=MemoryType.SB, address=0):
    """An on-chip location of partitions x elems."""
    return MemoryLocation(
        name,
        memory,
        MemoryKind.INTERNAL,
        dtype,
        (partitions, elems),
        partitions,
        address,
        elems * dtype.itemsize,
    )


def dram(name, shape, dtype=Dtype.FP32):
    return MemoryLocation(name, MemoryType.DRAM, MemoryKind.INTERNAL, dtype, shape)


def ap(loc, pattern=None, parts=None, start=0, offset=0):
    """Access pattern over loc; by default every partition, contiguous over all elements."""
    if loc.memory is MemoryType.DRAM:
        return AccessPattern(loc.name, pattern or ((1, loc.num_elements),), offset)
    pattern = pattern or ((1, loc.num_elements),)
    return AccessPattern(loc.name, pattern, offset, (), start, parts or loc.num_partitions)


def instr(opcode, engine, dst, srcs=None, **attrs):
    return Instruction(opcode, engine, dst, srcs or {}, attrs, ORIGIN, id=7)


def machine(*locs):
    return Machine(Function("f", {loc.name: loc for loc in locs}))


def put(m, loc, values):
    m.location_view(loc.name)[...] = np.asarray(values).astype(loc.dtype.numpy)


def get(m, loc):
    return m.location_view(loc.name).copy()


def run(m, ins, loop_values=None):
    SEMANTICS[ins.opcode](m, ins, loop_values or {})


def rejects(m, ins, words):
    """The instruction raises MachineError naming its id, opcode, origin and the rule."""
    with pytest.raises(MachineError) as info:
        run(m, ins)
    message = str(info.value)
    for word in ["instruction 7", str(ins.opcode), ORIGIN.node, ORIGIN.rule, *words]:
        assert word in message, (word, message)


def test_every_opcode_has_semantics():
    assert set(SEMANTICS) == set(Opcode)


def test_every_opcode_has_its_rules():
    from onnx2bir.bir.opcodes import OPCODES

    assert set(OPCODES) == set(Opcode)


# ---- Matmult -----------------------------------------------------------------------------------


def _matmul_setup(k, m_size, n, dt_stat=Dtype.FP32, dt_mov=Dtype.FP32, address=0):
    stat, mov = tile("st", k, m_size, dt_stat), tile("mv", k, n, dt_mov, address=4096)
    out = tile("ps", min(m_size, 128), n, memory=MemoryType.PSUM, address=address)
    mach = machine(stat, mov, out)
    a = RNG.standard_normal((k, m_size)).astype(dt_stat.numpy)
    b = RNG.standard_normal((k, n)).astype(dt_mov.numpy)
    put(mach, stat, a)
    put(mach, mov, b)
    srcs = {"stationary": ap(stat), "moving": ap(mov)}
    return mach, out, srcs, a, b


def test_matmult_fp32_is_stationary_transposed_times_moving():
    mach, out, srcs, a, b = _matmul_setup(96, 40, 300)
    run(mach, instr(Opcode.MATMULT, Engine.PE, ap(out), srcs, accumulate=False))
    np.testing.assert_allclose(get(mach, out), a.T.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)


def test_matmult_bf16_fp16_mix_accumulates_in_fp32():
    mach, out, srcs, a, b = _matmul_setup(128, 128, 512, Dtype.BF16, Dtype.FP16)
    run(mach, instr(Opcode.MATMULT, Engine.PE, ap(out), srcs, accumulate=False))
    expected = a.astype(np.float32).T @ b.astype(np.float32)
    np.testing.assert_allclose(get(mach, out), expected, rtol=1e-5, atol=1e-5)


def test_matmult_accumulate_adds_and_overwrite_replaces():
    mach, out, srcs, a, b = _matmul_setup(16, 8, 32)
    run(mach, instr(Opcode.MATMULT, Engine.PE, ap(out), srcs, accumulate=False))
    run(mach, instr(Opcode.MATMULT, Engine.PE, ap(out), srcs, accumulate=True))
    np.testing.assert_allclose(get(mach, out), 2 * (a.T @ b), rtol=1e-5, atol=1e-5)
    run(mach, instr(Opcode.MATMULT, Engine.PE, ap(out), srcs, accumulate=False))
    np.testing.assert_allclose(get(mach, out), a.T @ b, rtol=1e-5, atol=1e-5)


def test_matmult_equal_columns_give_equal_results():
    """An output element depends on its operands only, not on its column in the tile.

    The onnx light inception_v1 (every weight 0.02) ends in a Gemm whose 1000 columns are
    equal, then a softmax over logits near 8e20: one ULP between columns is a probability of 0
    instead of 0.001. fp32 BLAS sums the first 8 of these 488 columns in another order.
    """
    mach, out, srcs, _, _ = _matmul_setup(128, 1, 488)
    a = np.full((128, 1), 8.750478e19, np.float32)
    b = np.full((128, 488), 0.02, np.float32)
    put(mach, tile("st", 128, 1), a)
    put(mach, tile("mv", 128, 488, address=4096), b)
    run(mach, instr(Opcode.MATMULT, Engine.PE, ap(out), srcs, accumulate=False))
    result = get(mach, out)
    assert np.unique(result).size == 1, np.unique(result)
    # And it is the fp32 rounding of the exact dot product.
    assert result[0, 0] == np.float32(
        128 * float(np.float32(8.750478e19)) * float(np.float32(0.02))
    )


@pytest.mark.parametrize(
    "k, m_size, n, dt_stat, dt_mov, address, words",
    [
        (16, 129, 8, Dtype.FP32, Dtype.FP32, 0, ["M = 129"]),
        (16, 8, 513, Dtype.FP32, Dtype.FP32, 0, ["N = 513"]),
        (16, 8, 512, Dtype.FP32, Dtype.BF16, 0, ["cannot pair"]),
        (16, 8, 300, Dtype.FP32, Dtype.FP32, 1024, ["bank"]),
    ],
)
def test_matmult_rules(k, m_size, n, dt_stat, dt_mov, address, words):
    mach, out, srcs, _, _ = _matmul_setup(k, m_size, n, dt_stat, dt_mov, address)
    rejects(mach, instr(Opcode.MATMULT, Engine.PE, ap(out), srcs, accumulate=False), words)


def test_matmult_contraction_partitions_must_match():
    mach, out, srcs, _, _ = _matmul_setup(32, 8, 16)
    srcs["moving"] = ap(tile("mv", 32, 16), parts=16)
    rejects(mach, instr(Opcode.MATMULT, Engine.PE, ap(out), srcs, accumulate=False), ["K"])


def test_matmult_wants_psum_dst_and_pe_engine():
    mach, out, srcs, _, _ = _matmul_setup(16, 8, 16)
    rejects(mach, instr(Opcode.MATMULT, Engine.PE, srcs["moving"], srcs, accumulate=False), ["SB"])
    rejects(mach, instr(Opcode.MATMULT, Engine.DVE, ap(out), srcs, accumulate=False), ["DVE"])


# ---- Activation --------------------------------------------------------------------------------

_erf = np.vectorize(math.erf)
REFERENCE = {
    ActFunc.COPY: lambda x: x,
    ActFunc.RELU: lambda x: np.where(x > 0, x, 0.0),
    ActFunc.SIGMOID: lambda x: 1 / (1 + np.exp(-x)),
    ActFunc.TANH: np.tanh,
    ActFunc.EXP: np.exp,
    ActFunc.LOG: np.log,
    ActFunc.SQRT: np.sqrt,
    ActFunc.RSQRT: lambda x: x**-0.5,
    ActFunc.RECIPROCAL: lambda x: 1 / x,
    ActFunc.SQUARE: lambda x: x * x,
    ActFunc.ABS: np.abs,
    ActFunc.SIGN: np.sign,
    ActFunc.ERF: _erf,
    ActFunc.GELU: lambda x: x * 0.5 * (1 + _erf(x / math.sqrt(2))),
    ActFunc.GELU_TANH: lambda x: 0.5 * x * (1 + np.tanh(0.7978845608 * (x + 0.044715 * x**3))),
    ActFunc.SILU: lambda x: x / (1 + np.exp(-x)),
    ActFunc.SOFTPLUS: lambda x: np.log(1 + np.exp(x)),
    ActFunc.SIN: np.vectorize(math.sin),
    ActFunc.COS: np.vectorize(math.cos),
}


def test_erf_is_accurate_to_1e7():
    x = np.linspace(-7, 7, 40001).astype(np.float32)
    assert erf(x).dtype == np.float32
    assert np.abs(erf(x) - _erf(x.astype(np.float64))).max() < 1e-7


POSITIVE_ONLY = {ActFunc.LOG, ActFunc.SQRT, ActFunc.RSQRT, ActFunc.RECIPROCAL}


@pytest.mark.parametrize("func", list(ActFunc))
def test_activation_matches_reference(func):
    assert set(REFERENCE) == set(ActFunc)
    src, bias, dst = (
        tile("x", 32, 50),
        tile("b", 32, 1, address=256),
        tile("y", 32, 50, address=512),
    )
    mach = machine(src, bias, dst)
    x = RNG.uniform(-4, 4, (32, 50)).astype(np.float32)
    b = RNG.uniform(-0.5, 0.5, (32, 1)).astype(np.float32)
    if func in POSITIVE_ONLY:
        x, b = np.abs(x) + 0.5, np.abs(b)
    if func in (ActFunc.SIN, ActFunc.COS):  # their table covers [-pi, pi] only (ACT-RANGE)
        x = x * np.float32(0.875)
    put(mach, src, x)
    put(mach, bias, b)
    ins = instr(Opcode.ACTIVATION, Engine.ACT, ap(dst), {"in": ap(src), "bias": ap(bias)})
    ins.attrs.update(func=func, scale=0.75)
    run(mach, ins)
    expected = REFERENCE[func](x.astype(np.float64) * 0.75 + b)
    # sin and cos have slope ±1 at their zeros: the fp32 rounding of the argument (up to 3.1,
    # one ULP 2.4e-7) is their error there
    atol = 5e-7 if func in (ActFunc.SIN, ActFunc.COS) else 2e-7
    np.testing.assert_allclose(get(mach, dst), expected, rtol=2e-6, atol=atol)


@pytest.mark.parametrize("func", list(ACT_INPUT_RANGES))
def test_activation_refuses_an_argument_outside_its_valid_range(func):
    """The ends of the range (docs/neuroncore.md#rules, ACT-RANGE) and NaN pass; one fp32 step
    past either end is refused, naming the rule."""
    low, high = (np.float32(end) for end in ACT_INPUT_RANGES[func])
    inside = np.array([low, high, np.nan, (low + high) / 2], np.float32)
    if func in ACT_RANGE_ON_MAGNITUDE:
        inside = np.concatenate([inside, -inside])
    src, dst = tile("x", 1, inside.size), tile("y", 1, inside.size, address=256)
    mach = machine(src, dst)
    put(mach, src, inside.reshape(1, -1))
    ins = instr(Opcode.ACTIVATION, Engine.ACT, ap(dst), {"in": ap(src)})
    ins.attrs.update(func=func, scale=1.0)
    run(mach, ins)
    for past in (np.nextafter(low, np.float32(-np.inf)), np.nextafter(high, np.float32(np.inf))):
        outside = inside.copy()
        outside[-1] = past
        put(mach, src, outside.reshape(1, -1))
        with pytest.raises(MachineError, match=f"ACT-RANGE: {func}: "):
            run(mach, ins)


def test_activation_bias_value_and_bf16_rounding():
    src, dst = tile("x", 8, 10), tile("y", 8, 10, Dtype.BF16, address=64)
    mach = machine(src, dst)
    x = RNG.standard_normal((8, 10)).astype(np.float32)
    put(mach, src, x)
    ins = instr(Opcode.ACTIVATION, Engine.ACT, ap(dst), {"in": ap(src)}, func="exp", scale=2.0)
    ins.attrs["bias_value"] = -1.0
    run(mach, ins)
    expected = np.exp(x * np.float32(2) - np.float32(1)).astype(BF16)
    assert get(mach, dst).tobytes() == expected.tobytes()


def test_activation_wide_inputs_do_not_overflow():
    src, dst = tile("x", 1, 4), tile("y", 1, 4, address=16)
    mach = machine(src, dst)
    put(mach, src, [[-200.0, -90.0, 90.0, 200.0]])
    for func, expected in [("sigmoid", [0, 0, 1, 1]), ("softplus", [0, 0, 90, 200])]:
        run(
            mach, instr(Opcode.ACTIVATION, Engine.ACT, ap(dst), {"in": ap(src)}, func=func, scale=1)
        )
        np.testing.assert_allclose(get(mach, dst)[0], expected, atol=1e-30)


def test_activation_operands_must_match_and_bias_be_a_column():
    src, dst, bias = tile("x", 8, 10), tile("y", 8, 12, address=64), tile("b", 8, 2)
    mach = machine(src, dst, bias)
    attrs = {"func": "copy", "scale": 1.0}
    rejects(mach, instr(Opcode.ACTIVATION, Engine.ACT, ap(dst), {"in": ap(src)}, **attrs), ["x 12"])
    ins = instr(Opcode.ACTIVATION, Engine.ACT, ap(src), {"in": ap(src), "bias": ap(bias)}, **attrs)
    rejects(mach, ins, ["bias", "[8, 1]"])
    ins = instr(Opcode.ACTIVATION, Engine.ACT, ap(src), {"in": ap(src)}, func="cube", scale=1)
    rejects(mach, ins, ["func"])


# ---- TensorTensor ------------------------------------------------------------------------------

FLOAT_REFERENCE = {
    AluOp.ADD: lambda a, b: a + b,
    AluOp.SUBTRACT: lambda a, b: a - b,
    AluOp.MULTIPLY: lambda a, b: a * b,
    AluOp.DIVIDE: lambda a, b: a / b,
    AluOp.MAX: np.fmax,
    AluOp.MIN: np.fmin,
    AluOp.POW: lambda a, b: np.abs(a) ** b,
    AluOp.IS_EQUAL: lambda a, b: (a == b) * 1.0,
    AluOp.IS_LT: lambda a, b: (a < b) * 1.0,
    AluOp.IS_LE: lambda a, b: (a <= b) * 1.0,
    AluOp.IS_GT: lambda a, b: (a > b) * 1.0,
    AluOp.IS_GE: lambda a, b: (a >= b) * 1.0,
    AluOp.LOGICAL_AND: lambda a, b: ((a != 0) & (b != 0)) * 1.0,
    AluOp.LOGICAL_OR: lambda a, b: ((a != 0) | (b != 0)) * 1.0,
    AluOp.BYPASS: lambda a, b: a,
    AluOp.MOD: lambda a, b: np.vectorize(math.fmod)(a, b),
}


@pytest.mark.parametrize("op", [op for op in AluOp if op not in BITVEC_OPS])
def test_tensor_tensor_float_ops(op):
    in0, in1, out = (
        tile("a", 16, 24),
        tile("b", 16, 3 * 8, address=128),
        tile("c", 16, 24, address=256),
    )
    mach = machine(in0, in1, out)
    a = RNG.integers(-3, 4, (16, 24)).astype(np.float32) * 0.5
    b = RNG.integers(-3, 4, (16, 24)).astype(np.float32) * 0.5
    b[b == 0] = 0.25  # no division by zero
    if op is AluOp.POW:
        a = np.abs(a) + 0.5
    put(mach, in0, a)
    put(mach, in1, b)
    srcs = {"in0": ap(in0), "in1": ap(in1, ((8, 3), (1, 8)))}  # free shapes may differ
    run(mach, instr(Opcode.TENSOR_TENSOR, Engine.DVE, ap(out), srcs, op=op))
    np.testing.assert_allclose(get(mach, out), FLOAT_REFERENCE[op](a, b), rtol=1e-6)


def test_tensor_tensor_integers_are_exact_and_divide_truncates():
    in0, in1 = tile("a", 2, 3, Dtype.INT32), tile("b", 2, 3, Dtype.INT32, address=64)
    out = tile("c", 2, 3, Dtype.INT32, address=128)
    mach = machine(in0, in1, out)
    put(mach, in0, [[16777217, -7, 7], [2**30, -9, 0]])
    put(mach, in1, [[2, 2, -2], [1, 4, 5]])
    srcs = {"in0": ap(in0), "in1": ap(in1)}
    run(mach, instr(Opcode.TENSOR_TENSOR, Engine.POOL, ap(out), srcs, op="add"))
    assert get(mach, out).tolist() == [[16777219, -5, 5], [2**30 + 1, -5, 5]]
    run(mach, instr(Opcode.TENSOR_TENSOR, Engine.POOL, ap(out), srcs, op="divide"))
    assert get(mach, out).tolist() == [[8388608, -3, -3], [2**30, -2, 0]]


def test_vector_engine_computes_integers_in_fp32_and_gpsimd_in_int32():
    # docs/neuroncore.md#integers: 2^24 + 1 is not an fp32 value. VectorE rounds it on the way
    # in (to 2^24, ties to even) and again on the way out; GpSimd's int32 lanes keep it, and
    # wrap past 2^31 as the hardware does.
    in0, in1 = tile("a", 1, 3, Dtype.INT32), tile("b", 1, 3, Dtype.INT32, address=64)
    out = tile("c", 1, 3, Dtype.INT32, address=128)
    mach = machine(in0, in1, out)
    put(mach, in0, [[2**24 + 1, 2**24 + 1, 2**31 - 1]])
    put(mach, in1, [[0, 2, 1]])
    srcs = {"in0": ap(in0), "in1": ap(in1)}
    run(mach, instr(Opcode.TENSOR_TENSOR, Engine.POOL, ap(out), srcs, op="add"))
    assert get(mach, out).tolist() == [[2**24 + 1, 2**24 + 3, -(2**31)]]
    run(mach, instr(Opcode.TENSOR_TENSOR, Engine.DVE, ap(out), srcs, op="add"))
    assert get(mach, out)[0, :2].tolist() == [2**24, 2**24 + 2]
    # TensorScalar's scalars are fp32: an immediate 2^24 + 1 arrives as 2^24, even on GpSimd.
    run(
        mach,
        instr(
            Opcode.TENSOR_SCALAR,
            Engine.POOL,
            ap(out),
            {"in": ap(in1)},
            op0="add",
            imm0=2**24 + 1,
            reverse0=False,
        ),
    )
    assert get(mach, out).tolist() == [[2**24, 2**24 + 2, 2**24 + 1]]


def test_mod_takes_the_sign_of_the_dividend_and_is_exact_on_integers():
    in0, in1 = tile("a", 1, 4, Dtype.INT32), tile("b", 1, 4, Dtype.INT32, address=64)
    out = tile("c", 1, 4, Dtype.INT32, address=128)
    mach = machine(in0, in1, out)
    put(mach, in0, [[2**30 + 7, -7, 7, -7]])
    put(mach, in1, [[3, 3, -3, -3]])
    srcs = {"in0": ap(in0), "in1": ap(in1)}
    run(mach, instr(Opcode.TENSOR_TENSOR, Engine.POOL, ap(out), srcs, op="mod"))
    assert get(mach, out).tolist() == [[(2**30 + 7) % 3, -1, 1, -1]]


def test_no_engine_takes_an_int64_operand():
    in0, in1 = tile("a", 1, 4, Dtype.INT64), tile("b", 1, 4, Dtype.INT64, address=64)
    out = tile("c", 1, 4, Dtype.INT64, address=128)
    mach = machine(in0, in1, out)
    srcs = {"in0": ap(in0), "in1": ap(in1)}
    for engine in (Engine.DVE, Engine.POOL):
        rejects(
            mach, instr(Opcode.TENSOR_TENSOR, engine, ap(out), srcs, op="add"), ["INT64-DATAPATH"]
        )


def test_tensor_tensor_rules():
    sb, ps = tile("a", 8, 8), tile("p", 8, 8, memory=MemoryType.PSUM)
    ps2 = tile("q", 8, 8, memory=MemoryType.PSUM, address=64)
    mach = machine(sb, ps, ps2)
    both_psum = {"in0": ap(ps), "in1": ap(ps2)}
    rejects(mach, instr(Opcode.TENSOR_TENSOR, Engine.DVE, ap(sb), both_psum, op="add"), ["PSUM"])
    one_psum = {"in0": ap(sb), "in1": ap(ps)}
    rejects(mach, instr(Opcode.TENSOR_TENSOR, Engine.POOL, ap(sb), one_psum, op="add"), ["POOL"])
    short = {"in0": ap(sb), "in1": ap(sb, ((1, 4),))}
    rejects(mach, instr(Opcode.TENSOR_TENSOR, Engine.DVE, ap(sb), short, op="add"), ["in1"])
    rejects(mach, instr(Opcode.TENSOR_TENSOR, Engine.ACT, ap(sb), one_psum, op="add"), ["ACT"])


# ---- TensorScalar, TensorReduce, TensorCopy, Memset, Iota --------------------------------------


def test_tensor_scalar_column_immediate_and_reverse():
    src, col, out = tile("x", 4, 6), tile("s", 4, 1, address=64), tile("y", 4, 6, address=128)
    mach = machine(src, col, out)
    x, s = RNG.standard_normal((4, 6)).astype(np.float32), np.float32([[1], [2], [3], [-1]])
    put(mach, src, x)
    put(mach, col, s)
    ins = instr(Opcode.TENSOR_SCALAR, Engine.DVE, ap(out), {"in": ap(src), "scalar0": ap(col)})
    ins.attrs.update(op0="multiply", op1="subtract", imm1=1.5, reverse1=True)
    run(mach, ins)
    np.testing.assert_allclose(get(mach, out), 1.5 - x * s, rtol=1e-6)
    ins = instr(Opcode.TENSOR_SCALAR, Engine.ACT, ap(out), {"in": ap(src)}, op0="max", imm0=0.0)
    ins.attrs["op1"] = None
    run(mach, ins)
    np.testing.assert_array_equal(get(mach, out), np.maximum(x, 0))


def test_tensor_scalar_integer_math_and_missing_scalar():
    src, out = tile("x", 2, 2, Dtype.INT32), tile("y", 2, 2, Dtype.INT32, address=64)
    mach = machine(src, out)
    put(mach, src, [[2**25 + 1, 3], [-5, 0]])
    ins = instr(Opcode.TENSOR_SCALAR, Engine.POOL, ap(out), {"in": ap(src)}, op0="add", imm0=2)
    ins.attrs.update(op1="divide", imm1=2)
    run(mach, ins)
    assert get(mach, out).tolist() == [[2**24 + 1, 2], [-1, 1]]
    bad = instr(Opcode.TENSOR_SCALAR, Engine.POOL, ap(out), {"in": ap(src)}, op0="add")
    rejects(mach, bad, ["imm0"])


@pytest.mark.parametrize(
    "op, axes, negate, reference",
    [
        ("add", 1, False, lambda x: x.sum(axis=2)),
        ("max", 2, False, lambda x: x.max(axis=(1, 2))),
        ("min", 1, True, lambda x: -x.min(axis=2)),
        ("multiply", 1, False, lambda x: x.prod(axis=2)),
    ],
)
def test_tensor_reduce(op, axes, negate, reference):
    src, out = tile("x", 8, 20), tile("y", 8, 4, address=128)
    mach = machine(src, out)
    x = RNG.uniform(0.5, 1.5, (8, 4, 5)).astype(np.float32)
    put(mach, src, x.reshape(8, 20))
    kept = 4 if axes == 1 else 1
    ins = instr(
        Opcode.TENSOR_REDUCE, Engine.DVE, ap(out, ((1, kept),)), {"in": ap(src, ((5, 4), (1, 5)))}
    )
    ins.attrs.update(op=op, axes=axes, negate=negate)
    run(mach, ins)
    np.testing.assert_allclose(get(mach, out)[:, :kept], reference(x).reshape(8, kept), rtol=1e-6)


def test_tensor_reduce_rejects_bad_axes_and_shape():
    src, out = tile("x", 8, 20), tile("y", 8, 4, address=128)
    mach = machine(src, out)
    srcs = {"in": ap(src, ((5, 4), (1, 5)))}
    rejects(
        mach, instr(Opcode.TENSOR_REDUCE, Engine.DVE, ap(out), srcs, op="add", axes=3), ["axes"]
    )
    rejects(
        mach, instr(Opcode.TENSOR_REDUCE, Engine.DVE, ap(out), srcs, op="add", axes=2), ["8 x 1"]
    )
    rejects(mach, instr(Opcode.TENSOR_REDUCE, Engine.DVE, ap(out), srcs, op="pow", axes=1), ["pow"])


def test_tensor_copy_rounds_to_bf16_and_keeps_int_bits():
    src, out = tile("x", 4, 8), tile("y", 4, 8, Dtype.BF16, address=64)
    isrc, iout = (
        tile("i", 4, 8, Dtype.INT32, address=128),
        tile("j", 4, 8, Dtype.INT32, address=256),
    )
    mach = machine(src, out, isrc, iout)
    x = RNG.standard_normal((4, 8)).astype(np.float32)
    put(mach, src, x)
    run(mach, instr(Opcode.TENSOR_COPY, Engine.DVE, ap(out), {"in": ap(src)}))
    assert get(mach, out).tobytes() == x.astype(BF16).tobytes()
    put(mach, isrc, np.arange(32).reshape(4, 8) + 2**30 + 1)
    run(mach, instr(Opcode.TENSOR_COPY, Engine.POOL, ap(iout), {"in": ap(isrc)}))
    assert (get(mach, iout) == get(mach, isrc)).all()


def test_memset_and_iota():
    out, ints = tile("y", 8, 6, Dtype.FP16), tile("i", 8, 6, Dtype.INT32, address=64)
    mach = machine(out, ints)
    run(mach, instr(Opcode.MEMSET, Engine.POOL, ap(out), value=-1.5))
    assert (get(mach, out) == np.float16(-1.5)).all()
    ins = instr(
        Opcode.IOTA, Engine.POOL, ap(ints, ((3, 2), (1, 3))), base=5, channel_multiplier=100
    )
    ins.attrs["steps"] = [10, -1]
    run(mach, ins)
    p, i, j = np.indices((8, 2, 3))
    assert (get(mach, ints) == (5 + 100 * p + 10 * i - j).reshape(8, 6)).all()
    rejects(
        mach,
        instr(Opcode.IOTA, Engine.DVE, ap(ints), base=0, channel_multiplier=0, steps=[1]),
        ["DVE"],
    )


# ---- DmaCopy and the partition rule --------------------------------------------------------------


def test_dma_copy_reshapes_row_major_and_casts():
    src, dst = dram("x", (4, 6)), tile("t", 4, 6, Dtype.BF16)
    mach = machine(src, dst)
    x = RNG.standard_normal((4, 6)).astype(np.float32)
    mach.load("x", x)
    run(
        mach,
        instr(Opcode.DMA_COPY, Engine.DMA, ap(dst), {"in": ap(src, ((6, 4), (1, 6)))}, queue=0),
    )
    assert get(mach, dst).tobytes() == x.astype(BF16).tobytes()
    transposed = {"in": ap(src, ((1, 6), (6, 4)))}  # column-major walk: a transpose
    run(mach, instr(Opcode.DMA_COPY, Engine.DMA, ap(dst), transposed, queue=0))
    assert get(mach, dst).tobytes() == x.T.reshape(4, 6).astype(BF16).tobytes()
    short = {"in": ap(src, ((1, 5),))}
    rejects(mach, instr(Opcode.DMA_COPY, Engine.DMA, ap(dst), short, queue=0), ["5 elements"])


@pytest.mark.parametrize(
    "start, count, ok",
    [(0, 128, True), (64, 64, True), (32, 64, False), (96, 32, True), (16, 16, False)],
)
def test_partition_start_rule(start, count, ok):
    loc = tile("t", 128, 4)
    mach = machine(loc)
    ins = instr(Opcode.MEMSET, Engine.DVE, ap(loc, parts=count, start=start), value=0.0)
    if ok:
        run(mach, ins)
        assert (get(mach, loc)[start : start + count] == 0).all()
    else:
        rejects(mach, ins, ["start at partition"])


def test_compute_operands_have_at_most_four_free_dims():
    loc = tile("t", 4, 32)
    mach = machine(loc)
    five = ap(loc, ((16, 2), (8, 2), (4, 2), (2, 2), (1, 2)))
    rejects(mach, instr(Opcode.MEMSET, Engine.DVE, five, value=0.0), ["5 free dims"])
    run(mach, instr(Opcode.MEMSET, Engine.DVE, ap(loc, ((8, 4), (4, 2), (2, 2), (1, 2))), value=3))
    assert (get(mach, loc) == 3).all()


def test_copy_predicated_copies_bits_only_where_the_predicate_holds():
    dst, src = tile("d", 4, 8), tile("s", 4, 8, address=64)
    pred = tile("p", 4, 8, Dtype.UINT8, address=128)
    mach = machine(dst, src, pred)
    before = RNG.standard_normal((4, 8)).astype(np.float32)
    values = np.full((4, 8), np.nan, np.float32)
    values[:, ::2] = np.inf
    mask = RNG.integers(0, 2, (4, 8)).astype(np.uint8)
    put(mach, dst, before)
    put(mach, src, values)
    put(mach, pred, mask)
    run(
        mach,
        instr(Opcode.COPY_PREDICATED, Engine.DVE, ap(dst), {"in": ap(src), "predicate": ap(pred)}),
    )
    got = get(mach, dst)
    assert (got[mask == 0] == before[mask == 0]).all()  # no NaN leaks into kept elements
    assert np.array_equal(got[mask == 1], values[mask == 1], equal_nan=True)
    run(
        mach,
        instr(
            Opcode.COPY_PREDICATED,
            Engine.DVE,
            ap(dst),
            {"predicate": ap(pred)},
            imm=-1.5,
            reverse_pred=True,
        ),
    )
    assert (get(mach, dst)[mask == 0] == -1.5).all()


def test_copy_predicated_rules():
    dst, src = tile("d", 4, 8), tile("s", 4, 8, Dtype.FP16, address=64)
    fpred = tile("p", 4, 8, address=128)
    mach = machine(dst, src, fpred)
    rejects(
        mach,
        instr(Opcode.COPY_PREDICATED, Engine.DVE, ap(dst), {"in": ap(dst), "predicate": ap(fpred)}),
        ["integer"],
    )
    ipred = tile("q", 4, 8, Dtype.UINT8, address=192)
    mach = machine(dst, src, ipred)
    rejects(
        mach,
        instr(Opcode.COPY_PREDICATED, Engine.DVE, ap(dst), {"in": ap(src), "predicate": ap(ipred)}),
        ["dtypes must match"],
    )
