"""DecomposeAttention: every root kind decomposed and checked against onnxruntime, every refusal
with its reason.

Each model is built with onnx.helper (opset 23 for onnx.Attention, which onnxruntime 1.32 runs
on the CPU; com.microsoft ops at opset 18), imported, decomposed and compiled. Two checks:
the decomposed graph itself, exported back to ONNX, against onnxruntime on the original model
(so an expansion that needs an op the code generator may lack, e.g. Where, Cast or Slice, is
checked with the op declared available); and, whenever every op has a generic lowering, the
BIR simulated on the machine model against the same reference (atol 1e-4, rtol 1e-3).
onnxruntime 1.32 runs onnx.Attention on the CPU for every case here except a [B, 1, 1, T] mask,
which it rejects; that case is compared with onnx's reference implementation of the spec.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import onnx2bir.patterns.attention.decompose as decompose
from onnx2bir.codegen import GENERIC_LOWERINGS
from onnx2bir.compiler import compile_graph
from onnx2bir.frontend.importer import import_model
from onnx2bir.graph import Graph
from onnx2bir.options import CompileOptions
from onnx2bir.patterns.attention.decompose import DecomposeAttention
from onnx2bir.patterns.attention.raising import (
    ATTENTION_WITHOUT_SWAP,
    CAUSAL_ATTENTION_WITHOUT_SWAP,
    find_blocks,
    raise_block,
)
from onnx2bir.runtime.machine.interpreter import run_function
from onnx2bir.runtime.oracle.compare import compare_output
from onnx2bir.runtime.oracle.ort import run_onnxruntime, synthesize_inputs

FP32 = CompileOptions(auto_cast="none")  # compared at fp32 tolerance: no autocast

F, B, I32 = TensorProto.FLOAT, TensorProto.BOOL, TensorProto.INT32
ATOL, RTOL = 1e-4, 1e-3
SOFTMAX_OPS = {"ReduceMax", "Sub", "Exp", "ReduceSum", "Div"}


@pytest.fixture(autouse=True)
def no_attention_kernels(monkeypatch):
    """A kernel registry without any attention kernel: the raise's kernels are not selected."""
    monkeypatch.setattr(decompose, "KERNELS", {})


# --- model building --------------------------------------------------------------------------
def make_model(
    op_type,
    inputs,
    attrs,
    initializers=None,
    domain="",
    opset=23,
    outputs=("y",),
    node_inputs=None,
    out_shape=None,
):
    """One attention node; inputs {name: (elem type, shape)}, "" in node_inputs skips a slot.
    Output shapes come from onnx shape inference, or `out_shape` for com.microsoft ops."""
    initializers = initializers or {}
    names = node_inputs if node_inputs is not None else [*inputs, *initializers]
    node = helper.make_node(op_type, names, list(outputs), domain=domain, **attrs)
    graph = helper.make_graph(
        [node],
        "attention",
        [helper.make_tensor_value_info(n, t, s) for n, (t, s) in inputs.items()],
        [helper.make_tensor_value_info(n, F, out_shape) for n in outputs],
        [numpy_helper.from_array(np.asarray(v), n) for n, v in initializers.items()],
    )
    opsets = [helper.make_opsetid("", opset)]
    if domain:
        opsets.append(helper.make_opsetid(domain, 1))
    model = helper.make_model(graph, opset_imports=opsets, ir_version=10)
    return model if domain else onnx.shape_inference.infer_shapes(model, strict_mode=True)


def onnx_attention(q, k, v, mask=None, initializers=None, **attrs):
    inputs = {"q": (F, q), "k": (F, k), "v": (F, v)}
    if mask is not None:
        inputs["m"] = mask
    return make_model("Attention", inputs, attrs, initializers)


