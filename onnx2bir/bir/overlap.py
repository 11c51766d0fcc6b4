"""Where two accesses of the dependency analysis can meet (docs/dependencies.md#analysis).

An access is a `Footprint`: its memory (one DRAM location, or all of SBUF or PSUM, where tiles
of different nodes may share bytes), its partitions, and its byte range as an affine function
of the enclosing loop axes plus the reach of its free pattern. `may_overlap` compares two
footprints per relation of their loop iterations. Overlap is interval arithmetic over the loop
ranges (sound: it never misses a conflict); two accesses without loop dependence whose byte
ranges overlap are refined by enumerating their elements, so interleaved strided slices (a
Concat along an inner axis) do not meet.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from onnx2bir.bir.enums import MemoryType
from onnx2bir.bir.ir import AccessPattern, MemoryLocation

ENUMERATE_LIMIT = 1 << 15  # elements per access up to which overlap is decided exactly


@dataclass(frozen=True, slots=True)
class LoopRange:
    start: int
    last: int
    step: int

    @property
    def varies(self) -> bool:
        return self.last > self.start

    @property
    def trips(self) -> int:
        return (self.last - self.start) // self.step + 1


@dataclass(frozen=True, slots=True)
class Footprint:
    """The bytes one access pattern touches, per loop iteration."""

    memory: str
    first_partition: int
    last_partition: int
    base: int  # byte address of the first element with every loop axis at 0
    terms: tuple[tuple[str, int], ...]  # (axis, bytes per unit of the axis)
    low: int  # byte reach of the pattern around the first element, inclusive
    high: int
    is_write: bool
    dense: bool  # the pattern touches every byte of [low, high]
    static: bool  # the same bytes in every iteration
    exact: bool  # static and dense: first_byte..last_byte are exactly the bytes touched
    ap: AccessPattern
    itemsize: int
    first_byte: int  # the first and last byte over every iteration
    last_byte: int


def shared_loops(a: tuple[str, ...], b: tuple[str, ...]) -> tuple[str, ...]:
    """The loops two loop nests have in common: their longest common prefix."""
    n = 0
    while n < len(a) and n < len(b) and a[n] == b[n]:
        n += 1
    return a[:n]


def _dense(pattern: tuple[tuple[int, int], ...]) -> bool:
    if len(pattern) == 1:
        stride, count = pattern[0]
        return count <= 1 or abs(stride) == 1
    dims = sorted((abs(stride), count) for stride, count in pattern if count > 1)
    running = 1
    for stride, count in dims:
        if stride != running:
            return False
        running *= count
    return True


def footprint(
    ap: AccessPattern, loc: MemoryLocation, is_write: bool, loops: dict[str, LoopRange]
) -> Footprint:
    size = loc.dtype.itemsize
    if loc.memory is MemoryType.DRAM:
        memory, first_p, last_p, base = f"DRAM:{loc.name}", 0, 0, ap.offset * size
    else:
        memory = loc.memory.value
        first_p, last_p = ap.partition_start, ap.partition_start + ap.num_partitions - 1
        base = loc.address + ap.offset * size
    low, high = ap.pattern_reach
    low, high = low * size, high * size + size - 1
    if len(ap.offset_terms) < 2:
        terms = tuple((axis, coef * size) for axis, coef in ap.offset_terms if coef)
    else:
        merged: dict[str, int] = {}
        for axis, coef in ap.offset_terms:  # one coefficient per axis
            merged[axis] = merged.get(axis, 0) + coef * size
        terms = tuple((axis, coef) for axis, coef in merged.items() if coef)
    first, last = base + low, base + high
    static = True
    for axis, coef in terms:
        loop = loops[axis]
        a, b = coef * loop.start, coef * loop.last
        if a <= b:
            first, last = first + a, last + b
        else:
            first, last = first + b, last + a
        if loop.last > loop.start:
            static = False
    dense = _dense(ap.pattern)
    return Footprint(
        memory,
        first_p,
        last_p,
        base,
        terms,
        low,
        high,
        is_write,
        dense,
        static,
        static and dense,
        ap,
        size,
        first,
        last,
    )


def _range(coef: int, loop: LoopRange) -> tuple[int, int]:
    a, b = coef * loop.start, coef * loop.last
    return (a, b) if a <= b else (b, a)


def _coefficients(
    late: tuple[tuple[str, int], ...], early: tuple[tuple[str, int], ...]
) -> list[tuple[str, int, int]]:
    """(axis, late coefficient, early coefficient) for every axis of either (0 if absent)."""
    found = [(axis, coef, next((c for a, c in early if a == axis), 0)) for axis, coef in late]
    found.extend((axis, 0, coef) for axis, coef in early if all(a != axis for a, _ in late))
    return found


def may_overlap(
    early: Footprint,
    late: Footprint,
    shared: tuple[str, ...],
    level: int,
    relation: int,
    loops: dict[str, LoopRange],
    cache: dict,
) -> bool:
    """Can `early` and `late` touch a common byte when the shared loops above `level` take
    equal values in both and, at `level`, the early instruction's iteration compares to the
    late one's by `relation` (-1 before, +1 after; 0 with `level` = len(shared): all equal)?"""
    if early.memory != late.memory:
        return False
    if early.first_partition > late.last_partition or late.first_partition > early.last_partition:
        return False
    if early.first_byte > late.last_byte or late.first_byte > early.last_byte:
        return False
    if early.static and late.static:  # the same bytes in every iteration: the boxes meet
        return (early.dense and late.dense) or _elements_meet(early, late, loops, cache)
    low = high = late.base - early.base
    for axis, c_late, c_early in _coefficients(late.terms, early.terms):
        loop = loops[axis]
        index = shared.index(axis) if axis in shared else len(shared)
        if index < level:  # one value for both
            a, b = _range(c_late - c_early, loop)
        elif index == level and relation:
            # early = late + delta, delta a non-zero multiple of the step of the given sign
            span = loop.last - loop.start
            delta = (loop.step, span) if relation > 0 else (-span, -loop.step)
            a, b = _range(c_late - c_early, loop)
            d = (-c_early * delta[0], -c_early * delta[1])
            a, b = a + min(d), b + max(d)
        else:  # independent values
            a1, b1 = _range(c_late, loop)
            a2, b2 = _range(-c_early, loop)
            a, b = a1 + a2, b1 + b2
        low, high = low + a, high + b
    # late bytes [d + late.low, d + late.high] meet early bytes [early.low, early.high]
    if not (low <= early.high - late.low and high >= early.low - late.high):
        return False
    if early.static and late.static and not (early.dense and late.dense):
        return _elements_meet(early, late, loops, cache)
    if relation > 0 and not (early.dense and late.dense):
        return _shifted_meet(early, late, shared, level, loops, cache)
    return True


