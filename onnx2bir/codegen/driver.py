"""The BIR code generator, in BirCodeGenLoop's shape (docs/bir_codegen.md).

In: a `Graph` after the pattern passes. Out: a `bir.Module` with one function.

- Prologue (`before_function`): create the function and its entry block "Block1", push it on
  the block stack, bind the graph's inputs and outputs to DRAM memory locations
  (`ensure_dst_on_function`), and load the identity matrix the PE array multiplies by to
  transpose a tile.
- Walk: every op node, in topological order, is emitted inside a scope region (a one-trip
  loop) that bounds the lifetime of its SBUF and PSUM tiles. A node's lowering is found by
  name: a NativeKernel's `func_name` or a CustomCall's `custom_call_target` in the kernel
  registry, any other op in the generic lowering table. Loops (`loop`) push their body block
  "block0"; every instruction lands in the block on top of the stack. Lowerings emit through
  the per-opcode builders of `codegen/instructions.py`.
- Finalizer (`emit` → `_finalize`): stamps the instruction's id, loop nest and origin and
  derives its dependency edges from the buffers it touches (`codegen/deps.py`); inside a
  no_reorder scope each instruction also gets an Ordered edge to the one before it when that
  one runs on another stream. A counted loop gets its loop-carried edges when it closes and
  is marked `parallel` when it has no loop-carried hazard.
- Epilogue (`after_function`): in a no_reorder scope, copies graph outputs that no node
  writes (constants, inputs passed through), then pops "Block1".
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace

import numpy as np

from onnx2bir.bir.dtypes import on_chip
from onnx2bir.bir.enums import (
    PAYLOAD_KINDS,
    ActFunc,
    DepKind,
    Dtype,
    Engine,
    LoopMode,
    MemoryKind,
    MemoryType,
    Opcode,
)
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
    Module,
    Origin,
    Predicate,
    RuntimeValue,
    all_loops,
)
from onnx2bir.bir.opcodes import (
    NUM_PARTITIONS,
    PSUM_BANK_BYTES,
    PSUM_NUM_BANKS,
    SB_ALIGN,
    SBUF_BYTES_PER_PARTITION,
)
from onnx2bir.bir.parallel import parallel_hazards
from onnx2bir.codegen.casting import storage_dtype
from onnx2bir.codegen.deps import DependencyTracker
from onnx2bir.codegen.instructions import InstructionBuilders
from onnx2bir.codegen.planner import MemoryPlan, WeightRequest
from onnx2bir.codegen.registry import lowering_key
from onnx2bir.codegen.residency import plan_copy
from onnx2bir.codegen.tiling import Affine
from onnx2bir.errors import CompileError
from onnx2bir.graph import Graph, Node
from onnx2bir.options import CompileOptions

IDENTITY = "identity_fp32"  # the SBUF tile (docs/bir_codegen.md#prologue: "identity_<dtype>")
IDENTITY_DRAM = "identity_matrices.fp32"  # its constant source in DRAM


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


def kernel_name_of(data: dict) -> str | None:
    """The kernel a node asks for: a NativeKernel's `func_name` (conv selection) or a
    CustomCall's `custom_call_target` (attention and MLP raises); None for a plain op."""
    if data["op_type"] == "NativeKernel":
        return data["attrs"]["func_name"]
    if data["op_type"] == "CustomCall":
        return data["attrs"]["custom_call_target"]
    return None


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


# On-chip copies of resident tensors take these engines in turn (`BirCodeGen.on_chip_copy`).
COPY_ENGINES = (Engine.ACT, Engine.DVE, Engine.POOL)
_ARITHMETIC = frozenset({Opcode.TENSOR_TENSOR, Opcode.TENSOR_SCALAR, Opcode.TENSOR_REDUCE})


def _inexact_immediates(attrs: dict[str, object]) -> bool:
    """Whether a TensorScalar has an integer immediate that rounds on its way to fp32."""
    values = (attrs.get("imm0"), attrs.get("imm1"))
    return any(
        isinstance(v, int) and not isinstance(v, bool) and int(np.float32(v)) != v for v in values
    )


class CodegenError(CompileError):
    """A node the code generator cannot lower (the model does not compile, exit 1); the
    message names the node and the rule."""


