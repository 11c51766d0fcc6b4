"""Cost model: per-instruction formulas (docs/neuroncore.md#cost-model) and the list schedule."""

from __future__ import annotations

import dataclasses

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
from onnx2bir.runtime.timing.cost import DEFAULT_TABLE, CostTable, estimate, instruction_cost

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


def dma4(n, queue, ins_id=0, deps=()):
    src = {"in": AccessPattern("d", ((1, 4 * n),))}
    return ins(Opcode.DMA_COPY, Engine.DMA, ap("s32", 4, n), src, ins_id, deps, queue=queue)


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
    # 128 partitions spread over 16 DMA engines of 27 GB/s each.
    assert seconds == pytest.approx(0.6e-6 + moved / (16 * 27e9))
    small = instruction_cost(dma4(512, 0), FUNCTION)
    assert small[1] == pytest.approx(0.6e-6 + 4 * 512 * 4 / 27e9)  # 4 partitions: 1 engine
    # Seconds follow each engine's clock.
    assert instruction_cost(act(1400), FUNCTION)[1] == pytest.approx(1400 / 1.4e9)
    assert DEFAULT_TABLE.clock(Engine.DVE) == 1.12e9


def _module(items):
    fn = Function("f", FUNCTION.memory_locations, entry=BasicBlock("Block1", items))
    return Module("m", [fn])


T_ACT, T_MM = 1000 / 1.4e9, 512 / 2.8e9  # act(1000) and a 128x512 bf16 matmul
SEM_PE, SEM_ACT = 100 / 2.8e9, 100 / 1.4e9  # semaphore wait, in the waiting engine's clock


def test_pe_dtype_option_costs_fp32_operands_as_the_cast_dtype():
    fp32 = matmul(128, 512, Dtype.FP32)
    assert instruction_cost(fp32, FUNCTION)[0] == 2048
    assert instruction_cost(fp32, FUNCTION, CostTable(pe_dtype=Dtype.BF16))[0] == 512


def test_schedule_overlaps_engines_and_dependencies_pay_the_semaphore():
    independent = estimate(_module([act(1000, 1), matmul(128, 512, Dtype.BF16, 2)]))
    assert independent.total_seconds == pytest.approx(max(T_ACT, T_MM))
    dependent = estimate(_module([act(1000, 1), matmul(128, 512, Dtype.BF16, 2, deps=[1])]))
    assert dependent.total_seconds == pytest.approx(T_ACT + SEM_PE + T_MM)
    same_engine = estimate(_module([act(1000, 1), act(1000, 2, deps=[1])]))
    assert same_engine.total_seconds == pytest.approx(2 * T_ACT)  # no semaphore in one stream
    assert same_engine.instruction_counts == {Engine.ACT: 2}
    assert same_engine.busy_cycles == {Engine.ACT: 2000}
    assert dependent.flops == 2 * 128 * 128 * 512


def test_a_dma_waiting_on_an_engine_pays_the_semaphore_latency_and_back_to_back_dmas_do_not():
    t_dma = instruction_cost(dma4(512, 0), FUNCTION)[1]
    after_act = estimate(_module([act(1000, 1), dma4(512, 0, 2, deps=[1])]))
    # The transfer starts 1.3 us after the semaphore (its 0.6 us issue included).
    transfer = t_dma - 0.6e-6
    assert after_act.total_seconds == pytest.approx(T_ACT + 1.3e-6 + transfer)
    back_to_back = estimate(_module([dma4(512, 0, 1), dma4(512, 0, 2, deps=[1])]))
    assert back_to_back.total_seconds == pytest.approx(2 * t_dma)


def test_dma_queues_run_in_parallel_until_the_shared_bandwidth_binds():
    t_dma = instruction_cost(dma4(512, 0), FUNCTION)[1]
    two_queues = estimate(_module([dma4(512, 0, 1), dma4(512, 1, 2)]))
    one_queue = estimate(_module([dma4(512, 0, 1), dma4(512, 0, 2)]))
    assert two_queues.total_seconds == pytest.approx(t_dma)
    assert one_queue.total_seconds == pytest.approx(2 * t_dma)
    assert two_queues.busy_seconds[Engine.DMA] == pytest.approx(2 * t_dma)
    assert two_queues.stream_busy_seconds == pytest.approx({"DMA q0": t_dma, "DMA q1": t_dma})
    assert two_queues.dma_bytes == 2 * 4 * 512 * 4
    assert Engine.DMA not in two_queues.busy_cycles
    # 16 queues of 256 KiB: the core's 272 GB/s, not 16 x 432 GB/s, drains all the bytes.
    many = estimate(_module([dma(512, q, q + 1) for q in range(16)]))
    nbytes = 128 * 512 * 4
    assert many.total_seconds == pytest.approx(0.6e-6 + 16 * nbytes / 272e9)
    # Sixteen reads of one graph input: its size once is compulsory, the rest is not.
    assert many.compulsory_dma_bytes == nbytes


