"""What NeuronCore-v2 instructions cost: the constants of the device-time model, each with its
source (docs/device_time.md#figures-and-their-sources).

The device-time model (`runtime/timing/`) simulates programs with them; the code generator
reads the same figures to balance work between engines (`codegen/row_groups.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

from onnx2bir.bir.enums import Dtype, Engine


@dataclass(frozen=True)
class CostTable:
    """Every constant of the model, with its source in docs/device_time.md."""

    clock_hz: tuple[tuple[Engine, float], ...] = (
        (Engine.PE, 2.8e9),  # docs/device_time.md#figures-and-their-sources: TensorE clock
        (Engine.ACT, 1.4e9),  # ScalarE clock
        (Engine.POOL, 1.4e9),  # GpSimd clock
        (Engine.DVE, 1.12e9),  # VectorE clock
    )
    # docs/device_time.md#instruction-costs: MIN_II, the minimum initiation interval of ACT/DVE
    min_ii: int = 64
    matmul_min_stationary: int = 64  # max(min(64, N_stationary), N_moving)
    matmul_fp32_factor: int = 4  # fp32 matmul runs at 1/4 rate
    pool_startup: int = 150  # GpSimd start-up cycles
    # docs/device_time.md#dma: a DMA instruction occupies its queue for its descriptor
    # generation (~600 ns) and its bytes; one that waits on another engine's semaphore
    # starts its transfer ~1300 ns after it (the semaphore-to-start latency, issue included).
    dma_issue_s: float = 0.6e-6
    dma_semaphore_s: float = 1.3e-6
    dma_bytes_per_s: float = 27e9  # one DMA engine's bandwidth (27 GB/s)
    dma_partitions_per_engine: int = 8  # 128 partitions over 16 DMA engines
    dma_engines: int = 16  # DMA engines (and queues) per NeuronCore
    dma_core_bytes_per_s: float = 272e9  # 16 engines x 17 B/ns: the core's shared DMA bandwidth
    # docs/device_time.md#dma: transfers under 256 bytes a partition are dominated by overhead;
    # an indirect DMA's descriptor (one gathered row) is charged at least this many bytes.
    dma_descriptor_min_bytes: int = 256
    # docs/device_time.md#semaphores: an engine waiting on another stream's semaphore
    semaphore_cycles: int = 100
    # docs/device_time.md#on-chip-ports: an ACT, DVE or POOL operand whose innermost free
    # stride is wider than this many bytes gets half the SBUF/PSUM bandwidth: the instruction
    # takes twice as long.
    wide_stride_bytes: int = 16
    wide_stride_factor: int = 2
    # docs/device_time.md#on-chip-ports: DVE and POOL cannot access SBUF at the same time, nor
    # DVE and ACT PSUM; the simulation serialises such instructions (False: it does not).
    shared_ports: bool = True
    loop_warmup: int = 3  # loop trips simulated one by one before the steady state
    pe_peak_flops: float = 128 * 128 * 2 * 2.8e9  # bf16/fp16/tf32/fp8 peak, 91.75 TFLOP/s
    # The dtype fp32 matmul operands are costed as (None: as fp32, the BIR's own dtypes)
    pe_dtype: Dtype | None = None

    def clock(self, engine: Engine) -> float:
        return dict(self.clock_hz)[engine]

    def semaphore_seconds(self, engine: Engine) -> float:
        """Latency of a cross-stream dependency, charged to the waiting engine. A DMA's fixed
        waits ~1300 ns from a semaphore to the start of its transfer, its issue cost included."""
        if engine is Engine.DMA:
            return self.dma_semaphore_s - self.dma_issue_s
        return self.semaphore_cycles / self.clock(engine)


DEFAULT_TABLE = CostTable()
