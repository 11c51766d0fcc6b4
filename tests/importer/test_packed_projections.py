"""Packed projections split at import (frontend/packed_projections.py): a MatMul by a [D, 3D]
weight whose q, k and v the model takes apart (torch.nn.MultiheadAttention's
`Reshape → Transpose → Gather`, GPT-2's `Split`) becomes a MatMul per block of columns, each
followed by the views to the heads. A projection whose result is read whole stays. Checked
against onnxruntime."""

from __future__ import annotations

import numpy as np
from conftest import FP32_ATOL, FP32_RTOL, OnnxWriter
from onnx import helper

from onnx2bir.compiler import compile_model, import_graph
from onnx2bir.options import CompileOptions
from onnx2bir.runtime.machine.interpreter import run_function
from onnx2bir.runtime.oracle.ort import run_onnxruntime

S, H, D = 9, 2, 4
WIDTH = H * D


def _ops(model) -> list[str]:
    graph = import_graph(model)
    return [graph.node(n)["op_type"] for n in graph.topological_order()]


def _matches_onnxruntime(model) -> None:
    feeds = {"x": np.random.default_rng(0).standard_normal((S, 1, WIDTH)).astype(np.float32)}
    got = run_function(compile_model(model, CompileOptions(auto_cast="none")).module, feeds)
    for name, value in run_onnxruntime(model, feeds).items():
        np.testing.assert_allclose(got[name], value, rtol=FP32_RTOL, atol=FP32_ATOL)


def _packed(select: str = "gather", whole_reader: bool = False):
    """x [S, 1, D·H] → MatMul by a [D·H, 3·D·H] weight, bias → q, k, v → their heads
    [1, H, S, D] → scores → Softmax → P·v, as nn.MultiheadAttention exports it."""
    rng = np.random.default_rng(1)
    w = OnnxWriter()
    x = w.input("x", (S, 1, WIDTH))
    weight = w.const(rng.standard_normal((WIDTH, 3 * WIDTH)))
    bias = w.const(rng.standard_normal(3 * WIDTH))
    packed = w.op("Add", [bias, w.op("MatMul", [x, weight])], name="in")
    if select == "gather":
        parts = w.op("Transpose", [w.reshape(packed, (S, 1, 3, WIDTH))], perm=[2, 0, 1, 3])
        q, k, v = (w.op("Gather", [parts, w.const(i, np.int64)], axis=0) for i in range(3))
    else:
        q, k, v = (f"part{i}" for i in range(3))
        sizes = w.const(np.array([WIDTH] * 3), np.int64)
        w.nodes.append(helper.make_node("Split", [packed, sizes], [q, k, v], axis=2))
    heads = [
        w.reshape(w.op("Transpose", [w.reshape(t, (S, H, D))], perm=[1, 0, 2]), (1, H, S, D))
        for t in (q, k, v)
    ]
    kt = w.op("Transpose", [heads[1]], perm=[0, 1, 3, 2])
    p = w.op("Softmax", [w.op("MatMul", [heads[0], kt])], axis=-1)
    out = w.op("MatMul", [p, heads[2]])
    extra = [w.op("Relu", [packed])] if whole_reader else []
    return w.model(out, extra_outputs=extra)


def test_a_gathered_packed_projection_becomes_three():
    model = _packed()
    ops = _ops(model)
    assert ops.count("MatMul") == 5 and "Gather" not in ops
    _matches_onnxruntime(model)


def test_a_split_packed_projection_becomes_three():
    model = _packed("split")
    ops = _ops(model)
    assert ops.count("MatMul") == 5 and "Split" not in ops
    _matches_onnxruntime(model)


def test_a_projection_read_whole_stays_packed():
    model = _packed(whole_reader=True)
    assert _ops(model).count("MatMul") == 3
    _matches_onnxruntime(model)
