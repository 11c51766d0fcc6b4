"""The dependency analysis orders exactly what the reference analysis orders.

`deps_equivalence.compare` compiles a model twice, with `codegen/deps.py` and with the
reference analysis kept in `reference_deps.py`, and compares the happens-before order of
every instruction instance (vector clocks over the unrolled program); it also checks that an
edge is never added, only left out where another path already orders the pair
(docs/dependencies.md#equivalence).
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from deps_equivalence import compare, compare_functions  # noqa: E402

from onnx2bir.bir.enums import DepKind  # noqa: E402
from onnx2bir.bir.ir import Dependency  # noqa: E402
from onnx2bir.compiler import compile_model  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
ZOO = sorted(p.name for p in (ROOT / "models").glob("*.onnx"))
DEPTHS = (2, 12, 24)  # models/bert_depth.py exports them into models/.cache


@pytest.mark.parametrize("name", ZOO)
def test_zoo_model_is_ordered_as_by_the_reference(name):
    result = compare(ROOT / "models" / name)
    assert result.mismatch is None, result.mismatch
    assert result.edges <= result.reference_edges


@pytest.mark.slow
@pytest.mark.parametrize("layers", DEPTHS)
def test_deep_bert_is_ordered_as_by_the_reference(layers):
    path = ROOT / "models" / ".cache" / f"bert_h256_L{layers}.onnx"
    if not path.exists():
        pytest.skip(f"{path.name} not exported (models/bert_depth.py)")
    result = compare(path)
    assert result.mismatch is None, result.mismatch
    assert result.edges <= result.reference_edges


def test_the_comparison_sees_a_missing_edge_and_an_added_one():
    function = compile_model(ROOT / "models" / "mha.onnx").module.functions[0]
    assert compare_functions(function, copy.deepcopy(function)) is None
    # An edge no other path implies: the one whose loss changes the most clocks is found by
    # trying each; at least one edge of a real model is not implied by the others.
    weakened = copy.deepcopy(function)
    found = False
    for inst in weakened.instructions():
        for i, dep in enumerate(list(inst.deps)):
            inst.deps.pop(i)
            if compare_functions(function, weakened) is not None:
                found = True
                break
            inst.deps.insert(i, dep)
        if found:
            break
    assert found
    # An edge the reference does not have is refused even when it changes no order.
    extended = copy.deepcopy(function)
    instructions = list(extended.instructions())
    late = instructions[-1]
    sources = {d.source for d in late.deps}
    early = next(i for i in instructions if i.stream != late.stream and i.id not in sources)
    late.deps.append(Dependency(early.id, DepKind.ORDERED))
    assert "not in the reference" in compare_functions(function, extended)
