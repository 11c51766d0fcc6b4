"""`run_onnxruntime` on models whose inputs or outputs onnxruntime's Python API cannot exchange.

Each result is checked against an independent derivation: the same computation as a float32
(or int8) model whose narrow types live only inside it, behind explicit Casts, run on a raw
onnxruntime session (which exchanges float32 fine), and against numpy with ml_dtypes.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx2bir.errors import OracleError
from onnx2bir.runtime.oracle import ort_carrier
from onnx2bir.runtime.oracle.ort import run_onnxruntime

BF16 = ml_dtypes.bfloat16
F8 = ml_dtypes.float8_e4m3fn


def _model(nodes, inputs, outputs, opset=21, initializers=()) -> onnx.ModelProto:
    """A checked model; `inputs`/`outputs` are [(name, elem_type, shape)]."""
    graph = helper.make_graph(
        nodes,
        "carrier",
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
        list(initializers),
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)
    onnx.checker.check_model(model, full_check=True)
    return model


def _raw_run(model: onnx.ModelProto, feeds: dict) -> dict:
    """onnxruntime itself, no carrier: for models whose boundary is float32/int8 only."""
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [value.name for value in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds), strict=True))


def _bf16_model() -> onnx.ModelProto:
    """bf16 x, z -> h = bf16(float(x^T)^2) (also an output, as the emulating oracle adds its
    intermediates), y = Concat(h, z): bf16 kernels (Transpose, Concat) and Casts."""
    nodes = [
        helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0]),
        helper.make_node("Cast", ["t"], ["tf"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["tf", "tf"], ["sq"]),
        helper.make_node("Cast", ["sq"], ["h"], to=TensorProto.BFLOAT16),
        helper.make_node("Concat", ["h", "z"], ["y"], axis=0),
    ]
    bf = TensorProto.BFLOAT16
    return _model(
        nodes,
        [("x", bf, [3, 4]), ("z", bf, [1, 3])],
        [("y", bf, [5, 3]), ("h", bf, [4, 3])],
    )


def _bf16_reference_model() -> onnx.ModelProto:
    """The same computation with float32 at the boundary and explicit Casts to bf16 inside."""
    f, bf = TensorProto.FLOAT, TensorProto.BFLOAT16
    nodes = [
        helper.make_node("Cast", ["xf"], ["x"], to=bf),
        helper.make_node("Cast", ["zf"], ["z"], to=bf),
        helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0]),
        helper.make_node("Cast", ["t"], ["tf"], to=f),
        helper.make_node("Mul", ["tf", "tf"], ["sq"]),
        helper.make_node("Cast", ["sq"], ["h"], to=bf),
        helper.make_node("Concat", ["h", "z"], ["y"], axis=0),
        helper.make_node("Cast", ["y"], ["yf"], to=f),
        helper.make_node("Cast", ["h"], ["hf"], to=f),
    ]
    return _model(
        nodes,
        [("xf", f, [3, 4]), ("zf", f, [1, 3])],
        [("yf", f, [5, 3]), ("hf", f, [4, 3])],
    )


def test_bf16_inputs_and_outputs_match_a_float32_model_with_explicit_casts():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 4)).astype(np.float32).astype(BF16)
    z = rng.standard_normal((1, 3)).astype(np.float32).astype(BF16)
    got = run_onnxruntime(_bf16_model(), {"x": x, "z": z})
    assert list(got) == ["y", "h"]
    assert got["y"].dtype == BF16 and got["h"].dtype == BF16
    want = _raw_run(
        _bf16_reference_model(),
        {"xf": x.astype(np.float32), "zf": z.astype(np.float32)},
    )
    assert np.array_equal(got["y"].astype(np.float32), want["yf"])
    assert np.array_equal(got["h"].astype(np.float32), want["hf"])
    # numpy: bf16 of the fp32 square of the transposed bf16 values, then z below them
    squared = (x.astype(np.float32).T ** 2).astype(BF16)
    assert np.array_equal(got["h"], squared)
    assert np.array_equal(got["y"], np.concatenate([squared, z]))
    assert not np.array_equal(squared.astype(np.float32), x.astype(np.float32).T ** 2)


def test_an_intermediate_output_asked_for_by_name_is_carried_too():
    x = np.arange(12, dtype=np.float32).reshape(3, 4).astype(BF16)
    feeds = {"x": x, "z": np.zeros((1, 3), BF16)}
    got = run_onnxruntime(_bf16_model().SerializeToString(), feeds, ["h"])
    assert list(got) == ["h"]
    assert np.array_equal(got["h"], (x.astype(np.float32).T ** 2).astype(BF16))


def test_a_float8_output_matches_a_float32_model_with_explicit_casts():
    f, f8 = TensorProto.FLOAT, TensorProto.FLOAT8E4M3FN
    model = _model(
        [
            helper.make_node("Cast", ["x"], ["q"], to=f8),
            helper.make_node("Transpose", ["q"], ["y"], perm=[1, 0]),
        ],
        [("x", f, [2, 5])],
        [("y", f8, [5, 2])],
    )
    reference = _model(
        [
            helper.make_node("Cast", ["x"], ["q"], to=f8),
            helper.make_node("Transpose", ["q"], ["t"], perm=[1, 0]),
            helper.make_node("Cast", ["t"], ["yf"], to=f),
        ],
        [("x", f, [2, 5])],
        [("yf", f, [5, 2])],
    )
    x = np.array([[0.1, -0.3, 1.7, 3.3, -100.0], [0.017, 250.0, -7.5, 0.0, 448.0]], np.float32)
    got = run_onnxruntime(model, {"x": x})["y"]
    assert got.dtype == F8
    assert np.array_equal(got.astype(np.float32), _raw_run(reference, {"x": x})["yf"])
    assert np.array_equal(got, x.astype(F8).T)  # in range: round to nearest even
    assert not np.array_equal(got.astype(np.float32), x.T)  # the rounding is visible


def test_a_float8_input_keeps_every_value_infinities_included():
    # e5m2 has infinities: the carrier's Cast must not saturate them to the largest finite.
    e5m2 = TensorProto.FLOAT8E5M2
    model = _model(
        [helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT)],
        [("x", e5m2, [6])],
        [("y", TensorProto.FLOAT, [6])],
    )
    x = np.array([np.inf, -np.inf, 57344.0, -0.0, 1.5e-5, 3.0], np.float32)
    x = x.astype(ml_dtypes.float8_e5m2)
    got = run_onnxruntime(model, {"x": x})["y"]
    assert np.array_equal(got, x.astype(np.float32))
    assert np.isposinf(got[0]) and np.isneginf(got[1])


def test_int4_inputs_and_outputs_cross_as_int8():
    i4 = TensorProto.INT4
    model = _model(
        [helper.make_node("Transpose", ["x"], ["y"], perm=[1, 0])],
        [("x", i4, [2, 8])],
        [("y", i4, [8, 2])],
    )
    x = np.arange(-8, 8, dtype=np.int8).reshape(2, 8).astype(ml_dtypes.int4)
    got = run_onnxruntime(model, {"x": x})["y"]
    assert got.dtype == np.dtype(ml_dtypes.int4)
    assert np.array_equal(got.astype(np.int8), np.arange(-8, 8, dtype=np.int8).reshape(2, 8).T)


def test_a_model_saved_with_external_data_keeps_it_on_disk(tmp_path):
    bf = TensorProto.BFLOAT16
    w = np.linspace(-2, 2, 64, dtype=np.float32).astype(BF16).reshape(8, 8)
    model = _model(
        [helper.make_node("Concat", ["x", "w"], ["y"], axis=0)],
        [("x", bf, [8, 8])],
        [("y", bf, [16, 8])],
        initializers=[numpy_helper.from_array(w, "w")],
    )
    path = tmp_path / "m.onnx"
    onnx.save(model, path, save_as_external_data=True, location="m.data", size_threshold=0)
    x = np.ones((8, 8), BF16)
    got = run_onnxruntime(path, {"x": x})["y"]
    assert np.array_equal(got, np.concatenate([x, w]))


def test_an_opset_without_the_cast_is_a_clear_oracle_error():
    # An opset-11 model whose (unused) bf16 input would need a Cast of opset 13.
    model = helper.make_model(
        helper.make_graph(
            [helper.make_node("Relu", ["a"], ["y"])],
            "old",
            [
                helper.make_tensor_value_info("a", TensorProto.FLOAT, [2]),
                helper.make_tensor_value_info("b", TensorProto.BFLOAT16, [2]),
            ],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        ),
        opset_imports=[helper.make_opsetid("", 11)],
        ir_version=10,
    )
    feeds = {"a": np.array([-1, 2], np.float32), "b": np.zeros(2, BF16)}
    with pytest.raises(OracleError, match=r"input 'b' is bfloat16.*opset 13.*opset 11"):
        run_onnxruntime(model, feeds)


def test_a_feed_of_another_dtype_is_refused_naming_the_input():
    feeds = {"x": np.zeros((3, 4), np.float32), "z": np.zeros((1, 3), BF16)}
    with pytest.raises(OracleError, match=r"input 'x' is fed float32, the model takes bfloat16"):
        run_onnxruntime(_bf16_model(), feeds)


def test_ordinary_models_are_not_adapted(monkeypatch):
    def refuse(*args):
        raise AssertionError("an ordinary model was adapted")

    monkeypatch.setattr(ort_carrier, "adapt", refuse)
    model = _model(
        [helper.make_node("Relu", ["x"], ["y"])],
        [("x", TensorProto.FLOAT, [3])],
        [("y", TensorProto.FLOAT, [3])],
    )
    got = run_onnxruntime(model, {"x": np.array([-1, 0, 2], np.float32)})
    assert np.array_equal(got["y"], [0, 0, 2])


def test_adapted_names_do_not_collide_with_the_models_own():
    bf = TensorProto.BFLOAT16
    clash = "x" + ort_carrier.SUFFIX
    model = _model(
        [
            helper.make_node("Identity", ["x"], [clash]),
            helper.make_node("Transpose", [clash], ["y"], perm=[1, 0]),
        ],
        [("x", bf, [2, 3])],
        [("y", bf, [3, 2])],
    )
    x = np.arange(6, dtype=np.float32).reshape(2, 3).astype(BF16)
    assert np.array_equal(run_onnxruntime(model, {"x": x})["y"], x.T)
