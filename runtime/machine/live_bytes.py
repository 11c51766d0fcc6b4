"""The live-bytes check: no write lands in bytes of another on-chip location still in use.

In: a Function. Out: a `LiveBytes` whose `before(ins, loop_values)` the machine calls before it
executes each instruction instance (`interpreter._run`, `schedule.run_scheduled`); it raises a
MachineError when the instance would write SBUF or PSUM bytes that belong to another location
that is live (docs/buffers.md#live-bytes).

A location is live from the first executed write into it until the last instance of each of
its readers has run, in the order the machine executes (program order, or a schedule's order).
While live, it holds the bytes its writers of this life have written and its still-pending
readers read: a write elsewhere in its allocation is no conflict, which keeps the check free
of false alarms under any order the dependency edges allow. Tiles of different nodes share
bytes (each node's arena starts where the previous one started), so the check is what makes
that sharing safe on the machine rather than by construction.

Precomputed from the function once:

- per on-chip location, its box (partitions and bytes of each partition);
- per location, its readers: each reading instruction's reach over every value of its loops
  (kept element-exact when the read does not move with a loop), and how many of its instances
  make up one life. When every access of the location lies inside a loop that runs more than
  once (a static loop of several trips, a DynamicFor, a DoWhile), the location lives once per
  iteration of the innermost such loop: the count is the reader's instances in one iteration
  and a write to the dead location starts a new life, in which each reader owes `count` more
  instances (a schedule that interleaves a parallel loop's iterations may have run some of
  them already; they count). Otherwise the count is all of the reader's instances (the
  product of the trip counts around it) and the location lives once;
- per instruction, the on-chip location it writes and the locations it reads.

At run time the check keeps, per live location, its pending readers and a region: the box of
the bytes its readers of this life read, set when the life starts and dropped when the last of
them is done (in between it may cover readers already done: what a write is compared with
exactly is each pending reader's own reach). Regions are indexed by the 2 KiB byte buckets of
their memory that they cover (`_RegionIndex`). A written location asks the index which live
boxes overlap its allocation, which costs a few set lookups however many locations are live;
only when a live box overlaps does it compare this instance's written bytes with each pending
reader's reach (element by element for an exact reach).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from onnx2bir.bir.ir import BasicBlock, DoWhile, DynamicLoop, Function, Instruction, Loop
from onnx2bir.runtime.machine.machine import instruction_error


@dataclass(frozen=True, slots=True)
class Box:
    """Bytes [first, stop) of partitions [p_first, p_stop) of one on-chip memory."""

    memory: str
    p_first: int
    p_stop: int
    first: int
    stop: int

    def meets(self, other: Box) -> bool:
        return (
            self.memory == other.memory
            and self.first < other.stop
            and other.first < self.stop
            and self.p_first < other.p_stop
            and other.p_first < self.p_stop
        )

    def union(self, other: Box | None) -> Box:
        if other is None:
            return self
        return Box(
            self.memory,
            min(self.p_first, other.p_first),
            max(self.p_stop, other.p_stop),
            min(self.first, other.first),
            max(self.stop, other.stop),
        )


@dataclass(frozen=True, slots=True)
class _Reader:
    """One instruction reading a location: the bytes it reaches (over every loop value), and
    how many of its instances make up one life of the location."""

    ins: Instruction
    box: Box
    count: int
    aps: tuple  # its access patterns on the location
    path: tuple  # the loops around it, outermost first

    @property
    def ranges(self) -> dict[str, range] | None:
        """Values of the loops that move its accesses (None: a runtime loop moves them)."""
        return _moves(self.aps, self.path)


class LiveBytes:
    """Call `before(ins, loop_values)` before each executed instance (docs/buffers.md)."""

    def __init__(self, function: Function) -> None:
        on_chip = [loc for loc in function.memory_locations.values() if loc.on_chip]
        self.boxes = {
            loc.name: Box(
                loc.memory.value,
                0,
                loc.num_partitions,
                loc.address,
                loc.address + loc.bytes_per_partition,
            )
            for loc in on_chip
        }
        self.itemsize = {loc.name: loc.dtype.itemsize for loc in on_chip}
        self.readers, self.repeats, self.writers = _readers(function, self.boxes, self.itemsize)
        reads: dict[int, list[tuple[str, int]]] = {}
        for name, readers in self.readers.items():
            for reader in readers.values():
                reads.setdefault(reader.ins.id, []).append((name, reader.count))
        self.actions: dict[int, tuple[str | None, tuple[tuple[str, int], ...]]] = {}
        for ins in function.instructions():
            dst = ins.dst.loc if ins.dst is not None and ins.dst.loc in self.boxes else None
            done = tuple(reads.get(ins.id, ()))
            if dst is not None or done:
                self.actions[ins.id] = (dst, done)
        self.pending: dict[str, set[int]] = {}  # live location -> readers still to finish
        self.regions: dict[str, Box] = {}  # live location -> the bytes its pending readers read
        self.started: set[str] = set()
        self.runs: dict[int, int] = {}
        self.index = _RegionIndex()
        self._exact_keys: dict[tuple[str, int], np.ndarray | None] = {}
        self.written: dict[str, set[int]] = {}  # live location -> its writers run in this life
        self.lives: dict[str, int] = {}  # lives each location has started

    def before(self, ins: Instruction, loop_values: dict[str, int]) -> None:
        action = self.actions.get(ins.id)
        if action is None:
            return
        dst, reads = action
        if reads:  # its reads happen before its write lands
            runs = self.runs[ins.id] = self.runs.get(ins.id, 0) + 1
            for name, count in reads:
                pending = self.pending.get(name)
                if pending and ins.id in pending and runs >= count * self.lives[name]:
                    pending.discard(ins.id)
                    if not pending:  # dead; until then its region stays a covering box
                        self._reshape(name)
        if dst is None:
            return
        if ins.predicate is not None and ins.predicate.bound(loop_values) <= 0:
            return  # a padding trip of a predicated loop: the instruction does not run
        if (
            not self.pending.get(dst)
            and self.readers.get(dst)  # a location nothing reads is never live
            and (dst not in self.started or self.repeats[dst])
        ):
            # A new life: each reader owes `count` more instances. Under a schedule that
            # interleaves a parallel loop's iterations, some may have run already.
            self.started.add(dst)
            lives = self.lives[dst] = self.lives.get(dst, 0) + 1
            self.pending[dst] = {
                r
                for r, reader in self.readers[dst].items()
                if self.runs.get(r, 0) < reader.count * lives
            }
            self.written[dst] = set()
            self._reshape(dst)
        written = self.written.get(dst)
        if written is not None:
            written.add(ins.id)
        live = self.index.meeting(self.boxes[dst], dst, self.regions)
        if live:
            self._check_instance(ins, loop_values, live)

    def _reshape(self, name: str) -> None:
        """The location's pending readers changed: recompute the bytes it holds."""
        pending, readers = self.pending[name], self.readers[name]
        region = None
        if pending:
            boxes = [readers[reader_id].box for reader_id in pending]
            region = Box(
                boxes[0].memory,
                min(box.p_first for box in boxes),
                max(box.p_stop for box in boxes),
                min(box.first for box in boxes),
                max(box.stop for box in boxes),
            )
        old = self.regions.get(name)
        if region == old:
            return
        if old is not None:
            del self.regions[name]
            self.index.remove(name, old)
        if region is not None:
            self.regions[name] = region
            self.index.add(name, region)

    def _exact(self, name: str, reader: _Reader) -> np.ndarray | None:
        """The (partition, byte) keys `reader` reads of `name` over all its loop values, or
        None when a runtime loop moves them or there are too many (its box stands)."""
        key = (name, reader.ins.id)
        if key in self._exact_keys:
            return self._exact_keys[key]
        keys, ranges = None, reader.ranges
        if ranges is not None:
            combos = 1
            for values in ranges.values():
                combos *= len(values)
            size = sum(ap.free_size * ap.num_partitions for ap in reader.aps)
            if combos * size * self.itemsize[name] <= EXACT_LIMIT:
                axes = list(ranges)
                parts = []
                for values in itertools.product(*ranges.values()):
                    env = dict(zip(axes, values, strict=True))
                    for ap in reader.aps:
                        offset = ap.offset + sum(c * env[a] for a, c in ap.offset_terms)
                        parts.append(_keys(ap, offset, self.boxes[name].first, self.itemsize[name]))
                keys = np.unique(np.concatenate(parts))
                # Only the location's own bytes: an access beyond them can only belong to a
                # trip a predicate skips (the padding trips of a rotated loop), since every
                # access that runs is checked in bounds.
                box = self.boxes[name]
                inside = ((keys & 0xFFFFFFFF) >= box.first) & ((keys & 0xFFFFFFFF) < box.stop)
                keys = keys[inside]
        self._exact_keys[key] = keys
        return keys

    def _held(self, name: str) -> np.ndarray | None:
        """The keys the writers of `name` run in this life reach (None: not enumerable)."""
        parts = []
        for writer_id in self.written.get(name, ()):
            keys = self._exact(name, self.writers[name][writer_id])
            if keys is None:
                return None
            parts.append(keys)
        return np.unique(np.concatenate(parts)) if parts else np.zeros(0, np.int64)

    def _check_instance(self, ins: Instruction, loop_values: dict[str, int], live: list[str]):
        """Compare the bytes this instance writes with what each pending reader reads."""
        ap = ins.dst
        itemsize = self.itemsize[ap.loc]
        offset = ap.offset + sum(coef * loop_values.get(axis, 0) for axis, coef in ap.offset_terms)
        below, above = ap.pattern_reach
        base = self.boxes[ap.loc].first
        first = base + (offset + below) * itemsize
        stop = base + (offset + above + 1) * itemsize
        p_first, p_stop = ap.partition_start, ap.partition_start + ap.num_partitions
        written = Box(self.boxes[ap.loc].memory, p_first, p_stop, first, stop)
        keys = None
        for name in live:
            for reader_id in sorted(self.pending[name]):
                reader = self.readers[name][reader_id]
                if not reader.box.meets(written):
                    continue
                # Only bytes this life has written and a pending reader reads are live.
                exact = self._exact(name, reader)
                if exact is not None:
                    if keys is None:
                        keys = _keys(ap, offset, base, itemsize)
                    shared = np.intersect1d(keys, exact, assume_unique=True)
                    if not shared.size:
                        continue
                    held = self._held(name)
                    if held is not None and not np.intersect1d(shared, held).size:
                        continue
                lo, hi = max(first, reader.box.first), min(stop, reader.box.stop)
                p_lo, p_hi = max(p_first, reader.box.p_first), min(p_stop, reader.box.p_stop)
                raise instruction_error(
                    ins,
                    f"writes {written.memory} bytes [{lo}, {hi}) of partitions [{p_lo}, {p_hi}) "
                    f"through {ap.loc!r}, but those bytes belong to {name!r}, which is still "
                    f"live: instruction {reader.ins.id} {reader.ins.opcode} (node "
                    f"{reader.ins.origin.node!r}) reads them later (docs/buffers.md#live-bytes)",
                )


