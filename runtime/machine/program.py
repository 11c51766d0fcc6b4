"""A BIR function unrolled into its dynamic instructions and the happens-before order on them.

In: a Function. Out: a `Program`: every execution of every instruction ("instance"), in
program order, with its loop values, its stream, and the instances it must follow: the
previous instance on its stream, and for each dependency edge the instance of the source that
the edge names (docs/dependencies.md#edge-semantics):

- a plain edge: the latest instance of the source before this one in program order;
- a loop-carried edge (carried_by = axis, distance = d): the last instance of the source in
  iteration k - d of the same instance of loop `axis`, when this one runs in iteration k
  (none in the first d iterations).

`clocks()` gives each instance's vector clock (one component per stream): a component-wise
maximum over the instances it follows, then its own stream's component set to its position
on that stream. Instance a happens before instance b exactly when
`clock[b][stream(a)] >= epoch(a)`.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from onnx2bir.bir.ir import (
    BasicBlock,
    Dependency,
    DoWhile,
    DynamicLoop,
    Function,
    Instruction,
    Loop,
    runtime_loops,
)
from onnx2bir.errors import MachineError, UserError


@dataclass
class Program:
    function: Function
    instructions: list[Instruction] = field(default_factory=list)  # per instance
    loop_values: list[dict[str, int]] = field(default_factory=list)  # shared per iteration
    streams: list[str] = field(default_factory=list)  # stream names, by index
    stream_of: list[int] = field(default_factory=list)  # per instance
    epoch_of: list[int] = field(default_factory=list)  # position on its stream, from 1
    preds: list[list[int]] = field(default_factory=list)  # instances it must follow
    # Why each of `preds` is there: None for the stream predecessor, else the edge.
    reasons: list[list[Dependency | None]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.instructions)

    def clocks(self) -> np.ndarray:
        """Vector clock of every instance, shape (instances, streams)."""
        clocks = np.zeros((len(self), len(self.streams)), dtype=np.int32)
        for i, preds in enumerate(self.preds):
            row = clocks[i]
            if len(preds) == 1:
                row[:] = clocks[preds[0]]
            elif preds:
                np.maximum.reduce(clocks[preds], axis=0, out=row)
            row[self.stream_of[i]] = self.epoch_of[i]
        return clocks


def unroll(
    function: Function,
    trips: dict[int, list[int]] | None = None,
    permute: np.random.Generator | None = None,
) -> Program:
    """Every instance of `function`'s instructions in program order, with its predecessors.

    A runtime loop (DynamicFor, DoWhile) runs as many trips as `trips` recorded for it
    (`interpreter.record_trips`, one count per instance in the order the instances start).
    With `permute`, the iterations of every loop marked `parallel` come in a random order
    drawn from it — the order a scheduler free to reorder them might pick (docs/dependencies.md
    #parallel-loops); a parallel loop holding a runtime loop keeps its order, the recorded
    trips being per instance in program order."""
    builder = _Builder(function, trips, permute)
    builder.block(function.entry, {})
    return builder.program


class _Builder:
    def __init__(
        self,
        function: Function,
        trips: dict[int, list[int]] | None = None,
        permute: np.random.Generator | None = None,
    ) -> None:
        self.program = Program(function)
        self.trips = trips
        self.permute = permute
        self.trip_index: dict[int, int] = {}
        self.stream_index: dict[str, int] = {}
        self.stream_last: list[int] = []
        self.last: dict[int, int] = {}  # instruction id -> latest instance
        # Per loop axis: the sources of its carried edges, and per open loop instance the
        # last instance of each in its recent iterations (newest last).
        self.carried_sources: dict[str, set[int]] = {}
        self.max_distance: dict[str, int] = {}
        for inst in function.instructions():
            for dep in inst.deps:
                if dep.carried_by is not None:
                    self.carried_sources.setdefault(dep.carried_by, set()).add(dep.source)
                    self.max_distance[dep.carried_by] = max(
                        self.max_distance.get(dep.carried_by, 1), dep.distance
                    )
        self.history: dict[str, deque[dict[int, int]]] = {}
        self.current: dict[str, dict[int, int]] = {}

    def block(self, block: BasicBlock, values: dict[str, int]) -> None:
        for item in block.items:
            if isinstance(item, Loop):
                self.loop(item, values)
            else:
                self.instruction(item, values)

    def loop(self, loop: Loop, values: dict[str, int]) -> None:
        if loop.step <= 0:
            raise MachineError(f"loop over {loop.axis!r} has step {loop.step}, must be > 0")
        axis = loop.axis
        tracked = axis in self.carried_sources
        if tracked:
            self.history[axis] = deque(maxlen=self.max_distance[axis])
        order = self._values(loop)
        if self.permute is not None and loop.parallel and len(order) > 1:
            if next(runtime_loops(loop.body), None) is None:
                order = [order[i] for i in self.permute.permutation(len(order))]
        for value in order:
            inner = dict(values)
            inner[axis] = value
            if tracked:
                self.current[axis] = {}
            self.block(loop.body, inner)
            if tracked:
                self.history[axis].append(self.current.pop(axis))
        if tracked:
            del self.history[axis]

    def _values(self, loop: Loop) -> range:
        if not isinstance(loop, DynamicLoop | DoWhile):
            return range(loop.start, loop.stop, loop.step)
        # Its trips are known only once it has run: take them from the recorded run.
        recorded = (self.trips or {}).get(id(loop))
        index = self.trip_index.get(id(loop), 0)
        if recorded is None or index >= len(recorded):
            raise UserError(
                f"loop {loop.axis!r} runs a number of trips known only at run time "
                f"({type(loop).__name__}) and no recorded run gives it (docs/dependencies.md)"
            )
        self.trip_index[id(loop)] = index + 1
        start = loop.start if isinstance(loop, DynamicLoop) else 0
        return range(start, start + recorded[index] * loop.step, loop.step)

    def instruction(self, inst: Instruction, values: dict[str, int]) -> None:
        program = self.program
        index = len(program.instructions)
        stream = inst.stream
        s = self.stream_index.get(stream)
        if s is None:
            s = self.stream_index[stream] = len(program.streams)
            program.streams.append(stream)
            self.stream_last.append(-1)
        preds, reasons = [], []
        previous = self.stream_last[s]
        if previous >= 0:
            preds.append(previous)
            reasons.append(None)
        for dep in inst.deps:
            if dep.carried_by is None:
                source = self.last.get(dep.source)
            else:
                history = self.history.get(dep.carried_by)
                source = None
                if history is not None and len(history) >= dep.distance:
                    source = history[-dep.distance].get(dep.source)
            if source is not None and source != previous:
                preds.append(source)
                reasons.append(dep)
        program.instructions.append(inst)
        program.loop_values.append(values)
        program.stream_of.append(s)
        program.epoch_of.append(1 if previous < 0 else program.epoch_of[previous] + 1)
        program.preds.append(preds)
        program.reasons.append(reasons)
        self.stream_last[s] = index
        self.last[inst.id] = index
        for axis, current in self.current.items():
            if inst.id in self.carried_sources[axis]:
                current[inst.id] = index
