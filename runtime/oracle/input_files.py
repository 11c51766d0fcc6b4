"""Reading `validate --inputs`: only regular files and folders, only numeric and bool arrays.

`check_inputs_source` runs before any work (a FIFO or a device would block or never end);
`read_npz` reads each wanted array's header before its data, so a wrong dtype or a shape of
2^40 elements is refused without allocating it; `check_array` refuses what cannot be a model
input (strings, objects, structured, void, complex, datetime). Rules in
`docs/input_contracts.md#flags`.

The ml_dtypes types ONNX tensors take (bfloat16, the float8 types, int4/uint4, int2/uint2,
float4e2m1; `ML_DTYPES`) are numbers too: `numpy_helper.to_array` gives them from a .pb.
`np.save` writes them with a descriptor numpy cannot read back (`<V2` for bfloat16, `<f1` for
float8e5m2, `<V1` for the other one-byte types), so `read_npz` reads such an array as its one
ml_dtypes type (`<V2`, `<f1`) or, for `<V1`, as the type the model gives that input.
"""

from __future__ import annotations

import ast
import os
import stat
import zipfile
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper

from onnx2bir.errors import UserError

# bool, signed and unsigned integers, floats.
NUMERIC_KINDS = "biuf"
# The ml_dtypes types of ONNX tensors, as numpy_helper.to_array gives them: dtype -> is float.
ML_DTYPES = {
    np.dtype(helper.tensor_dtype_to_np_dtype(getattr(TensorProto, name))): "INT" not in name
    for name in (
        "BFLOAT16",
        "FLOAT8E4M3FN",
        "FLOAT8E4M3FNUZ",
        "FLOAT8E5M2",
        "FLOAT8E5M2FNUZ",
        "FLOAT8E8M0",
        "FLOAT4E2M1",
        "INT4",
        "UINT4",
        "INT2",
        "UINT2",
    )
    if hasattr(TensorProto, name)
}
# What np.save writes for them and numpy cannot read back, when only one type can be meant.
_SAVED_AS = {"V2": "BFLOAT16", "f1": "FLOAT8E5M2"}
_MAX_HEADER = 10000  # numpy's own limit on an .npy header
_KIND_NAMES = {
    "c": "complex (the imaginary part would be lost)",
    "U": "text",
    "S": "bytes",
    "O": "Python objects",
    "V": "structured or void",
    "M": "datetime",
    "m": "timedelta",
}


def check_inputs_source(path: str | Path) -> Path:
    """`--inputs` names an existing regular file or folder (symlinks to either are followed)."""
    if not str(path).strip():
        raise UserError("--inputs: the path is empty")
    path = Path(path)
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise UserError(f"--inputs {path}: no such inputs file or folder") from None
    except OSError as exc:
        raise UserError(f"--inputs {path}: cannot be read ({exc.strerror})") from None
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        raise UserError(f"--inputs {path}: not a regular file or a folder")
    return path


def check_regular_file(path: Path) -> None:
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise UserError(f"{path}: cannot be read ({exc.strerror})") from None
    if not stat.S_ISREG(mode):
        raise UserError(f"{path}: not a regular file")


def is_numeric(dtype: np.dtype) -> bool:
    """In: a dtype. Out: True for bool, integers, floats and the ml_dtypes types of ONNX
    tensors (`ML_DTYPES`); False for text, objects, structured or void records, complex,
    datetimes."""
    dtype = np.dtype(dtype)
    return dtype in ML_DTYPES or (dtype.kind in NUMERIC_KINDS and dtype.fields is None)


def is_float(dtype: np.dtype) -> bool:
    """In: a dtype. Out: True for numpy's floats and the ml_dtypes float types (bfloat16 is
    kind "V" to numpy, so `kind == "f"` misses it)."""
    dtype = np.dtype(dtype)
    return ML_DTYPES.get(dtype, dtype.kind == "f")


def check_array(where: str, name: str, dtype: np.dtype, role: str = "input") -> None:
    """Refuse an array (`role` `name` of the file `where`) that cannot be a tensor's value."""
    if not is_numeric(dtype):
        what = _KIND_NAMES.get(dtype.kind, str(dtype))
        raise UserError(
            f"{where}: {role} {name!r} holds {what} values ({dtype}); "
            f"{role}s must be numeric or bool arrays"
        )


