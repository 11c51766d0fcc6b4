"""Cost model: per-instruction formulas (docs/neuroncore.md#cost-model) and the list schedule."""

from __future__ import annotations

import pytest

from onnx2bir.bir.enums import DepKind, Dtype, Engine, MemoryKind, MemoryType, Opcode
from onnx2bir.bir.ir import (
    AccessPattern,
    BasicBlock,
    Dependency,
    Function,
    Instruction,
    Loop,
    MemoryLocation,
    Module,
    Origin,
)
from onnx2bir.runtime.cost import DEFAULT_TABLE, estimate, instruction_cost

ORIGIN = Origin("n", "test")


def tile(name, partitions, elems, dtype=Dtype.FP32, memory=MemoryType.SB):
    nbytes = elems * dtype.itemsize
    shape = (partitions, elems)
    return MemoryLocation(name, memory, MemoryKind.INTERNAL, dtype, shape, partitions, 0, nbytes)


LOCS = [
    tile("s32", 128, 512),
    tile("s16", 128, 512, Dtype.BF16),
    tile("p", 128, 512, memory=MemoryType.PSUM),
    MemoryLocation("d", MemoryType.DRAM, MemoryKind.EXTERNAL_INPUT, Dtype.FP32, (128, 512)),
]
FUNCTION = Function("f", {loc.name: loc for loc in LOCS})


def ap(name, parts, n):
    if name == "d":
        return AccessPattern(name, ((1, parts * n),))
    return AccessPattern(name, ((1, n),), 0, (), 0, parts)


def ins(opcode, engine, dst, srcs, ins_id=0, deps=(), **attrs):
    dependencies = [Dependency(d, DepKind.FLOW) for d in deps]
    return Instruction(opcode, engine, dst, srcs, attrs, ORIGIN, ins_id, (), dependencies)


def matmul(m_size, n, dtype, ins_id=0, deps=()):
    name = "s32" if dtype is Dtype.FP32 else "s16"
    srcs = {"stationary": ap(name, 128, m_size), "moving": ap(name, 128, n)}
    return ins(Opcode.MATMULT, Engine.PE, ap("p", m_size, n), srcs, ins_id, deps, accumulate=False)


def act(n, ins_id=0, deps=()):
    src = {"in": ap("s32", 128, n)}
    return ins(Opcode.ACTIVATION, Engine.ACT, ap("s32", 128, n), src, ins_id, deps, func="exp")


def dma(n, queue, ins_id=0, deps=()):
    src = {"in": ap("d", 128, n)}
    return ins(Opcode.DMA_COPY, Engine.DMA, ap("s32", 128, n), src, ins_id, deps, queue=queue)


def cycles(instruction):
    return instruction_cost(instruction, FUNCTION)[0]


@pytest.mark.parametrize(
    "m_size, n, dtype, expected",
    [(128, 512, Dtype.BF16, 512), (128, 512, Dtype.FP32, 2048), (32, 16, Dtype.BF16, 32)],
)
def test_matmul_cycles(m_size, n, dtype, expected):
    assert cycles(matmul(m_size, n, dtype)) == expected


def test_engine_formulas():
    assert cycles(act(10)) == 64 and cycles(act(1000)) == 1000
    sb_sb = {"in0": ap("s32", 128, 100), "in1": ap("s32", 128, 100)}
    assert cycles(ins(Opcode.TENSOR_TENSOR, Engine.DVE, ap("s32", 128, 100), sb_sb)) == 200
    sb_ps = {"in0": ap("s32", 128, 100), "in1": ap("p", 128, 100)}
    assert cycles(ins(Opcode.TENSOR_TENSOR, Engine.DVE, ap("s32", 128, 100), sb_ps)) == 100
    one_in = {"in": ap("s32", 128, 30)}
    assert cycles(ins(Opcode.TENSOR_REDUCE, Engine.DVE, ap("s32", 128, 1), one_in)) == 64
    assert cycles(ins(Opcode.IOTA, Engine.POOL, ap("s32", 128, 10), {})) == 160
    _, seconds, moved = instruction_cost(dma(512, 0), FUNCTION)
    assert moved == 128 * 512 * 4
    assert seconds == pytest.approx(1.3e-6 + moved / 27e9)
    # Seconds follow each engine's clock.
    assert instruction_cost(act(1400), FUNCTION)[1] == pytest.approx(1400 / 1.4e9)
    assert DEFAULT_TABLE.clock(Engine.DVE) == 1.12e9


