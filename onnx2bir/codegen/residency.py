"""Where a tensor lives when it stays on chip, and how an access to it is rewritten
(docs/memory_planner.md#layout).

A resident tensor keeps its flat element order, cut into rows of `inner` elements: flat
element `f = row · inner + i` lives in partition `row mod 128`, at free element
`(row div 128) · inner + i`. Rows are dealt round the partitions in chunks of 128, so a
tensor of R rows takes ceil(R / 128) · inner elements in each partition. `inner` is the
partition stride the lowerings already use: a conv's channel plane (H · W), a matrix row, a
normalised row. `canonical_inner` gives the default; the planner may pick another one that
every access can use.

`translate` turns an access pattern written against the tensor's flat DRAM view into
per-partition pieces on its SBUF home, or says why it cannot: its outermost dim must step
whole rows (stride `inner`, one partition each), every other step must stay inside a row or
move by whole 128-row chunks, and loop terms must not move it across partitions.
`plan_copy` pairs the two sides of a DmaCopy: a copy between two on-chip operands that line
up lane to lane becomes a TensorCopy on a compute engine, otherwise it stays a DmaCopy (DRAM
to SBUF, or SBUF to SBUF) with its resident side rewritten; both sides are cut at the same
partition-chunk boundaries.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from onnx2bir.bir.ir import AccessPattern
from onnx2bir.bir.opcodes import MAX_FREE_DIMS, NUM_PARTITIONS, SB_ALIGN, partition_start_allowed
from onnx2bir.op_traits import Layout, ops_with


def canonical_inner(shape: tuple[int, ...]) -> int:
    """The default row length: the pixels of one channel for [N, C, ...] tensors (rank ≥ 3),
    the last dim of a matrix, one element for a vector or scalar."""
    if len(shape) >= 3:
        return max(1, math.prod(shape[2:]))
    if len(shape) == 2:
        return max(1, shape[1])
    return 1


@dataclass(frozen=True, slots=True)
class Home:
    """A tensor's SBUF home: rows of `inner` elements dealt over the partitions; with `group`,
    in groups of that many rows, each starting a partition chunk of its own."""

    tensor: str
    inner: int
    num_elements: int
    itemsize: int
    address: int = 0  # byte offset in every partition, set by the allocator
    group: int = 0  # rows per group (0: the rows are one group)

    @property
    def rows(self) -> int:
        return self.num_elements // self.inner

    @property
    def group_rows(self) -> int:
        return self.group or self.rows

    @property
    def group_chunks(self) -> int:
        return -(-self.group_rows // NUM_PARTITIONS)

    @property
    def chunks(self) -> int:
        return self.rows // self.group_rows * self.group_chunks

    @property
    def partitions(self) -> int:
        return min(self.group_rows, NUM_PARTITIONS)

    def describe(self) -> str:
        text = f"rows of {self.inner} elements"
        return text + (f" in groups of {self.group} rows" if self.group else "")

    @property
    def free_elements(self) -> int:
        return self.chunks * self.inner

    @property
    def bytes_per_partition(self) -> int:
        nbytes = self.free_elements * self.itemsize
        return -(-nbytes // SB_ALIGN) * SB_ALIGN


@dataclass(frozen=True, slots=True)
class Piece:
    """Rows [first, first + count) of an access's outermost dim, and the access on chip."""

    first: int
    count: int
    ap: AccessPattern


AxisRanges = dict[str, tuple[int, int]]


