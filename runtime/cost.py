"""A cost model for BIR: per-engine busy time and a list-schedule estimate of total time.

In: a Module (one function of it). Out: a `CostReport` with per-engine busy cycles and seconds,
instruction counts per engine, DMA bytes, and the makespan of a simple list schedule.

Per-instruction cost (trainium_facts.md §3 and §6, NeuronCore-v2), N = elements per partition:
- PE Matmult: max(N_moving, min(64, M_stationary)) cycles, x4 when the operands are fp32.
- ACT (any opcode): max(64, N). DVE: max(64, N) with one input, max(64, 2N) for TensorTensor with
  both inputs in SBUF (max(64, N) when one is in PSUM). POOL: 150 + N.
- DMA: 1.3 us fixed + bytes / 27 GB/s; each DMA queue is its own resource.
N is the largest free size among the instruction's operands.

Schedule: items are taken in program order; an instruction starts when its engine (DMA: its
queue) is free and every `deps` source has finished. Approximation: a Loop's body is simulated
once and its iterations are assumed to run back to back without overlapping, so the loop takes
trip_count x (span of one iteration); busy time and counts scale by the trip count exactly.
Loop-carried edges (`carried_by`), and dependencies on instructions not yet scheduled, are
ignored (iterations do not overlap here anyway). The ~100-cycle overhead of dependent tiny
instructions and port conflicts are not modelled.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from onnx2bir.bir.enums import Dtype, Engine, MemoryType, Opcode
from onnx2bir.bir.ir import BasicBlock, Function, Instruction, Loop, Module


@dataclass(frozen=True)
class CostTable:
    """Every constant of the model, with its source in trainium_facts.md."""

    clock_hz: tuple[tuple[Engine, float], ...] = (
        (Engine.PE, 2.8e9),  # §2 TensorE clock
        (Engine.ACT, 1.4e9),  # §2 ScalarE clock
        (Engine.POOL, 1.4e9),  # §2 GpSimd clock
        (Engine.DVE, 1.12e9),  # §2 VectorE clock
    )
    min_ii: int = 64  # §3 MIN_II, the minimum initiation interval of ACT/DVE instructions
    matmul_min_stationary: int = 64  # §3.1 max(min(64, N_stationary), N_moving)
    matmul_fp32_factor: int = 4  # §3.1 fp32 matmul runs at 1/4 rate
    pool_startup: int = 150  # §3.4 GpSimd start-up cycles
    dma_fixed_s: float = 1.3e-6  # §2 DMA ~1300 ns semaphore-to-start latency
    dma_bytes_per_s: float = 27e9  # §2 DMA per-engine bandwidth (27 GB/s, S1/S10)

    def clock(self, engine: Engine) -> float:
        return dict(self.clock_hz)[engine]


DEFAULT_TABLE = CostTable()


@dataclass
class CostReport:
    """Estimated cost of one function."""

    function: str
    busy_cycles: dict[Engine, float]  # compute engines, in each engine's own clock
    busy_seconds: dict[Engine, float]  # DMA: summed over queues, so it may exceed total_seconds
    instruction_counts: dict[Engine, int]
    dma_bytes: int
    total_seconds: float  # list-schedule makespan

    def summary(self) -> str:
        """A small text table: engine, instructions, busy time, share of the total."""
        lines = [f"{self.function}: estimated {self.total_seconds * 1e6:.2f} us"]
        for engine in Engine:
            busy = self.busy_seconds.get(engine, 0.0)
            share = busy / self.total_seconds if self.total_seconds else 0.0
            lines.append(
                f"  {engine:<5} {self.instruction_counts.get(engine, 0):>8} instr "
                f"{busy * 1e6:>10.2f} us busy {share:>7.1%}"
            )
        lines.append(f"  DMA bytes {self.dma_bytes}")
        return "\n".join(lines)


def instruction_cost(
    ins: Instruction, function: Function, table: CostTable = DEFAULT_TABLE
) -> tuple[float, float, int]:
    """(engine cycles, seconds, DMA bytes) of one execution of ins; DMA cycles are 0."""
    locations = function.memory_locations
    operands = list(ins.srcs.values()) + ([ins.dst] if ins.dst is not None else [])
    if ins.engine is Engine.DMA:
        moved = max(ap.num_elements * locations[ap.loc].dtype.itemsize for ap in operands)
        return 0.0, table.dma_fixed_s + moved / table.dma_bytes_per_s, moved
    n = max((ap.free_size for ap in operands), default=1)
    if ins.engine is Engine.PE:
        stationary, moving = ins.srcs["stationary"], ins.srcs["moving"]
        fp32 = any(locations[ap.loc].dtype is Dtype.FP32 for ap in (stationary, moving))
        m_size = min(table.matmul_min_stationary, stationary.free_size)
        cycles = max(moving.free_size, m_size) * (table.matmul_fp32_factor if fp32 else 1)
    elif ins.engine is Engine.POOL:
        cycles = table.pool_startup + n
    elif ins.engine is Engine.DVE and ins.opcode is Opcode.TENSOR_TENSOR:
        in_psum = any(locations[ap.loc].memory is MemoryType.PSUM for ap in ins.srcs.values())
        cycles = max(table.min_ii, n if in_psum else 2 * n)
    else:  # ACT, and DVE with one input
        cycles = max(table.min_ii, n)
    return float(cycles), cycles / table.clock(ins.engine), 0


@dataclass
class _Frame:
    """What one pass over a block touched, so a loop can scale it."""

    ids: set[int] = field(default_factory=set)
    resources: set = field(default_factory=set)
    start: float = math.inf
    end: float = -math.inf


class _Schedule:
    def __init__(self, function: Function, table: CostTable):
        self.function, self.table = function, table
        self.free: dict[object, float] = {}
        self.finish: dict[int, float] = {}
        self.cycles: dict[Engine, float] = {}
        self.seconds: dict[Engine, float] = {}
        self.counts: dict[Engine, int] = {}
        self.dma_bytes = 0

    def block(self, block: BasicBlock, frame: _Frame, repeat: int) -> None:
        for item in block.items:
            if isinstance(item, Loop):
                self.loop(item, frame, repeat)
            else:
                self.instruction(item, frame, repeat)

    def instruction(self, ins: Instruction, frame: _Frame, repeat: int) -> None:
        cycles, seconds, moved = instruction_cost(ins, self.function, self.table)
        resource = (ins.engine, ins.attrs.get("queue")) if ins.engine is Engine.DMA else ins.engine
        ready = max(
            (self.finish.get(d.source, 0.0) for d in ins.deps if d.carried_by is None),
            default=0.0,
        )
        start = max(self.free.get(resource, 0.0), ready)
        self.free[resource] = self.finish[ins.id] = start + seconds
        engine = ins.engine
        self.cycles[engine] = self.cycles.get(engine, 0.0) + cycles * repeat
        self.seconds[engine] = self.seconds.get(engine, 0.0) + seconds * repeat
        self.counts[engine] = self.counts.get(engine, 0) + repeat
        self.dma_bytes += moved * repeat
        frame.ids.add(ins.id)
        frame.resources.add(resource)
        frame.start, frame.end = min(frame.start, start), max(frame.end, start + seconds)

    def loop(self, loop: Loop, outer: _Frame, repeat: int) -> None:
        trips = loop.trip_count
        if trips == 0:
            return
        body = _Frame()
        self.block(loop.body, body, repeat * trips)
        if not body.ids:
            return
        # One iteration simulated; the other trips - 1 follow it back to back.
        shift = (trips - 1) * (body.end - body.start)
        for ins_id in body.ids:
            self.finish[ins_id] += shift
        for resource in body.resources:
            self.free[resource] += shift
        outer.ids |= body.ids
        outer.resources |= body.resources
        outer.start, outer.end = min(outer.start, body.start), max(outer.end, body.end + shift)


def estimate(
    module: Module, function_name: str | None = None, table: CostTable = DEFAULT_TABLE
) -> CostReport:
    """Cost report of one function of module (the first if unnamed)."""
    if function_name is not None:
        function = module.function(function_name)
    elif module.functions:
        function = module.functions[0]
    else:
        raise ValueError(f"module {module.name!r} has no function")
    schedule = _Schedule(function, table)
    top = _Frame()
    schedule.block(function.entry, top, 1)
    return CostReport(
        function=function.name,
        busy_cycles={e: c for e, c in schedule.cycles.items() if e is not Engine.DMA},
        busy_seconds=schedule.seconds,
        instruction_counts=schedule.counts,
        dma_bytes=schedule.dma_bytes,
        total_seconds=max(top.end, 0.0),
    )
