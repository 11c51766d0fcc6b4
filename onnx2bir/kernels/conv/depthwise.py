"""The two depthwise conv kernels: conv2d_depthwise_f01b_o01i_bf01 (priority 5) on the PE array
and Conv1d_depthwise_bf01_oi01_bf01 (priority 3) on VectorE.

In (2-D): x in f01b [C, H, W, N], w in o01i [C, kH, kW, 1], optional bias [C].
In (1-D): x in bf01 [N, C, 1, L], w in oi01 [C, 1, 1, K], optional bias [C].
Out: y in bf01 [N, C, H_out, W_out] (the 1-D kernel's H_out is 1). Any stride, rhs dilation,
(low, high) padding and batch; one channel per group and C_out = C_in (the selector's rows).

Both compute, per channel c and output pixel (r, q),

    y[n, c, r, q] = b[c] + Σ_(i, j) w[c, i, j] · x_pad[n, c, r·s_h + i·d_h, q·s_w + j·d_w]

with channels on partitions (tiles of 128).

- 2-D (docs/neuroncore.md#convolution: depthwise on the PE array): tap (i, j) is a matmul
  whose stationary operand is diag(w[:, i, j]), the channel tile's identity scaled row by row
  by the tap's weights (one VectorE `TensorScalar` per tap, once per channel tile), and whose
  moving operand is the band of input rows seen through the tap's window [rows, cols] (strides
  s_h·band_cols and s_w, offset i·d_h·band_cols + j·d_w). The kH·kW matmuls of an output tile
  (at most 512 positions, one PSUM bank) accumulate y's tile in PSUM; one ScalarE activation
  adds the bias column and evicts it (applying a fused Relu, patterns/conv/epilogue.py). A
  matmul costs its moving free size whatever the channel count, so a tap costs one PE cycle
  per output position for up to 128 channels, where the vector engines took three (a multiply
  of two SBUF operands and a reduce) at less than half the clock. The PE operands are in the
  autocast dtype (`pe_operand_dtype`: the band's read and the diagonal's TensorScalar are the
  casts). A diagonal's zeros multiply the other channels' inputs, so an infinite or NaN input
  value makes the channel tile's outputs NaN. Band and out rotate over buffer copies, each
  with a PSUM bank, along the innermost output-tile loop with more than one tile
  (docs/buffers.md#lowerings), which makes that loop `parallel`.
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
The 2-D kernel's band and diagonals are in the PE operand dtype, its taps, bias and output
fp32; the 1-D kernel's compute tiles are fp32 whatever x's float dtype (the DMA converts,
docs/neuroncore.md#dma; VectorE computes in fp32 anyway, docs/neuroncore.md#engines), and only
its scratch and zero-fill tile keep x's dtype.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from onnx2bir.bir.enums import AluOp, Dtype, Engine
from onnx2bir.bir.ir import MemoryLocation
from onnx2bir.bir.opcodes import MATMUL_MAX_MOVING_FREE, NUM_PARTITIONS, PSUM_BANK_BYTES
from onnx2bir.codegen.casting import pe_operand_dtype
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
# The names the conv registry writes (docs/conv_selection.md#attributes).
CONV2D_DEPTHWISE = "conv2d_depthwise_f01b_o01i_bf01"
CONV1D_DEPTHWISE = "Conv1d_depthwise_bf01_oi01_bf01"
# The 2-D kernel's input band per partition (a quarter of a partition's 192 KiB), and a PSUM
# bank's fp32 elements (an output tile's accumulator).
BAND_BYTES = 48 * 1024
BANK_FP32 = PSUM_BANK_BYTES // FP32_BYTES
# The 1-D kernel's band and its three output-length tiles together, leaving room under the ~176
# KiB a compiler may use (docs/neuroncore.md#memory: ~16 KiB reserved) for the zero-fill tile,
# the taps and the bias.
WORK_BYTES = 128 * 1024
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


def output_tile_pe(cg: BirCodeGen, args: ConvKernelArgs, itemsize: int) -> tuple[int, int]:
    """(rows, cols) of an output tile: at most a PSUM bank of fp32 (MATMUL_MAX_MOVING_FREE
    positions, the matmul's moving free size), whole rows when they fit, its band within
    BAND_BYTES."""

    def fits(rows: int, cols: int) -> bool:
        band = rows_needed(args, rows) * cols_needed(args, cols) * itemsize
        return rows * cols <= MATMUL_MAX_MOVING_FREE and band <= BAND_BYTES

    cols = largest(min(args.out_w, MATMUL_MAX_MOVING_FREE), lambda c: fits(1, c))
    if not cols:
        raise cg.fail(
            f"a {args.k_h}x{args.k_w} filter (dilation {list(args.rhs_dilation)}) "
            f"does not fit the {BAND_BYTES}-byte band for one output pixel"
        )
    return largest(args.out_h, lambda r: fits(r, cols)), cols


def trace_conv2d_depthwise(cg: BirCodeGen, node: Node) -> None:
    args = conv_kernel_args(cg, node)
    check_depthwise(cg, node, args)
    operand = pe_operand_dtype(cg)
    rows, cols = output_tile_pe(cg, args, operand.itemsize)
    geo = kernel_geometry(args)  # the padding is framed band by band in SBUF
    taps = args.taps
    c_tile = min(args.c_in, NUM_PARTITIONS)
    taps_sb = cg.sb_tile("taps", NUM_PARTITIONS, taps, Dtype.FP32)
    bias_sb = cg.sb_tile("bias", NUM_PARTITIONS, 1, Dtype.FP32) if args.bias else None
    # diag(w[:, tap]) for every tap: the stationary operand of that tap's matmul
    diag = cg.sb_tile("diag", NUM_PARTITIONS, taps * c_tile, operand)
    # band and out rotate over the innermost output-tile loop with more than one tile, each
    # copy with a PSUM bank of its own (docs/buffers.md#lowerings).
    strides = [
        copy_stride(rows_needed(args, rows) * cols_needed(args, cols), operand),
        copy_stride(rows * cols, Dtype.FP32),
    ]
    counts = [args.batch, tile_count(args.out_h, rows), tile_count(args.out_w, cols)]
    level = rotating_level(counts)
    copies = 1
    if level is not None:
        per_copy = strides[0] * operand.itemsize + strides[1] * FP32_BYTES
        copies = buffer_count(cg, counts[level], per_copy, psum_banks=1)
    buffers = [copies if i == level else 1 for i in range(3)]
    band = cg.sb_tile("band", NUM_PARTITIONS, copies * strides[0], operand)
    out = cg.sb_tile("out", NUM_PARTITIONS, copies * strides[1], Dtype.FP32)
    acc = cg.psum_tile("acc", NUM_PARTITIONS, copies * BANK_FP32)
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
        for tap in range(taps):
            cg.tensor_scalar(
                cg.ap(diag, [(1, p)], tap * c_tile, partitions=p),
                cg.identity(p),
                AluOp.MULTIPLY,
                cg.ap(taps_sb, [(1, 1)], tap, partitions=p),
            )
        for n in tiles(cg, args.batch, 1, "n", buffers=buffers[0]):
            for row in window_tiles(cg, geo, "h", args.out_h, rows, "oh", buffers[1]):
                for col in window_tiles(cg, geo, "w", args.out_w, cols, "ow", buffers[2]):
                    slot = n.slot + row.slot + col.slot  # at most one of them rotates
                    band_at, out_at = (slot * stride for stride in strides)
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
                    size = row.size * col.size
                    total = cg.ap(acc, [(1, size)], slot * BANK_FP32, partitions=p)
                    for i in range(args.k_h):
                        for j in range(args.k_w):
                            tap = i * args.k_w + j
                            window = cg.ap(
                                band,
                                [(s_h * band_cols, row.size), (s_w, col.size)],
                                band_at + (i * d_h * band_cols + j * d_w),
                                partitions=p,
                            )
                            stationary = cg.ap(diag, [(1, p)], tap * c_tile, partitions=p)
                            cg.matmul(total, stationary, window, accumulate=tap > 0)
                    result = cg.ap(out, [(1, size)], out_at, partitions=p)
                    bias = cg.ap(bias_sb, partitions=p) if bias_sb is not None else None
                    cg.activation(result, total, args.activation, bias=bias)
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
