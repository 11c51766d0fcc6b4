"""The walk every generic elementwise op is built on (`emit_elementwise`), with numpy
broadcasting.

The output is walked as [outer..., rows, cols] after merging the dims every operand walks
contiguously (`merge_broadcast_dims`): rows go on partitions (tiles of 128), cols on the free
dim (tiles of FREE_TILE), outer dims become loops. A contiguous walk is cut into rows of the
output's preferred row length (a channel plane next to convs, a matrix row next to matmuls:
`residency.preferred_row`), the layout a tensor kept in SBUF has
(docs/memory_planner.md#layout). Each input tile is brought in by one DMA whose DRAM pattern
has stride 0 along the dims it broadcasts over, so the compute instruction always sees
same-shaped tiles; the result goes back by DMA.

Broadcast operands (docs/memory_planner.md#broadcast-operands): an input that is the same in
every iteration of some loops (a bias row down the rows, a [B, 1, T, T] mask along the heads
of [B, H, T, T] scores) is loaded once, before the outermost of those loops, when its block
fits one tile (`_hoist_depth`); a large fp32 row repeated down the partitions may instead be
loaded once as one row and copied down the partitions on the PE array into PSUM
(`_row_on_pe`). With `direct`, an input or output the memory plan keeps in SBUF is the
compute's operand itself, without a copy (docs/memory_planner.md#direct-operands).

The innermost loop with more than one tile rotates the tiles over up to `COPIES` copies
(docs/buffers.md#lowerings), so the loads of one tile overlap the compute on the previous one
and the loop is `parallel`. Scratch tiles for a `compute` (`scratch_tile`) are addressed like
the output tile (`like`), so they always hold `COPIES` copies.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from onnx2bir.bir.enums import Dtype
from onnx2bir.bir.ir import AccessPattern, MemoryLocation
from onnx2bir.bir.opcodes import NUM_PARTITIONS
from onnx2bir.codegen.driver import BirCodeGen
from onnx2bir.codegen.residency import image_group, preferred_group, preferred_row
from onnx2bir.codegen.tiling import (
    Affine,
    broadcast_strides,
    buffer_count,
    contiguous_strides,
    merge_broadcast_dims,
    rotating_level,
    tile_count,
    tiles,
)

PE_BROADCAST_ELEMENTS = 128 * 128  # a row block this big is copied on the PE (`_row_on_pe`)
MATMUL_COLUMNS = 512  # fp32 columns of one PSUM bank: the widest Matmult output
FREE_TILE = 2048  # elements; FREE_TILE x any itemsize is a multiple of the 64-byte alignment
COPIES = 2  # at most this many copies of the tiles (double buffering)


@dataclass(frozen=True)
class _Piece:
    """A rectangular part of the output walk: outer dims, then rows x cols."""

    base: tuple[int, ...]  # element offset per operand (output first)
    outer: tuple[tuple[int, tuple[int, ...]], ...]  # (extent, stride per operand)
    rows: int
    row_strides: tuple[int, ...]
    cols: int
    col_strides: tuple[int, ...]
    predicated: bool = True  # a partial last row tile runs under a predicate (else apart)


def _pieces(shape: tuple[int, ...], strides: list[tuple[int, ...]], row: int = 1) -> list[_Piece]:
    """The walk as pieces. A 1-D walk is cut into rows of `row` elements when that divides it
    (the output's row length on chip, docs/memory_planner.md#layout), else into 128 rows; a
    longer walk whose contiguous last dim holds whole rows is cut the same way."""
    count = len(strides)
    if not shape:
        zeros = (0,) * count
        return [_Piece(zeros, (), 1, zeros, 1, zeros)]
    if len(shape) == 1:
        # One run of contiguous-or-broadcast elements: fold it into rows x cols.
        (total,) = shape
        step = tuple(s[0] for s in strides)
        if row > 1 and total % row == 0:
            return [_Piece((0,) * count, (), total // row, tuple(s * row for s in step), row, step)]
        cols = min(FREE_TILE, max(1, -(-total // NUM_PARTITIONS)))
        rows, rest = divmod(total, cols)
        pieces = [_Piece((0,) * count, (), rows, tuple(s * cols for s in step), cols, step)]
        if rest:
            base = tuple(s * rows * cols for s in step)
            pieces.append(_Piece(base, (), 1, (0,) * count, rest, step))
        return [piece for piece in pieces if piece.rows]
    last = shape[-1]
    if row > 1 and last > row and last % row == 0 and strides[0][-1] == 1:
        # Cut the contiguous last dim into rows of `row`, so the rows are the partitions.
        shape = (*shape[:-1], last // row, row)
        strides = [(*s[:-1], s[-1] * row, s[-1]) for s in strides]
    outer = tuple((shape[d], tuple(s[d] for s in strides)) for d in range(len(shape) - 2))
    return [
        _Piece(
            (0,) * count,
            outer,
            shape[-2],
            tuple(s[-2] for s in strides),
            shape[-1],
            tuple(s[-1] for s in strides),
        )
    ]


Compute = Callable[[BirCodeGen, AccessPattern, list[AccessPattern]], None]


def scratch_tile(cg: BirCodeGen, tag: str, dtype: Dtype = Dtype.FP32) -> MemoryLocation:
    """An SBUF tile as large as `emit_elementwise`'s (all its copies), for intermediates of a
    `compute`: address it with `like(dst, tile)`."""
    return cg.sb_tile(tag, NUM_PARTITIONS, COPIES * FREE_TILE, dtype)


# The tile position of each operand `emit_elementwise` hands its `compute` in place of a
# tile (an SBUF home, a PSUM row), while the compute runs: `like` addresses scratch there.
_TILE_OF: dict[AccessPattern, AccessPattern] = {}


def like(ap: AccessPattern, loc: MemoryLocation) -> AccessPattern:
    """The same partitions and free pattern as `ap`, on tile `loc`. For an operand that is an
    SBUF home (`direct`), the position of the tile it stands for: the home's own offsets
    would leave the scratch tile."""
    return replace(_TILE_OF.get(ap, ap), loc=loc.name)


def _walk_pieces(
    cg: BirCodeGen,
    node: dict,
    shapes: dict[str, tuple[int, ...]] | None,
    out_shape: tuple[int, ...] | None = None,
) -> tuple[list[str], list[_Piece]] | None:
    """The tensors (output first) and the pieces of the output walk; None for an empty
    output."""
    inputs = [t for t in node["inputs"] if t]
    out = node["outputs"][0]
    out_shape = tuple(out_shape or cg.graph.tensors[out].shape)
    if math.prod(out_shape) == 0:
        return None
    shapes = shapes or {}
    strides = [contiguous_strides(out_shape)] + [
        broadcast_strides(shapes.get(t, tuple(cg.graph.tensors[t].shape)), out_shape)
        for t in inputs
    ]
    shape, merged = merge_broadcast_dims(out_shape, strides)
    pieces = _pieces(shape, merged, preferred_row(cg.graph, out))
    group = preferred_group(cg.graph, out)
    if group:
        pieces = [_in_groups(piece, group, out_shape[-1]) for piece in pieces]
    elif (images := image_group(cg.graph, out)) and all(
        tuple(shapes.get(t, cg.graph.tensors[t].shape)) == out_shape for t in inputs
    ):
        # a batch of images next to a conv, its images in groups: one image at a time (an op
        # with a broadcast operand walks flat rows, and the plan keeps the tensor in its rows)
        plane = math.prod(out_shape[2:])
        pieces = [_in_groups(piece, images, plane) for piece in pieces]
    return [out, *inputs], pieces


def _in_groups(piece: _Piece, group: int, length: int) -> _Piece:
    """A piece whose rows are the rows of a batch of matrices of `group` rows, walked one
    matrix at a time with unpredicated tiles, as a home in groups holds them
    (docs/memory_planner.md#groups); any other piece as it is."""
    if piece.cols != length or piece.row_strides[0] != length or piece.rows % group:
        return piece
    if piece.rows == group:
        return replace(piece, predicated=False)
    matrices = (piece.rows // group, tuple(s * group for s in piece.row_strides))
    return replace(piece, outer=(*piece.outer, matrices), rows=group, predicated=False)


def tile_width(cg: BirCodeGen, node: dict, shapes: dict[str, tuple[int, ...]] | None = None) -> int:
    """The largest free size (elements per partition) of the tiles `emit_elementwise` hands
    its `compute` for `node`: how much of a constant tile a compute can read."""
    planned = _walk_pieces(cg, node, shapes)
    if planned is None:
        return 1
    return max(min(piece.cols, FREE_TILE) for piece in planned[1])


def emit_elementwise(
    cg: BirCodeGen,
    node: dict,
    compute: Compute,
    shapes: dict[str, tuple[int, ...]] | None = None,
    direct: bool = False,
    psum_rows: bool = False,
    out_shape: tuple[int, ...] | None = None,
) -> None:
    """Tile the output, DMA each (broadcast) input tile in, `compute`, DMA the result out.

    `shapes` overrides the shape an input broadcasts from (same elements, e.g. a [C] slope
    seen as [C, 1, 1] where an old opset broadcasts along the channel axis). With `direct`,
    inputs and output the memory plan keeps in SBUF are `compute`'s operands themselves
    (`Residency.read_operand`); `like(dst, scratch)` then addresses the scratch tile where
    the output tile would be.
    With `psum_rows`, an fp32 input that is one row repeated down the partitions (a bias) may
    be handed to `compute` in PSUM (`_row_on_pe`): only for a compute whose instructions all
    run on VectorE or ScalarE (GpSimd cannot read PSUM) and read at most one PSUM operand.
    `out_shape` views the output as another shape of the same elements (a blocked axis split
    in two, docs/quantization.md#blocked), the inputs then seen through `shapes`.
    """
    planned = _walk_pieces(cg, node, shapes, out_shape)
    if planned is None:
        return
    names, pieces = planned
    locations = [cg.dram(name) for name in names]
    trips = max((_rotating_trips(piece) for piece in pieces), default=1)
    # A copy holds the walk's widest tile, 64-byte aligned in any dtype: attention scores in
    # rows of 128 take 128 elements, not FREE_TILE, and leave the room to the homes (the
    # tiles stay unused when every operand has one).
    stride = -(-max(min(piece.cols, FREE_TILE) for piece in pieces) // 64) * 64
    per_copy = sum(stride * cg.graph.tensors[name].dtype.itemsize for name in names)
    copies = buffer_count(cg, trips, per_copy, limit=COPIES)
    # Tiles in the tensors' own dtypes: under `--auto-cast all` the DMAs cast to and from
    # the DRAM storage dtype.
    sb = [
        cg.sb_tile(f"x{index}", NUM_PARTITIONS, copies * stride, cg.graph.tensors[name].dtype)
        for index, name in enumerate(names)
    ]
    pe_rows = {} if psum_rows else None
    for piece in pieces:
        level = rotating_level(_tile_counts(piece)) if copies > 1 else None
        hoist = [None] + [_hoist_depth(piece, index) for index in range(1, len(locations))]
        walk = _Walk(piece, locations, sb, compute, level, copies, stride, direct, hoist, pe_rows)
        _emit_piece(cg, walk, 0, [Affine()] * len(locations), Affine())


def _tile_counts(piece: _Piece) -> list[int]:
    """Tiles per loop level of a piece: its outer dims, rows, cols."""
    return [
        *(extent for extent, _ in piece.outer),
        tile_count(piece.rows, NUM_PARTITIONS),
        tile_count(piece.cols, FREE_TILE),
    ]


def _rotating_trips(piece: _Piece) -> int:
    counts = _tile_counts(piece)
    level = rotating_level(counts)
    return 1 if level is None else counts[level]


@dataclass(frozen=True)
class _Walk:
    """What `_emit_piece` carries down its loop levels."""

    piece: _Piece
    locations: list
    sb: list
    compute: Compute
    level: int | None  # the loop level that rotates the tiles' copies
    copies: int
    stride: int  # elements between two copies of a tile
    direct: bool  # operands straight from and into SBUF homes
    hoist: list  # per operand, the loop level it is loaded at (`_hoist_depth`), or None
    pe_rows: dict | None  # the ones and PSUM tiles of rows copied on the PE (`_row_on_pe`)

    def buffers(self, level: int) -> int:
        return self.copies if level == self.level else 1


def _hoist_depth(piece: _Piece, index: int) -> int | None:
    """The outermost loop level from which input `index` is the same in every iteration of
    the loops inside it, when its block (rows x cols) then fits one tile; None when it is
    not worth loading ahead of the tile loop (it changes from tile to tile).

    A bias row (stride 0 down the rows) is invariant in the row loop; a mask shared by the
    heads of an attention score (stride 0 along the head dim) is invariant in that loop
    too, so it is loaded once per batch and read by every head's tiles."""
    if tile_count(piece.cols, FREE_TILE) != 1:
        return None
    if piece.row_strides[index] and piece.rows > NUM_PARTITIONS:
        return None
    depth = len(piece.outer)
    while depth and piece.outer[depth - 1][1][index] == 0:
        depth -= 1
    if depth == len(piece.outer) and piece.row_strides[index]:
        return None  # varies with the innermost outer loop: one load per tile either way
    return depth


def _hoist(cg, walk: _Walk, depth: int, offsets, slot: Affine, hoisted: dict) -> dict:
    """Load the inputs whose hoist level is `depth`, once, before the loops they are
    invariant in: into their tile's copy `slot` (a rotating loop outside still gets one copy
    per iteration), or, with `direct`, read straight from an SBUF home."""
    piece = walk.piece
    loads = [
        index
        for index in range(1, len(walk.locations))
        if walk.hoist[index] == depth and index not in hoisted
    ]
    if not loads:
        return hoisted
    hoisted = dict(hoisted)
    width = min(piece.rows, NUM_PARTITIONS)
    for index in loads:
        tile = cg.ap(walk.sb[index], [(1, piece.cols)], slot * walk.stride, partitions=width)
        dram = cg.dram_ap(
            walk.locations[index].name,
            piece.base[index] + offsets[index],
            [(piece.row_strides[index], width), (piece.col_strides[index], piece.cols)],
        )
        if depth == 0 and _broadcast_on_pe(cg, walk, index, width):
            hoisted[index] = _row_on_pe(cg, walk, index, width, offsets[index])
        elif walk.direct:
            hoisted[index] = cg.read_operand(tile, dram)
        else:
            cg.dma(tile, dram)
            hoisted[index] = tile
    return hoisted


def _broadcast_on_pe(cg: BirCodeGen, walk: _Walk, index: int, width: int) -> bool:
    """Whether input `index`, one row repeated down `width` partitions (a bias), is better
    made on chip (`_row_on_pe`) than loaded by a partition-broadcast DMA: for a compute that
    reads it from PSUM (`pe_rows`), an fp32 constant (a weight) without negative zeros, a block
    of at least `PE_BROADCAST_ELEMENTS` and PSUM banks to hold it."""
    piece = walk.piece
    if walk.pe_rows is None or piece.row_strides[index] or width < 2:
        return False
    if walk.sb[index].dtype is not Dtype.FP32 or width * piece.cols < PE_BROADCAST_ELEMENTS:
        return False
    if not pe_copyable(cg.graph.tensors.get(walk.locations[index].name)):
        return False
    if index in walk.pe_rows:
        return walk.pe_rows[index].shape[1] >= piece.cols
    if any(key != "ones" for key in walk.pe_rows):
        return False  # one PSUM operand per instruction: a second row is loaded as before
    return -(-piece.cols // MATMUL_COLUMNS) <= cg.psum_free_banks()


def pe_copyable(info) -> bool:
    """Whether a tensor's row may be copied down the partitions on the PE array
    (`copy_row_down`) and stay exact: an fp32 constant without negative zeros (the PE's sum
    starts from +0, so 1 · (-0) would come out +0)."""
    if info is None or not info.is_const or info.dtype is not Dtype.FP32:
        return False
    values = np.asarray(info.const)
    return not np.any((values == 0) & np.signbit(values))


def copy_row_down(cg: BirCodeGen, psum, ones, row, width: int, cols: int) -> None:
    """`row` (cols elements on partition 0 of an SBUF tile) on `width` partitions of `psum`:
    ones[1, width]ᵀ · row[1, cols], 512 columns (one bank) per matmul; `ones` holds at least
    `width` ones on one partition. Exact: each element is 1 · x, rounded once."""
    for start in range(0, cols, MATMUL_COLUMNS):
        size = min(MATMUL_COLUMNS, cols - start)
        cg.matmul(
            cg.ap(psum, [(1, size)], start, partitions=width),
            cg.ap(ones, [(1, width)], partitions=1),
            cg.ap(row, [(1, size)], start, partitions=1),
            accumulate=False,
        )


def _row_on_pe(cg: BirCodeGen, walk: _Walk, index: int, width: int, offset: Affine):
    """Load the row once (cols elements on one partition) and copy it down `width`
    partitions on the PE array: ones[1, width]ᵀ · row[1, cols] into PSUM, 512 columns (one
    bank) per matmul. A DVE TensorTensor reads its PSUM operand at one element per cycle
    (docs/device_time.md#instruction-costs), and the load moves the row once instead of once
    per partition. Exact: each output element is 1 · x, rounded once (a -0 would come out +0,
    so `_broadcast_on_pe` leaves rows holding one to the DMA)."""
    piece, tiles_ = walk.piece, walk.pe_rows
    if "ones" not in tiles_:
        tiles_["ones"] = cg.sb_tile("ones", 1, NUM_PARTITIONS, Dtype.FP32)
        cg.memset(cg.ap(tiles_["ones"]), 1.0)
    if index not in tiles_:
        tiles_[index] = cg.psum_tile(f"row{index}", NUM_PARTITIONS, piece.cols)
    row = cg.ap(walk.sb[index], [(1, piece.cols)], partitions=1)
    cg.dma(
        row,
        cg.dram_ap(
            walk.locations[index].name,
            piece.base[index] + offset,
            [(piece.col_strides[index], piece.cols)],
        ),
    )
    copy_row_down(cg, tiles_[index], tiles_["ones"], walk.sb[index], width, piece.cols)
    return cg.ap(tiles_[index], [(1, piece.cols)], partitions=width)


def _emit_piece(
    cg, walk: _Walk, depth: int, offsets, slot: Affine, hoisted: dict | None = None
) -> None:
    piece, locations, sb, compute = walk.piece, walk.locations, walk.sb, walk.compute
    # Inputs invariant in the loops from here in are loaded once, here (`_hoist_depth`).
    hoisted = _hoist(cg, walk, depth, offsets, slot, hoisted or {})
    if depth < len(piece.outer):
        extent, strides = piece.outer[depth]
        for tile in tiles(cg, extent, 1, "i", buffers=walk.buffers(depth)):
            shifted = [off + tile.start * s for off, s in zip(offsets, strides, strict=True)]
            _emit_piece(cg, walk, depth + 1, shifted, slot + tile.slot, hoisted)
        return
    # Rows are the leading dim of every operand (partitions, the DRAM row dim): a partial last
    # row tile runs in the same loop under a predicate instead of separate code.
    outer = len(piece.outer)
    rows = tiles(
        cg,
        piece.rows,
        NUM_PARTITIONS,
        "r",
        predicated=piece.predicated,
        buffers=walk.buffers(outer),
    )
    for row in rows:
        for col in tiles(cg, piece.cols, FREE_TILE, "c", buffers=walk.buffers(outer + 1)):
            at = (slot + row.slot + col.slot) * walk.stride
            aps = []
            for index, loc in enumerate(locations):
                start = (
                    piece.base[index]
                    + offsets[index]
                    + row.start * piece.row_strides[index]
                    + col.start * piece.col_strides[index]
                )
                dram = cg.dram_ap(
                    loc.name,
                    start,
                    [(piece.row_strides[index], row.size), (piece.col_strides[index], col.size)],
                )
                aps.append((dram, cg.ap(sb[index], [(1, col.size)], at, partitions=row.size)))
            out_dram, out_tile = aps[0]
            srcs = []
            for index, (dram, tile) in enumerate(aps[1:], start=1):
                if index in hoisted:
                    srcs.append(hoisted[index])
                elif walk.direct:  # homes the memory plan keeps in SBUF are operands
                    srcs.append(cg.read_operand(tile, dram))
                else:
                    cg.dma(tile, dram)
                    srcs.append(tile)
            dst = cg.write_operand(out_tile, out_dram) if walk.direct else out_tile
            _TILE_OF.clear()
            _TILE_OF[dst] = out_tile
            try:
                compute(cg, dst, srcs)
            finally:
                _TILE_OF.clear()
            cg.store_result(out_dram, out_tile, dst)
