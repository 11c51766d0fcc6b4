"""SplitBatch (patterns/batch_split.py, docs/memory_planner.md#batch-split): the batch-heavy
front of a CNN runs one image at a time, and the program still computes what onnxruntime
computes."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import assert_matches_onnxruntime, make_model
from onnx import helper

from onnx2bir.compiler import compile_graph, default_passes, import_graph
from onnx2bir.options import CompileOptions
from onnx2bir.patterns import batch_split
from onnx2bir.patterns.batch_split import SplitBatch
from onnx2bir.runtime.machine.interpreter import run_function
from onnx2bir.runtime.machine.probes import ProbeReader, probe_shapes
from onnx2bir.runtime.oracle.compare import FP32_ATOL, FP32_RTOL, compare_output
from onnx2bir.runtime.oracle.ort import run_onnxruntime, synthesize_inputs


def _w(seed: int, *shape: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32)


def _net(batch: int = 3):
    """A residual block and a head: Conv -> Relu -> Conv -> Add(skip) -> Relu -> MaxPool ->
    GlobalAveragePool -> Flatten -> Gemm. Everything before Flatten is per sample."""
    nodes = [
        helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], name="c0", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c0"], ["r0"], name="r0"),
        helper.make_node("Conv", ["r0", "w1"], ["c1"], name="c1", pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c1", "r0"], ["a"], name="add"),
        helper.make_node("Relu", ["a"], ["r1"], name="r1"),
        helper.make_node(
            "MaxPool", ["r1"], ["p"], name="pool", kernel_shape=[2, 2], strides=[2, 2]
        ),
        helper.make_node("GlobalAveragePool", ["p"], ["g"], name="gap"),
        helper.make_node("Flatten", ["g"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "wf"], ["y"], name="fc", transB=1),
    ]
    inits = {
        "w0": _w(1, 16, 8, 3, 3),
        "b0": _w(2, 16, 1)[:, 0],
        "w1": _w(3, 16, 16, 3, 3),
        "wf": _w(4, 10, 16),
    }
    return make_model(nodes, {"x": (batch, 8, 16, 16)}, {"y": None}, initializers=inits)


@pytest.fixture
def small_spill(monkeypatch):
    """Count the test net's 16-channel activations (16 KiB an image, 48 KiB at batch 3) as
    staying on chip for one image and going through DRAM for the whole batch."""
    monkeypatch.setattr(batch_split, "SPILL_BYTES", 20 * 1024)


def test_the_front_runs_one_image_at_a_time(small_spill):
    graph = import_graph(_net())
    result = SplitBatch().run(graph, CompileOptions())
    assert result.changed
    ops = [(n, d["op_type"]) for n, d in graph.nodes()]
    clones = [n for n, _ in ops if "/image" in n]
    # the seven per-sample nodes (up to the global pool), three images each
    assert len(clones) == 21 and {n.rsplit("/", 1)[1] for n in clones} == {
        "image0",
        "image1",
        "image2",
    }
    order = graph.topological_order()
    # image 0's whole chain comes before image 1's first node
    assert order.index("pool/image0") < order.index("c0/image1")
    splits = [n for n, op in ops if op == "Split"]
    concats = [n for n, op in ops if op == "Concat"]
    assert splits == ["x/batch_split"] and concats == ["g/batch_concat"]
    assert graph.tensors["g@image1"].shape == (1, 16, 1, 1)


def test_the_split_program_matches_onnxruntime(small_spill):
    compiled = compile_graph(import_graph(_net()), CompileOptions(auto_cast="none"))
    stats = {s.name: s.value for s in compiled.passes.result_of("SplitBatch").statistics}
    assert stats["split_nodes"] == 7
    assert_matches_onnxruntime(_net())


def test_a_small_batch_that_fits_is_left_alone():
    graph = import_graph(_net())
    assert not SplitBatch().run(graph, CompileOptions()).changed
    assert not [n for n, _ in graph.nodes() if "/image" in n]


def test_a_node_mixing_images_stops_the_region(small_spill):
    # A Softmax over the batch axis reads every image: nothing after it is per sample.
    nodes = [
        helper.make_node("Softmax", ["x"], ["s"], name="softmax", axis=0),
        helper.make_node("Relu", ["s"], ["y"], name="relu"),
    ]
    graph = import_graph(make_model(nodes, {"x": (2, 4, 8, 8)}, {"y": None}))
    assert not SplitBatch().run(graph, CompileOptions()).changed


def _matches_with_reversed_concat(model, concat_node: str) -> bool:
    """Split `model`, reverse the inputs of the split's Concat `concat_node` (its pieces put
    together in the wrong order), and whether the program's output still matches."""
    graph = import_graph(model)
    SplitBatch().run(graph, CompileOptions())
    concat = graph.node(concat_node)
    concat["inputs"] = list(reversed(concat["inputs"]))
    for index, tensor in enumerate(concat["inputs"]):
        graph.uses[tensor] = [(concat_node, index)]
    compiled = compile_graph(graph, CompileOptions(auto_cast="none"), [])
    feeds = synthesize_inputs(compiled.graph, 0)
    got = run_function(compiled.module, feeds)
    want = run_onnxruntime(model, feeds)
    return compare_output("y", got["y"], want["y"], FP32_ATOL, FP32_RTOL).passed


