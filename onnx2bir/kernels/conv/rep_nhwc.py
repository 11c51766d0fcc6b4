"""Conv2d_dw_fb01_io01_01bf_rep_nhwc_Pcinh: dense conv with input rows replicated on partitions.

In: x in layout fb01 [C_in, N, H, W], w in io01 [C_in, C_out, kH, kW], optional bias [C_out].
Out: y in layout 01bf [H_out, W_out, N, C_out]; the selector bridges both ways.

"Pcinh" is the partition dim folded from C_in x h: partition p = (r, c) holds input channel c
as seen by kernel row g + r, so one matmul contracts over R kernel rows and all C_in channels
at once, and only the kW column taps remain to accumulate:

    psum[C_out, pixels] += Σ_kw  W_rep[(r, c), kw, C_out]ᵀ · X_rep[(r, c), rows, cols·sw + kw·dw]

with X_rep[(r, c), oh, ·] = X_padded[c, oh·sh + (g + r)·dh, ·], built by one DMA per kernel
row r from the input itself: the positions in the padding are set to 0 in SBUF (framed bands,
docs/memory_planner.md#framed-bands), so no padded copy of the input is made.
R = min(kH, 128 // C_in) rows fit at once (all of them when the selector's rep_nhwc row
matched: C_in·kH ≤ 128); otherwise the kernel rows are taken in groups of R (the
K-replication row, priority 9) and wide inputs (C_in > 128) in channel tiles of 128, all
accumulating into the same PSUM tile. Against the generic path this divides the matmul count
by R. Weights stay resident in SBUF for a C_out tile, or whole when every C_out tile's fit
`WHOLE_WEIGHT_BYTES` (the clones of a conv that a batch runs an image at a time then share
them, docs/memory_planner.md#shared-weights); the bias (and a fused Relu) rides on the PSUM
eviction. With the weights per C_out tile, the C_out loop is outermost and each output tile's
bands are read again for every C_out tile; with them whole, the C_out tiles run inside each
output tile, its bands read once for all of them, acc and out rotating over two copies.
Each (row group, channel tile) has a band of its own, so an output tile's band loads go at
once instead of each waiting for the matmuls on the band before it.
"""

from __future__ import annotations

from dataclasses import dataclass

from onnx2bir.bir.enums import Dtype
from onnx2bir.bir.ir import MemoryLocation
from onnx2bir.bir.opcodes import MATMUL_MAX_MOVING_FREE, NUM_PARTITIONS
from onnx2bir.codegen.casting import pe_operand_dtype
from onnx2bir.codegen.driver import BirCodeGen
from onnx2bir.codegen.spatial import (
    Clip,
    WindowGeometry,
    clip,
    frame_band,
    frame_sides,
    read_band,
    window_tiles,
)
from onnx2bir.codegen.tiling import (
    Affine,
    Tile,
    buffer_count,
    copy_stride,
    rotating_level,
    tile_count,
    tile_index,
    tiles,
)
from onnx2bir.graph import Node
from onnx2bir.kernels.conv.common import ConvKernelArgs, conv_kernel_args, kernel_geometry

REP_NHWC = "Conv2d_dw_fb01_io01_01bf_rep_nhwc_Pcinh"  # the name the conv registry writes

# Weights of several C_out tiles are held whole, each tile in a slot of its own, when they
# take at most this many bytes of each partition: half the budget of the generic conv's
# stationary weights (conv_stationary.RESIDENT_WEIGHT_BYTES). A 1x1 conv 128 -> 512 takes 1 KiB
# in bf16, ViT's patch embedding (3 -> 768, 16 x 16) 24 KiB.
WHOLE_WEIGHT_BYTES = 32 * 1024


@dataclass(frozen=True)
class _OutTile:
    """One output tile: image `n`, output rows and columns, and the `slot` (copy) of band, out
    and acc it uses."""

    n: Tile
    row: Tile
    col: Tile
    slot: Affine

    @property
    def pixels(self) -> int:
        return self.row.size * self.col.size


