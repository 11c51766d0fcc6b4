"""The memory planner (docs/memory_planner.md): which tensors live in SBUF, how accesses to
them are rewritten, and that the program still computes what onnxruntime computes."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import IR_VERSION
from onnx import TensorProto, helper, numpy_helper

from onnx2bir.bir.enums import MemoryType, Opcode
from onnx2bir.bir.ir import AccessPattern
from onnx2bir.bir.verify import verify_module
from onnx2bir.codegen.residency import Home, canonical_inner, plan_copy, translate
from onnx2bir.compiler import compile_model
from onnx2bir.options import CompileOptions
from onnx2bir.runtime.machine.interpreter import run_function
from onnx2bir.runtime.oracle.ort import run_onnxruntime
from onnx2bir.runtime.timing import cost
from onnx2bir.runtime.timing.device_time import simulate

IDENTITY_BYTES = 128 * 128 * 4  # the prologue loads I[128, 128] fp32 (docs/bir_codegen.md)


def _model(nodes, inputs, outputs, initializers=()):
    graph = helper.make_graph(nodes, "plan", inputs, outputs, initializer=list(initializers))
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=IR_VERSION
    )


def _vi(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def _run(model, feeds, **options):
    compilation = compile_model(model, CompileOptions(**options))
    problems = verify_module(compilation.module)
    assert not problems, problems
    got = run_function(compilation.module, feeds)
    want = run_onnxruntime(model, feeds)
    for name, value in want.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-5)
    return compilation


def _touching(function, tensor):
    return [
        inst
        for inst in function.instructions()
        if any(ap.loc == tensor for ap in (inst.dst, *inst.srcs.values()) if ap is not None)
    ]


def test_a_chain_hands_its_intermediates_over_on_chip():
    # Relu -> Neg -> Sigmoid on [1, 64, 20, 20]: r and n never touch DRAM.
    model = _model(
        [
            helper.make_node("Relu", ["x"], ["r"], name="relu"),
            helper.make_node("Neg", ["r"], ["n"], name="neg"),
            helper.make_node("Sigmoid", ["n"], ["y"], name="sigmoid"),
        ],
        [_vi("x", [1, 64, 20, 20])],
        [_vi("y", [1, 64, 20, 20])],
    )
    x = np.random.default_rng(0).standard_normal((1, 64, 20, 20)).astype(np.float32)
    compilation = _run(model, {"x": x})
    function = compilation.module.functions[0]
    for tensor in ("r", "n"):
        assert function.memory_locations[tensor].memory is MemoryType.SB
        # The activations read and write the homes themselves: no copy, no DMA.
        ops = {inst.opcode for inst in _touching(function, tensor)}
        assert ops == {Opcode.ACTIVATION}, (tensor, ops)
        assert compilation.memory_plan.decisions[tensor].resident
    # Only the input, the output and the identity tile of the prologue cross DMA.
    assert cost.estimate(compilation.module).dma_bytes == 2 * x.nbytes + IDENTITY_BYTES


def test_without_the_plan_every_intermediate_goes_through_dram():
    model = _model(
        [
            helper.make_node("Relu", ["x"], ["r"], name="relu"),
            helper.make_node("Neg", ["r"], ["y"], name="neg"),
        ],
        [_vi("x", [1, 8, 4, 4])],
        [_vi("y", [1, 8, 4, 4])],
    )
    x = np.random.default_rng(1).standard_normal((1, 8, 4, 4)).astype(np.float32)
    compilation = _run(model, {"x": x}, memory_plan=False)
    function = compilation.module.functions[0]
    assert compilation.memory_plan is None
    assert function.memory_locations["r"].memory is MemoryType.DRAM
    # x, r twice, y, and the identity tile
    assert cost.estimate(compilation.module).dma_bytes == 4 * x.nbytes + IDENTITY_BYTES


def test_a_tensor_too_big_for_sbuf_stays_in_dram_and_says_so():
    # 128 rows of 100,000 fp32 = 400 KB per partition, over the 192 KiB of SBUF.
    shape = [1, 128, 100_000]
    model = _model(
        [
            helper.make_node("Relu", ["x"], ["r"], name="relu"),
            helper.make_node("Neg", ["r"], ["y"], name="neg"),
        ],
        [_vi("x", shape)],
        [_vi("y", shape)],
    )
    x = np.random.default_rng(2).standard_normal(shape).astype(np.float32)
    compilation = _run(model, {"x": x})
    decision = compilation.memory_plan.decisions["r"]
    assert not decision.resident
    assert decision.reason.startswith("does not fit")
    assert compilation.module.functions[0].memory_locations["r"].memory is MemoryType.DRAM


def test_a_layout_change_keeps_the_tensor_in_dram_naming_the_node_and_rule():
    # The Transpose walks r with its last dim first: no row length serves it and the Relu.
    model = _model(
        [
            helper.make_node("Relu", ["x"], ["r"], name="relu"),
            helper.make_node("Transpose", ["r"], ["y"], name="turn", perm=[2, 0, 1]),
        ],
        [_vi("x", [6, 40, 24])],
        [_vi("y", [24, 6, 40])],
    )
    x = np.random.default_rng(3).standard_normal((6, 40, 24)).astype(np.float32)
    compilation = _run(model, {"x": x})
    decision = compilation.memory_plan.decisions["r"]
    assert not decision.resident
    assert "node 'turn' (generic.Transpose)" in decision.reason, decision.reason


def test_a_matrix_transpose_flips_on_the_pe_array_and_stays_on_chip():
    model = _model(
        [
            helper.make_node("Relu", ["x"], ["r"], name="relu"),
            helper.make_node("Transpose", ["r"], ["t"], name="flip", perm=[0, 2, 1]),
            helper.make_node("Neg", ["t"], ["y"], name="neg"),
        ],
        [_vi("x", [2, 256, 128])],
        [_vi("y", [2, 128, 256])],
    )
    x = np.random.default_rng(5).standard_normal((2, 256, 128)).astype(np.float32)
    compilation = _run(model, {"x": x}, auto_cast="none")
    decisions = compilation.memory_plan.decisions
    assert decisions["r"].resident and decisions["t"].resident
    flips = [
        inst
        for inst in compilation.module.functions[0].instructions()
        if inst.origin.node == "flip" and inst.opcode is Opcode.MATMULT
    ]
    assert flips and all(inst.srcs["moving"].loc == "identity_fp32" for inst in flips)


def test_a_padded_conv_input_stays_on_chip_and_is_not_copied():
    rng = np.random.default_rng(4)
    w = helper.make_tensor(
        "w", TensorProto.FLOAT, [16, 8, 3, 3], rng.standard_normal(16 * 8 * 9).tolist()
    )
    # Two groups: the generic conv. Its bands are read from r's home and framed in SBUF
    # (docs/memory_planner.md#framed-bands): no padded copy of r.
    model = _model(
        [
            helper.make_node("Relu", ["x"], ["r"], name="relu"),
            helper.make_node("Conv", ["r", "w"], ["y"], name="conv", pads=[1, 1, 1, 1], group=2),
        ],
        [_vi("x", [1, 16, 12, 12])],
        [_vi("y", [1, 16, 12, 12])],
        [w],
    )
    x = rng.standard_normal((1, 16, 12, 12)).astype(np.float32)
    compilation = _run(model, {"x": x}, auto_cast="none")
    decisions = compilation.memory_plan.decisions
    assert decisions["r"].resident and not [t for t in decisions if t.endswith("/padded")]


def test_translate_splits_rows_at_partition_chunks():
    # 300 rows of 8: rows 100..299 are partitions 100..127 of chunk 0, 0..127 of chunk 1,
    # 0..43 of chunk 2.
    home = Home("t", 8, 300 * 8, 4)
    pieces = translate(AccessPattern("t", ((8, 200), (1, 8)), 100 * 8), home, {})
    assert [(p.first, p.count) for p in pieces] == [(0, 28), (28, 128), (156, 44)]
    assert [(p.ap.partition_start, p.ap.num_partitions, p.ap.offset) for p in pieces] == [
        (100, 28, 0),
        (0, 128, 8),
        (0, 44, 16),
    ]


def test_translate_refuses_a_loop_that_moves_across_partitions():
    home = Home("t", 8, 300 * 8, 4)
    ap = AccessPattern("t", ((8, 4), (1, 8)), 0, (("i", 8),))
    reason = translate(ap, home, {"i": (0, 9)})
    assert isinstance(reason, str) and "loop i" in reason


def test_a_copy_whose_rows_do_not_line_up_with_the_tile_stays_a_dma_on_chip():
    home = Home("t", 32, 64 * 32, 4)
    tile = AccessPattern("tile", ((1, 64),), 0, (), 0, 32)  # 32 partitions x 64
    dram = AccessPattern("t", ((32, 64), (1, 32)), 0)  # 64 rows of 32
    (copy,) = plan_copy(tile, dram, {"t": home}, lambda name: name == "tile", {})
    assert not copy.on_chip  # a DMA from SBUF to SBUF
    assert (copy.src.loc, copy.src.partition_start, copy.src.num_partitions) == ("t", 0, 64)
    # Lane to lane (32 rows into 32 partitions) it is a compute-engine copy.
    lined_up = AccessPattern("t", ((32, 32), (1, 32)), 0)
    tile32 = AccessPattern("tile", ((1, 32),), 0, (), 0, 32)
    (copy,) = plan_copy(tile32, lined_up, {"t": home}, lambda name: name == "tile", {})
    assert copy.on_chip


@pytest.mark.parametrize(
    "shape, inner", [((1, 64, 7, 7), 49), ((2, 128, 768), 768), ((10, 3), 3), ((5,), 1)]
)
def test_canonical_rows_are_a_channel_plane_or_a_matrix_row(shape, inner):
    assert canonical_inner(shape) == inner


def test_report_json_lists_the_decisions():
    import onnx2bir

    model = _model(
        [
            helper.make_node("Relu", ["x"], ["r"], name="relu"),
            helper.make_node("Neg", ["r"], ["y"], name="neg"),
        ],
        [_vi("x", [1, 8, 4, 4])],
        [_vi("y", [1, 8, 4, 4])],
    )
    memory = onnx2bir.report(model).to_json()["memory"]
    assert memory["planned"] and memory["resident"] == 1 and memory["dram"] == 0
    (record,) = memory["tensors"]
    assert record["tensor"] == "r" and record["resident"]
    # 8 rows of 16 fp32 = 64 bytes in each of 8 partitions.
    assert record["bytes_per_partition"] == 64
    assert memory["sbuf_high_water_bytes"] >= 64
    assert memory["allocation_order"] == "first use"  # nothing refused: the first order kept


def test_a_rotated_edge_tile_loop_next_to_another_home_runs_clean():
    # 320 rows of 784: three row tiles, the last partial, rotated over two copies, so the loop
    # runs a fourth padding trip that a predicate skips. Its addresses lie past r1's home, in
    # r2's: the machine's live-bytes check must not count them (they are never touched).
    shape = [1, 320, 28, 28]
    model = _model(
        [
            helper.make_node("Relu", ["x"], ["r1"], name="relu1"),
            helper.make_node("Relu", ["r1"], ["r2"], name="relu2"),
            helper.make_node("Neg", ["r2"], ["y"], name="neg"),
        ],
        [_vi("x", shape)],
        [_vi("y", shape)],
    )
    x = np.random.default_rng(6).standard_normal(shape).astype(np.float32)
    compilation = _run(model, {"x": x})
    homes = compilation.memory_plan.homes
    assert homes["r1"].address + homes["r1"].bytes_per_partition == homes["r2"].address


def test_per_head_matrices_get_rows_the_engines_copy_lane_to_lane():
    """Scores [1, H, S, S] between a per-head MatMul, a Softmax and the next MatMul: the
    canonical rows (S x S elements, a head to a partition) serve every access, but only as
    SBUF-to-SBUF DMAs moving each row to its lane; the planner takes rows of S elements,
    under which every copy of the scores is an engine's (docs/memory_planner.md#the-rule)."""
    heads, seq, dim = 4, 128, 32
    nodes = [
        helper.make_node("MatMul", ["q", "kt"], ["scores"], name="qk"),
        helper.make_node("Softmax", ["scores"], ["probs"], name="softmax", axis=-1),
        helper.make_node("MatMul", ["probs", "v"], ["y"], name="pv"),
    ]
    model = _model(
        nodes,
        [
            _vi("q", [1, heads, seq, dim]),
            _vi("kt", [1, heads, dim, seq]),
            _vi("v", [1, heads, seq, dim]),
        ],
        [_vi("y", [1, heads, seq, dim])],
    )
    rng = np.random.default_rng(0)
    feeds = {
        "q": rng.standard_normal((1, heads, seq, dim)).astype(np.float32),
        "kt": rng.standard_normal((1, heads, dim, seq)).astype(np.float32),
        "v": rng.standard_normal((1, heads, seq, dim)).astype(np.float32),
    }
    compilation = _run(model, feeds, auto_cast="none")
    decisions = compilation.memory_plan.decisions
    for tensor in ("scores", "probs"):
        assert decisions[tensor].resident
        assert compilation.memory_plan.homes[tensor].inner == seq, decisions[tensor].reason
        touching = _touching(compilation.module.functions[0], tensor)
        assert touching and not any(i.opcode is Opcode.DMA_COPY for i in touching)