def test_a_wrong_image_order_is_caught(small_spill):
    # Concat the images back in the wrong order: the comparison must fail.
    assert not _matches_with_reversed_concat(_net(), "g/batch_concat")


def test_the_oracle_rounds_where_every_image_rounds(small_spill):
    # Under the autocast each image's conv multiplies bf16 operands; the cast plan maps the
    # copies to their model node, so the oracle rounds the model conv's operands (validate
    # compares with it) and nothing is left unemulated.
    compiled = compile_graph(import_graph(_net()), CompileOptions())
    plan = compiled.cast_plan
    assert not plan.unemulated
    operands = {(p.node, p.input) for p in plan.points if p.kind == "operand"}
    assert {("c0", "x"), ("c0", "w0"), ("c1", "r0"), ("c1", "w1")} <= operands


def test_a_tensor_computed_per_image_is_probed_whole(small_spill):
    # The verdict's probes read r0 image by image (r0@image<j>) and hand over the whole
    # [3, 16, 16, 16] tensor, equal to the unsplit program's r0.
    def probed(passes_split: bool):
        graph = import_graph(_net())
        passes = None if passes_split else []
        compiled = compile_graph(graph, CompileOptions(), passes)  # rounds: probes
        plan = compiled.cast_plan
        source = import_graph(_net())
        reader = ProbeReader(
            compiled.module.functions[0], plan.probes, probe_shapes(plan.probes, source)
        )
        feeds = synthesize_inputs(source, 0)
        run_function(compiled.module, feeds, before=reader.before())
        return plan, reader.values

    plan, split = probed(True)
    assert {p.whole for p in plan.probes.values()} >= {"r0", "r1"}
    _, whole = probed(False)
    assert split["r0"].shape == (3, 16, 16, 16)
    np.testing.assert_allclose(split["r0"], whole["r0"], rtol=1e-6, atol=1e-6)


def test_the_images_of_a_tensor_share_one_storage_dtype():
    # An image left in DRAM (eligible for bf16 storage) is not cast while its siblings live
    # in SBUF in fp32: the oracle reads the images as one tensor of one dtype.
    from onnx2bir.codegen.weight_cast import _images_alike

    names = {f"t@image{j}": None for j in range(3)}
    assert not _images_alike("t@image2", {"t@image2": True}, names)
    assert _images_alike("t@image2", dict.fromkeys(names, True), names)
    assert _images_alike("w", {"w": True}, names)  # not an image: its own decision


def _two_stage_net(batch: int = 4, batch_norm: bool = False):
    """Stage A, 16 channels at 16 x 16 (16 KiB an image) with small weights; stage B, 32
    channels at 8 x 8 (8 KiB an image) with three 32 x 32 x 3 x 3 convs (18 KiB each in
    bf16); then a head. Under `small_spill` an image of A fits, two do not; two images of B
    fit, four do not; so A runs an image at a time and B two at a time, which reads B's
    weights twice instead of four times. The cut falls after B's first conv, b0: its output
    (8 KiB an image) is cheaper to regroup than A's (16 KiB)."""
    nodes = [
        helper.make_node("Conv", ["x", "wa"], ["a0"], name="a0", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["a0"], ["a1"], name="a1"),
        helper.make_node("Conv", ["a1", "wb0"], ["b0"], name="b0", strides=[2, 2]),
        helper.make_node("Relu", ["b0"], ["b1"], name="b1"),
        *(
            [helper.make_node("BatchNormalization", ["b1", *BN], ["b1n"], name="bn")]
            if batch_norm
            # a cheap per-sample node in the BatchNorm's place (an Identity would be dropped
            # at import, folding.drop_identity_nodes)
            else [helper.make_node("Relu", ["b1"], ["b1n"], name="bn")]
        ),
        helper.make_node("Conv", ["b1n", "wb1"], ["b2"], name="b2", pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["b2", "b0"], ["b3"], name="b3"),
        helper.make_node("Conv", ["b3", "wb2"], ["b4"], name="b4", pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["b4", "wb3"], ["b5"], name="b5", pads=[1, 1, 1, 1]),
        helper.make_node("GlobalAveragePool", ["b5"], ["g"], name="gap"),
        helper.make_node("Flatten", ["g"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "wf"], ["y"], name="fc", transB=1),
    ]
    inits = {
        "wa": _w(5, 16, 4, 3, 3),
        "wb0": _w(6, 32, 16, 2, 2),
        "wb1": _w(7, 32, 32, 3, 3),
        "wb2": _w(8, 32, 32, 3, 3),
        "wb3": _w(9, 32, 32, 3, 3),
        "wf": _w(10, 10, 32),
    }
    if batch_norm:
        rng = np.random.default_rng(11)
        inits.update({name: rng.random(32).astype(np.float32) + 0.5 for name in BN})
    return make_model(nodes, {"x": (batch, 4, 16, 16)}, {"y": None}, initializers=inits)


