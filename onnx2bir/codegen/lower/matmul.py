"""Generic lowering of MatMul (batched, broadcasting) and Gemm on the PE array.

`Y[M, N] = A[M, K] · B[K, N]` is tiled M by 128 (PE columns), N by 512 (one PSUM bank) and
K by 128 (partitions, the contraction). Per output tile the K tiles accumulate in PSUM:
`matmul(psum[m, n], stationary=Aᵀ[k, m], moving=B[k, n])`, the first one overwriting, the rest
adding. The tile is evicted from PSUM by ScalarE (carrying Gemm's alpha), gets beta·C added on
VectorE, and goes back to DRAM by DMA.

An operand tile is loaded with one DMA when its rows are contiguous in DRAM. When only its
columns are (the tile is the transpose of a contiguous block, e.g. Aᵀ for a row-major A), the
contiguous block is loaded and transposed on the PE array against the resident identity
matrix: `matmul(psum[r, c], stationary=block[c, r], moving=I[c, c])` gives blockᵀ.

Under the general autocast the operand tiles are in the cast dtype (`codegen/casting.py`): the
loading DMA or the TensorCopy out of the transpose's PSUM tile is the cast. The transposes
themselves stay fp32 (exact), PSUM accumulates fp32, the eviction writes fp32.

Panels. When the product has more than one output tile and b, whole, takes at most
`matmul_panels.B_WHOLE_BYTES` per partition (a projection's weight), b is loaded once (one DMA
per K tile, on different queues) and each row tile of a gets its panel: its K tiles of Aᵀ,
flipped back to back through `PANEL_FLIPS` PSUM slots, then multiplied by every column block.
A flip is done once per row tile rather than once per output tile, and the PE array runs the
flips and the accumulation chains without waiting for each copy in between
(`matmul_panels.py`).

Batched products of one tile each whose b changes with the innermost batch index (attention's
per-head Q·Kᵀ and P·V) go to `matmul_heads.py`: per pass of that loop, every b in one DMA and
every a flipped back to back, then the matmuls.

Operands and results in SBUF homes are read and written in place
(docs/memory_planner.md#direct-operands).

MatMul and Gemm rotate their tiles over buffer copies along the innermost output-tile loop
(batch, M or N) with more than one tile (docs/buffers.md#lowerings): the operand loads of one
output tile overlap the matmuls of the previous one and that loop is `parallel`; the K loop
accumulates into one PSUM tile and stays sequential.
"""

from __future__ import annotations

import math

from onnx2bir.bir.enums import Dtype
from onnx2bir.bir.opcodes import MATMUL_MAX_MOVING_FREE, NUM_PARTITIONS
from onnx2bir.codegen.driver import BirCodeGen
from onnx2bir.codegen.matmul_heads import emit_heads, heads_fit
from onnx2bir.codegen.matmul_panels import try_panels
from onnx2bir.codegen.matmul_tiles import (
    MatmulTiles,
    MatrixView,
    evict_tile,
    load_tile,
    stored_transposed,
)
from onnx2bir.codegen.tiling import (
    Affine,
    broadcast_strides,
    buffer_count,
    contiguous_strides,
    rotating_level,
    tile_count,
    tile_index,
    tiles,
)
from onnx2bir.graph import Node


def emit_gemm(
    cg: BirCodeGen,
    a: MatrixView,
    b: MatrixView,
    y: MatrixView,
    mm: MatmulTiles,
    alpha: float = 1.0,
    c: MatrixView | None = None,
    beta: float = 1.0,
    slot: Affine | None = None,
) -> None:
    """y = alpha·(a @ b) + beta·c, with a [M, K], b [K, N], y and c [M, N].

    With `mm.copies` > 1 and no `slot`, the innermost of the M and N loops with more than one
    tile rotates the copies; a `slot` from an enclosing (batch) loop picks one copy instead.

    When a's rows need more than one tile and b's column block fits (`B_BLOCK_BYTES` per
    partition), the K tiles of b's column block are loaded once and stay in SBUF while the
    row tiles of a pass by (rotating the copies): each weight is read once, not once per row
    tile.
    """
    k_tiles = tile_count(a.cols, NUM_PARTITIONS)
    n_size = min(b.cols, MATMUL_MAX_MOVING_FREE)
    block_bytes = k_tiles * n_size * mm.moving_dtype.itemsize
    if a.rows > NUM_PARTITIONS and block_bytes <= min(B_BLOCK_BYTES, cg.sb_free_bytes()):
        _emit_gemm_b_resident(cg, a, b, y, mm, alpha, c, beta, slot, n_size)
        return
    buffers = [1, 1]
    if slot is None and mm.copies > 1:
        level = rotating_level(
            [tile_count(a.rows, NUM_PARTITIONS), tile_count(b.cols, MATMUL_MAX_MOVING_FREE)]
        )
        if level is not None:
            buffers[level] = mm.copies
    for m in tiles(cg, a.rows, NUM_PARTITIONS, "m", buffers=buffers[0]):
        for n in tiles(cg, b.cols, MATMUL_MAX_MOVING_FREE, "n", buffers=buffers[1]):
            copy = slot if slot is not None else m.slot + n.slot
            acc = cg.ap(mm.acc, [(1, n.size)], mm.at(mm.acc, copy), partitions=m.size)
            for k in tiles(cg, a.cols, NUM_PARTITIONS, "k", peel_first=True):
                stationary = load_tile(
                    cg, a.T.window(k.start, k.size, m.start, m.size), mm.stationary, mm, copy
                )
                moving = load_tile(
                    cg, b.window(k.start, k.size, n.start, n.size), mm.moving, mm, copy
                )
                cg.matmul(acc, stationary, moving, accumulate=not k.first)
            _finish_tile(cg, y, mm, alpha, c, beta, m, n, acc, copy)


