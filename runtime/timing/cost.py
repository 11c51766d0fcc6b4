"""A cost model for BIR: per-instruction cost and the estimated device time.

In: a Module (one function of it). Out: a `CostReport`: estimated device time from the
event-driven simulation of every engine and DMA queue (runtime/timing/device_time.py), busy time per
engine kind and per stream, instruction counts, DMA bytes (compulsory and the rest), matmul FLOPs,
the critical path and the most expensive ONNX nodes (runtime/timing/summary.py).

Per-instruction cost (docs/device_time.md#instruction-costs, NeuronCore-v2), N = elements per
partition, the largest free size among the instruction's operands:
- PE Matmult: max(N_moving, min(64, M_stationary)) cycles, x4 when an operand is fp32 (the
  table's `pe_dtype`, when set, stands for the dtype fp32 operands would be cast to).
- ACT (any opcode): max(64, N). DVE: max(64, N) with one input, max(64, 2N) for TensorTensor with
  both inputs in SBUF (max(64, N) when one is in PSUM). POOL: 150 + N.
- ACT, DVE and POOL take twice as long when an on-chip operand's innermost free stride is wider
  than 16 bytes (half the SBUF/PSUM bandwidth).
- DMA: 0.6 us to issue + bytes / (engines x 27 GB/s), a transfer spreading over one DMA engine
  per 8 partitions (16 engines for 128 partitions or DRAM to DRAM); the core's DMA engines share
  272 GB/s (the simulation's shared resource). A DMA that waits on another stream's semaphore
  starts its transfer 1.3 us after it (its issue included).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from onnx2bir.bir.costs import DEFAULT_TABLE, CostTable
from onnx2bir.bir.enums import Dtype, Engine, MemoryType, Opcode
from onnx2bir.bir.ir import Function, Instruction, Module


@dataclass
class CostReport:
    """Estimated cost of one function."""

    function: str
    busy_cycles: dict[Engine, float]  # compute engines, in each engine's own clock
    busy_seconds: dict[Engine, float]  # DMA: summed over queues, so it may exceed total_seconds
    instruction_counts: dict[Engine, int]
    dma_bytes: int
    total_seconds: float  # simulated device time
    stream_busy_seconds: dict[str, float] = field(default_factory=dict)  # each engine, queue
    # the sizes of the weights, constants, graph inputs and outputs that DMAs touch: the
    # traffic no program can avoid (capped by dma_bytes)
    compulsory_dma_bytes: int = 0
    # bytes read out of each weight and constant, every loop trip counted
    payload_dma_bytes: dict[str, int] = field(default_factory=dict)
    flops: int = 0  # matmul FLOPs (2 x K x M x N per Matmult)
    pe_peak_flops: float = DEFAULT_TABLE.pe_peak_flops
    critical_path: list[dict] = field(default_factory=list)
    top_nodes: list[dict] = field(default_factory=list)

    @property
    def achieved_flops(self) -> float:
        return self.flops / self.total_seconds if self.total_seconds else 0.0

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
        lines.append(f"  DMA bytes {self.dma_bytes} (DMA busy summed over its queues)")
        return "\n".join(lines)


def _pe_factor(stationary, moving, function: Function, table: CostTable) -> int:
    locations = function.memory_locations
    dtypes = [locations[ap.loc].dtype for ap in (stationary, moving)]
    if table.pe_dtype is not None:
        dtypes = [table.pe_dtype if d is Dtype.FP32 else d for d in dtypes]
    return table.matmul_fp32_factor if Dtype.FP32 in dtypes else 1


def matmul_flops(ins: Instruction) -> int:
    """2 x K x M x N of a Matmult (K partitions, M stationary columns, N moving columns)."""
    if ins.opcode is not Opcode.MATMULT:
        return 0
    stationary, moving = ins.srcs["stationary"], ins.srcs["moving"]
    k = moving.num_partitions or 1
    return 2 * k * stationary.free_size * moving.free_size


def instruction_cost(
    ins: Instruction, function: Function, table: CostTable = DEFAULT_TABLE
) -> tuple[float, float, int]:
    """(engine cycles, seconds, DMA bytes) of one execution of ins; DMA cycles are 0.

    A DMA's seconds are its own queue's time with the bandwidth to itself; the simulation adds
    the wait for the core's shared bandwidth."""
    locations = function.memory_locations
    operands = list(ins.srcs.values()) + ([ins.dst] if ins.dst is not None else [])
    if ins.opcode is Opcode.DMA_GATHER:
        # One descriptor per gathered row: its bytes, at least the size below which a
        # transfer is all overhead; never the table's size (docs/device_time.md#dma).
        dst = ins.dst
        row_bytes = dst.free_size * locations[dst.loc].dtype.itemsize
        rows = max(1, dst.num_partitions)
        charged = rows * max(row_bytes, table.dma_descriptor_min_bytes)
        engines = min(table.dma_engines, math.ceil(rows / table.dma_partitions_per_engine))
        return (
            0.0,
            table.dma_issue_s + charged / (engines * table.dma_bytes_per_s),
            rows * row_bytes,
        )
    if ins.engine is Engine.DMA:
        moved = max(ap.num_elements * locations[ap.loc].dtype.itemsize for ap in operands)
        partitions = max((ap.num_partitions for ap in operands), default=0)
        engines = table.dma_engines
        if partitions:
            engines = min(engines, math.ceil(partitions / table.dma_partitions_per_engine))
        return 0.0, table.dma_issue_s + moved / (engines * table.dma_bytes_per_s), moved
    n = max((ap.free_size for ap in operands), default=1)
    if ins.engine is Engine.PE:
        stationary, moving = ins.srcs["stationary"], ins.srcs["moving"]
        m_size = min(table.matmul_min_stationary, stationary.free_size)
        cycles = max(moving.free_size, m_size) * _pe_factor(stationary, moving, function, table)
    elif ins.engine is Engine.POOL:
        cycles = table.pool_startup + n
    elif ins.engine is Engine.DVE and ins.opcode is Opcode.TENSOR_TENSOR:
        in_psum = any(locations[ap.loc].memory is MemoryType.PSUM for ap in ins.srcs.values())
        cycles = max(table.min_ii, n if in_psum else 2 * n)
    else:  # ACT, and DVE with one input
        cycles = max(table.min_ii, n)
    if ins.engine is not Engine.PE and any(wide_stride(ap, function, table) for ap in operands):
        cycles *= table.wide_stride_factor
    return float(cycles), cycles / table.clock(ins.engine), 0


def wide_stride(ap, function: Function, table: CostTable = DEFAULT_TABLE) -> bool:
    """Whether an on-chip operand steps its innermost free dim (of more than one element) by
    more than `table.wide_stride_bytes` (docs/device_time.md#on-chip-ports)."""
    location = function.memory_locations[ap.loc]
    if not location.on_chip:
        return False
    steps = [stride for stride, count in ap.pattern if count > 1]
    return bool(steps) and abs(steps[-1]) * location.dtype.itemsize > table.wide_stride_bytes


def estimate(
    module: Module, function_name: str | None = None, table: CostTable = DEFAULT_TABLE
) -> CostReport:
    """Cost report of one function of module (the first if unnamed)."""
    from onnx2bir.runtime.timing.device_time import simulate
    from onnx2bir.runtime.timing.summary import cost_report

    if function_name is not None:
        function = module.function(function_name)
    elif module.functions:
        function = module.functions[0]
    else:
        raise ValueError(f"module {module.name!r} has no function")
    return cost_report(function, simulate(function, table), table)