SHIFT_LIMIT = 1 << 21  # element-iteration pairs up to which `_shifted_meet` decides exactly


def _shifted_meet(
    early: Footprint,
    late: Footprint,
    shared: tuple[str, ...],
    level: int,
    loops: dict[str, LoopRange],
    cache: dict,
) -> bool:
    """Exact carried-overlap test for strided patterns that move with one loop.

    When both footprints depend on the loop at `level` through the same coefficient c and
    otherwise only on outer shared loops (equal coefficients, one value for both), the early
    access in an iteration δ trips later touches its iteration-start elements shifted by c·δ:
    enumerate every δ against the late access's elements (docs/buffers.md#rotation: a
    multi-buffered loop's strided output rows must not look carried). True when unsure.
    """
    axis = shared[level]
    coefs_early, coefs_late = dict(early.terms), dict(late.terms)
    if coefs_early.get(axis, 0) != coefs_late.get(axis, 0) or not coefs_early.get(axis):
        return True
    for other in coefs_early.keys() | coefs_late.keys():
        if other == axis:
            continue
        if other not in shared[:level] or coefs_early.get(other) != coefs_late.get(other):
            return True
    loop = loops[axis]
    deltas = np.arange(loop.step, loop.last - loop.start + 1, loop.step, dtype=np.int64)
    a, a_bytes = _runs(early, loops, cache)
    b, b_bytes = _runs(late, loops, cache)
    if a is None or b is None or len(deltas) * len(a) > SHIFT_LIMIT:
        return True
    shifted = (a[None, :] + coefs_early[axis] * deltas[:, None]).reshape(-1)
    # a run of b at s meets a run of `shifted` at t when t - b_bytes < s < t + a_bytes
    lo = np.searchsorted(b, shifted - b_bytes + 1, side="left")
    hi = np.searchsorted(b, shifted + a_bytes, side="left")
    return bool(np.any(hi > lo))


