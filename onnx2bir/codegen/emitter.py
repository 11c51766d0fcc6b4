"""The emitter: where an instruction lands, and what it is given there
(docs/architecture.md#codegen).

It owns the block stack (the function's entry block, then each open loop's or scope's body),
the open loop nest and the ranges of its axes, the open `predicated` regions and no_reorder
scopes, the current node's `origin`, and the dependency tracker. `emit` (the finalizer,
transformInstruction) builds an instruction, stamps its id, loop nest and predicate, appends it
to the innermost open block and derives its dependency edges from the buffers it touches
(`codegen/deps.py`); inside a no_reorder scope it also gets an Ordered edge to the one before
it when that one runs on another stream. A counted loop gets its loop-carried edges when it
closes and is marked `parallel` when it has no loop-carried hazard.

The emitter checks nothing about where tensors live: the code generator's `emit` asks the
residency first (`codegen/homes.py`), and the residency's own rewritten copies come here
directly.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from onnx2bir.bir.enums import DepKind, Dtype, Engine, LoopMode, MemoryType, Opcode
from onnx2bir.bir.ir import (
    AccessPattern,
    BasicBlock,
    Dependency,
    DoWhile,
    DynamicLoop,
    Function,
    Instruction,
    Loop,
    MemoryLocation,
    Origin,
    Predicate,
    RuntimeValue,
)
from onnx2bir.codegen.deps import DependencyTracker
from onnx2bir.codegen.instructions import NUM_DMA_QUEUES, InstructionBuilders
from onnx2bir.errors import CompileError


class CodegenError(CompileError):
    """A node the code generator cannot lower (the model does not compile, exit 1); the
    message names the node and the rule."""


def stamp_loop_modes(block: BasicBlock, mode: LoopMode = LoopMode.NONE) -> None:
    """setLoopMode: each instruction gets the mode of its innermost enclosing loop (scope
    regions, one-trip no-op loops, do not count), from the loops' final `parallel` flags."""
    for item in block.items:
        if isinstance(item, DynamicLoop | DoWhile):
            stamp_loop_modes(item.body, LoopMode.DYNAMIC)
        elif isinstance(item, Loop):
            inner = mode
            if item.trip_count > 1:
                inner = LoopMode.AFFINE if item.parallel else LoopMode.SEQUENTIAL
            stamp_loop_modes(item.body, inner)
        else:
            item.loop_mode = mode


class PlanningRun:
    """The dependency tracker of a first pass whose BIR only feeds the memory planner: it
    records nothing (the second pass computes the real edges), so every call is a no-op."""

    def define_axis(self, axis: str, start: int, last: int, step: int) -> None:
        """No edges in a planning run: an axis needs no range."""

    def open_loop(self, loop: Loop) -> None:
        """No edges in a planning run: a loop opens nothing."""

    def close_loop(self, loop: Loop) -> bool:
        """No analysis, so no loop is known to be free of carried hazards."""
        return True

    def add(self, inst: Instruction, locations: dict[str, MemoryLocation]) -> None:
        """No edges in a planning run: the instruction gets none."""


_ARITHMETIC = frozenset({Opcode.TENSOR_TENSOR, Opcode.TENSOR_SCALAR, Opcode.TENSOR_REDUCE})


def integer_lanes(
    opcode: Opcode,
    engine: Engine,
    dst: AccessPattern | None,
    srcs: dict[str, AccessPattern],
    locations: dict[str, MemoryLocation],
) -> Engine:
    """GpSimd for VectorE arithmetic whose tile inputs are all integers, one of them 32-bit,
    or whose result is a narrower integer: VectorE would compute it in fp32, inexact past
    2^24, and its store to an integer saturates where ONNX's integer arithmetic wraps
    (int16 200·200); GpSimd's int32 lanes are exact and their store wraps (NKI dispatches
    int32 arithmetic the same way; docs/neuroncore.md#integers). Booleans and comparisons
    of narrow integers stay on VectorE, exact in fp32. GpSimd cannot reach PSUM."""
    if engine is not Engine.DVE or opcode not in _ARITHMETIC:
        return engine
    operands = [locations[ap.loc] for ap in (dst, *srcs.values()) if ap is not None]
    inputs = [locations[ap.loc].dtype for ap in srcs.values()]
    wide_integers = any(dtype.itemsize >= 4 for dtype in inputs)
    result = locations[dst.loc].dtype if dst is not None else None
    integer_result = result is not None and not result.is_float and result is not Dtype.BOOL
    if (
        (wide_integers or integer_result)
        and not any(dtype.is_float for dtype in inputs)
        and all(loc.memory is not MemoryType.PSUM for loc in operands)
    ):
        return Engine.POOL
    return engine


