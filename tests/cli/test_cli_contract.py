"""The command-line contract: every command, every outcome, one JSON document with --json,
and the same exit codes everywhere (0 ok, 1 fails, 2 bad input or usage, 3 internal)."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

import onnx2bir
from onnx2bir.cli.commands import main

ROOT = Path(__file__).resolve().parents[2]
SMALL_CNN = ROOT / "models" / "small_cnn.onnx"


def run(argv, capsys):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def _save(model, path: Path) -> Path:
    path.write_bytes(model.SerializeToString())
    return path


@pytest.fixture
def not_compiling(tmp_path) -> Path:
    """A valid model with an op no lowering handles: it reads, but does not compile."""
    graph = helper.make_graph(
        [helper.make_node("RandomNormalLike", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
    )
    return _save(helper.make_model(graph), tmp_path / "hardmax.onnx")


@pytest.fixture
def bad_file(tmp_path) -> Path:
    path = tmp_path / "bad.onnx"
    path.write_bytes(b"this is not a protobuf")
    return path


def _command(name: str, model: Path, tmp_path: Path) -> list:
    return {
        "convert": ["convert", model, "-o", tmp_path / "out"],
        "validate": ["validate", model],
        "report": ["report", model],
    }[name] + ["--json"]


@pytest.mark.parametrize("command", ["convert", "validate", "report"])
def test_every_command_answers_in_json_on_a_good_model(command, tmp_path, capsys):
    code, out, _ = run(_command(command, SMALL_CNN, tmp_path), capsys)
    doc = json.loads(out)
    assert code == 0 and "error" not in doc and doc["model"] == str(SMALL_CNN)


@pytest.mark.parametrize("command", ["convert", "validate", "report"])
def test_every_command_answers_in_json_on_a_bad_file(command, bad_file, tmp_path, capsys):
    code, out, err = run(_command(command, bad_file, tmp_path), capsys)
    doc = json.loads(out)
    assert code == 2 and doc["error"]["kind"] == "bad_input"
    assert "not a readable ONNX model" in doc["error"]["message"] and err == ""


@pytest.mark.parametrize("command", ["convert", "validate"])
def test_a_model_that_does_not_compile_exits_1_in_json(command, not_compiling, tmp_path, capsys):
    code, out, _ = run(_command(command, not_compiling, tmp_path), capsys)
    doc = json.loads(out)
    assert code == 1 and doc["error"]["kind"] == "does_not_compile"
    assert "RandomNormalLike x1" in doc["error"]["message"]
    assert not (tmp_path / "out").exists()


def test_report_on_a_model_that_does_not_compile_reports_it_and_exits_1(not_compiling, capsys):
    code, out, _ = run(["report", not_compiling, "--json"], capsys)
    doc = json.loads(out)
    assert code == 1 and doc["compiles"] is False and "RandomNormalLike" in doc["codegen_error"]
    code, out, _ = run(["report", not_compiling], capsys)
    assert code == 1 and "does NOT compile" in out


def test_usage_errors_are_json_too(capsys):
    code, out, err = run(["validate", SMALL_CNN, "--json", "--no-such-flag"], capsys)
    doc = json.loads(out)
    assert (
        code == 2
        and doc["error"]["kind"] == "usage"
        and "--no-such-flag" in doc["error"]["message"]
    )
    assert err == ""


def test_an_internal_error_is_exit_3_and_json(capsys, monkeypatch):
    def broken(*args, **kwargs):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(onnx2bir.api, "report", broken)
    code, out, _ = run(["report", SMALL_CNN, "--json"], capsys)
    doc = json.loads(out)
    assert code == 3 and doc["error"]["kind"] == "internal"
    assert "please report it" in doc["error"]["message"]
    assert doc["error"]["message"].endswith("ZeroDivisionError: a bug")
    code, _, err = run(["report", SMALL_CNN], capsys)
    assert code == 3 and err.rstrip().endswith("ZeroDivisionError: a bug)")


def test_version_matches_the_package_metadata():
    out = subprocess.run(
        [sys.executable, "-m", "onnx2bir", "--version"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
    ).stdout
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert out.strip() == f"onnx2bir {onnx2bir.__version__}"
    assert f'version = "{onnx2bir.__version__}"' in pyproject


def test_an_unknown_target_is_refused_with_the_valid_ones(capsys):
    code, out, _ = run(["report", SMALL_CNN, "--target", "foo", "--json"], capsys)
    doc = json.loads(out)
    assert code == 2 and "sunda" in doc["error"]["message"] and "inf2" in doc["error"]["message"]


def test_unknown_tolerance_names_and_op_types_are_refused_with_the_valid_ones(capsys):
    code, _, err = run(["validate", SMALL_CNN, "--tolerance", "NOSUCH=1e-3,"], capsys)
    assert code == 2 and "NOSUCH" in err and "logits" in err
    code, _, err = run(["validate", SMALL_CNN, "--op-tolerance", "Softmax=1e-3,"], capsys)
    assert code == 2 and "Softmax" in err and "Conv" in err and "Gemm" in err
    code, out, _ = run(["validate", SMALL_CNN, "--op-tolerance", "Conv=1e-3,"], capsys)
    assert code == 0


def test_output_folder_is_made_with_all_its_parents_and_ordinary_mode(tmp_path, capsys):
    out = tmp_path / "a" / "b" / "c"
    code, text, _ = run(["convert", SMALL_CNN, "-o", out, "--json"], capsys)
    doc = json.loads(text)
    assert code == 0 and sorted(Path(f).name for f in doc["files"]) == [
        "small_cnn.bir.json",
        "small_cnn.consts.bin",
    ]
    assert (out / "small_cnn.bir.json").is_file()
    mode = stat.S_IMODE(out.stat().st_mode)
    assert mode & 0o055, oct(mode)  # not a private 0700 folder


def test_validate_stats_go_into_the_json_and_the_text(capsys):
    code, out, err = run(["validate", SMALL_CNN, "--json", "--stats"], capsys)
    doc = json.loads(out)
    names = {(s["pass"], s["name"]) for s in doc["pass_statistics"]}
    assert ("TransformConvOp", "matched_conv_ops") in names and err == ""
    code, out, err = run(["validate", SMALL_CNN, "--stats"], capsys)
    assert "TransformConvOp.matched_conv_ops = 4" in out and err == ""


def _symbolic_pair(tmp_path) -> Path:
    """Two inputs sharing the symbols batch and seq."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "m"], ["y"])],
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq"]),
            helper.make_tensor_value_info("m", TensorProto.FLOAT, ["batch", "seq"]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq"])],
    )
    return _save(helper.make_model(graph, ir_version=9), tmp_path / "pair.onnx")