def test_two_nodes_in_a_row_get_arenas_apart_so_loads_run_ahead():
    """Two 3 x 3 convs of 256 channels: the second one's arena goes below the first's
    (docs/memory_planner.md#allocation), so its weight loads do not wait for the first conv's
    reads of the same bytes, and start before the first conv's matmuls end. With every arena
    ending at the top of SBUF they waited for them."""
    rng = np.random.default_rng(0)
    weights = [(rng.standard_normal((256, 256, 3, 3)) / 48).astype(np.float32) for _ in "12"]
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["h"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["h", "w2"], ["y"], name="conv2", pads=[1, 1, 1, 1]),
    ]
    inits = [numpy_helper.from_array(w, f"w{i}") for i, w in enumerate(weights, 1)]
    model = _model(nodes, [_vi("x", [1, 256, 14, 14])], [_vi("y", [1, 256, 14, 14])], inits)
    feeds = {"x": rng.standard_normal((1, 256, 14, 14)).astype(np.float32)}
    compilation = _run(model, feeds, auto_cast="none")
    plan = compilation.memory_plan
    arenas = {item: (plan.arena_base(item), plan.arena_base(item) + need)
              for item, need in plan.arena_need.items() if need}  # fmt: skip
    assert plan.lowered
    for item, (start, end) in arenas.items():
        if item + 1 in arenas:  # two nodes in a row share no byte
            after = arenas[item + 1]
            assert end <= after[0] or after[1] <= start
    slices = simulate(compilation.module.functions[0], cost.CostTable()).slices
    loads = [
        s.start
        for s in slices
        if s.ins.opcode is Opcode.DMA_COPY and s.ins.srcs["in"].loc.startswith("w2")
    ]
    matmuls = [
        s.end
        for s in slices
        if s.ins.opcode is Opcode.MATMULT and s.ins.origin.node.startswith("conv1")
    ]
    assert loads and min(loads) < max(matmuls)


