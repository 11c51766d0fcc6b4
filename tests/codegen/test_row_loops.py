"""Row loops that overlap (docs/row_loops.md): Softmax, LogSoftmax and the row normalisations
take a group of row tiles through each step, spread the steps over GpSimd, ScalarE and VectorE,
rotate their buffers so the loop over groups is `parallel`, and read and write the SBUF homes
the memory plan keeps. Each is checked against onnxruntime, race-free and bit-identical under a
random schedule."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import (
    IR_VERSION,
    assert_matches_onnxruntime,
    is_copy,
    make_model,
    one_node_model,
)
from onnx import TensorProto, helper, numpy_helper

from onnx2bir.bir.enums import Engine, MemoryType, Opcode
from onnx2bir.bir.ir import Loop, all_loops
from onnx2bir.bir.verify import verify_module
from onnx2bir.codegen.row_groups import (
    COPY_BUDGET,
    GROUP,
    EngineLoad,
    emit_skewed,
    emit_staged,
    plan_groups,
)
from onnx2bir.codegen.tiling import BUFFERED_LOOPS
from onnx2bir.compiler import compile_graph, compile_model, import_graph
from onnx2bir.options import CompileOptions
from onnx2bir.runtime.machine.interpreter import run_function
from onnx2bir.runtime.machine.schedule import parse_schedule, run_scheduled
from onnx2bir.runtime.oracle.ort import run_onnxruntime, synthesize_inputs


def _loops(block) -> list[Loop]:
    return list(all_loops(block))


def _compile(model):
    return compile_graph(import_graph(model), CompileOptions(auto_cast="none"), [])


def _same_under_a_random_schedule(model) -> None:
    """No race, and the outputs of program order and of a random order are the same bits."""
    compiled = _compile(model)
    feeds = synthesize_inputs(compiled.graph, 0)
    ordered = run_function(compiled.module, feeds)
    shuffled = run_scheduled(compiled.module, feeds, parse_schedule("random:1"), True)
    assert shuffled.race_count == 0, shuffled.races[:3]
    for name, value in shuffled.outputs.items():
        np.testing.assert_array_equal(value, ordered[name])


def _engines(compiled) -> set[Engine]:
    """The engines of a one-node model's instructions (the prologue's aside)."""
    fn = compiled.module.functions[0]
    return {i.engine for i in fn.instructions() if i.origin.node != "<prologue>"}


# --- the group walk ---------------------------------------------------------------------------


class _Free:
    """A code generator stand-in for `plan_groups`: only its free SBUF bytes and PSUM banks."""

    def __init__(self, sb_bytes: int) -> None:
        self.sb = sb_bytes

    def sb_free_bytes(self) -> int:
        return self.sb

    def psum_free_banks(self) -> int:
        return 8


@pytest.mark.parametrize(
    ("extent", "copy_bytes", "free", "group", "buffers"),
    [
        (128 * 48, 1000, 10**6, GROUP, 2),  # 12 group trips: two sets of copies
        (128 * 4, 1000, 10**6, GROUP, 1),  # one trip: nothing to rotate
        (128 * 8, 1000, 10**6, GROUP, 2),  # two trips: a set each
        (128 * 3, 1000, 10**6, 3, 1),  # fewer tiles than a group
        (128 * 48, 1000, 2500, 2, 1),  # two copies fit what is free, not two sets of two
        # The budget (COPY_BUDGET, or two copies when they take more): 2 x 20000 B fit it,
        # 4 x 20000 B do not; 2 x 30000 B or 2 x 60000 B are allowed: two tiles a trip.
        (128 * 48, 20000, 10**6, 2, 1),
        (128 * 48, 30000, 10**6, 2, 1),
        (128 * 48, 60000, 10**6, 2, 1),
    ],
)
def test_plan_groups_fills_a_group_then_rotates_what_fits(extent, copy_bytes, free, group, buffers):
    plan = plan_groups(_Free(free), extent, 128, copy_bytes)
    assert (plan.group, plan.buffers) == (group, buffers)
    assert plan.copies * copy_bytes <= max(COPY_BUDGET, 2 * copy_bytes)
    assert plan.copies * copy_bytes <= free


def test_staged_emits_a_step_of_every_tile_before_the_next_step():
    order = []
    steps = [[lambda t=t, k=k: order.append((t, k)) for k in range(3)] for t in range(2)]
    emit_staged(steps)
    assert order == [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2)]


def test_skewed_emits_the_tiles_in_waves_oldest_first():
    order = []
    steps = [[lambda t=t, k=k: order.append((t, k)) for k in range(3)] for t in range(3)]
    emit_skewed(steps)
    # Wave w holds step w - t of tile t: every tile's steps in order, every step's tiles too.
    waves = [t + k for t, k in order]
    assert waves == sorted(waves) and sorted(order) == [(t, k) for t in range(3) for k in range(3)]
    assert order[:4] == [(0, 0), (0, 1), (1, 0), (0, 2)]


# --- Softmax and LogSoftmax --------------------------------------------------------------------

SOFTMAX_CASES = {
    # 48 row tiles of 64: 12 groups of 4, two sets of copies (a loop of 6 over pairs of
    # groups, each pair written out in its body).
    "many_tiles": ((4, 12, 128, 64), -1),
    # 1000 rows: a group of 4 tiles, then a group of 3 full tiles and a 104-row edge tile.
    "edge_tile": ((1000, 40), -1),
    # Along an inner axis: 300 inner positions of each of 2 outer rows, read with stride 300.
    "strided_rows": ((2, 7, 300), 1),
}


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("case", list(SOFTMAX_CASES))
def test_softmax_row_groups_match_onnxruntime_race_free(op, case):
    shape, axis = SOFTMAX_CASES[case]
    model = one_node_model(op, {"x": shape}, shape, opset=13, axis=axis)
    compiled = _compile(model)
    # ScalarE and VectorE share the steps; GpSimd would take a row max only if it finished it
    # first, and it shares SBUF's port with VectorE (test_engine_load_counts_the_sbuf_port).
    assert {Engine.ACT, Engine.DVE} <= _engines(compiled)
    if case == "many_tiles":
        buffered = compiled.module.metadata[BUFFERED_LOOPS]
        loops = {loop.axis: loop for loop in _loops(compiled.module.functions[0].entry)}
        ((group_loop, copies),) = buffered.items()
        assert copies == 2 and loops[group_loop].trip_count == 6
    assert_matches_onnxruntime(model, passes=[], atol=1e-5)
    _same_under_a_random_schedule(model)


# --- the row normalisations -----------------------------------------------------------------


def _weights(seed: int, *shape: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


# GpSimd takes the row sum from about 600 elements a row and the scale and bias from 100 (where it
# is not dearer than VectorE, docs/device_time.md#instruction-costs); ScalarE and VectorE
# always have their steps. Scale and bias rows of 128 elements or more are made on the PE array
# (GpSimd sets its ones) and applied by VectorE from PSUM.
LAYER_NORM_CASES = {
    "four_tiles": ((4, 128, 640), {Engine.ACT, Engine.DVE, Engine.POOL, Engine.PE}),
    "two_groups_and_edge": ((1100, 64), {Engine.ACT, Engine.DVE}),
    "one_partial_tile": ((3, 50, 40), {Engine.ACT, Engine.DVE}),
}


@pytest.mark.parametrize("case", list(LAYER_NORM_CASES))
def test_layer_norm_row_groups_match_onnxruntime_race_free(case):
    shape, engines = LAYER_NORM_CASES[case]
    d = shape[-1]
    node = helper.make_node("LayerNormalization", ["x", "s", "b"], ["y", "mean", "rstd"])
    model = make_model(
        node,
        {"x": shape},
        {"y": None, "mean": None, "rstd": None},
        17,
        {"s": _weights(1, d), "b": _weights(2, d)},
    )
    compiled = _compile(model)
    assert _engines(compiled) - {Engine.DMA} == engines
    assert_matches_onnxruntime(model, passes=[])
    _same_under_a_random_schedule(model)


def _vector_reads(compiled, name: str) -> int:
    """Bytes the program's DMAs read out of constant `name`, loop trips counted."""
    total = 0

    def walk(block, trips):
        nonlocal total
        for item in block.items:
            if isinstance(item, Loop):
                walk(item.body, trips * item.trip_count)
            elif item.opcode is Opcode.DMA_COPY and item.srcs["in"].loc == name:
                total += item.srcs["in"].num_elements * 4 * trips

    walk(compiled.module.functions[0].entry, 1)
    return total