def _header(
    archive: zipfile.ZipFile, member: str, want: np.dtype | None
) -> tuple[tuple[int, ...], bool, np.dtype]:
    """In: an .npz member and the dtype the model wants for it (None: unknown). Out: (shape,
    Fortran order, dtype), from the .npy header alone. An ml_dtypes array `np.save` wrote gets
    its type back (module docstring); any other descriptor is numpy's own."""
    with archive.open(member) as handle:
        version = np.lib.format.read_magic(handle)
        size = int.from_bytes(handle.read(2 if version == (1, 0) else 4), "little")
        if size > _MAX_HEADER:
            raise ValueError(f"a header of {size} bytes, over numpy's {_MAX_HEADER}")
        text = handle.read(size).decode("latin1" if version < (3, 0) else "utf8")
    header = ast.literal_eval(text)
    if not isinstance(header, dict) or set(header) != {"descr", "fortran_order", "shape"}:
        raise ValueError("the header is not a dict of descr, fortran_order and shape")
    shape, fortran, descr = header["shape"], header["fortran_order"], header["descr"]
    if not (isinstance(shape, tuple) and all(isinstance(d, int) and d >= 0 for d in shape)):
        raise ValueError(f"the shape {shape!r} is not a tuple of sizes")
    return shape, bool(fortran), _saved_dtype(descr, want)


def _saved_dtype(descr, want: np.dtype | None) -> np.dtype:
    """The dtype an .npy descriptor stands for: `<V2` bfloat16, `<f1` float8e5m2, `<V1` the
    one-byte ml_dtypes type the model wants (a raw void otherwise, which is refused)."""
    code = descr.lstrip("<>|=") if isinstance(descr, str) else None
    if code in _SAVED_AS:
        return np.dtype(helper.tensor_dtype_to_np_dtype(getattr(TensorProto, _SAVED_AS[code])))
    if code == "V1" and want is not None and want in ML_DTYPES and want.itemsize == 1:
        return want
    return np.lib.format.descr_to_dtype(descr)


def _read_data(handle, shape: tuple[int, ...], fortran: bool, dtype: np.dtype) -> np.ndarray:
    """The data of an .npy member `handle` (past its header) as `dtype`, for the ml_dtypes
    types numpy's reader cannot name; the shape's bytes must all be there."""
    count = int(np.prod(shape, dtype=object))
    data = handle.read(count * dtype.itemsize)
    if len(data) != count * dtype.itemsize:
        raise ValueError(f"{len(data)} bytes of data where {count * dtype.itemsize} belong")
    flat = np.frombuffer(data, dtype=dtype).copy()
    return flat.reshape(shape, order="F" if fortran else "C")


def read_npz(
    path: Path,
    expected: dict[str, tuple[int, ...] | None],
    dtypes: dict[str, np.dtype] | None = None,
    role: str = "input",
) -> dict[str, np.ndarray]:
    """The arrays of `path` named in `expected` (name: shape); each checked before it is read.

    A shape of None (an input with symbolic dims, which the array will fix) is not compared;
    such an array must still fit the host's memory. `dtypes` (name: the model's dtype) names
    the type of a one-byte ml_dtypes array `np.save` wrote as `<V1`; `role` names the arrays
    in messages ("input", "output")."""
    check_regular_file(path)
    try:
        archive = zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile, ValueError) as exc:
        raise UserError(f"{path}: cannot read inputs as .npz ({type(exc).__name__})") from None
    with archive:
        members = {name.removesuffix(".npy"): name for name in archive.namelist()}
        missing = [name for name in expected if name not in members]
        if missing:
            raise UserError(f"{path}: no array for input(s) {', '.join(missing)}")
        feeds = {}
        for name, shape in expected.items():
            want = None if dtypes is None or dtypes.get(name) is None else np.dtype(dtypes[name])
            try:
                found, fortran, dtype = _header(archive, members[name], want)
            except Exception as exc:  # a damaged member: zlib, zipfile or the header's text
                raise UserError(f"{path}: array {name!r} cannot be read ({exc})") from None
            check_array(str(path), name, dtype, role)
            if shape is None:
                _check_fits_host(path, name, found, dtype)
            elif found != tuple(shape):
                raise UserError(
                    f"{path}: {role} {name!r} has shape {found}, the model expects {tuple(shape)}"
                )
            try:
                with archive.open(members[name]) as handle:
                    feeds[name] = _read_member(handle, found, fortran, dtype)
            except Exception as exc:
                raise UserError(f"{path}: array {name!r} cannot be read ({exc})") from None
    return feeds


def _read_member(handle, shape: tuple[int, ...], fortran: bool, dtype: np.dtype) -> np.ndarray:
    """An .npy member's array: numpy's reader for numpy's dtypes, `_read_data` past the
    header for the ml_dtypes types it cannot name."""
    if dtype not in ML_DTYPES:
        return np.lib.format.read_array(handle, allow_pickle=False)
    version = np.lib.format.read_magic(handle)
    size = int.from_bytes(handle.read(2 if version == (1, 0) else 4), "little")
    handle.read(size)
    return _read_data(handle, shape, fortran, dtype)


def _check_fits_host(path: Path, name: str, shape: tuple[int, ...], dtype: np.dtype) -> None:
    from onnx2bir.frontend.memory_contracts import host_memory_bytes

    size = int(np.prod(shape, dtype=object)) * dtype.itemsize
    available = host_memory_bytes()
    if available is not None and size > available:
        raise UserError(
            f"{path}: input {name!r} has shape {shape}: {size} bytes, more than this host's "
            f"{available} bytes of memory"
        )
