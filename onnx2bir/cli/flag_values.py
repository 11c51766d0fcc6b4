"""Command-line values, parsed and range-checked while the arguments are read.

Each function is an argparse `type=`: it returns the value or raises `ArgumentTypeError`, whose
message argparse prints as `onnx2bir: error: argument FLAG: MESSAGE` (exit 2). The ranges are
in `docs/input_contracts.md#flags`.
"""

from __future__ import annotations

import argparse
import math
import re

# ONNX dims are int64; a tensor of 2^62 elements is refused later by the memory contract, but a
# size that does not fit int64 cannot even be written into the model.
MAX_DIM = (1 << 63) - 1
MAX_SEED = (1 << 128) - 1
MAX_MEGABYTES = float(1 << 40)
_ASCII_INT = re.compile(r"[0-9]+")


def _positive_int(text: str, what: str, original: str) -> int:
    text = text.strip()
    if not _ASCII_INT.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"{what}: {text!r} is not a positive integer in {original!r}"
        )
    value = int(text)
    if not 0 < value <= MAX_DIM:
        raise argparse.ArgumentTypeError(
            f"{what}: {text} is out of range in {original!r} (1 to 2^63-1)"
        )
    return value


def input_shape(text: str) -> tuple[str, tuple[int, ...]]:
    """`NAME=D0,D1,...` with every D a positive integer."""
    name, sep, dims = text.rpartition("=")
    if not sep or not name or not dims.strip():
        raise argparse.ArgumentTypeError(f"expected NAME=D0,D1,... with positive sizes: {text!r}")
    return name, tuple(_positive_int(d, "size", text) for d in dims.split(","))


def dim(text: str) -> tuple[str, int]:
    """`SYMBOL=N` with N a positive integer (ASCII digits)."""
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected SYMBOL=N with N a positive integer: {text!r}")
    return name, _positive_int(value, "N", text)


def input_value(text: str) -> tuple[str, tuple[int | float, ...]]:
    """`NAME=V[,V...]` with every V a number (integer, decimal or true/false)."""
    name, sep, values = text.rpartition("=")
    if not sep or not name or not values.strip():
        raise argparse.ArgumentTypeError(f"expected NAME=V[,V...] with numbers: {text!r}")
    return name, tuple(_number(v, text) for v in values.split(","))


def _number(text: str, original: str) -> int | float:
    text = text.strip()
    if text.lower() in ("true", "false"):
        return int(text.lower() == "true")
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number in {original!r}") from None
    return value


def seed(text: str) -> int:
    """A non-negative integer below 2^128 (numpy's seed range)."""
    text = text.strip()
    if not _ASCII_INT.fullmatch(text) or int(text) > MAX_SEED:
        raise argparse.ArgumentTypeError(f"expected an integer from 0 to 2^128-1: {text!r}")
    return int(text)


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None


def positive_megabytes(text: str) -> float:
    """A number of MB > 0 and at most 2^40 (so its byte count is an integer)."""
    value = _float(text)
    if not math.isfinite(value) or not 0 < value <= MAX_MEGABYTES:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a number of MB > 0 and <= 2^40")
    return value


def tolerance(text: str) -> float:
    """A finite number >= 0."""
    value = _float(text)
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a finite number >= 0")
    return value


def exclude_list(text: str) -> list[str]:
    """`--auto-cast-exclude NODE|OP_TYPE[,...]`: names separated by commas, none empty."""
    names = [name.strip() for name in text.split(",")]
    if not all(names):
        raise argparse.ArgumentTypeError(
            f"expected NODE|OP_TYPE[,...] without empty names: {text!r}"
        )
    return names


_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
    "tib": 1 << 40,
}


def byte_size(text: str) -> int:
    """A size in bytes, with an optional unit: 6GiB, 512MiB, 8GB, 2e9 (`--memory-limit`)."""
    match = re.fullmatch(r"\s*([0-9.eE+]+)\s*([A-Za-z]*)\s*", text)
    unit = match and _UNITS.get(match.group(2).lower())
    try:
        value = float(match.group(1)) * unit if unit else float("nan")
    except ValueError:
        value = float("nan")
    if not (math.isfinite(value) and value >= 1):
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected a size such as 6GiB, 512MiB or 8GB (units B, KB, MB, GB, TB, "
            "KiB, MiB, GiB, TiB)"
        )
    return int(value)


def count(text: str) -> int:
    """A positive integer (`--jobs`)."""
    return _positive_int(text, "N", text)


def segment_count(text: str) -> int:
    """An integer of at least 2 (`--segments`: one segment is the whole model)."""
    value = _positive_int(text, "N", text)
    if value < 2:
        raise argparse.ArgumentTypeError(f"N: at least 2 (one segment is the whole model): {text}")
    return value
