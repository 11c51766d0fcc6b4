"""The anchored matcher finds exactly the embeddings networkx's VF2 finds, on every node of
real transformer exports and with the radius below, at and above the patterns' own."""

from __future__ import annotations

from pathlib import Path

import pytest
from onnx import TensorProto, helper

from onnx2bir.frontend.importer import import_model
from onnx2bir.patterns.attention.match import MAX_SCORE_STEPS, PATTERNS
from onnx2bir.patterns.matcher import Pattern, PNode, find_matches, find_matches_vf2

MODELS = Path(__file__).resolve().parents[2] / "models"


def _embeddings(found) -> list[tuple]:
    return sorted(tuple(sorted(match.items())) for match in found)


@pytest.mark.parametrize("name", ["bert", "gpt2", "llama", "mha"])
def test_every_anchor_of_an_attention_model_matches_as_vf2_does(name):
    graph = import_model(MODELS / f"{name}.onnx")
    total = 0
    for node in graph.topological_order():
        for pattern in PATTERNS:
            for radius in (2, MAX_SCORE_STEPS + 4, None):
                fast = _embeddings(find_matches(graph, pattern, node, radius))
                assert fast == _embeddings(find_matches_vf2(graph, pattern, node, radius))
                assert len(set(fast)) == len(fast)
                total += len(fast)
    assert total > 0  # the models do hold attention blocks


def test_a_diamond_with_a_shared_input_is_matched_once_per_embedding():
    # y = Add(Relu(x), Relu(x)) twice over: the pattern Add <- (Relu, Relu) embeds two ways
    # per Add (the two Relu keys swap) when its edges accept any input index.
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="r1"),
        helper.make_node("Relu", ["x"], ["b"], name="r2"),
        helper.make_node("Add", ["a", "b"], ["y"], name="add"),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])
    graph = import_model(
        helper.make_model(
            helper.make_graph(nodes, "g", [x], [y]),
            opset_imports=[helper.make_opsetid("", 18)],
        )
    )
    pattern = Pattern(
        "diamond",
        (PNode.of("add", "Add"), PNode.of("p", "Relu"), PNode.of("q", "Relu")),
        (("p", "add", -1), ("q", "add", -1)),
        "add",
    )
    fast = _embeddings(find_matches(graph, pattern, "add"))
    assert fast == _embeddings(find_matches_vf2(graph, pattern, "add"))
    assert len(fast) == 2
    fixed = Pattern(
        "diamond",
        (PNode.of("add", "Add"), PNode.of("p", "Relu"), PNode.of("q", "Relu")),
        (("p", "add", 1), ("q", "add", 0)),
        "add",
    )
    assert _embeddings(find_matches(graph, fixed, "add")) == [
        (("add", "add"), ("p", "r2"), ("q", "r1"))
    ]
