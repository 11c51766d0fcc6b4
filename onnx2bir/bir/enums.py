"""The closed vocabularies of BIR: engines, memories, opcodes, dependency kinds, dtypes.

Names follow the reference BIR driver (docs/bir_codegen.md#module) where it gives them: MemoryType
{DRAM, SB, PSUM}, MemoryKind {ExternalInput, ExternalInputParameter, ExternalOutput,
ExternalOutputParameter, Const, Internal}, EdgeKind {Flow, Output, Anti, Ordered}, entry block
"Block1", loop body block "block0".
"""

from __future__ import annotations

import enum

import ml_dtypes
import numpy as np

ENTRY_BLOCK = "Block1"
LOOP_BODY_BLOCK = "block0"


class Engine(enum.StrEnum):
    PE = "PE"  # TensorE: 128x128 systolic array, writes PSUM
    ACT = "ACT"  # ScalarE: activation LUT, out = f(in * scale + bias)
    DVE = "DVE"  # VectorE: elementwise, scalar and reduce ops
    POOL = "POOL"  # GpSimdE: same ALU ops as DVE, cannot touch PSUM
    DMA = "DMA"  # a DMA queue; the queue number rides on the instruction


class MemoryType(enum.StrEnum):
    DRAM = "DRAM"
    SB = "SB"
    PSUM = "PSUM"


class MemoryKind(enum.StrEnum):
    EXTERNAL_INPUT = "ExternalInput"
    EXTERNAL_INPUT_PARAMETER = "ExternalInputParameter"
    EXTERNAL_OUTPUT = "ExternalOutput"
    EXTERNAL_OUTPUT_PARAMETER = "ExternalOutputParameter"
    CONST = "Const"
    INTERNAL = "Internal"


# Kinds whose payload the module carries (`Module.constants`, the sidecar): constants folded at
# compile time, and the model's weights, which the loader supplies unless the caller passes its
# own (docs/memory_kinds.md).
PAYLOAD_KINDS = frozenset(
    {MemoryKind.CONST, MemoryKind.EXTERNAL_INPUT_PARAMETER, MemoryKind.EXTERNAL_OUTPUT_PARAMETER}
)


class LoopMode(enum.StrEnum):
    """How an instruction's innermost enclosing loop runs (docs/predicates.md)."""

    NONE = ""  # not inside a counted or runtime loop (scope regions do not count)
    AFFINE = "Affine"  # a parallel static loop: trips may be reordered
    SEQUENTIAL = "Sequential"  # a static loop whose trips run in order
    DYNAMIC = "Dynamic"  # a DynamicFor or DoWhile loop


class DepKind(enum.StrEnum):
    FLOW = "Flow"  # read after write
    OUTPUT = "Output"  # write after write
    ANTI = "Anti"  # write after read
    ORDERED = "Ordered"  # no data hazard; program order must hold (e.g. a scope barrier)


class Opcode(enum.StrEnum):
    DMA_COPY = "DmaCopy"
    DMA_GATHER = "DmaGather"
    MATMULT = "Matmult"
    ACTIVATION = "Activation"
    TENSOR_TENSOR = "TensorTensor"
    TENSOR_SCALAR = "TensorScalar"
    TENSOR_REDUCE = "TensorReduce"
    TENSOR_COPY = "TensorCopy"
    COPY_PREDICATED = "CopyPredicated"
    MEMSET = "Memset"
    IOTA = "Iota"


class ActFunc(enum.StrEnum):
    """ScalarE lookup-table functions (docs/neuroncore.md#scalare)."""

    COPY = "copy"
    RELU = "relu"
    SIGMOID = "sigmoid"
    TANH = "tanh"
    EXP = "exp"
    LOG = "log"
    SQRT = "sqrt"
    RSQRT = "rsqrt"
    RECIPROCAL = "reciprocal"
    SQUARE = "square"
    ABS = "abs"
    SIGN = "sign"
    ERF = "erf"
    GELU = "gelu"
    GELU_TANH = "gelu_tanh"
    SILU = "silu"
    SOFTPLUS = "softplus"
    SIN = "sin"
    COS = "cos"


class AluOp(enum.StrEnum):
    """Vector/GpSimd ALU operations (computed in fp32, or bit-exact on integers)."""

    ADD = "add"
    SUBTRACT = "subtract"
    MULTIPLY = "multiply"
    DIVIDE = "divide"
    MAX = "max"
    MIN = "min"
    POW = "pow"
    IS_EQUAL = "is_equal"
    IS_LT = "is_lt"
    IS_LE = "is_le"
    IS_GT = "is_gt"
    IS_GE = "is_ge"
    LOGICAL_AND = "logical_and"
    LOGICAL_OR = "logical_or"
    BYPASS = "bypass"  # pass the first operand through unchanged
    MOD = "mod"  # remainder of truncated division (C fmod): the sign of the first operand
    # Bitvec operators (NKI's names): integer operands as 32-bit bit patterns, never through
    # fp32 (`opcodes.BITVEC_OPS`, rule ALU-BITVEC). invert ignores its second operand; a shift
    # by 32 or more (the amount read unsigned) gives 0; right_shift is logical (zero-filling).
    BITWISE_AND = "bitwise_and"
    BITWISE_OR = "bitwise_or"
    BITWISE_XOR = "bitwise_xor"
    INVERT = "invert"
    LEFT_SHIFT = "left_shift"
    RIGHT_SHIFT = "right_shift"


