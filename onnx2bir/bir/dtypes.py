"""How a value is stored in a location of a BIR dtype: the conversions every store makes.

In: numpy arrays and a target dtype. Out: the values as the location holds them. Integers to
integers directly (wrapping, the 4-bit ones too), anything else through fp32
(docs/neuroncore.md#dma); bf16, fp16 and the fp8 formats round to nearest even (ml_dtypes,
numpy); tf32 rounds the fp32 bit pattern at bit 13; fp8 e4m3 saturates at ±448 and e5m2 at
±57344 (docs/autocast.md#rounding). The machine stores through these, and the code generator
uses them to store a weight cast at compile time exactly as a casting DMA would.

Dtypes that exist only in DRAM (`DRAM_ONLY`): no engine has a 64-bit datapath, and the 4-bit
integers are unpacked where they are used, so each is loaded into SBUF as its on-chip dtype
and converted back on the way out (docs/neuroncore.md#integers, docs/dtypes.md).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from onnx2bir.bir.enums import Dtype

F32 = np.dtype(np.float32)
# ml_dtypes' narrow integers have numpy kind "V" (as bfloat16 does): named here.
_NARROW_INTS = frozenset(np.dtype(t) for t in (ml_dtypes.int4, ml_dtypes.uint4))


def int_like(dtype: np.dtype) -> bool:
    """Whether values of dtype are computed as integers rather than in fp32."""
    return dtype.kind in "iub" or dtype in _NARROW_INTS


def iinfo(dtype: np.dtype):
    """The range of an integer dtype, the 4-bit ones included."""
    return ml_dtypes.iinfo(dtype) if dtype in _NARROW_INTS else np.iinfo(dtype)


def cast(values: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Convert to dtype: integers to integers directly (two's complement, wrapping), anything
    else through fp32; fp32 to an integer truncates toward zero and saturates, NaN becoming 0
    (docs/neuroncore.md#dma)."""
    values = np.asarray(values)
    if values.dtype == dtype:
        return values
    if int_like(values.dtype) and int_like(dtype):
        return values.astype(dtype)
    values = values.astype(F32, copy=False)
    if int_like(dtype) and dtype != np.bool_:
        return float_to_int(values, dtype)
    return values.astype(dtype)


def float_to_int(values: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """fp32 to an integer dtype: truncated toward zero, saturated at the dtype's range, NaN 0."""
    info = iinfo(dtype)
    wide = np.nan_to_num(np.asarray(values, np.float64), nan=0.0)
    return np.clip(np.trunc(wide), info.min, info.max).astype(dtype)


# DRAM-only dtype -> the dtype it has in SBUF and PSUM. int64 is narrowed to int32 as the
# reference compiler narrows it (codegen/narrowing.py says where that is proven safe); uint64
# likewise to uint32; float64 is computed in fp32, as every float is; the 4-bit integers are
# held one per byte.
DRAM_ONLY = {
    Dtype.INT64: Dtype.INT32,
    Dtype.UINT64: Dtype.UINT32,
    Dtype.FP64: Dtype.FP32,
    Dtype.INT4: Dtype.INT8,
    Dtype.UINT4: Dtype.UINT8,
}


def on_chip(dtype: Dtype) -> Dtype:
    """The dtype a tensor of `dtype` has in SBUF (`DRAM_ONLY`, docs/neuroncore.md#integers)."""
    return DRAM_ONLY.get(dtype, dtype)


FP8_E4M3_MAX = 448.0  # the largest finite float8_e4m3fn value
FP8_E5M2_MAX = 57344.0  # the largest finite float8_e5m2 value
SATURATING = {Dtype.FP8_E4M3: FP8_E4M3_MAX, Dtype.FP8_E5M2: FP8_E5M2_MAX}


def round_tf32(values: np.ndarray) -> np.ndarray:
    """fp32 values rounded to TF32 (10 mantissa bits), to nearest, ties to even; NaN and ±inf
    pass through, a value that rounds past the fp32 maximum becomes ±inf."""
    v = np.ascontiguousarray(values, dtype=F32)
    bits = v.view(np.uint32)
    lsb = (bits >> np.uint32(13)) & np.uint32(1)
    rounded = (bits + np.uint32(0x0FFF) + lsb) & np.uint32(0xFFFFE000)
    finite = np.isfinite(v)
    return np.where(finite, rounded.view(F32), v)


def saturate_fp8(values: np.ndarray, dtype: Dtype = Dtype.FP8_E4M3) -> np.ndarray:
    """fp32 values clamped to the fp8 format's largest finite value before the conversion: the
    device's conversion saturates, so a finite value beyond the range (and ±inf) becomes that
    value with its sign (±448 for e4m3, ±57344 for e5m2); NaN stays NaN. ONNX Cast's default
    (`saturate=1`) does the same."""
    v = np.asarray(values, dtype=F32)
    return np.clip(v, -SATURATING[dtype], SATURATING[dtype])


def store_as(values: np.ndarray, dtype: Dtype) -> np.ndarray:
    """Values as they are stored in a location of BIR dtype `dtype` (`cast`, plus the TF32
    rounding and FP8 saturation that the numpy dtype alone does not express)."""
    if dtype is Dtype.TF32:
        return round_tf32(cast(values, F32))
    if dtype in SATURATING:
        return saturate_fp8(cast(values, F32), dtype).astype(dtype.numpy)
    return cast(values, dtype.numpy)
