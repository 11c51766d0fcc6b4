"""Quantized convs and matmuls on the exact integer path (docs/quantization.md#exactness).

Every model here is checked against onnxruntime by `onnx2bir validate`; integer outputs are
compared exactly (0 ULP), so a QLinearConv whose requantization differs from onnxruntime's by
one step anywhere fails. The bound that decides the path is recomputed here from the weights
with numpy, independently of the pass. Each exactness claim has a wrong answer it rejects: the
multiplier rounded another way, the zero point left out, a sum past 2^24.
"""

from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx2bir.cli.commands import main
from onnx2bir.patterns.quant import integer
from onnx2bir.runtime.oracle.ort import save_arrays

U8, I8 = TensorProto.UINT8, TensorProto.INT8
ROOT = Path(__file__).resolve().parents[2]


def _save(tmp_path, nodes, inputs, outputs, inits, name="m", ms=False) -> str:
    opsets = [helper.make_opsetid("", 18)] + (
        [helper.make_opsetid("com.microsoft", 1)] if ms else []
    )
    graph = helper.make_graph(
        nodes, name, inputs, outputs, [numpy_helper.from_array(v, k) for k, v in inits.items()]
    )
    model = helper.make_model(graph, opset_imports=opsets)
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, path)
    return str(path)


def _qlinear_conv(tmp_path, rng, c=16, m=32, h=12, w_scale=None, y_scale=0.71, x_zero=117):
    """uint8 x, int8 weight per output channel, int32 bias, uint8 y."""
    inits = {
        "xs": np.array(0.0237, np.float32),
        "xz": np.array(x_zero, np.uint8),
        "w": rng.integers(-127, 128, (m, c, 3, 3)).astype(np.int8),
        "ws": (rng.random(m) * 0.01 + 0.001).astype(np.float32) if w_scale is None else w_scale,
        "wz": np.zeros(m, np.int8),
        "ys": np.array(y_scale, np.float32),
        "yz": np.array(128, np.uint8),
        "b": rng.integers(-5000, 5000, m).astype(np.int32),
    }
    node = helper.make_node(
        "QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"], ["y"], pads=[1] * 4
    )
    x = helper.make_tensor_value_info("x", U8, [1, c, h, h])
    y = helper.make_tensor_value_info("y", U8, [1, m, h, h])
    return _save(tmp_path, [node], [x], [y], inits, "qlinearconv"), inits


def _validate(capsys, path, *args) -> tuple[int, dict]:
    code = main(["validate", path, "--json", *args])
    return code, json.loads(capsys.readouterr().out)


