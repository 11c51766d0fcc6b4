"""Helpers for the race-detector tests: run the detector alone, delete an edge."""

from __future__ import annotations

import numpy as np

from onnx2bir.bir.ir import Dependency, Function
from onnx2bir.runtime.program import unroll
from onnx2bir.runtime.races import RaceDetector


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


def necessary_edges(function: Function) -> list[tuple[int, Dependency]]:
    """(target id, dependency) of every edge that some execution needs: at one instance of
    its target, the two instances touch a common byte (one writing) and the other
    predecessors do not already order the source instance first."""
    program = unroll(function)
    clocks = program.clocks()
    locations = function.memory_locations
    found: dict[tuple[int, Dependency], None] = {}
    for index, (preds, reasons) in enumerate(zip(program.preds, program.reasons, strict=True)):
        for k, (pred, dep) in enumerate(zip(preds, reasons, strict=True)):
            if dep is None or (program.instructions[index].id, dep) in found:
                continue
            others = [p for j, p in enumerate(preds) if j != k]
            stream = program.stream_of[pred]
            covered = any(clocks[p][stream] >= program.epoch_of[pred] for p in others)
            if not covered and _conflict(program, pred, index, locations):
                found[(program.instructions[index].id, dep)] = None
    return list(found)


def _bytes(ap, values: dict[str, int], locations) -> tuple[str, int, int, np.ndarray]:
    """(memory, first partition, partition stop, sorted byte addresses) of one access."""
    loc = locations[ap.loc]
    size = loc.dtype.itemsize
    offset = ap.offset + sum(coef * values[axis] for axis, coef in ap.offset_terms)
    starts = np.array([offset], dtype=np.int64)
    for stride, count in ap.pattern:
        starts = (starts[:, None] + stride * np.arange(count, dtype=np.int64)[None, :]).ravel()
    addresses = (starts[:, None] * size + np.arange(size)[None, :]).ravel()
    if loc.on_chip:
        memory, first = loc.memory.value, ap.partition_start
        return memory, first, first + ap.num_partitions, np.unique(addresses + loc.address)
    return f"DRAM:{loc.name}", 0, 1, np.unique(addresses)


def _conflict(program, early: int, late: int, locations) -> bool:
    """Do instances `early` and `late` touch a common byte, one of them writing?"""
    a_ins, b_ins = program.instructions[early], program.instructions[late]
    a_values, b_values = program.loop_values[early], program.loop_values[late]
    for ap_a, write_a in a_ins.accesses():
        for ap_b, write_b in b_ins.accesses():
            if not (write_a or write_b) or ap_a.loc not in locations or ap_b.loc not in locations:
                continue
            mem_a, p0_a, p1_a, bytes_a = _bytes(ap_a, a_values, locations)
            mem_b, p0_b, p1_b, bytes_b = _bytes(ap_b, b_values, locations)
            if mem_a != mem_b or p0_a >= p1_b or p0_b >= p1_a:
                continue
            if np.intersect1d(bytes_a, bytes_b, assume_unique=True).size:
                return True
    return False
