"""`validate` on test_data_set folders and .npz files holding ml_dtypes arrays (bfloat16,
float8, int4), and on data sets without inputs.

The bf16 model's reference outputs are computed here with numpy (float64 products, rounded to
bf16 once), independently of onnxruntime and of the machine.
"""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx2bir.bir.enums import MemoryType
from onnx2bir.cli.commands import main
from onnx2bir.errors import UserError
from onnx2bir.frontend.input_values import input_array
from onnx2bir.runtime.machine import semantics
from onnx2bir.runtime.oracle import input_files

BF16 = ml_dtypes.bfloat16


def _run(argv, capsys) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def _save_tensor(path, value, name) -> None:
    path.write_bytes(numpy_helper.from_array(np.ascontiguousarray(value), name).SerializeToString())


def _bf16_case(folder):
    """A bf16-in, bf16-out model (x -> float MatMul w -> Relu -> bf16 y) and its test_data_set
    of bf16 .pb files; the reference is numpy's. Returns (model path, data set, x, reference)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 8)).astype(np.float32).astype(BF16)
    w = rng.standard_normal((8, 6)).astype(np.float32)
    nodes = [
        helper.make_node("Cast", ["x"], ["xf"], name="widen", to=TensorProto.FLOAT),
        helper.make_node("MatMul", ["xf", "w"], ["m"], name="mm"),
        helper.make_node("Relu", ["m"], ["r"], name="relu"),
        helper.make_node("Cast", ["r"], ["y"], name="narrow", to=TensorProto.BFLOAT16),
    ]
    graph = helper.make_graph(
        nodes,
        "bf16",
        [helper.make_tensor_value_info("x", TensorProto.BFLOAT16, [4, 8])],
        [helper.make_tensor_value_info("y", TensorProto.BFLOAT16, [4, 6])],
        [numpy_helper.from_array(w, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    onnx.checker.check_model(model, full_check=True)
    path = folder / "model.onnx"
    onnx.save(model, path)
    reference = np.maximum(x.astype(np.float64) @ w.astype(np.float64), 0).astype(BF16)
    data = folder / "test_data_set_0"
    data.mkdir()
    _save_tensor(data / "input_0.pb", x, "x")
    _save_tensor(data / "output_0.pb", reference, "y")
    return path, data, x, reference


def test_a_bf16_test_data_set_validates(tmp_path, capsys):
    model, data, _, _ = _bf16_case(tmp_path)
    argv = ["validate", model, "--inputs", data, "--reference", data, "--json"]
    code, out, err = _run([*argv, "--max-drift", "snr=50"], capsys)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["passed"] and doc["inputs"][0]["dtype"] == "bfloat16"
    assert doc["outputs"][0]["passed"]


@pytest.mark.parametrize("wrong, limit", [(0.0, "cosine=0.999"), (1.01, "snr=50")])
def test_a_wrong_bf16_reference_fails(tmp_path, capsys, wrong, limit):
    # --reference is what drift is measured against; --max-drift bounds it. The right
    # reference drifts 58 dB SNR (the bf16 matmul operands); zeros or 1.01x do not pass.
    model, data, _, reference = _bf16_case(tmp_path)
    _save_tensor(data / "output_0.pb", (reference.astype(np.float32) * wrong).astype(BF16), "y")
    argv = ["validate", model, "--inputs", data, "--reference", data, "--max-drift", limit]
    code, out, err = _run(argv, capsys)
    assert code == 1, out + err
    assert "FAIL" in out


def test_a_wrong_machine_result_fails_against_the_bf16_oracle(tmp_path, capsys, monkeypatch):
    # The verdict compares the machine with onnxruntime (its bf16 input and output carried
    # as float32): a Relu that writes 1.05x its result to SBUF must be caught.
    model, data, _, _ = _bf16_case(tmp_path)
    for opcode, function in list(semantics.SEMANTICS.items()):

        def scaled(machine, ins, loop_values, _function=function):
            _function(machine, ins, loop_values)
            if ins.origin.node == "relu" and ins.dst is not None:
                if machine.locations[ins.dst.loc].memory == MemoryType.SB:
                    view = machine.operands(ins)["dst"].view(loop_values)
                    view *= np.asarray(1.05, view.dtype)

        monkeypatch.setitem(semantics.SEMANTICS, opcode, scaled)
    code, out, err = _run(["validate", model, "--inputs", data, "--json"], capsys)
    assert code == 1, err
    doc = json.loads(out)
    assert not doc["passed"]
    assert not all(entry["passed"] for entry in doc["outputs"] + doc["checkpoints"])


def test_bf16_arrays_in_an_npz_file_validate(tmp_path, capsys):
    model, _, x, _ = _bf16_case(tmp_path)
    np.savez(tmp_path / "inputs.npz", x=x)  # np.save writes bfloat16 as '<V2'
    code, out, err = _run(["validate", model, "--inputs", tmp_path / "inputs.npz"], capsys)
    assert code == 0, err
    assert out.startswith("PASS")


def test_a_bf16_input_takes_input_value(tmp_path, capsys):
    model, _, _, _ = _bf16_case(tmp_path)
    values = ",".join(str(v) for v in np.linspace(-2, 2, 32))
    code, out, err = _run(["validate", model, "--input-value", f"x={values}"], capsys)
    assert code == 0, err
    info = helper.make_tensor_value_info("q", TensorProto.INT4, [3])
    assert input_array(info, [1, -8, 7]).dtype == np.dtype(ml_dtypes.int4)
    with pytest.raises(UserError, match="outside int4's range"):
        input_array(info, [1, 2, 8])


def _constant_case(folder, with_output: bool = True):
    """A model without graph inputs (y = a constant, as onnx's test_constant) and an empty
    test_data_set (its output only, or nothing at all)."""
    value = np.arange(6, dtype=np.float32).reshape(2, 3) - 2.5
    node = helper.make_node("Constant", [], ["y"], value=numpy_helper.from_array(value, "v"))
    graph = helper.make_graph(
        [node], "c", [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])]
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    path = folder / "model.onnx"
    onnx.save(model, path)
    data = folder / "test_data_set_0"
    data.mkdir()
    if with_output:
        _save_tensor(data / "output_0.pb", value, "y")
    return path, data


def test_a_model_without_inputs_validates_on_an_empty_data_set(tmp_path, capsys):
    model, data = _constant_case(tmp_path)
    code, out, err = _run(["validate", model, "--inputs", data, "--reference", data], capsys)
    assert code == 0, err
    assert out.startswith("PASS")


def test_a_model_without_inputs_validates_on_an_empty_folder(tmp_path, capsys):
    model, data = _constant_case(tmp_path, with_output=False)
    code, out, err = _run(["validate", model, "--inputs", data], capsys)
    assert code == 0, err


def test_a_model_with_inputs_still_needs_input_files(tmp_path, capsys):
    model, data, _, _ = _bf16_case(tmp_path)
    (data / "input_0.pb").unlink()
    code, _, err = _run(["validate", model, "--inputs", data], capsys)
    assert code == 2
    assert "no input_*.pb files" in err


# --- the .npz reader ------------------------------------------------------------------------
def test_npz_ml_dtypes_come_back_as_themselves(tmp_path):
    path = tmp_path / "a.npz"
    arrays = {
        "b": np.array([1.5, -2], BF16),
        "e5": np.array([np.inf, 3], ml_dtypes.float8_e5m2),  # saved as '<f1'
        "e4": np.array([0.5, -448], ml_dtypes.float8_e4m3fn),  # saved as '<V1'
        "i4": np.array([-8, 7], ml_dtypes.int4),
        "f": np.array([[1, 2], [3, 4]], np.float32, order="F"),
    }
    np.savez(path, **arrays)
    dtypes = {"e4": np.dtype(ml_dtypes.float8_e4m3fn), "i4": np.dtype(ml_dtypes.int4)}
    got = input_files.read_npz(path, dict.fromkeys(arrays), dtypes)
    for name, value in arrays.items():
        assert got[name].dtype == value.dtype, name
        assert np.array_equal(got[name].astype(np.float32), value.astype(np.float32)), name


def test_npz_one_byte_voids_without_a_model_type_and_records_are_refused(tmp_path):
    path = tmp_path / "a.npz"
    np.savez(path, e4=np.array([0.5], ml_dtypes.float8_e4m3fn))
    with pytest.raises(UserError, match=r"input 'e4' holds structured or void values"):
        input_files.read_npz(path, {"e4": None}, {"e4": np.dtype(np.float32)})
    np.savez(path, r=np.zeros(2, dtype=[("a", "f4"), ("b", "i4")]))
    with pytest.raises(UserError, match=r"input 'r' holds structured or void values"):
        input_files.read_npz(path, {"r": None})
    np.savez(path, v=np.zeros(2, dtype="V8"))
    with pytest.raises(UserError, match=r"output 'v' holds structured or void"):
        input_files.read_npz(path, {"v": None}, role="output")


def test_a_structured_reference_is_refused(tmp_path, capsys):
    model, _, x, _ = _bf16_case(tmp_path)
    np.savez(tmp_path / "ref.npz", y=np.zeros((4, 6), dtype=[("a", "f2")]))
    argv = ["validate", model, "--reference", tmp_path / "ref.npz"]
    code, _, err = _run(argv, capsys)
    assert code == 2
    assert "output 'y' holds structured or void values" in err
