"""`onnx2bir sweep --quantize`: each model quantized by onnxruntime's tool in its worker, the
variant recorded, the quantizer's own failures a category, bad values refused (exit 2)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx2bir.cli.commands import main
from onnx2bir.errors import UserError
from onnx2bir.sweep import run as sweep
from onnx2bir.sweep import table
from onnx2bir.sweep.model import run_one
from onnx2bir.sweep.quantize import quantize_model, unshare_initializers


def _linear(path: Path) -> None:
    """y = relu(x @ W + b): a MatMul for every variant to quantize."""
    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["h"]),
            helper.make_node("Add", ["h", "b"], ["z"]),
            helper.make_node("Relu", ["z"], ["y"]),
        ],
        "linear",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 16])],
        [
            numpy_helper.from_array(rng.standard_normal((32, 16)).astype(np.float32), "w"),
            numpy_helper.from_array(rng.standard_normal(16).astype(np.float32), "b"),
        ],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def _custom_op(path: Path) -> None:
    """An op of a domain onnxruntime does not know: its quantize_static cannot calibrate."""
    graph = helper.make_graph(
        [helper.make_node("Frobnicate", ["x"], ["y"], domain="example.custom")],
        "custom",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("example.custom", 1)]
    onnx.save(helper.make_model(graph, opset_imports=opsets), path)


def test_quantize_qdq_validates_the_quantized_model_and_records_the_variant(tmp_path, capsys):
    _linear(tmp_path / "linear.onnx")
    out = tmp_path / "sweep.json"
    md = tmp_path / "sweep.md"
    args = ["sweep", str(tmp_path / "linear.onnx"), "--quantize", "qdq", "--no-progress"]
    assert main([*args, "--json", str(out), "--md", str(md)]) == 0
    (record,) = json.loads(out.read_text())["models"]
    assert record["passed"] and record["quantize"] == "qdq" and record["model"] == "linear"
    # What ran is the quantized model: Q/DQ pairs around the MatMul, not the 3 float nodes.
    assert record["ops"] > 3 and record["times"]["quantize"] > 0
    assert json.loads(out.read_text())["summary"]["quantize"] == "qdq"
    page = md.read_text()
    assert "`--quantize qdq`" in page and "| family | quantized |" in page
    assert "| linear |  |  | qdq |" in page
    capsys.readouterr()
    assert main(args) == 0
    assert "each quantized by onnxruntime (qdq)" in capsys.readouterr().out


def test_the_page_of_a_quantized_sweep_reads_back_with_its_variant(tmp_path):
    _linear(tmp_path / "linear.onnx")
    records, summary = sweep.sweep(
        [str(tmp_path / "linear.onnx")], quantize="dynamic", report_only=True, progress=False
    )
    (back,) = table.parse(table.markdown(records, summary))
    assert back["quantize"] == "dynamic" and back["passed"] == records[0]["passed"]
    # A float sweep's page has no such column.
    plain, plain_summary = sweep.sweep(
        [str(tmp_path / "linear.onnx")], report_only=True, progress=False
    )
    assert "quantized" not in table.markdown(plain, plain_summary)


def test_a_bad_variant_is_refused_with_exit_2(tmp_path, capsys):
    _linear(tmp_path / "linear.onnx")
    with pytest.raises(SystemExit) as info:
        main(["sweep", str(tmp_path / "linear.onnx"), "--quantize", "int8"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "--quantize: invalid choice: 'int8'" in err and "'qdq'" in err and "'int4'" in err
    with pytest.raises(UserError, match="--quantize int8: not one of qdq, qop, dynamic, int4"):
        sweep.sweep([str(tmp_path / "linear.onnx")], quantize="int8", progress=False)


def test_int4_without_onnx_ir_is_refused_before_any_model_runs(tmp_path, capsys, monkeypatch):
    _linear(tmp_path / "linear.onnx")
    monkeypatch.setitem(sys.modules, "onnx_ir", None)  # import onnx_ir raises ImportError
    assert main(["sweep", str(tmp_path / "linear.onnx"), "--quantize", "int4"]) == 2
    err = capsys.readouterr().err
    assert "--quantize int4 needs the onnx_ir package: pip install onnx_ir" in err
    assert "Traceback" not in err


def test_a_model_the_quantizer_fails_on_is_its_own_category(tmp_path, capfd):
    _custom_op(tmp_path / "custom.onnx")
    record = run_one(str(tmp_path / "custom.onnx"), quantize="qdq")
    assert record["category"] == "quantize" and not record["passed"]
    assert record["reason"].startswith("onnxruntime quantization, quantize_static (qdq): ")
    assert "Frobnicate" in record["reason"] and "/tmp" not in record["reason"]
    # onnxruntime's pre-processing logs a traceback when it cannot optimize: held back.
    assert "Traceback" not in capfd.readouterr().err
    assert "quantize" in sweep.CATEGORIES


def test_records_of_another_variant_are_not_resumed(tmp_path):
    _linear(tmp_path / "linear.onnx")
    out = tmp_path / "sweep.json"
    sweep.sweep([str(tmp_path / "linear.onnx")], json_out=out, report_only=True, progress=False)
    with pytest.raises(UserError, match="made with no --quantize, this sweep runs with "):
        sweep.sweep([str(tmp_path / "linear.onnx")], json_out=out, quantize="qdq", progress=False)


def test_shared_initializers_get_a_copy_per_reader():
    """Exporters merge equal constants; onnxruntime's QOperator quantizer then writes an int8
    tensor where a QGemm needs its int32 bias (models/bert.onnx): each reader gets its own."""
    zero = numpy_helper.from_array(np.zeros(4, np.float32), "zero")
    shape = numpy_helper.from_array(np.array([4], np.int64), "shape")
    graph = helper.make_graph(
        [
            helper.make_node("Add", ["x", "zero"], ["a"]),
            helper.make_node("Add", ["a", "zero"], ["b"]),
            helper.make_node("Reshape", ["b", "shape"], ["c"]),
            helper.make_node("Reshape", ["c", "shape"], ["y"]),
        ],
        "shared",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
        [zero, shape],
    )
    model = helper.make_model(graph)
    assert unshare_initializers(model) == 1  # the float one; int64 shapes stay shared
    first, second = model.graph.node[0], model.graph.node[1]
    assert first.input[1] == "zero" and second.input[1] == "zero_copy1"
    assert [n.input[1] for n in model.graph.node[2:]] == ["shape", "shape"]
    onnx.checker.check_model(model)


def test_the_same_model_quantizes_to_the_same_bytes(tmp_path):
    _linear(tmp_path / "linear.onnx")
    for variant in ("qdq", "qop", "dynamic"):
        first = quantize_model(tmp_path / "linear.onnx", variant).SerializeToString()
        assert quantize_model(tmp_path / "linear.onnx", variant).SerializeToString() == first