class Dtype(enum.StrEnum):
    FP32 = "float32"
    BF16 = "bfloat16"
    FP16 = "float16"
    TF32 = "tfloat32"  # 1-8-10, held in 4 bytes; the low 13 mantissa bits are always zero
    FP8_E4M3 = "float8_e4m3"  # 1-4-3, max ±448, no infinities (OCP e4m3fn)
    FP8_E5M2 = "float8_e5m2"  # 1-5-2, max ±57344, with infinities (OCP e5m2)
    FP64 = "float64"  # DRAM only: computed in fp32 on chip (`dtypes.DRAM_ONLY`)
    INT64 = "int64"  # DRAM only: int32 on chip
    UINT64 = "uint64"  # DRAM only: uint32 on chip
    INT32 = "int32"
    UINT32 = "uint32"
    INT16 = "int16"
    UINT16 = "uint16"
    INT8 = "int8"
    UINT8 = "uint8"
    INT4 = "int4"  # DRAM only, one value per byte: int8 on chip
    UINT4 = "uint4"  # DRAM only, one value per byte: uint8 on chip
    BOOL = "bool"

    @property
    def numpy(self) -> np.dtype:
        return _NUMPY_DTYPES[self]

    @property
    def itemsize(self) -> int:
        return _NUMPY_DTYPES[self].itemsize

    @property
    def is_float(self) -> bool:
        return self in _FLOAT_DTYPES

    @property
    def autocast_only(self) -> bool:
        """A storage format of the autocast only (TF32), never a graph tensor's dtype."""
        return self in _AUTOCAST_ONLY

    @property
    def mantissa_bits(self) -> int:
        """Explicit fraction bits of a float dtype (the unit roundoff is 2^-(bits+1))."""
        return _MANTISSA_BITS[self]

    @classmethod
    def from_numpy(cls, dtype: np.dtype) -> Dtype:
        for member, np_dtype in _NUMPY_DTYPES.items():
            if member in _AUTOCAST_ONLY:
                continue
            if np_dtype == np.dtype(dtype):
                return member
        raise ValueError(f"no BIR dtype for numpy dtype {dtype}")


_NUMPY_DTYPES = {
    Dtype.FP32: np.dtype(np.float32),
    Dtype.BF16: np.dtype(ml_dtypes.bfloat16),
    Dtype.FP16: np.dtype(np.float16),
    Dtype.TF32: np.dtype(np.float32),  # rounded to 10 mantissa bits on every store
    Dtype.FP8_E4M3: np.dtype(ml_dtypes.float8_e4m3fn),
    Dtype.FP8_E5M2: np.dtype(ml_dtypes.float8_e5m2),
    Dtype.FP64: np.dtype(np.float64),
    Dtype.INT64: np.dtype(np.int64),
    Dtype.UINT64: np.dtype(np.uint64),
    Dtype.INT32: np.dtype(np.int32),
    Dtype.UINT32: np.dtype(np.uint32),
    Dtype.INT16: np.dtype(np.int16),
    Dtype.UINT16: np.dtype(np.uint16),
    Dtype.INT8: np.dtype(np.int8),
    Dtype.UINT8: np.dtype(np.uint8),
    Dtype.INT4: np.dtype(ml_dtypes.int4),
    Dtype.UINT4: np.dtype(ml_dtypes.uint4),
    Dtype.BOOL: np.dtype(np.bool_),
}
_FLOAT_DTYPES = frozenset(
    {Dtype.FP32, Dtype.BF16, Dtype.FP16, Dtype.TF32, Dtype.FP8_E4M3, Dtype.FP8_E5M2, Dtype.FP64}
)
_MANTISSA_BITS = {
    Dtype.FP64: 52,
    Dtype.FP32: 23,
    Dtype.TF32: 10,
    Dtype.FP16: 10,
    Dtype.BF16: 7,
    Dtype.FP8_E4M3: 3,
    Dtype.FP8_E5M2: 2,
}
# Storage formats of the autocast only: never the dtype of a graph tensor (TF32 shares
# float32's numpy dtype and has no ONNX type).
_AUTOCAST_ONLY = frozenset({Dtype.TF32})
