"""Helpers for the race-detector tests: run the detector alone, delete an edge."""

from __future__ import annotations

import numpy as np

from onnx2bir.bir.ir import Dependency, Function
from onnx2bir.bir.predicates import narrow
from onnx2bir.runtime.machine.program import unroll
from onnx2bir.runtime.machine.races import RaceDetector


def detect(function: Function, limit: int = 1000) -> RaceDetector:
    """The detector run over every instance in program order (no semantics: the shadow
    state depends only on which bytes each instance touches)."""
    program = unroll(function)
    detector = RaceDetector(program, limit=limit)
    for index in range(len(program)):
        detector.check(index)
    return detector


def edges(function: Function) -> list[tuple[int, Dependency]]:
    """(target id, dependency) for every cross-stream edge."""
    return [(inst.id, dep) for inst in function.instructions() for dep in inst.deps]


def without(function: Function, target: int, dep: Dependency):
    """Remove one edge in place; returns a function that puts it back."""
    inst = next(i for i in function.instructions() if i.id == target)
    position = inst.deps.index(dep)
    del inst.deps[position]

    def restore() -> None:
        inst.deps.insert(position, dep)

    return restore


_SPACES: dict[str, int] = {}  # one number per memory (SBUF, PSUM) and per DRAM location


def _addresses(inst, values: dict[str, int], locations) -> list[tuple[np.ndarray, bool]]:
    """(byte addresses, is_write) of every operand of one instance: (partition << 32) | byte
    within its memory, DRAM keyed by location, each memory apart."""
    if inst.predicate is not None:
        bound = inst.predicate.bound(values)
        if bound <= 0:
            return []
        inst = narrow(inst, bound)
    found = []
    for ap, is_write in inst.accesses():
        loc = locations[ap.loc]
        if any(count == 0 for _, count in ap.pattern):
            continue
        elements = np.array([ap.offset_at(values)], dtype=np.int64)
        for stride, count in ap.pattern:
            elements = (elements[:, None] + stride * np.arange(count)[None, :]).reshape(-1)
        size = loc.dtype.itemsize
        nbytes = (loc.address + elements[:, None] * size + np.arange(size)[None, :]).reshape(-1)
        if loc.on_chip:
            parts = np.arange(ap.partition_start, ap.partition_start + ap.num_partitions)
            key = str(loc.memory)
        else:
            parts = np.zeros(1, dtype=np.int64)
            key = f"DRAM:{loc.name}"
        space = _SPACES.setdefault(key, len(_SPACES))
        grid = (parts[:, None].astype(np.int64) << 32) | nbytes[None, :]
        found.append((np.unique(grid.reshape(-1) | (space << 48)), is_write))
    return found


def _conflict(a, b) -> bool:
    return any(
        (wa or wb) and np.intersect1d(xa, xb, assume_unique=True).size
        for xa, wa in a
        for xb, wb in b
    )


def necessary_edges(function: Function) -> list[tuple[int, Dependency]]:
    """(target id, dependency) of every edge that some execution needs: at one instance of
    its target, an instance of its source that touches the same bytes (one of them writing)
    is not ordered first by the target's other predecessors (its stream predecessor and its
    other edges)."""
    program = unroll(function)
    clocks = program.clocks()
    locations = function.memory_locations
    instances_of: dict[int, list[int]] = {}
    for index, inst in enumerate(program.instructions):
        instances_of.setdefault(inst.id, []).append(index)
    footprints: dict[int, list] = {}

    def footprint(index: int):
        if index not in footprints:
            footprints[index] = _addresses(
                program.instructions[index], program.loop_values[index], locations
            )
        return footprints[index]

    found: dict[tuple[int, Dependency], None] = {}
    for index, (preds, reasons) in enumerate(zip(program.preds, program.reasons, strict=True)):
        for k, (pred, dep) in enumerate(zip(preds, reasons, strict=True)):
            if dep is None or (program.instructions[index].id, dep) in found:
                continue
            others = [p for j, p in enumerate(preds) if j != k]
            source = program.instructions[pred].id
            for earlier in instances_of[source]:
                if earlier > pred:
                    break
                stream = program.stream_of[earlier]
                if any(clocks[p][stream] >= program.epoch_of[earlier] for p in others):
                    continue
                if _conflict(footprint(earlier), footprint(index)):
                    found[(program.instructions[index].id, dep)] = None
                    break
    return list(found)
