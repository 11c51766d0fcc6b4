"""Generic lowering of ScatterND (reduction none or add) as one-hot matmuls on the PE array.

data is seen as [M, S]: its first k dims (k = the last dim of indices) flattened into M rows,
the rest into S; updates as [U, S], one row per index tuple. Each index tuple becomes its row
number m_u = Σ idx_i · stride_i (negative components wrapped by + dim_i) in a [U, 1] column
(VectorE), and a one-hot tile H[u, m] = (m == m_u) (GpSimd Iota, is_equal). Per output tile
[128 rows, 512 columns]:
    psum[m, s] = Σ_u H[u, m] · updates[u, s]       (the scattered values; sums for duplicates)
    cover[m]   = Σ_u H[u, m]                       (how many updates hit row m)
accumulating over tiles of 128 updates; "add" returns data + psum, "none" returns
data · (cover == 0) + psum (ONNX leaves duplicate indices undefined for "none"). The row and
update tiles are unrolled at compile time; mul, max and min are refused.
"""

from __future__ import annotations

import math

from onnx2bir.bir.enums import AluOp, Dtype
from onnx2bir.bir.opcodes import MATMUL_MAX_MOVING_FREE, NUM_PARTITIONS
from onnx2bir.codegen.driver import BirCodeGen
from onnx2bir.codegen.lower.elementwise import iota
from onnx2bir.codegen.tiling import Affine, contiguous_strides
from onnx2bir.graph import Node

MAX_TILES = 4096  # (row tiles) x (update tiles) x (column tiles) unrolled


def lower_scatter_nd(cg: BirCodeGen, node: Node) -> None:
    data, indices, updates = node.inputs[:3]
    out = node.outputs[0]
    reduction = node.attr("reduction", "none")
    if reduction not in ("none", "add"):
        raise cg.fail(f"ScatterND reduction {reduction!r} is not supported (none and add are)")
    shape = tuple(cg.graph.tensors[data].shape)
    idx_shape = tuple(cg.graph.tensors[indices].shape)
    k = idx_shape[-1]
    rows, width = math.prod(shape[:k]), math.prod(shape[k:])
    count = math.prod(idx_shape[:-1])
    if rows * width == 0:
        return
    p = NUM_PARTITIONS
    row_tiles, upd_tiles = -(-rows // p), -(-max(count, 1) // p)
    col_tiles = -(-width // MATMUL_MAX_MOVING_FREE)
    if row_tiles * upd_tiles * col_tiles > MAX_TILES:
        raise cg.fail(f"ScatterND of {count} updates into [{rows}, {width}] is too large")
    fp32 = Dtype.FP32
    d_loc, i_loc, u_loc, y_loc = (cg.dram(n).name for n in (data, indices, updates, out))
    strides = contiguous_strides(shape[:k])
    # Row numbers of every update, per tile of 128 updates: [128, upd_tiles] columns.
    lin = cg.sb_tile("rows", p, upd_tiles, fp32)
    comp = cg.sb_tile("component", p, k, fp32)
    wrap = cg.sb_tile("wrap", p, 1, fp32)
    cg.memset(cg.ap(lin), -1.0)  # padding updates hit no row
    for t in range(upd_tiles):
        size = min(p, count - t * p)
        col = cg.ap(lin, [(1, 1)], t, partitions=size)
        cg.dma(
            cg.ap(comp, partitions=size), cg.dram_ap(i_loc, Affine(t * p * k), [(k, size), (1, k)])
        )
        cg.memset(col, 0.0)
        for i in range(k):
            c = cg.ap(comp, [(1, 1)], i, partitions=size)
            w = cg.ap(wrap, partitions=size)
            cg.tensor_scalar(w, c, AluOp.IS_LT, 0.0, AluOp.MULTIPLY, float(shape[i]))
            cg.tensor_tensor(c, c, w, AluOp.ADD)
            cg.tensor_scalar(c, c, AluOp.MULTIPLY, float(strides[i]))
            cg.tensor_tensor(col, col, c, AluOp.ADD)
    numbers = cg.sb_tile("numbers", p, p, fp32)
    onehot = cg.sb_tile("onehot", p, p, fp32)
    ones = cg.sb_tile("ones", p, 1, fp32)
    upd = cg.sb_tile("updates", p, MATMUL_MAX_MOVING_FREE, fp32)
    base = cg.sb_tile("data", p, MATMUL_MAX_MOVING_FREE, fp32)
    keep = cg.sb_tile("keep", p, 1, fp32)
    acc = cg.psum_tile("scattered", p, MATMUL_MAX_MOVING_FREE)
    cover = cg.psum_tile("cover", p, 1)
    iota(cg, cg.ap(numbers), 0, 0, [1])
    cg.memset(cg.ap(ones), 1.0)
    for r in range(row_tiles):
        m0, m = r * p, min(p, rows - r * p)
        for c in range(col_tiles):
            s0, s = (
                c * MATMUL_MAX_MOVING_FREE,
                min(MATMUL_MAX_MOVING_FREE, width - c * MATMUL_MAX_MOVING_FREE),
            )
            psum = cg.ap(acc, [(1, s)], partitions=m)
            for t in range(upd_tiles):
                size = min(p, count - t * p)
                hot = cg.ap(onehot, [(1, m)], partitions=size)
                shifted = cg.ap(wrap, partitions=size)
                cg.tensor_scalar(
                    shifted, cg.ap(lin, [(1, 1)], t, partitions=size), AluOp.SUBTRACT, float(m0)
                )
                cg.tensor_scalar(
                    hot, cg.ap(numbers, [(1, m)], partitions=size), AluOp.IS_EQUAL, shifted
                )
                moving = cg.ap(upd, [(1, s)], partitions=size)
                cg.dma(
                    moving, cg.dram_ap(u_loc, Affine(t * p * width + s0), [(width, size), (1, s)])
                )
                cg.matmul(psum, hot, moving, accumulate=t > 0)
                if reduction == "none":
                    cg.matmul(
                        cg.ap(cover, partitions=m),
                        hot,
                        cg.ap(ones, partitions=size),
                        accumulate=t > 0,
                    )
            tile = cg.ap(base, [(1, s)], partitions=m)
            window = [(width, m), (1, s)]
            cg.dma(tile, cg.dram_ap(d_loc, Affine(m0 * width + s0), window))
            if reduction == "none":
                k_col = cg.ap(keep, partitions=m)
                cg.tensor_scalar(k_col, cg.ap(cover, partitions=m), AluOp.IS_EQUAL, 0.0)
                cg.tensor_scalar(tile, tile, AluOp.MULTIPLY, k_col)
            cg.tensor_tensor(tile, tile, psum, AluOp.ADD)
            cg.dma(cg.dram_ap(y_loc, Affine(m0 * width + s0), window), tile)
