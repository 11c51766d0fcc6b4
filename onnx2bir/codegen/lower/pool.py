"""Generic lowering of MaxPool, AveragePool, GlobalAveragePool and GlobalMaxPool on VectorE.

Planes (N·C) sit on partitions. MaxPool reads a band of the input for each output tile, its
positions in the padding set to -inf in SBUF (docs/memory_planner.md#framed-bands), and
reduces it through a 4-D access pattern — output rows, output cols, window rows, window cols —
with one `TensorReduce(max)` over the last two dims per tile, as the NKI pooling kernels do; the
output tile shrinks until its windows fit the elements per partition VectorE takes and their
steps the ISA's stride field (docs/neuroncore.md#rules: FREE-SIZE, AP-FIELD-BITS).
AveragePool does the same with a 0 frame and an add, then divides by the number of elements
each window counts: the same for every window (an immediate), or, when padding or ceil_mode
make the edge windows count fewer, a constant divisor map [out_h, out_w] broadcast to every
partition by DMA. GlobalAveragePool / GlobalMaxPool reduce each plane along the free dim (in
chunks when the plane is larger than a tile, then reduce the partial results); the average
scales by 1 / (H·W) on ScalarE. MaxPool and AveragePool on 5-D inputs go to `lower_pool3d`
(a depth pass, then `window_pool` here).

Planes are tiled 128 at a time over all images, or image by image when the memory plan may keep
the input or output in image groups (`plane_tiles`, docs/memory_planner.md#groups).

The window pools' output-tile loops (planes, output rows, output columns) rotate band, out and
divisor tiles over buffer copies along the innermost loop with more than one tile
(docs/buffers.md#lowerings): that loop is `parallel`.
"""

from __future__ import annotations

import math
from functools import partial

import numpy as np