def graph_to_model(graph: Graph):
    """The Graph as an ONNX model, so onnxruntime can run a rewritten graph."""

    def value(name):
        info = graph.tensors[name]
        return helper.make_tensor_value_info(
            name, helper.np_dtype_to_tensor_dtype(info.dtype.numpy), list(info.shape)
        )

    nodes, used = [], set()
    for name in graph.topological_order():
        data = graph.node(name)
        used.update(data["inputs"])
        nodes.append(
            helper.make_node(
                data["op_type"],
                data["inputs"],
                data["outputs"],
                name=name,
                domain=data["domain"],
                **data["attrs"],
            )
        )
    consts = [
        numpy_helper.from_array(np.asarray(info.const), n)
        for n, info in graph.tensors.items()
        if info.is_const and n in used
    ]
    onnx_graph = helper.make_graph(
        nodes,
        "decomposed",
        [value(n) for n in graph.inputs],
        [value(n) for n in graph.outputs],
        consts,
    )
    return helper.make_model(
        onnx_graph, opset_imports=[helper.make_opsetid("", graph.opset)], ir_version=10
    )


def assert_close(got, expected):
    for name, reference in expected.items():
        actual = got[name] if name in got else got[f"{name}:output"]
        result = compare_output(name, actual, reference, ATOL, RTOL)
        assert result.passed, result.to_json()


def check(model, seed=0, feeds=None, extra_ops=()):
    """Decompose, compare the rewritten graph and (when lowerable) the BIR with onnxruntime."""
    graph = import_model(model)
    feeds = feeds or synthesize_inputs(graph, seed)
    expected = run_onnxruntime(model, feeds)
    available = frozenset(GENERIC_LOWERINGS) | frozenset(extra_ops)
    compiled = compile_graph(
        graph, FP32, passes=[DecomposeAttention(lowerings=available)], keep_going=True
    )
    (finding,) = compiled.passes.result_of("DecomposeAttention").findings
    assert finding["decomposed"], finding["reason"]
    ops = set(compiled.graph.op_counts())
    assert SOFTMAX_OPS <= ops and "Softmax" not in ops and "Attention" not in ops
    assert all(name.startswith(tuple(finding["nodes"])) for name, _ in compiled.graph.nodes())
    assert_close(run_onnxruntime(graph_to_model(compiled.graph), feeds), expected)
    assert extra_ops or ops <= set(GENERIC_LOWERINGS)  # only given ops may lack a lowering
    if ops <= set(GENERIC_LOWERINGS):
        assert compiled.codegen_error is None, compiled.codegen_error
        assert_close(run_function(compiled.module, feeds), expected)
    return finding, compiled.graph


def refusal(model, lowerings=None):
    graph = import_model(model)
    before = graph.op_counts()
    result = DecomposeAttention(lowerings=lowerings).run(graph, CompileOptions())
    (finding,) = result.findings
    assert not finding["decomposed"] and not result.changed
    assert graph.op_counts() == before
    return finding["reason"]


def body_instead(model):
    """The decomposition's reason for an onnx.Attention whose ONNX function body replaced it
    instead (patterns/attention/function_body.py)."""
    graph = import_model(model)
    (finding,) = DecomposeAttention().run(graph, CompileOptions()).findings
    assert not finding["decomposed"] and finding["expanded"], finding
    assert "Attention" not in graph.op_counts()
    return finding["reason"]


# --- onnx.Attention (opset 23) ---------------------------------------------------------------
ONNX_CASES = {
    "4d": (dict(q=[2, 3, 5, 8], k=[2, 3, 6, 8], v=[2, 3, 6, 4]), {}),
    "4d_custom_scale": (dict(q=[2, 3, 5, 8], k=[2, 3, 6, 8], v=[2, 3, 6, 4]), {"scale": 0.3}),
    "4d_causal": (dict(q=[1, 2, 6, 8], k=[1, 2, 6, 8], v=[1, 2, 6, 4]), {"is_causal": 1}),
    "4d_causal_sq_gt_skv": (dict(q=[1, 2, 6, 8], k=[1, 2, 4, 8], v=[1, 2, 4, 4]), {"is_causal": 1}),
    "3d": (dict(q=[2, 5, 12], k=[2, 6, 12], v=[2, 6, 9]), {"q_num_heads": 3, "kv_num_heads": 3}),
    "3d_causal": (
        dict(q=[2, 5, 12], k=[2, 5, 12], v=[2, 5, 9]),
        {"q_num_heads": 3, "kv_num_heads": 3, "is_causal": 1},
    ),
    "4d_gqa": (dict(q=[2, 6, 5, 8], k=[2, 2, 6, 8], v=[2, 2, 6, 4]), {}),
    "4d_mqa_causal": (dict(q=[1, 4, 5, 8], k=[1, 1, 5, 8], v=[1, 1, 5, 4]), {"is_causal": 1}),
    "3d_gqa": (dict(q=[2, 5, 24], k=[2, 6, 8], v=[2, 6, 6]), {"q_num_heads": 6, "kv_num_heads": 2}),
    "softcap": (dict(q=[2, 3, 5, 8], k=[2, 3, 6, 8], v=[2, 3, 6, 4]), {"softcap": 2.0}),
}


