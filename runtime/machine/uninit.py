"""The uninitialised-read check: no instruction reads bytes nothing wrote, unless it says so.

In: a Module and the function's loaded locations. Out: an observer for
`interpreter.run_function` / `execute` that raises a MachineError naming the first instruction
that reads an element no earlier instruction (nor the loader) wrote, unless the instruction is
marked `can_read_uninit` (docs/predicates.md).

It keeps a shadow of the machine's memories (a second `Machine` over the same function) in
which an element is nonzero once written: the loader's inputs, constants and parameters start
written; after each executed instruction the elements it read are checked and the elements it
wrote are marked. A predicated instruction is checked as it ran (narrowed by its bound).
Element granularity: a read of an element written through a different dtype's view counts as
written if the first byte was marked, which every write in this code generator satisfies.
"""

from __future__ import annotations

import numpy as np

from onnx2bir.bir.enums import PAYLOAD_KINDS, MemoryKind
from onnx2bir.bir.ir import Function, Instruction
from onnx2bir.bir.predicates import leading_extent, narrow
from onnx2bir.errors import MachineError
from onnx2bir.runtime.machine.machine import Machine, instruction_error

_LOADED = PAYLOAD_KINDS | {MemoryKind.EXTERNAL_INPUT}


class UninitChecker:
    """Call `observe(ins, loop_values)` after each executed instruction."""

    def __init__(self, function: Function) -> None:
        self.shadow = Machine(function)
        self.shadow.sbuf[...] = 0
        self.shadow.psum[...] = 0
        for name, flat in self.shadow.dram.items():
            loaded = function.memory_locations[name].kind in _LOADED
            flat.view(np.uint8)[...] = 0
            if loaded:
                flat[...] = 1
        self.checked = 0
        self._narrowed: dict[tuple[Instruction, int], Instruction] = {}

    def observe(self, ins: Instruction, loop_values: dict[str, int]) -> None:
        ran = self._as_run(ins, loop_values)
        if ran is None:
            return
        operands = self.shadow.operands(ran)
        if not ins.can_read_uninit:
            for role, operand in operands.items():
                if role == "dst":
                    continue
                view = operand.view(loop_values)
                if not np.all(view != 0):
                    raise instruction_error(
                        ins,
                        f"reads {np.count_nonzero(view == 0)} of {view.size} elements of "
                        f"{operand.ap.loc!r} ({role}) that nothing wrote, and is not marked "
                        "can_read_uninit",
                    )
        dst = operands.get("dst")
        if dst is not None:
            dst.view(loop_values)[...] = 1
        self.checked += 1

    def _as_run(self, ins: Instruction, loop_values: dict[str, int]) -> Instruction | None:
        if ins.predicate is None:
            return ins
        bound = ins.predicate.bound(loop_values)
        if bound <= 0:
            return None
        if bound >= leading_extent(ins):
            return ins
        key = (ins, bound)
        if key not in self._narrowed:
            self._narrowed[key] = narrow(ins, bound)
        return self._narrowed[key]


def run_checked(module, inputs, function_name: str | None = None, observer=None):
    """`run_function` with the uninitialised-read check on; raises MachineError on a read."""
    from onnx2bir.runtime.machine.interpreter import _select, run_function
    from onnx2bir.runtime.machine.progress import chain

    checker = UninitChecker(_select(module, function_name))
    outputs = run_function(module, inputs, function_name, chain(checker.observe, observer))
    if checker.checked == 0 and any(True for _ in _select(module, function_name).instructions()):
        raise MachineError("the uninitialised-read check observed no instruction")
    return outputs