class BirCodeGen(InstructionBuilders):
    def __init__(
        self,
        graph: Graph,
        options: CompileOptions,
        lowerings: dict[str, Callable],
        kernels: dict[str, Callable],
        tensor_memkind: dict[str, MemoryKind] | None = None,
        memory_plan: MemoryPlan | None = None,
        planning_run: bool = False,
        derived_constants: dict[str, np.ndarray] | None = None,
    ) -> None:
        self.graph = graph
        # Compile-time payloads computed from the graph's constants (a weight stored
        # transposed), by location name: the planner's two passes share one copy.
        self.derived_constants = {} if derived_constants is None else derived_constants
        self.options = options
        self.lowerings = lowerings
        self.kernels = kernels
        self.module = Module(name=graph.name, metadata={"opset": graph.opset})
        self.function: Function | None = None
        self.block_stack: list[BasicBlock] = []
        self.loopnest: list[str] = []
        self.axis_ranges: dict[str, tuple[int, int]] = {}
        self.deps = PlanningRun() if planning_run else DependencyTracker()
        # The memory plan (docs/memory_planner.md): tensors with an SBUF home, and where each
        # node's arena starts. Without one every tensor lives in DRAM and every arena starts
        # just above the reserved tiles; `arena_need` and `psum_need` record what each node
        # used, keyed by the position of its scope in the entry block.
        self.memory_plan = memory_plan
        self.homes = memory_plan.homes if memory_plan else {}
        self.arena_need: dict[int, int] = {}
        self.psum_need: dict[int, int] = {}
        self.weight_requests: list[WeightRequest] = []  # every `weight_tile`, for the planner
        self.item_nodes: dict[int, str] = {}
        self._dram_views: dict[str, MemoryLocation] = {}
        self._copy_engine = 0
        self._planned_copy = False
        self._direct_aps: set[AccessPattern] = set()  # home accesses handed to a lowering
        self._lowering_node = False  # inside a top-level node's lowering
        self.origin = Origin("<prologue>", "codegen.prologue")
        self._next_id = 0
        self._axis_counts: dict[str, int] = {}
        self._axis_names: set[str] = set()
        self._dma_queue = 0
        # The SBUF bytes (per partition, [start, end)) of the weights the last node that
        # loaded some holds: a node with two copies of its weight tile loads the other one,
        # so that its loads need not wait for that node's matmuls (docs/buffers.md#weights).
        self.last_weights: tuple[int, int] | None = None
        self._sb_top = 0
        self._arena_top = 0
        self._arena_base = 0
        self._sb_reserved = 0
        self._psum_next_bank = 0
        self._tile_count = 0
        self._ordered: list[list[Instruction] | None] = []  # per open scope, if no_reorder
        self._predicates: list[Predicate] = []  # open `predicated` regions, innermost last
        # createMemLoc's `tensor_memkind`: a per-tensor MemoryKind that beats the predicates.
        self.tensor_memkind: dict[str, MemoryKind] = dict(tensor_memkind or {})

    # --- driver ----------------------------------------------------------------------------
    def run(self) -> Module:
        self.before_function()
        for name in self.graph.topological_order():
            self.transform_node(name)
        self.after_function()
        return self.module

    def before_function(self) -> None:
        fn = Function(self.graph.name)
        self.module.functions.append(fn)
        self.function = fn
        self.block_stack.append(fn.entry)
        self.ensure_dst_on_function()
        self._load_identity()

    def ensure_dst_on_function(self) -> None:
        fn = self.function
        for tensor in self.graph.inputs:
            fn.inputs.append(self.dram(tensor).name)
        for tensor in self.graph.outputs:
            fn.outputs.append(self.output_location(tensor).name)

    def _load_identity(self) -> None:
        """The PE transposes' moving operand: I[128, 128] resident in SBUF for the whole run."""
        self.add_dram_const(IDENTITY_DRAM, np.eye(NUM_PARTITIONS, dtype=np.float32))
        tile = self.sb_tile("identity", NUM_PARTITIONS, NUM_PARTITIONS, Dtype.FP32, name=IDENTITY)
        self._sb_reserved = self._sb_top
        self.dma(
            self.ap(tile), self.dram_ap(IDENTITY_DRAM, Affine(), [(NUM_PARTITIONS, 128), (1, 128)])
        )

    @property
    def reserved_bytes(self) -> int:
        """SBUF bytes per partition below every arena (the resident identity tile)."""
        return self._sb_reserved

    def identity(self, size: int) -> AccessPattern:
        """I[size, size] from the resident identity tile."""
        return AccessPattern(IDENTITY, ((1, size),), 0, (), 0, size)

    def transform_node(self, name: str) -> None:
        data = self.graph.node(name)
        op_type = data["op_type"]
        kernel_name = kernel_name_of(data)
        if kernel_name is not None:
            lower = self.kernels.get(kernel_name)
            rule = f"kernel.{kernel_name}"
            if lower is None:
                raise CodegenError(
                    f"node {name!r}: no kernel named {kernel_name!r} in the registry"
                )
        else:
            lower = self.lowerings.get(lowering_key(op_type, data["domain"]))
            rule = f"generic.{lowering_key(op_type, data['domain'])}"
            if lower is None:
                raise CodegenError(f"node {name!r}: no lowering for op {op_type}")
        self.origin = Origin(name, rule)
        item = len(self.function.entry.items)
        if self._lowering_node:
            # A node of a Loop body, lowered inside its Loop's node: its tiles go above the
            # Loop's and are free again when it is done.
            saved = self._sb_top, self._psum_next_bank
            with self.scope(f"node_{item}"):
                lower(self, Node.of(data))
            self._sb_top, self._psum_next_bank = saved
            return
        base = self.memory_plan.arena_base(item) if self.memory_plan else self._sb_reserved
        self._sb_top = self._arena_top = self._arena_base = base
        self._psum_next_bank = 0
        self._lowering_node = True
        try:
            with self.scope(f"node_{item}"):
                lower(self, Node.of(data))
        finally:
            self._lowering_node = False
        self.arena_need[item] = self._arena_top - base
        self.item_nodes[item] = name
        self.psum_need[item] = self._psum_next_bank * PSUM_BANK_BYTES

    def after_function(self) -> None:
        self.origin = Origin("<epilogue>", "codegen.epilogue")
        written = {t for _, d in self.graph.nodes() for t in d["outputs"]}
        with self.scope("epilogue", no_reorder=True):  # outputs are published in order
            self._copy_outputs(written)
        self.block_stack.pop()
        # A closing loop sees the hazards of a later iteration on an earlier one (its carried
        # edges); a parallel loop must have none in either direction (bir/parallel.py).
        unsound = {hazard.axis for hazard in parallel_hazards(self.function)}
        for loop in all_loops(self.function.entry):
            if loop.axis in unsound:
                loop.parallel = False
        stamp_loop_modes(self.function.entry)

    def _copy_outputs(self, written: set[str]) -> None:
        """Graph outputs no node writes (constants, inputs passed through) are copied."""
        for tensor in self.graph.outputs:
            if tensor in written and tensor not in self.graph.inputs:
                continue
            src = self.dram(tensor)
            dst = self.output_location(tensor)
            count = math.prod(src.shape)
            if count == 0 or dst is src:
                continue  # an empty output: nothing to move
            self.dma(
                self.dram_ap(dst.name, Affine(), [(1, count)]),
                self.dram_ap(src.name, Affine(), [(1, count)]),
            )

    # --- control structure -----------------------------------------------------------------
    def _axis_name(self, hint: str) -> str:
        """hint + a count, unique in the function: hints "h" and "h2" both count to "h20"."""
        while True:
            count = self._axis_counts.get(hint, 0)
            self._axis_counts[hint] = count + 1
            name = f"{hint}{count}"
            if name not in self._axis_names:
                self._axis_names.add(name)
                return name

    @contextmanager
    def loop(self, hint: str, start: int, stop: int, step: int = 1) -> Iterator[str]:
        """Open a counted loop; yields its axis name for use in offsets. When it closes, its
        loop-carried edges are added and `parallel` says whether it has none."""
        axis = self._axis_name(hint)
        item = Loop(axis, start, stop, step)
        self.block_stack[-1].items.append(item)
        self.block_stack.append(item.body)
        self.loopnest.append(axis)
        self.axis_ranges[axis] = (start, item.last_value)
        self.deps.open_loop(item)
        try:
            yield axis
        finally:
            # Iterations may be reordered exactly when no hazard crosses them.
            item.parallel = not self.deps.close_loop(item)
            self.loopnest.pop()
            self.block_stack.pop()

    @contextmanager
    def predicated(self, predicate: Predicate) -> Iterator[None]:
        """Every instruction emitted inside runs under `predicate` (setPredicate): on the
        leading-dim indices below its bound, which is how a loop covers its edge tile."""
        self._predicates.append(predicate)
        try:
            yield
        finally:
            self._predicates.pop()

    @contextmanager
    def runtime_loop(self, item: DynamicLoop | DoWhile) -> Iterator[str]:
        """Open a DynamicFor or DoWhile loop (codegenLoop(dynamic=True) / codegenWhile); yields
        its axis. Static analyses see its one-trip view (docs/loops.md)."""
        self.block_stack[-1].items.append(item)
        self.block_stack.append(item.body)
        self.loopnest.append(item.axis)
        self.axis_ranges[item.axis] = (item.start, item.last_value)
        # Its trip count is known only at run time: the dependency analysis sees two trips, so
        # a hazard from one iteration to the next gets its loop-carried edge.
        two_trips = Loop(item.axis, item.start, item.start + 2 * item.step, item.step)
        self.deps.open_loop(two_trips)
        try:
            yield item.axis
        finally:
            self.deps.close_loop(two_trips)
            self.loopnest.pop()
            self.block_stack.pop()

    def dynamic_loop(self, hint: str, start: int, stop: RuntimeValue, step: int = 1) -> DynamicLoop:
        """A DynamicFor loop to open with `runtime_loop`."""
        return DynamicLoop(self._axis_name(hint), start, start + step, step, stop_value=stop)

    def do_while(
        self, hint: str, condition: RuntimeValue | bool, is_do_while: bool = False
    ) -> DoWhile:
        """A DoWhile loop to open with `runtime_loop`: test-before unless `is_do_while`."""
        return DoWhile(
            self._axis_name(hint), 0, 1, 1, continue_condition=condition, is_do_while=is_do_while
        )

    @contextmanager
    def scope(self, hint: str, no_reorder: bool = False) -> Iterator[None]:
        """A scope region: a one-trip loop whose body bounds tile lifetimes
        (docs/bir_codegen.md#scopes)."""
        axis = self._axis_name(hint)
        item = Loop(axis, 0, 1, 1, parallel=False, no_reorder=no_reorder)
        self.block_stack[-1].items.append(item)
        self.block_stack.append(item.body)
        self.loopnest.append(axis)
        self.axis_ranges[axis] = (0, 0)
        self.deps.define_axis(axis, 0, 0, 1)
        self._ordered.append([] if no_reorder else None)
        try:
            yield
        finally:
            self._ordered.pop()
            self.loopnest.pop()
            self.block_stack.pop()

    # --- memory locations ------------------------------------------------------------------
    def _dram_kind(self, tensor: str) -> MemoryKind:
        """createMemLoc's kind predicates, in the reference order (docs/memory_kinds.md).

        A `tensor_memkind` override wins. Then: a model weight feeding the function is an
        ExternalInputParameter (its payload supplied at load time), a graph input an
        ExternalInput, a weight that is also a graph output an ExternalOutputParameter, a
        computed graph output an ExternalOutput, a constant folded at compile time Const, and
        everything else Internal. A folded constant that is also a graph output stays Const and
        is published through an ExternalOutput copy (`output_location`): only a location
        codegen writes can be an ExternalOutput.
        """
        override = self.tensor_memkind.get(tensor)
        if override is not None:
            return override
        info = self.graph.tensors[tensor]
        parameter = tensor in self.graph.parameters and info.is_const
        outputs = self.graph.outputs
        if parameter and tensor not in outputs:
            return MemoryKind.EXTERNAL_INPUT_PARAMETER
        if tensor in self.graph.inputs:
            return MemoryKind.EXTERNAL_INPUT
        if parameter:
            return MemoryKind.EXTERNAL_OUTPUT_PARAMETER
        if tensor in outputs and not info.is_const:
            return MemoryKind.EXTERNAL_OUTPUT
        if info.is_const:
            return MemoryKind.CONST
        return MemoryKind.INTERNAL

    def _kept_fp32(self, tensor: str) -> bool:
        """Whether a node `--auto-cast-exclude` keeps in fp32 reads or writes `tensor`."""
        keep = self.graph.keep_fp32
        if not keep:
            return False
        nodes = [node for node, _ in self.graph.consumers(tensor)]
        return self.graph.producer(tensor) in keep or any(node in keep for node in nodes)

    def dram(self, tensor: str) -> MemoryLocation:
        """The DRAM location holding graph tensor `tensor` (created on first use)."""
        fn = self.function
        if tensor in self._dram_views:
            return self._dram_views[tensor]
        if tensor in fn.memory_locations:
            return fn.memory_locations[tensor]
        info = self.graph.tensors[tensor]
        kind = self._dram_kind(tensor)
        # `--auto-cast all` stores the model's intermediates narrow, not a pass's copies of
        # them (a graph output's layout copy would round the output).
        dtype = (
            storage_dtype(self.options, kind, info.dtype, self._kept_fp32(tensor))
            if self.graph.is_model_tensor(tensor)
            else info.dtype
        )
        loc = MemoryLocation(tensor, MemoryType.DRAM, kind, dtype, tuple(info.shape))
        if tensor in self.homes:
            return self._place_home(loc)
        if kind in PAYLOAD_KINDS:
            # ascontiguousarray turns a 0-d array into shape (1,); keep the tensor's shape.
            self.module.constants[tensor] = np.ascontiguousarray(info.const).reshape(
                info.const.shape
            )
        return fn.add_memory_location(loc)

    def output_location(self, tensor: str) -> MemoryLocation:
        """The ExternalOutput location of a graph output (a copy when the tensor is not one)."""
        if self._dram_kind(tensor) in (
            MemoryKind.EXTERNAL_OUTPUT,
            MemoryKind.EXTERNAL_OUTPUT_PARAMETER,
        ):
            return self.dram(tensor)
        name = f"{tensor}:output"
        fn = self.function
        if name not in fn.memory_locations:
            info = self.graph.tensors[tensor]
            fn.add_memory_location(
                MemoryLocation(
                    name, MemoryType.DRAM, MemoryKind.EXTERNAL_OUTPUT, info.dtype, tuple(info.shape)
                )
            )
        return fn.memory_locations[name]

    def add_dram_const(self, name: str, value: np.ndarray) -> MemoryLocation:
        loc = MemoryLocation(
            name,
            MemoryType.DRAM,
            MemoryKind.CONST,
            Dtype.from_numpy(value.dtype),
            tuple(value.shape),
        )
        self.module.constants[name] = np.ascontiguousarray(value)
        return self.function.add_memory_location(loc)

    def dram_scratch(self, tag: str, shape: tuple[int, ...], dtype: Dtype) -> MemoryLocation:
        """An Internal DRAM buffer private to the current node."""
        name = f"{self.origin.node}/{tag}"
        suffix = 1
        while name in self.function.memory_locations:
            name, suffix = f"{self.origin.node}/{tag}.{suffix}", suffix + 1
        loc = MemoryLocation(name, MemoryType.DRAM, MemoryKind.INTERNAL, dtype, tuple(shape))
        if name in self.homes:
            return self._place_home(loc)
        return self.function.add_memory_location(loc)

    def _place_home(self, view: MemoryLocation) -> MemoryLocation:
        """Put a resident tensor at its SBUF home; return its flat DRAM view, which lowerings
        address as if the tensor were in DRAM (`dma` rewrites those accesses)."""
        home = self.homes[view.name]
        self.function.add_memory_location(
            MemoryLocation(
                view.name,
                MemoryType.SB,
                MemoryKind.INTERNAL,
                on_chip(view.dtype),
                (home.partitions, home.free_elements),
                home.partitions,
                home.address,
                home.bytes_per_partition,
            )
        )
        self._dram_views[view.name] = view
        return view

    def _tile_name(self, tag: str) -> str:
        self._tile_count += 1
        return f"{self.origin.node}/{tag}#{self._tile_count}"

    def sb_tile(
        self, tag: str, partitions: int, free: int, dtype: Dtype, name: str | None = None
    ) -> MemoryLocation:
        """Allocate an SBUF tile of `partitions` x `free` elements in the node's arena; an
        int64 tile is int32 on chip (`on_chip`, docs/neuroncore.md#integers)."""
        dtype = on_chip(dtype)
        nbytes = -(-free * dtype.itemsize // SB_ALIGN) * SB_ALIGN
        if partitions > NUM_PARTITIONS or self._sb_top + nbytes > SBUF_BYTES_PER_PARTITION:
            raise CodegenError(
                f"node {self.origin.node!r} ({self.origin.rule}): SBUF tile {tag!r} of "
                f"{partitions} x {free} {dtype} does not fit ({self._sb_top} of "
                f"{SBUF_BYTES_PER_PARTITION} bytes per partition in use)"
            )
        loc = MemoryLocation(
            name or self._tile_name(tag),
            MemoryType.SB,
            MemoryKind.INTERNAL,
            dtype,
            (partitions, free),
            partitions,
            self._sb_top,
            nbytes,
        )
        self._sb_top += nbytes
        self._arena_top = max(self._arena_top, self._sb_top)
        return self.function.add_memory_location(loc)

    def weight_tile(
        self, tag: str, key: tuple, partitions: int, free: int, dtype: Dtype
    ) -> tuple[MemoryLocation, bool]:
        """An SBUF tile for the node's whole copy of a constant, and whether the node must load
        it. `key` names the constant (its DRAM location first; a computed tensor is never
        shared) and the way the caller fills
        the tile: nodes asking with one key get the same bytes. When the memory plan gives
        the key a home (docs/memory_planner.md#shared-weights), the tile is that home, loaded
        by its first reader only; the node's arena still takes the bytes of its own copy, so
        that both passes allocate the same tiles."""
        source = self.function.memory_locations.get(key[0])
        if source is None or source.kind not in PAYLOAD_KINDS:
            return self.sb_tile(tag, partitions, free, dtype), True  # computed: not shared
        item = len(self.function.entry.items) - 1  # the node's scope, open
        home = self.memory_plan.weight_home(key, item) if self.memory_plan else None
        if home is None:
            tile = self.sb_tile(tag, partitions, free, dtype)
            request = WeightRequest(item, key, partitions, tile.bytes_per_partition)
            self.weight_requests.append(request)
            return tile, True
        self.sb_tile(tag, partitions, free, dtype)  # the bytes of the node's own copy
        locations = self.function.memory_locations
        if home.name not in locations:
            self.function.add_memory_location(
                MemoryLocation(
                    home.name,
                    MemoryType.SB,
                    MemoryKind.INTERNAL,
                    on_chip(dtype),
                    (partitions, free),
                    partitions,
                    home.address,
                    home.nbytes,
                )
            )
        return locations[home.name], item == home.first

    def sb_free_bytes(self) -> int:
        """Bytes of each SBUF partition the node can still allocate, counted as if its arena
        began just above the reserved tiles: the same in both passes of the memory planner,
        so that lowerings choose the same tiles in both (docs/memory_planner.md)."""
        used = self._sb_top - self._arena_base
        return SBUF_BYTES_PER_PARTITION - self._sb_reserved - used

    def psum_free_banks(self) -> int:
        """PSUM banks the node can still allocate."""
        return PSUM_NUM_BANKS - self._psum_next_bank

    def psum_tile(self, tag: str, partitions: int, free: int) -> MemoryLocation:
        """Allocate a PSUM tile (fp32) in whole 2 KiB banks; a node has the 8 banks to itself."""
        banks = -(-free * 4 // PSUM_BANK_BYTES)
        if self._psum_next_bank + banks > PSUM_NUM_BANKS:
            raise self.fail(
                f"PSUM tile {tag!r} needs {banks} bank(s); "
                f"{self._psum_next_bank} of {PSUM_NUM_BANKS} are in use"
            )
        loc = MemoryLocation(
            self._tile_name(tag),
            MemoryType.PSUM,
            MemoryKind.INTERNAL,
            Dtype.FP32,
            (partitions, free),
            partitions,
            self._psum_next_bank * PSUM_BANK_BYTES,
            banks * PSUM_BANK_BYTES,
        )
        self._psum_next_bank += banks
        return self.function.add_memory_location(loc)

    # --- access patterns -------------------------------------------------------------------
    @staticmethod
    def ap(
        loc: MemoryLocation,
        pattern: list[tuple[int, int]] | None = None,
        offset: Affine | int = 0,
        partitions: int | None = None,
        partition_start: int = 0,
    ) -> AccessPattern:
        """An access pattern on an on-chip tile (default: all of it, contiguous)."""
        offset = offset if isinstance(offset, Affine) else Affine(offset)
        if pattern is None:
            pattern = [(1, loc.shape[1])]
        return AccessPattern(
            loc.name,
            tuple(pattern),
            offset.const,
            offset.terms,
            partition_start,
            loc.num_partitions if partitions is None else partitions,
        )

    def dram_ap(
        self, loc_name: str, offset: Affine, pattern: list[tuple[int, int]]
    ) -> AccessPattern:
        return AccessPattern(loc_name, tuple(pattern), offset.const, offset.terms)

    # --- emission --------------------------------------------------------------------------
    def emit(
        self,
        opcode: Opcode,
        engine: Engine,
        dst: AccessPattern | None,
        srcs: dict[str, AccessPattern],
        **attrs: object,
    ) -> Instruction:
        if opcode is Opcode.TENSOR_SCALAR and _inexact_immediates(attrs):
            return self._exact_scalar_steps(dst, srcs["in"], attrs)
        engine = self._integer_lanes(opcode, engine, dst, srcs)
        inst = Instruction(opcode, engine, dst, srcs, attrs, self.origin)
        if self.homes and not self._planned_copy:
            for ap in (dst, *srcs.values()):
                if ap is not None and ap.loc in self.homes and ap not in self._direct_aps:
                    raise self.fail(
                        f"{opcode} addresses {ap.loc!r}, which the memory plan keeps in SBUF; "
                        "only copies may (docs/memory_planner.md)"
                    )
        self._finalize(inst)
        return inst

    def _integer_lanes(
        self,
        opcode: Opcode,
        engine: Engine,
        dst: AccessPattern | None,
        srcs: dict[str, AccessPattern],
    ) -> Engine:
        """GpSimd for VectorE arithmetic whose tile inputs are all integers, one of them 32-bit,
        or whose result is a narrower integer: VectorE would compute it in fp32, inexact past
        2^24, and its store to an integer saturates where ONNX's integer arithmetic wraps
        (int16 200·200); GpSimd's int32 lanes are exact and their store wraps (NKI dispatches
        int32 arithmetic the same way; docs/neuroncore.md#integers). Booleans and comparisons
        of narrow integers stay on VectorE, exact in fp32. GpSimd cannot reach PSUM."""
        if engine is not Engine.DVE or opcode not in _ARITHMETIC:
            return engine
        locations = self.function.memory_locations
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

    def _exact_scalar_steps(
        self, dst: AccessPattern, src: AccessPattern, attrs: dict[str, object]
    ) -> Instruction:
        """A TensorScalar with an integer immediate that fp32 cannot hold (its scalars are fp32,
        docs/neuroncore.md#integers), as exact steps: each step's scalar set into an int32
        column by a Memset, then a TensorTensor against the column broadcast along the free
        dims (on GpSimd's integer lanes)."""
        column = self.sb_tile("scalar", NUM_PARTITIONS, 1, Dtype.INT32)
        source, last = src, None
        for step in (0, 1):
            op = attrs.get(f"op{step}")
            if op is None:
                break
            value = attrs.get(f"imm{step}")
            if value is None:
                raise self.fail("an exact integer TensorScalar takes immediates only")
            held = AccessPattern(
                column.name, ((1, 1),), 0, (), dst.partition_start, dst.num_partitions
            )
            self.emit(Opcode.MEMSET, Engine.POOL, held, {}, value=value)
            spread = replace(held, pattern=tuple((0, count) for _, count in dst.pattern))
            operands = (spread, source) if attrs.get(f"reverse{step}") else (source, spread)
            last = self.tensor_tensor(dst, *operands, op)
            source = dst
        return last

    def read_operand(self, tile: AccessPattern, src: AccessPattern) -> AccessPattern:
        """The operand a compute instruction reads for `src` (an access to a tensor's DRAM
        view) through `tile`: the tensor's SBUF home itself when the memory plan keeps it
        there and the access lines up lane to lane with the tile in the same dtype, else
        `tile`, loaded from `src` now (docs/memory_planner.md#direct-operands)."""
        direct = self._direct(tile, src, reading=True)
        if direct is not None:
            return direct
        self.dma(tile, src)
        return tile

    def write_operand(self, tile: AccessPattern, dst: AccessPattern) -> AccessPattern:
        """The operand a compute instruction writes for `dst`: the SBUF home, as
        `read_operand` decides, or `tile`, which `store_result` then copies out."""
        direct = self._direct(tile, dst, reading=False)
        return tile if direct is None else direct

    def columns(self, operand: AccessPattern, start: Affine, size: int) -> AccessPattern:
        """Free elements [start, start + size) of a one-row-per-partition operand that
        `read_operand` or `write_operand` returned: a window on its tile, or on the SBUF home
        it reads in place (which compute instructions may then address too)."""
        if len(operand.pattern) != 1 or operand.pattern[0][0] != 1:
            raise self.fail(f"columns of {operand.loc!r}: not one contiguous row per partition")
        at = Affine(operand.offset, operand.offset_terms) + start
        window = replace(operand, pattern=((1, size),), offset=at.const, offset_terms=at.terms)
        if operand in self._direct_aps:
            self._direct_aps.add(window)
        return window

    def store_result(self, dst: AccessPattern, tile: AccessPattern, written: AccessPattern) -> None:
        """Finish a `write_operand`: copy the tile out unless the home was written directly."""
        if written == tile:
            self.dma(dst, tile)

    def _direct(self, tile: AccessPattern, view: AccessPattern, reading: bool):
        if view.loc not in self.homes:
            return None
        locations = self.function.memory_locations
        if locations[tile.loc].dtype != locations[view.loc].dtype:
            return None
        copies = self._plan_copy(tile, view) if reading else self._plan_copy(view, tile)
        if isinstance(copies, str) or len(copies) != 1 or not copies[0].on_chip:
            return None
        home = copies[0].src if reading else copies[0].dst
        self._direct_aps.add(home)
        return home

    def _plan_copy(self, dst: AccessPattern, src: AccessPattern):
        """`residency.plan_copy` for a copy emitted here, under the open loops and predicate."""
        return plan_copy(
            dst,
            src,
            self.homes,
            lambda name: self.function.memory_locations[name].on_chip,
            self.axis_ranges,
            bool(self._predicates),
        )

    def dma(self, dst: AccessPattern, src: AccessPattern) -> Instruction:
        """A DmaCopy; with a memory plan, a copy touching a resident tensor is rewritten onto
        its SBUF home, as a TensorCopy when both sides are then on chip."""
        if not self.homes or (dst.loc not in self.homes and src.loc not in self.homes):
            return super().dma(dst, src)
        copies = self._plan_copy(dst, src)
        if isinstance(copies, str):
            raise self.fail(f"memory plan: {copies}")
        self._planned_copy = True
        try:
            for copy in copies:
                if copy.on_chip:
                    last = self.on_chip_copy(copy.dst, copy.src)
                else:
                    last = super().dma(copy.dst, copy.src)
        finally:
            self._planned_copy = False
        return last

    def on_chip_copy(self, dst: AccessPattern, src: AccessPattern) -> Instruction:
        """A copy between on-chip tiles on the next of `COPY_ENGINES` that can make it.

        ScalarE has no TensorCopy on NeuronCore-v2 (rule ACT-TENSOR-COPY): it copies with an
        Activation of func copy, through fp32, so only between float tiles (an integer past
        2^24 would lose bits); GpSimd cannot reach PSUM (docs/neuroncore.md#rules)."""
        locations = self.function.memory_locations
        ends = (locations[dst.loc], locations[src.loc])
        floats = all(loc.dtype.is_float for loc in ends)
        in_psum = any(loc.memory is MemoryType.PSUM for loc in ends)
        while True:
            engine = COPY_ENGINES[self._copy_engine]
            self._copy_engine = (self._copy_engine + 1) % len(COPY_ENGINES)
            if engine is Engine.ACT and floats:
                return self.activation(dst, src, ActFunc.COPY)
            if engine is Engine.DVE or (engine is Engine.POOL and not in_psum):
                return self.tensor_copy(dst, src, engine)

    def _finalize(self, inst: Instruction) -> None:
        """transformInstruction: id, loop nest, block placement, dependency edges."""
        inst.id = self._next_id
        self._next_id += 1
        inst.loopnest = tuple(self.loopnest)
        if self._predicates:
            inst.predicate = self._predicates[-1]
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

    def fail(self, reason: str) -> CodegenError:
        """An error naming the current node and rule."""
        return CodegenError(f"node {self.origin.node!r} ({self.origin.rule}): {reason}")
