"""The live-bytes check: no write lands in bytes of another on-chip location still in use.

In: a Function. Out: a `LiveBytes` whose `before(ins, loop_values)` the machine calls before it
executes each instruction instance (`interpreter._run`, `schedule.run_scheduled`); it raises a
MachineError when the instance would write SBUF or PSUM bytes that belong to another location
that is live (docs/buffers.md#live-bytes).

A location is live from the first executed write into it until the last executed read of it:
the last instance of its last reader in program order. Tiles of different nodes share bytes
(each node's arena starts where the previous one started), so the check is what makes that
sharing safe on the machine rather than by construction.

Everything that can be is precomputed from the function once:

- per on-chip location, its box (partitions and bytes of a partition);
- per location, the instance that ends its life: its last reader in program order, and how many
  instances of it end a life. When every access of the location lies inside a loop that runs
  more than once (a static loop of several trips, a DynamicFor, a DoWhile), the location lives
  once per iteration of the innermost such loop: the count is the reader's instances in one
  iteration (the trip counts between that loop and the reader), a life ends at every multiple
  of it and the next write starts a new one. Otherwise the count is all the reader's
  instances (the product of the trip counts around it) and the location lives once;
- per instruction, the location it writes (on chip) and the locations whose life its instances
  end.

At run time the check keeps the set of live locations and a version number that changes when
the set does. For a written location it caches which live locations its box overlaps, so an
instance costs a dict lookup and, for a first write or the instance that ends a life, a set
update; only when a live location's box overlaps does it compare this instance's written
bytes with that box. There is no per-byte work.
"""

from __future__ import annotations

from dataclasses import dataclass

from onnx2bir.bir.ir import BasicBlock, DoWhile, DynamicLoop, Function, Instruction, Loop

from .machine import instruction_error


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
class _Ending:
    """The instance that ends a location's life: instance `count` of instruction `reader`;
    with `per_trip`, every `count`-th instance, and a later write starts a new life."""

    reader: Instruction
    count: int
    per_trip: bool


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
        order, last_read, self.write_boxes = _readers(function, self.boxes, self.itemsize)
        self.endings: dict[str, _Ending] = {}
        for name, (position, count, per_trip) in last_read.items():
            self.endings[name] = _Ending(order[position], count, per_trip)
        kills: dict[int, list[tuple[str, int, bool]]] = {}
        for name, ending in self.endings.items():
            kills.setdefault(ending.reader.id, []).append((name, ending.count, ending.per_trip))
        self.actions: dict[int, tuple[str | None, tuple[tuple[str, int, bool], ...]]] = {}
        for ins in function.instructions():
            dst = ins.dst.loc if ins.dst is not None and ins.dst.loc in self.boxes else None
            ends = tuple(kills.get(ins.id, ()))
            if dst is not None or ends:
                self.actions[ins.id] = (dst, ends)
        self.live: set[str] = set()
        self.started: set[str] = set()
        self.ended: set[str] = set()
        self.runs: dict[int, int] = {}
        self.version = 0
        self._overlaps: dict[str, tuple[int, list[str]]] = {}
        # Per location, the bytes its executed writes reach (over every loop value): what a
        # live location holds. Grown on each writing instruction's first run.
        self.regions: dict[str, Box] = {}
        self._grown: set[int] = set()

    def before(self, ins: Instruction, loop_values: dict[str, int]) -> None:
        action = self.actions.get(ins.id)
        if action is None:
            return
        dst, ends = action
        if ends:  # its reads happen before its write lands
            runs = self.runs[ins.id] = self.runs.get(ins.id, 0) + 1
            for name, count, per_trip in ends:
                if runs == count or per_trip and runs % count == 0:
                    self.ended.add(name)
                    if name in self.live:
                        self.live.discard(name)
                        self.version += 1
        if dst is None:
            return
        if dst not in self.live and (
            dst not in self.started or dst in self.ended and self.endings[dst].per_trip
        ):
            self.started.add(dst)
            if dst in self.endings and (dst not in self.ended or self.endings[dst].per_trip):
                self.ended.discard(dst)
                self.live.add(dst)
                self.version += 1
        if ins.id not in self._grown:
            self._grown.add(ins.id)
            grown = self.write_boxes[ins.id].union(self.regions.get(dst))
            if grown != self.regions.get(dst):
                self.regions[dst] = grown
                self.version += 1
        cached = self._overlaps.get(dst)
        if cached is None or cached[0] != self.version:
            box = self.boxes[dst]
            cached = (
                self.version,
                sorted(
                    n
                    for n in self.live
                    if n != dst and n in self.regions and self.regions[n].meets(box)
                ),
            )
            self._overlaps[dst] = cached
        if cached[1]:
            self._check_instance(ins, loop_values, cached[1])

    def _check_instance(self, ins: Instruction, loop_values: dict[str, int], live: list[str]):
        """Compare the bytes this instance writes with each overlapping live location."""
        ap = ins.dst
        itemsize = self.itemsize[ap.loc]
        offset = ap.offset + sum(coef * loop_values.get(axis, 0) for axis, coef in ap.offset_terms)
        reaches = [stride * (count - 1) for stride, count in ap.pattern]
        first = self.boxes[ap.loc].first + (offset + sum(r for r in reaches if r < 0)) * itemsize
        stop = self.boxes[ap.loc].first + (offset + sum(r for r in reaches if r > 0) + 1) * itemsize
        p_first, p_stop = ap.partition_start, ap.partition_start + ap.num_partitions
        for name in live:
            other = self.regions[name]
            if first < other.stop and other.first < stop:
                ending = self.endings[name]
                lo, hi = max(first, other.first), min(stop, other.stop)
                p_lo, p_hi = max(p_first, other.p_first), min(p_stop, other.p_stop)
                if p_lo >= p_hi:
                    continue
                raise instruction_error(
                    ins,
                    f"writes {other.memory} bytes [{lo}, {hi}) of partitions "
                    f"[{p_lo}, {p_hi}) through {ap.loc!r}, but those "
                    f"bytes belong to {name!r}, which is still live: instruction "
                    f"{ending.reader.id} {ending.reader.opcode} (node "
                    f"{ending.reader.origin.node!r}) reads it later (docs/buffers.md#live-bytes)",
                )