def test_every_unset_symbol_is_named_in_one_message(tmp_path, capsys):
    code, _, err = run(["validate", _symbolic_pair(tmp_path)], capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1
    assert "'batch'" in lines[0] and "'seq'" in lines[0]
    assert "--dim batch=N" in lines[0] and "--dim seq=N" in lines[0]


def test_a_shape_for_one_input_carries_shared_symbols_to_the_others(tmp_path, capsys):
    code, out, _ = run(
        ["validate", _symbolic_pair(tmp_path), "--input-shape", "x=2,5", "--json"], capsys
    )
    doc = json.loads(out)
    assert code == 0
    assert {i["name"]: i["shape"] for i in doc["inputs"]} == {"x": [2, 5], "m": [2, 5]}


def test_shapes_come_from_the_input_arrays(tmp_path, capsys):
    arrays = tmp_path / "in.npz"
    rng = np.random.default_rng(0)
    x, m = rng.standard_normal((3, 7), np.float32), rng.standard_normal((3, 7), np.float32)
    np.savez(arrays, x=x, m=m)
    code, out, _ = run(["validate", _symbolic_pair(tmp_path), "--inputs", arrays, "--json"], capsys)
    doc = json.loads(out)
    assert code == 0 and doc["outputs"][0]["shape"] == [3, 7]
    assert doc["outputs"][0]["max_abs_err"] == 0.0  # an Add: exact on the machine too
