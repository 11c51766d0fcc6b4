"""Each hardware rule of docs/neuroncore.md#rules, broken alone: `onnx2bir run` refuses the
program with exit 1 and the rule's id; the same program keeping the rule runs (and computes
y = aᵀ·b, checked against numpy).

The program: two DMAs bring a[K=4, M=8] and b[K=4, N=8] into SBUF, a Matmult writes aᵀ·b into
PSUM, VectorE copies it to SBUF, a DMA writes it out. Each case changes one thing; for the
rules that need a program of another shape (a sine, a copy on ScalarE, a wide or strided copy,
a second Matmult), `KEEPING` holds the variant that keeps the rule and what it computes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from run_program import run_program

from onnx2bir.bir.enums import DepKind, Dtype, Engine, MemoryKind, MemoryType, Opcode
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
from onnx2bir.bir.rules import RULES

K, M, N = 4, 8, 8
RNG = np.random.default_rng(0)
A = RNG.standard_normal((K, M)).astype(np.float32)
B = RNG.standard_normal((K, N)).astype(np.float32)


def _tile(name, memory, partitions, elems, address, dtype=Dtype.FP32):
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


def _program(
    operand_dtype=Dtype.FP32,
    psum_dtype=Dtype.FP32,
    psum_address=0,
    matmul_engine=Engine.PE,
    matmul_dst="ps",
    moving_partitions=K,
    copy_engine=Engine.DVE,
    copy_start=0,
    copy_dims=1,
    tensor_tensor_on_psum=False,
    copy_as_activation=False,
    sine_scale=None,
    psum_repeat=1,
    out_stride=None,
    accumulate_only=False,
    accumulate_twice=False,
    rewrite_psum_between=False,
) -> Module:
    """The program, with one thing changed: `copy_as_activation` copies PSUM out with an
    Activation (func copy), `sine_scale` with sin(scale · x); `psum_repeat` reads the PSUM row
    that many times (stride 0) into one copy; `out_stride` writes the copy twice, that many
    elements apart; `accumulate_only` makes the one Matmult accumulate, `accumulate_twice`
    adds a second, accumulating one (y = 2·aᵀ·b), and `rewrite_psum_between` has VectorE
    rewrite the PSUM tile (times 1) between the two."""
    out_elems = max(N * psum_repeat, (out_stride or 0) + N)
    locations = [
        MemoryLocation("a", MemoryType.DRAM, MemoryKind.EXTERNAL_INPUT, Dtype.FP32, (K, M)),
        MemoryLocation("b", MemoryType.DRAM, MemoryKind.EXTERNAL_INPUT, Dtype.FP32, (K, N)),
        MemoryLocation("y", MemoryType.DRAM, MemoryKind.EXTERNAL_OUTPUT, Dtype.FP32, (M, N)),
        _tile("sa", MemoryType.SB, K, M, 0, operand_dtype),
        _tile("sb", MemoryType.SB, K, N, 64, operand_dtype),
        _tile("so", MemoryType.SB, 64, out_elems, 128),
        _tile("ps", MemoryType.PSUM, M, N, psum_address, psum_dtype),
    ]
    origin = Origin("mm", "test")
    # The copy's free pattern: one dim of N, or split into `copy_dims` dims of the same N.
    pattern = ((1, N),) if copy_dims == 1 else (*((N, 1),) * (copy_dims - 1), (1, N))
    psum = AccessPattern("ps", pattern, 0, (), 0, M)
    out_tile = AccessPattern("so", pattern, 0, (), copy_start, M)
    if psum_repeat > 1:
        psum = AccessPattern("ps", ((0, psum_repeat), (1, N)), 0, (), 0, M)
        out_tile = AccessPattern("so", ((N, psum_repeat), (1, N)), 0, (), copy_start, M)
    if out_stride is not None:
        psum = AccessPattern("ps", ((0, 2), (1, N)), 0, (), 0, M)
        out_tile = AccessPattern("so", ((out_stride, 2), (1, N)), 0, (), copy_start, M)
    if copy_as_activation or sine_scale is not None:
        func, scale = ("copy", 1.0) if sine_scale is None else ("sin", sine_scale)
        copy = Instruction(
            Opcode.ACTIVATION,
            Engine.ACT,
            out_tile,
            {"in": psum},
            {"func": func, "scale": scale, "bias_value": 0.0},
            origin,
        )
    elif tensor_tensor_on_psum:
        copy = Instruction(
            Opcode.TENSOR_TENSOR,
            copy_engine,
            out_tile,
            {"in0": psum, "in1": psum},
            {"op": "add"},
            origin,
        )
    else:
        copy = Instruction(Opcode.TENSOR_COPY, copy_engine, out_tile, {"in": psum}, {}, origin)
    matmul_dst_ap = AccessPattern(matmul_dst, ((1, N),), 0, (), 0, M)

    def matmul(accumulate: bool) -> Instruction:
        return Instruction(
            Opcode.MATMULT,
            matmul_engine,
            matmul_dst_ap,
            {
                "stationary": AccessPattern("sa", ((1, M),), 0, (), 0, K),
                "moving": AccessPattern("sb", ((1, N),), 0, (), 0, moving_partitions),
            },
            {"accumulate": accumulate},
            origin,
        )

    matmuls = [matmul(accumulate_only)]
    if rewrite_psum_between:
        matmuls.append(
            Instruction(
                Opcode.TENSOR_SCALAR,
                Engine.DVE,
                matmul_dst_ap,
                {"in": matmul_dst_ap},
                {"op0": "multiply", "imm0": 1.0},
                origin,
            )
        )
    if accumulate_twice or rewrite_psum_between:
        matmuls.append(matmul(True))
    items = [
        Instruction(
            Opcode.DMA_COPY,
            Engine.DMA,
            AccessPattern("sa", ((1, M),), 0, (), 0, K),
            {"in": AccessPattern("a", ((M, K), (1, M)))},
            {"queue": 0},
            origin,
        ),
        Instruction(
            Opcode.DMA_COPY,
            Engine.DMA,
            AccessPattern("sb", ((1, N),), 0, (), 0, K),
            {"in": AccessPattern("b", ((N, K), (1, N)))},
            {"queue": 1},
            origin,
        ),
        *matmuls,
        copy,
        Instruction(
            Opcode.DMA_COPY,
            Engine.DMA,
            AccessPattern("y", ((N, M), (1, N))),
            {"in": AccessPattern("so", ((1, N),), 0, (), copy_start, M)},
            {"queue": 0},
            origin,
        ),
    ]
    for number, inst in enumerate(items):
        inst.id = number
        inst.deps = [Dependency(source, DepKind.FLOW) for source in range(number)]
    fn = Function(
        "main", {loc.name: loc for loc in locations}, ["a", "b"], ["y"], BasicBlock("Block1")
    )
    fn.entry.items = items
    return Module("rules", [fn])


CASES = {
    "ENGINE-OPCODE": {"matmul_engine": Engine.ACT},
    "OPERAND-MEMORY": {"matmul_dst": "so"},
    "POOL-PSUM": {"copy_engine": Engine.POOL},
    "PARTITION-START": {"copy_start": 16},
    "FREE-DIMS": {"copy_dims": 5},
    "PE-SHAPE": {"moving_partitions": 3},
    "PE-DTYPE": {"operand_dtype": Dtype.INT32},
    "PE-PSUM-FP32": {"psum_dtype": Dtype.BF16},
    "PSUM-BANK": {"psum_address": 2040},
    "TT-PSUM-INPUTS": {"tensor_tensor_on_psum": True},
    "ACT-RANGE": {"sine_scale": 1.0},  # |aᵀ·b| reaches 5.2
    "ACT-TENSOR-COPY": {"copy_engine": Engine.ACT},
    "FREE-SIZE": {"psum_repeat": 513},  # 4104 elements from PSUM
    "AP-FIELD-BITS": {"out_stride": 32768},
    "PSUM-ACCUMULATE": {"accumulate_only": True},  # onto PSUM nothing wrote
}


def _run(tmp_path: Path, module: Module, capsys) -> tuple[int, str]:
    code, err, _ = run_program(tmp_path, module, {"a": A, "b": B}, capsys)
    return code, err


def test_the_program_keeping_every_rule_runs(tmp_path, capsys):
    code, err = _run(tmp_path, _program(), capsys)
    assert code == 0, err
    with np.load(tmp_path / "out.npz") as saved:
        np.testing.assert_allclose(saved["y"], A.T @ B, rtol=1e-6, atol=1e-6)
    # A variant that moves without breaking anything still runs: the cases below are the rules.
    assert _run(tmp_path, _program(copy_start=32, psum_address=2048), capsys)[0] == 0


@pytest.mark.parametrize("rule", list(CASES))
def test_a_program_breaking_one_rule_is_refused_with_its_id(tmp_path, capsys, rule):
    code, err = _run(tmp_path, _program(**CASES[rule]), capsys)
    assert code == 1, err
    assert f"{rule}: " in err and RULES[rule].fact in err
    others = [other for other in RULES if other != rule and f"{other}: " in err]
    assert not others, others  # only that rule


def test_every_machine_rule_has_a_case_here_or_beside_its_feature():
    elsewhere = {
        "DMA-OOB": "test_indirect_dma.py",
        "PARALLEL-HAZARD": "test_parallel_loops.py",
        "INT64-DATAPATH": "test_integer_datapaths.py",
        "ALU-BITVEC": "test_bitvec_alu.py",
        "NARROWING-CHECKED": "../codegen/test_model_dtypes.py",
    }
    assert set(RULES) == set(CASES) | set(elsewhere)
    for name in elsewhere.values():
        assert (Path(__file__).parent / name).exists()


# The same programs keeping the rule, and what they compute.
PRODUCT = A.T @ B
KEEPING = {
    "ACT-RANGE": ({"sine_scale": 0.5}, np.sin(0.5 * PRODUCT)),  # inside [-pi, pi]
    "ACT-TENSOR-COPY": ({"copy_engine": Engine.ACT, "copy_as_activation": True}, PRODUCT),
    "FREE-SIZE": ({"psum_repeat": 512}, PRODUCT),
    "AP-FIELD-BITS": ({"out_stride": 32767}, PRODUCT),
    "PSUM-ACCUMULATE": ({"accumulate_twice": True}, 2 * PRODUCT),
}


@pytest.mark.parametrize("rule", list(KEEPING))
def test_the_program_keeping_a_rule_computes_its_numbers(tmp_path, capsys, rule):
    changes, expected = KEEPING[rule]
    code, err = _run(tmp_path, _program(**changes), capsys)
    assert code == 0, err
    with np.load(tmp_path / "out.npz") as saved:
        np.testing.assert_allclose(saved["y"], expected, rtol=1e-6, atol=1e-6)


def test_a_matmul_accumulating_onto_psum_another_engine_rewrote_is_refused(tmp_path, capsys):
    """The bytes hold the same values, but VectorE wrote them last: no partial sum."""
    code, err = _run(tmp_path, _program(rewrite_psum_between=True), capsys)
    assert code == 1, err
    assert "PSUM-ACCUMULATE: " in err and "instruction 4 Matmult" in err
