"""LowerToCustomNativeKernel: one match and one no-match test per exported variant, the gates
in the seed's order, the target choice, and the cast policy's Casts around the raised node."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import OnnxWriter, assert_matches_onnxruntime
from onnx import TensorProto, helper

from onnx2bir.bir.enums import Dtype
from onnx2bir.frontend.importer import import_model
from onnx2bir.kernels.attention.plan import sb_shape
from onnx2bir.options import CompileOptions
from onnx2bir.patterns.attention.raising import (
    ATTENTION,
    ATTENTION_WITHOUT_SWAP,
    CAUSAL_ATTENTION_WITHOUT_SWAP,
    LowerToCustomNativeKernel,
)

B, H, D = 1, 2, 8
RAISE = CompileOptions(
    enable_native_kernel_attention=True, enable_native_kernel_attention_bf16=True
)


class Builder(OnnxWriter):
    """An attention graph with q, k, v inputs of `seq_q` and `seq_k` tokens."""

    def __init__(self, seq_q: int = 16, seq_k: int | None = None):
        super().__init__()
        self.sq, self.sk = seq_q, seq_k or seq_q

    def qkv(self):
        q = self.input("q", (B, H, self.sq, D))
        k = self.input("k", (B, H, self.sk, D))
        v = self.input("v", (B, H, self.sk, D))
        return q, k, v


DEFAULT = CompileOptions()


def run_pass(model, options=DEFAULT):
    graph = import_model(model)
    result = LowerToCustomNativeKernel().run(graph, options)
    return graph, result.findings


def core(b: Builder, scores, v, guard=False):
    p = b.op("Softmax", [scores], name="softmax", axis=-1)
    if guard:
        nan = b.op("IsNaN", [p])
        p = b.op("Where", [nan, b.const(0.0), p])
    return b.op("MatMul", [p, v], name="pv")


def standard(step_kinds=("mul",), guard=False, **builder):
    b = Builder(**builder)
    q, k, v = b.qkv()
    kt = b.op("Transpose", [k], perm=[0, 1, 3, 2])
    s = b.op("MatMul", [q, kt], name="qk")
    for kind in step_kinds:
        if kind == "mul":
            s = b.op("Mul", [s, b.const(D**-0.5)])
        elif kind == "div":
            s = b.op("Div", [s, b.const(D**0.5)])
        elif kind == "mask":
            s = b.op("Add", [s, b.input(f"mask{b.count}", (B, 1, 1, b.sk))])
        elif kind == "bias_const":
            s = b.op(
                "Add", [b.const(np.random.default_rng(0).standard_normal((1, H, b.sq, b.sk))), s]
            )
        elif kind == "causal_const":
            tri = np.triu(np.full((b.sq, b.sk), -1e9, np.float32), k=1)
            s = b.op("Add", [s, b.const(tri)])
        elif kind == "masked_fill":
            cond = b.const(np.triu(np.ones((b.sq, b.sk), bool), k=1), dtype=bool)
            s = b.op("Where", [cond, b.const(-np.inf), s])
        elif kind == "cast":
            s = b.op("Cast", [s], to=TensorProto.FLOAT)
    return b, b.model(core(b, s, v, guard))


@pytest.mark.parametrize(
    "steps, fragment",
    [
        (("mul",), "scale Mul(0.353553) after QK"),
        (("div",), "scale Div(2.82843) after QK"),
        ((), "no scale"),
        (("mul", "mask"), "additive mask/bias (runtime)"),
        (("mask", "mask"), "additive mask/bias (runtime), additive mask/bias (runtime)"),
        (("bias_const", "mask"), "additive mask/bias (constant)"),
        (("div", "masked_fill"), "causal masked_fill Where(-inf) (constant)"),
        (("mul", "causal_const"), "causal mask (constant)"),
        # an identity Cast is dropped at import (folding.drop_identity_nodes)
        (("cast", "mask"), "additive mask/bias (runtime)"),
    ],
)
def test_score_step_variants_match(steps, fragment):
    _, model = standard(steps)
    _, findings = run_pass(model)
    (block,) = findings
    assert block["is_attention"] and fragment in block["variant"]
    assert block["nodes"][0] == "qk" and "pv" in block["nodes"] and "softmax" in block["nodes"]


@pytest.mark.parametrize("casts", [1, 2])
def test_casts_after_the_softmax_do_not_hide_the_block(casts):
    """softmax(scores, dtype=float32).to(query.dtype), as transformers' eager attention writes
    it: Softmax → Cast → Cast → MatMul. An identity Cast must never hide an idiom: the import
    drops it (folding.drop_identity_nodes), so the block is the plain one."""
    b = Builder()
    q, k, v = b.qkv()
    s = b.op("MatMul", [q, b.op("Transpose", [k], perm=[0, 1, 3, 2])], name="qk")
    p = b.op("Softmax", [b.op("Mul", [s, b.const(D**-0.5)])], name="softmax", axis=-1)
    for _ in range(casts):
        p = b.op("Cast", [p], to=TensorProto.FLOAT)
    model = b.model(b.op("MatMul", [p, v], name="pv"))
    _, findings = run_pass(model)
    (block,) = findings
    assert block["is_attention"] and "Cast" not in block["variant"]
    assert "pv" in block["nodes"] and len(block["nodes"]) >= 4
    assert_matches_onnxruntime(model)


def test_a_cast_of_the_probabilities_to_integers_is_not_attention():
    b = Builder()
    q, k, v = b.qkv()
    s = b.op("MatMul", [q, b.op("Transpose", [k], perm=[0, 1, 3, 2])], name="qk")
    p = b.op("Softmax", [s], name="softmax", axis=-1)
    p = b.op("Cast", [b.op("Cast", [p], to=TensorProto.INT32)], to=TensorProto.FLOAT)
    _, findings = run_pass(b.model(b.op("MatMul", [p, v], name="pv")))
    assert not any(f.get("is_attention") for f in findings)


def test_nan_guard_after_softmax_is_part_of_the_block():
    _, model = standard(("mul", "mask"), guard=True)
    _, (block,) = run_pass(model)
    assert "NaN guard after softmax" in block["variant"] and len(block["nodes"]) == 7


def test_scale_folded_into_q_and_split_over_q_and_k():
    b = Builder()
    q, k, v = b.qkv()
    q_scaled = b.op("Mul", [q, b.const(D**-0.5)])
    kt = b.op("Transpose", [k], perm=[0, 1, 3, 2])
    _, (block,) = run_pass(b.model(core(b, b.op("MatMul", [q_scaled, kt], name="qk"), v)))
    assert "scale folded into Q" in block["variant"]
    b = Builder()
    q, k, v = b.qkv()
    root = D**-0.25
    kt = b.op("Mul", [b.op("Transpose", [k], perm=[0, 1, 3, 2]), b.const(root)])
    qs = b.op("Mul", [q, b.const(root)])
    _, (block,) = run_pass(b.model(core(b, b.op("MatMul", [qs, kt], name="qk"), v)))
    assert "scale split as √scale on Q and Kᵀ" in block["variant"]


def test_heads_split_packed_qkv_and_k_transpose_chain():
    b = Builder()
    x = b.input("x", (B, 16, 3 * H * D))
    q, k, v = (
        b.op(
            "Transpose",
            [b.op("Reshape", [part, b.const([B, 16, H, D], np.int64)])],
            perm=[0, 2, 1, 3],
        )
        for part in b.op_multi("Split", [x], 3, axis=2, num_outputs=3)
    )
    flat = b.op("Reshape", [k, b.const([B * H, 16, D], np.int64)])
    kt = b.op(
        "Reshape", [b.op("Transpose", [flat], perm=[0, 2, 1]), b.const([B, H, D, 16], np.int64)]
    )
    _, (block,) = run_pass(b.model(core(b, b.op("MatMul", [q, kt], name="qk"), v)))
    # the import collapses the key's Transpose/Reshape chain into one Transpose
    # (frontend/view_chains.py)
    for fragment in (
        "packed QKV (Split)",
        "heads split by Reshape/Transpose",
        "Kᵀ by Transpose(0, 2, 3, 1)",
    ):
        assert fragment in block["variant"]


def _op_multi(self, op_type, inputs, count, **attrs):
    outs = [f"t{self.count + i}" for i in range(count)]
    self.count += count
    self.nodes.append(helper.make_node(op_type, inputs, outs, **attrs))
    return outs


Builder.op_multi = _op_multi


def test_grouped_query_kv_by_expand():
    b = Builder()
    q = b.input("q", (B, 4, 16, D))
    k = b.input("k", (B, 2, 16, D))
    v = b.input("v", (B, 2, 16, D))

    def repeat(t):
        t = b.op("Unsqueeze", [t, b.const([2], np.int64)])
        t = b.op("Expand", [t, b.const([B, 2, 2, 16, D], np.int64)])
        return b.op("Reshape", [t, b.const([B, 4, 16, D], np.int64)])

    kt = b.op("Transpose", [repeat(k)], perm=[0, 1, 3, 2])
    _, (block,) = run_pass(b.model(core(b, b.op("MatMul", [q, kt], name="qk"), repeat(v))))
    assert "grouped-query K/V (Expand)" in block["variant"]


# --- no-match ------------------------------------------------------------------------------------
def test_softmax_over_another_axis_is_not_attention():
    b = Builder()
    q, k, v = b.qkv()
    s = b.op("MatMul", [q, b.op("Transpose", [k], perm=[0, 1, 3, 2])], name="qk")
    p = b.op("Softmax", [s], name="softmax", axis=2)
    _, (finding,) = run_pass(b.model(b.op("MatMul", [p, v], name="pv")))
    assert not finding["is_attention"] and "softmax over axis 2" in finding["reason"]


def test_constant_divided_by_scores_is_refused():
    b = Builder()
    q, k, v = b.qkv()
    s = b.op("MatMul", [q, b.op("Transpose", [k], perm=[0, 1, 3, 2])], name="qk")
    s = b.op("Div", [b.const(2.0), s])
    _, findings = run_pass(b.model(core(b, s, v)))
    assert findings and not findings[0]["is_attention"]
    assert "divides a constant by the scores" in findings[0]["reason"]


def test_where_without_a_scalar_fill_is_refused():
    b = Builder()
    q, k, v = b.qkv()
    s = b.op("MatMul", [q, b.op("Transpose", [k], perm=[0, 1, 3, 2])], name="qk")
    s = b.op("Where", [b.input("cond", (16, 16), TensorProto.BOOL), b.input("fill", (16, 16)), s])
    _, findings = run_pass(b.model(core(b, s, v)))
    assert "Where without a scalar fill value" in findings[0]["reason"]


def test_probabilities_used_outside_the_block_are_not_absorbed():
    b = Builder()
    q, k, v = b.qkv()
    s = b.op("MatMul", [q, b.op("Transpose", [k], perm=[0, 1, 3, 2])], name="qk")
    p = b.op("Softmax", [s], name="softmax", axis=-1)
    out = b.op("MatMul", [p, v], name="pv")
    graph, (finding,) = run_pass(b.model(out, extra_outputs=[p]), RAISE)
    assert not finding["is_attention"] and "is a graph output" in finding["reason"]
    assert graph.op_counts()["Softmax"] == 1


def test_projection_matmul_with_constant_weight_is_not_attention():
    b = Builder()
    x = b.input("x", (B, 16, D))
    s = b.op("MatMul", [x, b.const(np.ones((D, 16)))], name="qk")
    _, findings = run_pass(b.model(core(b, s, b.input("v", (B, 16, D)))))
    assert "constant operand" in findings[0]["reason"]


# --- gates, target, cast policy ------------------------------------------------------------------
@pytest.mark.parametrize(
    "options, seq, reason",
    [
        (CompileOptions(), 1024, "enable-native-kernel-attention is off"),
        (
            CompileOptions(enable_native_kernel_attention=True, target="inf2"),
            1024,
            "target 'inf2' is not 'sunda'",
        ),
        (
            CompileOptions(enable_native_kernel_attention=True),
            1024,
            "tensors are float32, not bfloat16, and enable-native-kernel-attention-bf16 is off",
        ),
        (RAISE, 1007, "sequence 1007 <= 1007"),
    ],
)
def test_gates_in_order(options, seq, reason):
    _, model = standard(("mul",), seq_q=seq)
    graph, (block,) = run_pass(model, options)
    assert block["target"] is None and block["reason"] == reason
    assert graph.op_counts()["Softmax"] == 1


def test_head_dim_and_sbuf_gates():
    global D
    saved, D = D, 160
    try:
        _, model = standard(("mul",), seq_q=1024)
        _, (block,) = run_pass(model, RAISE)
        assert block["reason"] == "head dim 160 > 128"
    finally:
        D = saved
    # The flash-style kernel's SBUF does not grow with the keys: 30000 keys are raised ...
    _, model = standard((), seq_q=1008, seq_k=30000)
    _, (block,) = run_pass(model, RAISE)
    assert block["target"] == ATTENTION and block["sb_bytes"] < 196608
    # ... unless the bytes kept for dynamic DMA leave too little of the state buffer.
    free = 196608 - block["sb_bytes"]
    tight = CompileOptions(
        enable_native_kernel_attention=True,
        enable_native_kernel_attention_bf16=True,
        dynamic_dma_sbuf_bytes=free + 1,
    )
    _, (block,) = run_pass(model, tight)
    assert block["target"] is None
    assert block["reason"] == (
        f"SBUF bytes {196608 + 1} (with {free + 1} for dynamic DMA) > 196608"
    )


def test_sb_shape_matmult_reserves_two_bytes_more_per_key_than_all():
    """matmult-to-bf16 keeps fp32 scores, all-to-bf16 bf16 ones: +2 bytes per key column."""
    matmult = sb_shape(4096, 4096, False, Dtype.BF16, True)
    cast_all = sb_shape(4096, 4096, False, Dtype.BF16, False)
    assert matmult[:2] == cast_all[:2] == (128, 512)
    assert matmult[2] - cast_all[2] == 2 * 512
    # K and V are held one 8192-key section at a time: longer blocks reserve the same.
    assert sb_shape(32768, 32768, True, Dtype.BF16, True) == sb_shape(
        8192, 8192, True, Dtype.BF16, True
    )
    assert sb_shape(4096, 4096, True, Dtype.BF16, True) < sb_shape(
        8192, 8192, True, Dtype.BF16, True
    )
    assert sb_shape(16, 100, False, Dtype.BF16, True)[:2] == (16, 100)


@pytest.mark.parametrize("cast", ["matmult-to-bf16", "all-to-bf16"])
def test_raised_entry_lists_sb_bytes_and_config(cast):
    _, model = standard(("mul",), seq_q=1024)
    options = CompileOptions(
        native_kernel_cast_type=cast,
        enable_native_kernel_attention=True,
        enable_native_kernel_attention_bf16=True,
    )
    graph, (block,) = run_pass(model, options)
    expected = sb_shape(1024, 1024, False, Dtype.BF16, cast.startswith("matmult"))
    assert block["status"] == "raised" and block["sb_bytes"] == expected[2]
    # A Reshape for each of q, kᵀ, v and the output (in and out of the kernel's batch layout),
    # a Transpose for each of q, kᵀ, v (into its operand layout), Casts of q, kᵀ, v to bf16
    # and of the output back. This unmasked block needs no reshaping: the code generator
    # drops every Reshape and Transpose of it.
    assert block["packaging"] == {"Cast": 4, "Reshape": 4, "Transpose": 3}
    (call,) = [d for _, d in graph.nodes() if d["op_type"] == "CustomCall"]
    config = json.loads(call["attrs"]["backend_config"])
    assert config["sb_shape"] == list(expected) and config["auto_cast"] == cast.split("-")[0]
    assert call["attrs"]["api_version"] == 1


@pytest.mark.parametrize(
    "steps, seq_k, target",
    [
        (("mul", "mask"), None, ATTENTION_WITHOUT_SWAP),
        (("mul", "mask"), 2048, ATTENTION),
        (("mul", "causal_const"), None, CAUSAL_ATTENTION_WITHOUT_SWAP),
        (("div", "masked_fill"), None, CAUSAL_ATTENTION_WITHOUT_SWAP),
    ],
)
def test_target_choice_and_raise(steps, seq_k, target):
    _, model = standard(steps, seq_q=1024, seq_k=seq_k)
    graph, (block,) = run_pass(model, RAISE)
    assert block["target"] == target and block["reason"] is None
    (node,) = [d for _, d in graph.nodes() if d["op_type"] == "CustomCall"]
    assert node["attrs"]["custom_call_target"] == target
    assert node["attrs"]["api_version"] == 1
    config = __import__("json").loads(node["attrs"]["backend_config"])
    assert list(config) == ["psum_shape", "sb_shape", "auto_cast", "auto_cast_type", "kernel_name"]
    assert config["kernel_name"] == target and config["auto_cast_type"] == "bf16"
    # matmult-to-bf16: q, kᵀ, v stored as bf16 by Casts in front; the result cast back.
    casts = [d for _, d in graph.nodes() if d["op_type"] == "Cast"]
    assert len(casts) == 4 and node["attrs"]["storage_dtype"] == "bfloat16"
    assert "Softmax" not in graph.op_counts() and "MatMul" not in graph.op_counts()
    if target == CAUSAL_ATTENTION_WITHOUT_SWAP:
        assert {"op": "causal"} in __import__("json").loads(node["attrs"]["steps"])


def test_fp16_cast_policy():
    _, model = standard(("mul",), seq_q=1024)
    graph, (block,) = run_pass(
        model,
        CompileOptions(
            enable_native_kernel_attention=True,
            enable_native_kernel_attention_bf16=True,
            native_kernel_cast_type="all-to-fp16",
        ),
    )
    (node,) = [d for _, d in graph.nodes() if d["op_type"] == "CustomCall"]
    assert node["attrs"]["storage_dtype"] == "float16"


def test_bf16_model_is_raised_without_the_bf16_flag_and_runs():
    """Tensors already in bf16: the seed's dtype gate lets them through with only the master
    flag; the kernel stores bf16 and accumulates fp32. Checked against onnxruntime running the
    fp32 graph on the same (bf16-representable) inputs."""
    import ml_dtypes

    from onnx2bir.compiler import compile_model
    from onnx2bir.runtime.machine.interpreter import run_function
    from onnx2bir.runtime.oracle.compare import compare_output
    from onnx2bir.runtime.oracle.ort import run_onnxruntime

    seq = 1024

    def build(bf16: bool):
        b = Builder(seq_q=seq)
        q, k, v = b.qkv()
        if bf16:
            q, k, v = (b.op("Cast", [t], to=TensorProto.BFLOAT16) for t in (q, k, v))
        kt = b.op("Transpose", [k], perm=[0, 1, 3, 2])
        s = b.op("MatMul", [q, kt], name="qk")
        scale = b.const(D**-0.5, dtype=ml_dtypes.bfloat16 if bf16 else np.float32)
        out = core(b, b.op("Mul", [s, scale]), v)
        if bf16:
            out = b.op("Cast", [out], to=TensorProto.FLOAT)
        return b.model(out)

    options = CompileOptions(enable_native_kernel_attention=True)
    compilation = compile_model(build(True), options)
    (block,) = compilation.passes.result_of("LowerToCustomNativeKernel").findings
    assert block["dtype"] == "bfloat16" and block["target"] == ATTENTION_WITHOUT_SWAP
    rng = np.random.default_rng(0)
    feeds = {
        name: rng.standard_normal((B, H, seq, D)).astype(ml_dtypes.bfloat16).astype(np.float32)
        for name in ("q", "k", "v")
    }
    (name,) = compilation.graph.outputs
    got = run_function(compilation.module, feeds)[name]
    reference = run_onnxruntime(build(False), feeds)
    ((_, expected),) = reference.items()
    unit = 2.0**-8
    result = compare_output(
        name, got, expected, atol=4 * unit * float(abs(expected).max()), rtol=2 * unit
    )
    assert result.passed, result.to_json()
