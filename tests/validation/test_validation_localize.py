"""`validate --localize`: the first node over tolerance, own vs carried error, first NaN/inf,
the conv join, and the bounded oracle."""

from __future__ import annotations

import numpy as np
from onnx import helper
from validation_helpers import (
    F32,
    SMALL_CNN,
    SMALL_CNN_ORDER,
    corrupt_node,
    model,
    observer_factory,
    run,
    run_json,
    save,
)

from onnx2bir.options import CompileOptions
from onnx2bir.runtime.oracle import emulating as emulating_module
from onnx2bir.runtime.oracle import ort as oracle_module
from onnx2bir.runtime.oracle.tolerance import TolerancePolicy
from onnx2bir.validation import localize as localize_module
from onnx2bir.validation.prepared import prepare
from onnx2bir.validation.run import run_validate

REP_NHWC = "Conv2d_dw_fb01_io01_01bf_rep_nhwc_Pcinh"


def _nodes(doc: dict) -> dict[str, dict]:
    return {n["node"]: n for n in doc["localize"]["nodes"]}


def test_clean_model_has_no_failing_node(capsys):
    code, doc = run_json(["validate", SMALL_CNN, "--localize"], capsys)
    loc = doc["localize"]
    assert code == 0 and doc["passed"]
    assert [n["node"] for n in loc["nodes"]] == SMALL_CNN_ORDER
    # The Relus right after a conv run on its eviction (docs/conv_selection.md#fused-activations):
    # their outputs are their convs' now, compared there.
    assert loc["nodes_compared"] == 11 and loc["tensors_compared"] == 11
    assert loc["first_failing"] is None
    assert loc["first_nonfinite_machine"] is None and loc["first_nonfinite_onnxruntime"] is None
    fused = {n["node"]: n["lowering"] for n in loc["nodes"] if n["status"] == "fused"}
    assert fused == {f"node_relu{s}": f"fused into node_conv2d{s}" for s in ("", "_1", "_2", "_4")}
    assert all(n["status"] == "ok" for n in loc["nodes"] if n["node"] not in fused)


def test_localize_names_the_corrupted_kernel_not_its_successors(capsys, monkeypatch):
    corrupt_node(monkeypatch, "node_conv2d_2")  # a conv on the rep_nhwc kernel
    fp32 = ["--auto-cast", "none"]  # every other node exact to fp32 tolerance
    code, doc = run_json(["validate", SMALL_CNN, "--localize", *fp32], capsys)
    assert code == 1 and not doc["passed"]
    first = doc["localize"]["first_failing"]
    assert first["node"] == "node_conv2d_2"
    assert first["kernel"] == REP_NHWC and first["lowering"] == f"kernel.{REP_NHWC}"
    assert first["verdict"] == "own error"
    assert first["local"]["passed"] is False and first["local"]["kernel"] == REP_NHWC
    assert first["input_max_abs_err"] < 1e-4  # its inputs were fine
    nodes = _nodes(doc)
    position = SMALL_CNN_ORDER.index("node_conv2d_2")
    assert all(nodes[n]["status"] in ("ok", "fused") for n in SMALL_CNN_ORDER[:position])
    # Every successor is off too (the error flows down), but none is named first; the Relus
    # fused into their convs are compared there.
    assert all(nodes[n]["status"] in ("FAIL", "fused") for n in SMALL_CNN_ORDER[position:])
    assert nodes["node_relu_2"]["status"] == "fused"
    conv = {c["node"]: c for c in doc["localize"]["convs"]}
    assert conv["node_conv2d_2"]["status"] == "FAIL" and conv["node_conv2d_2"]["kernel"] == REP_NHWC
    assert conv["node_conv2d_1"]["status"] == "ok"
    code, out, _ = run(["validate", SMALL_CNN, "--localize", *fp32], capsys)
    assert "first node over tolerance: node_conv2d_2 (Conv, " + REP_NHWC in out
    assert "verdict: own error" in out


def test_observer_hook_on_a_fallback_conv_joins_its_fallback_reason():
    doc, _, _ = run_validate(
        str(SMALL_CNN),
        CompileOptions(),
        TolerancePolicy(),
        localize_nodes=True,
        factories=[observer_factory("node_conv2d_4")],
    )
    first = doc["localize"]["first_failing"]
    assert first["node"] == "node_conv2d_4"
    assert first["kernel"] is None and first["lowering"] == "generic.Conv"
    assert "feature_group_count 4 != 1" in first["fallback_reason"]
    assert first["verdict"] == "own error"


def _relu_then_scale(tmp_path):
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("Mul", ["r", "k"], ["y"], name="scale"),
    ]
    proto = model(
        nodes, {"x": (F32, [8, 16])}, {"y": (F32, [8, 16])}, {"k": np.array(1000.0, np.float32)}
    )
    return save(proto, tmp_path / "relu_scale.onnx")


def test_error_carried_in_is_told_apart_from_own_error(tmp_path, capsys, monkeypatch):
    # Relu's result is off by 5e-5, inside its tolerance (atol 1e-4); the x1000 Mul turns that
    # into 0.05 where the reference is 0. The Mul is right on exact inputs: carried in.
    path = _relu_then_scale(tmp_path)
    corrupt_node(monkeypatch, "relu", amount=5e-5)
    code, doc = run_json(["validate", path, "--localize"], capsys)
    assert code == 1
    nodes = _nodes(doc)
    assert nodes["relu"]["status"] == "ok" and nodes["relu"]["max_abs_err"] > 4e-5
    first = doc["localize"]["first_failing"]
    assert first["node"] == "scale"
    assert first["verdict"] == "carried in"
    assert first["local"]["passed"] is True and first["local"]["max_abs_err"] < 1e-6
    assert first["amplification"] > 500