@pytest.mark.parametrize("negative_zero", [False, True], ids=["on_pe", "negative_zero"])
def test_layer_norm_makes_its_scale_and_bias_rows_on_the_pe(negative_zero):
    """An encoder's LN rows (768 fp32) are read once and copied down the partitions on the PE
    array, not moved once per partition by a broadcast DMA; a scale holding -0 keeps the DMA
    (1 · (-0) on the PE comes out +0). Both match onnxruntime."""
    d = 768
    scale = _weights(1, d)
    if negative_zero:
        scale[5] = -0.0
    node = helper.make_node("LayerNormalization", ["x", "s", "b"], ["y"], axis=-1)
    model = make_model(node, {"x": (1, 197, d)}, {"y": None}, 17, {"s": scale, "b": _weights(2, d)})
    compiled = _compile(model)
    assert _vector_reads(compiled, "s") == (128 if negative_zero else 1) * d * 4
    assert (Engine.PE in _engines(compiled)) is not negative_zero
    assert_matches_onnxruntime(model, passes=[])


def test_instance_norm_groups_images():
    shape = (6, 20, 8, 8)  # 6 images of one channel tile: a group of 4, then 2
    model = one_node_model(
        "InstanceNormalization",
        {"x": shape},
        shape,
        initializers={"s": _weights(1, 20), "b": _weights(2, 20)},
        epsilon=1e-4,
    )
    assert_matches_onnxruntime(model, passes=[])
    _same_under_a_random_schedule(model)


