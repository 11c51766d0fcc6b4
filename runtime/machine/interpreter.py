"""Run a BIR function on the machine model.

In: a Module, input arrays keyed by DRAM location name, optionally a function name and an observer.
Out: the function's output DRAM locations, in their declared shapes.

The entry block runs in program order; a Loop runs its body for axis = start, start + step, ...
< stop, binding the axis in `loop_values` for the access patterns' offset terms (loops nest). Each
instruction runs through the one semantics table,
`onnx2bir.runtime.machine.semantics.SEMANTICS`. Input locations (ExternalInput,
ExternalInputParameter) come from `inputs`, a parameter missing there and Const and
ExternalOutputParameter locations from `module.constants`; every other location
starts as NaN bytes (see `machine.py`). The observer, if any, is called as
observer(instruction, loop_values) after each execution; loop_values is the live dict, so copy
it to keep it. `before` maps chosen instructions to a hook called as hook(machine, instruction,
loop_values) before each of their executions (the verdict's probes read a tensor there,
runtime/machine/probes.py).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from onnx2bir.bir.enums import MemoryKind, MemoryType
from onnx2bir.bir.ir import (
    BasicBlock,
    DoWhile,
    DynamicLoop,
    Function,
    Instruction,
    Loop,
    Module,
    RuntimeValue,
    runtime_loops,
)
from onnx2bir.bir.predicates import leading_extent, narrow
from onnx2bir.errors import MachineError
from onnx2bir.gc_pause import no_cyclic_gc
from onnx2bir.runtime.machine.blas import one_blas_thread
from onnx2bir.runtime.machine.live_bytes import LiveBytes, check_before
from onnx2bir.runtime.machine.machine import SENTINEL_BYTE, Machine, instruction_error
from onnx2bir.runtime.machine.semantics import SEMANTICS

Observer = Callable[[Instruction, dict[str, int]], None]
Hook = Callable[[Machine, Instruction, dict[str, int]], None]
_INPUT_KINDS = (MemoryKind.EXTERNAL_INPUT, MemoryKind.EXTERNAL_INPUT_PARAMETER)
_LOADED_KINDS = (*_INPUT_KINDS, MemoryKind.CONST, MemoryKind.EXTERNAL_OUTPUT_PARAMETER)
_UNBOUND = object()


def run_function(
    module: Module,
    inputs: dict[str, np.ndarray],
    function_name: str | None = None,
    observer: Observer | None = None,
    before: dict[Instruction, Hook] | None = None,
) -> dict[str, np.ndarray]:
    """Run one function of module (the first if unnamed); return copies of its outputs."""
    function = _select(module, function_name)
    machine = load_machine(module, function, inputs)
    execute(machine, function.entry, observer, before)
    return {name: machine.read(name) for name in function.outputs}


def load_machine(module: Module, function: Function, inputs: dict[str, np.ndarray]) -> Machine:
    """A fresh machine for function with its input and constant DRAM locations loaded."""
    locations = function.memory_locations
    unknown = set(inputs) - {n for n, loc in locations.items() if loc.kind in _INPUT_KINDS}
    if unknown:
        raise ValueError(f"inputs {sorted(unknown)} name no input location of {function.name!r}")
    loaded = {
        name
        for name, loc in locations.items()
        if loc.memory is MemoryType.DRAM and loc.kind in _LOADED_KINDS
    }
    machine = Machine(function, loaded)
    with no_cyclic_gc():  # the analysis allocates an object per access (runtime/machine/blas.py)
        machine.live_bytes = LiveBytes(function)  # docs/buffers.md#live-bytes
    # An input or constant nothing writes is read in place: no copy of the weights
    # (docs/simulation_speed.md#loading).
    written = {ins.dst.loc for ins in function.instructions() if ins.dst is not None}
    for loop in runtime_loops(function.entry):  # their locals are reset when they end
        written.update(loop.local_locations)
    for name, loc in locations.items():
        if loc.kind in _INPUT_KINDS:
            if name in inputs:
                values, source = inputs[name], "input"
            elif loc.kind is MemoryKind.EXTERNAL_INPUT_PARAMETER and name in module.constants:
                values, source = module.constants[name], "constant"
            else:
                raise ValueError(f"missing input {name!r} for function {function.name!r}")
        elif loc.kind in (MemoryKind.CONST, MemoryKind.EXTERNAL_OUTPUT_PARAMETER):
            if name not in module.constants:
                raise ValueError(f"module has no payload for constant {name!r}")
            values, source = module.constants[name], "constant"
        else:
            continue
        if loc.memory is not MemoryType.DRAM:
            raise MachineError(f"{source} location {name!r} must be in DRAM, is in {loc.memory}")
        values = np.asarray(values)
        # Inputs must match exactly; a constant payload may be stored flat.
        shape_ok = values.shape == loc.shape or (
            source == "constant" and values.size == loc.num_elements
        )
        if not shape_ok or values.dtype != loc.dtype.numpy:
            raise ValueError(
                f"{source} {name!r} is {values.dtype}{list(values.shape)}, "
                f"location wants {loc.dtype}{list(loc.shape)}"
            )
        machine.load(name, values, share=name not in written)
    for name in function.outputs:
        if name not in locations or locations[name].memory is not MemoryType.DRAM:
            raise ValueError(f"output {name!r} of {function.name!r} is not a DRAM location")
    return machine


def execute(
    machine: Machine,
    block: BasicBlock,
    observer: Observer | None = None,
    before: dict[Instruction, Hook] | None = None,
) -> None:
    """Run block (and the loops nested in it) on machine, in program order."""
    # Hardware raises no floating-point exceptions; NaN and inf just flow through.
    with np.errstate(all="ignore"), one_blas_thread(), no_cyclic_gc():
        _run(_compile(block, before or {}), machine, {}, observer)


def _select(module: Module, function_name: str | None) -> Function:
    if function_name is not None:
        return module.function(function_name)
    if not module.functions:
        raise ValueError(f"module {module.name!r} has no function")
    return module.functions[0]


def _compile(block: BasicBlock, before: dict[Instruction, Hook]) -> list[tuple]:
    """Block items as (semantics, instruction, None) or (None, loop, compiled body)."""
    steps = []
    for item in block.items:
        if isinstance(item, Loop):
            if item.step <= 0:
                raise MachineError(f"loop over {item.axis!r} has step {item.step}, must be > 0")
            runner = _RUNTIME_LOOP_RUNNERS.get(type(item))
            steps.append((runner, item, _compile(item.body, before)))
        else:
            semantics = SEMANTICS.get(item.opcode)
            if semantics is None:
                raise instruction_error(item, "has no semantics")
            if item.predicate is not None:
                semantics = _predicated(semantics)
            if item in before:
                semantics = _hooked(before[item], semantics)
            steps.append((semantics, item, None))
    return steps


def _hooked(hook: Hook, semantics):
    def run(machine: Machine, ins: Instruction, loop_values: dict[str, int]) -> None:
        hook(machine, ins, loop_values)
        semantics(machine, ins, loop_values)

    return run


def _run(
    steps: list[tuple], machine: Machine, loop_values: dict[str, int], observer: Observer | None
) -> None:
    for semantics, item, body in steps:
        if body is None:
            check_before(machine, item, loop_values)
            semantics(machine, item, loop_values)
            if observer is not None:
                observer(item, loop_values)
            continue
        if semantics is not None:  # a runtime-controlled loop
            semantics(item, body, machine, loop_values, observer)
            continue
        axis = item.axis
        outer = loop_values.get(axis, _UNBOUND)
        for value in range(item.start, item.stop, item.step):
            loop_values[axis] = value
            _run(body, machine, loop_values, observer)
        if outer is _UNBOUND:
            loop_values.pop(axis, None)
        else:
            loop_values[axis] = outer


# --- runtime-controlled loops (docs/loops.md) -------------------------------------------------
MAX_RUNTIME_TRIPS = 1 << 20  # a loop whose condition never fails is reported, not run forever


def read_runtime_value(machine: Machine, value: RuntimeValue, axis: str) -> int:
    """LoadTensorToRegister: the integer in element `offset` of a DRAM location."""
    flat = machine.dram.get(value.loc)
    if flat is None:
        raise MachineError(f"loop {axis!r}: runtime value names {value.loc!r}, not a DRAM location")
    if not 0 <= value.offset < flat.size:
        raise MachineError(
            f"loop {axis!r}: runtime value offset {value.offset} outside {value.loc!r} "
            f"[0, {flat.size})"
        )
    scalar = flat[value.offset]
    if np.issubdtype(flat.dtype, np.floating) and not np.isfinite(scalar):
        raise MachineError(f"loop {axis!r}: runtime value {value.loc!r} is {scalar} (unwritten?)")
    return int(scalar)


def _end_region(machine: Machine, names: tuple[str, ...]) -> None:
    """Locations local to a loop region die with it: their bytes become the sentinel again."""
    for name in names:
        flat = machine.dram.get(name)
        if flat is not None:
            flat.view(np.uint8)[...] = SENTINEL_BYTE


def _bind_trips(item: Loop, values, body, machine, loop_values, observer) -> None:
    axis = item.axis
    outer = loop_values.get(axis, _UNBOUND)
    # A trip log (`record_trips`) keeps each runtime loop's trip counts in the order its
    # instances start, for the unrolled schedules (runtime/machine/program.py).
    log = machine.__dict__.get("trip_log")
    if log is not None:
        slot = log.setdefault(id(item), [])
        index = len(slot)
        slot.append(0)
    trips = 0
    for value in values:
        loop_values[axis] = value
        _run(body, machine, loop_values, observer)
        trips += 1
    if log is not None:
        slot[index] = trips
    if outer is _UNBOUND:
        loop_values.pop(axis, None)
    else:
        loop_values[axis] = outer


def record_trips(module: Module, inputs: dict[str, np.ndarray], function_name=None) -> dict:
    """Run the function in program order and return the trip counts of its runtime loops:
    {id(loop): [trips of each instance, in the order the instances start]}."""
    function = _select(module, function_name)
    machine = load_machine(module, function, inputs)
    machine.__dict__["trip_log"] = log = {}
    execute(machine, function.entry)
    return log


def _run_dynamic_for(item: DynamicLoop, body, machine, loop_values, observer) -> None:
    """InstDynamicForLoop: the bound is read once, at loop entry."""
    stop = read_runtime_value(machine, item.stop_value, item.axis)
    if (stop - item.start) // item.step > MAX_RUNTIME_TRIPS:
        raise MachineError(f"loop {item.axis!r}: {stop} trips exceed {MAX_RUNTIME_TRIPS}")
    _bind_trips(item, range(item.start, stop, item.step), body, machine, loop_values, observer)
    _end_region(machine, item.local_locations)


def _run_do_while(item: DoWhile, body, machine, loop_values, observer) -> None:
    """InstDoWhile: test before each trip, or (is_do_while) after each trip."""

    def proceed() -> bool:
        condition = item.continue_condition
        if isinstance(condition, bool):
            return condition
        return read_runtime_value(machine, condition, item.axis) != 0

    def trips():
        trip = 0
        while item.is_do_while and trip == 0 or proceed():
            if trip >= MAX_RUNTIME_TRIPS:
                raise MachineError(
                    f"do-while {item.axis!r}: still running after {MAX_RUNTIME_TRIPS} trips"
                )
            yield trip
            trip += 1

    _bind_trips(item, trips(), body, machine, loop_values, observer)
    _end_region(machine, item.local_locations)


_RUNTIME_LOOP_RUNNERS = {DynamicLoop: _run_dynamic_for, DoWhile: _run_do_while}


def semantics_for(ins: Instruction):
    """The function that executes `ins`: its opcode's semantics, under its predicate if any."""
    semantics = SEMANTICS.get(ins.opcode)
    if semantics is None:
        raise instruction_error(ins, "has no semantics")
    return _predicated(semantics) if ins.predicate is not None else semantics


# --- predicated instructions (docs/predicates.md) ---------------------------------------------
def _predicated(semantics):
    """Run `semantics` under the instruction's predicate: skipped when the bound is ≤ 0, whole
    when it covers the leading dim, else on a narrowed copy (cached per bound)."""

    def run(machine: Machine, ins: Instruction, loop_values: dict[str, int]) -> None:
        try:
            bound = ins.predicate.bound(loop_values)
        except KeyError as exc:
            raise instruction_error(
                ins, f"predicate axis {exc.args[0]!r} is not bound by an enclosing loop"
            ) from None
        if bound <= 0:
            return
        if bound >= leading_extent(ins):
            semantics(machine, ins, loop_values)
            return
        cache = machine.__dict__.setdefault("narrowed", {})
        clone = cache.get((ins, bound))
        if clone is None:
            clone = cache[(ins, bound)] = narrow(ins, bound)
        semantics(machine, clone, loop_values)

    return run
