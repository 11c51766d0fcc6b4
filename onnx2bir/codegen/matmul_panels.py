"""The panel form of the generic PE matmul (docs/buffers.md#lowerings).

y = alpha·(a @ b) + beta·c with all of b resident in SBUF (in one of two copies that successive
nodes alternate, when they fit, so that a node's weight loads overlap the previous node's
matmuls, docs/buffers.md#weights) and, per 128-row tile of a, its
panel: the K tiles of Aᵀ, flipped on the PE array once and used by every column block. The
flips of a panel run back to back through `PANEL_FLIPS` PSUM slots (four 128-column slots of
one bank), so the PE array does not wait for each flip's copy out of PSUM before the next; row
tiles rotate their panels, flip slots, accumulators and results over copies, so one row tile's
panel loads while the previous one multiplies. `lower_matmul` tries this form first and falls
back to `emit_gemm` when b is too large to hold or the tiles do not fit.
"""

from __future__ import annotations

from onnx2bir.bir.enums import Dtype
from onnx2bir.bir.ir import AccessPattern
from onnx2bir.bir.opcodes import MATMUL_MAX_MOVING_FREE, NUM_PARTITIONS
from onnx2bir.codegen.casting import pe_operand_dtype
from onnx2bir.codegen.driver import BirCodeGen
from onnx2bir.codegen.matmul_tiles import (
    PANEL_FLIPS,
    FlipTiles,
    MatrixView,
    evict_tile,
    load_tile,
    weight_copy,
)
from onnx2bir.codegen.tiling import (
    FULL_EXPANSION,
    Affine,
    copy_stride,
    tile_count,
    tile_index,
    tiles,
)

B_WHOLE_BYTES = 64 * 1024  # SBUF per partition that b, held whole, may take


def try_panels(
    cg: BirCodeGen,
    a: MatrixView,
    b: MatrixView,
    y: MatrixView,
    model_dtype: Dtype,
    alpha: float = 1.0,
    c: MatrixView | None = None,
    beta: float = 1.0,
) -> bool:
    """`emit_gemm_panels` when the product has more than one output tile and b, whole, takes
    at most `B_WHOLE_BYTES` of each partition; False when it does not apply or fit."""
    dtype = pe_operand_dtype(cg, model_dtype)
    several_tiles = a.rows > NUM_PARTITIONS or b.cols > MATMUL_MAX_MOVING_FREE
    whole_bytes = tile_count(a.cols, NUM_PARTITIONS) * b.cols * dtype.itemsize
    if not several_tiles or whole_bytes > B_WHOLE_BYTES:
        return False
    return emit_gemm_panels(cg, a, b, y, dtype, alpha, c, beta)


def _panel_copies(
    cg: BirCodeGen, a: MatrixView, b: MatrixView, dtype: Dtype, addend: bool, b_copies: int = 1
) -> tuple[int, int] | None:
    """(copies of the per-row-tile tiles, accumulators per row tile), or None when even one
    of each does not fit. A row tile copy holds its panel, its flip slots, and per column
    block in flight a PSUM accumulator and a result (and addend) tile; b is held `b_copies`
    times. Each count is one per tile up to `FULL_EXPANSION` tiles, else 2, else 1
    (docs/buffers.md#choice), the column blocks' first."""
    p = NUM_PARTITIONS
    k_tiles = tile_count(a.cols, p)
    sb_free = cg.sb_free_bytes() - b_copies * copy_stride(k_tiles * b.cols, dtype) * dtype.itemsize
    banks_free = cg.psum_free_banks()
    result_bytes = (1 + addend) * MATMUL_MAX_MOVING_FREE * 4
    panel_bytes = copy_stride(k_tiles * p, dtype) * dtype.itemsize + PANEL_FLIPS * p * 4
    for accumulators in _counts(tile_count(b.cols, MATMUL_MAX_MOVING_FREE)):
        for copies in _counts(tile_count(a.rows, p)):
            sb_bytes = copies * (panel_bytes + accumulators * result_bytes)
            if sb_bytes <= sb_free and copies * (1 + accumulators) <= banks_free:
                return copies, accumulators
    return None


def _counts(trips: int) -> list[int]:
    """Buffer counts to try for a loop of `trips` tiles, most first."""
    return [c for c in (trips if trips <= FULL_EXPANSION else 0, 2, 1) if 0 < c <= trips]


