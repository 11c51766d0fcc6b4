"""Einsum against onnxruntime over a sweep of equations: matmuls, batched and broadcast
products, transposes, reductions, outer products, ellipses, implicit outputs, three operands."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import assert_matches_onnxruntime
from onnx import TensorProto, helper

from onnx2bir.compiler import compile_graph, import_graph
from onnx2bir.errors import UserError
from onnx2bir.options import CompileOptions

CASES = [
    ("ij,jk->ik", [(5, 7), (7, 3)]),
    ("ij,jk", [(130, 7), (7, 600)]),
    ("bij,bjk->bik", [(3, 4, 5), (3, 5, 6)]),
    ("bhqd,bhkd->bhqk", [(1, 2, 6, 8), (1, 2, 5, 8)]),
    ("bhqk,bhkd->bhqd", [(2, 2, 6, 5), (2, 2, 5, 8)]),
    ("i,i->", [(300,), (300,)]),
    ("ij->ji", [(4, 9)]),
    ("ij->", [(4, 9)]),
    ("ijk->j", [(3, 4, 5)]),
    ("i,j->ij", [(6,), (7,)]),
    ("...ij,...jk->...ik", [(2, 3, 4, 5), (2, 3, 5, 2)]),
    ("...ij,...jk->...ik", [(2, 1, 4, 5), (1, 3, 5, 2)], (2, 3, 4, 2)),
    ("...i,...i", [(3, 4), (3, 4)]),
    ("nhwc,hkc->nhwk", [(1, 4, 5, 8), (4, 6, 8)]),  # MaxViT's relative position logits
    ("abc,cd->abd", [(2, 3, 4), (4, 5)]),
    ("bn,anm,bm->ba", [(2, 3), (4, 3, 5), (2, 5)]),
    ("ij,ij->ij", [(3, 4), (3, 4)]),
    ("bij,jk->bki", [(2, 3, 4), (4, 5)]),
    ("ab,cd->", [(2, 3), (4, 5)]),
]


def _model(equation, shapes, out_shape=None, opset=12):
    names = [f"x{i}" for i in range(len(shapes))]
    graph = helper.make_graph(
        [helper.make_node("Einsum", names, ["y"], equation=equation)],
        "einsum",
        [
            helper.make_tensor_value_info(n, TensorProto.FLOAT, list(s))
            for n, s in zip(names, shapes, strict=True)
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_einsum_matches_onnxruntime(case):
    assert_matches_onnxruntime(_model(*case), passes=[])


@pytest.mark.parametrize("seed", range(6))
def test_einsum_random_equations(seed):
    """Random two-operand equations over letters a-e of random sizes."""
    rng = np.random.default_rng(seed)
    letters = "abcde"
    sizes = {c: int(rng.integers(1, 6)) for c in letters}
    left = "".join(rng.permutation(list(letters))[: rng.integers(1, 5)])
    right = "".join(rng.permutation(list(letters))[: rng.integers(1, 5)])
    pool = sorted(set(left + right))
    out = "".join(rng.permutation(pool)[: rng.integers(0, len(pool) + 1)])
    equation = f"{left},{right}->{out}"
    shapes = [tuple(sizes[c] for c in left), tuple(sizes[c] for c in right)]
    assert_matches_onnxruntime(_model(equation, shapes), passes=[])


def test_a_diagonal_is_refused_with_the_equation():
    graph = import_graph(_model("ii->i", [(3, 3)]))
    with pytest.raises(UserError, match="repeats a letter"):
        compile_graph(graph, CompileOptions(), [])
