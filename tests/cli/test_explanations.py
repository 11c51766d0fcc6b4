"""A flag that changed nothing says why; geometry as the model wrote it; fallback reasons
ranked; every table column has a header."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from onnx2bir.cli.commands import main
from onnx2bir.reporting.document import rank_refusals

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "models"


def run(argv, capsys):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_validate_says_why_the_attention_flag_raised_nothing(capsys):
    # bert.onnx is fp32: the master flag alone raises nothing without the bf16 flag.
    code, out, _ = run(
        ["validate", MODELS / "bert.onnx", "--enable-native-kernel-attention"], capsys
    )
    assert code == 0 and out.startswith("PASS")
    note = next(line for line in out.splitlines() if "note:" in line)
    assert "nothing raised" in note and "enable-native-kernel-attention-bf16 is off" in note
    # With both flags the sequence gate refuses: 16 tokens <= 1007.
    code, out, _ = run(
        [
            "validate",
            MODELS / "mha.onnx",
            "--enable-native-kernel-attention",
            "--enable-native-kernel-attention-bf16",
            "--json",
        ],
        capsys,
    )
    (note,) = json.loads(out)["notes"]
    assert note["flag"] == "--enable-native-kernel-attention"
    assert "sequence 16 <= 1007" in note["message"]
    assert "docs/attention.md#gates" in note["message"]


def test_no_note_when_the_flag_did_its_work(capsys):
    code, out, _ = run(["report", MODELS / "small_cnn.onnx", "--json"], capsys)
    assert code == 0 and json.loads(out)["notes"] == []


def test_the_experimental_conv_flag_says_it_changed_nothing_and_why(capsys):
    code, out, _ = run(
        ["report", MODELS / "small_cnn.onnx", "--experimental-convolution-kernel-match"], capsys
    )
    note = next(line for line in out.splitlines() if line.startswith("note:"))
    assert "4 matched a functional-registry kernel first" in note
    assert "disabled" in note


def test_the_bf16_flag_alone_says_it_needs_the_master_flag(capsys):
    code, out, _ = run(
        ["report", MODELS / "mha.onnx", "--enable-native-kernel-attention-bf16", "--json"], capsys
    )
    flags = [n["flag"] for n in json.loads(out)["notes"]]
    assert flags == ["--enable-native-kernel-attention-bf16"]


def test_conv_transpose_geometry_is_printed_with_the_models_stride(capsys):
    code, out, _ = run(["report", MODELS / "unet.onnx"], capsys)
    # unet's up-sampling ConvTranspose has stride 2 (kernel 2x2); the canonical form keeps
    # that stride as lhs_dilation and a unit stride, which the table must not show.
    rows = [line for line in out.splitlines() if " T 64->32 " in line]
    assert rows and "k2x2 s2x2" in rows[0]
    code, out, _ = run(["report", MODELS / "unet.onnx", "--json"], capsys)
    transposed = [c for c in json.loads(out)["convs"] if c["op_type"] == "ConvTranspose"]
    assert transposed and all(c["model_stride"] == [2, 2] for c in transposed)


def test_fallback_reasons_put_the_closest_entry_first():
    conv = {
        "walk": [
            {"entry": "a", "refused": "lhs_dilation [2, 2] (transposed conv)"},
            {"entry": "b", "refused": "not depthwise (groups 1, C_in 64)"},
            {"entry": "c", "refused": "C_in x kH = 144 x 1 > 128 partitions"},
        ]
    }
    assert [s["entry"] for s in rank_refusals(conv)] == ["c", "b", "a"]


def test_the_table_shows_two_reasons_and_points_to_explain(capsys):
    code, out, _ = run(["report", MODELS / "mobilenetv3.onnx"], capsys)
    row = next(line for line in out.splitlines() if "GENERIC" in line and "144->40" in line)
    # The closest refusal is the partition limit, not the first registry entry's form test.
    assert row.split("GENERIC - ")[1].startswith("rep_nhwc: C_in x kH = 144 x 1 > 128")
    assert "more: --explain" in row


def test_a_conv_no_registry_entry_was_tried_for_shows_why(tmp_path, capsys):
    """A 3-D conv is not walked through the 2-D registry: the table gives that reason instead
    of an empty one, in text and in HTML."""
    from onnx import TensorProto, helper, numpy_helper, save

    weight = numpy_helper.from_array(np.ones((4, 2, 2, 2, 2), np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], name="c3", strides=[2, 2, 2])],
        "video",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 2, 4, 4])],
        [weight],
    )
    path = tmp_path / "conv3d.onnx"
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    code, out, _ = run(["report", path], capsys)
    row = next(line for line in out.splitlines() if line.strip().startswith("c3 "))
    assert row.split("GENERIC - ")[1] == "3-D conv: only 2-D convs are matched"
    code, out, _ = run(["report", path, "--html", tmp_path / "r.html"], capsys)
    assert "3-D conv: only 2-D convs are matched" in (tmp_path / "r.html").read_text()


def test_localize_table_headers_and_skipped_nodes_are_explained(capsys):
    code, out, _ = run(["validate", MODELS / "small_cnn.onnx", "--localize"], capsys)
    assert "max abs err" in out and "inputs err" in out and "op type" in out
    assert "inputs' err: the largest abs error already in its inputs" in out
    assert "in abs" not in out
    assert "onnxruntime (session creation + run)" in out


def test_validate_json_explains_its_timings(capsys):
    code, out, _ = run(["validate", MODELS / "small_cnn.onnx", "--json"], capsys)
    doc = json.loads(out)
    assert "session creation" in doc["timings_explained"]["onnxruntime"]
    assert set(doc["timings"]) <= set(doc["timings_explained"])


def test_an_input_shape_that_replaces_a_fixed_shape_is_said(capsys):
    code, out, _ = run(
        ["validate", MODELS / "small_cnn.onnx", "--input-shape", "input=1,3,16,16", "--json"],
        capsys,
    )
    (note,) = json.loads(out)["notes"]
    assert code == 0 and note["flag"] == "--input-shape"
    assert "1x3x32x32" in note["message"] and "1x3x16x16" in note["message"]
    code, out, _ = run(
        ["report", MODELS / "small_cnn.onnx", "--input-shape", "input=1,3,32,32", "--json"],
        capsys,
    )
    assert json.loads(out)["notes"] == []  # the declared shape itself: nothing to say
