"""Generic lowering of Gather and GatherND (GatherElements: `lower_gather_elements`).

Constant indices are resolved at compile time into source offsets, and consecutive picks whose
offsets step evenly (a slice, a repeat, a single index) become one strided DRAM→DRAM DMA each.
When the indices are too irregular for that (more than MAX_CONST_RUNS runs), or are computed
at run time, each pick is an **indirect DMA** (`_gather_rows_dma`): one pick per partition, its
index components folded to a row number (int32 on GpSimd, negative indices normalised), and a
DmaGather brings that row of the DRAM table into its partition — one descriptor per row, so the
cost follows the picks, not the table (docs/device_time.md#dma). A table the memory plan keeps
in SBUF has no DRAM rows to gather; there a pick is a one-hot selection:

- Rows of a float table (Gather, GatherND): one-hot matmul on the PE array. Every partition
  holds the index row (a broadcasting DMA, converted to fp32), VectorE compares it with the
  row number of its partition (an Iota column `p + 128·t` per K tile) to get onehot[i, j], and
  `psum[j, c] += onehotᵀ[i, j] · table[i, c]` accumulates over the K tiles of the table's rows.
  A table that fits (`TABLE_BYTES` per partition) is loaded once and the one-hot blocks of
  a pick tile are all built before its matmuls, which then run back to back; a larger table
  streams K tile by K tile. One 1.0 per column makes the product exact for finite fp32
  values (an inf or NaN anywhere in a table tile spreads NaN through `0 · inf`). GatherND
  first folds its index tuple into a row number Σ idx_m · stride_m on VectorE.
- Rows of an integer or bool table: the same one-hot selection, exact on GpSimd in int32:
  output positions on partitions, a chunk of the table broadcast to every partition,
  `Σ_i onehot[j, i] · table[i, c]` as TensorTensor multiply + TensorReduce add.

Negative indices are normalised on-chip (`idx + n·(idx < 0)`).
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from onnx2bir.bir.enums import ActFunc, AluOp, Dtype
from onnx2bir.bir.ir import AccessPattern
from onnx2bir.bir.opcodes import MATMUL_MAX_MOVING_FREE, NUM_PARTITIONS
from onnx2bir.codegen.driver import BirCodeGen
from onnx2bir.codegen.lower.data import copy_strided
from onnx2bir.codegen.lower.elementwise import iota, scalar_op
from onnx2bir.codegen.tiling import Affine, contiguous_strides, tile_index, tiles
from onnx2bir.graph import Node

MAX_CONST_RUNS = 64
SELECT_CHUNK = 2048  # table elements per partition per VectorE select step


def arithmetic_runs(offsets: list[int]) -> list[tuple[int, int, int, int]]:
    """(first position, count, first offset, step): maximal runs of evenly stepping offsets."""
    runs = []
    i, total = 0, len(offsets)
    while i < total:
        if i + 1 == total:
            runs.append((i, 1, offsets[i], 0))
            break
        step = offsets[i + 1] - offsets[i]
        j = i + 1
        while j + 1 < total and offsets[j + 1] - offsets[j] == step:
            j += 1
        runs.append((i, j - i + 1, offsets[i], step))
        i = j + 1
    return runs


def const_indices(cg: BirCodeGen, name: str, dims: list[int]) -> np.ndarray | None:
    info = cg.graph.tensors[name]
    if not info.is_const:
        return None
    values = info.const.astype(np.int64)
    if dims:  # the last axis holds one index per dim (GatherND); else one index
        return np.where(values < 0, values + np.array(dims), values)
    return values


def fold_index(
    cg: BirCodeGen,
    component,
    flat: AccessPattern,
    tmp: AccessPattern,
    dims: list[int],
    integer: bool,
) -> AccessPattern:
    """Normalise each index component (idx + d·(idx < 0)) and fold them into the row number
    Σ idx_m · Π dims[m+1:]; `component(m)` is the access pattern of component m."""
    for m, size in enumerate(dims):
        comp = component(m)
        scalar_op(cg, tmp, comp, integer, AluOp.IS_LT, 0, AluOp.MULTIPLY, size)
        cg.tensor_tensor(comp, comp, tmp, AluOp.ADD)
    if len(dims) == 1:
        return component(0)
    for m in range(len(dims)):
        stride = math.prod(dims[m + 1 :])
        if m == 0:
            scalar_op(cg, flat, component(0), integer, AluOp.MULTIPLY, stride)
        else:
            scalar_op(cg, tmp, component(m), integer, AluOp.MULTIPLY, stride)
            cg.tensor_tensor(flat, flat, tmp, AluOp.ADD)
    return flat


def gather_rows(
    cg: BirCodeGen,
    data: str,
    outer: int,
    rows: int,
    inner: int,
    indices: str,
    picks: int,
    dims: list[int],
    idx_outer_stride: int,
    out: str,
) -> None:
    """out[o, j, :] = table_o[flat(indices[o, j, :]), :] for tables [outer, rows, inner].

    Each pick has len(dims) index components (1 for Gather), which fold to a row number.
    """
    dtype = cg.graph.tensors[data].dtype
    args = (cg, data, outer, rows, inner, indices, picks, dims, idx_outer_stride, out)
    if cg.dram(data).name not in cg.homes:
        _gather_rows_dma(*args)
    elif dtype.is_float:
        _gather_rows_pe(*args)
    else:
        _gather_rows_dve(*args)


ROW_CHUNK = 4096  # table elements per partition an indirect DMA gathers at once


def index_tiles(cg, components: int) -> tuple:
    """The integer tiles (int32 on chip) `rows_per_partition` works in: the index
    components, the row number and a scratch column, one pick per partition."""
    p, i64 = NUM_PARTITIONS, Dtype.INT64
    return (
        cg.sb_tile("indices", p, components, i64),
        cg.sb_tile("flat", p, 1, i64),
        cg.sb_tile("tmp", p, 1, i64),
    )


def rows_per_partition(cg, scratch, idx_loc: str, offset, j, dims: list[int]) -> AccessPattern:
    """Picks j of the index tensor (from element `offset`), one per partition, folded to the
    row number each names (int32 on GpSimd, negative indices normalised)."""
    idx_sb, flat_sb, tmp_sb = scratch
    k_parts = len(dims)
    cg.dma(
        cg.ap(idx_sb, [(1, k_parts)], partitions=j.size),
        cg.dram_ap(idx_loc, offset + j.start * k_parts, [(k_parts, j.size), (1, k_parts)]),
    )
    return fold_index(
        cg,
        lambda m: cg.ap(idx_sb, [(1, 1)], m, partitions=j.size),
        cg.ap(flat_sb, partitions=j.size),
        cg.ap(tmp_sb, partitions=j.size),
        dims,
        integer=True,
    )


def _gather_rows_dma(
    cg, data, outer, rows, inner, indices, picks, dims, idx_outer_stride, out
) -> None:
    """One pick per partition: its index components (int32 on chip) fold to a row number on VectorE,
    and an indirect DMA brings that row of the DRAM table into the partition."""
    p = NUM_PARTITIONS
    cols = min(inner, ROW_CHUNK)
    scratch = index_tiles(cg, len(dims))
    gathered = cg.sb_tile("rows", p, cols, cg.graph.tensors[data].dtype)
    idx_loc, data_loc, out_loc = cg.dram(indices).name, cg.dram(data).name, cg.dram(out).name
    for o in tiles(cg, outer, 1, "o"):
        for j in tiles(cg, picks, p, "j"):
            flat = rows_per_partition(cg, scratch, idx_loc, o.start * idx_outer_stride, j, dims)
            for c in tiles(cg, inner, cols, "c"):
                row = cg.ap(gathered, [(1, c.size)], partitions=j.size)
                table = cg.dram_ap(
                    data_loc, o.start * (rows * inner) + c.start, [(inner, rows), (1, c.size)]
                )
                cg.dma_gather(row, table, flat)
                cg.dma(
                    cg.dram_ap(
                        out_loc,
                        o.start * (picks * inner) + j.start * inner + c.start,
                        [(inner, j.size), (1, c.size)],
                    ),
                    row,
                )


def _gather_rows_pe(
    cg, data, outer, rows, inner, indices, picks, dims, idx_outer_stride, out
) -> None:
    p, fp32 = NUM_PARTITIONS, Dtype.FP32
    k_parts = len(dims)
    k_tiles = -(-rows // p)
    # A table that fits is loaded once (per outer index) and every one-hot column block of a
    # pick tile is built before its matmuls, which then run back to back.
    resident = k_tiles * inner * fp32.itemsize <= min(TABLE_BYTES, cg.sb_free_bytes() // 2)
    row_ids = cg.sb_tile("row_ids", p, k_tiles, fp32)
    iota(cg, cg.ap(row_ids), 0, 1, [p])  # row_ids[q, t] = q + 128·t
    idx_sb = cg.sb_tile("indices", p, k_parts * p, fp32)
    flat_sb = cg.sb_tile("flat", p, p, fp32)
    tmp_sb = cg.sb_tile("tmp", p, p, fp32)
    onehot = cg.sb_tile("onehot", p, (k_tiles if resident else 1) * p, fp32)
    table = cg.sb_tile("table", p, k_tiles * inner if resident else MATMUL_MAX_MOVING_FREE, fp32)
    acc = cg.psum_tile("acc", p, MATMUL_MAX_MOVING_FREE)
    result = cg.sb_tile("result", p, MATMUL_MAX_MOVING_FREE, fp32)
    idx_loc, data_loc, out_loc = cg.dram(indices).name, cg.dram(data).name, cg.dram(out).name

    def mask_of(k, j) -> AccessPattern:
        at = tile_index(k, p) * p if resident else Affine()
        return cg.ap(onehot, [(1, j.size)], at, partitions=k.size)

    def make_mask(k, j, flat) -> None:
        cg.tensor_scalar(
            mask_of(k, j),
            replace(flat, num_partitions=k.size),
            AluOp.IS_EQUAL,
            cg.ap(row_ids, [(1, 1)], tile_index(k, p), partitions=k.size),
        )

    for o in tiles(cg, outer, 1, "o"):
        if resident:
            # One DMA per K tile, unrolled so that they take different queues.
            for t, k0 in enumerate(range(0, rows, p)):
                size = min(p, rows - k0)
                cg.dma(
                    cg.ap(table, [(1, inner)], t * inner, partitions=size),
                    cg.dram_ap(
                        data_loc, o.start * (rows * inner) + k0 * inner, [(inner, size), (1, inner)]
                    ),
                )
        for j in tiles(cg, picks, p, "j"):
            # Every partition gets the tile's index row, laid out [component, pick].
            cg.dma(
                cg.ap(idx_sb, [(1, k_parts * j.size)]),
                cg.dram_ap(
                    idx_loc,
                    o.start * idx_outer_stride + j.start * k_parts,
                    [(0, p), (1, k_parts), (k_parts, j.size)],
                ),
            )
            flat = fold_index(
                cg,
                lambda m, j=j: cg.ap(idx_sb, [(1, j.size)], m * j.size),
                cg.ap(flat_sb, [(1, j.size)]),
                cg.ap(tmp_sb, [(1, j.size)]),
                dims,
                integer=False,
            )
            if resident:
                for k in tiles(cg, rows, p, "km"):
                    make_mask(k, j, flat)
            for c in tiles(cg, inner, MATMUL_MAX_MOVING_FREE, "c"):
                psum = cg.ap(acc, [(1, c.size)], partitions=j.size)
                for k in tiles(cg, rows, p, "k", peel_first=True):
                    if resident:
                        rows_sb = cg.ap(
                            table,
                            [(1, c.size)],
                            tile_index(k, p) * inner + c.start,
                            partitions=k.size,
                        )
                    else:
                        make_mask(k, j, flat)
                        rows_sb = cg.ap(table, [(1, c.size)], partitions=k.size)
                        cg.dma(
                            rows_sb,
                            cg.dram_ap(
                                data_loc,
                                o.start * (rows * inner) + k.start * inner + c.start,
                                [(inner, k.size), (1, c.size)],
                            ),
                        )
                    cg.matmul(psum, mask_of(k, j), rows_sb, accumulate=not k.first)
                res = cg.ap(result, [(1, c.size)], partitions=j.size)
                cg.activation(res, psum, ActFunc.COPY)
                cg.dma(
                    cg.dram_ap(
                        out_loc,
                        o.start * (picks * inner) + j.start * inner + c.start,
                        [(inner, j.size), (1, c.size)],
                    ),
                    res,
                )


TABLE_BYTES = 64 * 1024  # SBUF per partition a gathered float table may take to stay resident


def _gather_rows_dve(
    cg, data, outer, rows, inner, indices, picks, dims, idx_outer_stride, out
) -> None:
    p, i64 = NUM_PARTITIONS, Dtype.INT64
    k_parts = len(dims)
    cols = min(inner, 256)
    chunk = max(1, min(rows, SELECT_CHUNK // cols))
    scratch = index_tiles(cg, k_parts)
    onehot = cg.sb_tile("onehot", p, chunk, i64)
    table = cg.sb_tile("table", p, chunk * cols, i64)
    product = cg.sb_tile("product", p, chunk * cols, i64)
    partial = cg.sb_tile("partial", p, cols, i64)
    acc = cg.sb_tile("acc", p, cols, i64)
    idx_loc, data_loc, out_loc = cg.dram(indices).name, cg.dram(data).name, cg.dram(out).name
    for o in tiles(cg, outer, 1, "o"):
        for j in tiles(cg, picks, p, "j"):
            flat = rows_per_partition(cg, scratch, idx_loc, o.start * idx_outer_stride, j, dims)
            for c in tiles(cg, inner, cols, "c"):
                total = cg.ap(acc, [(1, c.size)], partitions=j.size)
                for first in range(0, rows, chunk):
                    size = min(chunk, rows - first)
                    mask = cg.ap(onehot, [(1, size)], partitions=j.size)
                    iota(cg, mask, first, 0, [1])
                    cg.tensor_scalar(mask, mask, AluOp.IS_EQUAL, flat)
                    # The table chunk [size, c] on every partition.
                    cg.dma(
                        cg.ap(table, [(1, size * c.size)], partitions=j.size),
                        cg.dram_ap(
                            data_loc,
                            o.start * (rows * inner) + first * inner + c.start,
                            [(0, j.size), (inner, size), (1, c.size)],
                        ),
                    )
                    walk = [(size, c.size), (1, size)]  # [c, i]: reduce over the rows i
                    cg.tensor_tensor(
                        cg.ap(product, walk, partitions=j.size),
                        cg.ap(table, [(1, c.size), (c.size, size)], partitions=j.size),
                        cg.ap(onehot, [(0, c.size), (1, size)], partitions=j.size),
                        AluOp.MULTIPLY,
                    )
                    target = (
                        total if first == 0 else cg.ap(partial, [(1, c.size)], partitions=j.size)
                    )
                    cg.tensor_reduce(
                        target, cg.ap(product, walk, partitions=j.size), AluOp.ADD, axes=1
                    )
                    if first:
                        cg.tensor_tensor(total, total, target, AluOp.ADD)
                cg.dma(
                    cg.dram_ap(
                        out_loc,
                        o.start * (picks * inner) + j.start * inner + c.start,
                        [(inner, j.size), (1, c.size)],
                    ),
                    total,
                )


def lower_gather(cg: BirCodeGen, node: Node) -> None:
    data, indices = node.inputs[:2]
    out = node.outputs[0]
    shape = tuple(cg.graph.tensors[data].shape)
    axis = int(node.attr("axis", 0)) % len(shape)
    outer, n, inner = math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1 :])
    picks = math.prod(cg.graph.tensors[indices].shape)
    if picks * outer * inner == 0:
        return
    const = const_indices(cg, indices, [])
    if const is not None:
        flat = np.where(const < 0, const + n, const).reshape(-1)
        runs = arithmetic_runs([int(v) * inner for v in flat])
        if len(runs) <= MAX_CONST_RUNS:
            dst, src = cg.dram(out).name, cg.dram(data).name
            for position, count, offset, step in runs:
                copy_strided(
                    cg,
                    dst,
                    Affine(position * inner),
                    src,
                    Affine(offset),
                    (outer, count, inner),
                    (picks * inner, inner, 1),
                    (n * inner, step, 1),
                )
            return
    gather_rows(cg, data, outer, n, inner, indices, picks, [n], 0, out)


def lower_gather_nd(cg: BirCodeGen, node: Node) -> None:
    data, indices = node.inputs[:2]
    out = node.outputs[0]
    shape = tuple(cg.graph.tensors[data].shape)
    idx_shape = tuple(cg.graph.tensors[indices].shape)
    batch_dims = int(node.attr("batch_dims", 0))
    k = idx_shape[-1]
    batch = math.prod(shape[:batch_dims])
    dims = list(shape[batch_dims : batch_dims + k])
    rows, inner = math.prod(dims), math.prod(shape[batch_dims + k :])
    picks = math.prod(idx_shape[batch_dims:-1])
    if batch * picks * inner == 0:
        return
    const = const_indices(cg, indices, dims)
    if const is not None:
        row = (const.reshape(batch, picks, k) * np.array(contiguous_strides(tuple(dims)))).sum(-1)
        offsets = (row + np.arange(batch)[:, None] * rows) * inner
        runs = arithmetic_runs([int(v) for v in offsets.reshape(-1)])
        if len(runs) <= MAX_CONST_RUNS:
            dst, src = cg.dram(out).name, cg.dram(data).name
            for position, count, offset, step in runs:
                copy_strided(
                    cg,
                    dst,
                    Affine(position * inner),
                    src,
                    Affine(offset),
                    (count, inner),
                    (inner, 1),
                    (step, 1),
                )
            return
    gather_rows(cg, data, batch, rows, inner, indices, picks, dims, picks * k, out)
