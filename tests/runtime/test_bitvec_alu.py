"""Bitvec ALU operators (docs/neuroncore.md#bitvec): bitwise and, or, xor, invert, left shift
and logical right shift compute on integer bit patterns in 32-bit lanes, never through fp32.

- the numpy functions: a shift by 32 or more gives 0, the right shift is logical (a uint32
  above 2^31 in an int32 lane shifts in zeros), a left shift drops the bits past bit 31;
- `onnx2bir run` runs them on VectorE and GpSimd and computes the bits exactly (2^24 + 1 is
  not an fp32 value, so exactness shows no fp32 on the way); a uint8 result wraps;
- the same program with a float operand, on ScalarE, or beside an arithmetic operator in one
  TensorScalar is refused, exit 1, rule ALU-BITVEC alone.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from run_program import run_program

from onnx2bir.bir.enums import AluOp, DepKind, Dtype, Engine, MemoryKind, MemoryType, Opcode
from onnx2bir.bir.ir import (
    AccessPattern,
    BasicBlock,
    Dependency,
    Function,
    Instruction,
    MemoryLocation,
    Module,
    Origin,
)
from onnx2bir.bir.opcodes import BITVEC_OPS
from onnx2bir.bir.rules import RULES
from onnx2bir.bir.verify import verify_module
from onnx2bir.runtime.machine.alu import I32, alu

ORIGIN = Origin("bits", "test")
N = 6


def test_shifts_on_32_bit_lanes():
    a = np.array([1, -1, 3, 2**31 - 1, -(2**31), 5], np.int32)
    s = np.array([31, 1, 32, 1, 31, 200], np.int32)
    left = alu(AluOp.LEFT_SHIFT, a, s, I32)
    assert left.dtype == I32
    assert left.tolist() == [-(2**31), -2, 0, -2, 0, 0]
    right = alu(AluOp.RIGHT_SHIFT, a, s, I32)
    assert right.tolist() == [0, 2**31 - 1, 0, 2**30 - 1, 1, 0]  # zeros shifted in
    # A shift amount read unsigned: -1 is 2^32 - 1, a shift past the lane.
    assert alu(AluOp.RIGHT_SHIFT, a, np.int32(-1), I32).tolist() == [0] * N


def test_bitwise_operators_and_invert():
    a = np.array([12, -1, 0, 2**31 - 1, -(2**31), 255], np.int32)
    b = np.array([10, 7, -1, -(2**31), -1, 15], np.int32)
    assert alu(AluOp.BITWISE_AND, a, b, I32).tolist() == (a & b).tolist()
    assert alu(AluOp.BITWISE_OR, a, b, I32).tolist() == (a | b).tolist()
    assert alu(AluOp.BITWISE_XOR, a, b, I32).tolist() == (a ^ b).tolist()
    assert alu(AluOp.INVERT, a, b, I32).tolist() == (~a).tolist()


def _program(
    op: AluOp = AluOp.BITWISE_XOR,
    engine: Engine = Engine.POOL,
    dtype: Dtype = Dtype.INT32,
    scalar_ops: tuple[AluOp, AluOp | None] | None = None,
) -> Module:
    """y = a <op> b over 6 elements, through SBUF tiles of `dtype`; with `scalar_ops`, a
    TensorScalar y = (a op0 3) op1 1 instead."""
    locations = [
        MemoryLocation(n, MemoryType.DRAM, kind, dtype, (1, N))
        for n, kind in (
            ("a", MemoryKind.EXTERNAL_INPUT),
            ("b", MemoryKind.EXTERNAL_INPUT),
            ("y", MemoryKind.EXTERNAL_OUTPUT),
        )
    ] + [
        MemoryLocation(n, MemoryType.SB, MemoryKind.INTERNAL, dtype, (1, N), 1, at, 64)
        for n, at in (("sa", 0), ("sb", 64), ("sy", 128))
    ]

    def tile(name):
        return AccessPattern(name, ((1, N),), 0, (), 0, 1)

    def dram(name):
        return AccessPattern(name, ((1, N),))

    if scalar_ops is None:
        compute = Instruction(
            Opcode.TENSOR_TENSOR,
            engine,
            tile("sy"),
            {"in0": tile("sa"), "in1": tile("sb")},
            {"op": str(op)},
            ORIGIN,
        )
    else:
        attrs: dict[str, object] = {"op0": str(scalar_ops[0]), "imm0": 3}
        if scalar_ops[1] is not None:
            attrs.update(op1=str(scalar_ops[1]), imm1=1)
        compute = Instruction(
            Opcode.TENSOR_SCALAR, engine, tile("sy"), {"in": tile("sa")}, attrs, ORIGIN
        )
    items = [
        Instruction(
            Opcode.DMA_COPY, Engine.DMA, tile("sa"), {"in": dram("a")}, {"queue": 0}, ORIGIN
        ),
        Instruction(
            Opcode.DMA_COPY, Engine.DMA, tile("sb"), {"in": dram("b")}, {"queue": 1}, ORIGIN
        ),
        compute,
        Instruction(
            Opcode.DMA_COPY, Engine.DMA, dram("y"), {"in": tile("sy")}, {"queue": 0}, ORIGIN
        ),
    ]
    for number, inst in enumerate(items):
        inst.id = number
        inst.deps = [Dependency(source, DepKind.FLOW) for source in range(number)]
    fn = Function(
        "main", {loc.name: loc for loc in locations}, ["a", "b"], ["y"], BasicBlock("Block1")
    )
    fn.entry.items = items
    return Module("bits", [fn])


A = np.array([[2**24 + 1, -1, 7, -(2**31), 2**30 + 3, 0]])
B = np.array([[2, 5, 33, 1, 3, -1]])
REFERENCE = {
    AluOp.BITWISE_AND: lambda a, b: a & b,
    AluOp.BITWISE_OR: lambda a, b: a | b,
    AluOp.BITWISE_XOR: lambda a, b: a ^ b,
    AluOp.INVERT: lambda a, b: ~a,
    AluOp.LEFT_SHIFT: lambda a, b: np.where(
        (b & 0xFFFFFFFF) < 32, (a << np.clip(b, 0, 31)) & 0xFFFFFFFF, 0
    ),
    AluOp.RIGHT_SHIFT: lambda a, b: np.where(
        (b & 0xFFFFFFFF) < 32, (a & 0xFFFFFFFF) >> np.clip(b, 0, 31), 0
    ),
}


def _run(tmp_path: Path, module: Module, capsys, dtype=np.int32, a=A, b=B):
    inputs = {"a": a.astype(dtype), "b": b.astype(dtype)}
    code, err, outputs = run_program(tmp_path, module, inputs, capsys)
    return code, err, outputs.get("y")


@pytest.mark.parametrize("engine", [Engine.POOL, Engine.DVE])
@pytest.mark.parametrize("op", sorted(BITVEC_OPS))
def test_bitvec_runs_on_integer_bit_patterns(tmp_path, capsys, op, engine):
    code, err, y = _run(tmp_path, _program(op, engine), capsys)
    assert code == 0, err
    expected = REFERENCE[op](A.astype(np.int64), B.astype(np.int64)).astype(np.int32)
    assert y.tolist() == expected.tolist()


def test_a_uint8_result_wraps_on_vector_engine(tmp_path, capsys):
    a, b = np.array([[200, 255, 1, 128, 3, 0]]), np.array([[1, 4, 7, 8, 200, 3]])
    module = _program(AluOp.LEFT_SHIFT, Engine.DVE, Dtype.UINT8)
    code, err, y = _run(tmp_path, module, capsys, np.uint8, a, b)
    assert code == 0, err
    assert y.tolist() == [[144, 240, 128, 0, 0, 0]]  # (a << b) mod 256; b >= 8 gives 0
    module = _program(AluOp.INVERT, Engine.DVE, Dtype.UINT8)
    code, err, y = _run(tmp_path, module, capsys, np.uint8, a, b)
    assert code == 0, err
    assert y.tolist() == (255 - a).tolist()


def test_tensor_scalar_with_two_bitvec_operators(tmp_path, capsys):
    module = _program(engine=Engine.DVE, scalar_ops=(AluOp.RIGHT_SHIFT, AluOp.BITWISE_AND))
    code, err, y = _run(tmp_path, module, capsys)
    assert code == 0, err
    assert y.tolist() == (((A & 0xFFFFFFFF) >> 3) & 1).tolist()


BREAKING = {
    "a float operand": {"dtype": Dtype.FP32},
    "ScalarE": {"engine": Engine.ACT, "scalar_ops": (AluOp.BITWISE_AND, None)},
    "beside arithmetic": {
        "engine": Engine.DVE,
        "scalar_ops": (AluOp.LEFT_SHIFT, AluOp.ADD),
    },
}


@pytest.mark.parametrize("case", list(BREAKING))
def test_a_bitvec_operator_off_integer_bit_patterns_is_refused(tmp_path, capsys, case):
    module = _program(**BREAKING[case])
    dtype = np.float32 if case == "a float operand" else np.int32
    code, err, _ = _run(tmp_path, module, capsys, dtype)
    assert code == 1, err
    assert "ALU-BITVEC: " in err and RULES["ALU-BITVEC"].fact in err
    assert [rule for rule in RULES if f"{rule}: " in err] == ["ALU-BITVEC"]
    (problem,) = verify_module(module)
    assert "instruction 2" in problem and "ALU-BITVEC" in problem


def test_a_non_integral_immediate_is_refused():
    module = _program(engine=Engine.DVE, scalar_ops=(AluOp.BITWISE_AND, None))
    module.functions[0].entry.items[2].attrs["imm0"] = 0.5
    (problem,) = verify_module(module)
    assert "ALU-BITVEC: bitwise_and with immediate imm0 = 0.5" in problem
