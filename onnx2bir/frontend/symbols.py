"""Symbolic input dimensions: one size per symbol, and one message for every missing size.

`propagate_symbols` gives the symbols of an input fixed by `--input-shape` to every other
input sharing them (`input_ids` [batch, seq] fixed at 2x128 sets batch=2 and seq=128 for
`attention_mask` [batch, seq] too) and refuses two sources that disagree. `unset_message`
names every dimension still without a size, and how to set each, in one line.
"""

from __future__ import annotations

import onnx

from onnx2bir.errors import UserError

# Exporters' spellings of "unknown, not tied to any other dim": paddle2onnx and PaddlePaddle
# write "?" for every unknown dim, as an empty dim_param does. Each is a dim of its own.
UNNAMED_SYMBOLS = frozenset({"", "?"})


def is_unnamed(symbol: str) -> bool:
    """Whether a dim_param names no symbol: the dim is unknown and shared with nothing."""
    return symbol.strip() in UNNAMED_SYMBOLS


def propagate_symbols(
    inputs: list[onnx.ValueInfoProto],
    input_shapes: dict[str, tuple[int, ...]],
    dims: dict[str, int],
) -> dict[str, int]:
    """`dims` plus the sizes that `--input-shape` gives to symbols shared with other inputs.

    A symbol names one size wherever it appears: `--input-shape input_ids=2,128` on an input
    declared [batch, seq] sets batch=2 and seq=128 for attention_mask [batch, seq] too. Two
    sources that disagree about a symbol are refused.
    """
    result = dict(dims)
    source = {symbol: f"--dim {symbol}={size}" for symbol, size in dims.items()}
    for value in inputs:
        if value.name not in input_shapes:
            continue
        declared = value.type.tensor_type.shape.dim
        wanted = tuple(input_shapes[value.name])
        if len(declared) and len(declared) != len(wanted):
            raise UserError(
                f"--input-shape {value.name}: the model's input has rank {len(declared)}, "
                f"the given shape {','.join(map(str, wanted))} has rank {len(wanted)}"
            )
        for dim, size in zip(declared, wanted, strict=False):
            if not dim.HasField("dim_param") or is_unnamed(dim.dim_param):
                continue
            symbol = dim.dim_param
            if symbol in result and result[symbol] != size:
                raise UserError(
                    f"symbol {symbol!r} is {result[symbol]} by {source[symbol]} but {size} by "
                    f"the shape of input {value.name} ({','.join(map(str, wanted))}, from "
                    "--input-shape or the arrays of --inputs)"
                )
            result.setdefault(symbol, size)
            source.setdefault(symbol, f"the shape of input {value.name}")
    return result


def unset_message(unset: dict[str, list[str]]) -> str:
    """One message naming every dimension still without a size, and how to set each."""
    named = sorted(key for key in unset if ":" not in key)
    parts = [f"{symbol!r} ({', '.join(unset[symbol])})" for symbol in named]
    parts += [f"unnamed ({where[0]})" for key, where in unset.items() if ":" in key]
    inputs = sorted({where.split("'")[1] for places in unset.values() for where in places})
    dims = " ".join(f"--dim {symbol}=N" for symbol in named)
    shapes = " ".join(f"--input-shape {name}=D0,D1,..." for name in inputs)
    noun = "dimension has" if len(parts) == 1 else "dimensions have"
    how = f"{dims}, or give whole shapes with {shapes}" if dims else shapes
    return (
        f"{len(parts)} symbolic input {noun} no size: {'; '.join(parts)}. Set "
        f"{'them' if len(parts) > 1 else 'it'} with {how} (validate also takes the sizes "
        "from the arrays given with --inputs)"
    )
