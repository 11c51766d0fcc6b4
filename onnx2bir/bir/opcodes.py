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
  `in · scale + bias` must lie in the function's valid input range (`ACT_INPUT_RANGES`, rule
  ACT-RANGE), checked at run time.
- TensorTensor: `dst = in0 <op> in1` elementwise, fp32 math. Not both inputs in PSUM.
  A bitvec operator (`BITVEC_OPS`: bitwise_and/or/xor, invert, left_shift, right_shift)
  computes on the operands' 32-bit bit patterns instead, integer operands only, on VectorE or
  GpSimd (rule ALU-BITVEC, `bitvec_problem`).
- TensorScalar: `dst = (in <op0> s0) <op1> s1` where s_i is a [P, 1] operand `scalar<i>` or the
  immediate `imm<i>`; `reverse<i>` swaps the operands of step i; `op1` may be absent.
- TensorReduce: reduces the last `axes` free dims of `in` with `op` (add, max, min, multiply);
  `negate` flips the sign of the result.
- TensorCopy: `dst = in`, converting dtype through fp32 when the dtypes differ. VectorE or
  GpSimd: on NeuronCore-v2 ScalarE has no TensorCopy (rule ACT-TENSOR-COPY); it copies with an
  Activation of func copy, through fp32.
- CopyPredicated: where `predicate` (an integer/bool tile) is nonzero — zero when
  `reverse_pred` — `dst = in` (or the immediate `imm`); elsewhere dst keeps its value. Bits
  are copied as they are, so a NaN or inf in the branch not taken cannot leak (nki.isa
  tensor_copy_predicated, VectorE). in and dst share a dtype.
- Memset: every element of `dst` becomes `value`.
- Iota: `dst[p, i1, …] = base + p · channel_multiplier + Σ i_k · steps[k]`, integer math.

