"""Loops marked `parallel` whose iterations conflict (docs/dependencies.md#parallel-loops).

In: a Function. Out: `ParallelHazard`s — for each loop marked `parallel`, two accesses of its
body, in different iterations, that can touch a common byte with at least one writing (the
first pair found per loop).

A parallel loop's iterations may run in any order, so no iteration may read or overwrite what
another one writes. The test is the dependency analysis's own geometry (`overlap.may_overlap`,
which never misses an overlap): every pair of accesses in the body (nested loops included),
with the enclosing loops at one value for both, and the loop's own axis at a different value
in each — the first access in a later iteration than the second, and the second in a later
iteration than the first. The code generator marks a loop parallel only when this finds nothing
(`codegen/driver.py`); the verifier refuses a parallel loop for which it finds something
(rule `PARALLEL-HAZARD`), such as a loop that accumulates into one PSUM tile in every iteration.
"""

from __future__ import annotations

from dataclasses import dataclass

from onnx2bir.bir.ir import BasicBlock, DoWhile, DynamicLoop, Function, Instruction, Loop
from onnx2bir.bir.overlap import Footprint, LoopRange, footprint, may_overlap, shared_loops
from onnx2bir.bir.rules import cite

RULE = "PARALLEL-HAZARD"


@dataclass(frozen=True, slots=True)
class ParallelHazard:
    axis: str
    first: Instruction  # the earlier of the two in the body
    second: Instruction
    memory: str
    kind: str  # "write/write", "write/read", "read/write" (first's access / second's)

    def message(self) -> str:
        return cite(
            RULE,
            f"loop {self.axis!r} is marked parallel, but instruction {self.first.id} "
            f"{self.first.opcode} (node {self.first.origin.node!r}) and instruction "
            f"{self.second.id} {self.second.opcode} (node {self.second.origin.node!r}) touch "
            f"the same bytes of {self.memory} in different iterations ({self.kind})",
        )


@dataclass(slots=True)
class _Access:
    inst: Instruction
    loopnest: tuple[str, ...]
    footprint: Footprint


def parallel_hazards(fn: Function) -> list[ParallelHazard]:
    """The first conflicting pair of every parallel loop of `fn` (module docstring)."""
    walk = _Walk(fn)
    walk.block(fn.entry, ())
    return walk.hazards


class _Walk:
    def __init__(self, fn: Function) -> None:
        self.locations = fn.memory_locations
        self.loops: dict[str, LoopRange] = {}
        self.hazards: list[ParallelHazard] = []
        self.cache: dict = {}

    def block(self, block: BasicBlock, nest: tuple[str, ...]) -> list[_Access]:
        """The accesses of `block` (nested loops included), after checking its parallel
        loops."""
        accesses: list[_Access] = []
        for item in block.items:
            if isinstance(item, Loop):
                last = item.last_value if item.trip_count else item.start
                if isinstance(item, DynamicLoop | DoWhile):  # trips known at run time
                    last = item.start + item.step
                self.loops[item.axis] = LoopRange(item.start, max(item.start, last), item.step)
                inner = self.block(item.body, (*nest, item.axis))
                if item.parallel and item.trip_count >= 2:
                    self._check(item, inner, len(nest))
                accesses += inner
            else:
                accesses += self._accesses(item, nest)
        return accesses

    def _accesses(self, inst: Instruction, nest: tuple[str, ...]) -> list[_Access]:
        found = []
        for ap, is_write in inst.accesses():
            loc = self.locations.get(ap.loc)
            if loc is None or not all(count > 0 for _, count in ap.pattern):
                continue
            if not all(axis in self.loops for axis, _ in ap.offset_terms):
                continue  # an axis the verifier reports as unknown
            found.append(_Access(inst, nest, footprint(ap, loc, is_write, self.loops)))
        return found

    def _check(self, loop: Loop, accesses: list[_Access], level: int) -> None:
        # Sweep each memory by first byte: only pairs whose whole ranges meet are compared.
        by_memory: dict[str, list[tuple[int, _Access]]] = {}
        for order, access in enumerate(accesses):
            by_memory.setdefault(access.footprint.memory, []).append((order, access))
        for memory, items in by_memory.items():
            items.sort(key=lambda pair: pair[1].footprint.first_byte)
            for i, (order_a, a) in enumerate(items):
                for order_b, b in items[i:]:
                    if b.footprint.first_byte > a.footprint.last_byte:
                        break
                    if not (a.footprint.is_write or b.footprint.is_write):
                        continue
                    early, late = (a, b) if order_a <= order_b else (b, a)
                    if self._conflict(early, late, loop.axis, level):
                        kind = (
                            f"{'write' if early.footprint.is_write else 'read'}/"
                            f"{'write' if late.footprint.is_write else 'read'}"
                        )
                        self.hazards.append(
                            ParallelHazard(loop.axis, early.inst, late.inst, memory, kind)
                        )
                        return

    def _conflict(self, early: _Access, late: _Access, axis: str, level: int) -> bool:
        shared = shared_loops(early.loopnest, late.loopnest)
        if len(shared) <= level or shared[level] != axis:
            return False  # cannot happen: both are in the loop's body
        # Overlap is symmetric: "early in an earlier iteration" is "late in a later one", and the
        # later-iteration form (+1) is the one `may_overlap` decides exactly for strided
        # patterns that move with the loop (a multi-buffered loop's tiles).
        return may_overlap(
            early.footprint, late.footprint, shared, level, +1, self.loops, self.cache
        ) or may_overlap(late.footprint, early.footprint, shared, level, +1, self.loops, self.cache)
