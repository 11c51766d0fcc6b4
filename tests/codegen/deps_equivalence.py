"""Compare the dependency analysis of `codegen/deps.py` with the reference one
(`reference_deps.py`) on one model: same instructions, same `parallel` loops, and the same
happens-before order over every execution (docs/dependencies.md#equivalence).

Happens-before is compared through vector clocks (`runtime/machine/program.py`): over the same
instruction instances on the same streams, two edge sets order exactly the same pairs of
instances when every instance gets the same clock. A runtime loop is unrolled with 0 trips
and with 3 trips per run, so pruning that assumed its body ran would show.

Run as a script to print the comparison of some models:
    python tests/codegen/deps_equivalence.py models/bert.onnx models/.cache/bert_h256_L24.onnx
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    sys.path.insert(0, str(Path(__file__).resolve().parent))

from onnx import TensorProto, helper  # noqa: E402
from reference_deps import DependencyTracker as ReferenceTracker  # noqa: E402

from onnx2bir.bir.ir import DoWhile, DynamicLoop, Function, Loop  # noqa: E402
from onnx2bir.codegen import GENERIC_LOWERINGS, BirCodeGen, emitter  # noqa: E402
from onnx2bir.compiler import (  # noqa: E402
    compile_model,
    import_graph,
    kernel_table,  # noqa: E402
)
from onnx2bir.options import CompileOptions  # noqa: E402
from onnx2bir.runtime.machine.program import unroll  # noqa: E402

RUNTIME_TRIPS = (0, 3)  # trips per run of a runtime loop in the unrolled comparison


@dataclass(frozen=True, slots=True)
class Comparison:
    model: str
    instructions: int
    instances: int
    reference_edges: int
    edges: int
    reference_deps_s: float  # the analysis' own time, this process, one compile
    deps_s: float
    mismatch: str | None  # None when the two agree


def _compile(path: Path, tracker: type) -> tuple[Function, float]:
    """Compile `path` with `tracker` as the code generator's dependency analysis; the
    function and the seconds spent in the tracker."""
    spent = [0.0]

    def timed(method):
        def run(*args, **kwargs):
            start = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                spent[0] += time.perf_counter() - start

        return run

    timed_tracker = type(
        tracker.__name__,
        (tracker,),
        {
            name: timed(getattr(tracker, name))
            for name in ("add", "open_loop", "close_loop", "define_axis")
        },
    )
    original = emitter.DependencyTracker
    emitter.DependencyTracker = timed_tracker
    try:
        module = compile_model(path).module
    finally:
        emitter.DependencyTracker = original
    return module.functions[0], spent[0]


def _loops(function: Function) -> list[Loop]:
    found, stack = [], [function.entry]
    while stack:
        for item in stack.pop().items:
            if isinstance(item, Loop):
                found.append(item)
                stack.append(item.body)
    return found


def _shape(inst) -> tuple:
    """Everything of an instruction but its edges."""
    return (inst.id, str(inst.opcode), inst.stream, inst.loopnest, repr(inst.accesses()))


def _runtime_trips(function: Function, trips: int) -> dict[int, list[int]]:
    """`trips` trips for every run of every runtime loop, as `unroll` takes them."""
    return {
        id(loop): [trips] * 1_000_000
        for loop in _loops(function)
        if isinstance(loop, DynamicLoop | DoWhile)
    }


def _clocks(function: Function, trips: int) -> tuple[np.ndarray, list[int]]:
    program = unroll(function, _runtime_trips(function, trips))
    return program.clocks(), [inst.id for inst in program.instructions]


def _edges(function: Function) -> int:
    return sum(len(inst.deps) for inst in function.instructions())


def compare_functions(reference: Function, new: Function) -> str | None:
    """None when `new` has the instructions and loops of `reference`, each instruction's
    edge sources among the reference's, and the same happens-before order; else what
    differs."""
    old_insts, new_insts = list(reference.instructions()), list(new.instructions())
    if [_shape(i) for i in old_insts] != [_shape(i) for i in new_insts]:
        return "the instructions differ (code generation is not deterministic?)"
    if [(lp.axis, lp.parallel) for lp in _loops(reference)] != [
        (lp.axis, lp.parallel) for lp in _loops(new)
    ]:
        return "a loop's `parallel` differs"
    for old, now in zip(old_insts, new_insts, strict=True):
        extra = {d.source for d in now.deps} - {d.source for d in old.deps}
        if extra:
            return f"instruction {now.id} has edges from {sorted(extra)}, not in the reference"
    has_runtime = any(isinstance(lp, DynamicLoop | DoWhile) for lp in _loops(new))
    for trips in RUNTIME_TRIPS if has_runtime else RUNTIME_TRIPS[:1]:
        old_clocks, ids = _clocks(reference, trips)
        new_clocks, _ = _clocks(new, trips)
        differ = np.flatnonzero((old_clocks != new_clocks).any(axis=1))
        if len(differ):
            first = int(differ[0])
            return (
                f"instance {first} (instruction {ids[first]}, runtime loops at {trips} "
                f"trips) is ordered differently: clock {old_clocks[first].tolist()} in the "
                f"reference, {new_clocks[first].tolist()} now"
            )
    return None


def compare(path: Path) -> Comparison:
    """Compile `path` with both analyses and compare what they order."""
    reference, reference_s = _compile(path, ReferenceTracker)
    new, new_s = _compile(path, emitter.DependencyTracker)
    return Comparison(
        path.name,
        sum(1 for _ in new.instructions()),
        len(unroll(new, _runtime_trips(new, RUNTIME_TRIPS[-1]))),
        _edges(reference),
        _edges(new),
        reference_s,
        new_s,
        compare_functions(reference, new),
    )


def main(paths: list[str]) -> int:
    failed = 0
    for name in paths:
        c = compare(Path(name))
        failed += c.mismatch is not None
        print(
            f"{c.model}: {c.instructions} instructions, {c.instances} instances, edges "
            f"{c.reference_edges} -> {c.edges}, deps {c.reference_deps_s:.3f} s -> "
            f"{c.deps_s:.3f} s: {c.mismatch or 'same order'}",
            flush=True,
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))


def relu_codegen(row: int = 512) -> BirCodeGen:
    """A code generator opened on a one-Relu graph over x, y: [128, row] fp32 in DRAM, for
    tests that emit instructions by hand (the pruning and random-program tests)."""
    graph = import_graph(
        helper.make_model(
            helper.make_graph(
                [helper.make_node("Relu", ["x"], ["y"])],
                "g",
                [helper.make_tensor_value_info("x", TensorProto.FLOAT, [128, row])],
                [helper.make_tensor_value_info("y", TensorProto.FLOAT, [128, row])],
            ),
            opset_imports=[helper.make_opsetid("", 18)],
            ir_version=10,
        )
    )
    cg = BirCodeGen(graph, CompileOptions(), GENERIC_LOWERINGS, kernel_table())
    cg.before_function()
    return cg
