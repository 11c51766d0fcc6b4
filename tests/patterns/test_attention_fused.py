"""Fused attention ops as attention blocks: found, gated, raised with their packaging and run on
the machine against onnxruntime, or refused with the reason and decomposed.

Tolerance of a raised block (bf16 storage of q, kᵀ, v and P, fp32 accumulation and softmax
statistics): with u = 2^-8 and the scale s = 1/√D, a logit is off by about √D·s·u = u and
O = P·v / Σ P moves by about (u + u)·max|v|; the tests allow atol = 2u·max|v|, rtol = 2u, as
the kernel tests derive it (tests/kernels/test_attention_kernel.py).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from onnx import TensorProto
from test_decompose import F, make_model

import onnx2bir.patterns.attention.decompose as decompose
from onnx2bir.compiler import compile_graph
from onnx2bir.frontend.importer import import_model
from onnx2bir.kernels import KERNELS
from onnx2bir.options import CompileOptions
from onnx2bir.runtime.machine.interpreter import run_function
from onnx2bir.runtime.oracle.compare import compare_output
from onnx2bir.runtime.oracle.ort import run_onnxruntime, synthesize_inputs

# The raise is under test, not the general autocast: the decomposed math stays fp32.
RAISE = CompileOptions(
    enable_native_kernel_attention=True,
    enable_native_kernel_attention_bf16=True,
    auto_cast="none",
)
U = 2.0**-8


def validate(model, options=RAISE, feeds=None, half=True):
    """Compile with the default passes, run the BIR, compare; returns (compilation, findings)."""
    graph = import_model(model)
    feeds = feeds or synthesize_inputs(graph, 0)
    expected = run_onnxruntime(model, feeds)["y"]
    compiled = compile_graph(graph, options)
    got = run_function(compiled.module, feeds)
    got = got["y"] if "y" in got else got["y:output"]
    atol, rtol = (2 * U * np.abs(feeds["v"]).max(), 2 * U) if half else (1e-4, 1e-3)
    result = compare_output("y", got, expected, atol, rtol)
    assert result.passed, result.to_json()
    findings = compiled.passes.result_of("LowerToCustomNativeKernel").findings
    return compiled, findings


def custom_calls(graph):
    return [d for _, d in graph.nodes() if d["op_type"] == "CustomCall"]


def test_opset23_attention_gqa_causal_long_sequence_raised_and_validates():
    """Sequence 1040 > 1007: raised to the causal kernel; 4 query heads share 2 K/V heads."""
    model = make_model(
        "Attention",
        {"q": (F, [1, 4, 1040, 32]), "k": (F, [1, 2, 1040, 32]), "v": (F, [1, 2, 1040, 32])},
        {"is_causal": 1},
    )
    compiled, (entry,) = validate(model)
    assert entry["status"] == "raised"
    assert entry["target"] == "CausalAttentionMMSoftmaxMMWithoutSwap"
    assert entry["source"] == "onnx.Attention"
    assert "grouped-query 4/2 heads" in entry["variant"] and "is_causal" in entry["variant"]
    # q to [B, Hkv, r, S, D], K transposed to Kᵀ, V and the output regrouped; bf16 casts.
    assert entry["packaging"] == {"Cast": 4, "Reshape": 4, "Transpose": 1}
    (call,) = custom_calls(compiled.graph)
    shapes = [tuple(compiled.graph.tensors[t].shape) for t in call["inputs"]]
    assert shapes == [(1, 2, 2, 1040, 32), (1, 2, 1, 32, 1040), (1, 2, 1, 1040, 32)]
    assert json.loads(call["attrs"]["steps"])[-1] == {"op": "causal"}


def test_opset23_attention_3d_bool_mask_raised_with_packaging():
    rng = np.random.default_rng(1)
    mask = rng.random((1030, 1030)) < 0.9
    model = make_model(
        "Attention",
        {
            "q": (F, [1, 1030, 64]),
            "k": (F, [1, 1030, 64]),
            "v": (F, [1, 1030, 64]),
            "m": (TensorProto.BOOL, [1030, 1030]),
        },
        {"q_num_heads": 2, "kv_num_heads": 2},
    )
    graph = import_model(model)
    feeds = {**synthesize_inputs(graph, 0), "m": mask}
    compiled, (entry,) = validate(model, feeds=feeds)
    assert entry["target"] == "AttentionMMSoftmaxMMWithoutSwap"
    assert "bool attn_mask" in entry["variant"]
    # [B, S, H·D] → Reshape + Transpose per operand and back for the output.
    assert entry["packaging"]["Reshape"] == 4 and entry["packaging"]["Transpose"] == 4


def test_float_mask_and_custom_scale():
    model = make_model(
        "Attention",
        {
            "q": (F, [1, 2, 1024, 16]),
            "k": (F, [1, 2, 1024, 16]),
            "v": (F, [1, 2, 1024, 16]),
            "m": (F, [1024, 1024]),
        },
        {"scale": 0.2},
    )
    _, (entry,) = validate(model)
    assert entry["status"] == "raised" and "float attn_mask" in entry["variant"]


def test_ms_multihead_attention_unidirectional_raised():
    model = make_model(
        "MultiHeadAttention",
        {"q": (F, [1, 1024, 64]), "k": (F, [1, 1024, 64]), "v": (F, [1, 1024, 64])},
        {"num_heads": 2, "unidirectional": 1},
        domain="com.microsoft",
        opset=18,
        out_shape=[1, 1024, 64],
    )
    _, (entry,) = validate(model)
    assert entry["source"] == "com.microsoft.MultiHeadAttention"
    assert entry["target"] == "CausalAttentionMMSoftmaxMMWithoutSwap"


@pytest.mark.parametrize(
    "attrs, options, reason",
    [
        ({}, CompileOptions(auto_cast="none"), "enable-native-kernel-attention is off"),
        ({}, RAISE, "sequence 16 <= 1007"),
        (
            {"softcap": 5.0},
            RAISE,
            "softcap needs a tanh score step the kernel does not have "
            "(DecomposeAttention expands it)",
        ),
    ],
)
def test_refused_fused_blocks_are_decomposed_and_validate(attrs, options, reason):
    seq = 1024 if "softcap" in attrs else 16
    model = make_model(
        "Attention",
        {"q": (F, [1, 2, seq, 8]), "k": (F, [1, 2, seq, 8]), "v": (F, [1, 2, seq, 8])},
        attrs,
    )
    compiled, (entry,) = validate(model, options, half=False)
    assert entry["status"] == "refused" and entry["reason"] == reason
    (decomposed,) = compiled.passes.result_of("DecomposeAttention").findings
    assert decomposed["decomposed"]
    stats = {s.name: s.value for s in compiled.passes.statistics}
    assert stats["attention_fused_ops_found"] == 1 and stats["attention_blocks_raised"] == 0


def test_group_query_attention_is_listed_with_its_reason():
    from onnx2bir.patterns.attention.raising import LowerToCustomNativeKernel

    model = make_model(
        "GroupQueryAttention",
        {"q": (F, [1, 4, 64]), "k": (F, [1, 4, 32]), "v": (F, [1, 4, 32])},
        {"num_heads": 2, "kv_num_heads": 1},
        domain="com.microsoft",
        opset=18,
        out_shape=[1, 4, 64],
    )
    graph = import_model(model)
    (entry,) = LowerToCustomNativeKernel().run(graph, RAISE).findings
    assert entry["source"] == "com.microsoft.GroupQueryAttention"
    assert entry["status"] == "refused" and "GroupQueryAttention" in entry["reason"]


def test_round_trip_raised_block_without_its_kernel_is_decomposed_back(monkeypatch):
    """Raised to a target whose kernel is not registered: DecomposeAttention (the next pass)
    expands the CustomCall back to math, dropping the raise's casts, and it validates."""
    kernels = {k: v for k, v in KERNELS.items() if not k.startswith("Causal")}
    monkeypatch.setattr(decompose, "KERNELS", kernels)
    model = make_model(
        "Attention",
        {"q": (F, [1, 4, 1040, 16]), "k": (F, [1, 2, 1040, 16]), "v": (F, [1, 2, 1040, 16])},
        {"is_causal": 1},
    )
    compiled, (entry,) = validate(model, half=False)
    assert entry["status"] == "raised"
    (back,) = compiled.passes.result_of("DecomposeAttention").findings
    assert back["decomposed"] and back["target"] == "CausalAttentionMMSoftmaxMMWithoutSwap"
    ops = compiled.graph.op_counts()
    assert "CustomCall" not in ops and "Cast" not in ops and ops["Exp"] == 1
