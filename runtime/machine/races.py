"""A happens-before race detector for BIR executed on concurrent streams.

In: a `Program` (the unrolled function with its vector clocks, `runtime/machine/program.py`) and the
`Machine` it runs on. The executor calls `check(i)` after running instance i. Out: `races`,
one `Race` per pair of instructions found racing (the first byte range seen for that pair).

Method (docs/dependencies.md#race-detector), the one of ThreadSanitizer's FastTrack: every
byte that instructions write carries a shadow word, the instance that wrote it last, and
slots for the instances that read it since (one slot per mutually unordered reader; a reader
ordered after the one in a slot replaces it). A read is checked against the last write, a
write against the last write and every read slot; instance a is ordered before instance b
when b's clock has seen a (`clock[b][stream(a)] >= epoch(a)`). Anything else is a race.
Shadows cover SBUF and PSUM up to the highest byte any location uses, and the DRAM locations
some instruction writes (a location nothing writes cannot race). Views into the shadow are
built from the same access patterns the machine uses, one shadow word per unit of each
element, the unit being the largest size dividing every element size and tile address in
that memory (4 bytes in an fp32-only SBUF, 1 byte once an int8 tile exists), so tiles of
different dtypes that share bytes are compared exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from onnx2bir.bir.enums import MemoryType
from onnx2bir.bir.ir import AccessPattern, Instruction, MemoryLocation, all_loops
from onnx2bir.bir.predicates import leading_extent, narrow
from onnx2bir.runtime.machine.program import Program

MAX_RACES = 100  # distinct instruction pairs recorded; the count goes on


@dataclass(frozen=True, slots=True)
class RaceSide:
    id: int
    opcode: str
    stream: str
    node: str
    rule: str
    access: str  # "read" or "write"
    loop_values: tuple[tuple[str, int], ...]

    def describe(self) -> str:
        where = "".join(f" {axis}={value}" for axis, value in self.loop_values)
        return (
            f"instruction {self.id} {self.opcode} on {self.stream} ({self.access}; node "
            f"{self.node!r}, rule {self.rule!r}{';' + where if where else ''})"
        )

    def to_json(self) -> dict:
        return {
            "id": self.id,
            "opcode": self.opcode,
            "stream": self.stream,
            "node": self.node,
            "rule": self.rule,
            "access": self.access,
            "loop_values": dict(self.loop_values),
        }


@dataclass(frozen=True, slots=True)
class Race:
    first: RaceSide  # the earlier of the two in program order
    second: RaceSide
    memory: str  # DRAM, SB or PSUM
    location: str  # the location the second instruction named
    partitions: tuple[int, int] | None  # first and last partition (SB/PSUM)
    byte_range: tuple[int, int]  # first and last byte: of the location (DRAM) or partition

    @property
    def pair(self) -> tuple[int, int]:
        return self.first.id, self.second.id

    def message(self) -> str:
        if self.partitions is None:
            where = f"DRAM {self.location!r} bytes [{self.byte_range[0]}, {self.byte_range[1]}]"
        else:
            where = (
                f"{self.memory} ({self.location!r}) partitions [{self.partitions[0]}, "
                f"{self.partitions[1]}] bytes [{self.byte_range[0]}, {self.byte_range[1]}]"
            )
        return (
            f"race: {self.first.describe()} and {self.second.describe()} are unordered on {where}"
        )

    def to_json(self) -> dict:
        return {
            "first": self.first.to_json(),
            "second": self.second.to_json(),
            "memory": self.memory,
            "location": self.location,
            "partitions": None if self.partitions is None else list(self.partitions),
            "bytes": list(self.byte_range),
            "message": self.message(),
        }


class _Shadow:
    """Last writer and read slots of one memory (flat, row by row), one word per `unit`
    bytes: the largest size that divides every element size and address in the memory, so
    that every element covers whole units and two accesses share a unit exactly when they
    share a byte."""

    def __init__(self, rows: int, row_bytes: int, unit: int) -> None:
        self.rows, self.row_bytes, self.unit = rows, row_bytes, unit
        self.words = rows * (row_bytes // unit)
        self.last_write = np.full(self.words, -1, dtype=np.int32)
        self.reads: list[np.ndarray] = []

    def new_slot(self) -> np.ndarray:
        slot = np.full(self.words, -1, dtype=np.int32)
        self.reads.append(slot)
        return slot


@dataclass(frozen=True, slots=True)
class _Geometry:
    shape: tuple[int, ...]
    strides: tuple[int, ...]  # in units of the shadow's row-by-row layout
    offset: int
    unit: int

    def view(self, array: np.ndarray) -> np.ndarray:
        word = array.itemsize
        return np.ndarray(
            self.shape,
            array.dtype,
            array,
            self.offset * word,
            tuple(s * word for s in self.strides),
        )

    def addresses(self, mask: np.ndarray) -> np.ndarray:
        """Byte addresses (row-by-row layout) of the first byte of each masked unit."""
        index = np.nonzero(mask.reshape(self.shape))
        units = self.offset + sum(i * s for i, s in zip(index, self.strides, strict=True))
        return units * self.unit


class RaceDetector:
    def __init__(self, program: Program, limit: int = MAX_RACES) -> None:
        self.program = program
        self.clocks = program.clocks()
        self.stream_of = np.asarray(program.stream_of, dtype=np.int64)
        self.epoch_of = np.asarray(program.epoch_of, dtype=np.int32)
        self.limit = limit
        self.races: list[Race] = []
        self.race_count = 0
        self._pairs: set[tuple[int, int]] = set()
        locations = program.function.memory_locations
        self.locations = locations
        self._counted = {
            loop.axis for loop in all_loops(program.function.entry) if loop.trip_count > 1
        }
        written = {inst.dst.loc for inst in program.function.instructions() if inst.dst is not None}
        self.shadows: dict[str, _Shadow] = {}
        for memory in (MemoryType.SB, MemoryType.PSUM):
            tiles = [loc for loc in locations.values() if loc.memory is memory]
            if tiles:
                rows = max(loc.num_partitions for loc in tiles)
                used = max(loc.address + loc.bytes_per_partition for loc in tiles)
                unit = math.gcd(
                    *(loc.dtype.itemsize for loc in tiles), *(loc.address for loc in tiles)
                )
                unit = math.gcd(unit, used) or 1
                self.shadows[memory.value] = _Shadow(rows, used, unit)
        for name in sorted(written):
            loc = locations.get(name)
            if loc is not None and loc.memory is MemoryType.DRAM:
                size = loc.dtype.itemsize
                self.shadows[f"DRAM:{name}"] = _Shadow(1, loc.num_elements * size, size)

    # --- geometry ----------------------------------------------------------------------------
    def _geometry(
        self, ap: AccessPattern, loc: MemoryLocation, values: dict[str, int]
    ) -> tuple[_Shadow, _Geometry] | None:
        if any(count < 1 for _, count in ap.pattern):
            return None
        key = f"DRAM:{loc.name}" if loc.memory is MemoryType.DRAM else loc.memory.value
        shadow = self.shadows.get(key)
        if shadow is None:
            return None
        size = loc.dtype.itemsize
        unit = shadow.unit
        per = size // unit  # units per element
        element = ap.offset + sum(coef * values[axis] for axis, coef in ap.offset_terms)
        free_shape = tuple(count for _, count in ap.pattern)
        free_strides = tuple(stride * per for stride, _ in ap.pattern)
        if loc.memory is MemoryType.DRAM:
            geometry = _Geometry((*free_shape, per), (*free_strides, 1), element * per, unit)
        else:
            row = shadow.row_bytes // unit
            geometry = _Geometry(
                (ap.num_partitions, *free_shape, per),
                (row, *free_strides, 1),
                ap.partition_start * row + (loc.address + element * size) // unit,
                unit,
            )
        return shadow, geometry

    # --- checking ----------------------------------------------------------------------------
    def check(self, index: int) -> None:
        """Check instance `index` (after it ran) against the accesses before it."""
        program = self.program
        inst = program.instructions[index]
        values = program.loop_values[index]
        clock = self.clocks[index]
        if inst.predicate is not None:  # the bytes it really touches (docs/predicates.md)
            bound = inst.predicate.bound(values)
            if bound <= 0:
                return
            if bound < leading_extent(inst):
                inst = narrow(inst, bound)
        reads = []
        for ap in inst.srcs.values():
            found = self._geometry(ap, self.locations[ap.loc], values)
            if found is None:
                continue
            shadow, geometry = found
            self._against(
                geometry.view(shadow.last_write),
                clock,
                index,
                "write",
                "read",
                ap,
                shadow,
                geometry,
            )
            reads.append((shadow, geometry))
        write = None
        if inst.dst is not None:
            write = self._geometry(inst.dst, self.locations[inst.dst.loc], values)
            if write is not None:
                shadow, geometry = write
                self._against(
                    geometry.view(shadow.last_write),
                    clock,
                    index,
                    "write",
                    "write",
                    inst.dst,
                    shadow,
                    geometry,
                )
                for slot in shadow.reads:
                    self._against(
                        geometry.view(slot),
                        clock,
                        index,
                        "read",
                        "write",
                        inst.dst,
                        shadow,
                        geometry,
                    )
        for shadow, geometry in reads:
            self._record_read(shadow, geometry, clock, index)
        if write is not None:
            shadow, geometry = write
            geometry.view(shadow.last_write)[...] = index
            for slot in shadow.reads:
                geometry.view(slot)[...] = -1

    def _ordered(self, earlier: np.ndarray, clock: np.ndarray) -> bool | np.ndarray:
        """Which of the instances `earlier` (all >= 0) happen before the one with `clock`:
        one bool when the answer is the same for all, else a mask. Bytes mostly share a
        few last accessors, so the test runs once per distinct instance."""
        lo, hi = int(earlier.min()), int(earlier.max())
        if lo == hi:
            return bool(clock[self.stream_of[lo]] >= self.epoch_of[lo])
        ids = np.flatnonzero(np.bincount(earlier - lo)) + lo
        ok = clock[self.stream_of[ids]] >= self.epoch_of[ids]
        if ok.all():
            return True
        if not ok.any():
            return False
        table = np.zeros(hi - lo + 1, dtype=bool)
        table[ids - lo] = ok
        return table[earlier - lo]

    def _against(
        self,
        view: np.ndarray,
        clock: np.ndarray,
        index: int,
        earlier_access: str,
        access: str,
        ap: AccessPattern,
        shadow: _Shadow,
        geometry: _Geometry,
    ) -> None:
        previous = view.reshape(-1)
        last = int(previous.max())
        if last < 0:  # nothing recorded on these bytes
            return
        first = int(previous.min())
        if first == last:  # one instance on every byte: one test
            if clock[self.stream_of[last]] >= self.epoch_of[last]:
                return
            racing = np.ones(previous.shape, dtype=bool)
        else:
            seen = previous >= 0
            ordered = self._ordered(previous[seen] if first < 0 else previous, clock)
            if ordered is True:
                return
            racing = np.zeros(previous.shape, dtype=bool)
            racing[np.flatnonzero(seen)[~np.asarray(ordered)]] = True
        for other in np.unique(previous[racing]):
            self._report(
                int(other),
                index,
                earlier_access,
                access,
                ap,
                shadow,
                geometry,
                racing & (previous == other),
            )

    def _record_read(
        self, shadow: _Shadow, geometry: _Geometry, clock: np.ndarray, index: int
    ) -> None:
        remaining = None
        for slot in shadow.reads:
            view = geometry.view(slot)
            current = np.asarray(view)
            last = int(current.max())
            if last < 0:
                replace = True
            elif int(current.min()) == last:  # one reader in the slot on every byte
                replace = bool(clock[self.stream_of[last]] >= self.epoch_of[last])
                if not replace:
                    replace = np.zeros(current.shape, dtype=bool)
            else:
                held = current >= 0
                ordered = self._ordered(current[held], clock)
                if ordered is True:
                    replace = True
                elif ordered is False:
                    replace = ~held
                else:
                    replace = ~held
                    replace[held] = ordered
            if replace is True:
                if remaining is None:
                    view[...] = index
                else:
                    view[remaining] = index
                return
            if remaining is not None:
                replace &= remaining
            view[replace] = index
            remaining = ~replace if remaining is None else remaining & ~replace
            if not remaining.any():
                return
        view = geometry.view(shadow.new_slot())
        if remaining is None:
            view[...] = index
        else:
            view[remaining] = index

    def _report(
        self,
        other: int,
        index: int,
        other_access: str,
        access: str,
        ap: AccessPattern,
        shadow: _Shadow,
        geometry: _Geometry,
        mask: np.ndarray,
    ) -> None:
        self.race_count += 1
        first, second = sorted(((other, other_access), (index, access)))
        pair = (self.program.instructions[first[0]].id, self.program.instructions[second[0]].id)
        if pair in self._pairs or len(self.races) >= self.limit:
            return
        self._pairs.add(pair)
        addresses = geometry.addresses(mask)
        loc = self.locations[ap.loc]
        if loc.memory is MemoryType.DRAM:
            partitions = None
            byte_range = (int(addresses.min()), int(addresses.max()) + shadow.unit - 1)
        else:
            rows, columns = np.divmod(addresses, shadow.row_bytes)
            partitions = (int(rows.min()), int(rows.max()))
            byte_range = (int(columns.min()), int(columns.max()) + shadow.unit - 1)
        self.races.append(
            Race(
                self._side(*first),
                self._side(*second),
                loc.memory.value,
                loc.name,
                partitions,
                byte_range,
            )
        )

    def _side(self, index: int, access: str) -> RaceSide:
        inst: Instruction = self.program.instructions[index]
        return RaceSide(
            inst.id,
            inst.opcode.value,
            inst.stream,
            inst.origin.node,
            inst.origin.rule,
            access,
            tuple(
                (axis, value)
                for axis, value in sorted(self.program.loop_values[index].items())
                if axis in self._counted
            ),
        )
