"""Generic lowering of GatherElements: out[e] = data[e with its `axis` coordinate := idx[e]].

Constant indices become source offsets, and evenly stepping runs of them one strided
DRAM→DRAM DMA each (`lower_gather.arithmetic_runs`). Run-time indices (or constants too
irregular for a few DMAs) select on VectorE: the positions of the largest index dim on
partitions, the other dims as loops, and the whole source line along `axis` (one strided DMA,
stride 0 across partitions when the partition dim is `axis` itself) on the free dim. An Iota
of line positions compared with the per-partition index (normalised as idx + n·(idx < 0)) is
the one-hot mask. Floats select with min/max, inf-safe: `max_i min(line[i], ±inf)` with +inf
only at the index; integers multiply by the mask and add, exact in int32 on GpSimd.
"""

from __future__ import annotations

import math

import numpy as np

from onnx2bir.bir.enums import AluOp, Dtype
from onnx2bir.bir.opcodes import NUM_PARTITIONS
from onnx2bir.codegen.driver import BirCodeGen
from onnx2bir.codegen.lower.data import copy_strided
from onnx2bir.codegen.lower.elementwise import iota, scalar_op
from onnx2bir.codegen.lower.gather import (
    MAX_CONST_RUNS,
    SELECT_CHUNK,
    arithmetic_runs,
    const_indices,
)
from onnx2bir.codegen.lower.logic import INF
from onnx2bir.codegen.tiling import Affine, contiguous_strides, nested_loops, tiles
from onnx2bir.graph import Node


def lower_gather_elements(cg: BirCodeGen, node: Node) -> None:
    data, indices = node.inputs[:2]
    out = node.outputs[0]
    shape = tuple(cg.graph.tensors[data].shape)
    idx_shape = tuple(cg.graph.tensors[indices].shape)
    rank = len(shape)
    axis = int(node.attr("axis", 0)) % rank
    n = shape[axis]
    if math.prod(idx_shape) == 0:
        return
    d_strides, i_strides = contiguous_strides(shape), contiguous_strides(idx_shape)
    const = const_indices(cg, indices, [])
    if const is not None:
        coords = np.indices(idx_shape, dtype=np.int64)
        coords[axis] = np.where(const < 0, const + n, const)
        offsets = sum(coords[d] * d_strides[d] for d in range(rank)).reshape(-1)
        runs = arithmetic_runs([int(v) for v in offsets])
        if len(runs) <= MAX_CONST_RUNS:
            dst, src = cg.dram(out).name, cg.dram(data).name
            for position, count, offset, step in runs:
                copy_strided(
                    cg, dst, Affine(position), src, Affine(offset), (count,), (1,), (step,)
                )
            return
    _gather_elements_dve(cg, data, indices, out, shape, idx_shape, axis, d_strides, i_strides)


def _gather_elements_dve(
    cg, data, indices, out, shape, idx_shape, axis, d_strides, i_strides
) -> None:
    """Positions of the largest index dim on partitions, the other dims as loops."""
    rank, n = len(shape), shape[axis]
    dtype = Dtype.FP32 if cg.dram(data).dtype.is_float else Dtype.INT64
    integer = dtype is Dtype.INT64
    part = max(range(rank), key=lambda d: (idx_shape[d], d))
    loop_dims = [d for d in range(rank) if d != part]
    data_part_stride = 0 if part == axis else d_strides[part]
    chunk = min(n, SELECT_CHUNK)
    chunks = -(-n // chunk)
    p = NUM_PARTITIONS
    idx_sb = cg.sb_tile("index", p, 1, dtype)
    tmp_sb = cg.sb_tile("tmp", p, 1, dtype)
    ids = cg.sb_tile("ids", p, chunk, dtype)
    line = cg.sb_tile("line", p, chunk, dtype)
    mask = cg.sb_tile("mask", p, chunk, dtype)
    partial = cg.sb_tile("partial", p, chunks, dtype)
    if chunks == 1:
        iota(cg, cg.ap(ids), 0, 0, [1])
    combine = AluOp.ADD if integer else AluOp.MAX
    idx_loc, data_loc, out_loc = cg.dram(indices).name, cg.dram(data).name, cg.dram(out).name
    strides = [
        tuple(i_strides[d] for d in loop_dims),
        tuple(0 if d == axis else d_strides[d] for d in loop_dims),
    ]
    for idx_off, data_off in nested_loops(cg, tuple(idx_shape[d] for d in loop_dims), strides):
        for t in tiles(cg, idx_shape[part], p, "p"):
            index = cg.ap(idx_sb, partitions=t.size)
            cg.dma(
                index,
                cg.dram_ap(
                    idx_loc,
                    idx_off + t.start * i_strides[part],
                    [(i_strides[part], t.size), (1, 1)],
                ),
            )
            tmp = cg.ap(tmp_sb, partitions=t.size)
            scalar_op(cg, tmp, index, integer, AluOp.IS_LT, 0, AluOp.MULTIPLY, n)
            cg.tensor_tensor(index, index, tmp, AluOp.ADD)
            for number, first in enumerate(range(0, n, chunk)):
                size = min(chunk, n - first)
                ids_ap = cg.ap(ids, [(1, size)], partitions=t.size)
                if chunks > 1:
                    iota(cg, ids_ap, first, 0, [1])
                line_ap = cg.ap(line, [(1, size)], partitions=t.size)
                cg.dma(
                    line_ap,
                    cg.dram_ap(
                        data_loc,
                        data_off + t.start * data_part_stride + first * d_strides[axis],
                        [(data_part_stride, t.size), (d_strides[axis], size)],
                    ),
                )
                mask_ap = cg.ap(mask, [(1, size)], partitions=t.size)
                if integer:
                    cg.tensor_scalar(mask_ap, ids_ap, AluOp.IS_EQUAL, index)
                    cg.tensor_tensor(line_ap, line_ap, mask_ap, AluOp.MULTIPLY)
                else:
                    cg.tensor_scalar(mask_ap, ids_ap, AluOp.IS_EQUAL, index, AluOp.SUBTRACT, 0.5)
                    cg.tensor_scalar(mask_ap, mask_ap, AluOp.MULTIPLY, INF)
                    cg.tensor_tensor(line_ap, line_ap, mask_ap, AluOp.MIN)
                cg.tensor_reduce(
                    cg.ap(partial, [(1, 1)], number, partitions=t.size), line_ap, combine, axes=1
                )
            result = cg.ap(partial, [(1, 1)], partitions=t.size)
            if chunks > 1:
                cg.tensor_reduce(tmp, cg.ap(partial, partitions=t.size), combine, axes=1)
                result = tmp
            cg.dma(
                cg.dram_ap(
                    out_loc,
                    idx_off + t.start * i_strides[part],
                    [(i_strides[part], t.size), (1, 1)],
                ),
                result,
            )
