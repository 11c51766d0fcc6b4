"""The BIR data model: Module → Function → BasicBlock → Instruction | Loop
(docs/bir_codegen.md#module).

Values (access patterns, memory locations, origins, dependency edges) are frozen dataclasses;
graph objects (instructions, loops, blocks, functions, modules) are mutable and compare by
identity. Structural comparison of two modules goes through their JSON form
(`onnx2bir.bir.json_io.module_to_json`).

Addressing. An SB or PSUM memory location occupies partitions [0, num_partitions) and the
bytes [address, address + bytes_per_partition) of each of them; its elements are addressed
per partition. A DRAM memory location is a flat array of `prod(shape)` elements. An
AccessPattern names a location and walks it: `partition_start` and `num_partitions` select
contiguous partitions (SB/PSUM only), then each `(stride, count)` pair of `pattern` is one
free dimension, outermost first, strides in elements. The first element sits at
`offset + Σ coef·iv` where iv is the current value of the enclosing loop axis named in
`offset_terms`. The shape an access pattern denotes is `(num_partitions, *counts)` on SB/PSUM
and `counts` on DRAM.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from onnx2bir.bir.enums import (
    ENTRY_BLOCK,
    LOOP_BODY_BLOCK,
    DepKind,
    Dtype,
    Engine,
    LoopMode,
    MemoryKind,
    MemoryType,
    Opcode,
)


@dataclass(frozen=True, slots=True)
class MemoryLocation:
    """A named buffer: a DRAM tensor, or a tile in SBUF or PSUM."""

    name: str
    memory: MemoryType
    kind: MemoryKind
    dtype: Dtype
    shape: tuple[int, ...]
    # SB/PSUM geometry: partitions used and the byte range in each partition.
    num_partitions: int = 0
    address: int = 0
    bytes_per_partition: int = 0

    @property
    def num_elements(self) -> int:
        """Elements addressable per partition (SB/PSUM) or in total (DRAM)."""
        if self.memory is MemoryType.DRAM:
            return math.prod(self.shape)
        return self.bytes_per_partition // self.dtype.itemsize

    @property
    def on_chip(self) -> bool:
        return self.memory is not MemoryType.DRAM


@dataclass(frozen=True, slots=True)
class AccessPattern:
    loc: str
    pattern: tuple[tuple[int, int], ...]
    offset: int = 0
    offset_terms: tuple[tuple[str, int], ...] = ()
    partition_start: int = 0
    num_partitions: int = 0  # 0 on DRAM: no partition dimension

    @property
    def counts(self) -> tuple[int, ...]:
        return tuple(count for _, count in self.pattern)

    @property
    def shape(self) -> tuple[int, ...]:
        if self.num_partitions:
            return (self.num_partitions, *self.counts)
        return self.counts

    @property
    def free_size(self) -> int:
        return math.prod(self.counts)

    @property
    def num_elements(self) -> int:
        return math.prod(self.shape)

    def offset_at(self, loop_values: dict[str, int]) -> int:
        return self.offset + sum(coef * loop_values[axis] for axis, coef in self.offset_terms)

    @property
    def pattern_reach(self) -> tuple[int, int]:
        """How far the free pattern reaches below and above its first element (elements of
        one partition row: low <= 0 <= high)."""
        low = high = 0
        for stride, count in self.pattern:
            reach = stride * (count - 1)
            if reach < 0:
                low += reach
            else:
                high += reach
        return low, high

    def element_span(self, axis_ranges: dict[str, tuple[int, int]]) -> tuple[int, int]:
        """Smallest and largest element index touched in one partition, over all loop values.

        `axis_ranges` maps an axis to the (first, last) value it takes.
        """
        low = high = self.offset
        for axis, coef in self.offset_terms:
            first, last = axis_ranges[axis]
            low += min(coef * first, coef * last)
            high += max(coef * first, coef * last)
        below, above = self.pattern_reach
        return low + below, high + above


@dataclass(frozen=True, slots=True)
class Origin:
    """Where an instruction came from: the ONNX node and the rule or kernel that emitted it."""

    node: str
    rule: str


def node_of_origin(origin: str, nodes: set[str]) -> str | None:
    """The graph node an instruction origin or a location name belongs to: itself, or the node
    a helper ("conv/output_transpose", "loop/body_tensor") was made for."""
    name = origin
    while name not in nodes:
        head, sep, _ = name.rpartition("/")
        if not sep:
            return None
        name = head
    return name


@dataclass(frozen=True, slots=True)
class Dependency:
    """An edge from `source` to the instruction that lists it (docs/dependencies.md#edge-semantics).

    Plain (`carried_by` None): each execution of the instruction waits for the latest
    execution of `source` before it in program order. Loop-carried (`carried_by` names an
    enclosing loop axis shared by both, `distance` >= 1): an execution in iteration k of
    that loop waits for the last execution of `source` in iteration k - distance of the same
    loop instance; `source` may come later in the loop body.
    """

    source: int  # id of the instruction waited for
    kind: DepKind
    carried_by: str | None = None
    distance: int = 0

    @property
    def loop_carried(self) -> bool:
        return self.carried_by is not None


@dataclass(frozen=True, slots=True)
class Predicate:
    """BirAffinePredicate: the instruction runs only on the leading-dimension indices
    i < const + Σ coef·axis of every operand (partitions on SB/PSUM, the outermost free dim
    on DRAM). A bound ≥ the dimension runs the whole instruction, ≤ 0 skips it. It lets one
    loop body cover the partial edge tile of a tiled extent (docs/predicates.md)."""

    const: int
    terms: tuple[tuple[str, int], ...] = ()

    def bound(self, loop_values: dict[str, int]) -> int:
        return self.const + sum(coef * loop_values[axis] for axis, coef in self.terms)


@dataclass(eq=False)
class Instruction:
    opcode: Opcode
    engine: Engine
    dst: AccessPattern | None
    srcs: dict[str, AccessPattern]
    attrs: dict[str, object]
    origin: Origin
    id: int = -1
    loopnest: tuple[str, ...] = ()
    deps: list[Dependency] = field(default_factory=list)
    predicate: Predicate | None = None
    loop_mode: LoopMode = LoopMode.NONE
    # The instruction may read bytes no earlier instruction wrote (docs/predicates.md).
    can_read_uninit: bool = False

    @property
    def stream(self) -> str:
        """The in-order instruction stream this runs on: its engine, or `DMA<queue>`."""
        if self.engine is Engine.DMA:
            return f"DMA{self.attrs.get('queue', 0)}"
        return self.engine.value

    def accesses(self) -> list[tuple[AccessPattern, bool]]:
        """(access pattern, is_write) for every operand, the write last."""
        result = [(ap, False) for ap in self.srcs.values()]
        if self.dst is not None:
            result.append((self.dst, True))
        return result


@dataclass(eq=False)
class BasicBlock:
    name: str
    items: list[Instruction | Loop] = field(default_factory=list)

    def instructions(self):
        """Every instruction in this block and in the loops nested in it, in program order."""
        for item in self.items:
            if isinstance(item, Loop):
                yield from item.body.instructions()
            else:
                yield item


@dataclass(eq=False)
class Loop:
    """A counted loop over `axis`; a scope region is a one-trip loop with `no_reorder` set."""

    axis: str
    start: int
    stop: int
    step: int = 1
    parallel: bool = False
    no_reorder: bool = False
    body: BasicBlock = field(default_factory=lambda: BasicBlock(LOOP_BODY_BLOCK))

    @property
    def trip_count(self) -> int:
        return max(0, -(-(self.stop - self.start) // self.step))

    @property
    def last_value(self) -> int:
        return self.start + (self.trip_count - 1) * self.step


@dataclass(eq=False)
class Function:
    name: str
    memory_locations: dict[str, MemoryLocation] = field(default_factory=dict)
    inputs: list[str] = field(default_factory=list)  # DRAM locations, in graph-input order
    outputs: list[str] = field(default_factory=list)  # DRAM locations, in graph-output order
    entry: BasicBlock = field(default_factory=lambda: BasicBlock(ENTRY_BLOCK))

    def add_memory_location(self, loc: MemoryLocation) -> MemoryLocation:
        if loc.name in self.memory_locations:
            raise ValueError(f"memory location {loc.name!r} defined twice")
        self.memory_locations[loc.name] = loc
        return loc

    def instructions(self):
        return self.entry.instructions()


@dataclass(eq=False)
class Module:
    name: str
    functions: list[Function] = field(default_factory=list)
    # Constant payloads by DRAM location name; serialised to the sidecar, not the JSON.
    constants: dict[str, object] = field(default_factory=dict)
    metadata: dict[str, object] = field(default_factory=dict)

    def function(self, name: str) -> Function:
        for fn in self.functions:
            if fn.name == name:
                return fn
        raise KeyError(name)


# --- runtime-controlled loops (docs/loops.md) ------------------------------------------------
@dataclass(frozen=True, slots=True)
class RuntimeValue:
    """A scalar the sequencer loads into a register when a loop tests it (LoadTensorToRegister
    → IntRuntimeValue): element `offset` of DRAM location `loc`, read as an integer (a bool is
    0 or 1, a float is truncated)."""

    loc: str
    offset: int = 0


@dataclass(eq=False)
class DynamicLoop(Loop):
    """InstDynamicForLoop: axis = start, start + step, ... while below a runtime bound.

    `stop_value` is read once, when the loop is entered. The inherited `stop` is the static
    view every static analysis sees: one trip (start + step), so a pass that ignores the
    runtime bound treats the body as a single iteration. A runtime loop is never parallel.
    `local_locations` name the locations defined by the body: they live for the loop region.
    """

    stop_value: RuntimeValue = RuntimeValue("")
    local_locations: tuple[str, ...] = ()


@dataclass(eq=False)
class DoWhile(Loop):
    """InstDoWhile: run the body while `continue_condition` is nonzero.

    `is_do_while` True tests after each trip (the body runs at least once), False before each
    trip (a while loop). The condition is a RuntimeValue re-read at every test, or a bool when
    it folded at compile time. `axis` counts the trips from 0 and may appear in offsets; the
    inherited start/stop/step are the one-trip static view (0, 1, 1).
    """

    continue_condition: RuntimeValue | bool = True
    is_do_while: bool = False
    local_locations: tuple[str, ...] = ()


def all_loops(block: BasicBlock):
    """Every Loop nested in `block` (counted or runtime), outermost first."""
    for item in block.items:
        if isinstance(item, Loop):
            yield item
            yield from all_loops(item.body)


def runtime_loops(block: BasicBlock):
    """Every DynamicLoop and DoWhile nested in `block`, outermost first."""
    for item in block.items:
        if isinstance(item, Loop):
            if isinstance(item, DynamicLoop | DoWhile):
                yield item
            yield from runtime_loops(item.body)
