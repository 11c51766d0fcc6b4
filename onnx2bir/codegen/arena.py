"""The arena: the on-chip bytes a node allocates its tiles from (docs/memory_planner.md).

Below every arena lie the reserved tiles (the resident identity). A top-level node's SBUF tiles
are taken upward from where the memory plan starts its arena (without a plan, just above the
reserved tiles) and its PSUM tiles from bank 0; `with arena.node(item, name)` opens that
arena, and when it closes, records how much of it the node used. A node lowered inside
another (a Loop body's) takes its tiles above the enclosing node's, free again when it is done
(`with arena.nested()`). `needs` is what the first pass tells the planner: each node's SBUF
and PSUM use, the reserved bytes and every weight a node loads whole (`weight_tile`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from onnx2bir.bir.dtypes import on_chip
from onnx2bir.bir.enums import PAYLOAD_KINDS, Dtype, MemoryKind, MemoryType
from onnx2bir.bir.ir import MemoryLocation
from onnx2bir.bir.opcodes import (
    NUM_PARTITIONS,
    PSUM_BANK_BYTES,
    PSUM_NUM_BANKS,
    SB_ALIGN,
    SBUF_BYTES_PER_PARTITION,
)
from onnx2bir.codegen.emitter import CodegenError, Emitter
from onnx2bir.codegen.planner import ArenaNeeds, MemoryPlan, WeightRequest


class Arena:
    """SBUF and PSUM allocation for the node being lowered (module docstring)."""

    def __init__(self, emitter: Emitter, plan: MemoryPlan | None) -> None:
        self.emitter = emitter
        self.plan = plan
        self.needs = ArenaNeeds()
        # The SBUF bytes (per partition, [start, end)) of the weights the last node that
        # loaded some holds: a node with two copies of its weight tile loads the other one,
        # so that its loads need not wait for that node's matmuls (docs/buffers.md#weights).
        self.last_weights: tuple[int, int] | None = None
        self._sb_top = 0
        self._top = 0  # the highest `_sb_top` of the node
        self._base = 0
        self._psum_next_bank = 0
        self._tile_count = 0
        self._in_node = False

    @property
    def in_node(self) -> bool:
        """Whether a top-level node's arena is open."""
        return self._in_node

    def reserve(self) -> None:
        """Keep the tiles allocated so far below every arena."""
        self.needs.reserved = self._sb_top

    @contextmanager
    def node(self, item: int, name: str) -> Iterator[None]:
        """The arena of top-level node `name`, whose scope is entry item `item`."""
        base = self.plan.arena_base(item) if self.plan else self.needs.reserved
        self._sb_top = self._top = self._base = base
        self._psum_next_bank = 0
        self._in_node = True
        try:
            yield
        finally:
            self._in_node = False
        self.needs.sbuf[item] = self._top - base
        self.needs.nodes[item] = name
        self.needs.psum[item] = self._psum_next_bank * PSUM_BANK_BYTES

    @contextmanager
    def nested(self) -> Iterator[None]:
        """Tiles above the open node's, free again afterwards."""
        saved = self._sb_top, self._psum_next_bank
        yield
        self._sb_top, self._psum_next_bank = saved

    def loaded_weights(self, start: int, end: int) -> None:
        """The node now loading weights holds SBUF bytes [start, end) (`last_weights`)."""
        self.last_weights = (start, end)

    def _tile_name(self, tag: str) -> str:
        self._tile_count += 1
        return f"{self.emitter.origin.node}/{tag}#{self._tile_count}"

    def sb_tile(
        self, tag: str, partitions: int, free: int, dtype: Dtype, name: str | None = None
    ) -> MemoryLocation:
        """Allocate an SBUF tile of `partitions` x `free` elements in the node's arena; an
        int64 tile is int32 on chip (`on_chip`, docs/neuroncore.md#integers)."""
        dtype = on_chip(dtype)
        nbytes = -(-free * dtype.itemsize // SB_ALIGN) * SB_ALIGN
        if partitions > NUM_PARTITIONS or self._sb_top + nbytes > SBUF_BYTES_PER_PARTITION:
            origin = self.emitter.origin
            raise CodegenError(
                f"node {origin.node!r} ({origin.rule}): SBUF tile {tag!r} of "
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
        self._top = max(self._top, self._sb_top)
        return self.emitter.function.add_memory_location(loc)

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
        locations = self.emitter.function.memory_locations
        source = locations.get(key[0])
        if source is None or source.kind not in PAYLOAD_KINDS:
            return self.sb_tile(tag, partitions, free, dtype), True  # computed: not shared
        item = self.emitter.entry_items - 1  # the node's scope, open
        home = self.plan.weight_home(key, item) if self.plan else None
        if home is None:
            tile = self.sb_tile(tag, partitions, free, dtype)
            request = WeightRequest(item, key, partitions, tile.bytes_per_partition)
            self.needs.weights.append(request)
            return tile, True
        self.sb_tile(tag, partitions, free, dtype)  # the bytes of the node's own copy
        if home.name not in locations:
            self.emitter.function.add_memory_location(
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
        used = self._sb_top - self._base
        return SBUF_BYTES_PER_PARTITION - self.needs.reserved - used

    def psum_free_banks(self) -> int:
        """PSUM banks the node can still allocate."""
        return PSUM_NUM_BANKS - self._psum_next_bank

    def psum_tile(self, tag: str, partitions: int, free: int) -> MemoryLocation:
        """Allocate a PSUM tile (fp32) in whole 2 KiB banks; a node has the 8 banks to itself."""
        banks = -(-free * 4 // PSUM_BANK_BYTES)
        if self._psum_next_bank + banks > PSUM_NUM_BANKS:
            raise self.emitter.fail(
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
        return self.emitter.function.add_memory_location(loc)
