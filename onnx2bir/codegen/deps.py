"""Dependency edges from buffer overlap, the `dep_edges_for_inst` step of the finalizer.

Every engine and every DMA queue runs its own in-order stream (`Instruction.stream`); only
the edges computed here order one stream against another (docs/dependencies.md#analysis).
For each pair of instructions on different streams whose accesses can overlap in bytes, one
of them writing, the later one gets an edge from the earlier: Flow (read after write),
Output (write after write) or Anti (write after read). Pairs on one stream need no edge: the
stream orders them. Where two accesses can meet is `bir/overlap.py` `may_overlap`, per relation
of their loop iterations, so a loop body gets:

- a plain edge when the earlier instruction's execution can conflict with a later-or-equal
  iteration of the later one (checked when the later instruction is added), and
- a loop-carried edge (`carried_by` = the loop, distance 1) when an execution in a later
  iteration of the loop can conflict with one in an earlier iteration, the earlier-iteration
  instruction being the source (checked when the loop closes, over every pair in its body).
  A loop with any such hazard, on one stream or across streams, is not `parallel`.

Near-linear cost: earlier accesses are kept per memory in buckets of byte slices, reads and
writes apart (a read looks only at writes). An access is dropped once a later access covers
it and every later conflict with it is ordered behind it through the covering access
(docs/dependencies.md#pruning):

- a loop-invariant contiguous write drops everything inside it, a loop-invariant contiguous
  read on the same stream the earlier reads inside it;
- when a counted loop closes, a write in its body that moves with the loop drops every access
  recorded before the loop opened inside the bytes it spans over the loop, unless the dropped
  access moves with a loop still open.

Either way the covering access must run after what it drops: one inside a loop that may run
no trip (a runtime loop, which the analysis sees as two trips, or a loop of no trip) drops
only what was recorded since the innermost such loop opened.

The pruning leaves out only edges that other edges and the streams imply: the order over every
execution is the same as without it. Nothing is dropped for any other reason: no window.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from onnx2bir.bir.enums import DepKind
from onnx2bir.bir.ir import Dependency, Instruction, Loop, MemoryLocation
from onnx2bir.bir.overlap import Footprint, LoopRange, footprint, may_overlap, shared_loops

BUCKET_BYTES = 8192  # on-chip accesses are indexed by 8 KiB slices of the partition
DRAM_BUCKETS = 16  # a DRAM location is indexed by at most this many slices
_PRECEDENCE = {DepKind.FLOW: 0, DepKind.OUTPUT: 1, DepKind.ANTI: 2, DepKind.ORDERED: 3}

# An entry: its stream, first and last partition, first and last byte, record and footprint
# (the fields every scan compares, unpacked once).
Entry = tuple[str, int, int, int, int, "_Record", Footprint]
Table = dict[tuple[str, int], dict[int, Entry]]


@dataclass(slots=True)
class _Record:
    """One instruction as the analysis sees it."""

    inst: Instruction
    stream: str
    loopnest: tuple[str, ...]
    footprints: list[Footprint]
    position: int  # program order
    # The first position its accesses may drop: where the innermost loop open when it was
    # added that may run no trip (a runtime loop, or one of no trip) opened; else 0.
    since: int


@dataclass(slots=True)
class _OpenLoop:
    loop: Loop
    opened: int  # the position of the first instruction in it
    body: list[_Record] = field(default_factory=list)  # its records so far, nested ones too
    # Its instructions land in `loop.body`. The two-trip view of a runtime loop (DynamicFor,
    # DoWhile) is a Loop of its own whose body stays empty: its trips may be none.
    counted: bool = False


def _kind(early_writes: bool, late_writes: bool) -> DepKind:
    if early_writes:
        return DepKind.OUTPUT if late_writes else DepKind.FLOW
    return DepKind.ANTI


def _holds(loop: Loop, inst: Instruction) -> bool:
    """Is `inst`, just emitted, in `loop`'s body (directly or in loops nested in it)?"""
    items = loop.body.items
    while items and isinstance(items[-1], Loop):
        items = items[-1].body.items
    return bool(items) and items[-1] is inst


