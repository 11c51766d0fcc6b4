"""The residency: the tensors the memory plan keeps in SBUF, during code generation
(docs/memory_planner.md).

A resident tensor is an SBUF location at its home, and lowerings address it through its flat
DRAM view as if it were in DRAM (`place`). A DmaCopy touching a home is rewritten onto it
(`dma`, through `residency.plan_copy`): a copy between two on-chip operands that line up becomes
an engine copy (`on_chip_copy`), the others stay DMAs. Those copies go to the emitter's own
builders, which check nothing; every other instruction the code generator emits is first
checked here (`check`): it may address a home only through an operand handed out by
`read_operand`, `write_operand` or `columns` (docs/memory_planner.md#direct-operands).
"""

from __future__ import annotations

from dataclasses import replace

from onnx2bir.bir.dtypes import on_chip
from onnx2bir.bir.enums import ActFunc, Engine, MemoryKind, MemoryType, Opcode
from onnx2bir.bir.ir import AccessPattern, Instruction, MemoryLocation
from onnx2bir.codegen.emitter import Emitter
from onnx2bir.codegen.instructions import InstructionBuilders
from onnx2bir.codegen.residency import Copy, Home, plan_copy
from onnx2bir.codegen.tiling import Affine

# On-chip copies of resident tensors take these engines in turn (`Residency.on_chip_copy`).
COPY_ENGINES = (Engine.ACT, Engine.DVE, Engine.POOL)


class Residency:
    """SBUF homes, the operands read or written in place, and the DMA rewrite."""

    def __init__(self, emitter: Emitter, homes: dict[str, Home]) -> None:
        self.emitter = emitter
        self.homes = homes
        self._dram_views: dict[str, MemoryLocation] = {}
        self._direct: set[AccessPattern] = set()  # home accesses handed to a lowering
        # The next of `COPY_ENGINES` to try. The engines are taken in turn over the whole
        # function, so a copy's engine depends on the copies before it; choosing it from the
        # copy alone would move most copies to another engine (a different program).
        self._copy_engine = 0

    def view(self, name: str) -> MemoryLocation | None:
        """The flat DRAM view of resident tensor `name`, once placed."""
        return self._dram_views.get(name)

    def place(self, view: MemoryLocation) -> MemoryLocation:
        """Put a resident tensor at its SBUF home; return its flat DRAM view, which lowerings
        address as if the tensor were in DRAM (`dma` rewrites those accesses)."""
        home = self.homes[view.name]
        self.emitter.function.add_memory_location(
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

    def check(self, opcode: Opcode, dst: AccessPattern | None, srcs: dict) -> None:
        """Refuse an instruction that addresses a home other than through a direct operand."""
        if not self.homes:
            return
        for ap in (dst, *srcs.values()):
            if ap is not None and ap.loc in self.homes and ap not in self._direct:
                raise self.emitter.fail(
                    f"{opcode} addresses {ap.loc!r}, which the memory plan keeps in SBUF; "
                    "only copies may (docs/memory_planner.md)"
                )

    # --- direct operands -------------------------------------------------------------------
    def read_operand(self, tile: AccessPattern, src: AccessPattern) -> AccessPattern:
        """The operand a compute instruction reads for `src` (an access to a tensor's DRAM
        view) through `tile`: the tensor's SBUF home itself when the memory plan keeps it
        there and the access lines up lane to lane with the tile in the same dtype, else
        `tile`, loaded from `src` now (docs/memory_planner.md#direct-operands)."""
        direct = self._direct_operand(tile, src, reading=True)
        if direct is not None:
            return direct
        self.dma(tile, src)
        return tile

    def write_operand(self, tile: AccessPattern, dst: AccessPattern) -> AccessPattern:
        """The operand a compute instruction writes for `dst`: the SBUF home, as
        `read_operand` decides, or `tile`, which `store_result` then copies out."""
        direct = self._direct_operand(tile, dst, reading=False)
        return tile if direct is None else direct

    def columns(self, operand: AccessPattern, start: Affine, size: int) -> AccessPattern:
        """Free elements [start, start + size) of a one-row-per-partition operand that
        `read_operand` or `write_operand` returned: a window on its tile, or on the SBUF home
        it reads in place (which compute instructions may then address too)."""
        if len(operand.pattern) != 1 or operand.pattern[0][0] != 1:
            raise self.emitter.fail(
                f"columns of {operand.loc!r}: not one contiguous row per partition"
            )
        at = Affine(operand.offset, operand.offset_terms) + start
        window = replace(operand, pattern=((1, size),), offset=at.const, offset_terms=at.terms)
        if operand in self._direct:
            self._direct.add(window)
        return window

    def _direct_operand(self, tile: AccessPattern, view: AccessPattern, reading: bool):
        if view.loc not in self.homes:
            return None
        locations = self.emitter.function.memory_locations
        if locations[tile.loc].dtype != locations[view.loc].dtype:
            return None
        copies = self._plan_copy(tile, view) if reading else self._plan_copy(view, tile)
        if isinstance(copies, str) or len(copies) != 1 or not copies[0].on_chip:
            return None
        home = copies[0].src if reading else copies[0].dst
        self._direct.add(home)
        return home

    # --- copies ----------------------------------------------------------------------------
    def _plan_copy(self, dst: AccessPattern, src: AccessPattern) -> list[Copy] | str:
        """`residency.plan_copy` for a copy emitted now, under the open loops and predicate."""
        emitter = self.emitter
        return plan_copy(
            dst,
            src,
            self.homes,
            lambda name: emitter.function.memory_locations[name].on_chip,
            emitter.axis_ranges,
            bool(emitter.predicates),
        )

    def dma(self, dst: AccessPattern, src: AccessPattern) -> Instruction:
        """A DmaCopy; with a memory plan, a copy touching a resident tensor is rewritten onto
        its SBUF home, as a TensorCopy when both sides are then on chip."""
        if dst.loc not in self.homes and src.loc not in self.homes:
            return self.emitter.dma(dst, src)
        copies = self._plan_copy(dst, src)
        if isinstance(copies, str):
            raise self.emitter.fail(f"memory plan: {copies}")
        for copy in copies:
            if copy.on_chip:
                last = self.on_chip_copy(copy.dst, copy.src, self.emitter)
            else:
                last = self.emitter.dma(copy.dst, copy.src)
        return last

    def on_chip_copy(
        self, dst: AccessPattern, src: AccessPattern, builders: InstructionBuilders
    ) -> Instruction:
        """A copy between on-chip tiles on the next of `COPY_ENGINES` that can make it,
        emitted by `builders`.

        ScalarE has no TensorCopy on NeuronCore-v2 (rule ACT-TENSOR-COPY): it copies with an
        Activation of func copy, through fp32, so only between float tiles (an integer past
        2^24 would lose bits); GpSimd cannot reach PSUM (docs/neuroncore.md#rules)."""
        locations = self.emitter.function.memory_locations
        ends = (locations[dst.loc], locations[src.loc])
        floats = all(loc.dtype.is_float for loc in ends)
        in_psum = any(loc.memory is MemoryType.PSUM for loc in ends)
        while True:
            engine = COPY_ENGINES[self._copy_engine]
            self._copy_engine = (self._copy_engine + 1) % len(COPY_ENGINES)
            if engine is Engine.ACT and floats:
                return builders.activation(dst, src, ActFunc.COPY)
            if engine is Engine.DVE or (engine is Engine.POOL and not in_psum):
                return builders.tensor_copy(dst, src, engine)
