"""FuseSoftmaxNanGuard (patterns/softmax_guard.py): the NaN guard `Where(IsNaN(P), c, P)` after
a Softmax runs in the softmax's rows, and rows that are NaN (a NaN or +inf in the row, a row of
−inf) come out as onnxruntime's: c."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import assert_matches_onnxruntime, make_model
from onnx import helper

from onnx2bir.codegen.lower.softmax import NAN_ROW_FILL
from onnx2bir.compiler import compile_graph, import_graph
from onnx2bir.options import CompileOptions
from onnx2bir.patterns.softmax_guard import FuseSoftmaxNanGuard

SHAPE = (2, 3, 40, 40)


def _guarded(fill: float = 0.0, extra_reader: bool = False):
    nodes = [
        helper.make_node("Softmax", ["s"], ["p"], name="softmax", axis=-1),
        helper.make_node("IsNaN", ["p"], ["bad"], name="isnan"),
        helper.make_node("Where", ["bad", "fill", "p"], ["y"], name="guard"),
    ]
    outputs = {"y": None}
    if extra_reader:
        nodes.append(helper.make_node("Cast", ["bad"], ["flags"], name="flags", to=1))
        outputs["flags"] = None
    fill_value = np.array(fill, dtype=np.float32)
    return make_model(nodes, {"s": SHAPE}, outputs, initializers={"fill": fill_value})


def _scores_with_bad_rows() -> np.ndarray:
    s = np.random.default_rng(0).standard_normal(SHAPE).astype(np.float32)
    s[0, 0, 3, :] = -np.inf  # a fully masked row
    s[0, 1, 7, 5] = np.nan
    s[1, 2, 39, 0] = np.inf
    s[1, 0, 0, :20] = -np.inf  # half masked: an ordinary row
    return s


def test_the_guard_runs_in_the_softmax():
    graph = compile_graph(import_graph(_guarded()), CompileOptions(auto_cast="none")).graph
    ops = {name: data["op_type"] for name, data in graph.nodes()}
    assert ops == {"softmax": "Softmax"}
    assert graph.node("softmax")["outputs"] == ["y"]
    assert graph.node("softmax")["attrs"][NAN_ROW_FILL] == 0.0


@pytest.mark.parametrize("fill", [0.0, -2.5])
def test_nan_rows_are_filled_as_onnxruntime_fills_them(fill):
    got = assert_matches_onnxruntime(_guarded(fill), feeds={"s": _scores_with_bad_rows()})
    y = got["y"] if "y" in got else got["y:output"]
    assert not np.isnan(y).any()
    assert np.all(y[0, 0, 3] == fill) and np.all(y[0, 1, 7] == fill) and np.all(y[1, 2, 39] == fill)


def test_a_guard_whose_test_is_read_elsewhere_stays():
    graph = import_graph(_guarded(extra_reader=True))
    result = FuseSoftmaxNanGuard().run(graph, CompileOptions())
    assert not result.changed
    assert "other readers" in result.findings[0]["reason"]
    assert_matches_onnxruntime(_guarded(extra_reader=True), feeds={"s": _scores_with_bad_rows()})
