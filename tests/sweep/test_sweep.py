"""`onnx2bir sweep`: categories, resume, exit status, the Markdown table, and Ray."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx2bir.cli.commands import main
from onnx2bir.sweep import run as sweep

ROOT = Path(__file__).resolve().parents[2]
SMALL_CNN = ROOT / "models" / "small_cnn.onnx"


def _unsupported(path: Path) -> None:
    """A model with an op that has no lowering (Det)."""
    graph = helper.make_graph(
        [helper.make_node("Det", ["x"], ["y"])],
        "det",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def _refused(path: Path) -> None:
    """Reshape to a runtime shape: onnx2bir refuses it (the shape must be known)."""
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "shape"], ["y"])],
        "reshape",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
            helper.make_tensor_value_info("shape", TensorProto.INT64, [2]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def _tiny_add(path: Path) -> None:
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "b"], ["y"])],
        "add",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])],
        [numpy_helper.from_array(np.ones((4, 8), np.float32), "b")],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


@pytest.fixture
def zoo(tmp_path: Path) -> Path:
    folder = tmp_path / "zoo"
    folder.mkdir()
    shutil.copy(SMALL_CNN, folder / "small_cnn.onnx")
    _tiny_add(folder / "add.onnx")
    _unsupported(folder / "det.onnx")
    _refused(folder / "reshape.onnx")
    (folder / "garbage.onnx").write_bytes(b"\x00not a model")
    (folder / "broken_export.export-error").write_text("RuntimeError: cannot trace this\n")
    return folder


def test_failures_fall_into_categories_with_their_reason(zoo, tmp_path, capsys):
    out_json, out_md = tmp_path / "sweep.json", tmp_path / "sweep.md"
    code = main(["sweep", str(zoo), "--jobs", "2", "--json", str(out_json), "--md", str(out_md)])
    printed = capsys.readouterr().out
    assert code == 1  # not every model passed
    doc = json.loads(out_json.read_text())
    by_name = {r["model"]: r for r in doc["models"]}
    assert sorted(by_name) == sorted(
        ["add", "broken_export", "det", "garbage", "reshape", "small_cnn"]
    )
    assert by_name["small_cnn"]["passed"] and by_name["add"]["passed"]
    assert by_name["small_cnn"]["convs"] == {"matched": 4, "total": 5}
    # Against the emulating oracle the bf16 program is exact here; its drift from fp32 is not.
    assert by_name["small_cnn"]["max_abs_err"] < 1e-4
    assert 0 < by_name["small_cnn"]["drift_max_abs_err"] < 1e-2
    assert by_name["broken_export"]["category"] == "export"
    assert by_name["broken_export"]["reason"] == "RuntimeError: cannot trace this"
    assert by_name["det"]["category"] == "unsupported op"
    assert "Det x1" in by_name["det"]["reason"]
    assert by_name["det"]["ops"] == 1
    assert by_name["reshape"]["category"] == "codegen refusal"
    assert by_name["garbage"]["category"] == "codegen refusal"
    assert all("\n" not in r["reason"] for r in doc["models"])
    assert doc["summary"]["models"] == 6 and doc["summary"]["passed"] == 2
    assert doc["summary"]["by_category"] == {
        "export": 1,
        "unsupported op": 1,
        "codegen refusal": 2,
    }
    assert json.loads(printed) == doc  # with --json, stdout is the same document
    table = out_md.read_text()
    assert "| small_cnn |" in table and "| det | unsupported op |" in table


def test_a_sweep_resumes_and_skips_models_already_recorded(zoo, tmp_path):
    out_json = tmp_path / "sweep.json"
    sweep.sweep([str(zoo / "add.onnx")], json_out=out_json, progress=False)
    first = json.loads(out_json.read_text())["models"]
    # The recorded model is not run again, even if its file changed; the new one is.
    (zoo / "add.onnx").write_bytes(b"garbage now")
    records, summary = sweep.sweep(
        [str(zoo / "add.onnx"), str(zoo / "small_cnn.onnx")], json_out=out_json, progress=False
    )
    assert [r["model"] for r in records] == ["add", "small_cnn"]
    assert records[0] == first[0] and records[0]["passed"]
    assert summary["passed"] == 2


def test_the_text_summary_lists_each_failure_with_its_category(zoo, capsys):
    assert main(["sweep", str(zoo), "--no-progress"]) == 1
    printed = capsys.readouterr().out
    assert "FAIL  2/6 models validate" in printed and "det: unsupported op" in printed


def test_all_passing_exits_zero_and_report_only_does_not_simulate(tmp_path, capsys):
    _tiny_add(tmp_path / "add.onnx")
    assert main(["sweep", str(tmp_path / "add.onnx"), "--no-progress"]) == 0
    assert main(["sweep", str(SMALL_CNN), "--report-only", "--no-progress"]) == 0
    assert "1/1 models compile" in capsys.readouterr().out


def test_a_model_over_the_timeout_is_stopped(tmp_path):
    record = sweep.run_guarded(str(SMALL_CNN), timeout=0.01)
    assert record["category"] == "timeout" and not record["passed"]


def test_bad_paths_and_flags_are_one_line_errors(tmp_path, capsys):
    assert main(["sweep", str(tmp_path / "missing")]) == 2
    assert "no such file or folder" in capsys.readouterr().err
    assert main(["sweep", str(tmp_path)]) == 2
    assert "no .onnx models" in capsys.readouterr().err
    assert main(["sweep", str(SMALL_CNN), "--jobs", "0"]) == 2
    assert "--jobs 0" in capsys.readouterr().err


@pytest.mark.slow
def test_models_on_a_local_ray_instance(tmp_path):
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        records, summary = sweep.sweep(
            [str(ROOT / "models")], use_ray=True, json_out=tmp_path / "s.json", progress=False
        )
    finally:
        ray.shutdown()
    committed = sorted(p.stem for p in (ROOT / "models").glob("*.onnx"))
    assert [r["model"] for r in records] == committed
    assert summary["failed"] == 0, [r for r in records if not r["passed"]]
    # Each passed within its own tolerance (bf16 matmul operands by default); the error is
    # recorded for every model.
    assert all(r["max_abs_err"] is not None and r["category"] is None for r in records)


def test_a_recorded_export_failure_is_run_again_once_the_model_exists(zoo, tmp_path):
    out_json = tmp_path / "sweep.json"
    error = zoo / "broken_export.export-error"
    sweep.sweep([str(error)], json_out=out_json, progress=False)
    error.unlink()
    _tiny_add(zoo / "broken_export.onnx")
    records, _ = sweep.sweep([str(zoo / "broken_export.onnx")], json_out=out_json, progress=False)
    assert records[0]["passed"] and records[0]["category"] is None


def _exporter_meta_prefix() -> str:
    """The metadata key prefix models/sweep.py writes into each export (read from its source:
    the exporter needs torch, the test does not)."""
    import ast

    tree = ast.parse((ROOT / "models" / "sweep.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and [t.id for t in node.targets] == ["META"]:
            return node.value.value
    raise AssertionError("models/sweep.py defines no META")


def test_a_record_carries_the_source_and_family_the_exporter_wrote(tmp_path):
    path = tmp_path / "add.onnx"
    _tiny_add(path)
    model = onnx.load(path)
    prefix = _exporter_meta_prefix()
    for key, value in (("source", "timm"), ("family", "cnn")):
        model.metadata_props.add(key=prefix + key, value=value)
    onnx.save(model, path)
    record = sweep.run_guarded(str(path), timeout=600)
    assert (record["source"], record["family"]) == ("timm", "cnn")


def _steered(path: Path) -> None:
    """y = x * 2 when the int64 input `mode` is 1, else x + 100; x has a symbolic batch."""
    branches = {
        name: helper.make_graph(
            [helper.make_node(op, ["x", const], [f"{name}_y"])],
            name,
            [],
            [helper.make_tensor_value_info(f"{name}_y", TensorProto.FLOAT, None)],
        )
        for name, op, const in (("then", "Mul", "two"), ("else", "Add", "hundred"))
    }
    graph = helper.make_graph(
        [
            helper.make_node("Equal", ["mode", "one"], ["on"]),
            helper.make_node(
                "If", ["on"], ["y"], then_branch=branches["then"], else_branch=branches["else"]
            ),
        ],
        "steered",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8]),
            helper.make_tensor_value_info("mode", TensorProto.INT64, []),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])],
        [
            numpy_helper.from_array(np.array(1, np.int64), "one"),
            numpy_helper.from_array(np.full((1,), 2.0, np.float32), "two"),
            numpy_helper.from_array(np.full((1,), 100.0, np.float32), "hundred"),
        ],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def test_a_run_file_gives_the_sizes_and_fixed_inputs(tmp_path):
    model = tmp_path / "steered.onnx"
    _steered(model)
    # Without the run file: the batch has no size.
    (bare,), _ = sweep.sweep([str(model)], jobs=1, progress=False)
    assert bare["category"] == "codegen refusal" and "'batch'" in bare["reason"]
    run_file = tmp_path / "steered.run.json"
    run_file.write_text(json.dumps({"dims": {"batch": 2}, "input_values": {"mode": [1]}}))
    (record,), _ = sweep.sweep([str(model)], jobs=1, progress=False)
    assert record["passed"], record
    run_file.write_text(json.dumps({"dims": {"batch": 2}, "sizes": {}}))
    (bad,), _ = sweep.sweep([str(model)], jobs=1, progress=False)
    assert bad["category"] == "codegen refusal" and "run file" in bad["reason"]