def _module(items):
    fn = Function("f", FUNCTION.memory_locations, entry=BasicBlock("Block1", items))
    return Module("m", [fn])


def test_schedule_overlaps_engines_and_respects_dependencies():
    t_act, t_mm = 1000 / 1.4e9, 512 / 2.8e9
    independent = estimate(_module([act(1000, 1), matmul(128, 512, Dtype.BF16, 2)]))
    assert independent.total_seconds == pytest.approx(max(t_act, t_mm))
    dependent = estimate(_module([act(1000, 1), matmul(128, 512, Dtype.BF16, 2, deps=[1])]))
    assert dependent.total_seconds == pytest.approx(t_act + t_mm)
    same_engine = estimate(_module([act(1000, 1), act(1000, 2)]))
    assert same_engine.total_seconds == pytest.approx(2 * t_act)
    assert same_engine.instruction_counts == {Engine.ACT: 2}
    assert same_engine.busy_cycles == {Engine.ACT: 2000}


def test_dma_queues_run_in_parallel():
    t_dma = instruction_cost(dma(512, 0), FUNCTION)[1]
    two_queues = estimate(_module([dma(512, 0, 1), dma(512, 1, 2)]))
    one_queue = estimate(_module([dma(512, 0, 1), dma(512, 0, 2)]))
    assert two_queues.total_seconds == pytest.approx(t_dma)
    assert one_queue.total_seconds == pytest.approx(2 * t_dma)
    assert two_queues.busy_seconds[Engine.DMA] == pytest.approx(2 * t_dma)
    assert two_queues.dma_bytes == 2 * 128 * 512 * 4
    assert Engine.DMA not in two_queues.busy_cycles


def test_loops_scale_by_trip_count():
    t_act, t_mm = 1000 / 1.4e9, 512 / 2.8e9
    body = BasicBlock("block0", [act(1000, 1), matmul(128, 512, Dtype.BF16, 2, deps=[1])])
    inner = Loop("j", 0, 3, body=body)
    outer = Loop("i", 0, 4, step=2, body=BasicBlock("block0", [inner]))  # 2 trips
    after = act(1000, 3, deps=[2])
    report = estimate(_module([outer, after]))
    assert report.instruction_counts == {Engine.ACT: 7, Engine.PE: 6}
    assert report.busy_cycles[Engine.PE] == 6 * 512
    # Iterations run back to back: 6 x (act then dependent matmul), then the last act.
    assert report.total_seconds == pytest.approx(6 * (t_act + t_mm) + t_act)
    assert "ACT" in report.summary() and "us" in report.summary()


def test_empty_loop_and_function():
    report = estimate(_module([Loop("i", 0, 0, body=BasicBlock("block0", [act(10, 1)]))]))
    assert report.total_seconds == 0.0 and report.instruction_counts == {}


def test_an_iteration_that_waits_for_earlier_work_does_not_repeat_the_wait():
    """A loop body whose first instruction starts early (free engine, no dependency) and whose
    second waits for a long instruction before the loop: only the first iteration waits."""
    t_act, t_mm = 1000 / 1.4e9, 512 / 2.8e9
    long_before = act(1000, 1)
    body = BasicBlock(
        "block0", [matmul(128, 512, Dtype.BF16, 2), matmul(128, 512, Dtype.BF16, 3, deps=[1])]
    )
    report = estimate(_module([long_before, Loop("i", 0, 8, body=body)]))
    # First iteration ends at t_act + t_mm; the 7 others each take the two matmuls in a row.
    assert report.total_seconds == pytest.approx(t_act + t_mm + 7 * 2 * t_mm)
    assert report.total_seconds < t_act + 8 * 2 * t_mm + 1e-12
