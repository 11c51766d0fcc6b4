"""`validate --segments N`: the model cut into consecutive pieces, each validated from
onnxruntime's values at its inputs (docs/validation.md#segments).

The cuts are checked against onnxruntime (every segment, run on its own, gives the values the
whole model gives), the verdict against the whole-model validate: the same PASS on a shipped
model, the same FAIL when the machine computes one node wrong — caught in the segment that holds
that node, and only there — and when an op has no lowering.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from validation_helpers import corrupt_node

from onnx2bir.bir.enums import MemoryType
from onnx2bir.cli.commands import main
from onnx2bir.frontend.importer import import_model, load_model
from onnx2bir.runtime.oracle.ort import run_onnxruntime, synthesize_inputs
from onnx2bir.validation.segments import WEIGHT_COST, choose_cuts, crossings, node_costs
from onnx2bir.validation.subgraph import Cutter, all_values

ROOT = Path(__file__).resolve().parents[2]
RESNET18 = ROOT / "models" / "resnet18.onnx"
SMALL_CNN = ROOT / "models" / "small_cnn.onnx"


def _validate(capsys, *args) -> tuple[int, dict]:
    capsys.readouterr()
    code = main(["validate", *[str(a) for a in args], "--json", "--no-progress"])
    return code, json.loads(capsys.readouterr().out)


def test_every_segment_gives_the_values_of_the_whole_model():
    model = load_model(RESNET18)
    feeds = synthesize_inputs(import_model(model), 0)
    values = all_values(model, feeds)
    cutter = Cutter(model, feeds, values)
    cuts = [20, 45]
    ends = [c - 1 for c in cuts] + [len(cutter.nodes) - 1]
    for first, last in zip([0, *cuts], ends, strict=True):
        piece = cutter.segment(first, last)
        onnx.checker.check_model(piece.model)
        got = run_onnxruntime(piece.model, piece.feeds)
        assert got, "a segment with no outputs"
        for name, value in got.items():
            np.testing.assert_array_equal(value, values[name], err_msg=name)


def test_cuts_balance_the_work_and_prefer_few_crossing_tensors():
    # 32 nodes of equal work, two segments: the ideal cut is before node 16, and the window of
    # an eighth of a segment's work (2 nodes) holds places 14..18. Three tensors cross each
    # place but 17, where one does: 17 wins.
    crossing = [0] + [3] * 31 + [0]
    crossing[17] = 1
    assert choose_cuts([1] * 32, crossing, 2) == [17]
    # Nothing to prefer: the ideal places.
    assert choose_cuts([1] * 32, [0] + [3] * 31 + [0], 4) == [8, 16, 24]
    # Each node is more than the window: the cut cannot move, even to a lower crossing.
    assert choose_cuts([100] * 8, [0, 2, 2, 1, 3, 1, 2, 2, 0], 2) == [4]


def test_node_costs_count_multiply_accumulates():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    w = onnx.numpy_helper.from_array(np.ones((4, 3, 3, 3), np.float32), "w")
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
            helper.make_node("Relu", ["c"], ["y"]),
        ],
        "g",
        [x],
        [y],
        [w],
    )
    model = helper.make_model(graph)
    shapes = {"x": (1, 3, 8, 8), "w": (4, 3, 3, 3), "c": (1, 4, 8, 8), "y": (1, 4, 8, 8)}
    conv, relu = node_costs(model, shapes)
    # 256 outputs x 27 products each, the 256 outputs written, 108 weights read.
    assert conv == 256 * 27 + 256 + WEIGHT_COST * 108
    assert relu == 256


def test_crossings_count_the_tensors_a_cut_separates():
    model = load_model(RESNET18)
    cutter = Cutter(model, {}, None)
    counts = crossings(cutter)
    assert counts[0] == 0 and counts[-1] == 0
    for place in (10, 30, 50):
        made = {t for node in cutter.nodes[:place] for t in node.output}
        later = {t for reads in cutter.reads[place:] for t in reads}
        assert counts[place] == len(made & later & cutter.dynamic)


def test_segments_pass_where_the_whole_model_passes(capsys):
    code, whole = _validate(capsys, RESNET18)
    assert code == 0 and whole["passed"]
    code, doc = _validate(capsys, RESNET18, "--segments", 3, "--jobs", 2)
    assert code == 0 and doc["passed"]
    pieces = doc["segments"]
    assert len(pieces) == 3
    assert pieces[0]["first_node"] == 0 and pieces[-1]["last_node"] == 68
    for before, after in zip(pieces, pieces[1:], strict=False):
        assert after["first_node"] == before["last_node"] + 1
        assert set(before["outputs_cut"]) & set(after["inputs"])
    assert [o["name"] for o in doc["outputs"]] == [o["name"] for o in whole["outputs"]]
    for piece in pieces:
        assert piece["outputs"] and all(o["passed"] for o in piece["outputs"])
        assert piece["wall_seconds"] > 0
    assert abs(sum(p["work_share"] for p in pieces) - 1) < 1e-3


def test_a_wrong_node_fails_its_segment_and_only_it(capsys, monkeypatch):
    index = 30
    node = onnx.load(str(RESNET18)).graph.node[index].name
    # Its results stay in SBUF in the whole model (and go to DRAM where a segment ends):
    # perturb both. Forked workers inherit the corrupted machine.
    corrupt_node(monkeypatch, node, memories=(MemoryType.DRAM, MemoryType.SB))
    code, whole = _validate(capsys, RESNET18)
    assert code == 1 and not whole["passed"]
    code, doc = _validate(capsys, RESNET18, "--segments", 3)
    assert code == 1 and not doc["passed"]
    holding = [p for p in doc["segments"] if p["first_node"] <= index <= p["last_node"]]
    assert [p["passed"] for p in holding] == [False]
    assert all(p["passed"] for p in doc["segments"] if p not in holding)


def test_an_op_without_a_lowering_fails_like_the_whole_model(tmp_path, capsys):
    model = onnx.load(str(SMALL_CNN))
    last = model.graph.node[-1]
    inner = last.output[0]
    last.output[0] = inner + "_pre"
    model.graph.node.append(helper.make_node("RandomNormalLike", [inner + "_pre"], [inner]))
    path = tmp_path / "lp.onnx"
    onnx.save(model, str(path))
    code, whole = _validate(capsys, path)
    assert code == 1
    code, doc = _validate(capsys, path, "--segments", 2)
    assert code == 1 and not doc["passed"]
    failed = [p for p in doc["segments"] if not p["passed"]]
    assert len(failed) == 1 and "RandomNormalLike" in failed[0]["error"]["message"]
    assert failed[0]["error"]["kind"] == "does_not_compile"


@pytest.mark.parametrize(
    "args, message",
    [
        (["--segments", "500"], "only 69 nodes"),
        (["--segments", "2", "--max-drift", "cosine=0.9"], "cannot be combined with --max-drift"),
        (["--segments", "2", "--localize"], "cannot be combined with --localize"),
    ],
)
def test_refused_with_a_reason(capsys, args, message):
    code, doc = _validate(capsys, RESNET18, *args)
    assert code == 2 and message in doc["error"]["message"]


def test_one_segment_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["validate", str(SMALL_CNN), "--segments", "1"])
    assert exit_info.value.code == 2
    assert "at least 2" in capsys.readouterr().err


def test_the_page_shows_each_segment(tmp_path, capsys):
    page = tmp_path / "page.html"
    code, _ = _validate(capsys, SMALL_CNN, "--segments", 2, "--html", page)
    assert code == 0
    text = page.read_text()
    assert 'id="segments"' in text and text.count("<tr><td>segment ") == 2


def test_segments_on_a_local_ray_instance(capsys):
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        code, doc = _validate(capsys, SMALL_CNN, "--segments", 2, "--ray")
    finally:
        ray.shutdown()
    assert code == 0 and doc["passed"] and doc["segmenting"]["runner"] == "ray"
    assert len(doc["segments"]) == 2