class Emitter(InstructionBuilders):
    """The block stack, the loops and the finalizer (module docstring). Its builders
    (`InstructionBuilders`) emit without the residency's check: the residency's copies use
    them."""

    def __init__(self, planning_run: bool = False) -> None:
        self.function: Function | None = None
        self.block_stack: list[BasicBlock] = []
        self.loopnest: list[str] = []
        self.axis_ranges: dict[str, tuple[int, int]] = {}
        self.deps = PlanningRun() if planning_run else DependencyTracker()
        self.origin = Origin("<prologue>", "codegen.prologue")
        self.predicates: list[Predicate] = []  # open `predicated` regions, innermost last
        self._ordered: list[list[Instruction] | None] = []  # per open scope, if no_reorder
        self._next_id = 0
        self._dma_queue = 0
        self._axis_counts: dict[str, int] = {}
        self._axis_names: set[str] = set()

    def begin(self, fn: Function) -> None:
        """Emit into `fn`, from its entry block."""
        self.function = fn
        self.block_stack.append(fn.entry)

    def end(self) -> None:
        """Close the entry block."""
        self.block_stack.pop()

    @property
    def entry_items(self) -> int:
        """How many items the entry block holds (a node's scope is the next)."""
        return len(self.function.entry.items)

    def fail(self, reason: str) -> CodegenError:
        """An error naming the current node and rule."""
        return CodegenError(f"node {self.origin.node!r} ({self.origin.rule}): {reason}")

    # --- control structure -----------------------------------------------------------------
    def axis_name(self, hint: str) -> str:
        """hint + a count, unique in the function: hints "h" and "h2" both count to "h20"."""
        while True:
            count = self._axis_counts.get(hint, 0)
            self._axis_counts[hint] = count + 1
            name = f"{hint}{count}"
            if name not in self._axis_names:
                self._axis_names.add(name)
                return name

    @contextmanager
    def _open(self, item: Loop, first: int, last: int) -> Iterator[None]:
        """Append `item` to the innermost block and emit into its body until closed."""
        self.block_stack[-1].items.append(item)
        self.block_stack.append(item.body)
        self.loopnest.append(item.axis)
        self.axis_ranges[item.axis] = (first, last)
        try:
            yield
        finally:
            self.loopnest.pop()
            self.block_stack.pop()

    @contextmanager
    def loop(self, hint: str, start: int, stop: int, step: int = 1) -> Iterator[str]:
        """Open a counted loop; yields its axis name for use in offsets. When it closes, its
        loop-carried edges are added and `parallel` says whether it has none."""
        item = Loop(self.axis_name(hint), start, stop, step)
        with self._open(item, start, item.last_value):
            self.deps.open_loop(item)
            try:
                yield item.axis
            finally:
                # Iterations may be reordered exactly when no hazard crosses them.
                item.parallel = not self.deps.close_loop(item)

    @contextmanager
    def predicated(self, predicate: Predicate) -> Iterator[None]:
        """Every instruction emitted inside runs under `predicate` (setPredicate): on the
        leading-dim indices below its bound, which is how a loop covers its edge tile."""
        self.predicates.append(predicate)
        try:
            yield
        finally:
            self.predicates.pop()

    @contextmanager
    def runtime_loop(self, item: DynamicLoop | DoWhile) -> Iterator[str]:
        """Open a DynamicFor or DoWhile loop (codegenLoop(dynamic=True) / codegenWhile); yields
        its axis. Static analyses see its one-trip view (docs/loops.md)."""
        with self._open(item, item.start, item.last_value):
            # Its trip count is known only at run time: the dependency analysis sees two
            # trips, so a hazard from one iteration to the next gets its loop-carried edge.
            two_trips = Loop(item.axis, item.start, item.start + 2 * item.step, item.step)
            self.deps.open_loop(two_trips)
            try:
                yield item.axis
            finally:
                self.deps.close_loop(two_trips)

    def dynamic_loop(self, hint: str, start: int, stop: RuntimeValue, step: int = 1) -> DynamicLoop:
        """A DynamicFor loop to open with `runtime_loop`."""
        return DynamicLoop(self.axis_name(hint), start, start + step, step, stop_value=stop)

    def do_while(
        self, hint: str, condition: RuntimeValue | bool, is_do_while: bool = False
    ) -> DoWhile:
        """A DoWhile loop to open with `runtime_loop`: test-before unless `is_do_while`."""
        return DoWhile(
            self.axis_name(hint), 0, 1, 1, continue_condition=condition, is_do_while=is_do_while
        )

    @contextmanager
    def scope(self, hint: str, no_reorder: bool = False) -> Iterator[None]:
        """A scope region: a one-trip loop whose body bounds tile lifetimes
        (docs/bir_codegen.md#scopes)."""
        item = Loop(self.axis_name(hint), 0, 1, 1, parallel=False, no_reorder=no_reorder)
        with self._open(item, 0, 0):
            self.deps.define_axis(item.axis, 0, 0, 1)
            self._ordered.append([] if no_reorder else None)
            try:
                yield
            finally:
                self._ordered.pop()

    # --- emission --------------------------------------------------------------------------
    def next_dma_queue(self) -> int:
        """The DMA queue of the next DMA instruction: the queues in turn."""
        queue = self._dma_queue
        self._dma_queue = (queue + 1) % NUM_DMA_QUEUES
        return queue

    def emit(
        self,
        opcode: Opcode,
        engine: Engine,
        dst: AccessPattern | None,
        srcs: dict[str, AccessPattern],
        **attrs: object,
    ) -> Instruction:
        """Build the instruction (on GpSimd's integer lanes when `integer_lanes` says so) and
        finalize it."""
        engine = integer_lanes(opcode, engine, dst, srcs, self.function.memory_locations)
        inst = Instruction(opcode, engine, dst, srcs, attrs, self.origin)
        self._finalize(inst)
        return inst

    def _finalize(self, inst: Instruction) -> None:
        """transformInstruction: id, loop nest, block placement, dependency edges."""
        inst.id = self._next_id
        self._next_id += 1
        inst.loopnest = tuple(self.loopnest)
        if self.predicates:
            inst.predicate = self.predicates[-1]
        self.block_stack[-1].items.append(inst)
        self.deps.add(inst, self.function.memory_locations)
        # In a no_reorder scope every instruction also follows the previous one (on another
        # stream an Ordered edge says so; on its own stream the stream does).
        ordered = next((ids for ids in reversed(self._ordered) if ids is not None), None)
        if ordered is not None:
            if ordered:
                previous = ordered[-1]
                if previous.stream != inst.stream and all(
                    dep.source != previous.id for dep in inst.deps
                ):
                    inst.deps.append(Dependency(previous.id, DepKind.ORDERED))
            ordered.append(inst)
