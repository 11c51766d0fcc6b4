"""Tensors stored in the autocast dtype (docs/autocast.md#weights).

A DRAM tensor that the program only ever reads by DMA into on-chip tiles of the autocast
dtype is stored in that dtype: every reader casts it on load anyway, so casting once — at
compile time for a weight, at the store for an intermediate — gives every reader the same
bits and moves half the bytes (bf16 from fp32). Candidates:

- a constant payload (Const, ExternalInputParameter): its location takes the cast dtype and its
  payload is converted the way the DMA would have converted it (`alu.store_as`);
- an Internal tensor every write of which is a DMA (a DMA converts on the way, as `store_as`
  does), e.g. a layout copy or a spilled activation read only by a convolution or matmul.

A tensor read any other way — a bias added in fp32 on VectorE, the table of a one-hot Gather,
an activation a pooling reads, a graph output — keeps its dtype.
"""

from __future__ import annotations

from dataclasses import replace

from onnx2bir.bir.dtypes import store_as
from onnx2bir.bir.enums import PAYLOAD_KINDS, Dtype, Engine, MemoryKind, MemoryType
from onnx2bir.bir.ir import Function, Module
from onnx2bir.codegen.casting import cast_dtype
from onnx2bir.options import CompileOptions


def store_in_cast_dtype(module: Module, function: Function, options: CompileOptions) -> list[str]:
    """Store in the autocast dtype every fp32 DRAM tensor the program reads only into on-chip
    tiles of that dtype (and, for an intermediate, writes only by DMA); returns their names."""
    target = cast_dtype(options)
    if target is None:
        return []
    locations = function.memory_locations
    eligible: dict[str, bool] = {}
    for ins in function.instructions():
        for ap, is_write in ins.accesses():
            loc = locations[ap.loc]
            if loc.memory is not MemoryType.DRAM or loc.dtype is not Dtype.FP32:
                continue
            if loc.kind in PAYLOAD_KINDS:
                ok = not is_write and _cast_load(ins, locations, target)
            elif loc.kind is MemoryKind.INTERNAL:
                ok = ins.engine is Engine.DMA if is_write else _cast_load(ins, locations, target)
            else:
                ok = False
            eligible[ap.loc] = eligible.get(ap.loc, True) and ok
    cast = [
        name
        for name, ok in eligible.items()
        if ok
        and name not in function.outputs
        and (locations[name].kind is MemoryKind.INTERNAL or name in module.constants)
        and _images_alike(name, eligible, locations)
    ]
    for name in cast:
        locations[name] = replace(locations[name], dtype=target)
        if name in module.constants:
            module.constants[name] = store_as(module.constants[name], target)
    return cast


def _cast_load(ins, locations, target: Dtype) -> bool:
    """Whether `ins` is a DMA into an on-chip tile of the cast dtype."""
    if ins.engine is not Engine.DMA or ins.dst is None:
        return False
    dst = locations[ins.dst.loc]
    return dst.memory is not MemoryType.DRAM and dst.dtype is target


def _images_alike(name: str, eligible: dict[str, bool], locations) -> bool:
    """An image of a tensor computed one image at a time (`<tensor>@image<j>`,
    patterns/batch_split.py) is cast only with all its siblings: the images of one tensor
    share one storage dtype, as the validation's oracle reads them as one tensor
    (docs/validation.md)."""
    whole, sep, part = name.rpartition("@image")
    if not sep or not part.isdigit():
        return True
    siblings = [
        n for n in locations if n.startswith(f"{whole}@image") and n[len(whole) + 6 :].isdigit()
    ]
    return all(eligible.get(n, False) for n in siblings)
