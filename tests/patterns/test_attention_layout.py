"""Attention blocks whose scores are viewed with other batch dims (BLOOM, Swin, DeBERTa),
grouped-query K/V read once per group, the packaging the raise emits, and Softmaxes no
pattern matches listed with their reason (docs/attention_kernel.md#packaging).

Each raised block runs on the machine and is compared with onnxruntime running the model.
The kernel stores q, kᵀ, v and P in bf16: the bound is the kernel tests' half-storage bound,
atol = (1 + √D·s)·u·max|v| and rtol = 2u (u = 2^-8), and each test shows that a wrong answer
of the kind a wrong layout gives (heads or windows exchanged) is outside it.

The raise's sequence gate (> 1007 tokens) is lowered for these small blocks; every other gate
applies."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from conftest import OnnxWriter

from onnx2bir.compiler import compile_graph
from onnx2bir.frontend.importer import import_model
from onnx2bir.options import CompileOptions
from onnx2bir.patterns.attention import raising
from onnx2bir.patterns.attention.layout import map_to, refine
from onnx2bir.patterns.attention.raising import LowerToCustomNativeKernel
from onnx2bir.runtime.machine.interpreter import run_function
from onnx2bir.runtime.oracle.ort import run_onnxruntime

RAISE = CompileOptions(
    enable_native_kernel_attention=True, enable_native_kernel_attention_bf16=True, auto_cast="none"
)
U = 2.0**-8  # bf16 unit roundoff


@pytest.fixture(autouse=True)
def short_blocks_raise(monkeypatch):
    monkeypatch.setattr(raising, "MIN_SEQUENCE", 0)


def feeds_for(model, seed=0):
    rng = np.random.default_rng(seed)
    return {
        i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(
            np.float32
        )
        for i in model.graph.input
    }


def raise_and_run(model, feeds):
    compiled = compile_graph(import_model(model), RAISE, [LowerToCustomNativeKernel()])
    (finding,) = [
        f for f in compiled.passes.result_of("LowerToCustomNativeKernel").findings if f["target"]
    ]
    got = run_function(compiled.module, feeds)
    return compiled, finding, next(iter(got.values()))


def within_bound(got, expected, d, scale, v):
    atol = (1 + math.sqrt(d) * scale) * U * float(np.abs(v).max())
    return bool(np.all(np.abs(got - expected) <= atol + 2 * U * np.abs(expected)))


def kernel_node(compiled):
    (node,) = [d for _, d in compiled.graph.nodes() if d["op_type"] == "CustomCall"]
    return node


def test_refinement_of_views():
    assert refine([(8, 3), (2, 4, 3), (8, 3)]) == (2, 4, 3)
    assert refine([(4,), (1, 4)]) == (4,)
    assert refine([(2, 3), (3, 2)]) is None  # cuts at 2 and 3 of 6 do not nest
    # Swin's window mask [1, nW, 1] in [B, nW, H], laid out in the refinement (2, 4, 3).
    assert map_to((2, 4, 3), (2, 4, 3), (1, 4, 1)) == (1, 4, 1)
    # BLOOM's ALiBi bias [B·H, 1, S] read in the [B·H] view: full, so (B, H) in the refinement.
    assert map_to((2, 4), (8,), (8,)) == (2, 4)
    assert map_to((2, 4), (2, 4), (2, 1)) == (2, 1)


def bloom_block(batch=2, heads=4, seq=16, d=8):
    """BLOOM's eager attention: ALiBi added to [B·H, S, S] scores (baddbmm), viewed as
    [B, H, S, S] for the mask, softmax, then the probabilities against v [B, H, S, D]."""
    g = OnnxWriter()
    q = g.input("q", (batch * heads, seq, d))
    kt = g.input("kt", (batch * heads, d, seq))
    alibi = g.input("alibi", (batch * heads, 1, seq))
    mask = g.input("mask", (batch, 1, seq, seq))
    v = g.input("v", (batch, heads, seq, d))
    s = g.op("MatMul", [q, kt], name="qk")
    s = g.op("Mul", [s, g.const(d**-0.5)])
    s = g.op("Add", [s, alibi])
    s = g.reshape(s, [batch, heads, seq, seq])
    s = g.op("Add", [s, mask])
    p = g.op("Softmax", [s], axis=-1)
    return g.model(g.op("MatMul", [p, v], name="pv")), d**-0.5


def test_bloom_alibi_through_a_view_is_raised_and_runs():
    model, scale = bloom_block()
    feeds = feeds_for(model)
    compiled, finding, got = raise_and_run(model, feeds)
    assert "scores viewed as [2, 4]" in finding["variant"]
    node = kernel_node(compiled)
    shapes = [tuple(compiled.graph.tensors[t].shape) for t in node["inputs"]]
    # The kernel's batch layout is (B, H): q, kᵀ and the bias are reshaped out of [B·H].
    assert shapes[0] == (2, 4, 16, 8) and shapes[1] == (2, 4, 8, 16) and shapes[3] == (2, 4, 1, 16)
    (expected,) = run_onnxruntime(model, feeds).values()
    assert within_bound(got, expected, 8, scale, feeds["v"])
    # Heads exchanged between the two batch rows (what reading [B·H] as [H, B] gives) fails.
    wrong = expected.reshape(2, 4, 16, 8)[::-1].reshape(expected.shape)
    assert not within_bound(wrong, expected, 8, scale, feeds["v"])


def swin_block(batch=2, windows=4, heads=3, n=9, d=8):
    """Swin's shifted-window attention: relative position bias on [B·nW, H, N, N] scores,
    viewed as [B, nW, H, N, N] for the window mask, and back."""
    g = OnnxWriter()
    rng = np.random.default_rng(1)
    q = g.input("q", (batch * windows, heads, n, d))
    k = g.input("k", (batch * windows, heads, n, d))
    v = g.input("v", (batch * windows, heads, n, d))
    window_mask = np.where(rng.random((1, windows, 1, n, n)) < 0.3, -100.0, 0.0)
    s = g.op("MatMul", [q, g.op("Transpose", [k], perm=[0, 1, 3, 2])], name="qk")
    s = g.op("Add", [s, g.const(rng.standard_normal((heads, n, n)))])
    s = g.reshape(s, [batch, windows, heads, n, n])
    s = g.op("Add", [s, g.const(window_mask)])
    s = g.reshape(s, [batch * windows, heads, n, n])
    p = g.op("Softmax", [s], axis=-1)
    return g.model(g.op("MatMul", [p, v], name="pv"))


def test_swin_shifted_window_views_are_raised_and_run():
    model = swin_block()
    feeds = feeds_for(model)
    compiled, finding, got = raise_and_run(model, feeds)
    assert "scores viewed as [2, 4, 3]" in finding["variant"]
    node = kernel_node(compiled)
    shapes = [tuple(compiled.graph.tensors[t].shape) for t in node["inputs"]]
    assert shapes[0] == (2, 4, 3, 9, 8)  # the refinement [B, nW, H] of [B·nW, H]
    assert shapes[4] == (1, 4, 1, 9, 9)  # the window mask broadcast over B and H
    (expected,) = run_onnxruntime(model, feeds).values()
    assert within_bound(got, expected, 8, 1.0, feeds["v"])
    # The window mask applied to the wrong windows (B and nW read the other way round) fails.
    wrong = expected.reshape(2, 4, 3, 9, 8).transpose(1, 0, 2, 3, 4).reshape(expected.shape)
    assert not within_bound(wrong, expected, 8, 1.0, feeds["v"])


def test_views_that_do_not_nest_are_listed_with_the_reason():
    g = OnnxWriter()
    q = g.input("q", (6, 4, 8))
    kt = g.input("kt", (6, 8, 4))
    v = g.input("v", (3, 2, 4, 8))
    s = g.op("MatMul", [q, kt], name="qk")
    s = g.op("Add", [s, g.input("bias", (6, 1, 4))])
    s = g.reshape(s, [3, 2, 4, 4])
    s = g.op("Add", [s, g.input("mask", (3, 1, 4, 4))])
    p = g.op("Softmax", [s], axis=-1)
    model = g.model(g.op("MatMul", [p, v], name="pv"))
    graph = import_model(model)
    (finding,) = LowerToCustomNativeKernel().run(graph, RAISE).findings
    assert finding["target"] is not None  # [6] and [3, 2] nest: cut at 3 and 6
    g2 = OnnxWriter()
    q = g2.input("q", (2, 3, 4, 8))
    kt = g2.input("kt", (2, 3, 8, 4))
    v = g2.input("v", (3, 2, 4, 8))
    s = g2.op("MatMul", [q, kt], name="qk")
    s = g2.op("Add", [s, g2.input("bias", (2, 1, 4, 4))])
    s = g2.reshape(s, [3, 2, 4, 4])
    p = g2.op("Softmax", [s], axis=-1)
    model = g2.model(g2.op("MatMul", [p, v], name="pv"))
    (finding,) = LowerToCustomNativeKernel().run(import_model(model), RAISE).findings
    assert finding["status"] == "refused" and "do not nest" in finding["reason"]
    assert "[2, 3]" in finding["reason"] and "[3, 2]" in finding["reason"]


def gqa_block(batch=1, kv_heads=2, group=3, seq=16, d=8):
    """Llama's eager attention with repeat_kv: K and V [B, Hkv, S, D] unsqueezed, expanded to
    [B, Hkv, G, S, D] and reshaped to [B, Hkv·G, S, D]; Kᵀ by a Transpose after the repeat."""
    g = OnnxWriter()
    heads = kv_heads * group
    q = g.input("q", (batch, heads, seq, d))
    k = g.input("k", (batch, kv_heads, seq, d))
    v = g.input("v", (batch, kv_heads, seq, d))
    axes = g.const(np.array([2], np.int64), np.int64)
    target = g.const(np.array([batch, kv_heads, group, seq, d], np.int64), np.int64)

    def repeat(x):
        expanded = g.op("Expand", [g.op("Unsqueeze", [x, axes]), target])
        return g.reshape(expanded, [batch, heads, seq, d])

    kt = g.op("Transpose", [repeat(k)], perm=[0, 1, 3, 2])
    s = g.op("Mul", [g.op("MatMul", [q, kt], name="qk"), g.const(d**-0.5)])
    s = g.op("Add", [s, g.input("mask", (batch, 1, seq, seq))])
    p = g.op("Softmax", [s], axis=-1)
    return g.model(g.op("MatMul", [p, repeat(v)], name="pv")), d**-0.5


def test_grouped_query_kv_read_once_per_group_with_zero_stride_heads():
    model, scale = gqa_block()
    feeds = feeds_for(model)
    compiled, finding, got = raise_and_run(model, feeds)
    assert "read once per group (zero-stride heads)" in finding["variant"]
    node = kernel_node(compiled)
    shapes = [tuple(compiled.graph.tensors[t].shape) for t in node["inputs"]]
    # q viewed as [Hkv, G, S, D] (B = 1 broadcasts); K and V un-expanded, [B, Hkv, 1, ...]:
    # never repeated.
    assert shapes[0] == (2, 3, 16, 8)
    assert shapes[1] == (1, 2, 1, 8, 16) and shapes[2] == (1, 2, 1, 16, 8)
    assert "Expand" not in compiled.graph.op_counts()
    (expected,) = run_onnxruntime(model, feeds).values()
    assert within_bound(got, expected, 8, scale, feeds["v"])
    # K/V heads shared across the wrong query heads (h = g·Hkv + kv instead of kv·G + g) fail.
    heads = expected.reshape(1, 2, 3, 16, 8)
    wrong = heads.reshape(1, 6, 16, 8)[:, np.arange(6).reshape(3, 2).T.reshape(-1)]
    assert not within_bound(wrong.reshape(expected.shape), expected, 8, scale, feeds["v"])


def test_packaging_is_the_seeds_and_its_identities_cost_nothing():
    g = OnnxWriter()
    q, k, v = (g.input(n, (1, 2, 16, 8)) for n in "qkv")
    s = g.op("MatMul", [q, g.op("Transpose", [k], perm=[0, 1, 3, 2])], name="qk")
    s = g.op("Add", [g.op("Mul", [s, g.const(0.25)]), g.input("mask", (1, 1, 16, 16))])
    p = g.op("Softmax", [s], axis=-1)
    model = g.model(g.op("MatMul", [p, v], name="pv"))
    graph = import_model(model)
    (finding,) = LowerToCustomNativeKernel().run(graph, RAISE).findings
    # q, kᵀ, v, the mask and the output reshaped; q, kᵀ, v transposed and cast, the output
    # cast back: 1 CustomCall + 5 Reshape + 3 Transpose (+ the cast policy's 4 Casts).
    assert finding["packaging"] == {"Cast": 4, "Reshape": 5, "Transpose": 3}
    assert graph.op_counts()["Reshape"] == 5
    compiled = compile_graph(import_model(model), RAISE, [LowerToCustomNativeKernel()])
    # None of them changes anything here: the code generator dropped them all; the Cast back
    # to fp32 reads the kernel's output itself.
    assert compiled.graph.op_counts()["Reshape"] == 0
    assert compiled.graph.op_counts()["Transpose"] == 1  # the model's own Kᵀ
    cast = compiled.graph.node(compiled.graph.producer(model.graph.output[0].name))
    assert compiled.graph.producer(cast["inputs"][0]) == "pv"
    feeds = feeds_for(model)
    got = next(iter(run_function(compiled.module, feeds).values()))
    (expected,) = run_onnxruntime(model, feeds).values()
    assert within_bound(got, expected, 8, 0.25, feeds["v"])


def test_class_attention_query_length_one_is_a_block():
    """CaiT's class attention: one class token against all tokens (seq_q 1, seq_k N+1)."""
    g = OnnxWriter()
    q = g.input("q", (1, 2, 1, 8))
    k = g.input("k", (1, 2, 17, 8))
    v = g.input("v", (1, 2, 17, 8))
    s = g.op(
        "MatMul", [g.op("Mul", [q, g.const(8**-0.5)]), g.op("Transpose", [k], perm=[0, 1, 3, 2])]
    )
    p = g.op("Softmax", [s], axis=-1)
    model = g.model(g.op("MatMul", [p, v], name="pv"))
    (finding,) = LowerToCustomNativeKernel().run(import_model(model), RAISE).findings
    assert finding["is_attention"] and (finding["seq_q"], finding["seq_k"]) == (1, 17)
    assert finding["target"] == raising.ATTENTION  # unequal lengths: the swap target
    compiled, _, got = raise_and_run(model, feeds := feeds_for(model))
    (expected,) = run_onnxruntime(model, feeds).values()
    assert within_bound(got, expected, 8, 8**-0.5, feeds["v"])