def _normalised(ap: AccessPattern, inner: int) -> list[tuple[int, int]]:
    """The pattern without unit dims (a zero-dim pattern becomes one element); a contiguous
    outermost run of whole rows is split into rows x row elements."""
    dims = [(stride, count) for stride, count in ap.pattern if count != 1] or [(1, 1)]
    stride, count = dims[0]
    if stride == 1 and inner > 1 and count > inner and count % inner == 0:
        dims[:1] = [(inner, count // inner), (1, inner)]
    return dims


def translate(
    ap: AccessPattern, home: Home, ranges: AxisRanges, predicated: bool = False
) -> list[Piece] | str:
    """The pieces of `ap` (an access to the tensor's flat view) on its SBUF home, or a reason.

    A `predicated` access keeps its leading dim as the partitions, in one piece: the
    predicate cuts the leading dim of every operand (docs/predicates.md).
    """
    inner, chunk = home.inner, home.inner * NUM_PARTITIONS
    if any(count == 0 for _, count in ap.pattern):
        return "an empty access"
    if home.group:
        return _translate_grouped(ap, home, ranges, predicated)
    dims = _normalised(ap, inner)
    if dims[0][0] == inner and dims[0][1] > 1:
        rows, free_dims = dims[0][1], dims[1:]
    else:
        rows, free_dims = 1, dims
    if predicated and (ap.pattern[0] != (inner, rows) or rows == 1):
        return "a predicated access whose leading dim is not the rows"
    # Axes with one value (scope regions, one-trip loops) fold into the constant offset.
    fixed = sum(
        coef * ranges.get(axis, (0, 0))[0]
        for axis, coef in ap.offset_terms
        if ranges.get(axis, (0, 0))[0] == ranges.get(axis, (0, 0))[1]
    )
    row0, i0 = divmod(ap.offset + fixed, inner)
    reach_low, reach_high = i0, i0  # the span inside one row
    terms: list[tuple[str, int]] = []
    for axis, coef in ap.offset_terms:
        first, last = ranges.get(axis, (0, 0))
        if first == last:
            continue
        if coef % chunk == 0:
            terms.append((axis, coef // chunk * inner))
            continue
        low, high = sorted((coef * first, coef * last))
        if coef % inner and 0 <= low and high < inner:
            terms.append((axis, coef))
            reach_low, reach_high = reach_low + low, reach_high + high
            continue
        return (
            f"loop {axis} steps {coef} elements: neither inside a row of {inner} "
            f"nor a whole number of {NUM_PARTITIONS}-row chunks"
        )
    free: list[tuple[int, int]] = []
    for stride, count in free_dims:
        if stride % chunk == 0 and stride:
            free.append((stride // chunk * inner, count))
        elif 0 <= stride and stride * (count - 1) < inner:
            free.append((stride, count))
            reach_high += stride * (count - 1)
        else:
            return f"a dim of stride {stride} leaves the row of {inner} elements"
    if reach_low < 0 or reach_high >= inner:
        return f"the access spans elements {reach_low}..{reach_high} of a {inner}-element row"
    if row0 < 0 or row0 + rows > home.rows:
        return "the access leaves the tensor"
    pieces = _row_pieces(home.tensor, free, terms, row0, rows, inner, i0)
    if predicated and len(pieces) > 1:
        return "a predicated access across partition chunks"
    return pieces


def _translate_grouped(
    ap: AccessPattern, home: Home, ranges: AxisRanges, predicated: bool
) -> list[Piece] | str:
    """`translate` on a home in groups (docs/memory_planner.md#groups): row r of group g lives
    in partition r mod 128, at free element (g · chunks per group + r div 128) · inner. A step
    of whole groups moves by their chunks; a step of whole 128-row chunks, or the rows of the
    access, must stay inside the group it starts in; other steps stay inside a row. A
    predicated access is refused: its nominal rows may run past the group's end."""
    inner, group = home.inner, home.group
    group_span, chunk = group * inner, NUM_PARTITIONS * inner
    group_step = home.group_chunks * inner  # free elements between two groups
    if predicated:
        return "a predicated access on a home in groups of rows"
    dims = _normalised(ap, inner)
    if dims[0][0] == inner and dims[0][1] > 1:
        rows, free_dims = dims[0][1], dims[1:]
    else:
        rows, free_dims = 1, dims
    fixed = sum(
        coef * ranges.get(axis, (0, 0))[0]
        for axis, coef in ap.offset_terms
        if ranges.get(axis, (0, 0))[0] == ranges.get(axis, (0, 0))[1]
    )
    row0, i0 = divmod(ap.offset + fixed, inner)
    group0, row0 = divmod(row0, group)
    reach_low, reach_high = i0, i0  # the span inside one row
    rows_reached = row0 + rows  # rows of the starting group the access may reach

    def place(stride: int, first: int, last: int) -> int | str:
        """Where a step of `stride` elements (taken first..last times) moves on chip."""
        nonlocal reach_low, reach_high, rows_reached
        if stride % group_span == 0:
            return stride // group_span * group_step
        low, high = sorted((stride * first, stride * last))
        if stride % chunk == 0 and low >= 0:
            rows_reached += high // inner
            return stride // chunk * inner
        if stride % inner and 0 <= low and high < inner:
            reach_low, reach_high = reach_low + low, reach_high + high
            return stride
        return (
            f"a step of {stride} elements is neither inside a row of {inner}, nor whole "
            f"groups of {group} rows, nor whole {NUM_PARTITIONS}-row chunks"
        )

    terms: list[tuple[str, int]] = []
    for axis, coef in ap.offset_terms:
        first, last = ranges.get(axis, (0, 0))
        if first == last:
            continue
        moved = place(coef, first, last)
        if isinstance(moved, str):
            return f"loop {axis}: {moved}"
        terms.append((axis, moved))
    free: list[tuple[int, int]] = []
    for stride, count in free_dims:
        moved = place(stride, 0, count - 1) if stride else 0
        if isinstance(moved, str):
            return moved
        free.append((moved, count))
    if reach_low < 0 or reach_high >= inner:
        return f"the access spans elements {reach_low}..{reach_high} of a {inner}-element row"
    if rows_reached > group:
        return f"the access crosses the end of a group of {group} rows"
    if group0 < 0 or group0 >= home.rows // group:
        return "the access leaves the tensor"
    return _row_pieces(home.tensor, free, terms, row0, rows, inner, group0 * group_step + i0)


def _row_pieces(tensor, free, terms, row0: int, rows: int, inner: int, base: int) -> list[Piece]:
    """Rows row0 .. row0 + rows of a home, `base` elements into it, cut where they cross from
    one 128-partition chunk into the next: one piece per chunk."""
    free = free or [(1, 1)]
    pieces = []
    row = row0
    while row < row0 + rows:
        part = row % NUM_PARTITIONS
        count = min(NUM_PARTITIONS - part, row0 + rows - row)
        offset = base + (row // NUM_PARTITIONS) * inner
        pieces.append(
            Piece(
                row - row0,
                count,
                AccessPattern(tensor, tuple(free), offset, tuple(terms), part, count),
            )
        )
        row += count
    return pieces


def group_rows(shape: tuple[int, ...]) -> int:
    """Rows per group of a home in groups (0: none): the matrices of a batch of matrices
    [..., M, N] whose M is not a whole number of partition chunks (the per-head scores of 197
    tokens, a head's [64, 197] keys), so that every matrix starts at partition 0."""
    if len(shape) < 3 or math.prod(shape[:-2]) < 2:
        return 0
    rows = shape[-2]
    return rows if rows % NUM_PARTITIONS else 0


def _slice_outer(ap: AccessPattern, first: int, count: int, total: int) -> AccessPattern | None:
    """Rows [first, first + count) of `ap`, which holds `total` rows: its partitions, or its
    outermost non-unit dim (split first when it runs over several elements per row)."""
    if first == 0 and count == total:
        return ap
    if ap.num_partitions:
        if ap.num_partitions != total:
            return None
        return replace(ap, partition_start=ap.partition_start + first, num_partitions=count)
    pattern = list(ap.pattern)
    for index, (stride, extent) in enumerate(pattern):
        if extent == 1:
            continue
        if extent % total:
            return None
        per_row = extent // total
        split = [(stride * per_row, count)] + ([(stride, per_row)] if per_row > 1 else [])
        pattern[index : index + 1] = split
        return replace(ap, pattern=tuple(pattern), offset=ap.offset + stride * per_row * first)
    return None


def _sub_piece(pieces: list[Piece], starts: list[int], first: int, end: int) -> AccessPattern:
    """Rows [first, end) of the piece that holds them (a piece's rows share one free offset);
    `starts` are the pieces' first rows, ascending (a binary search: a tensor of many
    partition chunks has as many pieces, and a copy is cut at every chunk)."""
    piece = pieces[bisect.bisect_right(starts, first) - 1]
    assert piece.first <= first and end <= piece.first + piece.count
    return replace(
        piece.ap,
        partition_start=piece.ap.partition_start + first - piece.first,
        num_partitions=end - first,
    )


@dataclass(frozen=True, slots=True)
class Copy:
    """One instruction of a rewritten DmaCopy: `on_chip` copies run on a compute engine,
    the others on a DMA queue."""

    dst: AccessPattern
    src: AccessPattern
    on_chip: bool


def _engine_ready(ap: AccessPattern) -> str | None:
    if not partition_start_allowed(ap.partition_start, ap.num_partitions):
        return f"{ap.num_partitions} partitions cannot start at partition {ap.partition_start}"
    if len(ap.pattern) > MAX_FREE_DIMS:
        return f"{len(ap.pattern)} free dims (an engine takes {MAX_FREE_DIMS})"
    return None


def plan_copy(
    dst: AccessPattern,
    src: AccessPattern,
    homes: dict[str, Home],
    on_chip: Callable[[str], bool],
    ranges: AxisRanges,
    predicated: bool = False,
    check_only: bool = False,
) -> list[Copy] | str:
    """A DmaCopy `dst ← src` rewritten for the resident tensors in `homes`, or a reason.

    `on_chip(name)` says whether a location is an SBUF/PSUM tile, whose access patterns
    already carry partitions. With `check_only` (the planner asking whether a layout works)
    only the first cut is made: the others succeed or fail as it does, since `_slice_outer`
    refuses by the shape of the access, never by the rows it is asked for.
    """
    sides = []
    for ap in (dst, src):
        home = homes.get(ap.loc)
        if home is None:
            sides.append(None)
            continue
        pieces = translate(ap, home, ranges, predicated)
        if isinstance(pieces, str):
            return f"{ap.loc!r}: {pieces}"
        sides.append(pieces)
    if sides == [None, None]:
        return [Copy(dst, src, False)]
    # Cut both sides wherever either resident side crosses a partition chunk.
    totals = {sum(p.count for p in pieces) for pieces in sides if pieces}
    if len(totals) > 1:
        return "both sides are resident but walk different numbers of rows"
    (total,) = totals
    bounds = sorted({p.first for pieces in sides if pieces for p in pieces} | {total})
    starts = [[p.first for p in pieces] if pieces else None for pieces in sides]
    copies = []
    for first, end in zip(bounds, bounds[1:], strict=False):
        parts = []
        for ap, pieces, firsts in ((dst, sides[0], starts[0]), (src, sides[1], starts[1])):
            if pieces is None:
                sliced = _slice_outer(ap, first, end - first, total)
                if sliced is None:
                    return f"the other side ({ap.loc!r}) cannot be cut at the same rows"
                parts.append(sliced)
            else:
                parts.append(_sub_piece(pieces, firsts, first, end))
        new_dst, new_src = parts
        both_on_chip = all(ap.loc in homes or on_chip(ap.loc) for ap in parts)
        # A compute engine copies lane to lane under the partition-start rule; anything else
        # between two on-chip operands is a DMA from SBUF to SBUF.
        engine_copy = (
            both_on_chip
            and new_dst.num_partitions == new_src.num_partitions
            and math.prod(c for _, c in new_dst.pattern) == math.prod(c for _, c in new_src.pattern)
            and not any(_engine_ready(ap) for ap in parts)
        )
        copies.append(Copy(new_dst, new_src, engine_copy))
        if check_only:
            break
    return copies


# The op traits behind the layouts (onnx2bir/op_traits.py, docs/memory_planner.md#layout):
# channel planes for the spatial ops, the last dim for the matrix ops; an operand that
# broadcasts along an outer dim of an elementwise op keeps the row length of its output.
PLANE_OPS = ops_with(layout=Layout.PLANE)
ROW_OPS = ops_with(layout=Layout.ROW)
BROADCAST_OPS = ops_with(broadcasts=True)


def _same_rows(shape: tuple[int, ...], other: tuple[int, ...]) -> bool:
    """Whether `other`, met through a broadcasting op, has `shape`'s rows: the same rank,
    the same last dim and the same dims after the second, so the last dim and
    `canonical_inner` are the same for both (a [B, 1, T, T] mask beside [B, H, T, T]
    scores)."""
    if len(other) != len(shape) or not shape or shape[-1] != other[-1]:
        return False
    return len(shape) < 3 or shape[2:] == other[2:]


def preferred_row(graph, tensor: str, hops: int = 16) -> int:
    """The row length the nearest layout-fixing op gives `tensor`, looking through ops that
    keep the shape (elementwise chains) and from a broadcast input of an elementwise op to
    its output when they have the same rows (`_same_rows`; the output's layout is never
    taken from a broadcast operand's): a channel plane next to a conv, pool or batch norm,
    the last dim next to a matmul, softmax or layer norm; else `canonical_inner`."""
    shape = tuple(graph.tensors[tensor].shape)
    seen, frontier = {tensor}, [tensor]
    # A node met again from a tensor of the same shape adds nothing: its tensors that qualify
    # are already seen, and a layout-fixing node ends the search at the hop it is first met.
    # (A long elementwise chain, an unrolled recurrence, meets each node from many tensors.)
    examined: set[tuple[str, tuple]] = set()
    for _ in range(hops):
        found, following = None, []
        for name in frontier:
            here = tuple(graph.tensors[name].shape)
            producer = graph.producer(name)
            nodes = ([producer] if producer else []) + [n for n, _ in graph.consumers(name)]
            for node in nodes:
                if (node, here) in examined:
                    continue
                examined.add((node, here))
                data = graph.node(node)
                op_type = data["op_type"]
                if op_type in PLANE_OPS:
                    found = found or "plane"
                elif op_type in ROW_OPS:
                    found = found or "row"
                else:
                    for other in [*data["inputs"], *data["outputs"]]:
                        if other and other not in seen and other in graph.tensors:
                            there = tuple(graph.tensors[other].shape)
                            if there == here or (
                                op_type in BROADCAST_OPS
                                and other in data["outputs"]
                                and _same_rows(here, there)
                            ):
                                seen.add(other)
                                following.append(other)
        if found == "row" and shape:
            return max(1, shape[-1])
        if found == "plane":
            return canonical_inner(shape)
        if not following:
            break
        frontier = following
    return canonical_inner(shape)


def image_group(graph, tensor: str) -> int:
    """Rows (channel planes) per image of a home in groups for a batch of images [N, C, ...]
    (N > 1) whose C is not a whole number of partition chunks and whose rows are planes
    (`preferred_row`): each image then starts at partition 0, so a conv's loop over the images
    steps whole groups and its PSUM evictions keep their lanes (docs/memory_planner.md#groups);
    0 otherwise. The walks that read such a tensor take one image at a time."""
    if tensor not in graph.tensors:
        return 0
    shape = tuple(graph.tensors[tensor].shape)
    if len(shape) < 3 or shape[0] < 2 or shape[1] % NUM_PARTITIONS == 0:
        return 0
    if not _near_plane_op(graph, tensor):
        return 0
    return shape[1]


def _near_plane_op(graph, tensor: str, hops: int = 8) -> bool:
    """Whether a conv, pool or batch norm (`PLANE_OPS`) reads or writes `tensor`, or a tensor
    of its shape reached through ops that keep the shape (an elementwise chain)."""
    nodes = _nodes_around(graph, tensor, hops, through=lambda data: True)
    return any(data["op_type"] in PLANE_OPS for data in nodes)


def _nodes_around(graph, tensor: str, hops: int, through):
    """The nodes that write or read `tensor`, then, breadth first for up to `hops` steps, those
    of the tensors of its shape that nodes `through` accepts lead to (as node data)."""
    shape = tuple(graph.tensors[tensor].shape)
    seen, frontier = {tensor}, [tensor]
    for _ in range(hops):
        following = []
        for name in frontier:
            producer = graph.producer(name)
            for node in ([producer] if producer else []) + [n for n, _ in graph.consumers(name)]:
                data = graph.node(node)
                yield data
                if not through(data):
                    continue
                for other in [*data["inputs"], *data["outputs"]]:
                    if other and other not in seen and other in graph.tensors:
                        if tuple(graph.tensors[other].shape) == shape:
                            seen.add(other)
                            following.append(other)
        if not following:
            return
        frontier = following


def preferred_group(graph, tensor: str, hops: int = 8, walks: bool = True) -> int:
    """`group_rows` of `tensor`, past one partition chunk, when it is a per-matrix operand or
    result of a batched MatMul (both inputs of rank 3 or more: attention's per-head products),
    looking through ops that keep its shape (elementwise chains, a Softmax); else 0. A walk of
    such a tensor takes the matrices one by one, so its accesses fit a home in groups
    (`_translate_grouped`)."""
    if tensor not in graph.tensors:
        return 0  # a lowering's scratch
    shape = tuple(graph.tensors[tensor].shape)
    group = group_rows(shape)
    if not group or (walks and group <= NUM_PARTITIONS):
        # Matrices within one chunk walk as well in flat rows, several to a tile (a home in
        # groups of them, `walks` false, serves a per-head product's operand).
        return 0

    def through(data) -> bool:  # ops that keep the matrices' layout (a Softmax does)
        op_type = data["op_type"]
        return not (
            op_type == "MatMul"
            or op_type in PLANE_OPS
            or (op_type in ROW_OPS and op_type != "Softmax")
        )

    for data in _nodes_around(graph, tensor, hops, through):
        if data["op_type"] == "MatMul":
            if min(len(graph.tensors[t].shape) for t in data["inputs"][:2]) >= 3:
                return group
    return 0
