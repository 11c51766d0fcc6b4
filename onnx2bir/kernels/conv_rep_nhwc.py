"""Conv2d_dw_fb01_io01_01bf_rep_nhwc_Pcinh: dense conv with input rows replicated on partitions.

In: x in layout fb01 [C_in, N, H, W], w in io01 [C_in, C_out, kH, kW], optional bias [C_out].
Out: y in layout 01bf [H_out, W_out, N, C_out]; the selector bridges both ways.

"Pcinh" is the partition dim folded from C_in x h: partition p = (r, c) holds input channel c
as seen by kernel row g + r, so one matmul contracts over R kernel rows and all C_in channels
at once, and only the kW column taps remain to accumulate:

    psum[C_out, pixels] += Σ_kw  W_rep[(r, c), kw, C_out]ᵀ · X_rep[(r, c), rows, cols·sw + kw·dw]

with X_rep[(r, c), oh, ·] = X_padded[c, oh·sh + (g + r)·dh, ·], built by one DMA per kernel
row r. R = min(kH, 128 // C_in) rows fit at once (all of them when the selector's rep_nhwc
row matched: C_in·kH ≤ 128); otherwise the kernel rows are taken in groups of R (the
K-replication row, priority 9) and wide inputs (C_in > 128) in channel tiles of 128, all
accumulating into the same PSUM tile. Against the generic path this divides the matmul count
by R. Weights stay resident in SBUF for a C_out tile; the bias rides on the PSUM eviction.
"""

from __future__ import annotations

from onnx2bir.bir.enums import ActFunc, Dtype
from onnx2bir.bir.opcodes import MATMUL_MAX_MOVING_FREE, NUM_PARTITIONS
from onnx2bir.codegen.driver import BirCodeGen
from onnx2bir.codegen.lower_conv import tile_index
from onnx2bir.codegen.spatial import WindowGeometry, padded_input
from onnx2bir.codegen.tiling import tiles
from onnx2bir.kernels import kernel
from onnx2bir.kernels.conv_common import ConvKernelArgs, conv_kernel_args
from onnx2bir.patterns.conv import REP_NHWC


def kernel_geometry(args: ConvKernelArgs) -> WindowGeometry:
    (pad_top, _), (pad_left, _) = args.padding
    return WindowGeometry(
        args.in_h,
        args.in_w,
        args.out_h,
        args.out_w,
        args.k_h,
        args.k_w,
        args.stride[0],
        args.stride[1],
        args.rhs_dilation[0],
        args.rhs_dilation[1],
        pad_top,
        pad_left,
    )


