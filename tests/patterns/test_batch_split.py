"""SplitBatch (patterns/batch_split.py, docs/memory_planner.md#batch-split): the batch-heavy
front of a CNN runs one image at a time, and the program still computes what onnxruntime
computes."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import assert_matches_onnxruntime, make_model
from onnx import helper

from onnx2bir.compiler import compile_graph, import_graph
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
    """Count every activation of the test net as going through DRAM at full batch."""
    monkeypatch.setattr(batch_split, "SPILL_BYTES", 1024)


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


def test_a_wrong_image_order_is_caught(small_spill):
    # Concat the images back in the wrong order: the comparison must fail.
    model = _net()
    graph = import_graph(model)
    SplitBatch().run(graph, CompileOptions())
    concat = graph.node("g/batch_concat")
    concat["inputs"] = list(reversed(concat["inputs"]))
    for index, tensor in enumerate(concat["inputs"]):
        graph.uses[tensor] = [("g/batch_concat", index)]
    compiled = compile_graph(graph, CompileOptions(auto_cast="none"), [])
    feeds = synthesize_inputs(compiled.graph, 0)
    got = run_function(compiled.module, feeds)
    want = run_onnxruntime(model, feeds)
    assert not compare_output("y", got["y"], want["y"], FP32_ATOL, FP32_RTOL).passed


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