@pytest.mark.parametrize("case", ONNX_CASES)
def test_match_onnx_attention(case):
    shapes, attrs = ONNX_CASES[case]
    finding, graph = check(onnx_attention(**shapes, **attrs))
    assert finding["source"] == "Attention" and finding["reason"] is None
    assert graph.op_counts()["MatMul"] == 2


MASK_CASES = {
    "float_bs": (dict(q=[2, 3, 5, 8], k=[2, 3, 6, 8], v=[2, 3, 6, 4]), [2, 1, 5, 6], {}),
    "float_2d_causal": (
        dict(q=[2, 3, 6, 8], k=[2, 3, 6, 8], v=[2, 3, 6, 4]),
        [6, 6],
        {"is_causal": 1},
    ),
    "float_per_head_gqa": (dict(q=[1, 4, 5, 8], k=[1, 2, 6, 8], v=[1, 2, 6, 4]), [1, 4, 5, 6], {}),
    "float_3d_gqa": (
        dict(q=[2, 5, 16], k=[2, 6, 8], v=[2, 6, 8]),
        [2, 1, 5, 6],
        {"q_num_heads": 4, "kv_num_heads": 2},
    ),
}


@pytest.mark.parametrize("case", MASK_CASES)
def test_match_onnx_attention_float_mask(case):
    shapes, mask, attrs = MASK_CASES[case]
    finding, graph = check(onnx_attention(**shapes, mask=(F, mask), **attrs))
    assert graph.op_counts()["Add"] == 1 + bool(attrs.get("is_causal"))


@pytest.mark.parametrize("causal", [0, 1])
def test_match_onnx_attention_constant_bool_mask_with_an_empty_row(causal):
    """A constant bool mask folds to one additive bias; a row with no allowed key is zero."""
    mask = np.random.default_rng(3).random((2, 1, 5, 5)) > 0.3
    mask[..., 0] = True  # key 0 visible: only row 1 is empty, also under the causal triangle
    mask[:, :, 1, :] = False
    model = onnx_attention(
        [2, 2, 5, 8], [2, 2, 5, 8], [2, 2, 5, 4], initializers={"m": mask}, is_causal=causal
    )
    _, graph = check(model)
    assert graph.op_counts()["Add"] == 1 and graph.op_counts()["Max"] == 2  # one bias, guard


def test_match_onnx_attention_runtime_bool_mask():
    """True = may attend: Where(mask, S, −inf) (on the machine too once Where lowers)."""
    model = onnx_attention(
        [2, 3, 5, 8], [2, 3, 6, 8], [2, 3, 6, 4], mask=(B, [2, 3, 5, 6]), is_causal=0
    )
    finding, graph = check(model, extra_ops={"Where"})
    assert graph.op_counts()["Where"] == 1
    if "Where" not in GENERIC_LOWERINGS:
        assert "Where" in refusal(model)


def test_match_onnx_attention_runtime_bool_mask_causal_gqa():
    model = onnx_attention(
        [1, 4, 5, 8], [1, 2, 5, 8], [1, 2, 5, 4], mask=(B, [1, 4, 5, 5]), is_causal=1
    )
    check(model, seed=1, extra_ops={"Where"})


