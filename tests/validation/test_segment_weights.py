"""`validate --segments` on a model whose weights are external data: each segment reads only its
own weights from the file, the parent none, and `--segment-memory` plans how many segments.

The model is a chain of six 256 x 256 projections (MatMul, Add of a bias, Relu) written with
every tensor in one data file. What a segment reads is checked against the model's own
initializers (the bytes of those its nodes name), the verdict against onnxruntime as the
whole-model validate does.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx2bir.cli.commands import main
from onnx2bir.frontend import importer
from onnx2bir.frontend.importer import external_array, load_model
from onnx2bir.validation import segments
from onnx2bir.validation.segments import (
    PLANNED_TENSOR_COPIES,
    PLANNED_WEIGHT_COPIES,
    PROCESS_BYTES,
    SegmentPlan,
    earlier_segments,
    segment_values,
)
from onnx2bir.validation.subgraph import Cutter, all_values

LAYERS, WIDTH = 6, 256


@pytest.fixture(scope="module")
def chain(tmp_path_factory) -> tuple[str, onnx.ModelProto]:
    rng = np.random.default_rng(3)
    nodes, inits, x = [], [], "x"
    for k in range(LAYERS):
        w = (rng.standard_normal((WIDTH, WIDTH)) / 16).astype(np.float32)
        b = (0.1 * rng.standard_normal(WIDTH)).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"w{k}"), numpy_helper.from_array(b, f"b{k}")]
        y = "y" if k == LAYERS - 1 else f"h{k}"
        nodes += [
            helper.make_node("MatMul", [x, f"w{k}"], [f"m{k}"], name=f"mm{k}"),
            helper.make_node("Add", [f"m{k}", f"b{k}"], [f"a{k}"], name=f"add{k}"),
            helper.make_node("Relu", [f"a{k}"], [y], name=f"relu{k}"),
        ]
        x = y
    graph = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, WIDTH])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, WIDTH])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    folder = tmp_path_factory.mktemp("external")
    path = folder / "chain.onnx"
    inline = onnx.ModelProto()
    inline.CopyFrom(model)  # onnx.save below turns the model's tensors into references
    onnx.save(model, str(path), save_as_external_data=True, location="chain.data", size_threshold=0)
    return str(path), inline


def _validate(capsys, *args) -> tuple[int, dict]:
    capsys.readouterr()
    code = main(["validate", *[str(a) for a in args], "--json", "--no-progress"])
    return code, json.loads(capsys.readouterr().out)


def _own_bytes(model: onnx.ModelProto, first: int, last: int) -> int:
    """The bytes of the initializers nodes first..last name: what the segment must read."""
    sizes = {i.name: numpy_helper.to_array(i).nbytes for i in model.graph.initializer}
    names = {t for node in model.graph.node[first : last + 1] for t in node.input if t in sizes}
    return sum(sizes[name] for name in names)


def test_the_skeleton_maps_large_weights_and_reads_small_ones(chain):
    path, model = chain
    skeleton = load_model(path, weights=False)
    by_name = {init.name: init for init in skeleton.graph.initializer}
    w0 = by_name["w0"]  # 65,536 elements: stays a reference, its location made absolute
    assert onnx.external_data_helper.uses_external_data(w0)
    location = next(e.value for e in w0.external_data if e.key == "location")
    assert location.startswith("/") and location.endswith("chain.data")
    mapped = external_array(w0)
    assert isinstance(mapped, np.memmap)
    expected = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    np.testing.assert_array_equal(mapped, expected["w0"])
    b0 = by_name["b0"]  # 256 elements: read now
    assert not onnx.external_data_helper.uses_external_data(b0)
    np.testing.assert_array_equal(numpy_helper.to_array(b0), expected["b0"])


def test_each_segment_reads_only_its_own_weights(chain, capsys, monkeypatch):
    path, model = chain

    def whole_read(*args, **kwargs):
        raise AssertionError("the parent read the whole external data")

    # Every whole-model read goes through onnx's loader; the segments' reads do not.
    monkeypatch.setattr(importer.external_data_helper, "load_external_data_for_model", whole_read)
    code, doc = _validate(capsys, path, "--segments", 3, "--jobs", 1)
    assert code == 0 and doc["passed"], doc.get("error")
    pieces = doc["segments"]
    assert len(pieces) == 3
    large = 4 * WIDTH * WIDTH  # the biases (1 KiB each) were read by the parent's skeleton
    for piece in pieces:
        own = _own_bytes(model, piece["first_node"], piece["last_node"])
        layers = round(own / (large + 4 * WIDTH))
        assert piece["weight_bytes"] == layers * large, piece
        assert piece["peak_bytes"] and piece["peak_bytes"] > 0
    assert sum(p["weight_bytes"] for p in pieces) == LAYERS * large
    (output,) = doc["outputs"]
    assert output["name"] == "y" and output["passed"] and output["segment"] == 3


def test_the_values_chained_segment_by_segment_are_the_whole_models(chain):
    # Each segment's onnxruntime run, fed the earlier segments' values, gives what one run of
    # the whole model gives.
    path, model = chain
    skeleton = load_model(path, weights=False)
    feeds = {"x": np.random.default_rng(0).standard_normal((64, WIDTH)).astype(np.float32)}
    bounds = [(0, 4), (5, 10), (11, 17)]
    plan = SegmentPlan(skeleton.SerializeToString(), feeds, bounds)
    needs = earlier_segments(Cutter(skeleton, feeds, {}), bounds)
    assert needs == [[], [0], [1]]
    made = []
    for index in range(3):
        made.append(segment_values(plan, index, *(made[j] for j in needs[index])))
    whole = all_values(onnx.load(path), feeds)
    assert set(made[0]) == {"a1"} and set(made[1]) == {"a3"} and set(made[2]) == {"y"}
    for values in made:
        for name, value in values.items():
            np.testing.assert_array_equal(value, whole[name], err_msg=name)


def test_segment_memory_plans_the_count(chain, capsys):
    path, model = chain
    tensor = 64 * WIDTH * 4
    layer = 4 * WIDTH * WIDTH + 4 * WIDTH
    # One layer is planned at its weights and its three tensors times the plan's factors; two
    # fit, three not.
    one = PLANNED_WEIGHT_COPIES * layer + PLANNED_TENSOR_COPIES * 3 * tensor
    limit = int(PROCESS_BYTES + 2 * one + one / 2)
    code, doc = _validate(capsys, path, "--segment-memory", limit, "--jobs", 1)
    assert code == 0 and doc["passed"], doc.get("error")
    pieces = doc["segments"]
    assert len(pieces) == 3, [(p["first_node"], p["last_node"]) for p in pieces]
    assert all(p["planned_peak_bytes"] <= limit for p in pieces)
    assert doc["segmenting"]["segment_memory"] == limit


def test_segment_memory_below_one_node_is_refused(chain, capsys):
    path, _ = chain
    code, doc = _validate(capsys, path, "--segment-memory", PROCESS_BYTES + 100_000)
    assert code == 2
    assert "--segment-memory" in doc["error"]["message"] and "alone" in doc["error"]["message"]


def test_segments_whose_weights_would_not_serialize_are_cut_again(chain, capsys, monkeypatch):
    # onnxruntime is given a segment as one protobuf message (2 GiB at most): with the cap at
    # two layers' weights, two segments of three layers each become more, none above the cap.
    path, model = chain
    layer = 4 * WIDTH * WIDTH + 4 * WIDTH
    monkeypatch.setattr(segments, "SERIALIZED_WEIGHT_BYTES", 2 * layer)
    code, doc = _validate(capsys, path, "--segments", 2, "--jobs", 1)
    assert code == 0 and doc["passed"], doc.get("error")
    pieces = doc["segments"]
    assert len(pieces) >= 3
    for piece in pieces:
        assert _own_bytes(model, piece["first_node"], piece["last_node"]) <= 2 * layer
