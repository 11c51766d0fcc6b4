"""No class of the code generator has more than `MAX_ATTRIBUTES` attributes
(docs/architecture.md#codegen).

A class's attributes, read from the source (AST): the names annotated in its body (a
dataclass's or NamedTuple's fields) and every `self.<name>` its methods assign. A class that
needs more holds its state in collaborators, as `BirCodeGen` holds its emitter, arena and
residency.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

CODEGEN = Path(__file__).resolve().parents[2] / "onnx2bir" / "codegen"
MAX_ATTRIBUTES = 15


def attributes(cls: ast.ClassDef) -> set[str]:
    names = {
        node.target.id
        for node in cls.body
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
    }
    for node in ast.walk(cls):
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign | ast.AugAssign):
            targets = [node.target]
        else:
            continue
        for target in targets:
            for part in ast.walk(target):
                if (
                    isinstance(part, ast.Attribute)
                    and isinstance(part.value, ast.Name)
                    and part.value.id == "self"
                ):
                    names.add(part.attr)
    return names


def classes() -> list[tuple[str, ast.ClassDef]]:
    found = []
    for path in sorted(CODEGEN.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                found.append((f"{path.relative_to(CODEGEN)}:{node.name}", node))
    return found


def test_the_count_reads_fields_and_self_assignments():
    source = """
class A:
    x: int
    def __init__(self):
        self.y = 1
        self.z: int = 2
        self.y += 1
        self.a, (self.b, other) = 1, (2, 3)
        other.c = 4
"""
    (cls,) = [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ClassDef)]
    assert attributes(cls) == {"x", "y", "z", "a", "b"}


def test_the_code_generator_has_classes_to_read():
    names = {name.split(":")[1] for name, _ in classes()}
    assert {"BirCodeGen", "Emitter", "Arena", "Residency"} <= names


@pytest.mark.parametrize("name, cls", classes(), ids=[name for name, _ in classes()])
def test_no_class_has_more_than_fifteen_attributes(name: str, cls: ast.ClassDef):
    found = attributes(cls)
    assert len(found) <= MAX_ATTRIBUTES, f"{name}: {len(found)} attributes {sorted(found)}"
