"""`onnx2bir sweep --merge`: a sweep of a few models keeps the other rows of the page, and the
page reads back into the records it shows."""

from __future__ import annotations

import datetime
import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx2bir.cli.commands import main
from onnx2bir.sweep import run as sweep
from onnx2bir.sweep.table import markdown, parse


def _add(path, value: float = 1.0) -> None:
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "b"], ["y"])],
        "add",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])],
        [numpy_helper.from_array(np.full((4, 8), value, np.float32), "b")],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def _det(path) -> None:
    graph = helper.make_graph(
        [helper.make_node("Det", ["x"], ["y"])],
        "det",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def _rows(table: str) -> list[str]:
    return [line for line in table.splitlines() if line.startswith("| ")]


def test_the_page_reads_back_into_the_records_it_shows(tmp_path):
    _add(tmp_path / "add.onnx")
    _det(tmp_path / "det.onnx")
    (tmp_path / "bad.export-error").write_text("RuntimeError: a | b cannot trace\n")
    records, summary = sweep.sweep([str(tmp_path)], progress=False)
    table = markdown(records, summary)
    back = parse(table)
    assert [r["model"] for r in back] == ["add", "bad", "det"]
    assert markdown(back, summary) == table  # every shown field survives the round trip
    by_name = {r["model"]: r for r in back}
    assert by_name["bad"]["reason"] == "RuntimeError: a | b cannot trace"
    assert by_name["det"]["category"] == "unsupported op" and not by_name["det"]["passed"]
    assert by_name["add"]["passed"] and by_name["add"]["ops"] == 1
    today = datetime.datetime.now(datetime.UTC).date().isoformat()
    assert all(r["measured"] == today for r in back)


def test_merge_keeps_the_rows_of_models_not_swept_this_time(tmp_path):
    zoo, md = tmp_path / "zoo", tmp_path / "zoo.md"
    zoo.mkdir()
    _add(zoo / "first.onnx")
    _det(zoo / "second.onnx")
    assert main(["sweep", str(zoo), "--md", str(md), "--no-progress"]) == 1
    # A stand-in measurement day, to tell kept rows from new ones.
    md.write_text(
        md.read_text().replace(
            datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d"), "2020-01-02"
        )
    )
    old = {r["model"]: r for r in parse(md.read_text())}
    _add(zoo / "third.onnx", 2.0)
    _add(zoo / "second.onnx")  # second now passes: its row is replaced, first's is kept
    code = main(
        ["sweep", str(zoo / "second.onnx"), str(zoo / "third.onnx"), "--md", str(md), "--merge"]
        + ["--no-progress"]
    )
    assert code == 0  # this sweep's models all passed
    table = md.read_text()
    new = {r["model"]: r for r in parse(table)}
    assert sorted(new) == ["first", "second", "third"]
    assert new["first"] == old["first"] and new["first"]["measured"] == "2020-01-02"
    assert new["second"]["passed"] and new["second"]["measured"] != "2020-01-02"
    assert "**3 of 3 architectures validate (100.0%)**" in table
    # The JSON keeps its other records too, and its record beats the page's row.
    out_json = tmp_path / "zoo.json"
    assert main(["sweep", str(zoo), "--json", str(out_json), "--no-progress"]) == 0
    first = json.loads(out_json.read_text())["models"][0]
    assert first["model"] == "first" and first["path"]
    code = main(
        ["sweep", str(zoo / "third.onnx"), "--json", str(out_json), "--md", str(md), "--merge"]
    )
    assert code == 0
    doc = json.loads(out_json.read_text())
    assert [r["model"] for r in doc["models"]] == ["first", "second", "third"]
    assert doc["models"][0] == first and doc["summary"]["models"] == 3
    # Without --merge the page holds this sweep only.
    assert main(["sweep", str(zoo / "third.onnx"), "--md", str(md), "--no-progress"]) == 0
    assert [r["model"] for r in parse(md.read_text())] == ["third"]


def test_merge_needs_a_page_and_a_page_must_be_a_sweep_table(tmp_path, capsys):
    _add(tmp_path / "add.onnx")
    assert main(["sweep", str(tmp_path / "add.onnx"), "--merge"]) == 2
    assert "--merge" in capsys.readouterr().err
    md = tmp_path / "page.md"
    md.write_text(
        "| architecture | source | family | ops (types) | verdict |\n"
        "| --- | --- | --- | --- | --- |\n| x | timm | cnn | many | pass |\n"
    )
    assert main(["sweep", str(tmp_path / "add.onnx"), "--md", str(md), "--merge"]) == 2
    assert "page.md:3: not a sweep table row" in capsys.readouterr().err


def test_a_page_without_the_measured_column_still_reads(tmp_path):
    page = (
        "| architecture | source | family | ops (types) | convs matched | attention | MLP "
        "| verdict | max abs err | compile s | simulate s | onnxruntime s |\n"
        + "|"
        + " --- |" * 12
        + "\n"
        "| tv_resnet18 | torchvision | cnn | 49 (7) | 8/20 | 0 | 0 | pass | 7.15e-07 "
        "| 0.2 | 0.6 | 0.2 |\n"
    )
    (record,) = parse(page)
    assert record["convs"] == {"matched": 8, "total": 20} and record["measured"] is None
    assert record["max_abs_err"] == pytest.approx(7.15e-07)
    assert record["times"] == {"compile": 0.2, "simulate": 0.6, "onnxruntime": 0.2}
