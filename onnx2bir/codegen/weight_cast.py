"""Weights stored in the autocast dtype (docs/autocast.md#weights).

A constant payload (a Const or ExternalInputParameter DRAM location) that the program only
ever reads by DMA into on-chip tiles of the autocast dtype is cast once, at compile time: its
location takes the cast dtype and its payload is converted the way the DMA would have
converted it (`alu.store_as`). The loads then move half the bytes (bf16 from fp32) and compute
the same values. A payload read any other way — a bias added in fp32, a lookup table, a
constant that is also a graph output — keeps its dtype.
"""

from __future__ import annotations

from dataclasses import replace

from onnx2bir.bir.enums import PAYLOAD_KINDS, Dtype, Engine, MemoryType
from onnx2bir.bir.ir import Function, Module
from onnx2bir.codegen.casting import cast_dtype
from onnx2bir.options import CompileOptions
from onnx2bir.runtime.alu import store_as


def cast_weights(module: Module, function: Function, options: CompileOptions) -> list[str]:
    """Store in the autocast dtype every fp32 payload the program reads only into on-chip
    tiles of that dtype; returns the names of the locations cast."""
    target = cast_dtype(options)
    if target is None:
        return []
    locations = function.memory_locations
    only_cast_loads: dict[str, bool] = {}
    for ins in function.instructions():
        for ap, is_write in ins.accesses():
            loc = locations[ap.loc]
            if loc.kind not in PAYLOAD_KINDS or loc.memory is not MemoryType.DRAM:
                continue
            dst = locations[ins.dst.loc] if ins.dst is not None else None
            cast_load = (
                not is_write
                and ins.engine is Engine.DMA
                and dst is not None
                and dst.memory is not MemoryType.DRAM
                and dst.dtype is target
            )
            only_cast_loads[ap.loc] = only_cast_loads.get(ap.loc, True) and cast_load
    cast = [
        name
        for name, only in only_cast_loads.items()
        if only
        and locations[name].dtype is Dtype.FP32
        and name in module.constants
        and name not in function.outputs
    ]
    for name in cast:
        locations[name] = replace(locations[name], dtype=target)
        module.constants[name] = store_as(module.constants[name], target)
    return cast
