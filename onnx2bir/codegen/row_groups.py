"""Row loops whose tiles overlap on the engines: several row tiles per trip, stage by stage.

In: an extent of rows (or of images, for a per-image normalisation) cut into tiles of a fixed
size, and the SBUF bytes one tile's buffers take. Out: the tiles in groups of up to `GROUP`, a
group per trip of a `tiles(..., buffers=k)` loop (docs/buffers.md#rotation), each tile with a
copy of the buffers of its own (`slot`).

A row normalisation (softmax, layer norm) is a chain of steps on different engines: a
reduction on VectorE or GpSimd, an activation on ScalarE, another reduction, and so on. Each
engine runs its instructions in program order, so a loop body that takes one tile through
the whole chain leaves every engine waiting on the others. A lowering that emits the steps of
a group's tiles interleaved (`emit_staged`: step by step; `emit_skewed`: in waves) lets an
engine start the next tile while the others work on the previous one; the groups rotate over
k sets of copies, so the loop over groups is `parallel` (or double-buffered) too. `EngineLoad`
estimates each engine's share of a group, for steps that more than one engine can run
(docs/row_loops.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from onnx2bir.bir.costs import DEFAULT_TABLE
from onnx2bir.bir.enums import Engine
from onnx2bir.codegen.tiling import Tile, buffer_count, tile_count, tiles

GROUP = 4  # tiles per trip, emitted step by step
COPY_BUDGET = 48 * 1024  # bytes of each partition for the copies of a group's buffers


@dataclass(frozen=True, slots=True)
class RowGroups:
    """How an extent is walked: `group` tiles per trip, `buffers` sets of their copies."""

    extent: int
    size: int
    group: int
    buffers: int

    @property
    def copies(self) -> int:
        """Copies of each per-tile buffer the lowering allocates."""
        return self.group * self.buffers


def plan_groups(cg, extent: int, size: int, copy_bytes: int) -> RowGroups:
    """Tiles per trip and buffer sets for `tiles(extent, size)` whose per-tile buffers take
    `copy_bytes` of each SBUF partition: up to `GROUP` tiles a trip while their copies fit the
    budget, then two sets of them (double buffering) when those fit too.

    The budget is COPY_BUDGET (at least two copies, at most what the node has free): a node's
    arena sits above the SBUF homes of the tensors live across it (docs/memory_planner.md
    #allocation), so copies that are not needed for the overlap would push those tensors to
    DRAM."""
    count = tile_count(extent, size)
    budget = min(cg.sb_free_bytes(), max(COPY_BUDGET, 2 * copy_bytes))
    group = max(1, min(GROUP, count))
    while group > 1 and group * copy_bytes > budget:
        group -= 1
    trips = tile_count(extent, size * group)
    buffers = 1
    if 2 * group * copy_bytes <= budget:
        buffers = buffer_count(cg, trips, group * copy_bytes, limit=2)
    return RowGroups(extent, size, group, buffers)


def row_groups(cg, plan: RowGroups, name: str) -> Iterator[list[Tile]]:
    """The groups of `plan`, one per trip of the loops they open; a tile's `slot` is the copy
    of the per-tile buffers it uses, below `plan.copies`.

    The tile's place in its group picks a block of `buffers` copies and the loop's rotation a
    copy inside it, so the copies of two places never share an interval of addresses over the
    loop's trips: the dependency analysis, which compares ranges of loop values, then sees that
    the steps of different tiles of a group touch different bytes."""
    span = plan.size * plan.group
    for outer in tiles(cg, plan.extent, span, name, buffers=plan.buffers):
        yield [
            Tile(
                outer.start + index * plan.size,
                min(plan.size, outer.size - index * plan.size),
                outer.first and index == 0,
                outer.slot + index * plan.buffers,
            )
            for index in range(tile_count(outer.size, plan.size))
        ]


def emit_skewed(steps: list[list[Callable[[], None]]]) -> None:
    """Emit the steps of a group's tiles (`steps[t][k]`: step k of tile t) wave by wave: wave
    w holds step w − t of each tile t, the oldest tile first. Each engine then meets the tiles
    of a group in a software-pipelined order: tile t's step k follows tile t−1's step k and
    tile t+1's step k−1, so no engine waits for the whole group to finish a step."""
    waves = len(steps) + max((len(s) for s in steps), default=0) - 1
    for wave in range(waves):
        for index, tile_steps in enumerate(steps):
            if 0 <= wave - index < len(tile_steps):
                tile_steps[wave - index]()


def emit_staged(steps: list[list[Callable[[], None]]]) -> None:
    """Emit step k of every tile of a group before step k + 1."""
    for k in range(max((len(s) for s in steps), default=0)):
        for tile_steps in steps:
            if k < len(tile_steps):
                tile_steps[k]()


class EngineLoad:
    """The estimated busy time of each engine over the steps of a group assigned so far, by
    the cost model's formulas (docs/device_time.md#instruction-costs): `pick` gives a step that
    several engines can run to the one that would be done with it first. The steps work on
    SBUF tiles, and VectorE and GpSimd take turns on SBUF (docs/device_time.md#on-chip-ports):
    their steps also add up on the port, and neither is done before the port is."""

    SBUF_PORT_ENGINES = (Engine.DVE, Engine.POOL)

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(Engine, 0.0)
        self.sbuf_port = 0.0

    @staticmethod
    def cost(engine: Engine, n: int, tensor_tensor: bool = False) -> float:
        """Seconds of one pass over `n` elements a partition on `engine`."""
        table = DEFAULT_TABLE
        if engine is Engine.POOL:
            cycles = table.pool_startup + n
        elif engine is Engine.DVE and tensor_tensor:
            cycles = max(table.min_ii, 2 * n)
        else:
            cycles = max(table.min_ii, n)
        return cycles / table.clock(engine)

    def add(self, engine: Engine, n: int, tensor_tensor: bool = False) -> Engine:
        seconds = self.cost(engine, n, tensor_tensor)
        self.seconds[engine] += seconds
        if engine in self.SBUF_PORT_ENGINES:
            self.sbuf_port += seconds
        return engine

    def pick(self, engines: tuple[Engine, ...], n: int, tensor_tensor: bool = False) -> Engine:
        """The first of `engines` to finish the step, which is then counted on it."""

        def done(engine: Engine) -> float:
            before = self.seconds[engine]
            if engine in self.SBUF_PORT_ENGINES:
                before = max(before, self.sbuf_port)
            return before + self.cost(engine, n, tensor_tensor)

        return self.add(min(engines, key=done), n, tensor_tensor)
