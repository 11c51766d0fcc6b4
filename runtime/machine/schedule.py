"""Execution orders of a BIR function on concurrent streams, and running one of them.

In: a Module, input arrays, a schedule spec and whether to check races. Out: the outputs, and
the races found (`run_scheduled`).

Schedules (docs/dependencies.md#schedules):
- `program`: every instance in program order, the order the plain interpreter uses.
- `random:SEED`: the iterations of every `parallel` loop in a seeded random order, then a
  seeded random interleaving of the streams: at each step one stream is picked at random among
  those whose next instance has every predecessor done (its stream predecessor and the sources
  of its edges, `runtime/machine/program.py`); nothing else orders them.
- `timeline`: the order in which a list schedule with the cost model's per-instruction costs
  (`runtime/timing/cost.py`) starts the instances: each starts when its stream is free and its edge
  sources have finished, every loop iteration scheduled in full; ties keep program order.

Every schedule respects each stream's order and every edge, and permutes only iterations the
verifier proved independent (`bir/parallel.py`), so a race-free program computes bit-identical
outputs under all of them.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from onnx2bir.bir.ir import Module, runtime_loops
from onnx2bir.errors import MachineError, UserError
from onnx2bir.gc_pause import no_cyclic_gc
from onnx2bir.runtime.machine.blas import one_blas_thread
from onnx2bir.runtime.machine.interpreter import _select, load_machine, record_trips, semantics_for
from onnx2bir.runtime.machine.live_bytes import check_before
from onnx2bir.runtime.machine.program import Program, unroll
from onnx2bir.runtime.machine.races import Race, RaceDetector
from onnx2bir.runtime.timing.cost import instruction_cost

SCHEDULE_HELP = "program | random:SEED | timeline"


@dataclass(frozen=True, slots=True)
class Schedule:
    kind: str  # program, random, timeline
    seed: int | None = None

    def __str__(self) -> str:
        return f"random:{self.seed}" if self.kind == "random" else self.kind


def parse_schedule(text: str) -> Schedule:
    """`program`, `random:SEED` (SEED a non-negative integer) or `timeline`."""
    if text in ("program", "timeline"):
        return Schedule(text)
    kind, sep, seed = text.partition(":")
    if kind == "random" and sep and seed.isdigit():
        return Schedule("random", int(seed))
    raise UserError(f"--schedule {text!r}: expected {SCHEDULE_HELP}")


def order(program: Program, schedule: Schedule) -> list[int]:
    """The instance indices in the order `schedule` runs them."""
    if schedule.kind == "program":
        return list(range(len(program)))
    if schedule.kind == "random":
        return _random_order(program, np.random.default_rng(schedule.seed))
    return _timeline_order(program)


def _random_order(program: Program, rng: np.random.Generator) -> list[int]:
    waiting = [len(preds) for preds in program.preds]
    successors: list[list[int]] = [[] for _ in range(len(program))]
    for i, preds in enumerate(program.preds):
        for p in preds:
            successors[p].append(i)
    ready = [i for i, count in enumerate(waiting) if count == 0]
    result = []
    while ready:
        pick = int(rng.integers(len(ready)))
        ready[pick], ready[-1] = ready[-1], ready[pick]
        i = ready.pop()
        result.append(i)
        for s in successors[i]:
            waiting[s] -= 1
            if waiting[s] == 0:
                ready.append(s)
    if len(result) != len(program):  # cannot happen: predecessors come earlier
        raise MachineError("the dependency edges form a cycle")
    return result


def _timeline_order(program: Program) -> list[int]:
    function = program.function
    seconds: dict[int, float] = {}
    finish = [0.0] * len(program)
    starts = []
    for i, inst in enumerate(program.instructions):
        cost = seconds.get(inst.id)
        if cost is None:
            cost = seconds[inst.id] = instruction_cost(inst, function)[1]
        start = max((finish[p] for p in program.preds[i]), default=0.0)
        finish[i] = start + cost
        starts.append((start, i))
    heapq.heapify(starts)
    return [i for _, i in sorted(starts)]


@dataclass
class ScheduledRun:
    outputs: dict[str, np.ndarray]
    races: list[Race] | None  # None when not checked
    race_count: int
    instances: int
    streams: list[str]


def run_scheduled(
    module: Module,
    inputs: dict[str, np.ndarray],
    schedule: Schedule,
    check_races: bool,
    function_name: str | None = None,
    observer: Callable | None = None,
    before: dict | None = None,
) -> ScheduledRun:
    """Run one function of `module` in the order `schedule` gives, checking races if asked.

    `before` ({instruction: hook(machine, instruction, loop_values)}, as the interpreter takes
    it) is allowed in program order only: a hook that reads a tensor relies on every earlier
    instruction having run."""
    if before and schedule.kind != "program":
        raise ValueError("before-hooks need the program order")
    function = _select(module, function_name)
    trips = None
    if next(runtime_loops(function.entry), None) is not None:
        # Runtime loops: their trip counts come from a run in program order first. A program
        # whose counts depended on the schedule would race on the values that decide them.
        trips = record_trips(module, inputs, function_name)
    machine = load_machine(module, function, inputs)
    # A random schedule also reorders the iterations of parallel loops (a second stream of
    # the seed's numbers, so the interleaving draws stay those of the seed).
    permute = np.random.default_rng([schedule.seed, 1]) if schedule.kind == "random" else None
    program = unroll(function, trips, permute)
    detector = RaceDetector(program) if check_races else None
    run = {inst.id: semantics_for(inst) for inst in function.instructions()}
    for inst, hook in (before or {}).items():
        run[inst.id] = _hooked(hook, run[inst.id])
    with np.errstate(all="ignore"), one_blas_thread(), no_cyclic_gc():
        for i in order(program, schedule):
            inst = program.instructions[i]
            values = program.loop_values[i]
            check_before(machine, inst, values)
            run[inst.id](machine, inst, values)
            if detector is not None:
                detector.check(i)
            if observer is not None:
                observer(inst, values)
    outputs = {name: machine.read(name) for name in function.outputs}
    if detector is None:
        return ScheduledRun(outputs, None, 0, len(program), program.streams)
    return ScheduledRun(outputs, detector.races, detector.race_count, len(program), program.streams)


def _hooked(hook, semantics):
    def step(machine, inst, values) -> None:
        hook(machine, inst, values)
        semantics(machine, inst, values)

    return step