BN = ["bn_scale", "bn_bias", "bn_mean", "bn_var"]


def test_later_stages_take_larger_groups(small_spill):
    graph = import_graph(_two_stage_net())
    result = SplitBatch().run(graph, CompileOptions())
    groups = {f["node"]: f["group"] for f in result.findings}
    assert groups["a0"] == groups["a1"] == groups["b0"] == 1
    assert groups["b1"] == groups["b2"] == groups["b5"] == 2
    nodes = dict(graph.nodes())
    assert "b2/images0-1" in nodes and "b2/images2-3" in nodes and "a0/image3" in nodes
    # b0 computed an image at a time, read two at a time (by b1 and by the residual add):
    # regrouped once by a Concat, and image 1's b0 is computed before images 0-1 go on
    assert nodes["b0/regroup0-1"]["inputs"] == ["b0@image0", "b0@image1"]
    assert nodes["b3/images0-1"]["inputs"] == ["b2@image0", "b0@images0-1"]
    assert graph.tensors["b3@image2"].shape == (2, 32, 8, 8)
    order = graph.topological_order()
    assert order.index("b0/image1") < order.index("b1/images0-1") < order.index("a0/image2")


def test_a_last_tier_with_large_weights_runs_its_groups_in_lockstep(small_spill):
    # Stage B's weights (55 KiB in bf16) exceed SPILL_BYTES (20 KiB here): groups run one
    # after another would each load them. Its groups go in lockstep instead, cut where what
    # the other group holds fits SPILL_BYTES: after b1 the other group would hold b1 and the
    # residual b0 (32 KiB), after b3 only b3 (16 KiB).
    graph = import_graph(_two_stage_net())
    tiers, _ = batch_split._best_tiers(
        graph, batch_split._per_sample_nodes(graph, 4, {"x"}), 4, CompileOptions()
    )
    segments = batch_split._lockstep_segments(graph, tiers[-1], 4, weight_itemsize=2)
    assert segments == [("b1", "bn", "b2", "b3"), ("b4",), ("b5",), ("gap",)]
    # a tier without weights keeps its groups one after another
    unweighted = batch_split.Tier(("b1", "bn"), 2)
    assert batch_split._lockstep_segments(graph, unweighted, 4, 2) == [("b1", "bn")]

    SplitBatch().run(graph, CompileOptions())
    order = graph.topological_order()
    # the first segment runs per group right after that group's images of stage A ...
    assert order.index("b3/images0-1") < order.index("a0/image2")
    # ... and then each node's two clones one after the other
    clones = [f"{node}/images{g}" for node in ("b3", "b4", "b5") for g in ("0-1", "2-3")]
    assert sorted(clones, key=order.index) == [
        "b3/images0-1",
        "b3/images2-3",
        "b4/images0-1",
        "b4/images2-3",
        "b5/images0-1",
        "b5/images2-3",
    ]


def test_the_tiered_program_matches_onnxruntime(small_spill):
    # its last tier in lockstep (the test above)
    compiled = compile_graph(import_graph(_two_stage_net()), CompileOptions(auto_cast="none"))
    stats = {s.name: s.value for s in compiled.passes.result_of("SplitBatch").statistics}
    assert stats["tiers"] == 2
    assert_matches_onnxruntime(_two_stage_net())


def test_a_wrong_regroup_order_is_caught(small_spill):
    assert not _matches_with_reversed_concat(_two_stage_net(), "b0/regroup2-3")


