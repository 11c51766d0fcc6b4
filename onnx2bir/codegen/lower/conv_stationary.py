"""The generic conv with its weights stationary: loaded once, kept for the whole node.

A dense conv (one group) whose weights, in the PE operand dtype, fit `RESIDENT_WEIGHT_BYTES` of
each SBUF partition is emitted in this order (docs/conv_selection.md#generic-conv):

    load every weight [C_in tile, tap, C_out] and every bias column, one DMA per input-channel
    tile (each on its own queue)
    for each image n, for each output tile (rows x cols <= 512 pixels):
        load the band of every input-channel tile (one copy for the whole 128-channel tiles,
        one for an edge tile)
        for each 128-channel output block m:
            psum[m] = Σ over input-channel tiles and taps of W[k, tap, m]ᵀ · band[k, window]
            evict psum[m] + bias[m] (ScalarE) into the output, in its SBUF home when the memory
            plan keeps it there

Against the block-by-block order of `lower_conv.emit_conv` (weights of one output block, then
every output tile reloading its band), the weights are read once whatever the batch and the
number of output tiles, and each band is read once for every output block. The output-tile loop
rotates the band's copies; the PSUM bank and the eviction tile have a copy per band copy times
the copies the output-block loop rotates, so the matmuls of block m + 1 overlap the eviction of
block m and the output-tile loop carries no hazard (docs/buffers.md).
"""

from __future__ import annotations

from onnx2bir.bir.enums import Dtype
from onnx2bir.bir.opcodes import MATMUL_MAX_MOVING_FREE, NUM_PARTITIONS
from onnx2bir.codegen.casting import pe_operand_dtype
from onnx2bir.codegen.driver import BirCodeGen
from onnx2bir.codegen.spatial import (
    WindowGeometry,
    clip,
    frame_band,
    frame_sides,
    read_band,
    window_tiles,
)
from onnx2bir.codegen.tiling import (
    Affine,
    buffer_count,
    copy_stride,
    rotating_level,
    tile_count,
    tile_index,
    tiles,
)

# Weights up to this many bytes of each partition stay resident for the whole node: a third
# of SBUF (docs/neuroncore.md#memory), so that the node's arena leaves room for the resident
# activations around it (docs/memory_planner.md#allocation).
RESIDENT_WEIGHT_BYTES = 64 * 1024


def stationary_fits(cg: BirCodeGen, c_in: int, taps: int, c_out: int, groups: int) -> bool:
    """Whether a conv takes the weight-stationary order: one group, weights within budget."""
    if groups != 1:
        return False
    k_tiles = tile_count(c_in, NUM_PARTITIONS)
    return k_tiles * taps * c_out * pe_operand_dtype(cg).itemsize <= RESIDENT_WEIGHT_BYTES


