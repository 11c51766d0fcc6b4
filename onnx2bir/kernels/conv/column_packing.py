"""Column-packing convolution kernels: filter taps stacked on the partition dim (K-replication).

In: a NativeKernel node from TransformConvOp (`patterns/conv/selection.py`) with x in bf01, w in
oi01 (`conv2d_column_packing`, `conv2d_column_packing_1`) or io10 (`conv2d_column_packing_io10`),
an optional bias [C_out]. Out: y in bf01. Geometry and per-axis strides come from
`conv_kernel_args`, so the tracers read every tensor through its canonical strides.

Formula. With the input zero-padded by (low, high) and, for a transposed conv in backward form,
dilated by `lhs_dilation` (x[i] sits at low + i·lhs_dilation), output pixel (r, s) of channel o
is `y[o, r, s] = b[o] + Σ_{c, i, j} W[o, c, i', j'] · xp[c, r·sh + i·dh, s·sw + j·dw]` where
(i', j') = (i, j), or (kH−1−i, kW−1−j) under `rhs_reversal`.

- `conv2d_column_packing` (dense, C_in low): the taps are grouped, at most 128 // C_in taps a
  group; per group one matmul contracts over partitions p = (tap, c_in):
  `psum[C_out tile, pixels] (+)= Wg[(tap, c), C_out tile]ᵀ · Xg[(tap, c), pixels]`, the groups
  accumulating in PSUM. Xg is an implicit im2col built by DMA: the C_in partitions of tap
  (i, j) read the padded input shifted by (i·dh, j·dw).
- `conv2d_column_packing_1` / `_io10` (depthwise transposed): up to 128 // taps channels per
  matmul, partitions p = (c, tap), a block-diagonal stationary `S[(c, tap), c'] = W[c, tap']·δ`
  with the reversed taps, the moving operand the im2col band of those channels (one DMA for
  all of them). Over 128 taps, the taps are grouped as above, one channel per matmul.
  The dense tracer also honours lhs_dilation and rhs_reversal, and the depthwise one forward
  form and rhs dilation: both are written for the general formula, the rows restrict them.

Facts used: the PE computes `dst[M, N] = stationary[K, M]ᵀ·moving[K, N]` with K ≤ 128,
M ≤ 128, N ≤ 512 fp32 (one PSUM bank) and accumulates in fp32 (docs/neuroncore.md#pe-array);
stacking taps on partitions when C_in is small (NKI library conv1d/conv3d K-replication) and the
offset DMA as implicit im2col (docs/neuroncore.md#convolution); a compute-engine tile starts at
partition 0/32/64/96 while a DMA may write any partition (docs/neuroncore.md#partitions), hence
every partition packing here is done by DMA and every compute operand starts at partition 0; the
bias is a [P, 1] operand of the ScalarE activation that evicts PSUM (docs/neuroncore.md#scalare).

INFERRED choices:
- Tap groups (computed in `tap_grouping`): whole kernel rows per group when that needs no more
  matmuls than the minimum ⌈taps·C_in / 128⌉ (then a group's im2col and weights are one DMA
  each); otherwise runs of 128 // C_in consecutive row-major taps, each one to three rectangles
  (a DMA each, ≤ 5 dims), so the matmul count is the minimum. Partitions are packed densely at
  stride C_in, not at the nki-library 32-partition stride, since only DMA writes them.
- The moving operands of all groups of a pixel tile are built before the matmuls and reused
  for every C_out tile; the weights of all groups and C_out tiles are loaded once per node.
- Padding (and the lhs dilation) is realised in a zeroed DRAM scratch [N, C, Hp, Wp]
  (SBUF memset DMA'd out, then one strided DRAM→DRAM DMA of x) with Hp, Wp exactly the extent
  the output reads; x is read in place when there is no dilation and no positive padding.
  Negative padding (ConvTranspose pads > d·(k−1)) is handled by cropping: input pixels that
  land outside the scratch are not copied.
- The block-diagonal stationary is assembled in a DRAM scratch that mirrors the SBUF weight
  tile (zeros DMA'd out from a memset tile, one DRAM→DRAM DMA per channel tile and tap block
  whose destination stride `taps·columns + 1` walks the diagonal, one DMA back), because an
  SBUF access pattern cannot move its column with its partition; that is one weight DMA per
  128 // taps channels instead of one per channel.
- Depthwise weights: the channel axis is whichever of the canonical (o, i) kernel axes has
  size C; ConvTranspose canonicalizes io-first weights with o = C_out / group = 1, so for
  `_io10` it is the i axis.
- Compute dtype: x's float dtype for both matmul operands (DMA casts the weights); PSUM fp32.
"""

