"""ConvInteger with pads and zero points (patterns/quant/integer.py).

The ONNX spec of ConvInteger pads x with its zero point: a padded tap contributes
(zx − zx) · (w − zw) = 0. The rewrite centres x before the float Conv, which then pads the
centred input with 0, the same thing. A run-time weight with one zero point per output channel
(the conformance case test_convinteger_with_padding) is centred by a Cast and a Sub.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx2bir.cli.commands import main
from onnx2bir.patterns.quant import integer

U8, I32 = TensorProto.UINT8, TensorProto.INT32


def _model(tmp_path, inits, inputs, name, pads=(1, 1, 1, 1), m=3, h=5, k=3) -> str:
    node = helper.make_node("ConvInteger", ["x", "w", "xz", "wz"], ["y"], pads=list(pads))
    out = h + pads[0] + pads[2] - k + 1
    graph = helper.make_graph(
        [node],
        name,
        inputs,
        [helper.make_tensor_value_info("y", I32, [1, m, out, out])],
        [numpy_helper.from_array(v, n) for n, v in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 10)])
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, path)
    return str(path)


def _validate(capsys, path, *args) -> tuple[int, dict]:
    code = main(["validate", path, "--json", *args])
    return code, json.loads(capsys.readouterr().out)


def _reference(x, w, xz, wz, pad, pad_value=None) -> np.ndarray:
    """ConvInteger by the spec: x padded with `pad_value` (its zero point by default)."""
    fill = xz if pad_value is None else pad_value
    xp = np.pad(x.astype(np.int64), ((0, 0), (0, 0), (pad, pad), (pad, pad)), constant_values=fill)
    xc = xp - int(xz)
    wc = w.astype(np.int64) - np.asarray(wz, np.int64).reshape(-1, 1, 1, 1)
    m, _, k, _ = w.shape
    out = xp.shape[2] - k + 1
    y = np.zeros((1, m, out, out), np.int64)
    for i in range(out):
        for j in range(out):
            y[0, :, i, j] = np.tensordot(wc, xc[0, :, i : i + k, j : j + k], axes=3)
    return y.astype(np.int32)


@pytest.mark.parametrize("runtime_weight", [False, True])
def test_pads_with_a_nonzero_x_zero_point_match_onnxruntime_exactly(
    tmp_path, capsys, runtime_weight
):
    rng = np.random.default_rng(11)
    w = rng.integers(0, 256, (3, 2, 3, 3)).astype(np.uint8)
    inits = {"xz": np.array(117, np.uint8), "wz": np.array(9, np.uint8)}
    inputs = [helper.make_tensor_value_info("x", U8, [1, 2, 5, 5])]
    if runtime_weight:
        inputs.append(helper.make_tensor_value_info("w", U8, [3, 2, 3, 3]))
    else:
        inits["w"] = w
    path = _model(tmp_path, inits, inputs, f"conv_integer_pads_{int(runtime_weight)}")
    code, doc = _validate(capsys, path)
    [out] = doc["outputs"]
    assert code == 0 and out["dtype"] == "int32"
    assert out["max_abs_err"] == 0 and out["atol"] == 0


def test_padding_with_0_instead_of_the_zero_point_fails(tmp_path, capsys, monkeypatch):
    """Forgetting x's zero point (the border then counts x's raw 0s, not zx) is caught."""
    rng = np.random.default_rng(12)
    inits = {
        "w": rng.integers(0, 256, (3, 2, 3, 3)).astype(np.uint8),
        "xz": np.array(117, np.uint8),
        "wz": np.array(9, np.uint8),
    }
    path = _model(
        tmp_path, inits, [helper.make_tensor_value_info("x", U8, [1, 2, 5, 5])], "wrong_pad"
    )

    def without_zero_point(graph, op, prefix):
        op.x.zero_point = np.zeros_like(op.x.zero_point)
        return centred(graph, op, prefix)

    centred = integer._centred_input
    monkeypatch.setattr(integer, "_centred_input", without_zero_point)
    code, doc = _validate(capsys, path)
    assert code == 1 and doc["outputs"][0]["mismatches"] > 0


def test_a_runtime_weight_with_per_channel_zero_points_is_the_spec_exactly(tmp_path, capsys):
    """onnxruntime's ConvInteger takes only a per-tensor w_zero_point, so the program's output
    is judged against the spec computed here: equal exactly, and unequal to the same conv
    padded with 0 instead of x's zero point."""
    rng = np.random.default_rng(13)
    x = rng.integers(0, 256, (1, 2, 5, 5)).astype(np.uint8)
    w = rng.integers(0, 256, (3, 2, 3, 3)).astype(np.uint8)
    xz, wz = np.array(117, np.uint8), np.array([0, 1, 200], np.uint8)
    inputs = [
        helper.make_tensor_value_info("x", U8, [1, 2, 5, 5]),
        helper.make_tensor_value_info("w", U8, [3, 2, 3, 3]),
        helper.make_tensor_value_info("xz", U8, []),
        helper.make_tensor_value_info("wz", U8, [3]),
    ]
    path = _model(tmp_path, {}, inputs, "per_channel")
    out_dir = tmp_path / "bir"
    argv = ["convert", path, "-o", str(out_dir), "--input-value", "xz=117"]
    assert main([*argv, "--input-value", "wz=0,1,200"]) == 0
    feeds, saved = tmp_path / "in.npz", tmp_path / "out.npz"
    np.savez(feeds, x=x, w=w)
    bir = str(out_dir / "per_channel.bir.json")
    assert main(["run", bir, "--inputs", str(feeds), "--save-outputs", str(saved)]) == 0
    with np.load(saved) as machine:
        y = machine["y"]
    assert y.dtype == np.int32
    np.testing.assert_array_equal(y, _reference(x, w, xz, wz, 1))
    assert not np.array_equal(y, _reference(x, w, xz, wz, 1, pad_value=0))
