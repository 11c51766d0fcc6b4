"""How a value is stored in a location of a BIR dtype: the conversions every store makes.

In: numpy arrays and a target dtype. Out: the values as the location holds them. Integers to
integers directly, anything else through fp32 (docs/neuroncore.md#dma); bf16 and fp16 round to
nearest even (ml_dtypes, numpy); tf32 rounds the fp32 bit pattern at bit 13; fp8 e4m3 saturates
at ±448 (docs/autocast.md#rounding). The machine stores through these, and the code generator
uses them to store a weight cast at compile time exactly as a casting DMA would.
"""

from __future__ import annotations

import numpy as np

from onnx2bir.bir.enums import Dtype

F32 = np.dtype(np.float32)


def int_like(dtype: np.dtype) -> bool:
    """Whether values of dtype are computed as integers (int64) rather than in fp32."""
    return dtype.kind in "iub"  # ml_dtypes bfloat16 has kind "V", so it counts as float


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
    info = np.iinfo(dtype)
    wide = np.nan_to_num(np.asarray(values, np.float64), nan=0.0)
    return np.clip(np.trunc(wide), info.min, info.max).astype(dtype)


def on_chip(dtype: Dtype) -> Dtype:
    """The dtype a tensor of `dtype` has in SBUF: int64 is narrowed to int32, as the reference
    compiler does, since no engine has an int64 datapath (docs/neuroncore.md#integers)."""
    return Dtype.INT32 if dtype is Dtype.INT64 else dtype


FP8_E4M3_MAX = 448.0  # the largest finite float8_e4m3fn value


def round_tf32(values: np.ndarray) -> np.ndarray:
    """fp32 values rounded to TF32 (10 mantissa bits), to nearest, ties to even; NaN and ±inf
    pass through, a value that rounds past the fp32 maximum becomes ±inf."""
    v = np.ascontiguousarray(values, dtype=F32)
    bits = v.view(np.uint32)
    lsb = (bits >> np.uint32(13)) & np.uint32(1)
    rounded = (bits + np.uint32(0x0FFF) + lsb) & np.uint32(0xFFFFE000)
    finite = np.isfinite(v)
    return np.where(finite, rounded.view(F32), v)


def saturate_fp8_e4m3(values: np.ndarray) -> np.ndarray:
    """fp32 values clamped to ±448 before the fp8 e4m3 conversion: the device's conversion
    saturates, so a finite value beyond the range (and ±inf) becomes ±448; NaN stays NaN."""
    v = np.asarray(values, dtype=F32)
    return np.clip(v, -FP8_E4M3_MAX, FP8_E4M3_MAX)


def store_as(values: np.ndarray, dtype: Dtype) -> np.ndarray:
    """Values as they are stored in a location of BIR dtype `dtype` (`cast`, plus the TF32
    rounding and FP8 saturation that the numpy dtype alone does not express)."""
    if dtype is Dtype.TF32:
        return round_tf32(cast(values, F32))
    if dtype is Dtype.FP8_E4M3:
        return saturate_fp8_e4m3(cast(values, F32)).astype(dtype.numpy)
    return cast(values, dtype.numpy)
