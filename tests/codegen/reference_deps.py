"""The dependency analysis as it was before pruning by covering loop writes, kept as the
reference that tests/codegen/test_deps_equivalence.py compares `codegen/deps.py` against
(docs/dependencies.md#equivalence). Not used by the tool.

One change from that version, made in both: a loop-invariant contiguous access inside a loop
that may run no trip (a runtime loop, or one with no trip) drops only accesses recorded since
that loop opened. Before, it dropped earlier ones too, which left a later access unordered
with them when the loop ran no trip.

Dependency edges from buffer overlap, the `dep_edges_for_inst` step of the finalizer.

Every engine and every DMA queue runs its own in-order stream (`Instruction.stream`); only
the edges computed here order one stream against another (docs/dependencies.md#analysis).
For each pair of instructions on different streams whose accesses can overlap in bytes, one
of them writing, the later one gets an edge from the earlier: Flow (read after write),
Output (write after write) or Anti (write after read). Pairs on one stream need no edge: the
stream orders them.

An access is a `Footprint`: its memory (one DRAM location, or all of SBUF or PSUM, where tiles
of different nodes may share bytes), its partitions, and its byte range as an affine function
of the enclosing loop axes plus the reach of its free pattern. Two footprints are compared per
relation of their loop iterations (`_may_overlap`), so a loop body gets:

- a plain edge when the earlier instruction's execution can conflict with a later-or-equal
  iteration of the later one (checked when the later instruction is added), and
- a loop-carried edge (`carried_by` = the loop, distance 1) when an execution in a later
  iteration of the loop can conflict with one in an earlier iteration, the earlier-iteration
  instruction being the source (checked when the loop closes, over every pair in its body).
  A loop with any such hazard, on one stream or across streams, is not `parallel`.

Overlap is interval arithmetic over the loop ranges (sound: it never misses a conflict); two
accesses without loop dependence whose byte ranges overlap are refined by enumerating their
elements, so interleaved strided slices (a Concat along an inner axis) get no edge.

Near-linear cost: earlier accesses are kept per memory in buckets of byte slices, reads and
writes apart (a read looks only at writes). An access is dropped once a later loop-invariant,
contiguous access covers it: any write covering it, or a read on the same stream covering an
earlier read. Every later hazard on those bytes meets the covering access first and is ordered
behind it through its edge or its stream, so no edge is lost. Nothing is dropped for any other
reason: there is no window.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from onnx2bir.bir.enums import DepKind, MemoryType
from onnx2bir.bir.ir import AccessPattern, Dependency, Instruction, Loop, MemoryLocation

BUCKET_BYTES = 8192  # on-chip accesses are indexed by 8 KiB slices of the partition
DRAM_BUCKETS = 64  # a DRAM location is indexed by at most this many slices
ENUMERATE_LIMIT = 1 << 15  # elements per access up to which overlap is decided exactly
_PRECEDENCE = {DepKind.FLOW: 0, DepKind.OUTPUT: 1, DepKind.ANTI: 2, DepKind.ORDERED: 3}


@dataclass(frozen=True, slots=True)
class LoopRange:
    start: int
    last: int
    step: int

    @property
    def varies(self) -> bool:
        return self.last > self.start


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
    exact: bool  # static and dense: `box` is exactly the bytes touched
    ap: AccessPattern
    itemsize: int
    box: tuple[int, int]  # first and last byte over every iteration


def _dense(ap: AccessPattern) -> bool:
    dims = sorted((abs(stride), count) for stride, count in ap.pattern if count > 1)
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
    low = sum(min(stride * (count - 1), 0) for stride, count in ap.pattern) * size
    high = sum(max(stride * (count - 1), 0) for stride, count in ap.pattern) * size + size - 1
    terms = tuple((axis, coef * size) for axis, coef in ap.offset_terms if coef)
    first, last = base + low, base + high
    for axis, coef in terms:
        loop = loops[axis]
        first += min(coef * loop.start, coef * loop.last)
        last += max(coef * loop.start, coef * loop.last)
    static = not any(loops[axis].varies for axis, _ in terms)
    dense = _dense(ap)
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
        (first, last),
    )


@dataclass(slots=True)
class _Record:
    """One instruction as the analysis sees it."""

    inst: Instruction
    stream: str
    loopnest: tuple[str, ...]
    footprints: list[Footprint]
    position: int  # program order
    since: int  # the first position its accesses may drop


def _range(coef: int, loop: LoopRange) -> tuple[int, int]:
    a, b = coef * loop.start, coef * loop.last
    return (a, b) if a <= b else (b, a)


def _may_overlap(
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
    if early.box[0] > late.box[1] or late.box[0] > early.box[1]:
        return False
    low = high = late.base - early.base
    coefs_late, coefs_early = dict(late.terms), dict(early.terms)
    for axis in coefs_late.keys() | coefs_early.keys():
        c_late, c_early = coefs_late.get(axis, 0), coefs_early.get(axis, 0)
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
        first, last = late.box
        lo = np.searchsorted(a, first - early.itemsize + 1, side="left")
        return bool(lo < len(a) and a[lo] <= last)
    b = _starts(late, loops, cache)
    if b is None:
        return True
    # an element of b at s meets an element of a at t when t - b.size < s < t + a.size
    lo = np.searchsorted(b, a - late.itemsize + 1, side="left")
    hi = np.searchsorted(b, a + early.itemsize, side="left")
    return bool(np.any(hi > lo))


def _kind(early_writes: bool, late_writes: bool) -> DepKind:
    if early_writes:
        return DepKind.OUTPUT if late_writes else DepKind.FLOW
    return DepKind.ANTI


def _shared(a: tuple[str, ...], b: tuple[str, ...]) -> tuple[str, ...]:
    n = 0
    while n < len(a) and n < len(b) and a[n] == b[n]:
        n += 1
    return a[:n]


class DependencyTracker:
    """Computes `deps` of each instruction as it is emitted, in program order."""

    def __init__(self) -> None:
        self.loops: dict[str, LoopRange] = {}
        self._writes: dict[tuple[str, int], dict[int, tuple[_Record, Footprint]]] = {}
        self._reads: dict[tuple[str, int], dict[int, tuple[_Record, Footprint]]] = {}
        self._bucket_bytes: dict[str, int] = {}
        self._next_entry = 0
        self._position = 0
        self._bodies: list[list[_Record]] = []  # per open counted loop, its records so far
        self._never_runs = 0  # open loops with no iteration
        self._open: list[list] = []  # per open loop: [loop, opened, counted]
        self._unconfirmed = 0
        self._starts: dict[int, tuple[Footprint, np.ndarray | None]] = {}

    # --- loops -------------------------------------------------------------------------------
    def define_axis(self, axis: str, start: int, last: int, step: int) -> None:
        self.loops[axis] = LoopRange(start, max(start, last), step)

    def open_loop(self, loop: Loop) -> None:
        self.define_axis(loop.axis, loop.start, loop.last_value, loop.step)
        self._bodies.append([])
        self._open.append([loop, self._position, False])
        self._unconfirmed += 1
        if loop.trip_count == 0:
            self._never_runs += 1

    def close_loop(self, loop: Loop) -> bool:
        """Add the loop-carried edges of `loop`'s body; True when it has a carried hazard."""
        body = self._bodies.pop()
        if not self._open.pop()[2]:
            self._unconfirmed -= 1
        if loop.trip_count == 0:
            self._never_runs -= 1
        if self._bodies:
            self._bodies[-1].extend(body)
        if loop.trip_count < 2:
            return False
        hazard = False
        for i, early in enumerate(body):
            for late in body[i:]:
                kind = self._carried(early, late, loop.axis)
                if kind is None:
                    continue
                hazard = True
                # `late` in an earlier iteration precedes `early` in a later one
                if late.stream != early.stream:
                    _add_edge(early.inst, late.inst.id, kind, loop.axis)
        return hazard

    def _carried(self, early: _Record, late: _Record, axis: str) -> DepKind | None:
        shared = _shared(early.loopnest, late.loopnest)
        level = shared.index(axis)
        found = None
        for fe in early.footprints:
            for fl in late.footprints:
                if not (fe.is_write or fl.is_write):
                    continue
                if _may_overlap(fe, fl, shared, level, +1, self.loops, self._starts):
                    kind = _kind(fl.is_write, fe.is_write)
                    if found is None or _PRECEDENCE[kind] < _PRECEDENCE[found]:
                        found = kind
        return found

    # --- instructions ------------------------------------------------------------------------
    def add(self, inst: Instruction, locations: dict[str, MemoryLocation]) -> None:
        """Compute `inst.deps` from earlier accesses, then record the instruction's own."""
        footprints = [
            footprint(ap, locations[ap.loc], is_write, self.loops)
            for ap, is_write in inst.accesses()
            if all(count > 0 for _, count in ap.pattern) and ap.loc in locations
        ]
        for entry in self._open:
            if not entry[2] and _holds(entry[0], inst):
                entry[2] = True
                self._unconfirmed -= 1
        since = 0
        if self._never_runs or self._unconfirmed:
            since = next(o[1] for o in reversed(self._open) if o[0].trip_count == 0 or not o[2])
        record = _Record(inst, inst.stream, inst.loopnest, footprints, self._position, since)
        self._position += 1
        edges: dict[int, DepKind] = {}
        stream = record.stream
        keys_of = {id(fp): self._keys(fp, locations) for fp in footprints}
        for fp in footprints:
            tables = (self._writes, self._reads) if fp.is_write else (self._writes,)
            first_p, last_p = fp.first_partition, fp.last_partition
            first_b, last_b = fp.box
            seen: set[int] = set()
            for key in keys_of[id(fp)]:
                for table in tables:
                    bucket = table.get(key)
                    if not bucket:
                        continue
                    for entry_id, (earlier, efp) in bucket.items():
                        if (
                            earlier.stream == stream
                            or efp.first_partition > last_p
                            or first_p > efp.last_partition
                            or efp.box[0] > last_b
                            or first_b > efp.box[1]
                            or entry_id in seen
                        ):
                            continue
                        seen.add(entry_id)
                        source = earlier.inst.id
                        kind = _kind(efp.is_write, fp.is_write)
                        known = edges.get(source)
                        if known is not None and _PRECEDENCE[known] <= _PRECEDENCE[kind]:
                            continue
                        # Two loop-invariant contiguous accesses overlap exactly as their boxes.
                        if not (efp.exact and fp.exact) and not self._forward(
                            earlier, efp, record, fp
                        ):
                            continue
                        edges[source] = kind
        inst.deps = [Dependency(source, kind) for source, kind in sorted(edges.items())]
        for fp in footprints:
            self._record(record, fp, keys_of[id(fp)])
        if self._bodies:
            self._bodies[-1].append(record)

    def _forward(self, early: _Record, efp: Footprint, late: _Record, lfp: Footprint) -> bool:
        shared = _shared(early.loopnest, late.loopnest)
        if _may_overlap(efp, lfp, shared, len(shared), 0, self.loops, self._starts):
            return True
        return any(
            self.loops[shared[level]].varies
            and _may_overlap(efp, lfp, shared, level, -1, self.loops, self._starts)
            for level in range(len(shared))
        )

    def _keys(self, fp: Footprint, locations: dict[str, MemoryLocation]) -> list[tuple[str, int]]:
        size = self._bucket_bytes.get(fp.memory)
        if size is None:
            size = BUCKET_BYTES
            if fp.memory.startswith("DRAM:"):
                loc = locations[fp.ap.loc]
                nbytes = loc.num_elements * loc.dtype.itemsize
                size = max(4096, -(-nbytes // DRAM_BUCKETS))
            self._bucket_bytes[fp.memory] = size
        first, last = max(fp.box[0], 0) // size, max(fp.box[1], 0) // size
        return [(fp.memory, b) for b in range(first, last + 1)]

    def _record(self, record: _Record, fp: Footprint, keys: list[tuple[str, int]]) -> None:
        if fp.exact:
            first_b, last_b = fp.box
            first_p, last_p = fp.first_partition, fp.last_partition
            # Drop what this access covers (see the module docstring).
            for table, same_stream_only in ((self._writes, False), (self._reads, False)):
                if not fp.is_write:
                    if table is self._writes:
                        continue
                    same_stream_only = True
                for key in keys:
                    bucket = table.get(key)
                    if not bucket:
                        continue
                    doomed = [
                        entry_id
                        for entry_id, (earlier, efp) in bucket.items()
                        if first_b <= efp.box[0]
                        and efp.box[1] <= last_b
                        and first_p <= efp.first_partition
                        and efp.last_partition <= last_p
                        and (not same_stream_only or earlier.stream == record.stream)
                        and earlier.position >= record.since
                    ]
                    for entry_id in doomed:
                        del bucket[entry_id]
        table = self._writes if fp.is_write else self._reads
        entry_id = self._next_entry
        self._next_entry += 1
        for key in keys:
            table.setdefault(key, {})[entry_id] = (record, fp)


def _holds(loop: Loop, inst: Instruction) -> bool:
    items = loop.body.items
    while items and isinstance(items[-1], Loop):
        items = items[-1].body.items
    return bool(items) and items[-1] is inst


def _add_edge(inst: Instruction, source: int, kind: DepKind, axis: str) -> None:
    for i, dep in enumerate(inst.deps):
        if dep.source == source and dep.carried_by == axis:
            if _PRECEDENCE[kind] < _PRECEDENCE[dep.kind]:
                inst.deps[i] = Dependency(source, kind, axis, 1)
            return
    inst.deps.append(Dependency(source, kind, axis, 1))