def _runs(fp: Footprint, loops: dict[str, LoopRange], cache: dict) -> tuple[np.ndarray | None, int]:
    """Sorted first byte of every contiguous run of a footprint (its unit-stride dim taken
    whole; each loop axis at its first value), and the run's length in bytes."""
    key = ("runs", id(fp))
    if key in cache:
        return cache[key][1]
    pattern = list(fp.ap.pattern)
    run = next((i for i, (stride, count) in enumerate(pattern) if stride == 1 and count > 1), None)
    run_bytes = fp.itemsize
    if run is not None:
        run_bytes = pattern[run][1] * fp.itemsize
        del pattern[run]
    starts = None
    if fp.ap.free_size // (run_bytes // fp.itemsize) <= ENUMERATE_LIMIT:
        base = fp.base + sum(coef * loops[axis].start for axis, coef in fp.terms)
        starts = np.array([base], dtype=np.int64)
        for stride, count in pattern:
            steps = np.arange(count, dtype=np.int64) * (stride * fp.itemsize)
            starts = (starts[:, None] + steps[None, :]).reshape(-1)
        starts.sort()
    cache[key] = (fp, (starts, run_bytes))  # the footprint is kept alive so its id stays unique
    return starts, run_bytes


def _starts(fp: Footprint, loops: dict[str, LoopRange], cache: dict) -> np.ndarray | None:
    """Sorted byte address of every element of a footprint with each loop axis at its first
    value (None: too many)."""
    key = id(fp)
    if key in cache:
        return cache[key][1]
    starts = None
    if fp.ap.free_size <= ENUMERATE_LIMIT:
        base = fp.base + sum(coef * loops[axis].start for axis, coef in fp.terms)
        starts = np.array([base], dtype=np.int64)
        for stride, count in fp.ap.pattern:
            steps = np.arange(count, dtype=np.int64) * (stride * fp.itemsize)
            starts = (starts[:, None] + steps[None, :]).reshape(-1)
        starts.sort()
    cache[key] = (fp, starts)  # the footprint is kept alive so that its id stays unique
    return starts


def _elements_meet(
    early: Footprint, late: Footprint, loops: dict[str, LoopRange], cache: dict
) -> bool:
    """Exact test for two loop-invariant patterns: does any element of one share a byte with
    an element of the other?"""
    if early.dense:
        early, late = late, early
    a = _starts(early, loops, cache)  # the sparse one
    if a is None:
        return True
    if late.dense:
        first, last = late.first_byte, late.last_byte
        lo = np.searchsorted(a, first - early.itemsize + 1, side="left")
        return bool(lo < len(a) and a[lo] <= last)
    b = _starts(late, loops, cache)
    if b is None:
        return True
    # an element of b at s meets an element of a at t when t - b.size < s < t + a.size
    lo = np.searchsorted(b, a - late.itemsize + 1, side="left")
    hi = np.searchsorted(b, a + early.itemsize, side="left")
    return bool(np.any(hi > lo))
