"""The BIR code generator, in BirCodeGenLoop's shape (docs/bir_codegen.md).

In: a `Graph` after the pattern passes. Out: a `bir.Module` with one function, and what its
arenas needed (`ArenaNeeds`, the memory planner's input).

`BirCodeGen` walks the graph and holds three collaborators, which lowerings and kernels reach
through it (docs/architecture.md#codegen): the `Emitter` (codegen/emitter.py: the block stack,
loops, scopes, predicates and the finalizer), the `Arena` (codegen/arena.py: SBUF and PSUM
tiles of the node being lowered) and the `Residency` (codegen/homes.py: the tensors the memory
plan keeps in SBUF, the operands read in place and the rewrite of copies touching them). It
also makes the DRAM locations of graph tensors.

- Prologue (`before_function`): create the function and its entry block "Block1", bind the
  graph's inputs and outputs to DRAM memory locations (`ensure_dst_on_function`), and load the
  identity matrix the PE array multiplies by to transpose a tile.
- Walk: every op node, in topological order, is emitted inside a scope region (a one-trip
  loop) that bounds the lifetime of its SBUF and PSUM tiles, in its arena. A node's lowering is
  found by name: a NativeKernel's `func_name` or a CustomCall's `custom_call_target` in the
  kernel registry, any other op in the generic lowering table. Lowerings emit through the
  per-opcode builders of `codegen/instructions.py`; `emit` asks the residency whether the
  instruction may touch what it touches, then hands it to the emitter.
- Epilogue (`after_function`): in a no_reorder scope, copies graph outputs that no node
  writes (constants, inputs passed through), then closes "Block1" and settles which loops are
  parallel.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from onnx2bir.bir.enums import PAYLOAD_KINDS, Dtype, Engine, MemoryKind, MemoryType, Opcode
from onnx2bir.bir.ir import (
    AccessPattern,
    Function,
    Instruction,
    MemoryLocation,
    Module,
    Origin,
    all_loops,
)
from onnx2bir.bir.opcodes import NUM_PARTITIONS
from onnx2bir.bir.parallel import parallel_hazards
from onnx2bir.codegen.arena import Arena
from onnx2bir.codegen.casting import storage_dtype
from onnx2bir.codegen.emitter import CodegenError, Emitter, stamp_loop_modes
from onnx2bir.codegen.homes import Residency
from onnx2bir.codegen.instructions import InstructionBuilders
from onnx2bir.codegen.locations import dram_kind, kept_fp32
from onnx2bir.codegen.planner import ArenaNeeds, MemoryPlan
from onnx2bir.codegen.registry import lowering_key
from onnx2bir.codegen.scalar_steps import exact_scalar_steps, inexact_immediates
from onnx2bir.codegen.tiling import Affine
from onnx2bir.graph import Graph, Node
from onnx2bir.options import CompileOptions

__all__ = [
    "IDENTITY",
    "IDENTITY_DRAM",
    "BirCodeGen",
    "CodegenError",
    "kernel_name_of",
    "stamp_loop_modes",
]

IDENTITY = "identity_fp32"  # the SBUF tile (docs/bir_codegen.md#prologue: "identity_<dtype>")
IDENTITY_DRAM = "identity_matrices.fp32"  # its constant source in DRAM


def kernel_name_of(data: dict) -> str | None:
    """The kernel a node asks for: a NativeKernel's `func_name` (conv selection) or a
    CustomCall's `custom_call_target` (attention and MLP raises); None for a plain op."""
    if data["op_type"] == "NativeKernel":
        return data["attrs"]["func_name"]
    if data["op_type"] == "CustomCall":
        return data["attrs"]["custom_call_target"]
    return None


def _to(collaborator: str, name: str, doc: str = "") -> property:
    """A member of a collaborator, read through the code generator."""
    prop = property(lambda self: getattr(getattr(self, collaborator), name))
    prop.__doc__ = doc or f"`{collaborator}.{name}`"
    return prop