def test_loop_iterations_pipeline_across_engines():
    """act then a dependent matmul per trip: the ACT stream runs the trips back to back and
    the matmuls trail behind, so the loop costs trips x t_act, not trips x (t_act + t_mm)."""
    for trips in (3, 10):  # all simulated; and 3 simulated + a steady state of 7
        body = BasicBlock("block0", [act(1000, 1), matmul(128, 512, Dtype.BF16, 2, deps=[1])])
        after = act(1000, 3, deps=[2])
        report = estimate(_module([Loop("i", 0, trips, body=body), after]))
        assert report.instruction_counts == {Engine.ACT: trips + 1, Engine.PE: trips}
        assert report.busy_cycles[Engine.PE] == trips * 512
        expected = trips * T_ACT + SEM_PE + T_MM + SEM_ACT + T_ACT
        assert report.total_seconds == pytest.approx(expected)


def test_nested_loops_scale_by_trip_count():
    body = BasicBlock("block0", [act(1000, 1), matmul(128, 512, Dtype.BF16, 2, deps=[1])])
    inner = Loop("j", 0, 5, body=body)
    outer = Loop("i", 0, 8, step=2, body=BasicBlock("block0", [inner]))  # 4 trips
    report = estimate(_module([outer]))
    assert report.instruction_counts == {Engine.ACT: 20, Engine.PE: 20}
    assert report.total_seconds == pytest.approx(20 * T_ACT + SEM_PE + T_MM)
    assert "ACT" in report.summary() and "us" in report.summary()


def test_loop_carried_dependency_serialises_the_trips():
    """act waits for the previous trip's matmul (an edge to a later body instruction)."""
    body = BasicBlock("block0", [act(1000, 1, deps=[2]), matmul(128, 512, Dtype.BF16, 2, deps=[1])])
    report = estimate(_module([Loop("i", 0, 6, body=body)]))
    assert report.total_seconds == pytest.approx(6 * (T_ACT + SEM_PE + T_MM) + 5 * SEM_ACT)


def test_empty_loop_and_function():
    report = estimate(_module([Loop("i", 0, 0, body=BasicBlock("block0", [act(10, 1)]))]))
    assert report.total_seconds == 0.0 and report.instruction_counts == {}


def test_an_iteration_that_waits_for_earlier_work_does_not_repeat_the_wait():
    """A loop body whose first instruction starts early (free engine, no dependency) and whose
    second waits for a long instruction before the loop: only the first iteration waits."""
    long_before = act(1000, 1)
    body = BasicBlock(
        "block0", [matmul(128, 512, Dtype.BF16, 2), matmul(128, 512, Dtype.BF16, 3, deps=[1])]
    )
    report = estimate(_module([long_before, Loop("i", 0, 8, body=body)]))
    # First iteration ends at t_act + semaphore + t_mm; the 7 others take two matmuls each.
    assert report.total_seconds == pytest.approx(T_ACT + SEM_PE + T_MM + 7 * 2 * T_MM)


def test_critical_path_and_top_nodes():
    a = act(1000, 1)
    a.origin = Origin("slow", "rule_a")
    m = matmul(128, 512, Dtype.BF16, 2, deps=[1])
    m.origin = Origin("fast", "rule_m")
    report = estimate(_module([a, m]))
    assert [(r["node"], r["stream"]) for r in report.critical_path] == [
        ("slow", "ACT"),
        ("fast", "PE"),
    ]
    assert [n["node"] for n in report.top_nodes] == ["slow", "fast"]
    assert report.top_nodes[0]["rule"] == "rule_a"


@dataclasses.dataclass(frozen=True)
class CarriedDependency:
    """A dependency with the fields a loop-carried edge adds (carrying loop, distance)."""

    source: int
    kind: DepKind
    loop: str = "i"
    distance: int = 1


def test_a_carried_edge_to_an_earlier_instruction_waits_for_the_previous_trip():
    """matmul (2) waits for act (1) of the previous trip; act never waits: ACT runs ahead."""
    first = matmul(128, 512, Dtype.BF16, 2)
    first.deps = [CarriedDependency(1, DepKind.FLOW)]
    body = BasicBlock("block0", [act(1000, 1), first])
    report = estimate(_module([Loop("i", 0, 6, body=body)]))
    # Trip 0's matmul has no previous act; trip k's waits for act k-1, which ended at k x t_act.
    assert report.total_seconds == pytest.approx(6 * T_ACT)
    plain = estimate(
        _module(
            [
                Loop(
                    "i",
                    0,
                    6,
                    body=BasicBlock("b", [act(1000, 1), matmul(128, 512, Dtype.BF16, 2, deps=[1])]),
                )
            ]
        )
    )
    assert plain.total_seconds == pytest.approx(6 * T_ACT + SEM_PE + T_MM)


