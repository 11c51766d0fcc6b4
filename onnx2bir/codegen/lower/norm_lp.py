"""Lp norms and one-hot maxima: LpNormalization, LpPool, Hardmax, EyeLike.

Registered through `LOWERINGS`, which `onnx2bir.codegen.lower.GENERIC_LOWERINGS` merges.

- LpNormalization (p = 1 or 2, any axis): the input viewed as [outer, length, inner] with the
  norm over `length`. Rows go on partitions: the outer rows when inner = 1; when inner is at
  most 64, whole outer blocks of `inner` rows each (128 // inner blocks a tile); else the inner
  positions of one outer block at a time. A row is read with stride `inner`. Per row tile,
  ScalarE maps x to |x| or x², VectorE sums along the free dim into a [P, 1] column, takes
  √ (VectorE pow, `act_range.square_root`), floors it at the smallest fp32 subnormal (a zero
  row has a zero norm: 0 / tiny = 0, as onnxruntime leaves it) and divides the row by the
  column. Rows longer than NORM_CHUNK take two passes: the partial sums of every chunk, then
  each chunk again divided.
- LpPool (1-D, 2-D and 3-D windows, kernel_shape, strides, pads, auto_pad, dilations,
  ceil_mode): (Σ |x|^p)^(1/p) over each window. One pass maps |x|^p into DRAM scratch
  (ScalarE abs / square, VectorE pow), the window sums are AveragePool's sums without its
  divisor (`pool.window_pool` over a 0-framed band; 3-D inputs first through the depth pass
  of `pool3d`), and a last pass takes the 1/p-th power of the output in place. Padding and
  the ceil_mode reach add zeros, which is what onnxruntime's sum skips.
- Hardmax: the first maximum of each row set to 1, every other element 0 (onnxruntime's
  ties). Opset < 13 flattens the input to 2-D at `axis` (default 1), opset ≥ 13 takes `axis`
  alone (default −1); rows as for LpNormalization. ArgMax's trick (`arg.py`): with
  ids = position − L from Iota, VectorE takes the row max, marks the positions equal to it,
  multiplies the marks by ids and takes the min: first − L, or 0 when nothing is marked
  (a NaN row). The output is then one TensorScalar, (ids − that) == 0.
- EyeLike: rows on partitions, columns on the free dim, as Trilu's mask (`index.py`): an Iota
  of column numbers minus the row number (a per-partition column) compared with k, stored by
  DMA in the output dtype (the `dtype` attribute or the input's).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

from onnx2bir.bir.enums import ActFunc, AluOp, Dtype
from onnx2bir.bir.ir import AccessPattern
from onnx2bir.bir.opcodes import NUM_PARTITIONS
from onnx2bir.codegen.act_range import square_root
from onnx2bir.codegen.driver import BirCodeGen
from onnx2bir.codegen.lower.arg import MAX_LENGTH
from onnx2bir.codegen.lower.elementwise import iota
from onnx2bir.codegen.lower.pool import window_pool
from onnx2bir.codegen.lower.pool3d import _depth_pass, axis_windows
from onnx2bir.codegen.spatial import WindowGeometry, window_geometry
from onnx2bir.codegen.tiling import Affine, tile_index, tiles
from onnx2bir.graph import Node

NORM_CHUNK = 8192  # elements of a row one pass holds
MAP_TILE = 2048  # free elements of a tile of the flat |x|^p and x^(1/p) passes
EYE_TILE = 2048
TINY = 2.0**-149  # the smallest fp32 subnormal: below every nonzero norm

RowTile = tuple[int, Affine, list[tuple[int, int]]]


def _split(shape: tuple[int, ...], axis: int, flatten: bool) -> tuple[int, int, int]:
    """[outer, length, inner] of `shape` around `axis` (flattened: everything from `axis` on
    is the length)."""
    if not shape:
        return 1, 1, 1
    outer = math.prod(shape[:axis])
    if flatten:
        return outer, math.prod(shape[axis:]), 1
    return outer, shape[axis], math.prod(shape[axis + 1 :])


def _row_tiles(cg: BirCodeGen, outer: int, length: int, inner: int) -> Iterator[RowTile]:
    """Tiles of rows (one row per partition) of an [outer, length, inner] view: (partitions,
    DRAM offset of the tile's first element, the DRAM pattern of its partitions). The row's
    own dim is (inner, length) after that pattern."""
    p = NUM_PARTITIONS
    if inner == 1:
        for r in tiles(cg, outer, p, "r"):
            yield r.size, r.start * length, [(length, r.size)]
    elif inner <= p // 2:
        group = p // inner
        block = length * inner
        for o in tiles(cg, outer, group, "o"):
            yield o.size * inner, o.start * block, [(block, o.size), (1, inner)]
    else:
        for o in tiles(cg, outer, 1, "o"):
            for r in tiles(cg, inner, p, "r"):
                yield r.size, o.start * (length * inner) + r.start, [(1, r.size)]


# --- LpNormalization ----------------------------------------------------------------------


def lower_lp_normalization(cg: BirCodeGen, node: Node) -> None:
    x_name, out_name = node.inputs[0], node.outputs[0]
    info = cg.graph.tensors[x_name]
    if not info.dtype.is_float:
        raise cg.fail(f"LpNormalization of {info.dtype} (floats only)")
    p_norm = int(node.attr("p", 2))
    if p_norm not in (1, 2):
        raise cg.fail(f"LpNormalization with p={p_norm} (the op defines p = 1 and 2)")
    shape = tuple(info.shape)
    axis = int(node.attr("axis", -1)) % max(1, len(shape))
    outer, length, inner = _split(shape, axis, False)
    if outer * length * inner == 0:
        return
    chunk = min(length, NORM_CHUNK)
    pieces = -(-length // chunk)
    if pieces > NORM_CHUNK:
        raise cg.fail(f"LpNormalization over {length} elements ({pieces} partial sums)")
    fp32 = Dtype.FP32
    data = cg.sb_tile("data", NUM_PARTITIONS, chunk, info.dtype)
    mapped = cg.sb_tile("mapped", NUM_PARTITIONS, chunk, fp32)
    partial = cg.sb_tile("partial", NUM_PARTITIONS, pieces, fp32)
    norm = cg.sb_tile("norm", NUM_PARTITIONS, 1, fp32)
    func = ActFunc.SQUARE if p_norm == 2 else ActFunc.ABS
    x_loc, y_loc = cg.dram(x_name).name, cg.dram(out_name).name
    for size, offset, rows in _row_tiles(cg, outer, length, inner):
        column = cg.ap(norm, partitions=size)

        def view(loc: str, piece, offset=offset, rows=rows) -> AccessPattern:
            return cg.dram_ap(loc, offset + piece.start * inner, [*rows, (inner, piece.size)])

        def load(piece, size=size) -> AccessPattern:
            tile = cg.ap(data, [(1, piece.size)], partitions=size)
            cg.dma(tile, view(x_loc, piece))
            return tile

        def divide(tile: AccessPattern, piece, column=column) -> None:
            cg.tensor_scalar(tile, tile, AluOp.DIVIDE, column)
            cg.dma(view(y_loc, piece), tile)

        whole = None
        for piece in tiles(cg, length, chunk, "l"):
            tile = load(piece)
            squares = cg.ap(mapped, [(1, piece.size)], partitions=size)
            cg.activation(squares, tile, func)
            slot = tile_index(piece, chunk)
            cg.tensor_reduce(
                cg.ap(partial, [(1, 1)], slot, partitions=size), squares, AluOp.ADD, axes=1
            )
            whole = (tile, piece)
        cg.tensor_reduce(column, cg.ap(partial, partitions=size), AluOp.ADD, axes=1)
        if p_norm == 2:
            square_root(cg, column, column)
        cg.tensor_scalar(column, column, AluOp.MAX, TINY)
        if pieces == 1:  # the row is still in SBUF
            divide(*whole)
            continue
        for piece in tiles(cg, length, chunk, "l"):
            divide(load(piece), piece)


# --- LpPool -------------------------------------------------------------------------------


def _map_flat(
    cg: BirCodeGen,
    src: str,
    dst: str,
    count: int,
    dtype: Dtype,
    compute: Callable[[AccessPattern], None],
    tag: str,
) -> None:
    """dst = compute(src) elementwise over `count` contiguous elements (DRAM locations, or
    graph tensors, of the same dtype; dst may be src): [rows, MAP_TILE] tiles, rows on
    partitions, then the rest on one partition. `compute` works in place on the tile."""
    cols = min(MAP_TILE, count)
    tile = cg.sb_tile(tag, NUM_PARTITIONS, cols, dtype)
    rows, rest = divmod(count, cols)
    for r in tiles(cg, rows, NUM_PARTITIONS, tag):
        pattern = [(cols, r.size), (1, cols)]
        block = cg.ap(tile, partitions=r.size)
        cg.dma(block, cg.dram_ap(src, r.start * cols, pattern))
        compute(block)
        cg.dma(cg.dram_ap(dst, r.start * cols, pattern), block)
    if rest:
        block = cg.ap(tile, [(1, rest)], partitions=1)
        cg.dma(block, cg.dram_ap(src, Affine(rows * cols), [(1, rest)]))
        compute(block)
        cg.dma(cg.dram_ap(dst, Affine(rows * cols), [(1, rest)]), block)


def _lp_power(cg: BirCodeGen, p: float) -> Callable[[AccessPattern], None]:
    """|x|^p in place: ScalarE abs or square, VectorE pow for other p."""

    def compute(tile: AccessPattern) -> None:
        if p == 2:
            cg.activation(tile, tile, ActFunc.SQUARE)
            return
        cg.activation(tile, tile, ActFunc.ABS)
        if p != 1:
            cg.tensor_scalar(tile, tile, AluOp.POW, p)

    return compute


def _lp_root(cg: BirCodeGen, p: float) -> Callable[[AccessPattern], None]:
    """s^(1/p) in place (s ≥ 0): √ for p = 2, VectorE pow otherwise."""

    def compute(tile: AccessPattern) -> None:
        if p == 2:
            square_root(cg, tile, tile)
        else:
            cg.tensor_scalar(tile, tile, AluOp.POW, 1.0 / p)

    return compute


def lower_lp_pool(cg: BirCodeGen, node: Node) -> None:
    x_name, out_name = node.inputs[0], node.outputs[0]
    info = cg.graph.tensors[x_name]
    if not info.dtype.is_float:
        raise cg.fail(f"LpPool of {info.dtype} (floats only)")
    p = float(node.attr("p", 2))
    if not math.isfinite(p) or p <= 0:
        raise cg.fail(f"LpPool with p={p} (a positive, finite p is supported)")
    if "kernel_shape" not in node.attrs:
        raise cg.fail("LpPool without kernel_shape")
    shape = tuple(info.shape)
    out_shape = tuple(cg.graph.tensors[out_name].shape)
    if len(shape) < 3 or math.prod(shape) == 0 or math.prod(out_shape) == 0:
        if len(shape) < 3:
            raise cg.fail(f"LpPool of a rank-{len(shape)} input (N, C and 1-3 spatial dims)")
        return
    spatial = len(shape) - 2
    if spatial > 3:
        raise cg.fail(f"{spatial}-D LpPool windows (1-D, 2-D and 3-D are supported)")
    powered = cg.dram_scratch("powered", shape, info.dtype)
    _map_flat(cg, x_name, powered.name, math.prod(shape), info.dtype, _lp_power(cg, p), "pow")
    planes = shape[0] * shape[1]
    if spatial == 3:
        depth, rows, cols = axis_windows(cg, node)
        sums_in = cg.dram_scratch(
            "depth_sums", (planes * depth.out, rows.size, cols.size), info.dtype
        )
        _depth_pass(
            cg,
            powered.name,
            sums_in.name,
            planes,
            rows.size * cols.size,
            depth,
            AluOp.ADD,
            0.0,
            None,
        )
        geo = WindowGeometry(
            rows.size,
            cols.size,
            rows.out,
            cols.out,
            rows.kernel,
            cols.kernel,
            rows.stride,
            cols.stride,
            rows.dilation,
            cols.dilation,
            rows.begin,
            cols.begin,
        )
        source, planes = sums_in.name, planes * depth.out
    else:
        geo = window_geometry(cg, node, tuple(node.attrs["kernel_shape"]))
        source = powered.name
    window_pool(cg, source, out_name, planes, info.dtype, geo, AluOp.ADD, 0.0, None)
    if p != 1:
        y_loc = cg.dram(out_name).name
        _map_flat(cg, y_loc, y_loc, math.prod(out_shape), info.dtype, _lp_root(cg, p), "root")


# --- Hardmax ------------------------------------------------------------------------------


def lower_hardmax(cg: BirCodeGen, node: Node) -> None:
    x_name, out_name = node.inputs[0], node.outputs[0]
    info = cg.graph.tensors[x_name]
    if not info.dtype.is_float:
        raise cg.fail(f"Hardmax of {info.dtype} (floats only)")
    shape = tuple(info.shape)
    flatten = cg.graph.opset < 13
    axis = int(node.attr("axis", 1 if flatten else -1)) % max(1, len(shape))
    outer, length, inner = _split(shape, axis, flatten)
    if outer * length * inner == 0:
        return
    if length > MAX_LENGTH:
        raise cg.fail(f"Hardmax over {length} positions (at most {MAX_LENGTH})")
    fp32 = Dtype.FP32
    data = cg.sb_tile("data", NUM_PARTITIONS, length, fp32)
    marks = cg.sb_tile("marks", NUM_PARTITIONS, length, fp32)
    ids = cg.sb_tile("ids", NUM_PARTITIONS, length, fp32)
    best = cg.sb_tile("best", NUM_PARTITIONS, 1, fp32)
    iota(cg, cg.ap(ids), -length, 0, [1])  # position − L: negative, exact in fp32
    x_loc, y_loc = cg.dram(x_name).name, cg.dram(out_name).name
    for size, offset, rows in _row_tiles(cg, outer, length, inner):
        pattern = [*rows, (inner, length)]
        x_tile, m_tile = cg.ap(data, partitions=size), cg.ap(marks, partitions=size)
        i_tile, column = cg.ap(ids, partitions=size), cg.ap(best, partitions=size)
        cg.dma(x_tile, cg.dram_ap(x_loc, offset, pattern))
        cg.tensor_reduce(column, x_tile, AluOp.MAX, axes=1)
        cg.tensor_scalar(m_tile, x_tile, AluOp.IS_EQUAL, column)
        cg.tensor_tensor(m_tile, m_tile, i_tile, AluOp.MULTIPLY)  # first − L at the maxima
        cg.tensor_reduce(column, m_tile, AluOp.MIN, axes=1)
        cg.tensor_scalar(x_tile, i_tile, AluOp.SUBTRACT, column, AluOp.IS_EQUAL, 0.0)
        cg.dma(cg.dram_ap(y_loc, offset, pattern), x_tile)


# --- EyeLike ------------------------------------------------------------------------------


def lower_eye_like(cg: BirCodeGen, node: Node) -> None:
    x_name, out_name = node.inputs[0], node.outputs[0]
    shape = tuple(cg.graph.tensors[x_name].shape)
    if len(shape) != 2:
        raise cg.fail(f"EyeLike of a rank-{len(shape)} input (the op takes rank 2)")
    rows, cols = shape
    if rows * cols == 0:
        return
    k = int(node.attr("k", 0))
    p, fp32 = NUM_PARTITIONS, Dtype.FP32
    row_ids = cg.sb_tile("row_ids", p, -(-rows // p), fp32)
    iota(cg, cg.ap(row_ids), 0, 1, [p])  # p + 128·t: the row of partition p in row tile t
    width = min(cols, EYE_TILE)
    mask = cg.sb_tile("mask", p, width, fp32)
    y_loc = cg.dram(out_name).name
    for c0 in range(0, cols, width):  # unrolled: the column numbers are Iota immediates
        size = min(width, cols - c0)
        for r in tiles(cg, rows, p, "r"):
            ones = cg.ap(mask, [(1, size)], partitions=r.size)
            iota(cg, ones, c0, 0, [1])
            row = cg.ap(row_ids, [(1, 1)], tile_index(r, p), partitions=r.size)
            cg.tensor_scalar(ones, ones, AluOp.SUBTRACT, row, AluOp.IS_EQUAL, float(k))
            cg.dma(cg.dram_ap(y_loc, r.start * cols + c0, [(cols, r.size), (1, size)]), ones)


LOWERINGS: dict[str, Callable] = {
    "EyeLike": lower_eye_like,
    "Hardmax": lower_hardmax,
    "LpNormalization": lower_lp_normalization,
    "LpPool": lower_lp_pool,
}
