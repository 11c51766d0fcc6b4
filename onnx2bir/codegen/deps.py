"""Dependency edges from buffer overlap, the `dep_edges_for_inst` step of the finalizer.

Each access is a region: a memory (one DRAM location, or the whole SBUF or PSUM), a partition
range, and a byte range that covers every loop iteration the access can take. A new
instruction gets a Flow edge from each earlier writer it reads over, an Output edge from each
earlier writer it overwrites, and an Anti edge from each earlier reader it overwrites. On-chip
regions compare physical addresses, so two tiles of different nodes that share SBUF bytes are
ordered, which is what lets the per-node arenas reuse the same addresses.

An earlier access is forgotten once a later write covers it completely: every later hazard
on those bytes then meets that write first and is ordered behind it transitively. Readers of
a buffer that is never rewritten (the identity weight, say) would accumulate without bound, so
each memory slice keeps at most `WINDOW` recent accesses (on-chip accesses are indexed by the
8 KiB slices of the partition they touch, so a new access meets only accesses near it). A
hazard against an access further back than that is not recorded: a known approximation, which
the machine does not depend on (it executes in program order); a scheduler reading these
edges would need the window widened.
"""

from __future__ import annotations

from dataclasses import dataclass

from onnx2bir.bir.enums import DepKind, MemoryType
from onnx2bir.bir.ir import AccessPattern, Dependency, Instruction, MemoryLocation

WINDOW = 512
BUCKET_BYTES = 8192  # on-chip accesses are indexed by 8 KiB slices of the partition
_PRECEDENCE = {DepKind.FLOW: 0, DepKind.OUTPUT: 1, DepKind.ANTI: 2, DepKind.ORDERED: 3}


@dataclass(frozen=True, slots=True)
class Region:
    memory: str
    first_partition: int
    last_partition: int
    first_byte: int
    last_byte: int

    def overlaps(self, other: Region) -> bool:
        return (
            self.first_partition <= other.last_partition
            and other.first_partition <= self.last_partition
            and self.first_byte <= other.last_byte
            and other.first_byte <= self.last_byte
        )

    def covers(self, other: Region) -> bool:
        return (
            self.first_partition <= other.first_partition
            and other.last_partition <= self.last_partition
            and self.first_byte <= other.first_byte
            and other.last_byte <= self.last_byte
        )


def region_of(
    ap: AccessPattern, loc: MemoryLocation, axis_ranges: dict[str, tuple[int, int]]
) -> Region:
    first, last = ap.element_span(axis_ranges)
    size = loc.dtype.itemsize
    if loc.memory is MemoryType.DRAM:
        return Region(f"DRAM:{loc.name}", 0, 0, first * size, (last + 1) * size - 1)
    base = loc.address
    return Region(
        loc.memory.value,
        ap.partition_start,
        ap.partition_start + ap.num_partitions - 1,
        base + first * size,
        base + (last + 1) * size - 1,
    )


def _buckets(region: Region) -> list[tuple[str, int]]:
    """The bucket keys a region touches: one per DRAM tensor, 8 KiB slices of SBUF/PSUM."""
    if region.memory.startswith("DRAM:"):
        return [(region.memory, 0)]
    return [
        (region.memory, b)
        for b in range(region.first_byte // BUCKET_BYTES, region.last_byte // BUCKET_BYTES + 1)
    ]


class DependencyTracker:
    def __init__(self) -> None:
        self._accesses: dict[tuple[str, int], list[tuple[int, bool, Region]]] = {}

    def add(
        self,
        inst: Instruction,
        locations: dict[str, MemoryLocation],
        axis_ranges: dict[str, tuple[int, int]],
    ) -> None:
        """Compute `inst.deps` from earlier accesses, then record the instruction's own."""
        edges: dict[int, DepKind] = {}
        regions = [
            (region_of(ap, locations[ap.loc], axis_ranges), is_write)
            for ap, is_write in inst.accesses()
        ]
        for region, is_write in regions:
            for bucket in _buckets(region):
                for source, was_write, earlier in self._accesses.get(bucket, ()):
                    if not (was_write or is_write) or not region.overlaps(earlier):
                        continue
                    if was_write:
                        kind = DepKind.OUTPUT if is_write else DepKind.FLOW
                    else:
                        kind = DepKind.ANTI
                    known = edges.get(source)
                    if known is None or _PRECEDENCE[kind] < _PRECEDENCE[known]:
                        edges[source] = kind
        inst.deps = [Dependency(source, kind) for source, kind in sorted(edges.items())]
        for region, is_write in regions:
            for bucket in _buckets(region):
                entries = self._accesses.setdefault(bucket, [])
                if is_write:
                    entries[:] = [entry for entry in entries if not region.covers(entry[2])]
                entries.append((inst.id, is_write, region))
                if len(entries) > WINDOW:
                    del entries[: len(entries) - WINDOW]
