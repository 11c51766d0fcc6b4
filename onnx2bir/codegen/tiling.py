"""Affine index arithmetic and the tile loops every lowering is built from.

An `Affine` is `const + Σ coef·axis`, the offset form BIR access patterns take. `tiles()`
splits an extent into tiles of a fixed size: the whole tiles become one BIR loop (its axis
value scaled into the tile's start index), a leftover tile is emitted after the loop with
constant offsets, or, for a `predicated` extent, run by the same loop under a per-instruction
predicate. A lowering written as nested `for tile in tiles(...)` therefore produces loops
wherever the iterations are uniform and straight-line code only at unpredicated edges.

Multi-buffered loops (`tiles(..., buffers=k)`, docs/buffers.md): each tile carries a `slot`,
the copy of the loop's per-iteration buffers it uses (`offset = slot * copy_stride + ...`).
With k copies, k or fewer uniform tiles become one loop whose iterations each own a copy (no
loop-carried hazard, so the dependency analysis finds the loop `parallel`); more become a
loop over groups of k whose body is the k tiles written out, each with a constant slot, so
that each copy's load has an edge from the reads of its own copy in the previous group.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from onnx2bir.bir.enums import Dtype
from onnx2bir.bir.ir import Predicate

if TYPE_CHECKING:
    from onnx2bir.codegen.driver import BirCodeGen


@dataclass(frozen=True, slots=True)
class Affine:
    const: int = 0
    terms: tuple[tuple[str, int], ...] = ()

    @staticmethod
    def axis(name: str, coef: int = 1) -> Affine:
        return Affine(0, ((name, coef),))

    def __add__(self, other: Affine | int) -> Affine:
        if isinstance(other, int):
            return Affine(self.const + other, self.terms)
        merged = dict(self.terms)
        for axis, coef in other.terms:
            merged[axis] = merged.get(axis, 0) + coef
        return Affine(
            self.const + other.const,
            tuple((axis, coef) for axis, coef in merged.items() if coef),
        )

    __radd__ = __add__

    def __mul__(self, factor: int) -> Affine:
        if factor == 0:
            return Affine()
        return Affine(self.const * factor, tuple((a, c * factor) for a, c in self.terms))

    __rmul__ = __mul__

    @property
    def is_const(self) -> bool:
        return not self.terms


@dataclass(frozen=True, slots=True)
class Tile:
    """One tile of a tiled extent: its first index (possibly loop-dependent) and its size."""

    start: Affine
    size: int
    first: bool  # the tile that opens an accumulation (see `tiles(peel_first=True)`)
    slot: Affine = Affine()  # the buffer copy it uses (see `tiles(buffers=k)`)


def tile_index(tile: Tile, size: int) -> Affine:
    """The ordinal of a tile produced by `tiles(extent, size)` (its start divided by size)."""
    if tile.start.const % size or any(coef % size for _, coef in tile.start.terms):
        raise ValueError("tile start is not a multiple of the tile size")
    return Affine(
        tile.start.const // size, tuple((axis, coef // size) for axis, coef in tile.start.terms)
    )


def tiles(
    cg: BirCodeGen,
    extent: int,
    size: int,
    name: str,
    peel_first: bool = False,
    predicated: bool = False,
    buffers: int = 1,
) -> Iterator[Tile]:
    """Yield the tiles covering [0, extent), opening a BIR loop around the uniform ones.

    With `peel_first`, the first tile is emitted on its own so that it can carry different
    flags (a matmul that starts a PSUM accumulation rather than adding to it). With
    `predicated`, a partial edge tile is not emitted separately: one loop runs every tile at
    full size and each instruction in it carries the predicate "leading index < extent −
    start", so the body must put this extent on the leading dim of every operand
    (docs/predicates.md). With `buffers=k`, the tiles' `slot`s rotate over k buffer copies
    (docs/buffers.md#rotation); the body must index its per-iteration tiles by `slot`.
    """
    full, rest = divmod(extent, size)
    copies = max(1, buffers)
    if predicated and rest and full and not peel_first:
        count = full + 1
        if count > copies > 1:
            # Whole groups of `copies` trips; the padding trips' bound is ≤ 0, so they skip
            # every instruction and the body stays one piece (docs/buffers.md#rotation).
            count = -(-count // copies) * copies
        for index, slot in _rotated(cg, name, 0, count, copies):
            bound = Predicate(
                extent - index.const * size, tuple((a, -c * size) for a, c in index.terms)
            )
            with cg.predicated(bound):
                yield Tile(index * size, size, False, slot)
        return
    # Tile i (counted from the first one in the loops) uses copy i mod k; a peeled first
    # tile takes copy k - 1, the one used last before the loops' first tile, so that no copy
    # is reused by the very next tile (docs/buffers.md#rotation).
    first_index = 0
    if peel_first and full:
        yield Tile(Affine(0), size, True, Affine(copies - 1))
        first_index = 1
    for index, slot in _rotated(cg, name, first_index, full, copies):
        yield Tile(index * size, size, index.is_const and index.const == 0, slot)
    if rest:
        yield Tile(Affine(full * size), rest, full == 0, Affine((full - first_index) % copies))


def _rotated(
    cg: BirCodeGen, name: str, first: int, stop: int, copies: int
) -> Iterator[tuple[Affine, Affine]]:
    """(tile index, buffer slot) of tiles first..stop-1, under the loops that run them; tile
    `first` takes copy 0 (the caller's tiles before it are a multiple of `copies`, or peeled)."""
    count = stop - first
    if count <= 0:
        return
    if count == 1:
        yield Affine(first), Affine()
        return
    if copies == 1 or count <= copies:
        with cg.loop(name, first, stop) as axis:
            slot = Affine()
            if copies > 1:
                _mark_buffered(cg, axis, copies)
                slot = Affine.axis(axis) + (-first)
            yield Affine.axis(axis), slot
        return
    groups, left = divmod(count, copies)
    with cg.loop(f"{name}g", 0, groups) as outer:
        # The body holds the k copies one after the other, each its own instructions: a
        # loop-carried edge waits for the last instance of its source in the previous trip
        # (docs/dependencies.md#edge-semantics), so a load into copy j waits for the reads of
        # copy j one group before, not for those of the tile just before it.
        _mark_buffered(cg, outer, copies)
        for copy in range(copies):
            yield Affine.axis(outer, copies) + (first + copy), Affine(copy)
    yield from _rotated(cg, name, first + groups * copies, stop, copies)


BUFFERED_LOOPS = "buffered_loops"  # module metadata: {loop axis: buffer copies it rotates}


def _mark_buffered(cg: BirCodeGen, axis: str, copies: int) -> None:
    cg.module.metadata.setdefault(BUFFERED_LOOPS, {})[axis] = copies


FULL_EXPANSION = 4  # up to this many tiles, a multi-buffered loop gets one copy per tile


def tile_count(extent: int, size: int) -> int:
    """How many tiles `tiles(extent, size)` yields."""
    return -(-extent // size)


def buffer_count(
    cg: BirCodeGen,
    trips: int,
    sb_bytes: int = 0,
    psum_banks: int = 0,
    limit: int = FULL_EXPANSION,
    reserved: int = 0,
) -> int:
    """Copies for a loop of `trips` tiles whose rotated tiles take `sb_bytes` of each SBUF
    partition and `psum_banks` PSUM banks per copy: one per tile when `trips` ≤ `limit` and
    they fit, else 2 (double buffering) when that fits, else 1 (docs/buffers.md#choice).
    `reserved`: SBUF bytes per partition that tiles allocated after these still need."""
    if trips < 2:
        return 1

    def fits(copies: int) -> bool:
        return copies * sb_bytes + reserved <= cg.sb_free_bytes() and copies * psum_banks <= (
            cg.psum_free_banks()
        )

    if trips <= limit and fits(trips):
        return trips
    return 2 if fits(2) else 1


def copy_stride(free: int, dtype: Dtype) -> int:
    """Elements between two copies of a rotated SBUF tile of `free` elements per partition:
    each copy starts on the arena's 64-byte alignment."""
    return -(-free * dtype.itemsize // 64) * 64 // dtype.itemsize


def rotating_level(counts: list[int]) -> int | None:
    """Which of nested tile loops (outermost first, `counts` tiles each) rotates the buffers:
    the innermost one with more than one tile (None: every level has one tile)."""
    for level in range(len(counts) - 1, -1, -1):
        if counts[level] > 1:
            return level
    return None


def merge_broadcast_dims(
    shape: tuple[int, ...], strides: list[tuple[int, ...]]
) -> tuple[tuple[int, ...], list[tuple[int, ...]]]:
    """Drop unit dims and merge neighbours that every operand walks contiguously.

    `strides[i][d]` is operand i's element stride along output dim d (0 where it broadcasts).
    Returns the shorter shape and strides describing the same element walk.
    """
    dims = [d for d, size in enumerate(shape) if size != 1]
    out_shape: list[int] = []
    out_strides: list[list[int]] = [[] for _ in strides]
    for d in dims:
        size = shape[d]
        if out_shape and all(
            s[-1] == st[d] * size for s, st in zip(out_strides, strides, strict=True)
        ):
            out_shape[-1] *= size
            for s, st in zip(out_strides, strides, strict=True):
                s[-1] = st[d]
            continue
        out_shape.append(size)
        for s, st in zip(out_strides, strides, strict=True):
            s.append(st[d])
    return tuple(out_shape), [tuple(s) for s in out_strides]


def rotating_nested_loops(
    cg: BirCodeGen,
    sizes: tuple[int, ...],
    strides: list[tuple[int, ...]],
    name: str,
    buffers: int,
) -> Iterator[tuple[tuple[Affine, ...], Affine]]:
    """`nested_loops` whose innermost loop rotates over `buffers` copies: yields the operands'
    offsets and the copy (`Tile.slot`) the body's per-iteration tiles use
    (docs/buffers.md#rotation)."""
    if not sizes:
        yield (Affine(),) * len(strides), Affine()
        return
    if len(sizes) == 1:
        for index in tiles(cg, sizes[0], 1, name, buffers=buffers):
            yield tuple(index.start * s[0] for s in strides), index.slot
        return
    for index in tiles(cg, sizes[0], 1, name):
        inner = [s[1:] for s in strides]
        for rest, slot in rotating_nested_loops(cg, sizes[1:], inner, name, buffers):
            yield tuple(index.start * s[0] + r for s, r in zip(strides, rest, strict=True)), slot


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides = []
    running = 1
    for size in reversed(shape):
        strides.append(running)
        running *= size
    return tuple(reversed(strides))


def broadcast_strides(in_shape: tuple[int, ...], out_shape: tuple[int, ...]) -> tuple[int, ...]:
    """Element strides of a numpy-broadcast input walked along the output's dims."""
    padded = (1,) * (len(out_shape) - len(in_shape)) + tuple(in_shape)
    own = contiguous_strides(padded)
    return tuple(0 if size == 1 else stride for size, stride in zip(padded, own, strict=True))


def nested_loops(
    cg: BirCodeGen, sizes: tuple[int, ...], strides: list[tuple[int, ...]], name: str = "i"
) -> Iterator[tuple[Affine, ...]]:
    """One BIR loop per dim of `sizes` (none for a unit dim), nested outermost first.

    `strides[k][d]` is operand k's element stride along dim d; yields the operands' offsets
    (Affine in the loop axes) for the body.
    """
    if not sizes:
        yield (Affine(),) * len(strides)
        return
    for index in tiles(cg, sizes[0], 1, name):
        inner = [s[1:] for s in strides]
        for rest in nested_loops(cg, sizes[1:], inner, name):
            yield tuple(index.start * s[0] + r for s, r in zip(strides, rest, strict=True))
