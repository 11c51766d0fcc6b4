"""Inputs fixed to a value (`--input-value NAME=V[,V...]`): a runtime input becomes a constant.

Some inputs steer the graph rather than carry data: silero-vad's sample rate `sr` picks one of
two `If` branches, a flag input picks a path. With the value given, the input is an initializer
before folding, so the `Equal` on it and the `If` it feeds fold away and only the branch taken
is compiled (docs/input_contracts.md#input-values). The program then computes the model for
that value only; validate feeds the same value to onnxruntime, which runs the original model.

`pin_input_values` checks each value against the input's declared type and shape and returns
the arrays it fixed; every problem is a `UserError` naming the input.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import ml_dtypes
import numpy as np
import onnx
from onnx import numpy_helper

from onnx2bir.errors import UserError


def pin_input_values(
    model: onnx.ModelProto,
    values: Mapping[str, object],
    runtime: list[onnx.ValueInfoProto],
    input_shapes: Mapping[str, tuple[int, ...]] | None = None,
) -> dict[str, np.ndarray]:
    """Replace each named runtime input of `model` (in place) by an initializer holding its
    value; return the arrays by input name. `runtime` lists the model's runtime inputs."""
    if not values:
        return {}
    by_name = {value.name: value for value in runtime}
    unknown = sorted(set(values) - set(by_name))
    if unknown:
        raise UserError(
            f"--input-value names {', '.join(unknown)}, but the model's inputs are: "
            f"{', '.join(by_name) or 'none'}"
        )
    shaped = set(input_shapes or {}) & set(values)
    if shaped:
        raise UserError(
            f"--input-value {', '.join(sorted(shaped))}: also given --input-shape; a fixed "
            "value has the input's declared shape (or its own, for a symbolic one)"
        )
    pinned = {name: input_array(by_name[name], value) for name, value in values.items()}
    # IR < 4 reads an initializer only when it is also a graph input; the pinned inputs leave
    # the inputs, so the model must say IR 4 or later.
    model.ir_version = max(model.ir_version, 4)
    kept = [value for value in model.graph.input if value.name not in pinned]
    del model.graph.input[:]
    model.graph.input.extend(kept)
    for init in [init for init in model.graph.initializer if init.name in pinned]:
        model.graph.initializer.remove(init)
    for name, array in pinned.items():
        model.graph.initializer.append(numpy_helper.from_array(array, name))
    return pinned


def input_array(value_info: onnx.ValueInfoProto, value: object) -> np.ndarray:
    """`value` (numbers, or an array) as the input's dtype and shape, checked exactly: an
    integer input takes integers in its range, a bool input 0/1 (the command line reads
    true/false as 1/0)."""
    name = value_info.name
    tensor_type = value_info.type.tensor_type
    if not value_info.type.HasField("tensor_type") or not tensor_type.elem_type:
        raise UserError(f"--input-value {name}: the input is not a typed tensor")
    dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor_type.elem_type)
    given = np.asarray(value)
    if given.dtype.kind not in "biuf":  # the command line parses its numbers itself
        raise UserError(f"--input-value {name}: give numbers (or an array), not {value!r}")
    array = _exact_cast(given, dtype, name)
    shape = _shape_for(value_info, array)
    return array.reshape(shape)


def _exact_cast(given: np.ndarray, dtype: np.dtype, name: str) -> np.ndarray:
    """`given` as `dtype`, refused when a value would change (3.5 as an integer, 300 as uint8).
    The ml_dtypes types of ONNX tensors count as floats (bfloat16, float8: rounded like
    float16) or integers (int4, uint4: checked against their range)."""
    if dtype.kind == "V" and dtype.fields is None and dtype.type.__module__ == "ml_dtypes":
        return _ml_cast(given, dtype, name)
    if dtype.kind not in "biuf":
        raise UserError(f"--input-value {name}: inputs of dtype {dtype} cannot be given a value")
    if given.dtype.kind == "b" or dtype.kind == "b":
        if given.dtype.kind != "b" and not np.isin(given, (0, 1)).all():
            raise UserError(f"--input-value {name}: a bool input takes 0/1 or true/false")
        return given.astype(dtype)
    if dtype.kind in "iu":
        if given.dtype.kind == "f" and not np.all(np.isfinite(given) & (given == np.round(given))):
            raise UserError(f"--input-value {name}: the input is {dtype}; give integers")
        info = np.iinfo(dtype)
        as_int = [int(v) for v in given.reshape(-1)]
        if any(not info.min <= v <= info.max for v in as_int):
            raise UserError(
                f"--input-value {name}: a value is outside {dtype}'s range "
                f"({info.min} to {info.max})"
            )
        return np.asarray(as_int, dtype=dtype).reshape(given.shape)
    with np.errstate(over="ignore"):
        return given.astype(dtype)


def _ml_cast(given: np.ndarray, dtype: np.dtype, name: str) -> np.ndarray:
    """`given` as the ml_dtypes `dtype`: a float type rounds as a float input does; an
    integer type (int4, uint4, int2, uint2) takes integers in its range only."""
    if "int" not in dtype.name:
        with np.errstate(over="ignore"):
            return given.astype(np.float64).astype(dtype)
    if given.dtype.kind == "f" and not np.all(np.isfinite(given) & (given == np.round(given))):
        raise UserError(f"--input-value {name}: the input is {dtype}; give integers")
    info = ml_dtypes.iinfo(dtype)
    as_int = [int(v) for v in given.reshape(-1)]
    if any(not int(info.min) <= v <= int(info.max) for v in as_int):
        raise UserError(
            f"--input-value {name}: a value is outside {dtype}'s range "
            f"({int(info.min)} to {int(info.max)})"
        )
    return np.asarray(as_int, dtype=np.int64).astype(dtype).reshape(given.shape)


def _shape_for(value_info: onnx.ValueInfoProto, array: np.ndarray) -> tuple[int, ...]:
    """The shape the value takes: the declared one, with one unknown dim set by the count; an
    array given with a shape keeps it when it fits the declaration."""
    name = value_info.name
    shape_proto = value_info.type.tensor_type.shape
    if not value_info.type.tensor_type.HasField("shape"):
        return array.shape  # no declared rank: the value's own
    declared = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None
                for d in shape_proto.dim]  # fmt: skip
    text = "x".join("?" if d is None else str(d) for d in declared) or "a scalar"
    if array.ndim == len(declared) and all(
        d in (None, s) for d, s in zip(declared, array.shape, strict=True)
    ):
        return array.shape
    count = array.size
    unknown = [i for i, d in enumerate(declared) if d is None]
    known = math.prod(d for d in declared if d is not None)
    if len(unknown) > 1 or (not unknown and known != count) or (unknown and count % known):
        raise UserError(
            f"--input-value {name}: {count} value{'s' if count != 1 else ''} do not fill the "
            f"input's declared shape ({text})"
        )
    shape = list(declared)
    for index in unknown:
        shape[index] = count // known
    return tuple(shape)
