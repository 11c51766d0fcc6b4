"""Inputs: seeded synthesis (gather-bounded indices, attention masks), .npz and test_data_set
folders in and out."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from validation_helpers import F32, I64, SMALL_CNN, model, run, run_json, save

from onnx2bir.compiler import import_graph
from onnx2bir.errors import UserError
from onnx2bir.runtime.oracle.ort import (
    input_rules,
    load_inputs,
    run_onnxruntime,
    synthesize_inputs,
)


def _gather_model():
    nodes = [
        helper.make_node("Cast", ["ids"], ["ids32"], to=TensorProto.INT32),
        helper.make_node("Unsqueeze", ["ids32", "axis0"], ["ids3"]),
        helper.make_node("Gather", ["emb", "ids3"], ["e"]),  # table of 5 rows
        helper.make_node("Gather", ["wide", "ids"], ["w"]),  # table of 50 rows: 5 wins
        helper.make_node("Gather", ["tab", "pos"], ["p"], axis=1),  # axis 1 of [3, 7]
        helper.make_node("Add", ["n", "n"], ["n2"]),
    ]
    return model(
        nodes,
        {"ids": (I64, [4, 64]), "pos": (I64, [200]), "n": (I64, [300])},
        {
            "e": (F32, [1, 4, 64, 8]),
            "w": (F32, [4, 64, 2]),
            "p": (F32, [3, 200]),
            "n2": (I64, [300]),
        },
        {
            "axis0": np.array([0], np.int64),
            "emb": np.arange(40, dtype=np.float32).reshape(5, 8),
            "wide": np.ones((50, 2), np.float32),
            "tab": np.ones((3, 7), np.float32),
        },
    )


def test_gather_indices_stay_inside_the_table():
    proto = _gather_model()
    graph = import_graph(proto)
    feeds = synthesize_inputs(graph, seed=3)
    assert feeds["ids"].min() >= 0 and feeds["ids"].max() == 4  # smallest table: 5 rows
    assert feeds["pos"].min() >= 0 and feeds["pos"].max() == 6  # axis 1 of tab: 7
    assert feeds["n"].max() == 7  # no gather: the [0, 8) default
    assert feeds["ids"].dtype == np.int64
    rules = input_rules(graph)
    assert rules["ids"].startswith("gather indices: integers in [0, 5)")
    assert rules["pos"].startswith("gather indices: integers in [0, 7)")
    assert rules["n"] == "integers in [0, 8)"
    run_onnxruntime(proto, feeds)  # every index is valid
    with pytest.raises(UserError, match="onnxruntime could not run"):  # out of range
        run_onnxruntime(proto, {**feeds, "ids": np.full((4, 64), 7, np.int64)})


def _mask_model():
    nodes = [
        # attention_mask: by name
        helper.make_node("Cast", ["attention_mask"], ["mf"], to=TensorProto.FLOAT),
        helper.make_node("Sub", ["one", "mf"], ["inv"]),
        helper.make_node("Mul", ["inv", "big"], ["bias"]),
        helper.make_node("Add", ["scores", "bias"], ["s1"]),
        # keep: no "mask" in the name, but it is the 1 - x of mask arithmetic
        helper.make_node("Sub", ["one", "keep"], ["inv2"]),
        helper.make_node("Mul", ["inv2", "big"], ["bias2"]),
        helper.make_node("Add", ["s1", "bias2"], ["y"]),
        # masked_lm_positions: "masked" is not a mask; it indexes a table
        helper.make_node("Gather", ["table", "masked_lm_positions"], ["g"]),
    ]
    return model(
        nodes,
        {
            "attention_mask": (I64, [2, 16]),
            "keep": (F32, [2, 16]),
            "scores": (F32, [2, 16]),
            "masked_lm_positions": (I64, [2, 3]),
        },
        {"y": (F32, [2, 16]), "g": (F32, [2, 3, 4])},
        {
            "one": np.array(1.0, np.float32),
            "big": np.array(-10000.0, np.float32),
            "table": np.ones((16, 4), np.float32),
        },
    )


def test_attention_masks_are_zero_one_with_each_row_attending():
    graph = import_graph(_mask_model())
    feeds = synthesize_inputs(graph, seed=0)
    rules = input_rules(graph)
    for name in ("attention_mask", "keep"):
        assert set(np.unique(feeds[name]).tolist()) == {0, 1}, name
        assert np.all(feeds[name][..., 0] == 1), name
        assert rules[name].startswith("attention mask")
    assert feeds["attention_mask"].dtype == np.int64 and feeds["keep"].dtype == np.float32
    assert "name contains 'mask'" in rules["attention_mask"]
    assert "1 - x" in rules["keep"]
    assert rules["masked_lm_positions"].startswith("gather indices: integers in [0, 16)")
    assert rules["scores"] == "standard normal"
    assert len(np.unique(feeds["scores"])) == feeds["scores"].size


def test_one_hot_codes_cover_the_compared_range():
    # x[..., None] == arange(257), as tf2onnx writes a one-hot (magika's bytes); a second
    # input compared with a two-valued constant is still a mask.
    nodes = [
        helper.make_node("Unsqueeze", ["codes", "last"], ["c3"]),
        helper.make_node("Equal", ["c3", "alphabet"], ["hot"]),
        helper.make_node("Cast", ["hot"], ["y"], to=TensorProto.FLOAT),
        helper.make_node("Equal", ["flag", "zero_one"], ["z"]),
    ]
    proto = model(
        nodes,
        {"codes": (TensorProto.INT32, [1, 2048]), "flag": (I64, [1, 4])},
        {"y": (F32, [1, 2048, 257]), "z": (TensorProto.BOOL, [2, 4])},
        {
            "last": np.array([-1], np.int64),
            "alphabet": np.arange(257, dtype=np.int32),
            "zero_one": np.array([[0], [1]], np.int64),
        },
    )
    graph = import_graph(proto)
    feeds = synthesize_inputs(graph, seed=0)
    rules = input_rules(graph)
    assert rules["codes"].startswith("one-hot codes: integers in [0, 256]")
    assert feeds["codes"].dtype == np.int32
    assert feeds["codes"].min() >= 0 and feeds["codes"].max() <= 256
    assert len(np.unique(feeds["codes"])) > 200  # not the {0, 1} of a mask
    assert rules["flag"].startswith("attention mask")


def test_synthesis_is_seeded():
    graph = import_graph(_mask_model())
    first, again = synthesize_inputs(graph, 5), synthesize_inputs(graph, 5)
    other = synthesize_inputs(graph, 6)
    assert all(np.array_equal(first[k], again[k]) for k in first)
    assert not np.array_equal(first["scores"], other["scores"])


def test_npz_round_trip(tmp_path, capsys):
    inputs, outputs, again = tmp_path / "in.npz", tmp_path / "out.npz", tmp_path / "again.npz"
    code, doc = run_json(
        ["validate", SMALL_CNN, "--seed", "4", "--save-inputs", inputs, "--save-outputs", outputs],
        capsys,
    )
    assert code == 0 and doc["seed"] == 4
    saved = np.load(inputs)
    expected = synthesize_inputs(import_graph(SMALL_CNN), 4)
    assert np.array_equal(saved["input"], expected["input"])
    code, doc = run_json(
        ["validate", SMALL_CNN, "--inputs", inputs, "--save-outputs", again], capsys
    )
    assert code == 0 and doc["seed"] is None
    assert doc["inputs"][0]["source"] == f"from {inputs}"
    first, second = np.load(outputs), np.load(again)
    assert first.files == second.files == ["logits"]
    assert np.array_equal(first["logits"], second["logits"])
    assert not list(tmp_path.glob(".*"))  # no staging files left behind


def test_test_data_set_round_trip(tmp_path, capsys):
    folder = tmp_path / "model" / "test_data_set_0"
    folder.parent.mkdir()
    outputs = tmp_path / "outputs"
    code, _ = run_json(
        ["validate", SMALL_CNN, "--seed", "2", "--save-inputs", folder, "--save-outputs", outputs],
        capsys,
    )
    assert code == 0
    tensor = onnx.load_tensor(str(folder / "input_0.pb"))
    assert tensor.name == "input"
    assert onnx.load_tensor(str(outputs / "output_0.pb")).name == "logits"
    graph = import_graph(SMALL_CNN)
    expected = synthesize_inputs(graph, 2)["input"]
    for source in (folder, folder.parent):  # the data set, or the model folder holding it
        assert np.array_equal(load_inputs(source, graph)["input"], expected)
    again = tmp_path / "again.npz"
    code, _ = run_json(
        ["validate", SMALL_CNN, "--inputs", folder.parent, "--save-outputs", again], capsys
    )
    saved = numpy_helper.to_array(onnx.load_tensor(str(outputs / "output_0.pb")))
    assert code == 0 and np.array_equal(np.load(again)["logits"], saved)


def test_unnamed_tensor_protos_match_by_position(tmp_path):
    value = np.ones((1, 3, 32, 32), np.float32)
    tensor = numpy_helper.from_array(value)  # no name
    (tmp_path / "input_0.pb").write_bytes(tensor.SerializeToString())
    feeds = load_inputs(tmp_path, import_graph(SMALL_CNN))
    assert np.array_equal(feeds["input"], value)


@pytest.mark.parametrize(
    "value, fragment",
    [
        (np.ones((1, 3, 8, 8), np.float32), "has shape"),
        (np.ones((2, 2), np.float32), "has shape"),
    ],
)
def test_bad_inputs_are_one_line_errors(tmp_path, capsys, value, fragment):
    path = tmp_path / "bad.npz"
    np.savez(path, input=value)
    code, _, err = run(["validate", SMALL_CNN, "--inputs", path], capsys)
    assert code == 2 and fragment in err and len(err.strip().splitlines()) == 1


def test_floats_are_not_truncated_into_integer_inputs(tmp_path):
    proto = _gather_model()
    path = tmp_path / "ids.npz"
    np.savez(
        path,
        ids=np.zeros((4, 64), np.float32),
        pos=np.zeros(200, np.int64),
        n=np.zeros(300, np.int64),
    )
    with pytest.raises(UserError, match="refusing to truncate"):
        load_inputs(path, import_graph(save(proto, tmp_path / "g.onnx")))