def _report(capsys, path, *args) -> dict:
    assert main(["report", path, "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize(
    "autocast", [[], ["--auto-cast", "none"], ["--auto-cast-type", "fp8_e4m3"]]
)
def test_a_qlinearconv_matches_onnxruntime_exactly(tmp_path, capsys, autocast):
    path, _ = _qlinear_conv(tmp_path, np.random.default_rng(1))
    code, doc = _validate(capsys, path, *autocast)
    out = doc["outputs"][0]
    assert code == 0 and out["dtype"] == "uint8"
    assert out["max_abs_err"] == 0 and out["atol"] == 0  # integers: compared exactly
    report = _report(capsys, path, *autocast)
    [entry] = report["quantized"]
    assert entry["path"] == "integer" and entry["form"] == "QLinearConv"
    # bf16 operands whatever the autocast: fp8 would not hold the integers
    assert set(report["autocast"]["matmul_operand_dtypes"]) <= {"bfloat16 x bfloat16"}
    assert report["casts"] == []


def test_the_bound_is_the_largest_row_of_weights_times_the_largest_input(tmp_path, capsys):
    path, inits = _qlinear_conv(tmp_path, np.random.default_rng(2))
    rows = np.abs(inits["w"].astype(np.int64)).reshape(inits["w"].shape[0], -1).sum(axis=1)
    x_max = max(abs(0 - 117), abs(255 - 117))
    expected = x_max * int(rows.max()) + int(np.abs(inits["b"]).max())
    [entry] = _report(capsys, path)["quantized"]
    assert entry["bound"] == expected


def test_ties_round_half_to_even_as_onnxruntime_does(tmp_path, capsys):
    """x_scale · w_scale / y_scale = 0.5: every odd accumulator is a tie."""
    rng = np.random.default_rng(3)
    path, _ = _qlinear_conv(
        tmp_path, rng, c=4, m=8, h=8, w_scale=np.full(8, 0.25, np.float32), y_scale=0.5
    )
    onnx_model = onnx.load(path)
    for init in onnx_model.graph.initializer:
        if init.name == "xs":
            init.CopyFrom(numpy_helper.from_array(np.array(1.0, np.float32), "xs"))
    onnx.save(onnx_model, path)
    code, doc = _validate(capsys, path, "--auto-cast", "none")
    assert code == 0 and doc["outputs"][0]["max_abs_err"] == 0


def test_a_wrong_multiplier_or_a_missing_zero_point_fails(tmp_path, capsys, monkeypatch):
    """The verdict sees one requantization step anywhere: requantizing with the multiplier
    rounded to bf16 (as an autocast of the requantization would), or forgetting x's zero
    point, fails validation."""
    path, _ = _qlinear_conv(tmp_path, np.random.default_rng(4), y_scale=0.0713)
    original = integer.IntegerMatmul.scale

    def rounded(op):
        return original.fget(op).astype(ml_dtypes.bfloat16).astype(np.float32)

    monkeypatch.setattr(integer.IntegerMatmul, "scale", property(rounded))
    code, doc = _validate(capsys, path)
    assert code == 1 and 0 < doc["outputs"][0]["mismatches"]
    monkeypatch.setattr(integer.IntegerMatmul, "scale", original)
    monkeypatch.setattr(integer, "_centred_input", _without_zero_point(integer._centred_input))
    code, doc = _validate(capsys, path)
    assert code == 1 and doc["outputs"][0]["mismatches"] > 0


def _without_zero_point(centred):
    def wrong(graph, op, prefix):
        op.x.zero_point = np.zeros_like(op.x.zero_point)
        return centred(graph, op, prefix)

    return wrong


def _qdq_conv(tmp_path, rng, c, m, weight_high, int32_bias=False):
    """A QDQ conv: QuantizeLinear → DequantizeLinear on the input, an int8 weight behind a
    DequantizeLinear, a float bias, QuantizeLinear → DequantizeLinear after."""
    inits = {
        "s": np.array(0.05, np.float32),
        "z": np.array(3, np.int8),
        "w": rng.integers(-weight_high, weight_high + 1, (m, c, 3, 3)).astype(np.int8),
        "ws": np.array(0.002, np.float32),
        "b": rng.standard_normal(m).astype(np.float32),
        "ys": np.array(0.4, np.float32),
        "yz": np.array(-2, np.int8),
    }
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"]),
        helper.make_node("DequantizeLinear", ["w", "ws"], ["wd"]),
    ]
    if int32_bias:  # as onnxruntime's quantizer writes it: int32 at scale x_scale · w_scale
        inits["bq"] = rng.integers(-3000, 3000, m).astype(np.int32)
        inits["bs"] = np.array(np.float32(0.05) * np.float32(0.002), np.float32)
        nodes.append(helper.make_node("DequantizeLinear", ["bq", "bs"], ["b"]))
        del inits["b"]
    nodes += [
        helper.make_node("Conv", ["xd", "wd", "b"], ["conv"], pads=[1] * 4),
        helper.make_node("QuantizeLinear", ["conv", "ys", "yz"], ["yq"]),
        helper.make_node("DequantizeLinear", ["yq", "ys", "yz"], ["y"]),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, 8, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, m, 8, 8])
    return _save(tmp_path, nodes, [x], [y], inits, f"qdq_{c}_{weight_high}_{int32_bias}")


