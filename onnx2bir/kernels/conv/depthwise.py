"""The two depthwise conv kernels on VectorE: conv2d_depthwise_f01b_o01i_bf01 (priority 5) and
Conv1d_depthwise_bf01_oi01_bf01 (priority 3). Neither uses the PE array.

In (2-D): x in f01b [C, H, W, N], w in o01i [C, kH, kW, 1], optional bias [C].
In (1-D): x in bf01 [N, C, 1, L], w in oi01 [C, 1, 1, K], optional bias [C].
Out: y in bf01 [N, C, H_out, W_out] (the 1-D kernel's H_out is 1). Any stride, rhs dilation,
(low, high) padding and batch; one channel per group and C_out = C_in (the selector's rows).

Both compute, per channel c and output pixel (r, q),

    y[n, c, r, q] = b[c] + Σ_(i, j) w[c, i, j] · x_pad[n, c, r·s_h + i·d_h, q·s_w + j·d_w]

with channels on partitions (tiles of 128): a depthwise conv contracts over nothing, so the
PE array would use one column of 128 (docs/neuroncore.md#convolution) while the vector engines are
fully parallel over channels (the parallel axis goes on P, docs/neuroncore.md#partitions).

- 2-D (docs/neuroncore.md#convolution: the depthwise kernels and pooling's window AP): per
  output tile of rows x cols, one DMA brings the band of input rows it reads, one
  TensorTensor multiplies the band seen through a 4-D window pattern [rows, cols, kH, kW]
  (strides s_h·band_cols, s_w, d_h·band_cols, d_w) by the channel tile's taps [c, kH·kW]
  broadcast with stride 0 over rows and cols, and one TensorReduce(add) sums the last two
  free dims. The neuron-team kernel sums the products on the PE array through an identity
  matmul; here the reduce stays on VectorE (`tensor_reduce`, docs/neuroncore.md#vectore), which
  keeps the kernel off PSUM. The bias rides on a ScalarE copy (`activation` with a [P, 1] bias,
  docs/neuroncore.md#scalare), so VectorE does two instructions per tile and ScalarE one.
  Band, products and out rotate over buffer copies along the innermost output-tile loop with
  more than one tile (docs/buffers.md#lowerings), which makes that loop `parallel`.
- 1-D (`tensor_scalar`, docs/neuroncore.md#vectore): per output tile of L_t ≤ 2048 positions, tap k
  multiplies the strided window band[k·d :: s] by the per-partition weight column w[c, k] (a [P, 1]
  operand). Tap 0 writes the accumulator, adding the bias in the same instruction (op1); later taps
  go to one of two temporaries on ScalarE and a VectorE TensorTensor adds them in, so ScalarE's
  multiply of tap k + 1 overlaps VectorE's add of tap k.

Layouts. The kernel reads x through `conv_kernel_args` strides, never a hard-coded layout.
The 2-D kernel reads each band straight from x through its strides (f01b puts the batch
innermost, so a row's columns are N apart) and sets the band's positions in the padding to zero
in SBUF (docs/memory_planner.md#framed-bands). The 1-D kernel frames x with zeros in a DRAM
scratch buffer laid out [C, N, 1, L_pad] instead; unpadded inputs are read in place.
The compute tiles are fp32 whatever x's float dtype (the DMA converts, docs/neuroncore.md#dma);
VectorE computes in fp32 anyway (docs/neuroncore.md#engines). Only the 1-D kernel's scratch and
its zero-fill tile keep x's dtype.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from onnx2bir.bir.enums import ActFunc, AluOp, Dtype, Engine
from onnx2bir.bir.ir import MemoryLocation
from onnx2bir.bir.opcodes import NUM_PARTITIONS
from onnx2bir.codegen.driver import BirCodeGen
from onnx2bir.codegen.spatial import (
    clip,
    fill_dram,
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
    tiles,
)
from onnx2bir.graph import Node
from onnx2bir.kernels.conv.common import ConvKernelArgs, conv_kernel_args, kernel_geometry

FP32_BYTES = 4
# The 2-D product tile [rows, cols, kH, kW] per partition. 64 KiB is 16K fp32, a quarter of
# VectorE's 64K-element free-size limit (docs/neuroncore.md#partitions) and a third of a partition's
# 192 KiB.
# The names the conv registry writes (docs/conv_selection.md#attributes).
CONV2D_DEPTHWISE = "conv2d_depthwise_f01b_o01i_bf01"
CONV1D_DEPTHWISE = "Conv1d_depthwise_bf01_oi01_bf01"
PRODUCT_BYTES = 64 * 1024
# Band + product + output tiles together, leaving room under the ~176 KiB a compiler may use
# (docs/neuroncore.md#memory: ~16 KiB reserved) for the zero-fill tile, the taps, the bias and the
# identity.
WORK_BYTES = 128 * 1024
# Output columns per 2-D tile: whole output rows up to this width, so the band and the y DMAs
# move long contiguous runs; the 16-bit AP strides stay far from overflow
# (docs/neuroncore.md#partitions).
MAX_TILE_COLS = 512
# Output positions per 1-D tile: each tap costs ~max(64, L_t) cycles
# (docs/neuroncore.md#cost-model), so the fixed instruction cost is amortised well before this.
# The band (≈ stride·L_t) and the three L_t-long tiles must also fit WORK_BYTES, which shortens
# the tile for large strides.
MAX_TILE_LENGTH = 2048
# Zero-fill tile for the padded scratch, and the most elements one interior DMA moves.
DMA_CHUNK = 1 << 20


@dataclass(frozen=True)
class Source:
    """The zero-framed input: a DRAM location and the strides of canonical (b, f, 0, 1) in it."""

    loc: str
    strides: tuple[int, int, int, int]


def rows_needed(args: ConvKernelArgs, out_rows: int) -> int:
    return (out_rows - 1) * args.stride[0] + (args.k_h - 1) * args.rhs_dilation[0] + 1


def cols_needed(args: ConvKernelArgs, out_cols: int) -> int:
    return (out_cols - 1) * args.stride[1] + (args.k_w - 1) * args.rhs_dilation[1] + 1


def check_depthwise(cg: BirCodeGen, node: Node, args: ConvKernelArgs) -> None:
    """What both kernels assume, beyond what the selector's rows check."""
    if not (args.groups == args.c_in == args.c_out):
        raise cg.fail(
            f"not depthwise: groups {args.groups}, C_in {args.c_in}, "
            f"C_out {args.c_out} (depth multipliers other than 1 are not supported)"
        )
    if any(d != 1 for d in args.lhs_dilation) or args.rhs_reversal:
        raise cg.fail("forward convolutions only (lhs dilation or a reversed kernel given)")
    if any(side < 0 for pair in args.padding for side in pair):
        raise cg.fail(f"negative padding {args.padding} is not supported")
    dtype = cg.graph.tensors[node.inputs[0]].dtype
    if not dtype.is_float:
        raise cg.fail(f"the depthwise kernels compute in fp32; input is {dtype}")