@kernel(REP_NHWC)
def trace_rep_nhwc(cg: BirCodeGen, node: dict) -> None:
    args = conv_kernel_args(cg, node)
    if args.groups != 1 or any(d != 1 for d in args.lhs_dilation) or args.rhs_reversal:
        raise cg.fail("rep_nhwc takes dense forward convolutions only")
    if args.x_strides[2:] != (args.in_w, 1):
        raise cg.fail("rep_nhwc expects rows and columns innermost in its input")
    geo = kernel_geometry(args)
    plane = args.in_h * args.in_w
    channel_planes, batch_planes = args.x_strides[1] // plane, args.x_strides[0] // plane
    src, height, width = padded_input(cg, node["inputs"][0], args.batch * args.c_in, geo, 0.0)
    padded_plane = height * width

    c_tile = min(args.c_in, NUM_PARTITIONS)
    c_tiles = -(-args.c_in // c_tile)
    rows_per_group = max(1, min(args.k_h, NUM_PARTITIONS // c_tile))
    groups = [(g, min(rows_per_group, args.k_h - g)) for g in range(0, args.k_h, rows_per_group)]
    m_tile = min(args.c_out, NUM_PARTITIONS)
    cols = min(args.out_w, MATMUL_MAX_MOVING_FREE)
    rows = max(1, min(args.out_h, MATMUL_MAX_MOVING_FREE // cols))
    band_cols_max = geo.cols_needed(cols)
    # Resident weights: [(r, c), (group, channel tile, kw, C_out)] for one C_out tile.
    w_slot = args.k_w * m_tile
    weights = cg.sb_tile("weights", NUM_PARTITIONS, len(groups) * c_tiles * w_slot, Dtype.FP32)
    band = cg.sb_tile("band", NUM_PARTITIONS, rows * band_cols_max, Dtype.FP32)
    bias_sb = cg.sb_tile("bias", NUM_PARTITIONS, 1, Dtype.FP32)
    out_sb = cg.sb_tile("out", NUM_PARTITIONS, MATMUL_MAX_MOVING_FREE, Dtype.FP32)
    acc = cg.psum_tile("acc", NUM_PARTITIONS, MATMUL_MAX_MOVING_FREE)
    w_o, w_i, w_h, w_w = args.w_strides  # canonical (o, i, 0, 1)
    y_b, y_f, y_h, y_w = args.y_strides

    for m in tiles(cg, args.c_out, m_tile, "m"):
        for gi, (g0, g_rows) in enumerate(groups):
            for k in tiles(cg, args.c_in, c_tile, "kc"):
                slot = (gi * c_tiles + tile_index(k, c_tile)) * w_slot
                for r in range(g_rows):
                    cg.dma(
                        cg.ap(
                            weights,
                            [(m.size, args.k_w), (1, m.size)],
                            slot,
                            partitions=k.size,
                            partition_start=r * k.size,
                        ),
                        cg.dram_ap(
                            args.w,
                            k.start * w_i + m.start * w_o + (g0 + r) * w_h,
                            [(w_i, k.size), (w_w, args.k_w), (w_o, m.size)],
                        ),
                    )
        if args.bias:
            cg.dma(
                cg.ap(bias_sb, partitions=m.size),
                cg.dram_ap(args.bias, m.start, [(1, m.size), (1, 1)]),
            )
        for n in tiles(cg, args.batch, 1, "n"):
            for row in tiles(cg, args.out_h, rows, "oh"):
                for col in tiles(cg, args.out_w, cols, "ow"):
                    band_cols = geo.cols_needed(col.size)
                    pixels = row.size * col.size
                    psum = cg.ap(acc, [(1, pixels)], partitions=m.size)
                    for gi, (g0, g_rows) in enumerate(groups):
                        for k in tiles(cg, args.c_in, c_tile, "kc", peel_first=True):
                            first_plane = k.start * channel_planes + n.start * batch_planes
                            for r in range(g_rows):
                                first_row = row.start * geo.stride_h + (g0 + r) * geo.dilation_h
                                cg.dma(
                                    cg.ap(
                                        band,
                                        [(1, row.size * band_cols)],
                                        partitions=k.size,
                                        partition_start=r * k.size,
                                    ),
                                    cg.dram_ap(
                                        src,
                                        first_plane * padded_plane
                                        + first_row * width
                                        + col.start * geo.stride_w,
                                        [
                                            (channel_planes * padded_plane, k.size),
                                            (geo.stride_h * width, row.size),
                                            (1, band_cols),
                                        ],
                                    ),
                                )
                            slot = (gi * c_tiles + tile_index(k, c_tile)) * w_slot
                            for kw in range(args.k_w):
                                cg.matmul(
                                    psum,
                                    cg.ap(
                                        weights,
                                        [(1, m.size)],
                                        slot + kw * m.size,
                                        partitions=g_rows * k.size,
                                    ),
                                    cg.ap(
                                        band,
                                        [(band_cols, row.size), (geo.stride_w, col.size)],
                                        kw * geo.dilation_w,
                                        partitions=g_rows * k.size,
                                    ),
                                    accumulate=not (gi == 0 and k.first and kw == 0),
                                )
                    result = cg.ap(out_sb, [(1, pixels)], partitions=m.size)
                    bias = cg.ap(bias_sb, partitions=m.size) if args.bias else None
                    cg.activation(result, psum, ActFunc.COPY, bias=bias)
                    cg.dma(
                        cg.dram_ap(
                            args.y,
                            n.start * y_b + m.start * y_f + row.start * y_h + col.start * y_w,
                            [(y_f, m.size), (y_h, row.size), (y_w, col.size)],
                        ),
                        result,
                    )
