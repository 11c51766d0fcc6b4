"""The command line: exit codes, one-line errors for bad input, atomic and deterministic output."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx2bir.cli.commands import main

ROOT = Path(__file__).resolve().parents[2]
SMALL_CNN = ROOT / "models" / "small_cnn.onnx"
SCHEMA = ROOT / "onnx2bir" / "bir" / "schema.json"


def run(argv, capsys):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code, err, *fragments, exit_code=2):
    assert code == exit_code
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    for fragment in fragments:
        assert fragment in lines[0]


def _save(model, path):
    path.write_bytes(model.SerializeToString())
    return path


def test_validate_small_cnn_passes_and_reports_json(capsys):
    code, out, _ = run(["validate", SMALL_CNN, "--json"], capsys)
    doc = json.loads(out)
    assert code == 0 and doc["passed"] is True
    (output,) = doc["outputs"]
    assert set(output) >= {
        "name",
        "shape",
        "max_abs_err",
        "max_rel_err",
        "cosine",
        "atol",
        "rtol",
        "passed",
    }
    assert output["name"] == "logits" and output["shape"] == [1, 10]
    assert output["cosine"] > 0.9999
    assert {"import", "codegen", "simulate", "onnxruntime"} <= set(doc["timings"])


def test_validate_exits_1_when_an_output_differs(capsys, monkeypatch):
    import onnx2bir.runtime.machine.interpreter as interpreter

    real = interpreter.run_function

    def off_by_a_bit(*args, **kwargs):
        return {name: value + 0.01 for name, value in real(*args, **kwargs).items()}

    monkeypatch.setattr(interpreter, "run_function", off_by_a_bit)
    code, out, _ = run(["validate", SMALL_CNN], capsys)
    assert code == 1
    assert out.startswith("FAIL")


def test_missing_file(capsys):
    code, _, err = run(["validate", "/no/such/model.onnx"], capsys)
    assert_one_line_error(code, err, "no such file")


def test_empty_file(tmp_path, capsys):
    path = tmp_path / "empty.onnx"
    path.write_bytes(b"")
    code, _, err = run(["convert", path, "-o", tmp_path / "out"], capsys)
    assert_one_line_error(code, err, "empty")
    assert not (tmp_path / "out").exists()


def test_truncated_file(tmp_path, capsys):
    path = tmp_path / "cut.onnx"
    path.write_bytes(SMALL_CNN.read_bytes()[:5000])
    code, _, err = run(["validate", path], capsys)
    assert_one_line_error(code, err, "cut.onnx")


def test_not_an_onnx_file(tmp_path, capsys):
    path = tmp_path / "notes.onnx"
    path.write_text("these are not the weights you are looking for\n" * 20)
    code, _, err = run(["report", path], capsys)
    assert_one_line_error(code, err, "notes.onnx", "ONNX")


def test_model_failing_the_checker(tmp_path, capsys):
    graph = helper.make_graph(
        [helper.make_node("Relu", ["ghost"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    path = _save(helper.make_model(graph, ir_version=9), tmp_path / "bad.onnx")
    code, _, err = run(["validate", path], capsys)
    assert_one_line_error(code, err, "checker")


def test_every_unsupported_op_is_listed_with_its_count(tmp_path, capsys):
    nodes = [
        helper.make_node("Relu", ["x"], ["a"]),
        helper.make_node("GridSample", ["a", "grid"], ["b"]),
        helper.make_node("GridSample", ["b", "grid"], ["c"]),
        helper.make_node("Det", ["c"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 4, 4]),
         helper.make_tensor_value_info("grid", TensorProto.FLOAT, [1, 4, 4, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1])],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    path = _save(model, tmp_path / "exotic.onnx")
    code, _, err = run(["convert", path, "-o", tmp_path / "out"], capsys)
    # The model reads and checks: it does not compile, exit 1 (not bad input).
    assert_one_line_error(code, err, "GridSample x2", "Det x1", exit_code=1)
    assert not (tmp_path / "out").exists()


def test_unset_symbolic_dimension(tmp_path, capsys):
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
    )
    path = _save(helper.make_model(graph, ir_version=9), tmp_path / "dyn.onnx")
    code, _, err = run(["validate", path], capsys)
    assert_one_line_error(code, err, "'N'", "--dim N=")
    code, out, _ = run(["validate", path, "--dim", "N=3"], capsys)
    assert code == 0 and out.startswith("PASS")


def test_external_data_outside_the_folder(tmp_path, capsys):
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "w"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
        [numpy_helper.from_array(np.ones(4, np.float32), "w")],
    )
    model = helper.make_model(graph, ir_version=9)
    weight = model.graph.initializer[0]
    weight.ClearField("raw_data")
    weight.data_location = TensorProto.EXTERNAL
    entry = weight.external_data.add()
    entry.key, entry.value = "location", "/etc/hostname"
    (tmp_path / "m").mkdir()
    path = _save(model, tmp_path / "m" / "ext.onnx")
    code, _, err = run(["validate", path], capsys)
    assert_one_line_error(code, err, "outside the model's folder")


def test_bad_cast_type_states_the_grammar(capsys):
    code, _, err = run(["report", SMALL_CNN, "--native-kernel-cast-type", "all-to-fp8"], capsys)
    assert_one_line_error(code, err, "<what>-to-<type>", "matmult, all", "bf16, fp16")


def test_usage_error_exits_2(capsys):
    with pytest.raises(SystemExit) as info:
        main(["validate", str(SMALL_CNN), "--input-shape", "x=1,a"])
    assert info.value.code == 2


def test_convert_is_deterministic_and_schema_valid(tmp_path, capsys):
    first, second = tmp_path / "a", tmp_path / "b"
    assert run(["convert", SMALL_CNN, "-o", first], capsys)[0] == 0
    assert run(["convert", SMALL_CNN, "-o", second], capsys)[0] == 0
    names = sorted(p.name for p in first.iterdir())
    assert names == ["small_cnn.bir.json", "small_cnn.consts.bin"]
    for name in names:
        assert (first / name).read_bytes() == (second / name).read_bytes()
    doc = json.loads((first / "small_cnn.bir.json").read_text())
    jsonschema.validate(doc, json.loads(SCHEMA.read_text()))


def test_convert_into_an_existing_folder_leaves_no_staging_files(tmp_path, capsys):
    (tmp_path / "keep.txt").write_text("mine")
    assert run(["convert", SMALL_CNN, "-o", tmp_path], capsys)[0] == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "keep.txt",
        "small_cnn.bir.json",
        "small_cnn.consts.bin",
    ]


def test_report_json_lists_ops(capsys):
    code, out, _ = run(["report", SMALL_CNN, "--json"], capsys)
    doc = json.loads(out)
    assert code == 0
    assert doc["ops"]["Conv"] == 5 and doc["ops"]["Gemm"] == 1
    assert doc["instructions"]["per_engine"]["PE"] > 0


def test_console_script_and_module_entry_point(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "onnx2bir", "--help"], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0 and "convert" in result.stdout and "validate" in result.stdout
    result = subprocess.run(
        [sys.executable, "-m", "onnx2bir", "validate", str(SMALL_CNN)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert onnx.load(str(SMALL_CNN)).graph.output[0].name in result.stdout


def test_report_json_follows_the_public_contract(capsys):
    code, out, _ = run(["report", ROOT / "models" / "bert.onnx", "--json"], capsys)
    doc = json.loads(out)
    assert code == 0 and doc["compiles"] is True
    assert set(doc["statistics"]) >= {
        "total_conv_ops",
        "matched_conv_ops",
        "conv_kernel_match_percentage",
        "per_kernel",
    }
    assert len(doc["attention"]) == 2 and len(doc["mlp"]) == 2
    for block in doc["attention"]:
        assert set(block) >= {"nodes", "variant", "target", "reason"}
        assert block["target"] is None and block["reason"]
    for block in doc["mlp"]:
        assert set(block) >= {"nodes", "activation", "target"}
        assert block["target"] == "AwsNeuronMLPNKI"
    code, out, _ = run(["report", SMALL_CNN, "--json"], capsys)
    convs = json.loads(out)["convs"]
    assert len(convs) == 5
    for conv in convs:
        assert set(conv) >= {"node", "kernel", "fallback_reason"}
        assert (conv["kernel"] is None) != (conv["fallback_reason"] is None)


def test_explain_prints_the_walk_and_names_unknown_convs(capsys):
    code, out, _ = run(["report", SMALL_CNN, "--explain", "node_conv2d_4"], capsys)
    assert code == 0 and "rep_nhwc" in out and "refused: feature_group_count 4 != 1" in out
    assert "the generic conv lowering runs it" in out
    code, _, err = run(["report", SMALL_CNN, "--explain", "nope"], capsys)
    assert_one_line_error(code, err, "no convolution named 'nope'", "node_conv2d")


def test_report_carries_the_cost_estimate(capsys):
    code, out, _ = run(["report", SMALL_CNN, "--json"], capsys)
    cost = json.loads(out)["cost"]
    assert code == 0 and cost["estimated_seconds"] > 0 and cost["dma_bytes"] > 0
    assert cost["busy_seconds"]["PE"] > 0 and set(cost["busy_seconds"]) <= {
        "PE",
        "ACT",
        "DVE",
        "POOL",
        "DMA",
    }


def test_a_converted_bir_file_runs_to_the_same_outputs(tmp_path, capsys):
    """convert → read the BIR back → run it on the machine: the same outputs, bit for bit."""
    from onnx2bir.bir.json_io import module_to_json, read_module
    from onnx2bir.compiler import compile_model
    from onnx2bir.runtime.machine.interpreter import run_function
    from onnx2bir.runtime.oracle.ort import synthesize_inputs

    model = ROOT / "models" / "llama.onnx"
    assert run(["convert", model, "-o", tmp_path], capsys)[0] == 0
    loaded = read_module(tmp_path / "llama.bir.json")
    compilation = compile_model(model)  # the default options, as convert used
    assert module_to_json(loaded) == module_to_json(compilation.module)
    feeds = synthesize_inputs(compilation.graph, 3)
    direct = run_function(compilation.module, feeds)
    again = run_function(loaded, feeds)
    for name, value in direct.items():
        assert np.array_equal(value, again[name])


def test_input_shape_overrides_a_static_shape_and_the_oracle_follows(capsys):
    code, out, _ = run(["validate", SMALL_CNN, "--input-shape", "input=1,3,8,8"], capsys)
    assert code == 0 and out.startswith("PASS")


def test_reshape_that_loses_elements_is_refused_naming_the_node(capsys):
    code, _, err = run(["validate", SMALL_CNN, "--input-shape", "input=2,3,8,8"], capsys)
    # With this shape the model is invalid (onnxruntime refuses it too): bad input, exit 2,
    # found on import before any code is generated.
    assert_one_line_error(code, err, "node_view", "the number of elements changes", exit_code=2)


def test_dim_for_a_symbol_the_model_lacks_is_refused(capsys):
    code, _, err = run(["validate", SMALL_CNN, "--dim", "batch=2"], capsys)
    assert_one_line_error(code, err, "--dim batch", "no symbolic dimension")


def test_convert_to_an_unwritable_place_is_a_clean_error(capsys):
    code, _, err = run(["convert", SMALL_CNN, "-o", "/proc/onnx2bir-out"], capsys)
    assert_one_line_error(code, err, "cannot write there")