class _RegionIndex:
    """The live regions by the byte buckets they cover in their memory: which regions may meet
    a box is a union of a few sets instead of a scan over every live location."""

    BUCKET_BYTES = 2048  # a PSUM bank; an SBUF partition row is 96 of them

    def __init__(self) -> None:
        self.buckets: dict[tuple[str, int], set[str]] = {}

    def _keys(self, box: Box):
        first, last = box.first // self.BUCKET_BYTES, (box.stop - 1) // self.BUCKET_BYTES
        return [(box.memory, bucket) for bucket in range(first, last + 1)]

    def add(self, name: str, box: Box) -> None:
        for key in self._keys(box):
            self.buckets.setdefault(key, set()).add(name)

    def remove(self, name: str, box: Box) -> None:
        for key in self._keys(box):
            self.buckets[key].discard(name)

    def meeting(self, box: Box, other_than: str, regions: dict[str, Box]) -> list[str]:
        """The live locations, other than `other_than`, whose region meets `box`, sorted."""
        candidates: set[str] = set()
        for key in self._keys(box):
            names = self.buckets.get(key)
            if names:
                candidates |= names
        candidates.discard(other_than)
        return sorted(n for n in candidates if regions[n].meets(box))


def _keys(ap, offset: int, base: int, itemsize: int) -> np.ndarray:
    """Sorted unique (partition, byte) keys an access touches with its first element at
    element `offset` of its location (which starts at byte `base`)."""
    starts = np.array([offset], dtype=np.int64)
    for stride, count in ap.pattern:
        starts = (starts[:, None] + stride * np.arange(count, dtype=np.int64)[None, :]).ravel()
    addresses = (base + starts[:, None] * itemsize + np.arange(itemsize)[None, :]).ravel()
    partitions = np.arange(ap.partition_start, ap.partition_start + ap.num_partitions)
    return np.unique((partitions[:, None] << 32) + addresses[None, :])


