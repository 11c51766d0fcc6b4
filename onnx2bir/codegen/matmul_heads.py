"""Batched small products, one per attention head (docs/buffers.md#lowerings).

A batched MatMul whose every product is a few tiles — a [M, K] times b [K, N ≤ 512], at most
`MAX_BLOCKS` 128 x 128 blocks of a, with b changing along the innermost batch dim — is
attention's per-head Q·Kᵀ or P·V (197 tokens: two row tiles, and two contraction tiles for
P·V, each accumulating in PSUM). Done product by product, each head waits for its own a flip
(stage, PE transpose, copy out of PSUM) and its own b load before its matmuls, and the PE array
idles between. Here each pass of the
innermost batch loop (the heads of one batch index):

1. loads every b of the pass in one DMA into [K partitions, heads × N];
2. flips every a of the pass back to back into PSUM, the heads whose M columns fit one bank side
   by side (one bank per contraction tile, two sets when the heads take several), each a read
   in place when it has an SBUF home; one copy per bank and contraction tile brings them into
   [K partitions, heads × M], alternating between ScalarE and VectorE;
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
from onnx2bir.codegen.matmul_tiles import BANK_FP32, PANEL_FLIPS
from onnx2bir.codegen.tiling import (
    FULL_EXPANSION,
    Affine,
    Tile,
    copy_stride,
    tile_count,
    tiles,
)

HEADS_BYTES = 32 * 1024  # SBUF per partition the a and b tiles of one pass (both copies) may take


def heads_fit(cg: BirCodeGen, batch, b_batch, m: int, k: int, n: int, dtype: Dtype) -> bool:
    """Whether `emit_heads` applies: b changing along the innermost batch dim, at least two
    products per pass, n within one PSUM bank, the a and b tiles of a pass within
    `HEADS_BYTES`, and PSUM banks for the flips and one accumulator per row tile."""
    if not batch or batch[-1] < 2 or not b_batch[-1]:
        return False
    k_tiles = tile_count(k, NUM_PARTITIONS)
    if n > MATMUL_MAX_MOVING_FREE or m > BANK_FP32:
        return False
    if tile_count(m, NUM_PARTITIONS) * k_tiles > MAX_BLOCKS:
        return False
    pe = pe_operand_dtype(cg, dtype)
    a_copy, b_copy = (
        copy_stride(batch[-1] * k_tiles * m, pe),
        copy_stride(batch[-1] * k_tiles * n, pe),
    )
    per_copy = (a_copy + b_copy) * pe.itemsize
    banks = _flip_copies(batch[-1], m) * k_tiles + tile_count(m, NUM_PARTITIONS)
    return 2 * per_copy <= min(HEADS_BYTES, cg.sb_free_bytes() // 2) and (
        cg.psum_free_banks() >= max(3, banks)
    )


MAX_BLOCKS = 2 * PANEL_FLIPS  # row x contraction tiles of one product, unrolled per head


def _spans(extent: int) -> list[Tile]:
    """The 128-row tiles of `extent`, each with constant offsets (the code is unrolled)."""
    return [
        Tile(Affine(start), min(NUM_PARTITIONS, extent - start), start == 0)
        for start in range(0, extent, NUM_PARTITIONS)
    ]


def _heads_per_bank(heads: int, m: int) -> int:
    """Heads whose flipped a (m columns each) share one PSUM bank, copied out together."""
    return max(1, min(heads, BANK_FP32 // m))


def _flip_copies(heads: int, m: int) -> int:
    """Copies of the flip banks: two when the heads take several banks' turns, so the next
    heads' flips do not wait for these heads' copies out of PSUM."""
    return 1 if heads <= _heads_per_bank(heads, m) else 2


def emit_heads(
    cg: BirCodeGen,
    batch: tuple[int, ...],
    strides: tuple[tuple[int, ...], tuple[int, ...]],
    locs: tuple[str, str, str],
    m: int,
    k: int,
    n: int,
    dtype: Dtype,
    alpha: float = 1.0,
) -> None:
    """y[..., h] = alpha · a[..., h] @ b[..., h] over `batch` (a, b, y row-major; `strides` the a
    and b element strides per batch dim, 0 where one broadcasts; `locs` the a, b, y DRAM views;
    alpha applied by the eviction).

    a [m, k] is cut into row tiles of 128 (m) and contraction tiles of 128 (k); block (kt, h)
    of the pass's tiles holds head h's k tile kt: aᵀ [k tile, m] and b [k tile, n]."""
    p = NUM_PARTITIONS
    pe = pe_operand_dtype(cg, dtype)
    heads = batch[-1]
    m_tiles, k_tiles = tile_count(m, p), tile_count(k, p)
    a_stride, b_stride = strides[0][-1], strides[1][-1]
    a_loc, b_loc, y_loc = locs
    a_copy, b_copy = copy_stride(heads * k_tiles * m, pe), copy_stride(heads * k_tiles * n, pe)
    a_t = cg.sb_tile("aT_heads", p, 2 * a_copy, pe)
    b_all = cg.sb_tile("b_heads", p, 2 * b_copy, pe)
    per_bank = _heads_per_bank(heads, m)
    flip_copies = _flip_copies(heads, m)
    blocks = m_tiles * k_tiles  # flips of one head's a
    staging = cg.sb_tile("staging", p, flip_copies * per_bank * blocks * p, Dtype.FP32)
    # One bank per contraction tile and copy: the flips of `per_bank` heads side by side.
    transposed = cg.psum_tile("transposed", p, flip_copies * k_tiles * BANK_FP32)
    banks = min(heads * m_tiles, FULL_EXPANSION, cg.psum_free_banks())
    head_buffers = max(1, banks // m_tiles)
    accumulators = head_buffers * m_tiles
    acc = cg.psum_tile("acc", p, accumulators * BANK_FP32)
    result_copy = copy_stride(n, Dtype.FP32)
    result = cg.sb_tile("result", p, accumulators * result_copy, Dtype.FP32)

    def one_pass(a_off: Affine, b_off: Affine, y_off: Affine, copy: Affine) -> None:
        for kt, kk in enumerate(_spans(k)):
            b_tile = cg.ap(
                b_all, [(1, heads * n)], copy * b_copy + kt * heads * n, partitions=kk.size
            )
            cg.dma(
                b_tile,
                cg.dram_ap(b_loc, b_off + kk.start * n, [(n, kk.size), (b_stride, heads), (1, n)]),
            )
        for g in tiles(cg, heads, per_bank, "fa", buffers=flip_copies):
            spans = [(mm, kt, kk) for mm in _spans(m) for kt, kk in enumerate(_spans(k))]
            for within in range(g.size):
                h = g.start + within
                for index, (mm, kt, kk) in enumerate(spans):
                    slot = (g.slot * per_bank + within) * blocks + index
                    staged = cg.read_operand(
                        cg.ap(staging, [(1, kk.size)], slot * p, partitions=mm.size),
                        cg.dram_ap(
                            a_loc,
                            a_off + h * a_stride + mm.start * k + kk.start,
                            [(k, mm.size), (1, kk.size)],
                        ),
                    )
                    bank = (g.slot * k_tiles + kt) * BANK_FP32
                    flipped = cg.ap(
                        transposed, [(1, mm.size)], bank + within * m + mm.start, partitions=kk.size
                    )
                    cg.matmul(flipped, staged, cg.identity(mm.size), accumulate=False)
            # Out of PSUM, one copy per contraction tile for all the heads of the bank.
            for kt, kk in enumerate(_spans(k)):
                bank = (g.slot * k_tiles + kt) * BANK_FP32
                column = copy * a_copy + (kt * heads + g.start) * m
                cg.on_chip_copy(
                    cg.ap(a_t, [(1, g.size * m)], column, partitions=kk.size),
                    cg.ap(transposed, [(1, g.size * m)], bank, partitions=kk.size),
                )
        for h in tiles(cg, heads, 1, "hd", buffers=head_buffers):
            for mt, mm in enumerate(_spans(m)):
                at = (h.slot * m_tiles + mt) * BANK_FP32
                total = cg.ap(acc, [(1, n)], at, partitions=mm.size)
                for kt, kk in enumerate(_spans(k)):
                    stationary = cg.ap(
                        a_t,
                        [(1, mm.size)],
                        copy * a_copy + (kt * heads + h.start) * m + mm.start,
                        partitions=kk.size,
                    )
                    moving = cg.ap(
                        b_all,
                        [(1, n)],
                        copy * b_copy + (kt * heads + h.start) * n,
                        partitions=kk.size,
                    )
                    cg.matmul(total, stationary, moving, accumulate=kt > 0)
                out = cg.dram_ap(
                    y_loc, y_off + h.start * (m * n) + mm.start * n, [(n, mm.size), (1, n)]
                )
                tile = cg.ap(
                    result, [(1, n)], (h.slot * m_tiles + mt) * result_copy, partitions=mm.size
                )
                written = cg.write_operand(tile, out)
                cg.activation(written, total, ActFunc.COPY, scale=alpha)
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
