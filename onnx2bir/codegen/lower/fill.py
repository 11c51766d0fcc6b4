"""Generic lowering of ConstantOfShape: a large fill written by the machine, not stored.

The importer folds a small ConstantOfShape into an initializer; a large one (a weight the onnx
light models make at run time, an all-zero cache) stays a node so that its value is never
materialised on the host (`onnx2bir.frontend.folding`). Here one SBUF tile [128, FILL_TILE] is
set by a single Memset on GpSimd and then stored over the output, row-tile by row-tile, by DMA: the
output's elements are walked as [rows, FILL_TILE] with the rows in a BIR loop.
"""

from __future__ import annotations

import math

import numpy as np

from onnx2bir.bir.opcodes import NUM_PARTITIONS
from onnx2bir.codegen.driver import BirCodeGen
from onnx2bir.codegen.lower.elementwise import fill_exact
from onnx2bir.codegen.tiling import Affine, tiles
from onnx2bir.graph import Node

FILL_TILE = 2048


def lower_constant_of_shape(cg: BirCodeGen, node: Node) -> None:
    value = node.attr("value")
    value = np.zeros(1, np.float32) if value is None else np.asarray(value).reshape(-1)
    fill_tensor(cg, node.outputs[0], value[0].item() if value.size else 0)


def fill_tensor(cg: BirCodeGen, out: str, fill_value: float | int) -> None:
    """Every element of tensor `out` set to `fill_value` (a Memset tile stored by DMA)."""
    info = cg.graph.tensors[out]
    count = math.prod(info.shape)
    if count == 0:
        return
    cols = min(FILL_TILE, count)
    tile = cg.sb_tile("fill", NUM_PARTITIONS, cols, info.dtype)
    fill_exact(cg, cg.ap(tile), fill_value, not info.dtype.is_float)
    loc = cg.dram(out).name
    rows, rest = divmod(count, cols)
    for row in tiles(cg, rows, NUM_PARTITIONS, "r"):
        cg.dma(
            cg.dram_ap(loc, row.start * cols, [(cols, row.size), (1, cols)]),
            cg.ap(tile, partitions=row.size),
        )
    if rest:
        cg.dma(
            cg.dram_ap(loc, Affine(rows * cols), [(1, rest)]),
            cg.ap(tile, [(1, rest)], partitions=1),
        )