@pytest.mark.parametrize("int32_bias", [False, True])
def test_a_qdq_conv_runs_on_integers_with_no_drift_under_the_autocast(tmp_path, capsys, int32_bias):
    path = _qdq_conv(tmp_path, np.random.default_rng(5), 8, 16, 127, int32_bias)
    code, doc = _validate(capsys, path)
    assert code == 0
    assert doc["outputs"][0]["drift"]["max_abs_err"] == 0  # the casts cost nothing
    # the conv's float result is read from the machine and fed on: the QuantizeLinear after
    # it sees the machine's value, not onnxruntime's differently rounded one
    assert "conv" in doc["emulation"]["resynchronised_tensors"]
    report = _report(capsys, path)
    [entry] = report["quantized"]
    assert entry["path"] == "integer" and entry["weight_dtype"] == "int8"
    # the int32 bias joins the integer sum: its DequantizeLinear is gone with the input's and
    # the weight's; left are x − zx (a DequantizeLinear of scale 1) and the output's
    assert report["ops_after_passes"]["DequantizeLinear"] == 2
    assert report["casts"] == []


def test_a_sum_that_may_pass_2_24_is_split_and_added_in_int32(tmp_path, capsys):
    """2,304 weights of magnitude up to 127 under inputs up to 131: one conv's partial sums
    could pass 2^24, so the input channels are split into convs whose sums cannot, added in
    exact int32. The groups are recomputed here from the weights."""
    rng = np.random.default_rng(6)
    path = _qdq_conv(tmp_path, rng, c=256, m=2, weight_high=127)
    [entry] = _report(capsys, path)["quantized"]
    assert entry["path"] == "integer" and entry["bound"] >= 2**24
    weights = numpy_helper.to_array(
        next(i for i in onnx.load(path).graph.initializer if i.name == "w")
    )
    per_channel = np.abs(weights.astype(np.int64)).sum(axis=(2, 3))  # [out, in]
    x_max = max(abs(-128 - 3), abs(127 - 3))
    groups, running = 1, np.zeros(per_channel.shape[0], np.int64)
    for column in per_channel.T:
        if x_max * (running + column).max() >= 2**24:
            groups, running = groups + 1, np.zeros_like(running)
        running += column
    assert entry["split"] == groups >= 2
    code, doc = _validate(capsys, path)
    assert code == 0 and doc["outputs"][0]["drift"]["max_abs_err"] == 0


def _integer_ops(tmp_path, rng):
    inits = {
        "w": rng.integers(-128, 128, (6, 4, 3, 3)).astype(np.int8),
        "xz": np.array(100, np.uint8),
        "b": rng.integers(-128, 128, (24, 5)).astype(np.int8),
    }
    nodes = [
        helper.make_node("ConvInteger", ["x", "w", "xz"], ["conv"]),
        helper.make_node("MatMulInteger", ["a", "b", "xz"], ["mm"]),
        # a zero point computed at run time, as DynamicQuantizeLinear gives it
        helper.make_node("MatMulInteger", ["a", "b", "az"], ["mm_runtime_zero"]),
    ]
    inputs = [
        helper.make_tensor_value_info("x", U8, [1, 4, 7, 7]),
        helper.make_tensor_value_info("a", U8, [3, 24]),
        helper.make_tensor_value_info("az", U8, []),
    ]
    outputs = [
        helper.make_tensor_value_info("conv", TensorProto.INT32, [1, 6, 5, 5]),
        helper.make_tensor_value_info("mm", TensorProto.INT32, [3, 5]),
        helper.make_tensor_value_info("mm_runtime_zero", TensorProto.INT32, [3, 5]),
    ]
    return _save(tmp_path, nodes, inputs, outputs, inits, "integer_ops")


def test_conv_integer_and_matmul_integer_are_exact(tmp_path, capsys):
    path = _integer_ops(tmp_path, np.random.default_rng(7))
    code, doc = _validate(capsys, path)
    assert code == 0
    assert [o["max_abs_err"] for o in doc["outputs"]] == [0, 0, 0]
    forms = sorted(e["form"] for e in _report(capsys, path)["quantized"])
    assert forms == ["ConvInteger", "MatMulInteger", "MatMulInteger"]