def test_a_refusal_for_room_says_what_holds_the_bytes():
    from onnx2bir.codegen.planner import _no_room

    # 100 B under the arenas from 10 to 110: homes at [10, 40) and [30, 50) (live at
    # different times, sharing 10 B) and [80, 95): 55 B held, gaps of 30 and 15 B.
    reason = _no_room(40, 3, 7, 10, 110, [(10, 40), (30, 50), (80, 95)])
    assert reason == (
        "does not fit: needs 40 B per partition from entry item 3 to 7; 100 B lie under the "
        "node arenas, 55 B of them held by 3 other homes live then, largest gap 30 B"
    )


def test_the_allocation_order_that_leaves_the_fewest_bytes_in_dram_wins(monkeypatch):
    from onnx2bir.bir.opcodes import SBUF_BYTES_PER_PARTITION
    from onnx2bir.codegen import planner

    # Ten 64-byte units a partition under the arenas. Placed in order of first use, the two
    # 3-unit homes live from item 0 split the room and the 7-unit home of items 1-2 finds no
    # gap; placed largest first, it takes the bottom and both small homes fit beside it.
    def home(name: str, units: int) -> Home:
        return Home(name, units, units * 128, 64)

    homes = {"short": home("short", 3), "long": home("long", 3), "big": home("big", 7)}
    spans = {"short": (0, 0), "long": (0, 2), "big": (1, 2)}
    arenas = dict.fromkeys(range(3), SBUF_BYTES_PER_PARTITION - 10 * 64)
    first_use = {"first use": planner.ALLOCATION_ORDERS["first use"]}
    monkeypatch.setattr(planner, "ALLOCATION_ORDERS", first_use)
    _, refused, _ = planner._allocate(homes, spans, arenas, 0)
    assert list(refused) == ["big"]
    monkeypatch.undo()
    placed, refused, order = planner._allocate(homes, spans, arenas, 0)
    assert not refused and order == "largest first"
    # and no two homes live at the same time share a byte
    for a in placed:
        for b in placed:
            overlap_in_time = spans[a][0] <= spans[b][1] and spans[b][0] <= spans[a][1]
            ends = [(h.address, h.address + h.bytes_per_partition) for h in (placed[a], placed[b])]
            apart = ends[0][1] <= ends[1][0] or ends[1][1] <= ends[0][0]
            assert a == b or not overlap_in_time or apart


