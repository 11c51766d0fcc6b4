"""MaxPool whose one window's band does not fit SBUF (codegen/lower/pool.py band_steps).

A 30x40 window dilated 10, strided 10, spans 291x391 fp32 (455 KB per partition); the band
keeps the input positions 10 apart, which are all any window reads.
"""

from __future__ import annotations

import json

import onnx
from onnx import TensorProto, helper

from onnx2bir.bir.enums import Dtype
from onnx2bir.cli.commands import main
from onnx2bir.codegen.lower import pool
from onnx2bir.codegen.spatial import WindowGeometry


def _model(tmp_path, h=420, w=500) -> str:
    node = helper.make_node(
        "MaxPool",
        ["x"],
        ["y"],
        kernel_shape=[30, 40],
        dilations=[10, 10],
        strides=[10, 10],
        pads=[10, 20, 10, 20],
    )
    out_h = (h + 20 - 291) // 10 + 1
    out_w = (w + 40 - 391) // 10 + 1
    graph = helper.make_graph(
        [node],
        "lattice",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, h, w])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, out_h, out_w])],
    )
    path = tmp_path / "maxpool_lattice.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), path)
    return str(path)


def _validate(capsys, path, *args) -> tuple[int, dict]:
    code = main(["validate", path, "--json", *args])
    return code, json.loads(capsys.readouterr().out)


def test_the_band_keeps_the_lattice_only_when_the_dense_band_does_not_fit():
    geo = WindowGeometry(420, 500, 16, 15, 30, 40, 10, 10, 10, 10, 10, 20)
    budget = pool.POOL_BAND_BYTES
    assert geo.rows_needed(1) * geo.cols_needed(1) * 4 > budget
    assert pool.band_steps(geo, Dtype.FP32, budget) == (10, 10)
    assert pool.band_extent(geo, 1, 1, (10, 10)) == 30 * 40
    small = WindowGeometry(8, 8, 4, 4, 3, 3, 2, 2, 2, 2, 1, 1)
    assert pool.band_steps(small, Dtype.FP32, budget) == (1, 1)


def test_a_maxpool_whose_band_does_not_fit_one_tile_is_exact(tmp_path, capsys):
    path = _model(tmp_path)
    code, doc = _validate(capsys, path, "--auto-cast", "none")
    [out] = doc["outputs"]
    assert code == 0 and out["mismatches"] == 0 and out["max_abs_err"] == 0


def test_a_band_on_the_wrong_lattice_fails(tmp_path, capsys, monkeypatch):
    """Reading the lattice's rows but the dense band's columns (column step 1) picks the
    wrong inputs: the verdict fails."""
    path = _model(tmp_path)

    def wrong(cg, band, at, partitions, band_cols, rows, cols, src, src_at, plane, in_w, steps):
        return original(
            cg, band, at, partitions, band_cols, rows, cols, src, src_at, plane, in_w, (steps[0], 1)
        )

    original = pool._read_lattice_band
    monkeypatch.setattr(pool, "_read_lattice_band", wrong)
    code, doc = _validate(capsys, path, "--auto-cast", "none")
    assert code == 1 and doc["outputs"][0]["mismatches"] > 0
