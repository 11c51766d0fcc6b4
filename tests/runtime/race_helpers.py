"""Helpers for the race-detector tests: run the detector alone, delete an edge."""

from __future__ import annotations

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
    its target, the other predecessors do not already order its source instance first."""
    program = unroll(function)
    clocks = program.clocks()
    found: dict[tuple[int, Dependency], None] = {}
    for index, (preds, reasons) in enumerate(zip(program.preds, program.reasons, strict=True)):
        for k, (pred, dep) in enumerate(zip(preds, reasons, strict=True)):
            if dep is None:
                continue
            others = [p for j, p in enumerate(preds) if j != k]
            stream = program.stream_of[pred]
            covered = any(clocks[p][stream] >= program.epoch_of[pred] for p in others)
            if not covered:
                found[(program.instructions[index].id, dep)] = None
    return list(found)
