"""The pattern builder: op calls become networkx patterns, choices become variants, and the
variants match (and fail to match) real graphs."""

from __future__ import annotations

import pytest
from onnx import TensorProto, helper

from onnx2bir.frontend.importer import import_model
from onnx2bir.patterns.attention.match import PATTERNS, TAILS
from onnx2bir.patterns.builder import PatternOps, expand
from onnx2bir.patterns.matcher import ANY_INDEX, find_matches


def _gelu(op: PatternOps) -> str:
    """x·½·(1 + erf(x/√2)) with an optional bias Add in front and Mul/Div for the /√2."""
    x = op.MatMul(None, None, key="dot")
    if op.choose(2):
        x = op.Add(x, None, key="bias", commutative=True)
    scaled = op.any_of("Mul", "Div")(x, None, key="scale")
    one = op.Add(op.Erf(scaled, key="erf"), None, key="one", commutative=True)
    op.Mul(op.Mul(x, one, key="mul_x", commutative=True), None, key="half", commutative=True)
    return "erf"


def model(with_bias: bool, scale_op: str = "Div"):
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="dot")]
    h = "h"
    if with_bias:
        nodes.append(helper.make_node("Add", ["b", "h"], ["hb"], name="bias"))
        h = "hb"
    nodes += [
        helper.make_node(scale_op, [h, "c"], ["s"], name="scale"),
        helper.make_node("Erf", ["s"], ["e"], name="erf"),
        helper.make_node("Add", ["e", "one"], ["o"], name="one"),
        helper.make_node("Mul", ["o", h], ["m"], name="mul_x"),
        helper.make_node("Mul", ["m", "half"], ["y"], name="half"),
    ]
    scalar = [
        helper.make_tensor(n, TensorProto.FLOAT, [], [v])
        for n, v in (("c", 1.4142), ("one", 1.0), ("half", 0.5))
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
        [
            helper.make_tensor("w", TensorProto.FLOAT, [4, 4], [0.1] * 16),
            helper.make_tensor("b", TensorProto.FLOAT, [4], [0.1] * 4),
            *scalar,
        ],
    )
    return import_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))


def test_optional_node_gives_two_variants_largest_first():
    patterns = expand("gelu", _gelu)
    assert [p.size for p in patterns] == [7, 6]
    with_bias, without = patterns
    assert ("dot", "bias", ANY_INDEX) in with_bias.edges and ("bias", "scale", 0) in with_bias.edges
    assert ("dot", "scale", 0) in without.edges
    assert {n.key: n.ops for n in without.nodes}["scale"] == frozenset({"Mul", "Div"})


@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("scale_op", ["Mul", "Div"])
def test_variants_match_the_graph_they_describe(with_bias, scale_op):
    graph = model(with_bias, scale_op)
    matches = [m for p in expand("gelu", _gelu) for m in find_matches(graph, p, "erf")]
    assert matches and all(m["erf"] == "erf" for m in matches)
    assert ("bias" in matches[0]) == with_bias


def test_no_match_when_an_op_differs():
    graph = model(True, "Sub")  # neither Mul nor Div
    assert not [m for p in expand("gelu", _gelu) for m in find_matches(graph, p, "erf")]


def test_a_key_defined_twice_is_an_error():
    def twice(op: PatternOps) -> str:
        op.Relu(None, key="a")
        op.Relu(None, key="a")
        return "a"

    with pytest.raises(ValueError, match="defined twice"):
        expand("bad", twice)


def test_attention_table_is_every_step_count_times_every_tail():
    assert len(PATTERNS) == 5 * len(TAILS)
    names = {p.name for p in PATTERNS}
    assert "attention.mm_softmax_mm[4 steps, nan_guard]" in names
    assert "attention.mm_softmax_mm[0 steps, none]" in names
    guard = next(p for p in PATTERNS if p.name.endswith("[0 steps, nan_guard]"))
    assert set(guard.edges) == {
        ("qk", "softmax", 0),
        ("softmax", "isnan", 0),
        ("isnan", "guard", 0),
        ("softmax", "guard", 2),
        ("guard", "pv", 0),
    }
    assert [p.size for p in PATTERNS] == sorted((p.size for p in PATTERNS), reverse=True)
