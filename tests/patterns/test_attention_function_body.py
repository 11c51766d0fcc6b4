"""onnx.Attention forms neither the raise nor the decomposition takes: replaced by the function
body the ONNX standard defines (patterns/attention/function_body.py), validated against
onnxruntime's own Attention kernel, an independent implementation of the op.

Bounds: with `auto_cast="none"` the program computes in fp32 and the verdict is the fp32
default (atol 1e-4 + rtol 1e-3·|ref|); a body built with a wrong scale moves the outputs by
far more and must fail it. A `reference` with one element of present_key changed by 0.5 drops
that output's cosine to about 0.9992 (128 elements of rms ≈ 1), below a 0.99999 drift limit
that the true reference meets (its drift is 0 to rounding).
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

import onnx2bir
from onnx2bir.codegen import GENERIC_LOWERINGS
from onnx2bir.compiler import compile_model
from onnx2bir.frontend.importer import import_model
from onnx2bir.options import CompileOptions
from onnx2bir.patterns.attention import function_body
from onnx2bir.patterns.attention.decompose import DecomposeAttention

F = TensorProto.FLOAT
FP32 = {"auto_cast": "none"}


def _model(inputs, outputs, name="attention", **attrs) -> onnx.ModelProto:
    node = helper.make_node(
        "Attention", [n if n in inputs else "" for n in _NAMES], outputs, name="attn", **attrs
    )
    graph = helper.make_graph(
        [node],
        name,
        [helper.make_tensor_value_info(n, F, shape) for n, shape in inputs.items()],
        [helper.make_tensor_value_info(n, F, None) for n in outputs if n],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])


_NAMES = ("q", "k", "v", "attn_mask", "past_key", "past_value")


def kv_cache_model() -> onnx.ModelProto:
    """3-D GQA with a KV cache: 4 query heads share 2 K/V heads, 5 cached positions + 3 new."""
    inputs = {
        "q": [1, 3, 32],
        "k": [1, 3, 16],
        "v": [1, 3, 16],
        "past_key": [1, 2, 5, 8],
        "past_value": [1, 2, 5, 8],
    }
    outputs = ["y", "present_key", "present_value"]
    return _model(inputs, outputs, "kv_cache", q_num_heads=4, kv_num_heads=2)


def softcap_model() -> onnx.ModelProto:
    """Softcap 2, and the capped scores read as the 4th output (qk_matmul_output_mode 2)."""
    inputs = {"q": [1, 2, 4, 8], "k": [1, 2, 6, 8], "v": [1, 2, 6, 8]}
    return _model(inputs, ["y", "", "", "qk"], "softcap", softcap=2.0, qk_matmul_output_mode=2)


def feeds_for(model, seed=0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(
            np.float32
        )
        for i in model.graph.input
    }


def onnxruntime_outputs(model, feeds) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, feeds), strict=True))


def notes(result) -> list[str]:
    return [n["message"] for n in result.document["notes"]]


def test_kv_cache_gqa_takes_the_function_body_and_validates():
    model = kv_cache_model()
    feeds = feeds_for(model)
    result = onnx2bir.validate(model, feeds, **FP32)
    assert result.passed
    (note,) = [n for n in notes(result) if "Attention node 'attn'" in n]
    assert "replaced by the function body" in note
    assert "past_key/past_value (KV cache) are not supported by the kernel" in note
    # present_key is the cache and the new keys, per K/V head: [1, 2, 5 + 3, 8].
    expected = onnxruntime_outputs(model, feeds)
    assert result.outputs["present_key"].shape == (1, 2, 8, 8)
    np.testing.assert_array_equal(result.outputs["present_key"], expected["present_key"])
    # The device's default autocast (bf16 matmul operands) passes too.
    assert onnx2bir.validate(model, feeds).passed


def test_softcap_with_qk_output_takes_the_function_body_and_validates():
    model = softcap_model()
    result = onnx2bir.validate(model, feeds_for(model, 1), **FP32)
    assert result.passed
    (note,) = [n for n in notes(result) if "Attention node 'attn'" in n]
    assert "softcap needs a tanh score step the kernel does not have" in note
    assert "qk_matmul_output" in note  # why the decomposition left it
    assert np.abs(result.outputs["qk"]).max() <= 2.0  # the scores are capped


def test_report_lists_the_block_with_its_reason_and_its_body():
    report = onnx2bir.report(kv_cache_model()).to_json()
    (block,) = report["attention"]
    assert block["nodes"] == ["attn"] and "past K/V" in block["variant"]
    (finding,) = report["decomposed_attention"]
    assert finding["expanded"] and not finding["decomposed"]
    assert finding["raise_reason"].startswith("past_key/past_value")
    assert finding["new_nodes"] == sum(finding["body_ops"].values()) > 0
    assert "Attention" not in report["ops_after_passes"]
    compilation = compile_model(kv_cache_model(), CompileOptions(auto_cast="none"))
    assert all(name.startswith("attn/") for name, _ in compilation.graph.nodes())


def test_a_wrong_body_fails_the_verdict(monkeypatch):
    """The body built with scale 0.5 instead of 1/√8: onnxruntime's kernel disagrees."""
    real = function_body.graph_node_body

    def wrong_scale(graph, node, lowered=None):
        graph.node(node)["attrs"]["scale"] = 0.5
        return real(graph, node, lowered)

    monkeypatch.setattr(function_body, "graph_node_body", wrong_scale)
    model = kv_cache_model()
    result = onnx2bir.validate(model, feeds_for(model), **FP32)
    assert not result.passed
    failed = {o["name"] for o in result.document["outputs"] if not o["passed"]}
    assert failed == {"y"}  # the caches do not depend on the scale


def test_a_changed_reference_fails_the_drift_limit():
    model = kv_cache_model()
    feeds = feeds_for(model)
    reference = onnxruntime_outputs(model, feeds)
    limit = {"cosine": 0.99999}
    assert onnx2bir.validate(model, feeds, reference=reference, max_drift=limit, **FP32).passed
    reference["present_key"] = reference["present_key"].copy()
    reference["present_key"][0, 1, 6, 3] += 0.5
    result = onnx2bir.validate(model, feeds, reference=reference, max_drift=limit, **FP32)
    assert not result.passed


def test_a_body_without_lowerings_stays_with_its_reason():
    """A body op with no generic lowering (Softmax, taken away here): the node stays whole,
    for the code generator to refuse by name, and the finding and note say why."""
    graph = import_model(kv_cache_model())
    available = frozenset(GENERIC_LOWERINGS) - {"Softmax"}
    result = DecomposeAttention(lowerings=available).run(graph, CompileOptions())
    (finding,) = result.findings
    assert not result.changed and graph.op_counts() == {"Attention": 1}
    assert not finding["expanded"] and "Softmax" in finding["expansion_reason"]
    assert finding["note"].startswith("Attention node 'attn' stays (not raised: past_key")
