"""Multi-buffered tile loops (docs/buffers.md): the rotation `tiles(buffers=k)` emits, the
loops the dependency analysis then finds `parallel`, and each rotating lowering against
onnxruntime with tile counts below and above the number of copies, race-free under a random
schedule."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from conftest import assert_matches_onnxruntime, one_node_model

from onnx2bir.bir.enums import Opcode
from onnx2bir.bir.ir import Loop, all_loops
from onnx2bir.codegen import GENERIC_LOWERINGS, BirCodeGen
from onnx2bir.codegen.tiling import BUFFERED_LOOPS, Affine, tiles
from onnx2bir.compiler import compile_graph, import_graph
from onnx2bir.options import CompileOptions
from onnx2bir.runtime.machine.schedule import parse_schedule, run_scheduled
from onnx2bir.runtime.oracle.ort import synthesize_inputs
from onnx2bir.runtime.timing.cost import CostTable
from onnx2bir.runtime.timing.device_time import simulate


def _loops(block) -> list[Loop]:
    return list(all_loops(block))


def _assert_rotated(buffered: dict[str, int], loops: dict[str, Loop]) -> None:
    """Some loop rotates copies, and one with a copy for each trip carries no hazard (a loop
    over groups of copies, `<name>g<n>`, reuses them: docs/buffers.md#rotation)."""
    assert buffered
    for axis in buffered:
        if not axis.rstrip("0123456789").endswith("g"):
            assert loops[axis].parallel, axis


# --- the rotation itself --------------------------------------------------------------------


def _walk(extent: int, size: int, copies: int, **kw) -> tuple[BirCodeGen, list]:
    """Run `tiles` in a bare code generator; returns it and each yielded tile with the loop
    axes open at that point."""
    graph = import_graph(one_node_model("Relu", {"x": (4, 4)}))
    cg = BirCodeGen(graph, CompileOptions(), GENERIC_LOWERINGS, {})
    cg.before_function()
    seen = []
    for tile in tiles(cg, extent, size, "t", buffers=copies, **kw):
        predicates = cg.emitter.predicates
        predicate = predicates[-1] if predicates else None
        seen.append((tile, {a: cg.axis_ranges[a] for a in cg.loopnest}, predicate))
    return cg, seen


def _instances(tile, ranges: dict) -> list[tuple[int, int, int]]:
    """(start, slot, size) of each execution of `tile`, by enumerating its loops' values."""
    axes = list(ranges)
    out = []
    for values in itertools.product(*(range(lo, hi + 1) for lo, hi in ranges.values())):
        env = dict(zip(axes, values, strict=True))
        start = tile.start.const + sum(c * env[a] for a, c in tile.start.terms)
        slot = tile.slot.const + sum(c * env[a] for a, c in tile.slot.terms)
        out.append((start, slot, tile.size))
    return out


@pytest.mark.parametrize(
    ("extent", "size", "copies"),
    [(40, 10, 4), (30, 10, 4), (100, 10, 2), (95, 10, 2), (70, 10, 3), (10, 10, 2), (7, 10, 2)],
)
def test_tiles_cover_the_extent_once_and_slots_stay_below_the_copies(extent, size, copies):
    cg, seen = _walk(extent, size, copies)
    starts = []
    for tile, ranges, _ in seen:
        for start, slot, length in _instances(tile, ranges):
            starts.append(start)
            assert 0 <= slot < copies
            assert length == min(size, extent - start)
    assert sorted(starts) == list(range(0, extent, size))


def test_few_tiles_get_one_loop_with_a_copy_each():
    cg, seen = _walk(40, 10, 4)
    (loop,) = _loops(cg.function.entry)
    assert loop.trip_count == 4 and cg.module.metadata[BUFFERED_LOOPS] == {loop.axis: 4}
    ((tile, _, _),) = seen
    assert dict(tile.slot.terms) == {loop.axis: 1}


def test_more_tiles_than_copies_split_into_groups_of_copies():
    # One loop over groups of 2 whose body holds both copies, each its own instructions.
    cg, seen = _walk(100, 10, 2)
    (outer,) = _loops(cg.function.entry)
    assert outer.trip_count == 5
    assert cg.module.metadata[BUFFERED_LOOPS] == {outer.axis: 2}
    assert [(tile.slot, dict(tile.start.terms), tile.start.const) for tile, _, _ in seen] == [
        (Affine(0), {outer.axis: 20}, 0),
        (Affine(1), {outer.axis: 20}, 10),
    ]


def test_a_predicated_split_loop_bounds_the_edge_tile_in_both_axes():
    # 95 = 9 full tiles + 5: the loops run 10 full-size tiles, each under "rows < 95 - start".
    cg, seen = _walk(95, 10, 2, predicated=True)
    runs = []
    for tile, ranges, predicate in seen:
        axes = list(ranges)
        for values in itertools.product(*(range(lo, hi + 1) for lo, hi in ranges.values())):
            env = dict(zip(axes, values, strict=True))
            start = tile.start.const + sum(c * env[a] for a, c in tile.start.terms)
            runs.append((start, predicate.bound(env)))
    assert sorted(runs) == [(start, 95 - start) for start in range(0, 95, 10)]


# --- lowerings: parallel output loops, sequential accumulation ------------------------------


def _compile(model, passes=None):
    return compile_graph(import_graph(model), CompileOptions(auto_cast="none"), passes)


def _check_races(model, passes=None, seed: int = 1) -> None:
    compiled = _compile(model, passes)
    feeds = synthesize_inputs(compiled.graph, 0)
    run = run_scheduled(compiled.module, feeds, parse_schedule(f"random:{seed}"), True)
    assert run.race_count == 0, run.races[:3]


def _conv(x_shape, w_shape, **attrs):
    rng = np.random.default_rng(1)
    w = (rng.standard_normal(w_shape) / np.sqrt(np.prod(w_shape[1:]))).astype(np.float32)
    return one_node_model(
        "Conv", {"x": x_shape}, initializers={"w": w}, kernel_shape=list(w_shape[2:]), **attrs
    )


# Output rows per tile: 512 // out_w. 40x40 -> 12 rows, 4 tiles (one copy each); 80x80 -> 6
# rows, 14 tiles (double buffered: 6 groups of 2, a leftover tile, the 2-row edge tile).
CONV_CASES = {
    "below_k": ((1, 4, 40, 40), (6, 4, 3, 3)),
    "above_k": ((1, 4, 80, 80), (6, 4, 3, 3)),
}


@pytest.mark.parametrize("case", list(CONV_CASES))
@pytest.mark.parametrize("generic", [True, False], ids=["generic", "kernel"])
def test_conv_output_tiles_rotate_and_match_onnxruntime(case, generic):
    x_shape, w_shape = CONV_CASES[case]
    model = _conv(x_shape, w_shape, pads=[1, 1, 1, 1])
    passes = [] if generic else None
    compiled = _compile(model, passes)
    fn = compiled.module.functions[0]
    rules = {i.origin.rule for i in fn.instructions() if i.origin.node != "<prologue>"}
    expected_rule = "generic.Conv" if generic else "kernel.Conv2d_dw_fb01_io01_01bf_rep_nhwc_Pcinh"
    assert expected_rule in rules
    buffered = compiled.module.metadata[BUFFERED_LOOPS]
    loops = {loop.axis: loop for loop in _loops(fn.entry) if loop.trip_count > 1}
    if case == "below_k":  # a copy per trip: no carried hazard
        assert list(buffered.values()) == [4]
        assert all(loops[axis].parallel for axis in buffered)
    else:  # the loop over groups of two copies reuses them: it carries the hazard
        ((axis, copies),) = buffered.items()
        assert copies == 2 and axis.startswith("ohg") and not loops[axis].parallel
    assert_matches_onnxruntime(model, passes=passes)
    _check_races(model, passes)


@pytest.mark.parametrize("generic", [True, False], ids=["generic", "kernel"])
def test_a_band_load_waits_for_its_own_copy_not_for_the_tile_before(generic):
    """Double buffering as the simulation times it: the band load of each output tile starts
    before the matmuls of the tile just before it end (they read the other copy); it waits
    only for the matmuls that read its own copy, two tiles before. With the copies in an inner
    loop, a loop-carried edge waited for the last trip of the previous group, the tile just
    before, for every group's first copy."""
    x_shape, w_shape = CONV_CASES["above_k"]
    compiled = _compile(_conv(x_shape, w_shape, pads=[1, 1, 1, 1]), [] if generic else None)
    slices = simulate(compiled.module.functions[0], CostTable()).slices
    # The trips simulated one by one (a loop's last trip stands for the rest, shifted), cut
    # into tiles: each tile's band loads, then its matmuls.
    tiles: list[tuple[float, float]] = []  # (first band load's start, last matmul's end)
    for piece in itertools.takewhile(lambda piece: piece.weight == 1, slices):
        if piece.ins.dst is not None and "/band" in piece.ins.dst.loc:
            if not tiles or tiles[-1][1] > 0:
                tiles.append((piece.start, 0.0))
        elif piece.ins.opcode is Opcode.MATMULT and tiles:
            tiles[-1] = (tiles[-1][0], piece.end)
    assert len(tiles) >= 4
    for index, ((_, before), (start, _)) in enumerate(itertools.pairwise(tiles[1:]), 2):
        assert start < before, f"tile {index}'s band loads wait for tile {index - 1}'s matmuls"


def test_conv_output_loop_is_parallel_and_its_channel_accumulation_is_not():
    # 400 input channels: a peeled first 128-channel tile, then a 2-trip accumulation loop
    # (and a 16-channel edge tile); 40 x 40 outputs: a 3-trip output-row loop.
    model = _conv((1, 400, 40, 40), (8, 400, 1, 1))
    fn = _compile(model, []).module.functions[0]
    loops = [loop for loop in _loops(fn.entry) if loop.trip_count > 1]
    output = [loop for loop in loops if loop.axis.startswith("oh")]
    channels = [loop for loop in loops if loop.axis.startswith("kc")]
    assert output and channels
    assert all(loop.parallel for loop in output)
    assert not any(loop.parallel for loop in channels)  # PSUM accumulation is carried
    assert_matches_onnxruntime(model, passes=[])


# --- MatMul and Gemm --------------------------------------------------------------------------

MATMUL_CASES = {
    "n_below_k": ((8, 16), (16, 2048)),  # 4 N tiles, one copy each
    "n_above_k": ((8, 16), (16, 3000)),  # 6 N tiles: two copies
    "m_tiles": ((300, 40), (40, 24)),  # 3 M tiles (one full copy each)
    "batch_above_k": ((6, 8, 20), (6, 20, 8)),  # batch loop of 6: two copies
    "batch_below_k": ((3, 8, 20), (3, 20, 8)),
}


@pytest.mark.parametrize("case", list(MATMUL_CASES))
def test_matmul_rotates_its_output_tiles(case):
    a, b = MATMUL_CASES[case]
    model = one_node_model("MatMul", {"a": a, "b": b})
    compiled = _compile(model, [])
    buffered = compiled.module.metadata[BUFFERED_LOOPS]
    loops = {loop.axis: loop for loop in _loops(compiled.module.functions[0].entry)}
    _assert_rotated(buffered, loops)
    assert_matches_onnxruntime(model, passes=[])
    _check_races(model, [])


def test_gemm_with_transposed_operands_and_bias_rotates():
    # transB loads Bᵀ through the PE transposes: staging and transposed rotate too.
    rng = np.random.default_rng(3)
    b = rng.standard_normal((1100, 64)).astype(np.float32)
    c = rng.standard_normal((1100,)).astype(np.float32)
    model = one_node_model(
        "Gemm", {"a": (20, 64)}, initializers={"b": b, "c": c}, transB=1, alpha=0.5, beta=2.0
    )
    compiled = _compile(model, [])
    buffered = compiled.module.metadata[BUFFERED_LOOPS]
    assert list(buffered.values()) == [3]  # 3 N tiles of 512, one copy each
    assert_matches_onnxruntime(model, passes=[], atol=1e-4)
    _check_races(model, [])


def test_matmul_k_accumulation_stays_sequential():
    model = one_node_model("MatMul", {"a": (8, 600), "b": (600, 1200)})
    fn = _compile(model, []).module.functions[0]
    loops = [loop for loop in _loops(fn.entry) if loop.trip_count > 1]
    k_loops = [loop for loop in loops if loop.axis.startswith("k")]
    n_loops = [loop for loop in loops if loop.axis.startswith("n")]
    assert k_loops and not any(loop.parallel for loop in k_loops)
    assert n_loops and all(loop.parallel for loop in n_loops)
    assert_matches_onnxruntime(model, passes=[], atol=1e-4)


# --- elementwise and pooling ------------------------------------------------------------------

ELEMENTWISE_CASES = {
    # [256, 4096] + [4096]: 2 row tiles x 2 column tiles; the column loop gets a copy each.
    "add_broadcast": ("Add", {"a": (256, 4096), "b": (4096,)}),
    # 600 x 2048 elements fold to 600 rows: 4 full row tiles and a predicated edge tile, run by
    # two groups of 2 copies and a leftover trip.
    "relu_rows_above_k": ("Relu", {"x": (600, 2048)}),
    # HardSwish addresses its scratch tile like the output: the scratch rotates with it.
    "hardswish_scratch": ("HardSwish", {"x": (600, 2048)}),
}


@pytest.mark.parametrize("case", list(ELEMENTWISE_CASES))
def test_elementwise_rotates_its_innermost_loop(case):
    op, inputs = ELEMENTWISE_CASES[case]
    model = one_node_model(op, inputs)
    compiled = _compile(model, [])
    buffered = compiled.module.metadata[BUFFERED_LOOPS]
    loops = {loop.axis: loop for loop in _loops(compiled.module.functions[0].entry)}
    _assert_rotated(buffered, loops)
    assert set(buffered.values()) <= {1, 2}
    assert_matches_onnxruntime(model, passes=[])
    _check_races(model, [])


POOL_CASES = {
    # 64 x 64 outputs in tiles of 16 rows: 4 tiles, which a pool takes in two groups of 2
    # copies (docs/buffers.md#lowerings), not a copy each as other lowerings do.
    "maxpool_below_k": ("MaxPool", (1, 4, 64, 64), {"pads": [1, 1, 1, 1]}),
    # 80 x 80 in tiles of 12 rows: 6 full tiles (3 groups of 2 copies) and an 8-row edge tile.
    "maxpool_above_k": ("MaxPool", (1, 4, 80, 80), {"pads": [1, 1, 1, 1]}),
    # Padding not counted: a divisor map, rotated with band and out.
    "avgpool_divisors": (
        "AveragePool",
        (1, 3, 80, 80),
        {"pads": [1, 1, 1, 1], "count_include_pad": 0},
    ),
}


@pytest.mark.parametrize("case", list(POOL_CASES))
def test_window_pool_rotates_its_output_tiles(case):
    op, shape, attrs = POOL_CASES[case]
    model = one_node_model(op, {"x": shape}, kernel_shape=[3, 3], **attrs)
    compiled = _compile(model, [])
    buffered = compiled.module.metadata[BUFFERED_LOOPS]
    loops = {loop.axis: loop for loop in _loops(compiled.module.functions[0].entry)}
    _assert_rotated(buffered, loops)
    assert list(buffered.values()) == [2]
    assert_matches_onnxruntime(model, passes=[])
    _check_races(model, [])


DEPTHWISE_CASES = {
    # The first row tile and the edge tile reach into the padding and are emitted alone
    # (docs/memory_planner.md#framed-bands); the loop runs the uniform ones.
    "below_k": (1, 32, 90, 64),  # 2 uniform row tiles: a copy each
    "above_k": (1, 32, 100, 100),  # 4 uniform row tiles: 2 groups of 2 copies
}


@pytest.mark.parametrize("case", list(DEPTHWISE_CASES))
def test_depthwise_kernel_rotates_its_output_tiles(case):
    shape = DEPTHWISE_CASES[case]
    model = _conv(shape, (shape[1], 1, 3, 3), pads=[1, 1, 1, 1], group=shape[1])
    compiled = _compile(model)
    fn = compiled.module.functions[0]
    assert "kernel.conv2d_depthwise_f01b_o01i_bf01" in {i.origin.rule for i in fn.instructions()}
    buffered = compiled.module.metadata[BUFFERED_LOOPS]
    loops = {loop.axis: loop for loop in _loops(fn.entry)}
    _assert_rotated(buffered, loops)
    assert_matches_onnxruntime(model)
    _check_races(model)


COLUMN_PACKING_CASES = {
    # C_in·kH = 144 > 128: rep_nhwc refuses, dense column packing takes it.
    "below_k": ((1, 16, 40, 40), (3, 16, 9, 9)),  # 32 x 32 outputs: 2 row tiles, a copy each
    "above_k": ((1, 16, 72, 72), (140, 16, 9, 9)),  # 8 row tiles (4 groups of 2), 2 C_out tiles
}


@pytest.mark.parametrize("case", list(COLUMN_PACKING_CASES))
def test_column_packing_kernel_rotates_its_output_tiles(case):
    x_shape, w_shape = COLUMN_PACKING_CASES[case]
    model = _conv(x_shape, w_shape)
    compiled = _compile(model)
    fn = compiled.module.functions[0]
    assert "kernel.conv2d_column_packing" in {i.origin.rule for i in fn.instructions()}
    buffered = compiled.module.metadata[BUFFERED_LOOPS]
    loops = {loop.axis: loop for loop in _loops(fn.entry)}
    _assert_rotated(buffered, loops)
    assert_matches_onnxruntime(model, atol=1e-4)
    _check_races(model)