def emit_stationary_conv(cg: BirCodeGen, geo: WindowGeometry, source, weights, y_loc: str) -> None:
    """`lower_conv.emit_conv` in the weight-stationary order (module docstring); `source` and
    `weights` are its ConvInput and ConvWeights (one group)."""
    c_in, c_out, taps = weights.c_in_group, weights.c_out, geo.taps
    operand = pe_operand_dtype(cg)
    k_tiles = tile_count(c_in, NUM_PARTITIONS)
    m_tiles = tile_count(c_out, NUM_PARTITIONS)
    k_stride = taps * c_out  # elements of w_sb per input-channel tile
    # Clones of one conv (a batch run an image at a time) may share one copy of the weights
    # in SBUF, loaded by the first of them (docs/memory_planner.md#shared-weights).
    w_sb, load = cg.weight_tile(
        "weights",
        (weights.loc, "conv_stationary", c_in, taps, c_out, operand),
        NUM_PARTITIONS,
        k_tiles * k_stride,
        operand,
    )
    if load:
        _load_weights(cg, w_sb, weights.loc, c_in, taps, c_out)
    bias_sb = None
    if weights.bias:
        bias_sb, load = cg.weight_tile(
            "bias",
            (weights.bias, "conv_stationary.bias", c_out),
            NUM_PARTITIONS,
            m_tiles,
            Dtype.FP32,
        )
        if load:
            _load_bias(cg, bias_sb, weights.bias, c_out)

    cols = min(geo.out_w, MATMUL_MAX_MOVING_FREE)
    rows = max(1, min(geo.out_h, MATMUL_MAX_MOVING_FREE // cols))
    band_stride = copy_stride(geo.rows_needed(rows) * geo.cols_needed(cols), operand)
    counts = [source.batch, tile_count(geo.out_h, rows), tile_count(geo.out_w, cols)]
    level = rotating_level(counts)
    band_copies = 1
    if level is not None:
        band_copies = buffer_count(cg, counts[level], k_tiles * band_stride * operand.itemsize)
    buffers = [band_copies if i == level else 1 for i in range(3)]
    x_sb = cg.sb_tile("band", NUM_PARTITIONS, band_copies * k_tiles * band_stride, operand)
    # The PSUM bank and the eviction tile have a copy per band copy (so the output-tile loop
    # keeps no carried hazard) times the copies the output blocks rotate.
    m_copies = 1
    if m_tiles > 1:
        m_copies = buffer_count(
            cg, m_tiles, band_copies * MATMUL_MAX_MOVING_FREE * 4, psum_banks=band_copies
        )
    out_copies = band_copies * m_copies
    out_sb = cg.sb_tile("out", NUM_PARTITIONS, out_copies * MATMUL_MAX_MOVING_FREE, Dtype.FP32)
    acc = cg.psum_tile("acc", NUM_PARTITIONS, out_copies * MATMUL_MAX_MOVING_FREE)

    plane = source.plane
    out_plane = geo.out_h * geo.out_w
    full_k, rest_k = divmod(c_in, NUM_PARTITIONS)
    framing = source.band_geometry(geo)  # the padding to frame in SBUF, if any
    sides_once = tile_count(geo.out_w, cols) == 1
    if sides_once:  # every band has the same side columns: framed once, every copy
        band_cols = geo.cols_needed(cols)
        sides = clip(Affine(), band_cols, framing.pad_left, framing.in_w)
        at = (band_stride, band_copies * k_tiles)
        band_rows = geo.rows_needed(rows)
        frame_sides(cg, x_sb, 0, at, (0, NUM_PARTITIONS), band_rows, band_cols, sides, 0.0)
    for n in tiles(cg, source.batch, 1, "n", buffers=buffers[0]):
        for row in window_tiles(cg, framing, "h", geo.out_h, rows, "oh", buffers[1]):
            for col in window_tiles(cg, framing, "w", geo.out_w, cols, "ow", buffers[2]):
                tile_slot = n.slot + row.slot + col.slot  # at most one of them rotates
                band_at = tile_slot * (k_tiles * band_stride)
                band_rows = geo.rows_needed(row.size)
                band_cols = geo.cols_needed(col.size)
                row_clip = clip(row.start * geo.stride_h, band_rows, framing.pad_top, framing.in_h)
                col_clip = clip(col.start * geo.stride_w, band_cols, framing.pad_left, framing.in_w)
                # Every input-channel tile's band: the whole tiles in one copy, the edge one.
                for first, count, partitions in ((0, full_k, NUM_PARTITIONS), (full_k, 1, rest_k)):
                    if not count or not partitions:
                        continue
                    # (a one-tile copy has no tile dim: a unit dim would need its stride to
                    # be a whole number of the home's 128-row chunks)
                    at = band_at + first * band_stride
                    lanes = (0, partitions)
                    copies = (band_stride, NUM_PARTITIONS * plane, count) if count > 1 else None
                    frame_band(
                        cg,
                        x_sb,
                        at,
                        lanes,
                        band_cols,
                        row_clip,
                        col_clip,
                        0.0,
                        not sides_once,
                        copies[::2] if copies else None,
                    )
                    read_band(
                        cg,
                        x_sb,
                        at,
                        lanes,
                        band_cols,
                        row_clip,
                        col_clip,
                        source.loc,
                        n.start * (source.channels * plane) + first * NUM_PARTITIONS * plane,
                        (plane, partitions),
                        1,
                        source.width,
                        copies,
                    )
                pixels = row.size * col.size
                for m in tiles(cg, c_out, NUM_PARTITIONS, "m", buffers=m_copies):
                    out_at = (tile_slot * m_copies + m.slot) * MATMUL_MAX_MOVING_FREE
                    psum = cg.ap(acc, [(1, pixels)], out_at, partitions=m.size)
                    for k in tiles(cg, c_in, NUM_PARTITIONS, "kc", peel_first=True):
                        k_index = tile_index(k, NUM_PARTITIONS)
                        at = band_at + k_index * band_stride
                        for tap in range(taps):
                            i, j = divmod(tap, geo.kernel_w)
                            moving = cg.ap(
                                x_sb,
                                [(geo.stride_h * band_cols, row.size), (geo.stride_w, col.size)],
                                at + i * geo.dilation_h * band_cols + j * geo.dilation_w,
                                partitions=k.size,
                            )
                            stationary = cg.ap(
                                w_sb,
                                [(1, m.size)],
                                k_index * k_stride + tap * c_out + m.start,
                                partitions=k.size,
                            )
                            first = k.first and tap == 0
                            cg.matmul(psum, stationary, moving, accumulate=not first)
                    y_view = cg.dram_ap(
                        y_loc,
                        (n.start * c_out + m.start) * out_plane + row.start * geo.out_w + col.start,
                        [(out_plane, m.size), (geo.out_w, row.size), (1, col.size)],
                    )
                    tile = cg.ap(out_sb, [(1, pixels)], out_at, partitions=m.size)
                    result = cg.write_operand(tile, y_view)
                    bias = None
                    if bias_sb is not None:
                        bias = cg.ap(
                            bias_sb,
                            [(1, 1)],
                            tile_index(m, NUM_PARTITIONS),
                            partitions=m.size,
                        )
                    cg.activation(result, psum, weights.activation, bias=bias)
                    cg.store_result(y_view, tile, result)


def _load_weights(cg: BirCodeGen, w_sb, w_loc: str, c_in: int, taps: int, c_out: int) -> None:
    """OIHW weights into [C_in tile (partitions), tile, tap, C_out]: one DMA per input-channel
    tile, emitted one by one so that they take different queues and run at once."""
    weight_row = c_in * taps  # elements of W per output channel
    k_stride = taps * c_out
    for index in range(tile_count(c_in, NUM_PARTITIONS)):
        first = index * NUM_PARTITIONS
        size = min(NUM_PARTITIONS, c_in - first)
        cg.dma(
            cg.ap(w_sb, [(c_out, taps), (1, c_out)], index * k_stride, partitions=size),
            cg.dram_ap(w_loc, Affine(first * taps), [(taps, size), (1, taps), (weight_row, c_out)]),
        )


def _load_bias(cg: BirCodeGen, bias_sb, b_loc: str, c_out: int) -> None:
    """Bias [C_out] into one column per 128-channel output block: channel m·128 + p at
    partition p, column m."""
    full, rest = divmod(c_out, NUM_PARTITIONS)
    if full:
        cg.dma(
            cg.ap(bias_sb, [(1, full)], 0),
            cg.dram_ap(b_loc, Affine(), [(1, NUM_PARTITIONS), (NUM_PARTITIONS, full)]),
        )
    if rest:
        cg.dma(
            cg.ap(bias_sb, [(1, 1)], full, partitions=rest),
            cg.dram_ap(b_loc, Affine(full * NUM_PARTITIONS), [(1, rest), (1, 1)]),
        )