def test_a_qlinear_matmul_of_two_activations_split_at_the_largest_exact_size(tmp_path, capsys):
    """K = 258 products of ±255 · ±255 stay below 2^24: one matmul; K = 259 cannot be proven
    for one, and runs as two (258 + 1) added in int32 — exact both ways."""

    def model(k):
        inits = {
            "s": np.array(0.01, np.float32),
            "z": np.array(0, np.uint8),
            "bz": np.array(255, np.uint8),
            "ys": np.array(300.0, np.float32),
            "yz": np.array(0, np.uint8),
        }
        node = helper.make_node("QLinearMatMul", ["a", "s", "z", "b", "s", "bz", "ys", "yz"], ["y"])
        a = helper.make_tensor_value_info("a", U8, [4, k])
        b = helper.make_tensor_value_info("b", U8, [k, 3])
        y = helper.make_tensor_value_info("y", U8, [4, 3])
        return _save(tmp_path, [node], [a, b], [y], inits, f"qmm_{k}")

    for k, split in ((258, None), (259, 2), (600, 3)):
        code, doc = _validate(capsys, model(k))
        assert code == 0 and doc["outputs"][0]["max_abs_err"] == 0
        [entry] = _report(capsys, model(k))["quantized"]
        assert entry.get("split") == split


def test_past_2_24_one_matmul_would_round_and_the_split_does_not(tmp_path, capsys, monkeypatch):
    """MatMulInteger with every product at its largest, 255 · (0 − 255), over K = 259: the sum
    −16,841,475 is odd and past 2^24, so fp32 PSUM cannot hold it. The split runs it exactly;
    forcing one matmul (no split) gives a wrong int32, which the exact verdict rejects."""
    k = 259
    inits = {"b": np.zeros((k, 3), np.uint8), "bz": np.array(255, np.uint8)}
    node = helper.make_node("MatMulInteger", ["a", "b", "", "bz"], ["y"])
    a = helper.make_tensor_value_info("a", U8, [2, k])
    y = helper.make_tensor_value_info("y", TensorProto.INT32, [2, 3])
    path = _save(tmp_path, [node], [a], [y], inits, "extreme")
    feeds = tmp_path / "feeds.npz"
    save_arrays(feeds, {"a": np.full((2, k), 255, np.uint8)}, "input")
    code, doc = _validate(capsys, path, "--inputs", str(feeds))
    assert code == 0 and doc["outputs"][0]["max_abs_err"] == 0
    monkeypatch.setattr(integer, "reduction_groups", lambda graph, op: [(0, k)])
    code, doc = _validate(capsys, path, "--inputs", str(feeds))
    assert code == 1 and doc["outputs"][0]["max_abs_err"] == 1  # rounded to an even neighbour


@pytest.mark.parametrize("variant", ["qdq", "qop"])
def test_quantized_resnet18_runs_every_conv_on_integers_and_moves_int8_weights(capsys, variant):
    """models/quantized/resnet18_*: 20 convs and the classifier on the integer path, none on
    the float path; what the DMAs read out of weights and constants is within 1.3x of the
    int8 weights (counted here from the file)."""
    path = ROOT / "models" / "quantized" / f"resnet18_{variant}.onnx"
    report = _report(capsys, str(path))
    convs = [e for e in report["quantized"] if e["op_type"] in ("Conv", "QLinearConv")]
    assert len(convs) == 20 and all(e["path"] == "integer" for e in report["quantized"])
    model = onnx.load(path)
    int8 = sum(
        numpy_helper.to_array(i).nbytes
        for i in model.graph.initializer
        if i.data_type == TensorProto.INT8 and len(i.dims) >= 2
    )
    summary = report["quantized_summary"]
    assert summary["integer_weight_bytes"] == int8
    assert summary["dma_bytes_weights"] <= 1.3 * int8