from __future__ import annotations

from dataclasses import dataclass

from onnx2bir.bir.enums import Dtype
from onnx2bir.bir.opcodes import MATMUL_MAX_MOVING_FREE, NUM_PARTITIONS
from onnx2bir.codegen.casting import pe_operand_dtype
from onnx2bir.codegen.driver import BirCodeGen
from onnx2bir.codegen.spatial import fill_dram
from onnx2bir.codegen.tiling import (
    Affine,
    buffer_count,
    copy_stride,
    rotating_level,
    tile_count,
    tile_index,
    tiles,
)
from onnx2bir.graph import Node
from onnx2bir.kernels.conv.common import (
    ConvKernelArgs,
    conv_attrs_with_out_shape,
    conv_kernel_args,
)
from onnx2bir.kernels.conv.tap_grouping import TapBlock, group_taps, tap_groups, weight_taps
from onnx2bir.kernels.conv.tap_grouping import TapGroup as TapGroup

# The names the conv registry writes (docs/conv_selection.md#attributes).
COLUMN_PACKING = "conv2d_column_packing"
COLUMN_PACKING_1 = "conv2d_column_packing_1"
COLUMN_PACKING_IO10 = "conv2d_column_packing_io10"


@dataclass(frozen=True)
class Source:
    """The padded (dilated) input as the moving DMAs read it: a location and element strides."""

    name: str
    base: int  # element offset of padded position (0, 0) of batch 0, channel 0
    batch: int
    chan: int
    row: int
    col: int