@dataclass(frozen=True)
class _Plan:
    """The kernel's tiling: row groups, channel tiles, output tile, and its SBUF/PSUM tiles."""

    args: ConvKernelArgs
    geo: WindowGeometry
    src: str  # the input, read band by band (the padding framed in SBUF)
    plane: int  # elements of one input plane (H x W)
    channel_planes: int  # planes between two channels / two images of the input
    batch_planes: int
    c_tile: int
    c_tiles: int
    row_groups: tuple[tuple[int, int], ...]  # (first kernel row, rows) stacked per matmul
    rows: int
    cols: int
    w_slot: int  # weight elements per (row group, channel tile)
    m_slots: int  # C_out tiles the weights tile holds at once: all of them, or 1
    m_copies: int  # with all of them: copies of acc and out the output-tile loop rotates
    weights: MemoryLocation
    load_weights: bool  # False: another node loaded them into a shared home
    load_bias: bool
    band: MemoryLocation  # `buffers` copies of band, out and acc (docs/buffers.md#rotation)
    bias: MemoryLocation
    out: MemoryLocation
    acc: MemoryLocation
    buffers: tuple[int, int, int]  # copies rotated by the n, oh and ow loops (one is > 1)
    band_stride: int  # elements between two copies of the band

    def slot(self, group: int, k: Tile, m: Tile) -> Affine:
        m_slot = tile_index(m, NUM_PARTITIONS) if self.m_slots > 1 else 0
        groups = len(self.row_groups)
        return ((m_slot * groups + group) * self.c_tiles + tile_index(k, self.c_tile)) * (
            self.w_slot
        )

    def bias_column(self, m: Tile) -> Affine | int:
        return tile_index(m, NUM_PARTITIONS) if self.m_slots > 1 else 0

    def band_at(self, group: int, k: Tile, slot: Affine) -> Affine:
        """Element offset of copy `slot` of the band of (row group, channel tile): each has
        its copies of its own, so an output tile's band loads all go at once rather than each
        waiting for the matmuls of the one before. The copies of one band are adjacent, so
        two bands' bytes are disjoint whatever the loop's trips (docs/dependencies.md)."""
        band = group * self.c_tiles + tile_index(k, self.c_tile)
        return band * self.band_copies + slot * self.band_stride

    @property
    def band_copies(self) -> int:
        """Elements of all copies of one band."""
        return max(self.buffers) * self.band_stride


