"""The Python API: the same results as the command line, as dataclasses."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

import onnx2bir
from onnx2bir.cli.commands import main
from onnx2bir.errors import MachineError
from onnx2bir.runtime.oracle import ort as oracle

ROOT = Path(__file__).resolve().parents[2]
SMALL_CNN = ROOT / "models" / "small_cnn.onnx"


def _cli_json(argv, capsys) -> tuple[int, dict]:
    code = main([str(a) for a in argv])
    return code, json.loads(capsys.readouterr().out)


def _without_timings(doc: dict) -> dict:
    return {k: v for k, v in doc.items() if k != "timings"}


def test_validate_is_the_cli_json(capsys):
    result = onnx2bir.validate(str(SMALL_CNN), seed=3)
    assert isinstance(result, onnx2bir.ValidationResult) and result.passed is True
    code, doc = _cli_json(["validate", SMALL_CNN, "--seed", "3", "--json"], capsys)
    assert code == 0
    assert _without_timings(json.loads(json.dumps(result.to_json()))) == _without_timings(doc)
    assert set(result.outputs) == {"logits"} and set(result.inputs) == {"input"}


def test_report_is_the_cli_json(capsys):
    result = onnx2bir.report(SMALL_CNN, experimental_convolution_kernel_match=True)
    code, doc = _cli_json(
        ["report", SMALL_CNN, "--experimental-convolution-kernel-match", "--json"], capsys
    )
    assert code == 0 and result.compiles
    assert json.loads(json.dumps(result.to_json())) == doc
    assert "node_conv2d_4" in result.explain("node_conv2d_4")


def test_compile_is_the_convert_json_and_run_reproduces_validate(tmp_path, capsys):
    compilation = onnx2bir.compile(SMALL_CNN).save(tmp_path / "bir")
    code, doc = _cli_json(["convert", SMALL_CNN, "-o", tmp_path / "cli", "--json"], capsys)
    ours = _without_timings(compilation.to_json())
    theirs = _without_timings(doc)
    assert code == 0 and [Path(f).name for f in ours.pop("files")] == [
        Path(f).name for f in theirs.pop("files")
    ]
    assert ours == theirs
    result = onnx2bir.validate(SMALL_CNN, seed=5)
    again = onnx2bir.run(tmp_path / "bir" / "small_cnn.bir.json", result.inputs)
    assert np.array_equal(again["logits"], result.outputs["logits"])
    assert np.array_equal(onnx2bir.run(compilation, result.inputs)["logits"], again["logits"])


def test_validate_takes_arrays_in_memory_and_a_model_proto():
    feeds = {"input": np.random.default_rng(1).standard_normal((1, 3, 32, 32), np.float32)}
    result = onnx2bir.validate(onnx.load(str(SMALL_CNN)), feeds, auto_cast="none")
    assert result.passed and np.array_equal(result.inputs["input"], feeds["input"])
    assert result.to_json()["model"] == "<ModelProto>"
    reference = oracle.run_onnxruntime(str(SMALL_CNN), feeds, ["logits"])["logits"]
    assert np.allclose(result.outputs["logits"], reference, atol=1e-4, rtol=1e-3)


def test_options_use_the_cli_names_and_unknown_ones_are_refused():
    with pytest.raises(TypeError, match="enable_native_kernel_attention"):
        onnx2bir.compile(SMALL_CNN, enable_attention=True)
    with pytest.raises(onnx2bir.UserError, match="matmult-to-bf16"):
        onnx2bir.compile(SMALL_CNN, native_kernel_cast_type="everything")


def test_errors_are_the_documented_exceptions(tmp_path):
    with pytest.raises(onnx2bir.UserError, match="no such file"):
        onnx2bir.validate(tmp_path / "missing.onnx")
    with pytest.raises(onnx2bir.UserError, match="missing input; no input named x"):
        onnx2bir.run(onnx2bir.compile(SMALL_CNN), {"x": np.zeros(1)})


def test_run_takes_an_npz_a_schedule_and_the_race_detector(tmp_path):
    compilation = onnx2bir.compile(SMALL_CNN).save(tmp_path / "bir")
    feeds = {"input": np.random.default_rng(3).standard_normal((1, 3, 32, 32), np.float32)}
    np.savez(tmp_path / "in.npz", **feeds)
    bir = tmp_path / "bir" / "small_cnn.bir.json"
    program = onnx2bir.run(bir, tmp_path / "in.npz")
    shuffled = onnx2bir.run(bir, feeds, schedule="random:4", check_races=True)
    assert np.array_equal(program["logits"], shuffled["logits"])
    reference = oracle.run_onnxruntime(str(SMALL_CNN), feeds, ["logits"])["logits"]
    assert np.allclose(program["logits"], reference, atol=1e-2, rtol=2e-2)  # bf16 matmuls
    module = compilation.module
    for inst in module.functions[0].instructions():
        inst.deps = []
    with pytest.raises(MachineError, match="race"):
        onnx2bir.run(module, feeds, check_races=True)


def test_validate_takes_its_options_as_groups_or_as_keywords():
    from onnx2bir.api import InputOptions, ToleranceOptions, ValidationRunOptions

    grouped = onnx2bir.validate(
        SMALL_CNN,
        input_options=InputOptions(seed=3),
        tolerance_options=ToleranceOptions(atol=1e-3, tolerance={"logits": (None, 1e-2)}),
        run_options=ValidationRunOptions(schedule="random:1"),
    )
    keywords = onnx2bir.validate(
        SMALL_CNN, seed=3, atol=1e-3, tolerance={"logits": (None, 1e-2)}, schedule="random:1"
    )
    assert grouped.passed and keywords.passed
    assert _without_timings(grouped.to_json()) == _without_timings(keywords.to_json())
    assert grouped.to_json()["seed"] == 3 and grouped.to_json()["schedule"] == "random:1"


def test_validate_keywords_override_their_group_and_unknown_ones_are_refused():
    from onnx2bir.api.options import ToleranceOptions, validate_options

    given = validate_options(
        onnx2bir.CompileOptions(auto_cast="all"),
        (None, ToleranceOptions(atol=1e-3, rtol=1e-2), None),
        {"rtol": 0.5, "localize": True, "auto_cast_type": "fp16"},
    )
    assert (given.tolerance.atol, given.tolerance.rtol) == (1e-3, 0.5)
    assert given.run.localize and given.inputs.seed == 0
    assert (given.compile.auto_cast, given.compile.auto_cast_type) == ("all", "fp16")
    with pytest.raises(TypeError, match="unknown compile option.*enable_native_kernel_attention"):
        onnx2bir.validate(SMALL_CNN, enable_attention=True)