def _emit_gemm_b_resident(cg, a, b, y, mm, alpha, c, beta, slot, n_size: int) -> None:
    """emit_gemm with b's column block held in SBUF across the row tiles of a."""
    block = cg.sb_tile(
        "b_block", NUM_PARTITIONS, tile_count(a.cols, NUM_PARTITIONS) * n_size, mm.moving_dtype
    )
    copies = mm.copies if slot is None else 1
    for n in tiles(cg, b.cols, MATMUL_MAX_MOVING_FREE, "n"):
        for k in tiles(cg, a.cols, NUM_PARTITIONS, "kb"):
            window = b.window(k.start, k.size, n.start, n.size)
            load_tile(cg, window, block, mm, offset=tile_index(k, NUM_PARTITIONS) * n_size)
        for m in tiles(cg, a.rows, NUM_PARTITIONS, "m", buffers=copies):
            copy = slot if slot is not None else m.slot
            acc = cg.ap(mm.acc, [(1, n.size)], mm.at(mm.acc, copy), partitions=m.size)
            for k in tiles(cg, a.cols, NUM_PARTITIONS, "k", peel_first=True):
                stationary = load_tile(
                    cg, a.T.window(k.start, k.size, m.start, m.size), mm.stationary, mm, copy
                )
                moving = cg.ap(
                    block,
                    [(1, n.size)],
                    tile_index(k, NUM_PARTITIONS) * n_size,
                    partitions=k.size,
                )
                cg.matmul(acc, stationary, moving, accumulate=not k.first)
            _finish_tile(cg, y, mm, alpha, c, beta, m, n, acc, copy)


def _finish_tile(cg, y, mm, alpha, c, beta, m, n, acc, copy) -> None:
    """Evict one output tile from PSUM with alpha, add beta·c, store it."""
    tile = cg.ap(mm.result, [(1, n.size)], mm.at(mm.result, copy), partitions=m.size)
    addend = cg.ap(mm.addend, [(1, n.size)], mm.at(mm.addend, copy), partitions=m.size)
    evict_tile(cg, y, m, n, acc, tile, addend, alpha, c, beta)


B_BLOCK_BYTES = 64 * 1024  # SBUF per partition a resident column block of b may take


def _row_major(loc: str, offset: Affine, rows: int, cols: int) -> MatrixView:
    return MatrixView(loc, offset, rows, cols, cols, 1)


# The attribute of a MatMul node holding the constant factor its PSUM eviction multiplies by:
# a Mul that FuseMatMulScale folded into it (patterns/matmul_scale.py).
MATMUL_SCALE = "fused_scale"