def emit_gemm_panels(
    cg: BirCodeGen,
    a: MatrixView,
    b: MatrixView,
    y: MatrixView,
    dtype: Dtype,
    alpha: float = 1.0,
    c: MatrixView | None = None,
    beta: float = 1.0,
) -> bool:
    """y = alpha·(a @ b) + beta·c with all of b resident and, per row tile of a, its panel:
    the K tiles of Aᵀ loaded (flipped on the PE array when a is row-major) once and used by
    every column block. The flips of one panel run back to back through `PANEL_FLIPS` PSUM
    slots; row tiles rotate their panels, results and accumulators (docs/buffers.md) so the
    next panel loads while this one multiplies. Returns False, emitting nothing, when the
    tiles do not fit (the caller then tiles the product another way)."""
    p = NUM_PARTITIONS
    k_tiles = tile_count(a.cols, p)
    with_addend = c is not None and beta != 0.0
    fit = _panel_copies(cg, a, b, dtype, with_addend)
    if fit is None:
        return False
    # b in two copies when that costs the rest nothing; the node loads the one away from the
    # previous node's weights, so that its loads need not wait for that node's matmuls to
    # finish reading them (docs/buffers.md#weights).
    b_copies = 2 if _panel_copies(cg, a, b, dtype, with_addend, 2) == fit else 1
    copies, accumulators = fit
    b_stride = copy_stride(k_tiles * b.cols, dtype)
    whole_b = cg.sb_tile("b_whole", p, (b_copies - 1) * b_stride + k_tiles * b.cols, dtype)
    b_base = weight_copy(cg.arena, whole_b, b_copies, b_stride, k_tiles * b.cols) * b_stride
    flips = FlipTiles(cg, copies)
    panel_stride = copy_stride(k_tiles * p, dtype)
    panel = cg.sb_tile("panel", p, copies * panel_stride, dtype)
    acc = cg.psum_tile("acc", p, copies * accumulators * MATMUL_MAX_MOVING_FREE)
    result = cg.sb_tile("result", p, copies * accumulators * MATMUL_MAX_MOVING_FREE, Dtype.FP32)
    addend = None
    if with_addend:
        addend = cg.sb_tile("addend", p, copies * accumulators * MATMUL_MAX_MOVING_FREE, Dtype.FP32)
    # One DMA per K tile, unrolled, so that they take different DMA queues and transfer in
    # parallel (the instructions of one loop all run on one queue).
    for k_index, k0 in enumerate(range(0, a.cols, p)):
        window = b.window(Affine(k0), min(p, a.cols - k0), Affine(), b.cols)
        load_tile(cg, window, whole_b, flips, offset=Affine(b_base + k_index * b.cols))
    for m in tiles(cg, a.rows, p, "m", buffers=copies):
        base = m.slot * panel_stride
        for k in tiles(cg, a.cols, p, "pt", buffers=PANEL_FLIPS):
            dst = cg.ap(panel, [(1, m.size)], base + tile_index(k, p) * p, partitions=k.size)
            _load_panel_tile(cg, a, m, k, dst, flips, m.slot * PANEL_FLIPS + k.slot)
        for n in tiles(cg, b.cols, MATMUL_MAX_MOVING_FREE, "n", buffers=accumulators):
            at = (m.slot * accumulators + n.slot) * MATMUL_MAX_MOVING_FREE
            total = cg.ap(acc, [(1, n.size)], at, partitions=m.size)
            for k in tiles(cg, a.cols, p, "k", peel_first=True):
                stationary = cg.ap(
                    panel, [(1, m.size)], base + tile_index(k, p) * p, partitions=k.size
                )
                moving = cg.ap(
                    whole_b,
                    [(1, n.size)],
                    b_base + tile_index(k, p) * b.cols + n.start,
                    partitions=k.size,
                )
                cg.matmul(total, stationary, moving, accumulate=not k.first)
            tile = cg.ap(result, [(1, n.size)], at, partitions=m.size)
            add = None if addend is None else cg.ap(addend, [(1, n.size)], at, partitions=m.size)
            evict_tile(cg, y, m, n, total, tile, add, alpha, c, beta)
    return True


def _load_panel_tile(
    cg: BirCodeGen, a: MatrixView, m, k, dst: AccessPattern, flips: FlipTiles, slot: Affine
) -> None:
    """Aᵀ[k, m] into `dst`: one DMA when its rows are contiguous, else a's block [m, k] read
    (from its SBUF home when it has one), flipped on the PE array in flip slot `slot`, and
    copied (cast to the PE dtype) into the panel."""
    view = a.T.window(k.start, k.size, m.start, m.size)
    if view.col_stride == 1 or view.row_stride != 1:
        cg.dma(dst, cg.dram_ap(view.loc, view.offset, view.pattern()))
        return
    block = view.T
    staged = cg.read_operand(
        cg.ap(flips.staging, [(1, k.size)], flips.at(flips.staging, slot), partitions=m.size),
        cg.dram_ap(block.loc, block.offset, block.pattern()),
    )
    flipped = cg.ap(
        flips.transposed, [(1, m.size)], flips.at(flips.transposed, slot), partitions=k.size
    )
    cg.matmul(flipped, staged, cg.identity(m.size), accumulate=False)
    cg.tensor_copy(dst, flipped)
