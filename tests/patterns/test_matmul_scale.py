"""FuseMatMulScale (patterns/matmul_scale.py): a MatMul's multiplication by a one-element
constant runs on the product's PSUM eviction, and the numbers stay onnxruntime's."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import assert_matches_onnxruntime, make_model
from onnx import helper

from onnx2bir.bir.enums import Opcode
from onnx2bir.codegen.lower.matmul import MATMUL_SCALE
from onnx2bir.compiler import compile_graph, import_graph
from onnx2bir.options import CompileOptions
from onnx2bir.patterns import matmul_scale
from onnx2bir.patterns.matmul_scale import FuseMatMulScale

HEADS, TOKENS, HEAD_DIM = 4, 40, 16
SCALE = np.float32(1 / np.sqrt(HEAD_DIM))


def _attention(extra_reader: bool = False, scale_shape: tuple[int, ...] = ()):
    """Per-head scores as exports write them: MatMul(q, kᵀ) → Mul(·, 1/√d) → Softmax →
    MatMul(·, v)."""
    nodes = [
        helper.make_node("MatMul", ["q", "kt"], ["scores"], name="qk"),
        helper.make_node("Mul", ["scores", "scale"], ["scaled"], name="scale_mul"),
        helper.make_node("Softmax", ["scaled"], ["p"], name="softmax", axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["y"], name="pv"),
    ]
    outputs = {"y": None}
    if extra_reader:
        nodes.append(helper.make_node("Relu", ["scores"], ["raw"], name="raw"))
        outputs["raw"] = None
    inputs = {
        "q": (1, HEADS, TOKENS, HEAD_DIM),
        "kt": (1, HEADS, HEAD_DIM, TOKENS),
        "v": (1, HEADS, TOKENS, HEAD_DIM),
    }
    scale = np.full(scale_shape, SCALE, dtype=np.float32)
    return make_model(nodes, inputs, outputs, initializers={"scale": scale})


def _compiled(model):
    return compile_graph(import_graph(model), CompileOptions(auto_cast="none"))


def test_the_scale_runs_on_the_eviction():
    compiled = _compiled(_attention())
    graph = compiled.graph
    ops = {name: data["op_type"] for name, data in graph.nodes()}
    assert "scale_mul" not in ops and ops["qk"] == "MatMul"
    assert graph.node("qk")["outputs"] == ["scaled"]
    assert graph.node("qk")["attrs"][MATMUL_SCALE] == pytest.approx(float(SCALE), rel=0)
    function = compiled.module.functions[0]
    scaled = {
        ins.dst.loc: ins.attrs["scale"]
        for ins in function.instructions()
        if ins.origin.node == "qk" and ins.opcode is Opcode.ACTIVATION
    }
    # the scores' evictions (into their home or result tile) scale; the operand flips do not
    evictions = {loc: s for loc, s in scaled.items() if loc == "scaled" or "result" in loc}
    assert evictions and set(evictions.values()) == {float(SCALE)}
    assert set(scaled.values()) - {1.0} == {float(SCALE)}
    # no pass of its own over the scores
    assert not [ins for ins in function.instructions() if ins.origin.node == "scale_mul"]


@pytest.mark.parametrize("scale_shape", [(), (1,), (1, 1, 1, 1)])
def test_the_fused_program_matches_onnxruntime(scale_shape):
    assert_matches_onnxruntime(_attention(scale_shape=scale_shape))


def test_a_wrong_factor_is_caught(monkeypatch):
    """The comparison with onnxruntime would reject a factor 2% off."""
    fuse = matmul_scale._fuse
    monkeypatch.setattr(
        matmul_scale,
        "_fuse",
        lambda graph, node, mul, factor: fuse(graph, node, mul, factor * 1.02),
    )
    with pytest.raises(AssertionError, match="outputs differ"):
        assert_matches_onnxruntime(_attention())


def test_every_matmul_form_takes_the_factor():
    """A plain [M, K] x [K, N] product (the panel form) and a batch of rows times one
    weight (the rows form) evict with the factor too."""
    rng = np.random.default_rng(3)
    for a_shape in [(64, 96), (2, 50, 96)]:
        nodes = [
            helper.make_node("MatMul", ["a", "w"], ["prod"], name="mm"),
            helper.make_node("Mul", ["half", "prod"], ["y"], name="half_mul"),
        ]
        inits = {
            "w": rng.standard_normal((96, 80)).astype(np.float32),
            "half": np.array(0.5, dtype=np.float32),
        }
        model = make_model(nodes, {"a": a_shape}, {"y": None}, initializers=inits)
        assert "half_mul" not in dict(_compiled(model).graph.nodes())
        assert_matches_onnxruntime(model)


def _refusal(model) -> str | None:
    graph = import_graph(model)
    result = FuseMatMulScale().run(graph, CompileOptions())
    reasons = [f["reason"] for f in result.findings if "reason" in f]
    assert not result.changed
    return reasons[0] if reasons else None


def test_a_product_read_elsewhere_keeps_its_mul():
    assert "has 2 readers" in _refusal(_attention(extra_reader=True))


def test_a_mul_by_a_tensor_is_not_a_scale():
    nodes = [
        helper.make_node("MatMul", ["a", "b"], ["prod"], name="mm"),
        helper.make_node("Mul", ["prod", "row"], ["y"], name="mul"),
    ]
    row = np.full((8,), 2.0, dtype=np.float32)
    model = make_model(nodes, {"a": (4, 6), "b": (6, 8)}, {"y": None}, initializers={"row": row})
    assert _refusal(model) is None  # not a candidate at all


def test_a_mul_that_broadcasts_to_a_larger_shape_is_refused():
    nodes = [
        helper.make_node("MatMul", ["a", "b"], ["prod"], name="mm"),
        helper.make_node("Mul", ["prod", "c"], ["y"], name="mul"),
    ]
    model = make_model(
        nodes,
        {"a": (4, 6), "b": (6, 8)},
        {"y": None},
        initializers={"c": np.full((1, 1, 1), 2.0, dtype=np.float32)},
    )
    assert "broadcasts" in _refusal(model)


def _sdpa_scores(scale_op: str = "Mul", on_k: bool = True, extra_reader: bool = False):
    """Scores as `scaled_dot_product_attention` exports write them: q and kᵀ each scaled by
    √(1/√d) before the product (or q divided by √d), then Softmax → MatMul(·, v)."""
    root = np.float32(np.sqrt(SCALE))
    factor = np.float32(1 / SCALE) if scale_op == "Div" else root
    nodes = [helper.make_node(scale_op, ["q", "root"], ["qs"], name="q_scale")]
    if on_k:
        nodes.append(helper.make_node("Mul", ["root_k", "kt"], ["ks"], name="k_scale"))
    nodes += [
        helper.make_node("MatMul", ["qs", "ks" if on_k else "kt"], ["scores"], name="qk"),
        helper.make_node("Softmax", ["scores"], ["p"], name="softmax", axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["y"], name="pv"),
    ]
    outputs = {"y": None}
    if extra_reader:
        nodes.append(helper.make_node("Relu", ["qs"], ["raw"], name="raw"))
        outputs["raw"] = None
    inputs = {
        "q": (1, HEADS, TOKENS, HEAD_DIM),
        "kt": (1, HEADS, HEAD_DIM, TOKENS),
        "v": (1, HEADS, TOKENS, HEAD_DIM),
    }
    inits = {"root": np.array(factor), "root_k": np.array([root])}
    return make_model(nodes, inputs, outputs, initializers=inits)


def test_operand_scales_move_onto_the_eviction():
    graph = _compiled(_sdpa_scores()).graph
    ops = {name: data["op_type"] for name, data in graph.nodes()}
    assert "q_scale" not in ops and "k_scale" not in ops
    assert graph.node("qk")["inputs"] == ["q", "kt"]
    assert graph.node("qk")["attrs"][MATMUL_SCALE] == pytest.approx(float(SCALE), rel=1e-6)
    assert_matches_onnxruntime(_sdpa_scores())


def test_a_divided_query_moves_onto_the_eviction():
    model = _sdpa_scores("Div", on_k=False)
    graph = _compiled(model).graph
    assert "q_scale" not in dict(graph.nodes())
    assert graph.node("qk")["attrs"][MATMUL_SCALE] == pytest.approx(float(SCALE), rel=1e-6)
    assert_matches_onnxruntime(model)


def test_operand_scales_validate_under_the_default_autocast():
    import onnx2bir

    assert onnx2bir.validate(_sdpa_scores()).passed


def test_an_operand_scale_read_elsewhere_stays():
    model = _sdpa_scores(extra_reader=True)
    graph = import_graph(model)
    result = FuseMatMulScale().run(graph, CompileOptions())
    reasons = [f["reason"] for f in result.findings if f.get("scale") == "q_scale"]
    assert reasons and "2 reads" in reasons[0]
    assert "q_scale" in dict(graph.nodes()) and "k_scale" not in dict(graph.nodes())
    assert_matches_onnxruntime(model)