def test_a_channel_concat_of_two_images_stays_on_chip():
    # [2, 128, 4, 4] tensors concatenated along the channels: the concat walks each image's
    # channel planes, the rows of the plan, so its inputs and output stay in SBUF (a flat run
    # of an image's channels beside a step over the images could not be mapped to rows).
    rng = np.random.default_rng(9)
    model = _model(
        [
            helper.make_node("Relu", ["x"], ["a"], name="relu_a"),
            helper.make_node("Neg", ["x"], ["b"], name="neg_b"),
            helper.make_node("Concat", ["a", "b"], ["c"], name="cat", axis=1),
            helper.make_node("Sigmoid", ["c"], ["y"], name="sigmoid"),
        ],
        [_vi("x", [2, 128, 4, 4])],
        [_vi("y", [2, 256, 4, 4])],
    )
    x = rng.standard_normal((2, 128, 4, 4)).astype(np.float32)
    decisions = _run(model, {"x": x}, auto_cast="none").memory_plan.decisions
    assert all(decisions[t].resident for t in ("a", "b", "c"))


def test_a_channel_concat_of_eight_images_stays_on_chip():
    # Eight images of 96 and 32 channels (GoogLeNet's and DenseNet's concats at batch 8): one
    # copy per image and input (CONCAT_IMAGES), each walking that image's planes, so inputs
    # and output stay in SBUF; with the copies unrolled only up to four images, one copy of
    # all eight stepped over the images inside a row and every concat went through DRAM.
    rng = np.random.default_rng(11)
    model = _model(
        [
            helper.make_node("Relu", ["x"], ["a"], name="relu_a"),
            helper.make_node("Neg", ["z"], ["b"], name="neg_b"),
            helper.make_node("Concat", ["a", "b"], ["c"], name="cat", axis=1),
            helper.make_node("Sigmoid", ["c"], ["y"], name="sigmoid"),
        ],
        [_vi("x", [8, 96, 7, 7]), _vi("z", [8, 32, 7, 7])],
        [_vi("y", [8, 128, 7, 7])],
    )
    feeds = {
        "x": rng.standard_normal((8, 96, 7, 7)).astype(np.float32),
        "z": rng.standard_normal((8, 32, 7, 7)).astype(np.float32),
    }
    decisions = _run(model, feeds, auto_cast="none").memory_plan.decisions
    assert all(decisions[t].resident for t in ("a", "b", "c")), {
        t: decisions[t].reason for t in ("a", "b", "c")
    }