def test_group_norm_groups_images():
    shape = (5, 12, 6, 6)
    model = one_node_model(
        "GroupNormalization",
        {"x": shape},
        shape,
        opset=21,
        initializers={"s": _weights(1, 12), "b": _weights(2, 12)},
        num_groups=4,
    )
    assert_matches_onnxruntime(model, passes=[], atol=1e-5)
    _same_under_a_random_schedule(model)


def test_rms_norm_groups_rows():
    # 9 row tiles: 2 full groups of 4 (a parallel loop of 2 trips, a set of copies each) and
    # the edge tile.
    node = helper.make_node("RMSNormalization", ["x", "s"], ["y"], epsilon=1e-5)
    model = make_model(node, {"x": (1100, 48)}, {"y": None}, 23, {"s": _weights(3, 48)})
    compiled = _compile(model)
    assert _engines(compiled) - {Engine.DMA} == {Engine.ACT, Engine.DVE}  # rows of 48
    buffered = compiled.module.metadata[BUFFERED_LOOPS]
    loops = {loop.axis: loop for loop in _loops(compiled.module.functions[0].entry)}
    assert list(buffered.values()) == [2] and all(loops[axis].parallel for axis in buffered)
    assert_matches_onnxruntime(model, passes=[])
    _same_under_a_random_schedule(model)


# --- direct operands ----------------------------------------------------------------------------


def _chain(op: str, shape: tuple[int, ...], initializers=(), inputs=(), opset: int = 18):
    """x + x -> op -> relu: the op's input and output are intermediates the plan keeps on chip."""
    vi = [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(shape)) for n in ("x", "y")]
    nodes = [
        helper.make_node("Add", ["x", "x"], ["a"], name="add"),
        helper.make_node(op, ["a", *inputs], ["n"], name="norm"),
        helper.make_node("Relu", ["n"], ["y"], name="relu"),
    ]
    graph = helper.make_graph(nodes, "chain", [vi[0]], [vi[1]], initializer=list(initializers))
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=IR_VERSION
    )


# (weights the op takes after its input, opset)
DIRECT_CASES = {
    "Softmax": ((), 18),
    "LogSoftmax": ((), 18),
    "LayerNormalization": (("s", "b"), 18),
    "RMSNormalization": (("s",), 23),
}


@pytest.mark.parametrize("op", list(DIRECT_CASES))
def test_rows_are_read_from_and_written_to_their_homes(op):
    shape = (4, 128, 64)
    inputs, opset = DIRECT_CASES[op]
    inits = [numpy_helper.from_array(_weights(n, 64), name) for n, name in enumerate(inputs)]
    model = _chain(op, shape, inits, inputs, opset)
    compilation = compile_model(model, CompileOptions(auto_cast="none"))
    assert not verify_module(compilation.module)
    fn = compilation.module.functions[0]
    for tensor in ("a", "n"):
        assert fn.memory_locations[tensor].memory is MemoryType.SB, tensor
    touching = [
        inst
        for inst in fn.instructions()
        if inst.origin.node == "norm"
        and any(ap.loc in ("a", "n") for ap in (inst.dst, *inst.srcs.values()) if ap is not None)
    ]
    # The compute instructions name the homes: no copy in or out.
    assert touching
    assert not any(is_copy(i) for i in touching)
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    got = run_function(compilation.module, {"x": x})
    want = run_onnxruntime(model, {"x": x})
    np.testing.assert_allclose(got["y"], want["y"], rtol=1e-5, atol=1e-5)


def test_engine_load_counts_the_sbuf_port():
    """VectorE and GpSimd take turns on SBUF (docs/device_time.md#on-chip-ports): an idle
    GpSimd is no faster than a busy VectorE for a step on SBUF tiles. Costs from the formulas:
    VectorE N cycles at 1.12 GHz, GpSimd 150 + N at 1.4 GHz, ScalarE N at 1.4 GHz."""
    busy = EngineLoad()
    busy.add(Engine.DVE, 1000)  # 893 ns on VectorE and on the port
    # 64 elements: VectorE 57 ns after 893, GpSimd 153 ns after the same 893 on the port.
    assert busy.pick((Engine.POOL, Engine.DVE), 64) is Engine.DVE
    # ScalarE does not take SBUF's port: with the port busy it finishes first.
    assert busy.pick((Engine.ACT, Engine.DVE), 64) is Engine.ACT
    # A long row: GpSimd's 150 + 4096 cycles at 1.4 GHz (3.03 us) beat VectorE's 4096 at
    # 1.12 GHz (3.66 us).
    assert EngineLoad().pick((Engine.POOL, Engine.DVE), 4096) is Engine.POOL
