"""DecomposeAttention's matcher rooted at the second dot: the read-back of every expansion,
and each of the reference's diagnostics on a graph that lacks what it looks for."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx2bir.frontend.importer import import_model
from onnx2bir.options import CompileOptions
from onnx2bir.patterns.attention.decompose import DecomposeAttention
from onnx2bir.patterns.attention.decompose_match import (
    NO_DIVIDE,
    NO_DOT,
    NO_SELECT,
    NO_SOFTMAX,
    explore,
)


def graph_of(nodes, inits=()):
    shape = [1, 2, 4, 4]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in ("q", "k", "v")],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
        [numpy_helper.from_array(np.asarray(v, np.float32), n) for n, v in inits],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    return import_model(model)


def run_explore(graph, masked=False, scaled=False):
    def producer(tensor):
        node = graph.producer(tensor)
        if node is None:
            return None
        data = graph.node(node)
        return node, data["op_type"], list(data["inputs"])

    def scalar(tensor):
        info = graph.tensors.get(tensor)
        return info is not None and info.is_const and info.const.size == 1

    dot2 = graph.node("pv")
    return explore(producer, scalar, ("pv", "MatMul", list(dot2["inputs"])), masked, scaled)


def block(*score_nodes, softmax="Softmax"):
    nodes = [helper.make_node("MatMul", ["q", "k"], ["s0"], name="qk"), *score_nodes]
    last = score_nodes[-1].output[0] if score_nodes else "s0"
    nodes += [
        helper.make_node(softmax, [last], ["p"], name="softmax"),
        helper.make_node("MatMul", ["p", "v"], ["y"], name="pv"),
    ]
    return nodes


SCALE = helper.make_node("Mul", ["s0", "c"], ["s1"], name="scale")
MASK = helper.make_node("Add", ["s1", "m"], ["s2"], name="mask")
INITS = [("c", 0.5), ("m", np.triu(np.full((4, 4), -1e4), 1))]  # not all zero: kept at import


def test_masked_scaled_block_reads_back():
    found = run_explore(graph_of(block(SCALE, MASK), INITS), masked=True, scaled=True)
    assert found.dot1 == "qk" and found.select and found.scale and found.softmax == "native"


@pytest.mark.parametrize(
    "nodes, masked, scaled, diagnostic",
    [
        (block(SCALE, softmax="Relu"), False, True, NO_SOFTMAX),
        (block(SCALE), True, True, NO_SELECT),
        (block(helper.make_node("Add", ["s0", "m"], ["s1"], name="mask")), True, True, NO_DIVIDE),
        (
            [
                helper.make_node("Softmax", ["q"], ["p"], name="softmax"),
                helper.make_node("MatMul", ["p", "v"], ["y"], name="pv"),
            ],
            False,
            False,
            NO_DOT,
        ),
    ],
)
def test_diagnostics(nodes, masked, scaled, diagnostic):
    assert run_explore(graph_of(nodes, INITS), masked, scaled) == diagnostic


def test_every_decomposition_is_read_back_before_it_is_written():
    node = helper.make_node("Attention", ["q", "k", "v", "mask"], ["y"], is_causal=0, scale=0.3)
    graph = helper.make_graph(
        [node],
        "g",
        [
            *(helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 2, 4, 8]) for n in "qkv"),
            helper.make_tensor_value_info("mask", TensorProto.BOOL, [4, 4]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 4, 8])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)], ir_version=10)
    imported = import_model(model)
    (finding,) = DecomposeAttention().run(imported, CompileOptions()).findings
    assert finding["decomposed"]
    explored = finding["explored"]
    assert explored["softmax"] == "stable" and explored["select"] and explored["scale"]
    assert explored["dot1"].endswith("/decomposed/qk")