def _conv_chain_of_two_images(activation):
    """Conv(8 -> 96, 3 x 3) -> activation -> Conv(96 -> 96, 3 x 3) over two images: 96
    channels a image, not a whole number of 128-row partition chunks."""
    rng = np.random.default_rng(10)
    w0 = rng.standard_normal((96, 8, 3, 3)).astype(np.float32) / 8
    w1 = rng.standard_normal((96, 96, 3, 3)).astype(np.float32) / 30
    inits = [numpy_helper.from_array(w0, "w0"), numpy_helper.from_array(w1, "w1")]
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c"], name="c0", pads=[1, 1, 1, 1])]
    if activation == "PRelu":
        slope = numpy_helper.from_array(np.full((96, 1, 1), 0.1, np.float32), "slope")
        inits.append(slope)
        nodes.append(helper.make_node("PRelu", ["c", "slope"], ["a"], name="act"))
    else:
        nodes.append(helper.make_node(activation, ["c"], ["a"], name="act"))
    nodes.append(helper.make_node("Conv", ["a", "w1"], ["y"], name="c1", pads=[1, 1, 1, 1]))
    return _model(nodes, [_vi("x", [2, 8, 10, 10])], [_vi("y", [2, 96, 10, 10])], inits)


def test_a_batch_of_images_of_96_channels_stays_on_chip_in_image_groups():
    # In flat rows image 1 would start at row 96, inside the first partition chunk, where a
    # conv's loop over the images cannot step and its evictions cannot write (a compute engine
    # keeps lanes). In groups of 96 rows each image starts at partition 0
    # (docs/memory_planner.md#groups): the sigmoid walks one image at a time and its input and
    # output stay in SBUF.
    x = np.random.default_rng(11).standard_normal((2, 8, 10, 10)).astype(np.float32)
    model = _conv_chain_of_two_images("Sigmoid")
    decisions = _run(model, {"x": x}, auto_cast="none").memory_plan.decisions
    for tensor in ("c", "a"):
        assert decisions[tensor].resident, decisions[tensor].reason
        assert "in groups of 96 rows" in decisions[tensor].reason