def test_match_onnx_attention_key_padding_mask_against_the_spec_reference():
    """A [B, 1, 1, T] bool mask is valid ONNX, but onnxruntime 1.32's CPU Attention rejects it
    ("inconsistent q_sequence_length"): compare with onnx's reference implementation."""
    model = onnx_attention([2, 2, 4, 8], [2, 2, 6, 8], [2, 2, 6, 4], mask=(B, [2, 1, 1, 6]))
    graph = import_model(model)
    feeds = synthesize_inputs(graph, 5)
    feeds["m"][:, ..., 0] = True
    feeds["m"][1, ..., :] = False  # batch 1: every key padded, so every row is zero
    (expected,) = ReferenceEvaluator(model).run(None, feeds)
    compiled = compile_graph(graph, FP32, passes=[DecomposeAttention()])
    assert_close(run_function(compiled.module, feeds), {"y": expected})
    assert not expected[1].any()


def test_no_match_onnx_attention_kv_cache():
    inputs = {
        "q": (F, [1, 2, 3, 8]),
        "k": (F, [1, 2, 3, 8]),
        "v": (F, [1, 2, 3, 8]),
        "pk": (F, [1, 2, 4, 8]),
        "pv": (F, [1, 2, 4, 8]),
    }
    model = make_model("Attention", inputs, {}, node_inputs=["q", "k", "v", "", "pk", "pv"])
    assert "past_key/past_value" in body_instead(model)


def test_no_match_onnx_attention_extra_outputs():
    inputs = {"q": (F, [1, 2, 3, 8]), "k": (F, [1, 2, 3, 8]), "v": (F, [1, 2, 3, 8])}
    model = make_model(
        "Attention",
        inputs,
        {},
        outputs=("y", "present_key", "present_value"),
        out_shape=[1, 2, 3, 8],
    )
    assert "present_key" in body_instead(model)


def test_no_match_onnx_attention_softcap_without_tanh():
    model = onnx_attention([1, 2, 3, 8], [1, 2, 3, 8], [1, 2, 3, 8], softcap=5.0)
    assert "Tanh" in refusal(model, frozenset(GENERIC_LOWERINGS) - {"Tanh"})


def test_no_match_onnx_attention_missing_where():
    model = onnx_attention([1, 2, 3, 8], [1, 2, 3, 8], [1, 2, 3, 8], mask=(B, [3, 3]))
    reason = refusal(model, frozenset(GENERIC_LOWERINGS) - {"Where"})
    assert "Where" in reason and "runtime condition" in reason


# --- com.microsoft.MultiHeadAttention and Attention -------------------------------------------
def mha(
    q=(2, 5, 12),
    kv=(2, 6),
    dv=12,
    heads=3,
    bias=False,
    mask=None,
    attention_bias=None,
    initializers=None,
    **attrs,
):
    rng = np.random.default_rng(7)
    inputs = {"q": (F, list(q)), "k": (F, [*kv, q[2]]), "v": (F, [*kv, dv])}
    initializers = dict(initializers or {})
    names = ["q", "k", "v", "", "", ""]
    if bias:
        initializers["bias"] = rng.standard_normal(2 * q[2] + dv).astype(np.float32)
        names[3] = "bias"
    if mask is not None:
        inputs["kpm"] = (I32, mask)
        names[4] = "kpm"
    if "kpm" in initializers:
        names[4] = "kpm"
    if attention_bias is not None:
        inputs["ab"] = (F, attention_bias)
        names[5] = "ab"
    while names[-1] == "":
        names.pop()
    return make_model(
        "MultiHeadAttention",
        inputs,
        {"num_heads": heads, **attrs},
        initializers,
        "com.microsoft",
        18,
        node_inputs=names,
        out_shape=[q[0], q[1], dv],
    )


def padding_mask(batch, length, seed=0):
    mask = (np.random.default_rng(seed).random((batch, length)) > 0.4).astype(np.int32)
    mask[:, 0] = 1
    return mask