def test_a_tensor_computed_two_images_at_a_time_is_probed_whole(small_spill):
    def probed(split: bool):
        # the same passes but for the split itself, so both programs run the same kernels
        passes = [p for p in default_passes() if split or not isinstance(p, SplitBatch)]
        compiled = compile_graph(import_graph(_two_stage_net()), CompileOptions(), passes)
        plan = compiled.cast_plan
        source = import_graph(_two_stage_net())
        reader = ProbeReader(
            compiled.module.functions[0], plan.probes, probe_shapes(plan.probes, source)
        )
        run_function(compiled.module, synthesize_inputs(source, 0), before=reader.before())
        return plan, reader.values

    plan, split = probed(True)
    pieces = [p for p in plan.probes.values() if p.whole == "b3"]
    assert [(p.part, p.images) for p in pieces] == [(0, 2), (2, 2)]
    _, whole = probed(False)
    assert split["b3"].shape == (4, 32, 8, 8)
    np.testing.assert_allclose(split["b3"], whole["b3"], rtol=1e-6, atol=1e-6)


def test_a_batch_norm_keeps_its_tier_at_one_image(small_spill):
    # A BatchNormalization in stage B: its lowering packs several images' planes into one
    # tile, an access the memory plan cannot keep on chip, so no tier of groups takes it
    # (GROUP_WALKED): it runs an image at a time, and the groups of two start after it.
    graph = import_graph(_two_stage_net(batch_norm=True))
    result = SplitBatch().run(graph, CompileOptions())
    groups = {f["node"]: f["group"] for f in result.findings}
    assert groups["bn"] == groups["b1"] == 1 and groups["b2"] == 2
    assert "bn/image3" in dict(graph.nodes())
    assert_matches_onnxruntime(_two_stage_net(batch_norm=True))


def test_the_report_names_the_tiers(small_spill):
    from onnx2bir.reporting.document import batch_split_text, build_report

    compiled = compile_graph(import_graph(_two_stage_net()), CompileOptions())
    split = build_report("two_stage", compiled)["batch_split"]
    assert split == {
        "images": 4,
        "tiers": [
            {"group": 1, "nodes": 3, "first": "a0", "last": "b0"},
            {"group": 2, "nodes": 7, "first": "b1", "last": "gap", "lockstep_segments": 4},
        ],
    }
    assert batch_split_text(split) == [
        "batch split (4 images): 3 nodes (a0 .. b0) an image at a time; "
        "7 nodes (b1 .. gap) 2 images at a time, the groups in lockstep over 4 segments"
    ]
    unsplit = compile_graph(import_graph(_two_stage_net(batch=1)), CompileOptions())
    assert build_report("one", unsplit)["batch_split"] is None


def _se_net(axes=(2, 3), keepdims: int = 1):
    """A squeeze-and-excitation block at batch 3, as EfficientNet exports it: Conv -> Relu ->
    ReduceMean over the image (axes an input, opset 18) -> 1x1 Conv -> Sigmoid -> Mul with the
    Relu's output -> global pool -> Gemm."""
    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["c0"], name="c0", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c0"], ["r0"], name="r0"),
        helper.make_node("ReduceMean", ["r0", "axes"], ["m"], name="mean", keepdims=keepdims),
        helper.make_node("Conv", ["m", "w1"], ["s"], name="squeeze"),
        helper.make_node("Sigmoid", ["s"], ["g"], name="gate"),
        helper.make_node("Mul", ["r0", "g"], ["e"], name="excite"),
        helper.make_node("GlobalAveragePool", ["e"], ["p"], name="gap"),
        helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "wf"], ["y"], name="fc", transB=1),
    ]
    inits = {
        "w0": _w(21, 16, 8, 3, 3),
        "w1": _w(22, 16, 16, 1, 1),
        "wf": _w(23, 10, 16),
        "axes": np.array(axes, np.int64),
    }
    return make_model(nodes, {"x": (3, 8, 16, 16)}, {"y": None}, initializers=inits)


def test_a_squeeze_and_excitation_block_runs_an_image_at_a_time(small_spill):
    # The mean over each image keeps the images apart, so the block is per sample: its nodes
    # are cloned per image with the rest of the front, and the program still matches.
    graph = import_graph(_se_net())
    result = SplitBatch().run(graph, CompileOptions())
    split = {f["node"] for f in result.findings}
    assert {"mean", "squeeze", "gate", "excite"} <= split
    assert "mean/image2" in dict(graph.nodes())
    assert_matches_onnxruntime(_se_net())


def test_a_mean_across_images_or_dropping_axes_is_not_per_sample(small_spill):
    graph = import_graph(_se_net())
    mean = graph.node("mean")
    assert batch_split._reduces_within_images(graph, mean)
    assert not batch_split._reduces_within_images(graph, {**mean, "attrs": {"keepdims": 0}})
    # a mean over the images as well: the front stops before it
    across = import_graph(_se_net(axes=(0, 2, 3)))
    assert not batch_split._reduces_within_images(across, across.node("mean"))
    SplitBatch().run(across, CompileOptions())
    nodes = dict(across.nodes())
    assert "mean" in nodes and "mean/image0" not in nodes and "c0/image0" in nodes
