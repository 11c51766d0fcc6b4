"""Batched small products, one per attention head (docs/buffers.md#lowerings).

A batched MatMul whose every product is one tile — a [M ≤ 128, K ≤ 128] times b [K, N ≤ 512],
with b changing along the innermost batch dim — is attention's per-head Q·Kᵀ or P·V. Done
product by product, each head waits for its own a flip (stage, PE transpose, copy out of PSUM)
and its own b load before its one matmul, and the PE array idles between. Here each pass of the
innermost batch loop (the heads of one batch index):

1. loads every b of the pass in one DMA into [K partitions, heads × N];
2. flips every a of the pass back to back through `PANEL_FLIPS` PSUM slots into
   [K partitions, heads × M], each a read in place when it has an SBUF home;
3. runs the heads' matmuls, rotating their PSUM accumulators, each evicted (straight into y's
   SBUF home when it has one) while the next multiplies.

The loads and flips of one pass go to two copies of their tiles, alternating between passes of
the enclosing batch loop, so the next pass loads while this one multiplies.
"""

from __future__ import annotations

from onnx2bir.bir.enums import ActFunc, Dtype
from onnx2bir.bir.opcodes import MATMUL_MAX_MOVING_FREE, NUM_PARTITIONS
from onnx2bir.codegen.casting import pe_operand_dtype
from onnx2bir.codegen.driver import BirCodeGen
from onnx2bir.codegen.matmul_tiles import BANK_FP32, PANEL_FLIPS, FlipTiles
from onnx2bir.codegen.tiling import FULL_EXPANSION, Affine, copy_stride, tiles

HEADS_BYTES = 32 * 1024  # SBUF per partition the a and b tiles of one pass (both copies) may take


def heads_fit(cg: BirCodeGen, batch, b_batch, m: int, k: int, n: int, dtype: Dtype) -> bool:
    """Whether `emit_heads` applies: one tile per product, b changing along the innermost batch
    dim, at least two products per pass, the tiles within `HEADS_BYTES` and three PSUM banks."""
    if not batch or batch[-1] < 2 or not b_batch[-1]:
        return False
    if m > NUM_PARTITIONS or k > NUM_PARTITIONS or n > MATMUL_MAX_MOVING_FREE:
        return False
    pe = pe_operand_dtype(cg, dtype)
    per_copy = (copy_stride(batch[-1] * m, pe) + copy_stride(batch[-1] * n, pe)) * pe.itemsize
    return 2 * per_copy <= min(HEADS_BYTES, cg.sb_free_bytes() // 2) and cg.psum_free_banks() >= 3


def emit_heads(
    cg: BirCodeGen,
    batch: tuple[int, ...],
    strides: tuple[tuple[int, ...], tuple[int, ...]],
    locs: tuple[str, str, str],
    m: int,
    k: int,
    n: int,
    dtype: Dtype,
) -> None:
    """y[..., h] = a[..., h] @ b[..., h] over `batch` (a, b, y row-major; `strides` the a and b
    element strides per batch dim, 0 where one broadcasts; `locs` the a, b, y DRAM views)."""
    p = NUM_PARTITIONS
    pe = pe_operand_dtype(cg, dtype)
    heads = batch[-1]
    a_stride, b_stride = strides[0][-1], strides[1][-1]
    a_loc, b_loc, y_loc = locs
    a_copy, b_copy = copy_stride(heads * m, pe), copy_stride(heads * n, pe)
    a_t = cg.sb_tile("aT_heads", p, 2 * a_copy, pe)
    b_all = cg.sb_tile("b_heads", p, 2 * b_copy, pe)
    flips = FlipTiles(cg, 1)
    banks = min(heads, FULL_EXPANSION, cg.psum_free_banks())
    acc = cg.psum_tile("acc", p, banks * BANK_FP32)
    result_copy = copy_stride(n, Dtype.FP32)
    result = cg.sb_tile("result", p, banks * result_copy, Dtype.FP32)

    def one_pass(a_off: Affine, b_off: Affine, y_off: Affine, copy: Affine) -> None:
        b_tile = cg.ap(b_all, [(1, heads * n)], copy * b_copy, partitions=k)
        cg.dma(b_tile, cg.dram_ap(b_loc, b_off, [(n, k), (b_stride, heads), (1, n)]))
        for h in tiles(cg, heads, 1, "fa", buffers=PANEL_FLIPS):
            slot = flips.at(flips.staging, h.slot)
            staged = cg.read_operand(
                cg.ap(flips.staging, [(1, k)], slot, partitions=m),
                cg.dram_ap(a_loc, a_off + h.start * a_stride, [(k, m), (1, k)]),
            )
            flipped = cg.ap(flips.transposed, [(1, m)], slot, partitions=k)
            cg.matmul(flipped, staged, cg.identity(m), accumulate=False)
            cg.tensor_copy(cg.ap(a_t, [(1, m)], copy * a_copy + h.start * m, partitions=k), flipped)
        for h in tiles(cg, heads, 1, "hd", buffers=banks):
            total = cg.ap(acc, [(1, n)], h.slot * BANK_FP32, partitions=m)
            stationary = cg.ap(a_t, [(1, m)], copy * a_copy + h.start * m, partitions=k)
            moving = cg.ap(b_all, [(1, n)], copy * b_copy + h.start * n, partitions=k)
            cg.matmul(total, stationary, moving, accumulate=False)
            out = cg.dram_ap(y_loc, y_off + h.start * (m * n), [(n, m), (1, n)])
            tile = cg.ap(result, [(1, n)], h.slot * result_copy, partitions=m)
            written = cg.write_operand(tile, out)
            cg.activation(written, total, ActFunc.COPY)
            cg.store_result(out, tile, written)

    def walk(depth: int, a_off: Affine, b_off: Affine, y_off: Affine, copy: Affine) -> None:
        if depth == len(batch) - 1:
            one_pass(a_off, b_off, y_off, copy)
            return
        inner = m * n
        for size in batch[depth + 1 :]:
            inner *= size
        # The loop just outside the heads alternates the two copies of the pass's tiles.
        buffers = 2 if depth == len(batch) - 2 else 1
        for index in tiles(cg, batch[depth], 1, "bh", buffers=buffers):
            walk(
                depth + 1,
                a_off + index.start * strides[0][depth],
                b_off + index.start * strides[1][depth],
                y_off + index.start * inner,
                index.slot if buffers == 2 else copy,
            )

    walk(0, Affine(), Affine(), Affine(), Affine())