def trace_rep_nhwc(cg: BirCodeGen, node: Node) -> None:
    args = conv_kernel_args(cg, node)
    if args.groups != 1 or any(d != 1 for d in args.lhs_dilation) or args.rhs_reversal:
        raise cg.fail("rep_nhwc takes dense forward convolutions only")
    if args.x_strides[2:] != (args.in_w, 1):
        raise cg.fail("rep_nhwc expects rows and columns innermost in its input")
    plan = _plan(cg, node, args)
    geo, band_cols = plan.geo, plan.geo.cols_needed(plan.cols)
    # One column tile: every band has the same side columns, framed once for every copy of
    # every band (copies of all bands are `band_stride` apart).
    sides_once = tile_count(args.out_w, plan.cols) == 1
    if sides_once:
        side_clip = clip(Affine(), band_cols, geo.pad_left, geo.in_w)
        copies = (plan.band_stride, plan.band.shape[1] // plan.band_stride)
        frame_sides(
            cg, plan.band, 0, copies, (0, NUM_PARTITIONS), plan.rows, band_cols, side_clip, 0.0
        )
    b_n, b_oh, b_ow = plan.buffers

    def output_tiles(m: Tile | None) -> None:
        for n in tiles(cg, args.batch, 1, "n", buffers=b_n):
            for row in window_tiles(cg, plan.geo, "h", args.out_h, plan.rows, "oh", b_oh):
                for col in window_tiles(cg, plan.geo, "w", args.out_w, plan.cols, "ow", b_ow):
                    # at most one of the three loops rotates
                    at = _OutTile(n, row, col, n.slot + row.slot + col.slot)
                    if m is None:
                        _output_tile_all_blocks(cg, plan, at, sides_once)
                    else:
                        _output_tile(cg, plan, m, at, sides_once)

    for m in tiles(cg, args.c_out, min(args.c_out, NUM_PARTITIONS), "m"):
        if plan.load_weights:
            _load_weights(cg, plan, m)
        if args.bias and plan.load_bias:
            cg.dma(
                cg.ap(plan.bias, [(1, 1)], plan.bias_column(m), partitions=m.size),
                cg.dram_ap(args.bias, m.start, [(1, m.size), (1, 1)]),
            )
        if plan.m_slots == 1:
            output_tiles(m)
    if plan.m_slots > 1:  # weights whole: each output tile's bands serve every C_out tile
        output_tiles(None)


def _plan(cg: BirCodeGen, node: Node, args: ConvKernelArgs) -> _Plan:
    geo = kernel_geometry(args)
    plane = args.in_h * args.in_w
    src = cg.dram(node.inputs[0]).name
    c_tile = min(args.c_in, NUM_PARTITIONS)
    c_tiles = -(-args.c_in // c_tile)
    per_group = max(1, min(args.k_h, NUM_PARTITIONS // c_tile))
    groups = tuple((g, min(per_group, args.k_h - g)) for g in range(0, args.k_h, per_group))
    cols = min(args.out_w, MATMUL_MAX_MOVING_FREE)
    rows = max(1, min(args.out_h, MATMUL_MAX_MOVING_FREE // cols))
    w_slot = args.k_w * min(args.c_out, NUM_PARTITIONS)
    operand = pe_operand_dtype(cg)
    # Resident weights: [(r, c), (group, channel tile, kw, C_out)] for one C_out tile.
    # Both PE operands in the autocast dtype: the weight and band DMAs are the casts. With one
    # C_out tile they are the whole weights, which the clones of a conv run an image at a time
    # may share (docs/memory_planner.md#shared-weights).
    w_free = len(groups) * c_tiles * w_slot
    m_tiles = tile_count(args.c_out, NUM_PARTITIONS)
    whole = m_tiles == 1 or m_tiles * w_free * operand.itemsize <= WHOLE_WEIGHT_BYTES
    m_slots = m_tiles if whole else 1
    load_weights = load_bias = True
    if whole:
        shape = (args.c_in, args.c_out, args.k_h, args.k_w, args.w_strides, per_group, operand)
        weights, load_weights = cg.weight_tile(
            "weights", (args.w, "rep_nhwc", *shape), NUM_PARTITIONS, m_slots * w_free, operand
        )
        if args.bias:
            key = (args.bias, "rep_nhwc.bias", args.c_out)
            bias, load_bias = cg.weight_tile("bias", key, NUM_PARTITIONS, m_slots, Dtype.FP32)
        else:
            bias = cg.sb_tile("bias", NUM_PARTITIONS, 1, Dtype.FP32)
    else:
        weights = cg.sb_tile("weights", NUM_PARTITIONS, w_free, operand)
        bias = cg.sb_tile("bias", NUM_PARTITIONS, 1, Dtype.FP32)
    # The output-tile loop rotates band, out and acc (docs/buffers.md#lowerings).
    band_stride = copy_stride(rows * geo.cols_needed(cols), operand)
    bands = len(groups) * c_tiles  # one band per (row group, channel tile)
    counts = [args.batch, tile_count(args.out_h, rows), tile_count(args.out_w, cols)]
    level = rotating_level(counts)
    # With the weights whole, the C_out tiles run inside each output tile (its bands loaded
    # once for all of them), rotating two copies of acc and out.
    m_copies = 2 if m_slots > 1 else 1
    copies = 1
    if level is not None:
        copy_bytes = bands * band_stride * operand.itemsize + m_copies * MATMUL_MAX_MOVING_FREE * 4
        copies = buffer_count(cg, counts[level], copy_bytes, psum_banks=m_copies)
    buffers = tuple(copies if i == level else 1 for i in range(3))
    return _Plan(
        args,
        geo,
        src,
        plane,
        args.x_strides[1] // plane,
        args.x_strides[0] // plane,
        c_tile,
        c_tiles,
        groups,
        rows,
        cols,
        w_slot,
        m_slots,
        m_copies,
        weights=weights,
        load_weights=load_weights,
        load_bias=load_bias,
        band=cg.sb_tile("band", NUM_PARTITIONS, bands * copies * band_stride, operand),
        bias=bias,
        out=cg.sb_tile(
            "out", NUM_PARTITIONS, copies * m_copies * MATMUL_MAX_MOVING_FREE, Dtype.FP32
        ),
        acc=cg.psum_tile("acc", NUM_PARTITIONS, copies * m_copies * MATMUL_MAX_MOVING_FREE),
        buffers=buffers,
        band_stride=band_stride,
    )


def _load_weights(cg: BirCodeGen, plan: _Plan, m: Tile) -> None:
    """Partition (r, c) of a group slot holds W[m, c, g0 + r, :] for every kw."""
    args = plan.args
    w_o, w_i, w_h, w_w = args.w_strides  # canonical (o, i, 0, 1)
    for gi, (g0, g_rows) in enumerate(plan.row_groups):
        for k in tiles(cg, args.c_in, plan.c_tile, "kc"):
            for r in range(g_rows):
                cg.dma(
                    cg.ap(
                        plan.weights,
                        [(m.size, args.k_w), (1, m.size)],
                        plan.slot(gi, k, m),
                        partitions=k.size,
                        partition_start=r * k.size,
                    ),
                    cg.dram_ap(
                        args.w,
                        k.start * w_i + m.start * w_o + (g0 + r) * w_h,
                        [(w_i, k.size), (w_w, args.k_w), (w_o, m.size)],
                    ),
                )


def _output_tile(cg: BirCodeGen, plan: _Plan, m: Tile, at: _OutTile, sides_once: bool) -> None:
    """Replicate the band once per kernel row, kW matmuls per group, evict, store; band, out
    and acc are the copies `at.slot` picks."""
    out_at = at.slot * MATMUL_MAX_MOVING_FREE
    psum = cg.ap(plan.acc, [(1, at.pixels)], out_at, partitions=m.size)
    for gi in range(len(plan.row_groups)):
        for k in tiles(cg, plan.args.c_in, plan.c_tile, "kc", peel_first=True):
            _load_band(cg, plan, gi, k, at, sides_once)
            _group_matmuls(cg, plan, psum, gi, k, m, at)
    _evict(cg, plan, psum, out_at, m, at)


def _output_tile_all_blocks(cg: BirCodeGen, plan: _Plan, at: _OutTile, sides_once: bool) -> None:
    """One output tile for every C_out tile, the weights whole: every band loaded once, then
    each C_out tile's matmuls and eviction, acc and out rotating over `m_copies` copies so
    that the matmuls of one block overlap the eviction of the one before."""
    args = plan.args
    for gi in range(len(plan.row_groups)):
        for k in tiles(cg, args.c_in, plan.c_tile, "kc"):
            _load_band(cg, plan, gi, k, at, sides_once)
    for m in tiles(cg, args.c_out, NUM_PARTITIONS, "m", buffers=plan.m_copies):
        out_at = (at.slot * plan.m_copies + m.slot) * MATMUL_MAX_MOVING_FREE
        psum = cg.ap(plan.acc, [(1, at.pixels)], out_at, partitions=m.size)
        for gi in range(len(plan.row_groups)):
            for k in tiles(cg, args.c_in, plan.c_tile, "kc", peel_first=True):
                _group_matmuls(cg, plan, psum, gi, k, m, at)
        _evict(cg, plan, psum, out_at, m, at)


def _load_band(cg: BirCodeGen, plan: _Plan, gi: int, k: Tile, at: _OutTile, sides_once: bool):
    """The band of (row group gi, channel tile k) for one output tile, one read per kernel row."""
    geo, n, row, col, slot = plan.geo, at.n, at.row, at.col, at.slot
    g0, g_rows = plan.row_groups[gi]
    band_cols = geo.cols_needed(col.size)
    first_plane = k.start * plan.channel_planes + n.start * plan.batch_planes
    band_at = plan.band_at(gi, k, slot)
    # Each kernel row's band reads its own input rows: the rows that fall in the
    # padding differ from one to the next, and a memset must start at partition 0, 32,
    # 64 or 96, so the union of their frames is set on every partition of the group
    # first and each kernel row's read overwrites the rows it has (no-op inside).
    cols = clip(col.start * geo.stride_w, band_cols, geo.pad_left, geo.in_w)
    starts = [row.start * geo.stride_h + (g0 + r) * geo.dilation_h for r in range(g_rows)]
    clips = [clip(s, row.size, geo.pad_top, geo.in_h, geo.stride_h) for s in starts]
    before = max(c.before for c in clips)
    after = min(max(c.after for c in clips), row.size - before)
    union = Clip(before, row.size - before - after, after, Affine())
    group = (0, g_rows * k.size)
    frame_band(cg, plan.band, band_at, group, band_cols, union, cols, 0.0, not sides_once)
    for r, rows in enumerate(clips):
        read_band(
            cg,
            plan.band,
            band_at,
            (r * k.size, k.size),
            band_cols,
            rows,
            cols,
            plan.src,
            first_plane * plan.plane,
            (plan.channel_planes * plan.plane, k.size),
            geo.stride_h,
            geo.in_w,
        )


def _group_matmuls(cg: BirCodeGen, plan: _Plan, psum, gi: int, k: Tile, m: Tile, at: _OutTile):
    """The kW matmuls of (row group gi, channel tile k) into `psum` for C_out tile m."""
    geo, row, col, slot = plan.geo, at.row, at.col, at.slot
    g_rows = plan.row_groups[gi][1]
    band_cols = geo.cols_needed(col.size)
    band_at = plan.band_at(gi, k, slot)
    for kw in range(plan.args.k_w):
        cg.matmul(
            psum,
            cg.ap(
                plan.weights,
                [(1, m.size)],
                plan.slot(gi, k, m) + kw * m.size,
                partitions=g_rows * k.size,
            ),
            cg.ap(
                plan.band,
                [(band_cols, row.size), (geo.stride_w, col.size)],
                band_at + kw * geo.dilation_w,
                partitions=g_rows * k.size,
            ),
            accumulate=not (gi == 0 and k.first and kw == 0),
        )


def _evict(cg: BirCodeGen, plan: _Plan, psum, out_at, m: Tile, at: _OutTile) -> None:
    """psum (+ bias, fused activation) into the out tile, stored to y."""
    args, n, row, col = plan.args, at.n, at.row, at.col
    result = cg.ap(plan.out, [(1, at.pixels)], out_at, partitions=m.size)
    bias = None
    if args.bias:
        bias = cg.ap(plan.bias, [(1, 1)], plan.bias_column(m), partitions=m.size)
    cg.activation(result, psum, args.activation, bias=bias)
    y_b, y_f, y_h, y_w = args.y_strides
    cg.dma(
        cg.dram_ap(
            args.y,
            n.start * y_b + m.start * y_f + row.start * y_h + col.start * y_w,
            [(y_f, m.size), (y_h, row.size), (y_w, col.size)],
        ),
        result,
    )
