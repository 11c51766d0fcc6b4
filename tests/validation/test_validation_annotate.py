"""`report --annotate`: the decisions as node metadata; the model still loads and runs."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper
from validation_helpers import F32, SMALL_CNN, model, run, save

from onnx2bir.runtime.oracle.ort import run_onnxruntime

REP_NHWC = "Conv2d_dw_fb01_io01_01bf_rep_nhwc_Pcinh"


def _meta(node: onnx.NodeProto) -> dict[str, str]:
    return {entry.key: entry.value for entry in node.metadata_props}


def test_annotated_small_cnn_loads_runs_and_carries_the_decisions(tmp_path, capsys):
    out = tmp_path / "annotated.onnx"
    source = onnx.load(str(SMALL_CNN))  # with a metadata entry of its own, which must stay
    source.graph.node[0].metadata_props.add(key="namespace", value="the model's own")
    original = tmp_path / "small_cnn.onnx"
    original.write_bytes(source.SerializeToString())
    code, stdout, err = run(["report", original, "--annotate", out], capsys)
    assert code == 0 and "wrote" in err and "convolutions: 4 of 5" in stdout
    annotated = onnx.load(str(out))
    onnx.checker.check_model(annotated, full_check=True)
    meta = {node.name: _meta(node) for node in annotated.graph.node}
    assert meta["node_conv2d"]["onnx2bir.kernel"] == REP_NHWC
    assert meta["node_conv2d"]["onnx2bir.lowering"] == f"kernel.{REP_NHWC}"
    assert meta["node_conv2d"]["onnx2bir.registry_entry"] == "rep_nhwc"
    assert "onnx2bir.fallback_reason" not in meta["node_conv2d"]
    assert "feature_group_count 4 != 1" in meta["node_conv2d_4"]["onnx2bir.fallback_reason"]
    assert meta["node_conv2d_4"]["onnx2bir.lowering"] == "generic.Conv"
    # a Relu right after a conv runs on the conv's eviction
    # (docs/conv_selection.md#fused-activations)
    assert meta["node_relu"]["onnx2bir.lowering"] == "fused into node_conv2d"
    assert meta["node_relu_3"]["onnx2bir.lowering"] == "generic.Relu"  # after the Add
    fused = {n for n, m in meta.items() if m["onnx2bir.lowering"].startswith("fused into")}
    assert fused == {"node_relu", "node_relu_1", "node_relu_2", "node_relu_4"}
    assert all(int(m["onnx2bir.instructions"]) > 0 for n, m in meta.items() if n not in fused)
    assert meta["node_conv2d"]["namespace"] == "the model's own"  # existing metadata is kept
    model_meta = {e.key: e.value for e in annotated.metadata_props}
    assert model_meta["onnx2bir.conv_kernel_match"] == "4 of 5 (80.00%)"
    feeds = {"input": np.random.default_rng(0).standard_normal((1, 3, 32, 32), np.float32)}
    np.testing.assert_array_equal(
        run_onnxruntime(out, feeds)["logits"], run_onnxruntime(SMALL_CNN, feeds)["logits"]
    )
    # Annotating again replaces the entries rather than repeating them.
    code, _, _ = run(["report", out, "--annotate", out], capsys)
    again = onnx.load(str(out))
    keys = [e.key for e in again.graph.node[0].metadata_props]
    assert code == 0 and len(keys) == len(set(keys))


def test_unnamed_and_folded_nodes(tmp_path, capsys):
    nodes = [
        helper.make_node("Add", ["a", "b"], ["c"]),  # constant: folded at compile time
        helper.make_node("Mul", ["x", "c"], ["m"]),
        helper.make_node("Relu", ["m"], ["y"]),
    ]
    proto = model(
        nodes,
        {"x": (F32, [2, 3])},
        {"y": (F32, [2, 3])},
        {"a": np.ones(3, np.float32), "b": np.full(3, 2.0, np.float32)},
    )
    source, out = save(proto, tmp_path / "m.onnx"), tmp_path / "m.annotated.onnx"
    code, _, _ = run(["report", source, "--annotate", out], capsys)
    assert code == 0
    add, mul, relu = (_meta(node) for node in onnx.load(str(out)).graph.node)
    assert add == {"onnx2bir.lowering": "folded"}
    # Named by their index in the file (the Add before them folds away): Mul_1, Relu_2.
    assert mul["onnx2bir.lowering"] == "generic.Mul" and mul["onnx2bir.node"] == "Mul_1"
    assert relu["onnx2bir.node"] == "Relu_2"
    feeds = {"x": np.arange(6, dtype=np.float32).reshape(2, 3) - 2}
    np.testing.assert_array_equal(
        run_onnxruntime(out, feeds)["y"], run_onnxruntime(source, feeds)["y"]
    )


def test_annotate_into_a_missing_folder_creates_it(tmp_path, capsys):
    out = tmp_path / "missing" / "a.onnx"
    code, _, _ = run(["report", SMALL_CNN, "--annotate", out], capsys)
    assert code == 0
    assert [p.name for p in out.parent.iterdir()] == ["a.onnx"]
    onnx.checker.check_model(onnx.load(str(out)))


def test_annotate_under_a_file_writes_nothing(tmp_path, capsys):
    (tmp_path / "plain").write_text("x")
    out = tmp_path / "plain" / "a.onnx"
    code, _, err = run(["report", SMALL_CNN, "--annotate", out], capsys)
    assert code == 2 and "not a folder" in err
    assert [p.name for p in tmp_path.iterdir()] == ["plain"]
