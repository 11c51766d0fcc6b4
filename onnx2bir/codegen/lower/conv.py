"""Generic lowering of Conv (1-D and 2-D, any stride, padding, dilation, group, bias; 3-D in
`lower_conv3d`, which folds the depth taps into channels and comes back here).

Shifted-window matmuls accumulating in PSUM (implicit GEMM, no im2col): for each output tile
of `rows x cols` pixels (≤ 512, one PSUM bank) and each filter tap (i, j),

    psum[C_out, pixels] += W[i, j][C_in, C_out]ᵀ · X_band[C_in, shifted window of (i, j)]

The input channels sit on partitions as the contraction dim, a band of input rows in the free
dims; the moving operand is the band seen through a strided access pattern, so no data is
copied per tap. Weights are the stationary operand, laid out [C_in, tap, C_out] in SBUF.

Groups: when a group's channels are few, up to 128 / C_in_per_group groups share one matmul
through a block-diagonal stationary operand (zeros between the groups' blocks), so a
depthwise conv costs taps x ceil(C / 128) matmuls per output tile instead of taps x C. A group
wider than 128 channels is tiled over C_in (accumulating) and C_out.

The bias rides on the PSUM eviction: ScalarE computes `func(psum + bias[C_out, 1])`, func a
copy, or the Relu that FuseConvActivation folded into the conv (`fused_activation`,
docs/conv_selection.md#fused-activations).

A dense conv whose weights fit `conv_stationary.RESIDENT_WEIGHT_BYTES` takes the
weight-stationary order of `conv_stationary.py` (weights loaded once, each band once for every
output block); the rest of this module is the block-by-block order, one output block's weights
at a time (docs/conv_selection.md#generic-conv).

The output-tile loop is multi-buffered (docs/buffers.md#lowerings): band, out and acc have
one copy per output tile (or two, rotated), so the load of one tile overlaps the matmuls of
the previous one and the loop is `parallel`; the input-channel loop inside accumulates into
one PSUM tile and stays sequential.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from onnx2bir.bir.enums import ActFunc, Dtype
from onnx2bir.bir.ir import MemoryLocation
from onnx2bir.bir.opcodes import MATMUL_MAX_MOVING_FREE, NUM_PARTITIONS
from onnx2bir.codegen.casting import pe_operand_dtype
from onnx2bir.codegen.driver import BirCodeGen
from onnx2bir.codegen.lower.conv_stationary import emit_stationary_conv, stationary_fits
from onnx2bir.codegen.spatial import (
    WindowGeometry,
    clip,
    frame_band,
    frame_sides,
    read_band,
    window_geometry,
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


@dataclass(frozen=True)
class ConvInput:
    """The input in DRAM: channel planes [batch, channels, height, width]. Either already
    padded (a scratch copy: pads 0), or the input itself, the window's padding before it
    (`pad_top`, `pad_left`) framed band by band in SBUF (docs/memory_planner.md#framed-bands)."""

    loc: str
    batch: int
    channels: int
    height: int
    width: int
    pad_top: int = 0
    pad_left: int = 0

    @property
    def plane(self) -> int:
        return self.height * self.width

    def band_geometry(self, geo: WindowGeometry) -> WindowGeometry:
        """`geo` against this source: its rows and columns, and the padding it lacks."""
        return replace(
            geo, in_h=self.height, in_w=self.width, pad_top=self.pad_top, pad_left=self.pad_left
        )


@dataclass(frozen=True)
class ConvWeights:
    """OIHW weights [c_out, c_in_group, kernel_h, kernel_w] in DRAM, groups, optional bias."""

    loc: str
    c_out: int
    c_in_group: int
    groups: int
    bias: str | None
    activation: ActFunc = ActFunc.COPY  # applied on the eviction (FuseConvActivation)

    @property
    def c_out_group(self) -> int:
        return self.c_out // self.groups


@dataclass(frozen=True)
class _Plan:
    """Everything the output-tile loop reads: geometry, operands, tile sizes and SBUF tiles."""

    geo: WindowGeometry
    source: ConvInput
    weights: ConvWeights
    y_loc: str
    rows: int
    cols: int
    x_sb: MemoryLocation  # `buffers` copies of x_sb, out_sb and acc
    w_sb: MemoryLocation
    bias_sb: MemoryLocation
    out_sb: MemoryLocation
    acc: MemoryLocation
    buffers: tuple[int, int]  # copies rotated by the oh and ow loops (at most one is > 1)
    band_stride: int  # elements between two copies of x_sb
    sides: bool  # each band frames its side columns (else framed once, `frame_sides`)


# The attribute of a conv node (a generic Conv's, or in a NativeKernel's JSON attrs) naming the
# ScalarE function its PSUM eviction applies: a Relu FuseConvActivation folded into the conv.
FUSED_ACTIVATION = "fused_activation"


def fused_activation(node: Node) -> ActFunc:
    """The function the conv applies on its eviction: a Relu fused into it, else a copy."""
    return ActFunc(node.attr(FUSED_ACTIVATION, ActFunc.COPY.value))


def lower_conv(cg: BirCodeGen, node: Node) -> None:
    x_name, w_name = node.inputs[:2]
    b_name = node.inputs[2] if len(node.inputs) > 2 else ""
    w_shape = tuple(cg.graph.tensors[w_name].shape)
    x_shape = tuple(cg.graph.tensors[x_name].shape)
    if len(x_shape) == 5:  # 3-D: the depth taps become channels of a 2-D conv
        from onnx2bir.codegen.lower.conv3d import lower_conv3d

        lower_conv3d(cg, node)
        return
    geo = window_geometry(cg, node, w_shape[2:])
    batch, channels = x_shape[:2]
    dtype = cg.graph.tensors[x_name].dtype
    if dtype is not Dtype.FP32:
        raise cg.fail(f"the generic conv computes in fp32; input is {dtype}")
    weights = ConvWeights(
        cg.dram(w_name).name,
        w_shape[0],
        w_shape[1],
        int(node.attr("group", 1)),
        cg.dram(b_name).name if b_name else None,
        fused_activation(node),
    )
    emit_conv(
        cg,
        geo,
        ConvInput(
            cg.dram(x_name).name, batch, channels, geo.in_h, geo.in_w, geo.pad_top, geo.pad_left
        ),
        weights,
        cg.dram(node.outputs[0]).name,
    )


def emit_conv(
    cg: BirCodeGen, geo: WindowGeometry, source: ConvInput, weights: ConvWeights, y_loc: str
) -> None:
    """Conv of `source` by `weights` into `y_loc`; `geo` gives the window (its pads are in
    `source` when it is a padded copy, else framed in each band)."""
    c_in_group, c_out_group, groups = weights.c_in_group, weights.c_out_group, weights.groups
    taps = geo.taps
    if stationary_fits(cg, c_in_group, taps, weights.c_out, groups):
        emit_stationary_conv(cg, geo, source, weights, y_loc)
        return

    # Groups per matmul (block-diagonal stationary) or, for wide groups, one group tiled.
    if c_in_group <= NUM_PARTITIONS and c_out_group <= NUM_PARTITIONS:
        per_tile = min(groups, NUM_PARTITIONS // c_in_group, NUM_PARTITIONS // c_out_group)
    else:
        per_tile = 1
    k_extent = per_tile * c_in_group if per_tile > 1 else c_in_group
    m_extent = per_tile * c_out_group if per_tile > 1 else c_out_group
    k_tiles = -(-k_extent // NUM_PARTITIONS)
    m_tile_size = min(m_extent, NUM_PARTITIONS)
    cols = min(geo.out_w, MATMUL_MAX_MOVING_FREE)
    rows = max(1, min(geo.out_h, MATMUL_MAX_MOVING_FREE // cols))
    operand = pe_operand_dtype(cg)  # the band and weight DMAs cast under the autocast
    w_sb = cg.sb_tile("weights", NUM_PARTITIONS, k_tiles * taps * m_tile_size, operand)
    bias_sb = cg.sb_tile("bias", NUM_PARTITIONS, 1, Dtype.FP32)
    band_stride = copy_stride(geo.rows_needed(rows) * geo.cols_needed(cols), operand)
    counts = [tile_count(geo.out_h, rows), tile_count(geo.out_w, cols)]
    level = rotating_level(counts)
    copies = 1
    if level is not None:
        copy_bytes = band_stride * operand.itemsize + MATMUL_MAX_MOVING_FREE * 4
        copies = buffer_count(cg, counts[level], copy_bytes, psum_banks=1)
    plan = _Plan(
        geo,
        source,
        weights,
        y_loc,
        rows,
        cols,
        x_sb=cg.sb_tile("band", NUM_PARTITIONS, copies * band_stride, operand),
        w_sb=w_sb,
        bias_sb=bias_sb,
        out_sb=cg.sb_tile("out", NUM_PARTITIONS, copies * MATMUL_MAX_MOVING_FREE, Dtype.FP32),
        acc=cg.psum_tile("acc", NUM_PARTITIONS, copies * MATMUL_MAX_MOVING_FREE),
        buffers=tuple(copies if i == level else 1 for i in range(2)),
        band_stride=band_stride,
        sides=counts[1] > 1,
    )
    if counts[1] == 1:  # one column tile: the same side columns in every band
        _frame_sides_once(cg, geo, source, plan.x_sb, band_stride, copies, rows, cols)
    w_sb, w_loc = plan.w_sb, weights.loc
    weight_row = c_in_group * taps  # elements of W per output channel

    for n in tiles(cg, source.batch, 1, "n"):
        for g in tiles(cg, groups, per_tile, "g"):
            for m in tiles(cg, m_extent if per_tile > 1 else c_out_group, m_tile_size, "m"):
                # Output channel of the tile's first row, and the tile's input channel base.
                m_size = g.size * c_out_group if per_tile > 1 else m.size
                first_out = g.start * c_out_group + m.start
                first_in = g.start * c_in_group
                if per_tile > 1:
                    cg.memset(cg.ap(w_sb), 0.0)
                    for member in range(g.size):
                        cg.dma(
                            cg.ap(
                                w_sb,
                                [(m_size, taps), (1, c_out_group)],
                                member * c_out_group,
                                partitions=c_in_group,
                                partition_start=member * c_in_group,
                            ),
                            cg.dram_ap(
                                w_loc,
                                (first_out + member * c_out_group) * weight_row,
                                [(taps, c_in_group), (1, taps), (weight_row, c_out_group)],
                            ),
                        )
                else:
                    for k in tiles(cg, c_in_group, NUM_PARTITIONS, "kw"):
                        cg.dma(
                            cg.ap(
                                w_sb,
                                [(m_size, taps), (1, m_size)],
                                tile_index(k, NUM_PARTITIONS) * (taps * m_size),
                                partitions=k.size,
                            ),
                            cg.dram_ap(
                                w_loc,
                                first_out * weight_row + k.start * taps,
                                [(taps, k.size), (1, taps), (weight_row, m_size)],
                            ),
                        )
                if weights.bias:
                    cg.dma(
                        cg.ap(plan.bias_sb, partitions=m_size),
                        cg.dram_ap(weights.bias, first_out, [(1, m_size), (1, 1)]),
                    )
                k_size = k_extent if per_tile == 1 else g.size * c_in_group
                _emit_output_tiles(cg, plan, n, first_in, first_out, m_size, k_size)


def _frame_sides_once(
    cg: BirCodeGen,
    geo: WindowGeometry,
    source: ConvInput,
    band: MemoryLocation,
    band_stride: int,
    copies: int,
    rows: int,
    cols: int,
) -> None:
    """The side columns of every copy of the band, framed before the tile loops (one column
    tile: every band has the same ones, docs/memory_planner.md#framed-bands)."""
    framing = source.band_geometry(geo)
    band_cols = geo.cols_needed(cols)
    sides = clip(Affine(), band_cols, framing.pad_left, framing.in_w)
    at = (band_stride, copies)
    frame_sides(cg, band, 0, at, (0, NUM_PARTITIONS), geo.rows_needed(rows), band_cols, sides, 0.0)


def _emit_output_tiles(
    cg: BirCodeGen,
    plan: _Plan,
    n: Tile,
    first_in: Affine,
    first_out: Affine,
    m_size: int,
    k_extent: int,
) -> None:
    """For each output tile: accumulate every tap and input-channel tile in PSUM, evict with
    the bias, store."""
    geo, source = plan.geo, plan.source
    taps, plane = geo.taps, source.plane
    framing = source.band_geometry(geo)
    out_plane = geo.out_h * geo.out_w
    b_oh, b_ow = plan.buffers
    for row in window_tiles(cg, framing, "h", geo.out_h, plan.rows, "oh", b_oh):
        for col in window_tiles(cg, framing, "w", geo.out_w, plan.cols, "ow", b_ow):
            slot = row.slot + col.slot  # at most one of them rotates
            band_at = slot * plan.band_stride
            out_at = slot * MATMUL_MAX_MOVING_FREE
            band_rows = geo.rows_needed(row.size)
            band_cols = geo.cols_needed(col.size)
            pixels = row.size * col.size
            psum = cg.ap(plan.acc, [(1, pixels)], out_at, partitions=m_size)
            rows = clip(row.start * geo.stride_h, band_rows, framing.pad_top, framing.in_h)
            cols = clip(col.start * geo.stride_w, band_cols, framing.pad_left, framing.in_w)
            for k in tiles(cg, k_extent, NUM_PARTITIONS, "kc", peel_first=True):
                first_channel = n.start * source.channels + first_in + k.start
                partitions = (0, k.size)
                x_sb = plan.x_sb
                frame_band(cg, x_sb, band_at, partitions, band_cols, rows, cols, 0.0, plan.sides)
                read_band(
                    cg,
                    x_sb,
                    band_at,
                    partitions,
                    band_cols,
                    rows,
                    cols,
                    source.loc,
                    first_channel * plane,
                    (plane, k.size),
                    1,
                    source.width,
                )
                k_index = tile_index(k, NUM_PARTITIONS)
                for tap in range(taps):
                    i, j = divmod(tap, geo.kernel_w)
                    moving = cg.ap(
                        plan.x_sb,
                        [(geo.stride_h * band_cols, row.size), (geo.stride_w, col.size)],
                        band_at + i * geo.dilation_h * band_cols + j * geo.dilation_w,
                        partitions=k.size,
                    )
                    stationary = cg.ap(
                        plan.w_sb,
                        [(1, m_size)],
                        k_index * (taps * m_size) + tap * m_size,
                        partitions=k.size,
                    )
                    cg.matmul(psum, stationary, moving, accumulate=not (k.first and tap == 0))
            result = cg.ap(plan.out_sb, [(1, pixels)], out_at, partitions=m_size)
            bias = cg.ap(plan.bias_sb, partitions=m_size) if plan.weights.bias else None
            cg.activation(result, psum, plan.weights.activation, bias=bias)
            cg.dma(
                cg.dram_ap(
                    plan.y_loc,
                    (n.start * plan.weights.c_out + first_out) * out_plane
                    + row.start * geo.out_w
                    + col.start,
                    [(out_plane, m_size), (geo.out_w, row.size), (1, col.size)],
                ),
                result,
            )
