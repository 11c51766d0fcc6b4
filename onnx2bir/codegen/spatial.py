"""Window geometry shared by convolution and pooling lowerings.

`window_geometry` reads an ONNX Conv/Pool node's kernel, strides, dilations and padding
(explicit `pads` or `auto_pad`) for 1-D and 2-D windows; a 1-D window is treated as 2-D with
a unit height.

Padding is framed in SBUF (docs/memory_planner.md#framed-bands): `window_tiles` runs in a
loop only the output tiles whose windows lie inside the input and emits the few that reach
into the padding on their own; `clip` says which of a band's rows and columns fall in the
padding, `frame_band` (and once for every band copy, `frame_sides`) sets those to the pad value
(0 for convolution, -inf for max pooling), and `read_band` reads the rest straight from the
input. No padded copy of the input is made: it would cost a copy of the whole input, and a
second home of its size to stay on chip. The window pools, the generic conv, the rep_nhwc
kernel and the 2-D depthwise kernel read their bands this way; the column-packing and 1-D
depthwise kernels keep padded scratch copies of their own (`fill_dram`).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

from onnx2bir.bir.enums import Dtype
from onnx2bir.bir.ir import AccessPattern, MemoryLocation
from onnx2bir.bir.opcodes import NUM_PARTITIONS
from onnx2bir.codegen.driver import BirCodeGen
from onnx2bir.codegen.lower.elementwise import fill_exact
from onnx2bir.codegen.tiling import Affine, Tile, tiles

FILL_TILE = 2048


@dataclass(frozen=True)
class WindowGeometry:
    in_h: int
    in_w: int
    out_h: int
    out_w: int
    kernel_h: int
    kernel_w: int
    stride_h: int
    stride_w: int
    dilation_h: int
    dilation_w: int
    pad_top: int
    pad_left: int

    @property
    def taps(self) -> int:
        return self.kernel_h * self.kernel_w

    def rows_needed(self, out_rows: int) -> int:
        return (out_rows - 1) * self.stride_h + (self.kernel_h - 1) * self.dilation_h + 1

    def cols_needed(self, out_cols: int) -> int:
        return (out_cols - 1) * self.stride_w + (self.kernel_w - 1) * self.dilation_w + 1


def window_geometry(cg: BirCodeGen, node: dict, kernel: tuple[int, ...]) -> WindowGeometry:
    attrs = node["attrs"]
    in_shape = tuple(cg.graph.tensors[node["inputs"][0]].shape)
    out_shape = tuple(cg.graph.tensors[node["outputs"][0]].shape)
    rank = len(in_shape) - 2
    if rank not in (1, 2):
        raise cg.fail(f"{rank}-D windows are not supported (1-D and 2-D are)")
    strides = list(attrs.get("strides") or [1] * rank)
    dilations = list(attrs.get("dilations") or [1] * rank)
    in_sp, out_sp = list(in_shape[2:]), list(out_shape[2:])
    auto_pad = attrs.get("auto_pad", "NOTSET")
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        begins = []
        for i in range(rank):
            total = max(
                0, (out_sp[i] - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1 - in_sp[i]
            )
            begins.append(total // 2 if auto_pad == "SAME_UPPER" else total - total // 2)
    elif auto_pad == "VALID":
        begins = [0] * rank
    else:
        begins = list((attrs.get("pads") or [0] * (2 * rank))[:rank])
    kernel = list(kernel)
    if rank == 1:
        for values, unit in (
            (in_sp, 1),
            (out_sp, 1),
            (kernel, 1),
            (strides, 1),
            (dilations, 1),
            (begins, 0),
        ):
            values.insert(0, unit)
    return WindowGeometry(
        in_sp[0],
        in_sp[1],
        out_sp[0],
        out_sp[1],
        kernel[0],
        kernel[1],
        strides[0],
        strides[1],
        dilations[0],
        dilations[1],
        begins[0],
        begins[1],
    )


def fill_dram(
    cg: BirCodeGen,
    loc: str,
    total: int,
    dtype: Dtype,
    fill: float | AccessPattern,
    row: int | None = None,
) -> None:
    """Write `fill` to elements [0, total) of DRAM location `loc`, from one SBUF tile.

    `fill` is a constant (Memset) or a one-element DRAM access pattern whose value a
    broadcasting DMA (stride 0 on both dims) spreads over the tile. With `row` (dividing
    `total`), the stores walk rows of that many elements, 128 rows at a time, so a tensor the
    memory planner keeps on chip in rows of that length is filled in its own layout
    (docs/memory_planner.md#layout).
    """
    fill_tile = cg.sb_tile("fill", NUM_PARTITIONS, FILL_TILE, dtype)
    if isinstance(fill, AccessPattern):
        cg.dma(
            cg.ap(fill_tile),
            cg.dram_ap(fill.loc, Affine(fill.offset), [(0, NUM_PARTITIONS), (0, FILL_TILE)]),
        )
    else:
        exact = not dtype.is_float and math.isfinite(fill) and fill == int(fill)
        fill_exact(cg, cg.ap(fill_tile), fill, exact)
    if row and total % row == 0 and row > 1:
        for rows in tiles(cg, total // row, NUM_PARTITIONS, "fill"):
            for col in tiles(cg, row, FILL_TILE, "fillc"):
                start = rows.start * row + col.start
                cg.dma(
                    cg.dram_ap(loc, start, [(row, rows.size), (1, col.size)]),
                    cg.ap(fill_tile, [(1, col.size)], partitions=rows.size),
                )
        return
    rows = total // FILL_TILE
    for row_tile in tiles(cg, rows, NUM_PARTITIONS, "fill"):
        cg.dma(
            cg.dram_ap(
                loc, row_tile.start * FILL_TILE, [(FILL_TILE, row_tile.size), (1, FILL_TILE)]
            ),
            cg.ap(fill_tile, partitions=row_tile.size),
        )
    if total % FILL_TILE:
        rest = total % FILL_TILE
        cg.dma(
            cg.dram_ap(loc, Affine(rows * FILL_TILE), [(1, 1), (1, rest)]),
            cg.ap(fill_tile, [(1, rest)], partitions=1),
        )


@dataclass(frozen=True)
class Clip:
    """How a band's positions along one axis (its rows, or its columns) fall against the
    input: the first `before` lie in the padding ahead of it, the next `inside` read it from
    input index `first` on, the last `after` lie past its end."""

    before: int
    inside: int
    after: int
    first: Affine


def clip(start: Affine, count: int, pad: int, size: int, step: int = 1) -> Clip:
    """Band positions `start + i·step` (i < count) of the padded axis (the input of `size`
    behind `pad` positions of padding). A loop-dependent `start` belongs to a tile that
    `window_tiles` ran in its loop, whose positions all lie inside the input."""
    low = start + (-pad)  # input index of the first position
    if not low.is_const:
        return Clip(0, count, 0, low)
    first = low.const
    before = min(count, max(0, -(first // step)))  # positions with first + i·step < 0
    reach = max(before, -((first - size) // step))  # the first position at or past the end
    after = max(0, count - reach)
    inside = count - before - after
    return Clip(before, inside, after, Affine(first + before * step))


def window_tiles(
    cg: BirCodeGen, geo: WindowGeometry, axis: str, extent: int, size: int, name: str, buffers: int
) -> Iterator[Tile]:
    """`tiles(cg, extent, size, name, buffers=buffers)` over output rows (`axis` "h") or
    columns ("w"), except that only the whole tiles whose windows lie inside the input run in
    the loop; the tiles whose windows reach into the padding (a few at each end) come on their
    own, with constant starts, so that `clip` can frame their bands. Buffer copies rotate as
    with `tiles`: the tile just before the loop takes copy k - 1, the loop's first copy 0."""
    stride, pad, in_size = (
        (geo.stride_h, geo.pad_top, geo.in_h)
        if axis == "h"
        else (geo.stride_w, geo.pad_left, geo.in_w)
    )
    reach = geo.rows_needed if axis == "h" else geo.cols_needed
    full, rest = divmod(extent, size)
    inside = [
        t
        for t in range(full)
        if t * size * stride >= pad and t * size * stride + reach(size) <= pad + in_size
    ]
    loop_from, loop_to = (inside[0], inside[-1] + 1) if inside else (full, full)
    copies = max(1, buffers)

    def alone(index: int, count: int, slot: int) -> Tile:
        return Tile(Affine(index * size), count, index == 0, Affine(slot % copies))

    for index in range(loop_from):
        yield alone(index, size, index - loop_from)
    for tile in tiles(cg, (loop_to - loop_from) * size, size, name, buffers=buffers):
        yield Tile(
            tile.start + loop_from * size,
            tile.size,
            tile.start == Affine() and not loop_from,
            tile.slot,
        )
    trips = loop_to - loop_from
    for index in range(loop_to, full):
        yield alone(index, size, trips + index - loop_to)
    if rest:
        yield alone(full, rest, trips + full - loop_to)


def frame_band(
    cg: BirCodeGen,
    band: MemoryLocation,
    band_at: Affine,
    partitions: tuple[int, int],
    band_cols: int,
    rows: Clip,
    cols: Clip,
    fill: float,
    sides: bool = True,
    copies: tuple[int, int] | None = None,
) -> None:
    """Set the positions of one band that `clip` put in the padding to `fill`: a memset each
    strip (the rows above and below, the columns left and right of the rest; the side columns
    only with `sides`, see `frame_sides`). The band is a dense [rows, band_cols] block at
    `band_at` of tile `band` on `partitions` (start, count); a compute engine's partition range
    must start at 0, 32, 64 or 96 (PARTITION-START), so a caller whose bands sit at other
    partitions frames their union and lets each band's read overwrite what it covers. With
    `copies` (stride, count), as many bands `stride` elements apart, framed alike."""
    start, count = partitions
    height = rows.before + rows.inside + rows.after
    exact = not band.dtype.is_float and math.isfinite(fill) and fill == int(fill)
    strips = [
        (0, rows.before, 0, band_cols),
        (height - rows.after, rows.after, 0, band_cols),
    ]
    if sides:
        strips.append((rows.before, rows.inside, 0, cols.before))
        strips.append((rows.before, rows.inside, cols.before + cols.inside, cols.after))
    for row, nrows, col, ncols in strips:
        if nrows and ncols:
            at = band_at + (row * band_cols + col)
            pattern = [*([copies] if copies else []), (band_cols, nrows), (1, ncols)]
            fill_exact(cg, cg.ap(band, pattern, at, count, start), fill, exact)


def frame_sides(
    cg: BirCodeGen,
    band: MemoryLocation,
    band_at: int,
    copies: tuple[int, int],
    partitions: tuple[int, int],
    rows: int,
    band_cols: int,
    cols: Clip,
    fill: float,
) -> None:
    """Set the side columns of every copy of a band to `fill` once, ahead of the tile loops:
    `copies` (stride, count) from element `band_at`, `rows` rows of `band_cols` each. Valid
    when every output tile has the same columns (one column tile), so that every tile's band
    has the same side strips and no read writes them; `frame_band(sides=False)` then leaves
    them alone, which takes two memsets out of every tile (ResNet's 3 x 3 convs and max pool:
    one column tile each)."""
    start, count = partitions
    exact = not band.dtype.is_float and math.isfinite(fill) and fill == int(fill)
    for col, ncols in ((0, cols.before), (cols.before + cols.inside, cols.after)):
        if ncols:
            pattern = [copies, (band_cols, rows), (1, ncols)]
            ap = cg.ap(band, pattern, band_at + col, count, start)
            fill_exact(cg, ap, fill, exact)


def read_band(
    cg: BirCodeGen,
    band: MemoryLocation,
    band_at: Affine,
    partitions: tuple[int, int],
    band_cols: int,
    rows: Clip,
    cols: Clip,
    src: str,
    src_at: Affine,
    src_partitions: tuple[int, int],
    row_step: int,
    in_w: int,
    copies: tuple[int, int, int] | None = None,
    col_step: int = 1,
) -> None:
    """One DMA of the positions of a band (as in `frame_band`) that `clip` put inside the
    input `src`, planes of rows `in_w` elements apart (columns `col_step` apart): band row i
    reads input row `rows.first + i·row_step` and band column j input column `cols.first + j`
    of the plane at element `src_at`; `src_partitions` is the (stride, count) that steps the
    source from one partition's plane to the next. With `copies` (band stride, source stride,
    count), as many bands in one DMA."""
    if not (rows.inside and cols.inside):
        return
    start, count = partitions
    at = band_at + (rows.before * band_cols + cols.before)
    band_dim = [(copies[0], copies[2])] if copies else []
    src_dim = [(copies[1], copies[2])] if copies else []
    cg.dma(
        cg.ap(band, [*band_dim, (band_cols, rows.inside), (1, cols.inside)], at, count, start),
        cg.dram_ap(
            src,
            src_at + rows.first * in_w + cols.first * col_step,
            [src_partitions, *src_dim, (row_step * in_w, rows.inside), (col_step, cols.inside)],
        ),
    )