from onnx2bir.bir.enums import ActFunc, AluOp, Dtype, Engine, MemoryType
from onnx2bir.bir.opcodes import NUM_PARTITIONS, ap_field_overflow, free_size_limit
from onnx2bir.codegen.driver import BirCodeGen
from onnx2bir.codegen.residency import image_group
from onnx2bir.codegen.spatial import (
    Clip,
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

POOL_OUT_TILE = 1024
POOL_BAND_BYTES = 96 * 1024  # SBUF bytes per partition one input band may take
# Band copies: double buffering, not one copy per tile. A pool reads each band once, so one
# copy ahead is enough to overlap its load; four copies of a 224-wide map's band take a third
# of SBUF, room a batch split's homes and shared weights need (docs/buffers.md#lowerings).
POOL_BAND_COPIES = 2
REDUCE_CHUNK = 8192


def lower_maxpool(cg: BirCodeGen, node: Node) -> None:
    attrs = node.attrs
    if len(node.outputs) > 1 and node.outputs[1]:
        raise cg.fail("MaxPool's Indices output is not supported")
    if attrs.get("storage_order", 0):
        raise cg.fail("MaxPool storage_order=1 is not supported")
    if len(cg.graph.tensors[node.inputs[0]].shape) == 5:
        return _pool_3d(cg, node)
    geo = window_geometry(cg, node, tuple(attrs["kernel_shape"]))
    _window_pool(cg, node, geo, AluOp.MAX, float("-inf"), None)


def axis_counts(
    out: int,
    size: int,
    stride: int,
    dilation: int,
    kernel: int,
    begin: int,
    end: int,
    count_include_pad: bool,
) -> np.ndarray:
    """Taps each of the `out` windows along one axis counts: those inside the input, or with
    count_include_pad those inside the padded input."""
    low, high = (-begin, size + end) if count_include_pad else (0, size)
    taps = np.arange(out)[:, None] * stride - begin + np.arange(kernel)[None, :] * dilation
    return ((taps >= low) & (taps < high)).sum(1)


def divisor_map(
    geo: WindowGeometry, pad_bottom: int, pad_right: int, count_include_pad: bool
) -> np.ndarray:
    """Elements each AveragePool window divides by, [out_h, out_w]: the taps inside the
    input, or with count_include_pad inside the padded input (a ceil_mode window reaching past
    the end padding counts only what is inside it)."""

    counts = partial(axis_counts, count_include_pad=count_include_pad)
    rows = counts(
        geo.out_h, geo.in_h, geo.stride_h, geo.dilation_h, geo.kernel_h, geo.pad_top, pad_bottom
    )
    cols = counts(
        geo.out_w, geo.in_w, geo.stride_w, geo.dilation_w, geo.kernel_w, geo.pad_left, pad_right
    )
    return (rows[:, None] * cols[None, :]).astype(np.float32)


def lower_average_pool(cg: BirCodeGen, node: Node) -> None:
    """Window sums as MaxPool's window max, then a divide by the divisor map (an immediate
    when every window counts the same)."""
    attrs = node.attrs
    if len(cg.graph.tensors[node.inputs[0]].shape) == 5:
        return _pool_3d(cg, node)
    geo = window_geometry(cg, node, tuple(attrs["kernel_shape"]))
    # The end pads: SAME_* padding puts the rest of the total there; ceil_mode's extra reach
    # past the input is not padding.
    pad_bottom = pad_right = 0
    auto_pad = attrs.get("auto_pad", "NOTSET")
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        pad_bottom = max(0, geo.rows_needed(geo.out_h) - geo.in_h - geo.pad_top)
        pad_right = max(0, geo.cols_needed(geo.out_w) - geo.in_w - geo.pad_left)
    elif auto_pad in ("NOTSET", "") and attrs.get("pads"):
        pads = list(attrs["pads"])
        pad_bottom, pad_right = pads[2:] if len(pads) == 4 else (0, pads[1])
    divisors = divisor_map(geo, pad_bottom, pad_right, bool(attrs.get("count_include_pad", 0)))
    _window_pool(cg, node, geo, AluOp.ADD, 0.0, divisor_argument(cg, divisors))


def divisor_argument(cg: BirCodeGen, divisors: np.ndarray) -> float | str:
    """The divisor `window_pool` takes: an immediate when every window counts the same, else
    the name of a DRAM constant holding the map."""
    if np.all(divisors == divisors.flat[0]):
        return float(divisors.flat[0])
    name = f"{cg.origin.node}/divisors"
    cg.add_dram_const(name, divisors)
    return name


def _pool_3d(cg: BirCodeGen, node: Node) -> None:
    from onnx2bir.codegen.lower.pool3d import lower_pool_3d  # imports this module

    lower_pool_3d(cg, node)


def _window_pool(
    cg: BirCodeGen,
    node: Node,
    geo: WindowGeometry,
    op: AluOp,
    fill: float,
    divisor: float | str | None,
) -> None:
    x_name, out_name = node.inputs[0], node.outputs[0]
    x_shape = tuple(cg.graph.tensors[x_name].shape)
    dtype = cg.graph.tensors[x_name].dtype
    images = _images_apart(cg, x_name, out_name)
    window_pool(
        cg, x_name, out_name, x_shape[0] * x_shape[1], dtype, geo, op, fill, divisor, images
    )


def _images_apart(cg: BirCodeGen, *tensors: str) -> int:
    """The batch when the memory plan may keep one of `tensors` in image groups
    (`residency.image_group`: each image's channels from partition 0), so that the pool walks
    one image's channel planes at a time; else 1 (the planes of all images in one walk)."""
    if any(image_group(cg.graph, t) for t in tensors):
        return cg.graph.tensors[tensors[0]].shape[0]
    return 1


def plane_tiles(cg: BirCodeGen, planes: int, images: int, name: str, buffers: int = 1):
    """Tiles of up to 128 of `planes` (N·C) planes: over all of them, or with `images` > 1
    image by image, so that no tile crosses from one image's channels into the next's."""
    if images <= 1:
        yield from tiles(cg, planes, NUM_PARTITIONS, name, buffers=buffers)
        return
    per_image = planes // images
    for n in tiles(cg, images, 1, f"{name}n"):
        for c in tiles(cg, per_image, NUM_PARTITIONS, name, buffers=buffers):
            yield Tile(n.start * per_image + c.start, c.size, c.first, c.slot)


def window_pool(
    cg: BirCodeGen,
    x_name: str,
    out_name: str,
    planes: int,
    dtype: Dtype,
    geo: WindowGeometry,
    op: AluOp,
    fill: float,
    divisor: float | str | None,
    images: int = 1,
) -> None:
    """Windows of the `fill`-framed planes of `x_name` (a graph tensor or a DRAM location of
    this node) reduced with `op` (a 4-D access pattern: output rows, output cols, window rows,
    window cols), then divided by `divisor`: an immediate or a DRAM [out_h, out_w] map
    broadcast to every partition."""
    src = cg.dram(x_name).name
    plane = geo.in_h * geo.in_w
    cols = min(geo.out_w, POOL_OUT_TILE)
    rows = max(1, min(geo.out_h, POOL_OUT_TILE // cols))
    budget = min(POOL_BAND_BYTES, cg.sb_free_bytes() // 2)
    steps = band_steps(geo, dtype, budget)
    step_h, step_w = steps

    def band_bytes(rows: int, cols: int) -> int:
        return band_extent(geo, rows, cols, steps) * dtype.itemsize

    # Big windows: shrink the output tile until its input band fits the band budget, and the
    # windows one TensorReduce reads fit VectorE's free size and the ISA's stride fields.
    while (rows > 1 or cols > 1) and band_bytes(rows, cols) > budget:
        if rows > 1:
            rows = max(1, rows // 2)
        else:
            cols = max(1, cols // 2)
    if band_bytes(rows, cols) > budget:
        raise cg.fail(
            f"one {geo.kernel_h}x{geo.kernel_w} window (dilations {geo.dilation_h}x"
            f"{geo.dilation_w}, strides {geo.stride_h}x{geo.stride_w}) reads a band of "
            f"{band_bytes(1, 1)} bytes per partition, past the {budget} a band may take in "
            "SBUF (SBUF-CAPACITY)"
        )
    while (problem := _windows_problem(geo, rows, cols, steps)) is not None:
        if rows == cols == 1:
            raise cg.fail(f"one {geo.kernel_h}x{geo.kernel_w} window alone: {problem}")
        if rows > 1:
            rows = max(1, rows // 2)
        else:
            cols = max(1, cols // 2)
    # band, out and divisors rotate over the innermost tile loop with more than one tile
    # (docs/buffers.md#lowerings).
    band_stride = copy_stride(band_extent(geo, rows, cols, steps), dtype)
    out_stride = copy_stride(rows * cols, dtype)
    counts = [tile_count(planes // images, NUM_PARTITIONS), tile_count(geo.out_h, rows)]
    counts.append(tile_count(geo.out_w, cols))
    level = rotating_level(counts)
    copies = 1
    if level is not None:
        per_copy = (band_stride + out_stride * (2 if isinstance(divisor, str) else 1)) * (
            dtype.itemsize
        )
        copies = buffer_count(cg, counts[level], per_copy, limit=POOL_BAND_COPIES)
    buffers = [copies if i == level else 1 for i in range(3)]
    band = cg.sb_tile("band", NUM_PARTITIONS, copies * band_stride, dtype)
    out_sb = cg.sb_tile("out", NUM_PARTITIONS, copies * out_stride, dtype)
    if isinstance(divisor, str):
        div_sb = cg.sb_tile("divisors", NUM_PARTITIONS, copies * out_stride, dtype)
    y_loc = cg.dram(out_name).name
    out_plane = geo.out_h * geo.out_w
    # One column tile: every band has the same side columns, framed once for every copy.
    sides_once = tile_count(geo.out_w, cols) == 1
    if sides_once:
        band_cols = _decimated(geo.cols_needed(cols), step_w)
        side_clip = clip(Affine(), band_cols, geo.pad_left, geo.in_w, step_w)
        partitions = (0, min(planes, NUM_PARTITIONS))
        rows_each = _decimated(geo.rows_needed(rows), step_h)
        copies_at = (band_stride, copies)
        frame_sides(cg, band, 0, copies_at, partitions, rows_each, band_cols, side_clip, fill)
    for p in plane_tiles(cg, planes, images, "p", buffers[0]):
        for row in window_tiles(cg, geo, "h", geo.out_h, rows, "oh", buffers[1]):
            for col in window_tiles(cg, geo, "w", geo.out_w, cols, "ow", buffers[2]):
                slot = p.slot + row.slot + col.slot  # at most one of them rotates
                band_at, out_at = slot * band_stride, slot * out_stride
                band_rows = _decimated(geo.rows_needed(row.size), step_h)
                band_cols = _decimated(geo.cols_needed(col.size), step_w)
                rows_clip = clip(row.start * geo.stride_h, band_rows, geo.pad_top, geo.in_h, step_h)
                cols_clip = clip(
                    col.start * geo.stride_w, band_cols, geo.pad_left, geo.in_w, step_w
                )
                at, partitions = band_at, (0, p.size)
                frame_band(
                    cg, band, at, partitions, band_cols, rows_clip, cols_clip, fill, not sides_once
                )
                if steps == (1, 1):
                    read_band(
                        cg,
                        band,
                        at,
                        partitions,
                        band_cols,
                        rows_clip,
                        cols_clip,
                        src,
                        p.start * plane,
                        (plane, p.size),
                        1,
                        geo.in_w,
                    )
                else:
                    _read_lattice_band(
                        cg,
                        band,
                        at,
                        p.size,
                        band_cols,
                        rows_clip,
                        cols_clip,
                        src,
                        p.start * plane,
                        plane,
                        geo.in_w,
                        steps,
                    )
                pattern = _windows(geo, row.size, col.size, steps)
                windows = cg.ap(band, pattern, band_at, partitions=p.size)
                result = cg.ap(out_sb, [(1, row.size * col.size)], out_at, partitions=p.size)
                cg.tensor_reduce(result, windows, op, axes=2)
                if isinstance(divisor, float):
                    cg.tensor_scalar(result, result, AluOp.DIVIDE, divisor)
                elif isinstance(divisor, str):
                    div = cg.ap(div_sb, [(1, row.size * col.size)], out_at, partitions=p.size)
                    cg.dma(
                        div,
                        cg.dram_ap(
                            divisor,
                            row.start * geo.out_w + col.start,
                            [(0, p.size), (geo.out_w, row.size), (1, col.size)],
                        ),
                    )
                    cg.tensor_tensor(result, result, div, AluOp.DIVIDE)
                cg.dma(
                    cg.dram_ap(
                        y_loc,
                        p.start * out_plane + row.start * geo.out_w + col.start,
                        [(out_plane, p.size), (geo.out_w, row.size), (1, col.size)],
                    ),
                    result,
                )


def band_steps(geo: WindowGeometry, dtype: Dtype, budget: int) -> tuple[int, int]:
    """The input rows and columns apart that a band keeps: (1, 1), a dense band, when one
    window's dense band fits `budget` bytes per partition; else along each axis the gcd of
    stride and dilation, since every window of a tile then reads only the positions on that
    lattice (a 60x80 window dilated 10 and strided 10 reads 1 position in 100 of its 591x791
    span). Out: (step_h, step_w), each dividing that axis's stride and dilation."""
    if geo.rows_needed(1) * geo.cols_needed(1) * dtype.itemsize <= budget:
        return 1, 1

    def step(stride: int, dilation: int, kernel: int) -> int:
        return math.gcd(stride, dilation) if kernel > 1 else stride

    return (
        step(geo.stride_h, geo.dilation_h, geo.kernel_h),
        step(geo.stride_w, geo.dilation_w, geo.kernel_w),
    )


def _read_lattice_band(
    cg: BirCodeGen,
    band,
    band_at: Affine,
    partitions: int,
    band_cols: int,
    rows: Clip,
    cols: Clip,
    src: str,
    src_at: Affine,
    plane: int,
    in_w: int,
    steps: tuple[int, int],
) -> None:
    """One DMA of a band that keeps input positions `steps` apart (`band_steps`): band row i,
    column j read input row `rows.first + i·step_h`, column `cols.first + j·step_w` of the
    plane at element `src_at`, one plane per partition; the positions `clip` put in the
    padding are left to `frame_band`."""
    if not (rows.inside and cols.inside):
        return
    step_h, step_w = steps
    at = band_at + (rows.before * band_cols + cols.before)
    cg.dma(
        cg.ap(band, [(band_cols, rows.inside), (1, cols.inside)], at, partitions, 0),
        cg.dram_ap(
            src,
            src_at + rows.first * in_w + cols.first,
            [(plane, partitions), (step_h * in_w, rows.inside), (step_w, cols.inside)],
        ),
    )


def _decimated(span: int, step: int) -> int:
    """Positions of a span of input positions that lie `step` apart (both ends on the
    lattice)."""
    return (span - 1) // step + 1


def band_extent(geo: WindowGeometry, rows: int, cols: int, steps: tuple[int, int]) -> int:
    """Elements per partition of the band a rows x cols output tile reads, with `steps`
    (`band_steps`)."""
    return _decimated(geo.rows_needed(rows), steps[0]) * _decimated(geo.cols_needed(cols), steps[1])


def _windows(
    geo: WindowGeometry, rows: int, cols: int, steps: tuple[int, int] = (1, 1)
) -> list[tuple[int, int]]:
    """The band's free pattern of a rows x cols output tile's windows: output rows, output
    cols, window rows, window cols; the band keeps input positions `steps` apart."""
    step_h, step_w = steps
    band_cols = _decimated(geo.cols_needed(cols), step_w)
    return [
        (geo.stride_h // step_h * band_cols, rows),
        (geo.stride_w // step_w, cols),
        (geo.dilation_h // step_h * band_cols, geo.kernel_h),
        (geo.dilation_w // step_w, geo.kernel_w),
    ]


def _windows_problem(
    geo: WindowGeometry, rows: int, cols: int, steps: tuple[int, int] = (1, 1)
) -> str | None:
    """Why one TensorReduce cannot read a rows x cols tile's windows (docs/neuroncore.md#rules:
    FREE-SIZE, AP-FIELD-BITS), or None."""
    pattern = tuple(_windows(geo, rows, cols, steps))
    limit = free_size_limit(Engine.DVE, MemoryType.SB)
    size = math.prod(count for _, count in pattern)
    if size > limit:
        return f"{size} elements per partition, VectorE takes {limit} (FREE-SIZE)"
    overflow = ap_field_overflow(pattern)
    return None if overflow is None else f"{overflow} (AP-FIELD-BITS)"


def lower_global_pool(cg: BirCodeGen, node: Node) -> None:
    op = AluOp.MAX if node.op_type == "GlobalMaxPool" else AluOp.ADD
    x_name, out_name = node.inputs[0], node.outputs[0]
    x_shape = tuple(cg.graph.tensors[x_name].shape)
    planes, size = x_shape[0] * x_shape[1], math.prod(x_shape[2:])
    dtype = cg.graph.tensors[x_name].dtype
    x_loc, y_loc = cg.dram(x_name).name, cg.dram(out_name).name
    chunk = min(size, REDUCE_CHUNK)
    chunks = -(-size // chunk)
    data = cg.sb_tile("data", NUM_PARTITIONS, chunk, dtype)
    partial = cg.sb_tile("partial", NUM_PARTITIONS, chunks, dtype)
    total = cg.sb_tile("sum", NUM_PARTITIONS, 1, dtype)
    for p in plane_tiles(cg, planes, _images_apart(cg, x_name, out_name), "p"):
        for piece in tiles(cg, size, chunk, "hw"):
            cg.dma(
                cg.ap(data, [(1, piece.size)], partitions=p.size),
                cg.dram_ap(x_loc, p.start * size + piece.start, [(size, p.size), (1, piece.size)]),
            )
            cg.tensor_reduce(
                cg.ap(partial, [(1, 1)], tile_index(piece, chunk), partitions=p.size),
                cg.ap(data, [(1, piece.size)], partitions=p.size),
                op,
                1,
            )
        cg.tensor_reduce(cg.ap(total, partitions=p.size), cg.ap(partial, partitions=p.size), op, 1)
        if op is AluOp.ADD:
            cg.activation(
                cg.ap(total, partitions=p.size),
                cg.ap(total, partitions=p.size),
                ActFunc.COPY,
                scale=1.0 / size,
            )
        cg.dma(cg.dram_ap(y_loc, p.start, [(1, p.size), (1, 1)]), cg.ap(total, partitions=p.size))