class BirCodeGen(InstructionBuilders):
    """The walk over the graph and the façade lowerings and kernels emit through."""

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
        self.options = options
        self.lowerings = lowerings
        self.kernels = kernels
        # createMemLoc's `tensor_memkind`: a per-tensor MemoryKind that beats the predicates.
        self.tensor_memkind: dict[str, MemoryKind] = dict(tensor_memkind or {})
        # Compile-time payloads computed from the graph's constants (a weight stored
        # transposed), by location name: the planner's two passes share one copy.
        self.derived_constants = {} if derived_constants is None else derived_constants
        self.module = Module(name=graph.name, metadata={"opset": graph.opset})
        # The memory plan (docs/memory_planner.md): tensors with an SBUF home, and where each
        # node's arena starts. Without one every tensor lives in DRAM and every arena starts
        # just above the reserved tiles.
        self.memory_plan = memory_plan
        self.emitter = Emitter(planning_run)
        self.arena = Arena(self.emitter, memory_plan)
        self.residency = Residency(self.emitter, memory_plan.homes if memory_plan else {})

    # --- the collaborators, as lowerings and kernels reach them ----------------------------
    function = _to("emitter", "function")
    origin = _to("emitter", "origin", "The node being lowered and its rule.")
    loopnest = _to("emitter", "loopnest")
    axis_ranges = _to("emitter", "axis_ranges")
    loop = _to("emitter", "loop")
    scope = _to("emitter", "scope")
    predicated = _to("emitter", "predicated")
    runtime_loop = _to("emitter", "runtime_loop")
    dynamic_loop = _to("emitter", "dynamic_loop")
    do_while = _to("emitter", "do_while")
    next_dma_queue = _to("emitter", "next_dma_queue")
    fail = _to("emitter", "fail")
    sb_tile = _to("arena", "sb_tile")
    psum_tile = _to("arena", "psum_tile")
    weight_tile = _to("arena", "weight_tile")
    sb_free_bytes = _to("arena", "sb_free_bytes")
    psum_free_banks = _to("arena", "psum_free_banks")
    homes = _to("residency", "homes")
    read_operand = _to("residency", "read_operand")
    write_operand = _to("residency", "write_operand")
    columns = _to("residency", "columns")
    dma = _to("residency", "dma", "A DmaCopy, rewritten onto the SBUF homes it touches.")

    def on_chip_copy(self, dst: AccessPattern, src: AccessPattern) -> Instruction:
        """A copy between on-chip tiles on the next copy engine that can make it."""
        return self.residency.on_chip_copy(dst, src, self)

    def store_result(self, dst: AccessPattern, tile: AccessPattern, written: AccessPattern) -> None:
        """Finish a `write_operand`: copy the tile out unless the home was written directly."""
        if written == tile:
            self.dma(dst, tile)

    def emit(
        self,
        opcode: Opcode,
        engine: Engine,
        dst: AccessPattern | None,
        srcs: dict[str, AccessPattern],
        **attrs: object,
    ) -> Instruction:
        """An instruction of the node being lowered, checked by the residency."""
        if opcode is Opcode.TENSOR_SCALAR and inexact_immediates(attrs):
            return exact_scalar_steps(self, dst, srcs["in"], attrs)
        self.residency.check(opcode, dst, srcs)
        return self.emitter.emit(opcode, engine, dst, srcs, **attrs)

    # --- driver ----------------------------------------------------------------------------
    def run(self) -> Module:
        self.before_function()
        for name in self.graph.topological_order():
            self.transform_node(name)
        self.after_function()
        return self.module

    def generate(self) -> tuple[Module, ArenaNeeds]:
        """`run`, and what the arenas of its nodes needed."""
        return self.run(), self.arena.needs

    def before_function(self) -> None:
        fn = Function(self.graph.name)
        self.module.functions.append(fn)
        self.emitter.begin(fn)
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
        self.arena.reserve()
        self.dma(
            self.ap(tile), self.dram_ap(IDENTITY_DRAM, Affine(), [(NUM_PARTITIONS, 128), (1, 128)])
        )

    @staticmethod
    def identity(size: int) -> AccessPattern:
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
        self.emitter.origin = Origin(name, rule)
        item = self.emitter.entry_items
        # A node of a Loop body, lowered inside its Loop's node, takes its tiles above the
        # Loop's; every other node has an arena of its own.
        arena = self.arena.nested() if self.arena.in_node else self.arena.node(item, name)
        with arena, self.scope(f"node_{item}"):
            lower(self, Node.of(data))

    def after_function(self) -> None:
        self.emitter.origin = Origin("<epilogue>", "codegen.epilogue")
        written = {t for _, d in self.graph.nodes() for t in d["outputs"]}
        with self.scope("epilogue", no_reorder=True):  # outputs are published in order
            self._copy_outputs(written)
        self.emitter.end()
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

    # --- DRAM locations --------------------------------------------------------------------
    def dram(self, tensor: str) -> MemoryLocation:
        """The DRAM location holding graph tensor `tensor` (created on first use); a tensor
        the memory plan keeps in SBUF is placed at its home, and this is its flat view."""
        fn = self.function
        view = self.residency.view(tensor)
        if view is not None:
            return view
        if tensor in fn.memory_locations:
            return fn.memory_locations[tensor]
        info = self.graph.tensors[tensor]
        kind = dram_kind(self.graph, self.tensor_memkind, tensor)
        # `--auto-cast all` stores the model's intermediates narrow, not a pass's copies of
        # them (a graph output's layout copy would round the output).
        dtype = (
            storage_dtype(self.options, kind, info.dtype, kept_fp32(self.graph, tensor))
            if self.graph.is_model_tensor(tensor)
            else info.dtype
        )
        loc = MemoryLocation(tensor, MemoryType.DRAM, kind, dtype, tuple(info.shape))
        if tensor in self.homes:
            return self.residency.place(loc)
        if kind in PAYLOAD_KINDS:
            # ascontiguousarray turns a 0-d array into shape (1,); keep the tensor's shape.
            self.module.constants[tensor] = np.ascontiguousarray(info.const).reshape(
                info.const.shape
            )
        return fn.add_memory_location(loc)

    def output_location(self, tensor: str) -> MemoryLocation:
        """The ExternalOutput location of a graph output (a copy when the tensor is not one)."""
        if dram_kind(self.graph, self.tensor_memkind, tensor) in (
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
            return self.residency.place(loc)
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

    @staticmethod
    def dram_ap(loc_name: str, offset: Affine, pattern: list[tuple[int, int]]) -> AccessPattern:
        return AccessPattern(loc_name, tuple(pattern), offset.const, offset.terms)
