"""Random programs ordered the same with and without pruning, and race-free.

Each seed builds a small program through the code generator's own builders: scopes whose
tiles reuse the same SBUF bytes, counted loops (1 to 4 trips, nested) and runtime loops,
loads, stores and copies on every engine over static, moving and strided slices of the
tiles, on all partitions or half of them. It is built twice, with `codegen/deps.py` and with
the reference analysis, and `deps_equivalence.compare_functions` must find the same order;
the race detector must find no race with the runtime loops at 0 and 2 trips.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

from onnx2bir.bir.enums import Dtype, Engine
from onnx2bir.bir.ir import AccessPattern, Function, MemoryLocation, RuntimeValue, runtime_loops
from onnx2bir.codegen import emitter
from onnx2bir.codegen.tiling import Affine
from onnx2bir.runtime.machine.program import unroll
from onnx2bir.runtime.machine.races import RaceDetector

sys.path.insert(0, str(Path(__file__).resolve().parent))
from deps_equivalence import compare_functions, relu_codegen  # noqa: E402
from reference_deps import DependencyTracker as ReferenceTracker  # noqa: E402

ROW = 512  # elements per row of the DRAM tensors x and y
ENGINES = (Engine.ACT, Engine.DVE, Engine.POOL)


class _Builder:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.cg = relu_codegen(ROW)

    def program(self) -> None:
        cg, rng = self.cg, self.rng
        with cg.scope("s"):
            tiles = [
                cg.sb_tile(f"t{k}", 128, rng.choice([64, 128, 256]), Dtype.FP32)
                for k in range(rng.randint(1, 3))
            ]
            for phase in range(rng.randint(2, 4)):  # phases reuse the same bytes
                with cg.scope(f"p{phase}"):
                    self.block(tiles, [], 0)
        cg.after_function()

    def block(self, tiles: list[MemoryLocation], axes: list[tuple[str, int]], depth: int) -> None:
        cg, rng = self.cg, self.rng
        for _ in range(rng.randint(2, 5)):
            kind = rng.choice(["load", "store", "copy", "copy", "loop" if depth < 2 else "load"])
            if kind == "loop":
                if rng.random() < 0.15:
                    with cg.runtime_loop(cg.dynamic_loop("r", 0, RuntimeValue("x", 0))):
                        self.block(tiles, axes, depth + 1)  # offsets do not move with it
                else:
                    trips = rng.choice([1, 2, 2, 3, 4])
                    with cg.loop("i", 0, trips) as axis:
                        self.block(tiles, axes + [(axis, trips)], depth + 1)
                continue
            parts, start = rng.choice([(128, 0), (128, 0), (64, 0), (64, 64)])
            tile, other = rng.choice(tiles), rng.choice(tiles)
            width = min(rng.choice([32, 64, 128]), tile.shape[1], other.shape[1])
            first = self.slice(tile, width, axes, parts, start)
            if kind == "load":
                cg.dma(first, self.dram("x", width, parts, start, axes))
            elif kind == "store":
                cg.dma(self.dram("y", width, parts, start, axes), first)
            else:
                second = self.slice(other, width, axes, parts, start)
                engine = rng.choice(ENGINES)
                if engine is Engine.ACT and rng.random() < 0.5:
                    cg.activation(first, second, "relu")
                else:
                    cg.tensor_copy(first, second, engine)

    def offset(self, free: int, width: int, axes: list[tuple[str, int]]) -> Affine:
        """A first element that keeps `width` elements inside `free` for every loop value:
        fixed, moving with a loop from 0 (a sweep over the tile, which covers what came
        before it), or moving from anywhere."""
        rng = self.rng
        offset = Affine(rng.randrange(0, free - width + 1, 32))
        if axes and rng.random() < 0.7:
            axis, trips = rng.choice(axes)
            coef = width if rng.random() < 0.6 else rng.choice([width // 2, 2 * width])
            const = 0
            if rng.random() < 0.4:
                const = rng.randrange(0, max(1, free - width - coef * (trips - 1) + 1), 32)
            if const + coef * (trips - 1) + width <= free:
                offset = Affine(const) + Affine.axis(axis, coef)
        return offset

    def slice(
        self, tile: MemoryLocation, width: int, axes: list[tuple[str, int]], parts: int, start: int
    ) -> AccessPattern:
        free = tile.shape[1]
        if self.rng.random() < 0.25 and 2 * width <= free:  # every other element
            return self.cg.ap(tile, [(2, width)], self.offset(free, 2 * width, axes), parts, start)
        return self.cg.ap(tile, [(1, width)], self.offset(free, width, axes), parts, start)

    def dram(
        self, name: str, width: int, parts: int, start: int, axes: list[tuple[str, int]]
    ) -> AccessPattern:
        offset = self.offset(ROW, width, axes) + start * ROW
        return self.cg.dram_ap(name, offset, [(ROW, parts), (1, width)])


def _build(seed: int, tracker: type) -> Function:
    original = emitter.DependencyTracker
    emitter.DependencyTracker = tracker
    try:
        builder = _Builder(seed)
        builder.program()
    finally:
        emitter.DependencyTracker = original
    return builder.cg.function


def _races(function: Function, trips: int) -> list:
    program = unroll(function, {id(loop): [trips] * 64 for loop in runtime_loops(function.entry)})
    detector = RaceDetector(program)
    for index in range(len(program)):
        detector.check(index)
    return detector.races


@pytest.mark.parametrize("seed", range(100))
def test_a_random_program_is_ordered_as_by_the_reference_and_race_free(seed):
    new = _build(seed, emitter.DependencyTracker)
    reference = _build(seed, ReferenceTracker)
    assert compare_functions(reference, new) is None
    assert not _races(new, 0) and not _races(new, 2)