EXACT_LIMIT = 1 << 22  # (partition, byte) keys up to which a reader's reads are enumerated


def _readers(
    function: Function, boxes: dict[str, Box], itemsize: dict[str, int]
) -> tuple[dict[str, dict[int, _Reader]], dict[str, bool], dict[str, dict[int, _Reader]]]:
    """Per on-chip location: its readers, whether its life repeats with the iterations of a
    loop (see `LiveBytes`), and its writers."""
    paths: dict[int, tuple[Loop, ...]] = {}  # per instruction id, its enclosing loops
    accesses: dict[str, tuple[Loop, ...]] = {}  # per location, the loops around every access
    reading: dict[str, dict[int, list]] = {}  # location -> reader id -> [ins, box, aps]
    writing: dict[str, dict[int, list]] = {}  # location -> writer id -> [ins, box, aps]

    def walk(block: BasicBlock, path: tuple[Loop, ...]) -> None:
        for item in block.items:
            if isinstance(item, Loop):
                walk(item.body, (*path, item))
                continue
            paths[item.id] = path
            if item.dst is not None and item.dst.loc in boxes:
                box = _reach(item.dst, boxes, itemsize, path)
                writing.setdefault(item.dst.loc, {})[item.id] = [item, box, [item.dst]]
            for ap, _ in item.accesses():
                if ap.loc in boxes:
                    known = accesses.get(ap.loc)
                    accesses[ap.loc] = path if known is None else _common(known, path)
            for ap in item.srcs.values():
                if ap.loc not in boxes:
                    continue
                box = _reach(ap, boxes, itemsize, path)
                entry = reading.setdefault(ap.loc, {}).get(item.id)
                if entry is None:
                    reading[ap.loc][item.id] = [item, box, [ap]]
                else:  # two operands on one location: keep their union
                    entry[1] = box.union(entry[1])
                    entry[2].append(ap)

    walk(function.entry, ())
    readers: dict[str, dict[int, _Reader]] = {}
    repeats: dict[str, bool] = {}
    for name, found in reading.items():
        common = accesses[name]
        repeats[name] = any(
            isinstance(loop, DynamicLoop | DoWhile) or loop.trip_count > 1 for loop in common
        )
        readers[name] = {}
        for reader_id, (ins, box, aps) in found.items():
            count = 1
            for loop in paths[reader_id][len(common) :]:  # between the common loops and it
                if count is None or isinstance(loop, DynamicLoop | DoWhile):
                    count = None
                else:
                    count *= loop.trip_count
            if count == 0:
                continue  # it never runs
            if count is None:  # a runtime loop between: done with each of its instances
                count, repeats[name] = 1, True
            readers[name][reader_id] = _Reader(ins, box, count, tuple(aps), paths[reader_id])
    writers = {
        name: {
            writer_id: _Reader(ins, box, 1, tuple(aps), paths[writer_id])
            for writer_id, (ins, box, aps) in found.items()
        }
        for name, found in writing.items()
    }
    return readers, repeats, writers