Compute-engine operands keep to the NeuronCore partition rule: a tile of more than 64
partitions starts at partition 0, of 33–64 at 0 or 64, of at most 32 at 0, 32, 64 or 96; their
free dims fit the ISA's fields (`ap_field_overflow`, rule AP-FIELD-BITS), and a VectorE or
ScalarE operand holds at most `free_size_limit` elements per partition (rule FREE-SIZE).
"""

from __future__ import annotations

from dataclasses import dataclass

from onnx2bir.bir.enums import ActFunc, AluOp, Dtype, Engine, MemoryType, Opcode

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
    Opcode.TENSOR_COPY: OpcodeSpec(_COMPUTE, ("in",), (), (), ON_CHIP, ON_CHIP),
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


# An opcode on an engine it does not run on breaks ENGINE-OPCODE, unless a rule of its own says
# why (docs/neuroncore.md#rules).
_ENGINE_RULES = {(Opcode.TENSOR_COPY, Engine.ACT): "ACT-TENSOR-COPY"}


def engine_rule(opcode: Opcode, engine: Engine) -> str:
    """The rule an instruction of `opcode` on `engine` breaks when the table does not allow it."""
    return _ENGINE_RULES.get((opcode, engine), "ENGINE-OPCODE")


# Bitvec ALU operators (docs/neuroncore.md#bitvec, rule ALU-BITVEC): they treat integer
# operands as bit patterns, never converting them to fp32 as the arithmetic operators do (NKI
# ISA, "Supported Math Operators": bitvec operators "expect integer data types and treat input
# elements as bit patterns"). On the machine they compute in 32-bit lanes: a narrower integer
# is sign- or zero-extended on the way in and wraps on the way out.
BITVEC_OPS = frozenset(
    {
        AluOp.BITWISE_AND,
        AluOp.BITWISE_OR,
        AluOp.BITWISE_XOR,
        AluOp.INVERT,
        AluOp.LEFT_SHIFT,
        AluOp.RIGHT_SHIFT,
    }
)
_BITVEC_ENGINES = frozenset({Engine.DVE, Engine.POOL})
_BITVEC_OPCODES = frozenset({Opcode.TENSOR_TENSOR, Opcode.TENSOR_SCALAR})


def _alu_op(value: object) -> AluOp | None:
    try:
        return AluOp(value)
    except ValueError:
        return None  # an unknown operator is the attribute check's to report


def bitvec_problem(
    opcode: Opcode, engine: Engine, attrs: dict[str, object], dtypes: dict[str, Dtype]
) -> str | None:
    """What an instruction with a bitvec operator does against rule ALU-BITVEC, or None.

    `dtypes` holds the dtype of each tile operand by role (`in0`, `scalar1`, `dst`, ...). A
    bitvec operator of a TensorTensor or TensorScalar is refused on ScalarE, with a float
    operand or a non-integral immediate (the engine would compute on fp32
    values, not bit patterns), and beside an arithmetic operator in one TensorScalar."""
    if opcode not in _BITVEC_OPCODES:
        return None  # TensorReduce takes the operators it models (`REDUCTIONS`), none bitvec
    keys = ("op",) if opcode is Opcode.TENSOR_TENSOR else ("op0", "op1")
    ops = [_alu_op(attrs[key]) for key in keys if attrs.get(key) is not None]
    bitvec = [op for op in ops if op in BITVEC_OPS]
    if not bitvec:
        return None
    name = bitvec[0].value
    if engine not in _BITVEC_ENGINES:
        return f"{name} on {engine}: bitvec operators run on VectorE or GpSimd"
    if len(bitvec) != len(ops):
        return f"{name} beside an arithmetic operator in one TensorScalar"
    floats = [f"{role} {dtype}" for role, dtype in sorted(dtypes.items()) if dtype.is_float]
    if floats:
        return f"{name} with a float operand ({', '.join(floats)}): bit patterns are integers"
    for key in ("imm0", "imm1"):
        value = attrs.get(key)
        if isinstance(value, bool) or value is None:
            continue
        if not isinstance(value, (int, float)) or not float(value).is_integer():
            return f"{name} with immediate {key} = {value!r}: bit patterns are integers"
    return None


# Elements per partition one VectorE or ScalarE operand may hold (docs/neuroncore.md#partitions,
# rule FREE-SIZE). GpSimd's limits depend on the instruction; none is modelled.
_FREE_SIZE_LIMITS = {MemoryType.SB: 64 * 1024, MemoryType.PSUM: 4 * 1024}
_FREE_SIZE_ENGINES = frozenset({Engine.DVE, Engine.ACT})


def free_size_limit(engine: Engine, memory: MemoryType) -> int | None:
    """The most elements per partition an operand of `engine` in `memory` holds; None: no limit
    modelled."""
    if engine not in _FREE_SIZE_ENGINES:
        return None
    return _FREE_SIZE_LIMITS.get(memory)


# A compute-engine access pattern encodes each free dim's size in a uint16 and its stride, in
# elements, in an int16 (docs/neuroncore.md#partitions, rule AP-FIELD-BITS). A dim of one
# element takes no step, so its stride is free to encode as 0.
AP_SIZE_MAX = (1 << 16) - 1
AP_STRIDE_MIN, AP_STRIDE_MAX = -(1 << 15), (1 << 15) - 1


def ap_field_overflow(pattern: tuple[tuple[int, int], ...]) -> str | None:
    """The first free dim of `pattern` ((stride, count) pairs) whose size or stride does not
    fit its field, described; None when every dim fits."""
    for dim, (stride, count) in enumerate(pattern):
        if count > AP_SIZE_MAX:
            return f"free dim {dim} has {count} elements (max {AP_SIZE_MAX})"
        if count > 1 and not AP_STRIDE_MIN <= stride <= AP_STRIDE_MAX:
            return (
                f"free dim {dim} steps {stride} elements (int16: {AP_STRIDE_MIN}..{AP_STRIDE_MAX})"
            )
    return None


# ScalarE's valid input range per function (docs/neuroncore.md#scalare, rule ACT-RANGE):
# (low, high) for `in · scale + bias`, or for its magnitude where `ACT_RANGE_ON_MAGNITUDE` says so.
# Outside, the lookup table's polynomials give invalid results; sin does no range reduction.
# cos is not among the NKI ISA's functions; the machine holds it to sin's range. The bound of
# sin and cos lets four fp32 ulps (2^-22 each) past pi rounded to fp32: an argument reduced in
# fp32 ends there at worst (onnx2bir/codegen/act_range.py). Every bound is an fp32 value.
PI_FP32 = 3.1415927410125732  # math.pi rounded to fp32
ACT_PI_BOUND = PI_FP32 + 4 * 2.0**-22
ACT_INPUT_RANGES: dict[ActFunc, tuple[float, float]] = {
    ActFunc.SIN: (-ACT_PI_BOUND, ACT_PI_BOUND),
    ActFunc.COS: (-ACT_PI_BOUND, ACT_PI_BOUND),
    ActFunc.LOG: (2.0**-64, 2.0**64),
    ActFunc.SQRT: (2.0**-116, 2.0**118),
    ActFunc.RSQRT: (2.0**-87, 2.0**97),
    ActFunc.RECIPROCAL: (2.0**-42, 2.0**42),
}
ACT_RANGE_ON_MAGNITUDE = frozenset({ActFunc.RECIPROCAL})


def partition_start_allowed(start: int, count: int) -> bool:
    """The NeuronCore start-partition rule for compute-engine tiles."""
    if count > 64:
        return start == 0
    if count > 32:
        return start in (0, 64)
    return start in (0, 32, 64, 96)