def _readers(
    function: Function, boxes: dict[str, Box], itemsize: dict[str, int]
) -> tuple[list[Instruction], dict[str, tuple[int, int, bool]], dict[int, Box]]:
    """Instructions in program order; per on-chip location its last reader's position, how
    many instances of that reader end the location's life, and whether the life repeats with
    the iterations of a loop (see `LiveBytes`); per instruction writing on chip, the bytes its
    writes reach over every value of its loops."""
    order: list[Instruction] = []
    write_boxes: dict[int, Box] = {}
    paths: list[tuple[Loop, ...]] = []  # per instruction, its enclosing loops, outermost first
    accesses: dict[str, tuple[Loop, ...]] = {}  # per location, the loops around every access
    last: dict[str, int] = {}

    def walk(block: BasicBlock, path: tuple[Loop, ...]) -> None:
        for item in block.items:
            if isinstance(item, Loop):
                walk(item.body, (*path, item))
                continue
            position = len(order)
            order.append(item)
            paths.append(path)
            if item.dst is not None and item.dst.loc in boxes:
                write_boxes[item.id] = _reach(item.dst, boxes, itemsize, path)
            for ap, _ in item.accesses():
                if ap.loc in boxes:
                    known = accesses.get(ap.loc)
                    accesses[ap.loc] = path if known is None else _common(known, path)
            for ap in item.srcs.values():
                if ap.loc in boxes:
                    last[ap.loc] = position

    walk(function.entry, ())
    endings: dict[str, tuple[int, int, bool]] = {}
    for name, position in last.items():
        common = accesses[name]
        inner = paths[position][len(common) :]  # loops between the common ones and the reader
        count = 1
        for loop in inner:
            count = (
                None
                if count is None or isinstance(loop, DynamicLoop | DoWhile)
                else (count * loop.trip_count)
            )
        if count == 0:
            continue  # the reader never runs
        repeats = any(
            isinstance(loop, DynamicLoop | DoWhile) or loop.trip_count > 1 for loop in common
        )
        if count is None:  # a runtime loop between: end with each instance of the reader
            count, repeats = 1, True
        endings[name] = (position, count, repeats)
    return order, endings, write_boxes


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
    reaches = [stride * (count - 1) for stride, count in ap.pattern]
    size = itemsize[ap.loc]
    first = whole.first + (low + sum(r for r in reaches if r < 0)) * size
    stop = whole.first + (high + sum(r for r in reaches if r > 0) + 1) * size
    p_first = ap.partition_start
    return Box(whole.memory, p_first, p_first + ap.num_partitions, first, stop)


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