def test_talking_heads_softmax_is_listed_with_the_ops_around_it():
    """CaiT's talking heads: the scores mixed across heads by a constant matmul before and
    after the softmax. Not the kernel's form, and listed, never silent."""
    g = OnnxWriter()
    rng = np.random.default_rng(2)
    q, k, v = (g.input(n, (1, 2, 16, 8)) for n in "qkv")
    s = g.op("MatMul", [q, g.op("Transpose", [k], perm=[0, 1, 3, 2])], name="qk")
    mix = g.op("MatMul", [g.op("Transpose", [s], perm=[0, 2, 3, 1]), g.const(rng.random((2, 2)))])
    s = g.op("Transpose", [g.op("Add", [mix, g.const(rng.random(2))])], perm=[0, 3, 1, 2])
    p = g.op("Softmax", [s], name="softmax", axis=-1)
    mix = g.op("MatMul", [g.op("Transpose", [p], perm=[0, 2, 3, 1]), g.const(rng.random((2, 2)))])
    p = g.op("Transpose", [mix], perm=[0, 3, 1, 2])
    model = g.model(g.op("MatMul", [p, v], name="pv"))
    (finding,) = LowerToCustomNativeKernel().run(import_model(model), RAISE).findings
    assert finding["status"] == "refused" and "softmax" in finding["nodes"]
    assert (
        "'qk' → Transpose → MatMul by a constant → Add → Transpose → Softmax" in finding["reason"]
    )
    assert "talking heads" in finding["reason"] and "'pv'" in finding["reason"]


def test_a_classifier_softmax_is_listed_as_no_attention():
    g = OnnxWriter()
    x = g.input("x", (1, 16))
    logits = g.op("MatMul", [x, g.const(np.ones((16, 4)))])
    model = g.model(g.op("Softmax", [logits], name="softmax", axis=-1))
    (finding,) = LowerToCustomNativeKernel().run(import_model(model), RAISE).findings
    assert finding["status"] == "refused" and not finding["is_attention"]
    assert "no matmul of two computed operands feeds the Softmax" in finding["reason"]


def test_steps_json_keeps_the_bias_operand_order():
    model, _ = bloom_block()
    graph = import_model(model)
    LowerToCustomNativeKernel().run(graph, RAISE)
    (node,) = [d for _, d in graph.nodes() if d["op_type"] == "CustomCall"]
    steps = json.loads(node["attrs"]["steps"])
    assert [s["op"] for s in steps] == ["scale", "add", "add"]
    assert [s["input"] for s in steps if s["op"] == "add"] == [0, 1]