def lower_matmul(cg: BirCodeGen, node: Node) -> None:
    """numpy matmul: 1-D operands get a unit dim, batch dims broadcast and become loops; a
    contiguous batched a times one shared b is one matmul with the batches as rows. Every
    tile is evicted times the node's `MATMUL_SCALE`, when it has one."""
    alpha = float(node.attr(MATMUL_SCALE, 1.0))
    a_name, b_name = node.inputs[:2]
    out = node.outputs[0]
    a_shape = tuple(cg.graph.tensors[a_name].shape)
    b_shape = tuple(cg.graph.tensors[b_name].shape)
    a_mat = (1, a_shape[0]) if len(a_shape) == 1 else a_shape[-2:]
    b_mat = (b_shape[0], 1) if len(b_shape) == 1 else b_shape[-2:]
    m, k = a_mat
    n = b_mat[1]
    batch = tuple(
        cg.graph.tensors[out].shape[
            : max(0, len(cg.graph.tensors[out].shape) - (len(a_shape) > 1) - (len(b_shape) > 1))
        ]
    )
    a_batch = broadcast_strides(a_shape[:-2], batch) if batch else ()
    b_batch = broadcast_strides(b_shape[:-2], batch) if batch else ()
    a_batch = tuple(s * m * k for s in a_batch)
    b_batch = tuple(s * k * n for s in b_batch)
    dtype = cg.graph.tensors[out].dtype
    a_loc, b_loc, y_loc = cg.dram(a_name).name, cg.dram(b_name).name, cg.dram(out).name
    rows = math.prod(batch)
    # A unit batch dim has no stride to keep: a [1, T, K] activation is T contiguous rows.
    a_contiguous = all(
        size == 1 or stride == s * m * k
        for size, stride, s in zip(batch, a_batch, contiguous_strides(batch), strict=True)
    )
    if batch and len(a_shape) > 1 and not any(b_batch) and a_contiguous:
        # One b for every batch index of a contiguous a: the batches are just more rows of a
        # (and b is read once, not once per batch index).
        a_rows = _row_major(a_loc, Affine(), rows * m, k)
        b_view, y_view = _row_major(b_loc, Affine(), k, n), _row_major(y_loc, Affine(), rows * m, n)
        if try_panels(cg, a_rows, b_view, y_view, dtype, alpha):
            return
        mm = _rotating_tiles(cg, dtype, [tile_count(rows * m, NUM_PARTITIONS)], n)
        emit_gemm(cg, a_rows, b_view, y_view, mm, alpha)
        return
    if not batch and try_panels(
        cg,
        _row_major(a_loc, Affine(), m, k),
        _row_major(b_loc, Affine(), k, n),
        _row_major(y_loc, Affine(), m, n),
        dtype,
        alpha,
    ):
        return
    if len(a_shape) > 1 and heads_fit(cg, batch, b_batch, m, k, n, dtype):
        locs = (a_loc, b_loc, y_loc)
        emit_heads(cg, batch, (a_batch, b_batch), locs, m, k, n, dtype, alpha)
        return
    mm = _rotating_tiles(cg, dtype, [*batch, tile_count(m, NUM_PARTITIONS)], n)
    level = rotating_level([*batch, tile_count(m, NUM_PARTITIONS), tile_count(n, 512)])

    def walk(depth: int, a_off: Affine, b_off: Affine, y_off: Affine, slot: Affine) -> None:
        if depth == len(batch):
            emit_gemm(
                cg,
                _row_major(a_loc, a_off, m, k),
                _row_major(b_loc, b_off, k, n),
                _row_major(y_loc, y_off, m, n),
                mm,
                alpha,
                slot=slot if level is not None and level < len(batch) else None,
            )
            return
        inner = 1
        for size in batch[depth + 1 :]:
            inner *= size
        copies = mm.copies if depth == level else 1
        for index in tiles(cg, batch[depth], 1, "b", buffers=copies):
            walk(
                depth + 1,
                a_off + index.start * a_batch[depth],
                b_off + index.start * b_batch[depth],
                y_off + index.start * (inner * m * n),
                slot + index.slot,
            )

    walk(0, Affine(), Affine(), Affine(), Affine())


def _rotating_tiles(cg: BirCodeGen, dtype: Dtype, outer: list[int], n: int) -> MatmulTiles:
    """Tiles with as many copies as the innermost loop of more than one tile (`outer` tile
    counts, then N's) can use (docs/buffers.md#choice)."""
    counts = [*outer, tile_count(n, MATMUL_MAX_MOVING_FREE)]
    level = rotating_level(counts)
    copies = 1
    if level is not None:
        copies = buffer_count(
            cg,
            counts[level],
            MatmulTiles.sb_bytes_per_copy(cg, dtype),
            MatmulTiles.PSUM_BANKS_PER_COPY,
        )
    return MatmulTiles(cg, dtype, copies)


def lower_gemm(cg: BirCodeGen, node: Node) -> None:
    """Y = alpha·A'·B' + beta·C, A' and B' optionally transposed, C broadcast to [M, N]."""
    attrs = node.attrs
    a_name, b_name = node.inputs[:2]
    c_name = node.inputs[2] if len(node.inputs) > 2 else ""
    out = node.outputs[0]
    a_shape = cg.graph.tensors[a_name].shape
    b_shape = cg.graph.tensors[b_name].shape
    a = _row_major(cg.dram(a_name).name, Affine(), *a_shape)
    if attrs.get("transA", 0):
        a = a.T
    b = stored_transposed(cg, b_name, node.name) if attrs.get("transB", 0) else None
    if b is None:
        b = _row_major(cg.dram(b_name).name, Affine(), *b_shape)
        if attrs.get("transB", 0):
            b = b.T
    y = _row_major(cg.dram(out).name, Affine(), a.rows, b.cols)
    c = None
    if c_name:
        row_stride, col_stride = broadcast_strides(
            tuple(cg.graph.tensors[c_name].shape), (a.rows, b.cols)
        )
        c = MatrixView(cg.dram(c_name).name, Affine(), a.rows, b.cols, row_stride, col_stride)
    dtype = cg.graph.tensors[out].dtype
    alpha, beta = float(attrs.get("alpha", 1.0)), float(attrs.get("beta", 1.0))
    if try_panels(cg, a, b, y, dtype, alpha, c, beta):
        return
    mm = _rotating_tiles(cg, dtype, [tile_count(a.rows, NUM_PARTITIONS)], b.cols)
    emit_gemm(cg, a, b, y, mm, alpha, c, beta)