# The on-chip ports (docs/device_time.md#on-chip-ports): NeuronCore-v2's architecture guide says
# VectorE and GpSimdE cannot access SBUF in parallel, nor VectorE and ScalarE PSUM; the
# compiler serialises such instructions. Each case pairs two independent instructions on two
# engines with their times derived from the engine formulas above.
T_DVE = 1000 / 1.12e9  # a one-input DVE instruction of 1000 elements


def dve_copy(ins_id, src="s32", dst="s32", n=1000):
    return ins(Opcode.TENSOR_COPY, Engine.DVE, ap(dst, 128, n), {"in": ap(src, 128, n)}, ins_id)


def pool_copy(ins_id, n=1000):
    src = {"in": ap("s32", 128, n)}
    return ins(Opcode.TENSOR_COPY, Engine.POOL, ap("s32", 128, n), src, ins_id)


def act_from(src, ins_id, n=1000):
    src_ap = {"in": ap(src, 128, n)}
    return ins(Opcode.ACTIVATION, Engine.ACT, ap("s32", 128, n), src_ap, ins_id, func="exp")


T_POOL = (150 + 1000) / 1.4e9


def test_dve_and_pool_take_turns_on_sbuf():
    both = estimate(_module([dve_copy(1), pool_copy(2)]))
    assert both.total_seconds == pytest.approx(T_DVE + T_POOL)
    apart = estimate(_module([dve_copy(1), pool_copy(2)]), table=CostTable(shared_ports=False))
    assert apart.total_seconds == pytest.approx(max(T_DVE, T_POOL))
    # The waiting engine counts the wait as busy; the sum of busy times bounds the estimate.
    assert sum(both.stream_busy_seconds.values()) >= both.total_seconds


def test_dve_and_act_take_turns_on_psum_but_not_on_sbuf():
    on_psum = estimate(_module([dve_copy(1, src="p"), act_from("p", 2)]))
    assert on_psum.total_seconds == pytest.approx(T_DVE + T_ACT)
    on_sbuf = estimate(_module([dve_copy(1), act_from("s32", 2)]))
    assert on_sbuf.total_seconds == pytest.approx(max(T_DVE, T_ACT))
    # ACT reading SBUF while DVE reads PSUM: different ports.
    mixed = estimate(_module([dve_copy(1, src="p", dst="p"), act_from("s32", 2)]))
    assert mixed.total_seconds == pytest.approx(max(T_DVE, T_ACT))


def test_a_port_user_takes_the_first_gap_it_fits():
    """POOL (1000 elements) is met first and takes SBUF; DVE waits for it; the next POOL
    instruction, free to start when its stream is, finds SBUF held by DVE and follows it."""
    first = estimate(_module([pool_copy(1), dve_copy(2)]))
    assert first.total_seconds == pytest.approx(T_POOL + T_DVE)
    chain = estimate(_module([pool_copy(1), dve_copy(2), pool_copy(3, n=64)]))
    assert chain.total_seconds == pytest.approx(T_POOL + T_DVE + (150 + 64) / 1.4e9)


def test_a_wide_innermost_stride_halves_an_engines_bandwidth():
    """Stride 4 of fp32 is 16 bytes (full rate); stride 8 is 32 bytes (twice the cycles); a
    stride on an outer dim, or a broadcast (stride 0), costs nothing."""

    def copy_with(pattern):
        src = {"in": AccessPattern("s32", pattern, 0, (), 0, 128)}
        return cycles(ins(Opcode.TENSOR_COPY, Engine.DVE, ap("s32", 128, 100), src))

    assert copy_with(((4, 100),)) == 100
    assert copy_with(((8, 100),)) == 200
    assert copy_with(((400, 2), (1, 50))) == 100
    assert copy_with(((0, 100),)) == 100
    assert copy_with(((8, 100), (1, 1))) == 200  # a one-element dim is not the minor one
    # bf16 elements: stride 8 is 16 bytes (full rate), 9 is 18 bytes.
    src16 = {"in": AccessPattern("s16", ((9, 50),), 0, (), 0, 128)}
    assert cycles(ins(Opcode.TENSOR_COPY, Engine.DVE, ap("s16", 128, 50), src16)) == 128