def _moves(aps, path: tuple[Loop, ...]) -> dict[str, range] | None:
    """The values of the loops in `path` that move `aps` (None when a runtime loop does)."""
    axes = {axis for ap in aps for axis, _ in ap.offset_terms}
    ranges: dict[str, range] = {}
    for loop in path:
        if loop.axis in axes:
            if isinstance(loop, DynamicLoop | DoWhile):
                return None
            ranges[loop.axis] = range(loop.start, loop.stop, loop.step)
    return ranges


def _common(a: tuple[Loop, ...], b: tuple[Loop, ...]) -> tuple[Loop, ...]:
    n = 0
    while n < len(a) and n < len(b) and a[n] is b[n]:
        n += 1
    return a[:n]


def check_before(machine, ins: Instruction, loop_values: dict[str, int]) -> None:
    """The interpreter's hook: run the machine's live-bytes check, if it has one."""
    live = getattr(machine, "live_bytes", None)
    if live is not None:
        live.before(ins, loop_values)


def _reach(ap, boxes: dict[str, Box], itemsize: dict[str, int], path: tuple[Loop, ...]) -> Box:
    """The bytes `ap` reaches over every value of the loops in `path` (its whole location
    when a runtime loop's axis moves it)."""
    whole = boxes[ap.loc]
    ranges = {loop.axis: loop for loop in path}
    low = high = ap.offset
    for axis, coef in ap.offset_terms:
        loop = ranges.get(axis)
        if loop is None or isinstance(loop, DynamicLoop | DoWhile):
            return whole
        a, b = coef * loop.start, coef * loop.last_value
        low, high = low + min(a, b), high + max(a, b)
    below, above = ap.pattern_reach
    size = itemsize[ap.loc]
    first = whole.first + (low + below) * size
    stop = whole.first + (high + above + 1) * size
    p_first = ap.partition_start
    # Clipped to the location: what lies beyond is reached only by trips a predicate skips.
    first, stop = max(first, whole.first), min(stop, whole.stop)
    return Box(whole.memory, p_first, p_first + ap.num_partitions, first, max(first, stop))