MHA_CASES = {
    "plain": {},
    "cross": {"q": (2, 4, 12), "kv": (2, 7)},
    "bias": {"bias": True},
    "bias_dv": {"bias": True, "dv": 6},
    "scale": {"scale": 0.2},
    "unidirectional": {"kv": (2, 5), "unidirectional": 1},
    "attention_bias": {"attention_bias": [2, 3, 5, 6]},
    "attention_bias_broadcast": {"attention_bias": [1, 1, 5, 6], "bias": True},
    "const_padding_mask": {"initializers": {"kpm": padding_mask(2, 6)}},
    "const_padding_mask_3d_causal": {
        "kv": (2, 5),
        "unidirectional": 1,
        "initializers": {"kpm": np.stack([padding_mask(5, 5, s) for s in (1, 2)])},
    },
    "const_mask_filter": {"initializers": {"kpm": padding_mask(2, 6)}, "mask_filter_value": -50.0},
}


@pytest.mark.parametrize("case", MHA_CASES)
def test_match_ms_multihead_attention(case):
    finding, _ = check(mha(**MHA_CASES[case]))
    assert (finding["source"], finding["domain"]) == ("MultiHeadAttention", "com.microsoft")


@pytest.mark.parametrize("unidirectional", [0, 1])
def test_match_ms_multihead_attention_runtime_padding_mask(unidirectional):
    """A runtime int mask needs Cast (on the machine too once Cast lowers)."""
    model = mha(kv=(2, 5), mask=[2, 5], unidirectional=unidirectional)
    check(model, extra_ops={"Cast"})
    if "Cast" not in GENERIC_LOWERINGS:
        assert "Cast" in refusal(model)


def test_match_ms_multihead_attention_runtime_bias():
    """A bias fed at run time is split into its Q/K/V parts by Slice."""
    model = make_model(
        "MultiHeadAttention",
        {"q": (F, [1, 3, 8]), "k": (F, [1, 4, 8]), "v": (F, [1, 4, 8]), "b": (F, [24])},
        {"num_heads": 2},
        domain="com.microsoft",
        opset=18,
        node_inputs=["q", "k", "v", "b"],
        out_shape=[1, 3, 8],
    )
    _, graph = check(model, extra_ops={"Slice"})
    assert graph.op_counts()["Slice"] == 3
    assert "Slice" in refusal(model, frozenset(GENERIC_LOWERINGS) - {"Slice"})


def test_no_match_ms_multihead_attention_reasons():
    lengths = mha(initializers={"kpm": np.array([6, 3], np.int32)})
    assert "only (batch, kv_sequence)" in refusal(lengths)
    packed = make_model(
        "MultiHeadAttention",
        {"q": (F, [1, 3, 2, 3, 4])},
        {"num_heads": 2},
        domain="com.microsoft",
        opset=18,
        node_inputs=["q"],
        out_shape=[1, 3, 8],
    )
    assert "packed" in refusal(packed)
    past = mha(kv=(2, 6))
    past.graph.node[0].input.extend(["", "", "", "k"])  # key again, as past_key
    assert "past_key/past_value" in refusal(past)


def ms_attention(seq=5, hidden=12, heads=3, mask=None, runtime_weights=False, **attrs):
    rng = np.random.default_rng(11)
    inputs = {"x": (F, [2, seq, hidden])}
    initializers = {"b": rng.standard_normal(3 * hidden).astype(np.float32)}
    w = (rng.standard_normal((hidden, 3 * hidden)) / np.sqrt(hidden)).astype(np.float32)
    if runtime_weights:
        inputs["w"] = (F, [hidden, 3 * hidden])
    else:
        initializers["w"] = w
    names = ["x", "w", "b"]
    if mask is not None:
        initializers["mask"] = mask
        names.append("mask")
    return make_model(
        "Attention",
        inputs,
        {"num_heads": heads, **attrs},
        initializers,
        "com.microsoft",
        18,
        node_inputs=names,
        out_shape=[2, seq, hidden],
    )