def pixel_tile(args: ConvKernelArgs) -> tuple[int, int]:
    """(rows, cols) of an output tile: at most 512 pixels, one PSUM bank of fp32."""
    cols = min(args.out_w, MATMUL_MAX_MOVING_FREE)
    return max(1, min(args.out_h, MATMUL_MAX_MOVING_FREE // cols)), cols


def compute_dtype(cg: BirCodeGen, node: Node) -> Dtype:
    dtype = cg.graph.tensors[node.inputs[0]].dtype
    if not dtype.is_float:
        raise cg.fail(f"column packing computes on the PE array in a float dtype; x is {dtype}")
    return dtype


def _kept(low: int, dilation: int, size: int, extent: int) -> tuple[int, int]:
    """(first, count) of input indices i whose position low + i·dilation lies in [0, extent)."""
    first = max(0, -(low // dilation))
    last = min(size - 1, (extent - 1 - low) // dilation) if extent - 1 >= low else -1
    return first, max(0, last - first + 1)


def staged_input(cg: BirCodeGen, args: ConvKernelArgs, channels: int, dtype: Dtype) -> Source:
    """The input framed by its padding and dilated by lhs_dilation; x itself when neither."""
    (low_h, _), (low_w, _) = args.padding
    ld_h, ld_w = args.lhs_dilation
    sh, sw = args.stride
    dh, dw = args.rhs_dilation
    height = (args.out_h - 1) * sh + (args.k_h - 1) * dh + 1
    width = (args.out_w - 1) * sw + (args.k_w - 1) * dw + 1
    xs_b, xs_f, xs_h, xs_w = args.x_strides
    if (
        (ld_h, ld_w) == (1, 1)
        and low_h <= 0
        and low_w <= 0
        and height - low_h <= args.in_h
        and width - low_w <= args.in_w
    ):
        return Source(args.x, -low_h * xs_h - low_w * xs_w, xs_b, xs_f, xs_h, xs_w)
    plane = height * width
    scratch = cg.dram_scratch("padded", (args.batch, channels, height, width), dtype)
    fill_dram(cg, scratch.name, args.batch * channels * plane, dtype, 0.0, plane)
    first_h, count_h = _kept(low_h, ld_h, args.in_h, height)
    first_w, count_w = _kept(low_w, ld_w, args.in_w, width)
    if count_h and count_w:
        cg.dma(
            cg.dram_ap(
                scratch.name,
                Affine((low_h + first_h * ld_h) * width + low_w + first_w * ld_w),
                [
                    (channels * plane, args.batch),
                    (plane, channels),
                    (ld_h * width, count_h),
                    (ld_w, count_w),
                ],
            ),
            cg.dram_ap(
                args.x,
                Affine(first_h * xs_h + first_w * xs_w),
                [(xs_b, args.batch), (xs_f, channels), (xs_h, count_h), (xs_w, count_w)],
            ),
        )
    return Source(scratch.name, 0, channels * plane, plane, width, 1)


def load_bias(cg: BirCodeGen, bias: str, count: int, per_tile: int):
    """bias[count] as a [per_tile, tiles] SBUF tile: column k holds the bias of channel tile k."""
    full, rest = divmod(count, per_tile)
    bias_sb = cg.sb_tile("bias", per_tile, full + (1 if rest else 0), Dtype.FP32)
    if full:
        cg.dma(
            cg.ap(bias_sb, [(1, full)]),
            cg.dram_ap(bias, Affine(), [(1, per_tile), (per_tile, full)]),
        )
    if rest:
        cg.dma(
            cg.ap(bias_sb, [(1, 1)], full, partitions=rest),
            cg.dram_ap(bias, Affine(full * per_tile), [(1, rest), (1, 1)]),
        )
    return bias_sb


def _window(
    src: Source, args: ConvKernelArgs, block: TapBlock, n, row, col
) -> tuple[Affine, list[tuple[int, int]], list[tuple[int, int]]]:
    """(offset, tap dims, pixel dims) of a block's shifted windows in the staged input."""
    sh, sw = args.stride
    dh, dw = args.rhs_dilation
    offset = (
        Affine(src.base + block.row * dh * src.row + block.col * dw * src.col)
        + n.start * src.batch
        + row.start * (sh * src.row)
        + col.start * (sw * src.col)
    )
    return (
        offset,
        [(dh * src.row, block.rows), (dw * src.col, block.cols)],
        [(sh * src.row, row.size), (sw * src.col, col.size)],
    )


def _evict(
    cg: BirCodeGen,
    args: ConvKernelArgs,
    psum,
    out_sb,
    bias,
    first_channel,
    channels,
    n,
    row,
    col,
    out_at: Affine | int = 0,
) -> None:
    """PSUM → SBUF (at element `out_at` of out_sb) with the bias column and the fused
    activation, if any, on ScalarE, then SBUF → y."""
    pixels = row.size * col.size
    result = cg.ap(out_sb, [(1, pixels)], out_at, partitions=channels)
    cg.activation(result, psum, args.activation, bias=bias)
    ys_b, ys_f, ys_h, ys_w = args.y_strides
    cg.dma(
        cg.dram_ap(
            args.y,
            n.start * ys_b + first_channel * ys_f + row.start * ys_h + col.start * ys_w,
            [(ys_f, channels), (ys_h, row.size), (ys_w, col.size)],
        ),
        result,
    )


# --- dense, low C_in --------------------------------------------------------------------------
def conv2d_column_packing(cg: BirCodeGen, node: Node) -> None:
    """Dense conv, partitions p = (tap, c_in), tap groups accumulating in PSUM."""
    args = conv_kernel_args(cg, node)
    dtype = compute_dtype(cg, node)
    if args.groups != 1:
        raise cg.fail(f"dense column packing needs feature_group_count 1, got {args.groups}")
    if args.c_in > NUM_PARTITIONS:
        raise cg.fail(f"C_in {args.c_in} > {NUM_PARTITIONS}: one tap does not fit the partitions")
    c_in, c_out = args.c_in, args.c_out
    groups = tap_groups(args.k_h, args.k_w, c_in)
    rows, cols = pixel_tile(args)
    tile_pixels = rows * cols
    m_tile = min(c_out, NUM_PARTITIONS)
    k_max = max(group_taps(g) for g in groups) * c_in
    ws_o, ws_i = args.w_strides[:2]

    # Stationary of group g: w_sb[(tap, c), g·C_out + o] = W[o, c, tap].
    operand = pe_operand_dtype(cg, dtype, otherwise=dtype)  # the autocast: DMAs cast
    w_sb = cg.sb_tile("weights", k_max, len(groups) * c_out, operand)
    for index, group in enumerate(groups):
        for block in group:
            first, taps = weight_taps(args, block)
            cg.dma(
                cg.ap(
                    w_sb,
                    [(1, c_out)],
                    index * c_out,
                    partitions=block.taps * c_in,
                    partition_start=block.first * c_in,
                ),
                cg.dram_ap(args.w, Affine(first), [*taps, (ws_i, c_in), (ws_o, c_out)]),
            )
    bias_sb = load_bias(cg, args.bias, c_out, m_tile) if args.bias else None
    src = staged_input(cg, args, c_in, dtype)
    # im2col, out and acc rotate over the innermost output-tile loop with more than one tile
    # (docs/buffers.md#lowerings); the C_out loop inside reuses the copy its tile picked.
    out_dtype = cg.graph.tensors[node.outputs[0]].dtype
    mov_stride = copy_stride(len(groups) * tile_pixels, operand)
    out_stride = copy_stride(tile_pixels, out_dtype)
    counts = [args.batch, tile_count(args.out_h, rows), tile_count(args.out_w, cols)]
    level = rotating_level(counts)
    copies = 1
    if level is not None:
        per_copy = mov_stride * operand.itemsize + out_stride * out_dtype.itemsize
        copies = buffer_count(cg, counts[level], per_copy, psum_banks=1)
    buffers = [copies if i == level else 1 for i in range(3)]
    mov = cg.sb_tile(
        "im2col", k_max, (copies - 1) * mov_stride + len(groups) * tile_pixels, operand
    )
    out_sb = cg.sb_tile("out", m_tile, (copies - 1) * out_stride + tile_pixels, out_dtype)
    acc = cg.psum_tile("acc", m_tile, (copies - 1) * MATMUL_MAX_MOVING_FREE + tile_pixels)

    for n in tiles(cg, args.batch, 1, "n", buffers=buffers[0]):
        for row in tiles(cg, args.out_h, rows, "oh", buffers=buffers[1]):
            for col in tiles(cg, args.out_w, cols, "ow", buffers=buffers[2]):
                slot = n.slot + row.slot + col.slot  # at most one of them rotates
                mov_at, out_at = slot * mov_stride, slot * out_stride
                acc_at = slot * MATMUL_MAX_MOVING_FREE
                pixels = row.size * col.size
                # The implicit im2col: tap t's C_in partitions read the window shifted by t.
                for index, group in enumerate(groups):
                    for block in group:
                        offset, tap_dims, pixel_dims = _window(src, args, block, n, row, col)
                        cg.dma(
                            cg.ap(
                                mov,
                                [(1, pixels)],
                                mov_at + index * tile_pixels,
                                partitions=block.taps * c_in,
                                partition_start=block.first * c_in,
                            ),
                            cg.dram_ap(
                                src.name, offset, [*tap_dims, (src.chan, c_in), *pixel_dims]
                            ),
                        )
                for m in tiles(cg, c_out, m_tile, "m"):
                    psum = cg.ap(acc, [(1, pixels)], acc_at, partitions=m.size)
                    for index, group in enumerate(groups):
                        k = group_taps(group) * c_in
                        cg.matmul(
                            psum,
                            cg.ap(w_sb, [(1, m.size)], m.start + index * c_out, partitions=k),
                            cg.ap(mov, [(1, pixels)], mov_at + index * tile_pixels, partitions=k),
                            accumulate=index > 0,
                        )
                    bias = (
                        cg.ap(bias_sb, [(1, 1)], tile_index(m, m_tile), partitions=m.size)
                        if bias_sb is not None
                        else None
                    )
                    _evict(cg, args, psum, out_sb, bias, m.start, m.size, n, row, col, out_at)


# --- depthwise transposed -----------------------------------------------------------------------
def _depthwise_channel_stride(cg: BirCodeGen, args: ConvKernelArgs, channels: int) -> int:
    """Stride of the channel axis in w: canonical o for an o-first kernel, i for io-first."""
    if args.c_out == channels:
        return args.w_strides[0]
    if args.c_out == 1:
        return args.w_strides[1]
    raise cg.fail(f"depthwise kernel with {args.c_out} output channels for {channels} channels")


def depthwise_column_packing(cg: BirCodeGen, node: Node) -> None:
    """Depthwise conv (any form), partitions p = (c, tap), block-diagonal stationary."""
    args = conv_kernel_args(cg, node)
    dtype = compute_dtype(cg, node)
    attrs = conv_attrs_with_out_shape(cg, node)
    channels = attrs["out_shape"][attrs["out_perm"][1]]
    if not args.groups == args.c_in == channels:
        raise cg.fail(f"not depthwise: groups {args.groups}, C_in {args.c_in}, C_out {channels}")
    ws_c = _depthwise_channel_stride(cg, args, channels)
    groups = tap_groups(args.k_h, args.k_w, 1)
    most_taps = max(group_taps(g) for g in groups)
    # A group of several blocks has > 64 taps, so it holds one channel and its blocks' partition
    # ranges stay contiguous; several channels per matmul only ever use one-block groups.
    per_tile = min(channels, NUM_PARTITIONS // most_taps)
    channel_tiles = -(-channels // per_tile)
    k_max = per_tile * most_taps
    rows, cols = pixel_tile(args)
    tile_pixels = rows * cols

    # The block-diagonal stationary, assembled in DRAM: w_sb[c·taps_g + t, (ct·G + g)·per_tile
    # + c] = W[ct·per_tile + c, flipped tap t]. Row-major, that element is at c·(taps_g·width
    # + 1) + t·width + column, one strided DMA per (channel tile, block).
    width = channel_tiles * len(groups) * per_tile
    operand = pe_operand_dtype(cg, dtype, otherwise=dtype)  # the autocast: DMAs cast
    w_sb = cg.sb_tile("weights", k_max, width, operand)
    diag = cg.dram_scratch("block_diagonal", (k_max, width), operand)
    whole = [(width, k_max), (1, width)]
    cg.memset(cg.ap(w_sb), 0.0)
    cg.dma(cg.dram_ap(diag.name, Affine(), whole), cg.ap(w_sb))
    for ct in range(channel_tiles):
        first_channel = ct * per_tile
        size = min(per_tile, channels - first_channel)
        for index, group in enumerate(groups):
            taps_g = group_taps(group)
            column = (ct * len(groups) + index) * per_tile
            for block in group:
                first, taps = weight_taps(args, block)
                cg.dma(
                    cg.dram_ap(
                        diag.name,
                        Affine(column + block.first * width),
                        [
                            (taps_g * width + 1, size),
                            (block.cols * width, block.rows),
                            (width, block.cols),
                        ],
                    ),
                    cg.dram_ap(args.w, Affine(first + first_channel * ws_c), [(ws_c, size), *taps]),
                )
    cg.dma(cg.ap(w_sb), cg.dram_ap(diag.name, Affine(), whole))

    bias_sb = load_bias(cg, args.bias, channels, per_tile) if args.bias else None
    src = staged_input(cg, args, channels, dtype)
    mov = cg.sb_tile("im2col", k_max, len(groups) * tile_pixels, operand)
    out_sb = cg.sb_tile("out", per_tile, tile_pixels, cg.graph.tensors[node.outputs[0]].dtype)
    acc = cg.psum_tile("acc", per_tile, tile_pixels)

    for n in tiles(cg, args.batch, 1, "n"):
        for ct in tiles(cg, channels, per_tile, "c"):
            ct_index = tile_index(ct, per_tile)
            for row in tiles(cg, args.out_h, rows, "oh"):
                for col in tiles(cg, args.out_w, cols, "ow"):
                    pixels = row.size * col.size
                    psum = cg.ap(acc, [(1, pixels)], partitions=ct.size)
                    for index, group in enumerate(groups):
                        k = ct.size * group_taps(group)
                        moving = cg.ap(mov, [(1, pixels)], index * tile_pixels, partitions=k)
                        for block in group:
                            offset, tap_dims, pixel_dims = _window(src, args, block, n, row, col)
                            cg.dma(
                                cg.ap(
                                    mov,
                                    [(1, pixels)],
                                    index * tile_pixels,
                                    partitions=ct.size * block.taps,
                                    partition_start=block.first,
                                ),
                                cg.dram_ap(
                                    src.name,
                                    offset + ct.start * src.chan,
                                    [(src.chan, ct.size), *tap_dims, *pixel_dims],
                                ),
                            )
                        stationary = cg.ap(
                            w_sb,
                            [(1, ct.size)],
                            ct_index * (len(groups) * per_tile) + index * per_tile,
                            partitions=k,
                        )
                        cg.matmul(psum, stationary, moving, accumulate=index > 0)
                    bias = (
                        cg.ap(bias_sb, [(1, 1)], ct_index, partitions=ct.size)
                        if bias_sb is not None
                        else None
                    )
                    _evict(cg, args, psum, out_sb, bias, ct.start, ct.size, n, row, col)


def conv2d_column_packing_1(cg: BirCodeGen, node: Node) -> None:
    """Depthwise transposed conv, kernel stored o-first (oi01)."""
    depthwise_column_packing(cg, node)


def conv2d_column_packing_io10(cg: BirCodeGen, node: Node) -> None:
    """Depthwise transposed conv, kernel stored io-first with swapped spatial axes (io10)."""
    depthwise_column_packing(cg, node)