def framed_input(cg: BirCodeGen, node: Node, args: ConvKernelArgs) -> Source:
    """x framed by zeros in a [C, N, H_pad, W_pad] DRAM scratch (x itself when unpadded)."""
    (top, _), (left, _) = args.padding
    height = max(top + args.in_h, rows_needed(args, args.out_h))
    width = max(left + args.in_w, cols_needed(args, args.out_w))
    if top == left == 0 and (height, width) == (args.in_h, args.in_w):
        return Source(args.x, args.x_strides)
    dtype = cg.graph.tensors[node.inputs[0]].dtype
    plane = height * width
    scratch = cg.dram_scratch("padded", (args.c_in, args.batch, height, width), dtype)
    total = args.c_in * args.batch * plane
    fill_dram(cg, scratch.name, total, dtype, 0.0, plane)
    # The interior, in chunks of whole channels so that no DMA moves more than DMA_CHUNK.
    x_b, x_f, x_h, x_w = args.x_strides
    image = args.in_h * args.in_w
    per_chunk = max(1, min(args.c_in, DMA_CHUNK // (args.batch * image)))
    for c in tiles(cg, args.c_in, per_chunk, "pc"):
        cg.dma(
            cg.dram_ap(
                scratch.name,
                c.start * (args.batch * plane) + top * width + left,
                [
                    (args.batch * plane, c.size),
                    (plane, args.batch),
                    (width, args.in_h),
                    (1, args.in_w),
                ],
            ),
            cg.dram_ap(
                args.x,
                c.start * x_f,
                [(x_f, c.size), (x_b, args.batch), (x_h, args.in_h), (x_w, args.in_w)],
            ),
        )
    return Source(scratch.name, (plane, args.batch * plane, width, 1))


def largest(limit: int, fits: Callable[[int], bool]) -> int:
    """The largest v in [1, limit] with fits(v), for a monotone `fits`; 0 if none."""
    low, high = 0, limit
    while low < high:
        middle = (low + high + 1) // 2
        if fits(middle):
            low = middle
        else:
            high = middle - 1
    return low


def output_tile_2d(cg: BirCodeGen, args: ConvKernelArgs) -> tuple[int, int]:
    """(rows, cols) of an output tile: as wide as allowed, then as many rows as fit."""

    def fits(rows: int, cols: int) -> bool:
        product = rows * cols * args.taps * FP32_BYTES
        band = rows_needed(args, rows) * cols_needed(args, cols) * FP32_BYTES
        return product <= PRODUCT_BYTES and product + band + rows * cols * FP32_BYTES <= WORK_BYTES

    cols = largest(min(args.out_w, MAX_TILE_COLS), lambda c: fits(1, c))
    if not cols:
        raise cg.fail(
            f"a {args.k_h}x{args.k_w} filter (dilation {list(args.rhs_dilation)}) "
            f"does not fit the {PRODUCT_BYTES}-byte product tile for one pixel"
        )
    return largest(args.out_h, lambda r: fits(r, cols)), cols


def load_channel_constants(
    cg: BirCodeGen,
    args: ConvKernelArgs,
    c: Tile,
    taps_sb: MemoryLocation,
    bias_sb: MemoryLocation | None,
) -> None:
    """The channel tile's taps [c, kH·kW] (row-major over (i, j)) and its bias column."""
    w_o, _, w_h, w_w = args.w_strides
    cg.dma(
        cg.ap(taps_sb, [(args.k_w, args.k_h), (1, args.k_w)], partitions=c.size),
        cg.dram_ap(args.w, c.start * w_o, [(w_o, c.size), (w_h, args.k_h), (w_w, args.k_w)]),
    )
    if bias_sb is not None:
        cg.dma(
            cg.ap(bias_sb, partitions=c.size), cg.dram_ap(args.bias, c.start, [(1, c.size), (1, 1)])
        )


def trace_conv2d_depthwise(cg: BirCodeGen, node: Node) -> None:
    args = conv_kernel_args(cg, node)
    check_depthwise(cg, node, args)
    rows, cols = output_tile_2d(cg, args)
    geo = kernel_geometry(args)  # the padding is framed band by band in SBUF
    taps = args.taps
    c_tile = min(args.c_in, NUM_PARTITIONS)
    taps_sb = cg.sb_tile("taps", NUM_PARTITIONS, taps, Dtype.FP32)
    bias_sb = cg.sb_tile("bias", NUM_PARTITIONS, 1, Dtype.FP32) if args.bias else None
    # band, product and out rotate over the innermost output-tile loop with more than one
    # tile (docs/buffers.md#lowerings).
    strides = [
        copy_stride(rows_needed(args, rows) * cols_needed(args, cols), Dtype.FP32),
        copy_stride(rows * cols * taps, Dtype.FP32),
        copy_stride(rows * cols, Dtype.FP32),
    ]
    counts = [args.batch, tile_count(args.out_h, rows), tile_count(args.out_w, cols)]
    level = rotating_level(counts)
    copies = 1
    if level is not None:
        copies = buffer_count(cg, counts[level], sum(strides) * FP32_BYTES)
    buffers = [copies if i == level else 1 for i in range(3)]
    band = cg.sb_tile("band", NUM_PARTITIONS, copies * strides[0], Dtype.FP32)
    product = cg.sb_tile("product", NUM_PARTITIONS, copies * strides[1], Dtype.FP32)
    out = cg.sb_tile("out", NUM_PARTITIONS, copies * strides[2], Dtype.FP32)
    (s_h, s_w), (d_h, d_w) = args.stride, args.rhs_dilation
    x_b, x_f, x_h, x_w = args.x_strides
    y_b, y_f, y_h, y_w = args.y_strides
    sides_once = tile_count(args.out_w, cols) == 1
    if sides_once:  # one column tile: the same side columns in every band, framed once
        band_cols = cols_needed(args, cols)
        sides = clip(Affine(), band_cols, geo.pad_left, geo.in_w)
        at = (strides[0], copies)
        partitions = (0, min(args.c_in, NUM_PARTITIONS))
        frame_sides(cg, band, 0, at, partitions, rows_needed(args, rows), band_cols, sides, 0.0)

    for c in tiles(cg, args.c_in, c_tile, "c"):
        load_channel_constants(cg, args, c, taps_sb, bias_sb)
        p = c.size
        for n in tiles(cg, args.batch, 1, "n", buffers=buffers[0]):
            for row in window_tiles(cg, geo, "h", args.out_h, rows, "oh", buffers[1]):
                for col in window_tiles(cg, geo, "w", args.out_w, cols, "ow", buffers[2]):
                    slot = n.slot + row.slot + col.slot  # at most one of them rotates
                    band_at, product_at, out_at = (slot * stride for stride in strides)
                    band_rows = rows_needed(args, row.size)
                    band_cols = cols_needed(args, col.size)
                    row_clip = clip(row.start * s_h, band_rows, geo.pad_top, geo.in_h)
                    col_clip = clip(col.start * s_w, band_cols, geo.pad_left, geo.in_w)
                    lanes = (0, p)
                    frame_band(
                        cg, band, band_at, lanes, band_cols, row_clip, col_clip, 0.0, not sides_once
                    )
                    read_band(
                        cg,
                        band,
                        band_at,
                        lanes,
                        band_cols,
                        row_clip,
                        col_clip,
                        args.x,
                        n.start * x_b + c.start * x_f,
                        (x_f, p),
                        1,
                        x_h,
                        col_step=x_w,
                    )
                    window = cg.ap(
                        band,
                        [
                            (s_h * band_cols, row.size),
                            (s_w, col.size),
                            (d_h * band_cols, args.k_h),
                            (d_w, args.k_w),
                        ],
                        band_at,
                        partitions=p,
                    )
                    weights = cg.ap(
                        taps_sb,
                        [(0, row.size), (0, col.size), (args.k_w, args.k_h), (1, args.k_w)],
                        partitions=p,
                    )
                    products = cg.ap(
                        product,
                        [
                            (col.size * taps, row.size),
                            (taps, col.size),
                            (args.k_w, args.k_h),
                            (1, args.k_w),
                        ],
                        product_at,
                        partitions=p,
                    )
                    cg.tensor_tensor(products, window, weights, AluOp.MULTIPLY)
                    result = cg.ap(out, [(1, row.size * col.size)], out_at, partitions=p)
                    cg.tensor_reduce(result, products, AluOp.ADD, axes=2)
                    if bias_sb is not None:
                        cg.activation(
                            result, result, ActFunc.COPY, bias=cg.ap(bias_sb, partitions=p)
                        )
                    cg.dma(
                        cg.dram_ap(
                            args.y,
                            n.start * y_b + c.start * y_f + row.start * y_h + col.start * y_w,
                            [(y_f, p), (y_h, row.size), (y_w, col.size)],
                        ),
                        result,
                    )


def trace_conv1d_depthwise(cg: BirCodeGen, node: Node) -> None:
    args = conv_kernel_args(cg, node)
    check_depthwise(cg, node, args)
    if (args.in_h, args.k_h, args.out_h) != (1, 1, 1) or args.padding[0] != (0, 0):
        raise cg.fail(
            f"not a 1-D conv: input height {args.in_h}, kernel height {args.k_h}, "
            f"output height {args.out_h}, height padding {list(args.padding[0])}"
        )
    length = largest(
        min(args.out_w, MAX_TILE_LENGTH),
        lambda t: (cols_needed(args, t) + 3 * t) * FP32_BYTES <= WORK_BYTES,
    )
    if not length:
        raise cg.fail(
            f"a {args.k_w}-tap filter with dilation {args.rhs_dilation[1]} does not fit the "
            f"{WORK_BYTES}-byte work area for one output position"
        )
    src = framed_input(cg, node, args)
    stride, dilation, k_w = args.stride[1], args.rhs_dilation[1], args.k_w
    c_tile = min(args.c_in, NUM_PARTITIONS)
    taps_sb = cg.sb_tile("taps", NUM_PARTITIONS, k_w, Dtype.FP32)
    bias_sb = cg.sb_tile("bias", NUM_PARTITIONS, 1, Dtype.FP32) if args.bias else None
    band = cg.sb_tile("band", NUM_PARTITIONS, cols_needed(args, length), Dtype.FP32)
    acc = cg.sb_tile("acc", NUM_PARTITIONS, length, Dtype.FP32)
    temps = [cg.sb_tile(f"tap{i}", NUM_PARTITIONS, length, Dtype.FP32) for i in range(2)]
    x_b, x_f, _, x_w = src.strides
    y_b, y_f, _, y_w = args.y_strides

    for c in tiles(cg, args.c_in, c_tile, "c"):
        load_channel_constants(cg, args, c, taps_sb, bias_sb)
        p = c.size
        for n in tiles(cg, args.batch, 1, "n"):
            for pos in tiles(cg, args.out_w, length, "ol"):
                band_len = cols_needed(args, pos.size)
                cg.dma(
                    cg.ap(band, [(1, band_len)], partitions=p),
                    cg.dram_ap(
                        src.loc,
                        n.start * x_b + c.start * x_f + pos.start * (stride * x_w),
                        [(x_f, p), (x_w, band_len)],
                    ),
                )
                accumulator = cg.ap(acc, [(1, pos.size)], partitions=p)
                for k in range(k_w):
                    window = cg.ap(band, [(stride, pos.size)], k * dilation, partitions=p)
                    weight = cg.ap(taps_sb, [(1, 1)], k, partitions=p)
                    if k == 0:
                        bias = cg.ap(bias_sb, partitions=p) if bias_sb is not None else None
                        cg.tensor_scalar(
                            accumulator,
                            window,
                            AluOp.MULTIPLY,
                            weight,
                            op1=AluOp.ADD if bias is not None else None,
                            operand1=bias,
                        )
                        continue
                    temp = cg.ap(temps[k % 2], [(1, pos.size)], partitions=p)
                    cg.tensor_scalar(temp, window, AluOp.MULTIPLY, weight, engine=Engine.ACT)
                    cg.tensor_tensor(accumulator, accumulator, temp, AluOp.ADD)
                cg.dma(
                    cg.dram_ap(
                        args.y,
                        n.start * y_b + c.start * y_f + pos.start * y_w,
                        [(y_f, p), (y_w, pos.size)],
                    ),
                    accumulator,
                )