@pytest.mark.parametrize("kind", ["plain", "mask_2d", "unidirectional", "mask_unidirectional"])
def test_match_ms_attention(kind):
    mask = padding_mask(2, 5) if "mask" in kind else None
    model = ms_attention(mask=mask, unidirectional=int("unidirectional" in kind))
    finding, graph = check(model)
    assert finding["source"] == "Attention" and finding["domain"] == "com.microsoft"
    assert graph.op_counts()["MatMul"] == 5  # three projections, QKᵀ, PV


def test_match_ms_attention_runtime_weights():
    model = ms_attention(runtime_weights=True, mask=padding_mask(2, 5))
    _, graph = check(model, extra_ops={"Slice"})
    assert graph.op_counts()["Slice"] == 3
    assert "Slice" in refusal(model, frozenset(GENERIC_LOWERINGS) - {"Slice"})


def test_no_match_ms_attention_mask_index_lengths():
    assert "only (batch, kv_sequence)" in refusal(ms_attention(mask=np.array([5, 3], np.int32)))


# --- the raise's CustomCall (case 1) ----------------------------------------------------------
def raised_block(
    steps,
    target=ATTENTION_WITHOUT_SWAP,
    shapes=((2, 5, 8), (2, 8, 5), (2, 5, 4)),
    initializers=None,
    tail=(),
    opset=18,
):
    """QK MatMul → steps → Softmax → tail → PV MatMul, imported and raised to a CustomCall
    (the gate skipped, bf16 storage so the raise puts Casts around it)."""
    nodes, current = [helper.make_node("MatMul", ["q", "kt"], ["s0"])], "s0"
    for index, (op, other, swap) in enumerate(steps):
        ins = [other, current] if swap else [current, other]
        if op == "Where":
            ins = [other[0], *((other[1], current) if swap else (current, other[1]))]
        nodes.append(helper.make_node(op, ins, [f"s{index + 1}"]))
        current = f"s{index + 1}"
    nodes.append(helper.make_node("Softmax", [current], ["p"], axis=-1))
    if "nan_guard" in tail:
        nodes += [
            helper.make_node("IsNaN", ["p"], ["nan"]),
            helper.make_node("Where", ["nan", "zero", "p"], ["pg"]),
        ]
    nodes.append(helper.make_node("MatMul", ["pg" if tail else "p", "v"], ["y"]))
    initializers = {**(initializers or {}), "zero": np.float32(0.0)}
    runtime = dict(zip(("q", "kt", "v"), shapes, strict=True))
    if any("mask" in node.input for node in nodes):
        runtime["mask"] = (shapes[0][1], shapes[1][2])
    graph = helper.make_graph(
        nodes,
        "block",
        [helper.make_tensor_value_info(n, F, s) for n, s in runtime.items()],
        [helper.make_tensor_value_info("y", F, None)],
        [numpy_helper.from_array(np.asarray(v), n) for n, v in initializers.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)
    imported = import_model(model)
    options = CompileOptions(
        enable_native_kernel_attention=True, enable_native_kernel_attention_bf16=True
    )
    ((block, _, reason),) = find_blocks(imported)
    assert block is not None, reason
    raise_block(imported, block, target, options)
    assert imported.op_counts()["CustomCall"] == 1 and imported.op_counts()["Cast"] == 4
    return model, imported


def check_custom_call(model, graph, seed=0):
    feeds = synthesize_inputs(graph, seed)
    expected = run_onnxruntime(model, feeds)
    compiled = compile_graph(graph, FP32, passes=[DecomposeAttention()])
    (finding,) = compiled.passes.result_of("DecomposeAttention").findings
    assert finding["decomposed"] and finding["source"] == "CustomCall"
    assert "CustomCall" not in graph.op_counts() and "Cast" not in graph.op_counts()
    # The CustomCall, the four casts the raise added and the Reshape of its output back into
    # the block's (its operands' packaging stays: identities the code generator drops).
    assert len(finding["nodes"]) == 6
    assert_close(run_function(compiled.module, feeds), expected)
    assert_close(run_onnxruntime(graph_to_model(graph), feeds), expected)
    return finding, graph


@pytest.mark.parametrize("opset", [13, 18])  # ReduceMax takes its axes as an input from 18
def test_match_custom_call_scale_and_runtime_mask(opset):
    model, graph = raised_block(
        [("Mul", "scale", False), ("Add", "mask", True)],
        initializers={"scale": np.float32(0.35)},
        opset=opset,
    )
    steps = json.loads(
        next(d for _, d in graph.nodes() if d["op_type"] == "CustomCall")["attrs"]["steps"]
    )
    assert [s["op"] for s in steps] == ["scale", "add"]
    _, graph = check_custom_call(model, graph)
    assert graph.op_counts()["Mul"] == 1 and graph.op_counts()["Add"] == 1


def test_match_custom_call_causal_reuses_the_triangle():
    triangle = np.triu(np.full((5, 5), -1e9, np.float32), 1)
    model, graph = raised_block(
        [("Div", "d", False), ("Add", "tri", False)],
        CAUSAL_ATTENTION_WITHOUT_SWAP,
        initializers={"d": np.float32(2.8), "tri": triangle},
    )
    (call,) = [d for _, d in graph.nodes() if d["op_type"] == "CustomCall"]
    assert "tri" not in call["inputs"]  # the raise dropped the mask its causal step replaced
    finding, graph = check_custom_call(model, graph)
    (add,) = [d for _, d in graph.nodes() if d["op_type"] == "Add"]
    rebuilt = graph.tensors[add["inputs"][1]].const
    assert np.array_equal(rebuilt == 0, triangle == 0) and np.all(rebuilt[triangle != 0] <= -1e4)


@pytest.mark.parametrize("fill", [-np.inf, -1e4])
def test_match_custom_call_masked_fill_constant_condition(fill):
    cond = np.triu(np.ones((5, 5), bool), 1)
    model, graph = raised_block(
        [("Where", ("cond", "fill"), True)], initializers={"cond": cond, "fill": np.float32(fill)}
    )
    _, graph = check_custom_call(model, graph)
    assert "Where" not in graph.op_counts()  # folded into constants


def test_match_custom_call_nan_guard_zeroes_an_empty_row():
    cond = np.zeros((5, 5), bool)
    cond[2] = True  # row 2 fully masked: Softmax gives NaN, the guard gives 0
    model, graph = raised_block(
        [("Where", ("cond", "fill"), True)],
        tail=("nan_guard",),
        initializers={"cond": cond, "fill": np.float32(-np.inf)},
    )
    finding, _ = check_custom_call(model, graph)
    if "IsNaN" not in GENERIC_LOWERINGS:
        assert "fully-masked-row guard" in finding["notes"][0]


def test_no_match_custom_call_kernel_selected(monkeypatch):
    model, graph = raised_block([("Mul", "scale", False)], initializers={"scale": np.float32(0.3)})
    monkeypatch.setattr(decompose, "KERNELS", {ATTENTION_WITHOUT_SWAP: object()})
    result = DecomposeAttention().run(graph, CompileOptions())
    (finding,) = result.findings
    assert not result.changed and "is registered" in finding["reason"]
    assert graph.op_counts()["CustomCall"] == 1


# --- the pass ----------------------------------------------------------------------------------
def test_statistics_and_node_names():
    graph = import_model(onnx_attention([1, 2, 4, 8], [1, 2, 4, 8], [1, 2, 4, 8], is_causal=1))
    root = next(name for name, _ in graph.nodes())
    result = DecomposeAttention().run(graph, CompileOptions())
    values = {stat.name: stat.value for stat in result.statistics}
    assert values == {
        "attention_roots_found": 1,
        "attention_roots_decomposed": 1,
        "attention_roots_expanded": 0,
    }
    assert result.changed
    assert all(name.startswith(f"{root}/decomposed/") for name, _ in graph.nodes())
    for name, info in graph.tensors.items():
        assert info.shape is not None and info.dtype is not None, name
    assert DecomposeAttention().run(graph, CompileOptions()).findings == []