def test_first_nan_is_the_node_that_made_it(capsys, monkeypatch):
    corrupt_node(monkeypatch, "node_relu_3", mode="nan")  # after the Add: not fused
    code, doc = run_json(["validate", SMALL_CNN, "--localize"], capsys)
    loc = doc["localize"]
    assert code == 1
    nan = loc["first_nonfinite_machine"]
    assert nan["node"] == "node_relu_3" and nan["inputs_finite"] is True
    assert loc["first_nonfinite_onnxruntime"] is None
    assert loc["first_failing"]["node"] == "node_relu_3"
    assert loc["first_failing"]["verdict"] == "own error"
    # Later nodes carry the NaN; they are not named.
    assert _nodes(doc)["node_conv2d_4"]["nonfinite_machine"] > 0
    logits = doc["outputs"][0]
    assert logits["nonfinite"]["machine"]["nan"] == 10
    assert logits["nonfinite"]["machine"]["first"][0] == [0, 0]
    assert logits["cosine"] is None and logits["max_abs_err"] is None  # NaN / inf → null


def test_first_nan_on_both_sides_passes_and_is_located(tmp_path, capsys):
    nodes = [
        helper.make_node("Sub", ["x", "c"], ["s"]),
        helper.make_node("Sqrt", ["s"], ["q"]),
        helper.make_node("Mul", ["q", "two"], ["y"]),
    ]
    proto = model(
        nodes,
        {"x": (F32, [4, 8])},
        {"y": (F32, [4, 8])},
        {"c": np.array(0.5, np.float32), "two": np.array(2.0, np.float32)},
    )
    code, doc = run_json(["validate", save(proto, tmp_path / "nan.onnx"), "--localize"], capsys)
    loc = doc["localize"]
    assert code == 0  # NaN against NaN passes
    assert loc["first_nonfinite_machine"]["node"] == "Sqrt_1"
    assert loc["first_nonfinite_onnxruntime"]["node"] == "Sqrt_1"
    assert loc["first_nonfinite_machine"]["inputs_finite"] is True
    assert loc["first_nonfinite_machine"]["local"]["passed"] is True  # alone: NaN as ORT does
    counts = doc["outputs"][0]["nonfinite"]
    assert counts["machine"]["nan"] == counts["onnxruntime"]["nan"] > 0


def test_oracle_batches_stay_within_the_budget(capsys, monkeypatch):
    _, whole = run_json(["validate", SMALL_CNN, "--localize"], capsys)
    sizes = []
    real = localize_module.ExposingOracle.run

    def recording(self, feeds, names):
        result = real(self, feeds, names)
        sizes.append((len(names), sum(v.nbytes for v in result.values())))
        return result

    monkeypatch.setattr(localize_module.ExposingOracle, "run", recording)
    budget_mb = 40_000 / (1 << 20)  # 40 kB: the 64 kB activations go one per run
    _, split = run_json(
        ["validate", SMALL_CNN, "--localize", "--localize-budget", budget_mb], capsys
    )
    loc = split["localize"]
    assert loc["oracle_batches"] > 5 and len(sizes) == loc["oracle_batches"]
    assert all(count == 1 or nbytes <= 40_000 for count, nbytes in sizes)
    assert [(n["node"], n["status"], n.get("max_abs_err")) for n in loc["nodes"]] == [
        (n["node"], n["status"], n.get("max_abs_err")) for n in whole["localize"]["nodes"]
    ]


def test_weights_held_aside_reach_onnxruntime_as_inputs_not_in_the_protobuf(capsys, monkeypatch):
    prepared = prepare(str(SMALL_CNN), CompileOptions())
    assert {"conv2.weight", "res_conv1.weight"} <= set(prepared.weights)
    serialized = []
    real = oracle_module.run_onnxruntime

    def recording(model, inputs, outputs=None):
        serialized.append(len(model) if isinstance(model, bytes) else None)
        return real(model, inputs, outputs)

    monkeypatch.setattr(emulating_module, "run_onnxruntime", recording)
    corrupt_node(monkeypatch, "node_conv2d_1")
    code, doc = run_json(["validate", SMALL_CNN, "--localize"], capsys)
    assert code == 1 and doc["localize"]["first_failing"]["node"] == "node_conv2d_1"
    assert _nodes(doc)["node_conv2d"]["status"] == "ok"
    weights = sum(v.nbytes for v in prepared.weights.values())
    assert serialized and all(size is not None and size < weights for size in serialized)


def test_error_inside_a_fused_attention_kernel_is_its_own(capsys, monkeypatch):
    """A fault inside the raised attention kernel (its scores 5% large): the first failing
    node is the kernel's output and the verdict is the kernel's own error, even though the
    one-node replay (the last MatMul alone, in fp32) is exact."""
    from onnx2bir.bir.enums import AluOp
    from onnx2bir.kernels.attention import kernel as attention_kernel

    original = attention_kernel.AttentionEmitter.score_tile

    def score_tile(self, *args):
        scores = original(self, *args)
        self.cg.tensor_scalar(scores, scores, AluOp.MULTIPLY, 1.05)
        return scores

    monkeypatch.setattr(attention_kernel.AttentionEmitter, "score_tile", score_tile)
    long_attention = SMALL_CNN.parent / "long_attention.onnx"
    code, doc = run_json(
        [
            "validate",
            long_attention,
            "--localize",
            "--enable-native-kernel-attention",
            "--enable-native-kernel-attention-bf16",
        ],
        capsys,
    )
    assert code == 1
    first = doc["localize"]["first_failing"]
    assert first["lowering"] == "kernel.AttentionMMSoftmaxMMWithoutSwap"
    assert first["verdict"] == "own error" and "fused kernel" in first["explanation"]
    assert first["local"]["passed"] is True