class DependencyTracker:
    """Computes `deps` of each instruction as it is emitted, in program order.

    The code generator places an instruction in its block before calling `add`, and opens a
    counted loop with the Loop it places in the function (a runtime loop with a two-trip view
    of its own); that is how a loop is known to be counted.
    """

    def __init__(self) -> None:
        self.loops: dict[str, LoopRange] = {}
        self._writes: Table = {}
        self._reads: Table = {}
        self._bucket_bytes: dict[str, int] = {}
        self._next_entry = 0
        self._position = 0
        self._open: list[_OpenLoop] = []
        self._never_runs = 0  # open loops with no iteration
        self._unconfirmed = 0  # open loops not (yet) known to be counted
        self._starts: dict[int, tuple[Footprint, np.ndarray | None]] = {}
        self._edges: dict[tuple[int, DepKind], Dependency] = {}

    # --- loops -------------------------------------------------------------------------------
    def define_axis(self, axis: str, start: int, last: int, step: int) -> None:
        self.loops[axis] = LoopRange(start, max(start, last), step)

    def open_loop(self, loop: Loop) -> None:
        self.define_axis(loop.axis, loop.start, loop.last_value, loop.step)
        self._open.append(_OpenLoop(loop, self._position))
        self._unconfirmed += 1
        if loop.trip_count == 0:
            self._never_runs += 1

    def close_loop(self, loop: Loop) -> bool:
        """Add the loop-carried edges of `loop`'s body; True when it has a carried hazard."""
        closed = self._open.pop()
        body = closed.body
        if not closed.counted:
            self._unconfirmed -= 1
        if loop.trip_count == 0:
            self._never_runs -= 1
        if self._open:
            self._open[-1].body.extend(body)
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
        self._drop_under_loop(body, loop.axis, closed.opened)
        return hazard

    def _carried(self, early: _Record, late: _Record, axis: str) -> DepKind | None:
        shared = shared_loops(early.loopnest, late.loopnest)
        level = shared.index(axis)
        found = None
        for fe in early.footprints:
            for fl in late.footprints:
                if not (fe.is_write or fl.is_write):
                    continue
                if may_overlap(fe, fl, shared, level, +1, self.loops, self._starts):
                    kind = _kind(fl.is_write, fe.is_write)
                    if found is None or _PRECEDENCE[kind] < _PRECEDENCE[found]:
                        found = kind
        return found

    # --- instructions ------------------------------------------------------------------------
    def add(self, inst: Instruction, locations: dict[str, MemoryLocation]) -> None:
        """Compute `inst.deps` from earlier accesses, then record the instruction's own."""
        if self._unconfirmed:
            for open_loop in self._open:
                if not open_loop.counted and _holds(open_loop.loop, inst):
                    open_loop.counted = True
                    self._unconfirmed -= 1
        footprints = [
            footprint(ap, locations[ap.loc], is_write, self.loops)
            for ap, is_write in inst.accesses()
            if all(count > 0 for _, count in ap.pattern) and ap.loc in locations
        ]
        since = 0
        if self._never_runs or self._unconfirmed:
            since = next(
                o.opened for o in reversed(self._open) if o.loop.trip_count == 0 or not o.counted
            )
        record = _Record(inst, inst.stream, inst.loopnest, footprints, self._position, since)
        self._position += 1
        edges: dict[int, DepKind] = {}
        stream = record.stream
        keys_of = {id(fp): self._keys(fp, locations) for fp in footprints}
        for fp in footprints:
            tables = (self._writes, self._reads) if fp.is_write else (self._writes,)
            first_p, last_p = fp.first_partition, fp.last_partition
            first_b, last_b = fp.first_byte, fp.last_byte
            seen: set[int] = set()
            for key in keys_of[id(fp)]:
                for table in tables:
                    bucket = table.get(key)
                    if not bucket:
                        continue
                    for entry_id, (other, p0, p1, b0, b1, earlier, efp) in bucket.items():
                        if (
                            other == stream
                            or p0 > last_p
                            or first_p > p1
                            or b0 > last_b
                            or first_b > b1
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
        inst.deps = [self._plain(source, kind) for source, kind in sorted(edges.items())]
        for fp in footprints:
            self._record(record, fp, keys_of[id(fp)])
        if self._open:
            self._open[-1].body.append(record)

    def _plain(self, source: int, kind: DepKind) -> Dependency:
        """The plain edge from `source` of `kind`, one shared value for every instruction
        that has it (a Dependency is immutable)."""
        dep = self._edges.get((source, kind))
        if dep is None:
            dep = self._edges[source, kind] = Dependency(source, kind)
        return dep

    def _forward(self, early: _Record, efp: Footprint, late: _Record, lfp: Footprint) -> bool:
        shared = shared_loops(early.loopnest, late.loopnest)
        if may_overlap(efp, lfp, shared, len(shared), 0, self.loops, self._starts):
            return True
        return any(
            self.loops[shared[level]].varies
            and may_overlap(efp, lfp, shared, level, -1, self.loops, self._starts)
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
        first, last = max(fp.first_byte, 0) // size, max(fp.last_byte, 0) // size
        return [(fp.memory, b) for b in range(first, last + 1)]

    # --- pruning (docs/dependencies.md#pruning) ----------------------------------------------
    def _record(self, record: _Record, fp: Footprint, keys: list[tuple[str, int]]) -> None:
        if fp.exact:
            # A loop-invariant contiguous write drops everything inside it; such a read, the
            # earlier reads inside it on its stream.
            if fp.is_write:
                self._drop_inside(fp, keys, self._writes, record.since)
                self._drop_inside(fp, keys, self._reads, record.since)
            else:
                self._drop_inside(fp, keys, self._reads, record.since, stream=record.stream)
        table = self._writes if fp.is_write else self._reads
        entry_id = self._next_entry
        self._next_entry += 1
        entry = (
            record.stream,
            fp.first_partition,
            fp.last_partition,
            fp.first_byte,
            fp.last_byte,
            record,
            fp,
        )
        for key in keys:
            table.setdefault(key, {})[entry_id] = entry

    def _drop_under_loop(self, body: list[_Record], axis: str, opened: int) -> None:
        """Drop what the writes moving with the closing loop `axis` cover (see the module
        docstring): accesses recorded before `opened` inside the span of such a write."""
        still_open = {o.loop.axis for o in self._open if self.loops[o.loop.axis].varies}
        for record in body:
            since = record.since
            if since >= opened:
                continue
            inner = record.loopnest[record.loopnest.index(axis) :]
            for fp in record.footprints:
                if not fp.is_write or fp.static:
                    continue
                moving = [a for a, _ in fp.terms if self.loops[a].varies]
                if axis not in moving or any(a not in inner for a in moving):
                    continue  # dropped at the close of the loop it moves with outermost
                keys = self._box_keys(fp)
                for table in (self._writes, self._reads):
                    self._drop_inside(fp, keys, table, since, opened, still_open=still_open)

    def _box_keys(self, fp: Footprint) -> list[tuple[str, int]]:
        size = self._bucket_bytes[fp.memory]
        first, last = max(fp.first_byte, 0) // size, max(fp.last_byte, 0) // size
        return [(fp.memory, b) for b in range(first, last + 1)]

    def _drop_inside(
        self,
        fp: Footprint,
        keys: list[tuple[str, int]],
        table: Table,
        since: int,
        before: int | None = None,
        stream: str | None = None,
        still_open: frozenset[str] | set[str] = frozenset(),
    ) -> None:
        """Drop the entries of `table` inside `fp`'s partitions and box recorded at `since`
        or later (and before `before`), on `stream` if given, that move with no loop of
        `still_open`."""
        first_b, last_b = fp.first_byte, fp.last_byte
        first_p, last_p = fp.first_partition, fp.last_partition
        for key in keys:
            bucket = table.get(key)
            if not bucket:
                continue
            doomed = [
                entry_id
                for entry_id, (other, p0, p1, b0, b1, earlier, efp) in bucket.items()
                if first_b <= b0
                and b1 <= last_b
                and first_p <= p0
                and p1 <= last_p
                and since <= earlier.position
                and (before is None or earlier.position < before)
                and (stream is None or other == stream)
                and not (still_open and any(a in still_open for a, _ in efp.terms))
            ]
            for entry_id in doomed:
                del bucket[entry_id]


def _add_edge(inst: Instruction, source: int, kind: DepKind, axis: str) -> None:
    for i, dep in enumerate(inst.deps):
        if dep.source == source and dep.carried_by == axis:
            if _PRECEDENCE[kind] < _PRECEDENCE[dep.kind]:
                inst.deps[i] = Dependency(source, kind, axis, 1)
            return
    inst.deps.append(Dependency(source, kind, axis, 1))
