"""Chains of Reshapes and Transposes collapse at import (frontend/view_chains.py) into the one
Transpose (or Reshape) they amount to: the dynamo exporter's key of
`scaled_dot_product_attention`, `Transpose(0, 2, 1, 3) → Reshape → Transpose(0, 2, 1) →
Reshape`, becomes the eager export's `Transpose(0, 2, 3, 1)`. A chain that does more than
permute, or whose middle tensor is read elsewhere, stays. Checked against onnxruntime."""

from __future__ import annotations

import numpy as np
from conftest import FP32_ATOL, FP32_RTOL, OnnxWriter

from onnx2bir.compiler import compile_model, import_graph
from onnx2bir.options import CompileOptions
from onnx2bir.runtime.machine.interpreter import run_function
from onnx2bir.runtime.oracle.ort import run_onnxruntime

B, S, H, D = 1, 9, 4, 8


def _nodes(model) -> list[tuple[str, list]]:
    graph = import_graph(model)
    return [
        (graph.node(n)["op_type"], list(graph.node(n)["attrs"].get("perm", [])))
        for n in graph.topological_order()
    ]


def _matches_onnxruntime(model) -> None:
    feeds = {"x": np.random.default_rng(0).standard_normal((B, S, H * D)).astype(np.float32)}
    got = run_function(compile_model(model, CompileOptions(auto_cast="none")).module, feeds)
    for name, value in run_onnxruntime(model, feeds).items():
        np.testing.assert_allclose(got[name], value, rtol=FP32_RTOL, atol=FP32_ATOL)


def _key_chain(extra_reader: bool = False, scramble: bool = False):
    """x [B, S, H·D] → heads [B, S, H, D] → the dynamo exporter's chain to kᵀ [B, H, D, S]."""
    w = OnnxWriter()
    heads = w.reshape(w.op("Relu", [w.input("x", (B, S, H * D))]), (B, S, H, D))
    per_head = w.op("Transpose", [heads], perm=[0, 2, 1, 3])
    merged = w.reshape(per_head, (B * H, S, D))
    flipped = w.op("Transpose", [merged], perm=[0, 2, 1])
    # scrambled: D·S elements of each head read back as [S, D], not a permutation of x
    key_t = w.reshape(flipped, (B, H, S, D) if scramble else (B, H, D, S))
    outputs = [w.op("Sigmoid", [key_t])]
    extra = [w.op("Tanh", [merged])] if extra_reader else []
    return w.model(outputs[0], extra_outputs=extra)


def test_the_dynamo_key_chain_becomes_one_transpose():
    model = _key_chain()
    assert _nodes(model) == [
        ("Relu", []),
        ("Reshape", []),
        ("Transpose", [0, 2, 3, 1]),
        ("Sigmoid", []),
    ]
    _matches_onnxruntime(model)


def test_a_chain_read_in_the_middle_collapses_only_after_it():
    model = _key_chain(extra_reader=True)
    ops = [op for op, _ in _nodes(model)]
    assert ops.count("Transpose") == 2 and "Tanh" in ops
    _matches_onnxruntime(model)


def test_a_chain_that_only_reshapes_becomes_one_reshape():
    w = OnnxWriter()
    x = w.op("Relu", [w.input("x", (B, S, H * D))])
    flat = w.reshape(w.reshape(w.reshape(x, (B, S, H, D)), (B * S, H, D)), (B, S * H * D))
    model = w.model(w.op("Sigmoid", [flat]))
    assert [op for op, _ in _nodes(model)] == ["Relu", "Reshape", "Sigmoid"]
    _matches_onnxruntime(model)


def test_a_transpose_then_its_inverse_disappears():
    w = OnnxWriter()
    x = w.op("Relu", [w.input("x", (B, S, H * D))])
    there = w.op("Transpose", [x], perm=[0, 2, 1])
    back = w.op("Transpose", [there], perm=[0, 2, 1])
    model = w.model(w.op("Sigmoid", [back]))
    assert [op for op, _ in _nodes(model)] == ["Relu", "Sigmoid"]
    _matches_onnxruntime(model)


def test_a_chain_that_is_not_a_permutation_is_kept():
    model = _key_chain(scramble=True)
    ops = [op for op, _ in _nodes(model)]
    assert ops.count("Transpose") >= 1 and ops.count("Reshape") >= 2
    _matches_onnxruntime(model)


def test_a_transpose_that_moves_a_unit_axis_becomes_a_reshape():
    """nn.MultiheadAttention's batch-first to sequence-first Transpose at batch 1."""
    w = OnnxWriter()
    x = w.op("Relu", [w.input("x", (B, S, H * D))])
    model = w.model(w.op("Sigmoid", [w.op("Transpose", [x], perm=[1, 0, 2])]))
    assert [op for op, _ in _nodes(model)] == ["Relu", "Reshape", "Sigmoid"]
    _matches_onnxruntime(model)


def test_multihead_attention_heads_become_reshape_then_transpose():
    """Reshape [S, H, D] → Transpose(1, 0, 2) → Reshape [1, H, S, D] is the eager export's
    Reshape [1, S, H, D] → Transpose(0, 2, 1, 3)."""
    w = OnnxWriter()
    x = w.op("Relu", [w.input("x", (B, S, H * D))])
    heads = w.op("Transpose", [w.reshape(x, (S, H, D))], perm=[1, 0, 2])
    model = w.model(w.op("Sigmoid", [w.reshape(heads, (1, H, S, D))]))
    assert _nodes(model) == [
        ("Relu", []),
        ("Reshape", []),
        ("Transpose", [0, 2, 1, 3]),
        ("Sigmoid", []),
    ]
    _matches_onnxruntime(model)
