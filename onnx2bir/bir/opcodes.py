"""What each BIR opcode takes: operand roles, engines, attributes. The verifier reads this table;
the machine (`onnx2bir.runtime.machine.semantics`) gives each opcode its meaning.

Semantics, per opcode (shapes are access-pattern shapes, see `onnx2bir.bir.ir`):

- DmaCopy: copies `in` to `dst`, element by element in row-major order of each side's shape;
  element counts must match. DRAM and SB on either side. A dtype change goes through fp32,
  except integer to integer (two's complement: int64 to int32 wraps).
- DmaGather: `dst[p, :] = in[indices[p], :]`, an indirect DMA: `in` views a DRAM table as
  [rows, row] (one row per descriptor), `indices` is an integer [P, 1] SBUF tile holding one
  row number per partition, `dst` an SB tile [P, row] of the table's dtype (an int64 table
  narrows to an int32 tile, as a DmaCopy would, docs/neuroncore.md#integers). A row number
  outside the table is refused (the DMA's bounds check), naming the index and the table.
  Descriptors are generated at run time from the index tile (docs/neuroncore.md#dma).
- Matmult: `dst[M, N] (+)= stationary[K, M]ᵀ · moving[K, N]`. K = partitions of both inputs
  (≤ 128), M = stationary free size (≤ 128), N = moving free size (≤ 512). Inputs in SB, dst in
  PSUM (fp32, M partitions, N elements inside one 2 KiB bank). Accumulation is fp32 whatever
  the operand dtype; fp32 operands pair only with fp32. `accumulate` False overwrites, True adds.
  Each element's K products are summed in float64 and rounded once, whatever its column.
- Activation: `dst = func(in · scale + bias)` in fp32, cast to dst's dtype. `bias` is a [P, 1]
  operand broadcast along the free dims, or the immediate `bias_value`; `scale` an immediate.
- TensorTensor: `dst = in0 <op> in1` elementwise, fp32 math. Not both inputs in PSUM.
- TensorScalar: `dst = (in <op0> s0) <op1> s1` where s_i is a [P, 1] operand `scalar<i>` or the
  immediate `imm<i>`; `reverse<i>` swaps the operands of step i; `op1` may be absent.
- TensorReduce: reduces the last `axes` free dims of `in` with `op` (add, max, min, multiply);
  `negate` flips the sign of the result.
- TensorCopy: `dst = in`, converting dtype through fp32 when the dtypes differ.
- CopyPredicated: where `predicate` (an integer/bool tile) is nonzero — zero when
  `reverse_pred` — `dst = in` (or the immediate `imm`); elsewhere dst keeps its value. Bits
  are copied as they are, so a NaN or inf in the branch not taken cannot leak (nki.isa
  tensor_copy_predicated, VectorE). in and dst share a dtype.
- Memset: every element of `dst` becomes `value`.
- Iota: `dst[p, i1, …] = base + p · channel_multiplier + Σ i_k · steps[k]`, integer math.

Compute-engine operands keep to the NeuronCore partition rule: a tile of more than 64
partitions starts at partition 0, of 33–64 at 0 or 64, of at most 32 at 0, 32, 64 or 96.
"""

from __future__ import annotations

from dataclasses import dataclass

from onnx2bir.bir.enums import Engine, MemoryType, Opcode

ON_CHIP = frozenset({MemoryType.SB, MemoryType.PSUM})
SB_ONLY = frozenset({MemoryType.SB})
ANY_MEMORY = frozenset(MemoryType)
DMA_MEMORY = frozenset({MemoryType.DRAM, MemoryType.SB})


@dataclass(frozen=True)
class OpcodeSpec:
    engines: frozenset[Engine]
    required_srcs: tuple[str, ...]
    optional_srcs: tuple[str, ...]
    required_attrs: tuple[str, ...]
    dst_memory: frozenset[MemoryType]
    src_memory: frozenset[MemoryType]


_COMPUTE = frozenset({Engine.DVE, Engine.POOL})

OPCODES: dict[Opcode, OpcodeSpec] = {
    Opcode.DMA_COPY: OpcodeSpec(
        frozenset({Engine.DMA}), ("in",), (), ("queue",), DMA_MEMORY, DMA_MEMORY
    ),
    Opcode.DMA_GATHER: OpcodeSpec(
        frozenset({Engine.DMA}), ("in", "indices"), (), ("queue",), SB_ONLY, DMA_MEMORY
    ),
    Opcode.MATMULT: OpcodeSpec(
        frozenset({Engine.PE}),
        ("stationary", "moving"),
        (),
        ("accumulate",),
        frozenset({MemoryType.PSUM}),
        SB_ONLY,
    ),
    Opcode.ACTIVATION: OpcodeSpec(
        frozenset({Engine.ACT}), ("in",), ("bias",), ("func", "scale"), ON_CHIP, ON_CHIP
    ),
    Opcode.TENSOR_TENSOR: OpcodeSpec(_COMPUTE, ("in0", "in1"), (), ("op",), ON_CHIP, ON_CHIP),
    Opcode.TENSOR_SCALAR: OpcodeSpec(
        _COMPUTE | {Engine.ACT}, ("in",), ("scalar0", "scalar1"), ("op0",), ON_CHIP, ON_CHIP
    ),
    Opcode.TENSOR_REDUCE: OpcodeSpec(_COMPUTE, ("in",), (), ("op", "axes"), ON_CHIP, ON_CHIP),
    Opcode.TENSOR_COPY: OpcodeSpec(_COMPUTE | {Engine.ACT}, ("in",), (), (), ON_CHIP, ON_CHIP),
    Opcode.COPY_PREDICATED: OpcodeSpec(
        frozenset({Engine.DVE}), ("predicate",), ("in",), (), ON_CHIP, ON_CHIP
    ),
    Opcode.MEMSET: OpcodeSpec(_COMPUTE, (), (), ("value",), ON_CHIP, ON_CHIP),
    Opcode.IOTA: OpcodeSpec(
        frozenset({Engine.POOL}),
        (),
        (),
        ("base", "channel_multiplier", "steps"),
        SB_ONLY,
        SB_ONLY,
    ),
}

# Hardware geometry of NeuronCore-v2 (docs/neuroncore.md#memory, docs/neuroncore.md#pe-array).
NUM_PARTITIONS = 128
SBUF_BYTES_PER_PARTITION = 192 * 1024
PSUM_BYTES_PER_PARTITION = 16 * 1024
PSUM_BANK_BYTES = 2 * 1024
PSUM_NUM_BANKS = 8
MATMUL_MAX_STATIONARY_FREE = 128
MATMUL_MAX_MOVING_FREE = 512
MAX_FREE_DIMS = 4  # compute-engine access patterns; DMA descriptors may use more
SB_ALIGN = 64  # SBUF tiles start at multiples of 64 bytes in each partition
DMA_MAX_DIMS = 5


def partition_start_allowed(start: int, count: int) -> bool:
    """The NeuronCore start-partition rule for compute-engine tiles."""
    if count > 64:
        return start == 0
    if count > 32:
        return start in (0, 64)
    return start in (0, 32, 64, 96)