def test_an_op_with_a_broadcast_operand_over_image_groups_still_matches():
    # PRelu's per-channel slope broadcasts over the images: its walk keeps flat rows, so the
    # plan must not put its input or output in image groups it cannot walk; the numbers match.
    x = np.random.default_rng(12).standard_normal((2, 8, 10, 10)).astype(np.float32)
    _run(_conv_chain_of_two_images("PRelu"), {"x": x}, auto_cast="none")


@pytest.mark.parametrize("pool", ["MaxPool", "GlobalAveragePool"])
def test_a_pool_between_convs_walks_image_groups_one_image_at_a_time(pool):
    # The pool reads and writes 96-channel images of a batch of two: walking one image's
    # channel planes at a time (`lower/pool.py plane_tiles`), its input and output can stay
    # in SBUF in image groups; a walk over all 192 planes at once would cross from image 0's
    # channels into image 1's inside a partition chunk.
    rng = np.random.default_rng(13)
    w0 = rng.standard_normal((96, 8, 3, 3)).astype(np.float32) / 8
    w1 = rng.standard_normal((16, 96, 1, 1)).astype(np.float32) / 10
    attrs = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}
    out = [2, 16, 5, 5] if pool == "MaxPool" else [2, 16, 1, 1]
    model = _model(
        [
            helper.make_node("Conv", ["x", "w0"], ["c"], name="c0", pads=[1, 1, 1, 1]),
            helper.make_node(
                pool, ["c"], ["p"], name="pool", **(attrs if pool == "MaxPool" else {})
            ),
            helper.make_node("Conv", ["p", "w1"], ["y"], name="c1"),
        ],
        [_vi("x", [2, 8, 10, 10])],
        [_vi("y", out)],
        [numpy_helper.from_array(w0, "w0"), numpy_helper.from_array(w1, "w1")],
    )
    x = rng.standard_normal((2, 8, 10, 10)).astype(np.float32)
    decisions = _run(model, {"x": x}, auto_cast="none").memory_plan.decisions
    assert decisions["c"].resident and decisions["p"].resident, decisions["c"].reason
