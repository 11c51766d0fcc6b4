"""Reading `validate --inputs`: only regular files and folders, only numeric and bool arrays.

`check_inputs_source` runs before any work (a FIFO or a device would block or never end);
`read_npz` reads each wanted array's header before its data, so a wrong dtype or a shape of
2^40 elements is refused without allocating it; `check_array` refuses what cannot be a model
input (strings, objects, structured, void, complex, datetime). Rules in
`docs/input_contracts.md#flags`.
"""

from __future__ import annotations

import os
import stat
import zipfile
from pathlib import Path

import ml_dtypes
import numpy as np

from onnx2bir.errors import UserError

# bool, signed and unsigned integers, floats.
NUMERIC_KINDS = "biuf"
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


def check_array(where: str, name: str, dtype: np.dtype) -> None:
    if dtype.kind not in NUMERIC_KINDS and dtype != np.dtype(ml_dtypes.bfloat16):
        what = _KIND_NAMES.get(dtype.kind, str(dtype))
        raise UserError(
            f"{where}: input {name!r} holds {what} values ({dtype}); "
            "inputs must be numeric or bool arrays"
        )


def _header(archive: zipfile.ZipFile, member: str) -> tuple[tuple[int, ...], np.dtype]:
    with archive.open(member) as handle:
        version = np.lib.format.read_magic(handle)
        if version == (1, 0):
            shape, _, dtype = np.lib.format.read_array_header_1_0(handle)
        else:
            shape, _, dtype = np.lib.format.read_array_header_2_0(handle)
    return tuple(shape), dtype


def read_npz(path: Path, expected: dict[str, tuple[int, ...] | None]) -> dict[str, np.ndarray]:
    """The arrays of `path` named in `expected` (name: shape); each checked before it is read.

    A shape of None (an input with symbolic dims, which the array will fix) is not compared;
    such an array must still fit the host's memory."""
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
            try:
                found, dtype = _header(archive, members[name])
            except Exception as exc:  # a damaged member: zlib, zipfile or numpy's header parser
                raise UserError(f"{path}: array {name!r} cannot be read ({exc})") from None
            check_array(str(path), name, dtype)
            if shape is None:
                _check_fits_host(path, name, found, dtype)
            elif found != tuple(shape):
                raise UserError(
                    f"{path}: input {name!r} has shape {found}, the model expects {tuple(shape)}"
                )
            try:
                with archive.open(members[name]) as handle:
                    feeds[name] = np.lib.format.read_array(handle, allow_pickle=False)
            except Exception as exc:
                raise UserError(f"{path}: array {name!r} cannot be read ({exc})") from None
    return feeds


def _check_fits_host(path: Path, name: str, shape: tuple[int, ...], dtype: np.dtype) -> None:
    from onnx2bir.frontend.memory_contracts import host_memory_bytes

    size = int(np.prod(shape, dtype=object)) * dtype.itemsize
    available = host_memory_bytes()
    if available is not None and size > available:
        raise UserError(
            f"{path}: input {name!r} has shape {shape}: {size} bytes, more than this host's "
            f"{available} bytes of memory"
        )
