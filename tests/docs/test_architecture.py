"""The layers of docs/architecture.md hold: every import of the source tree points down.

The imports are read from the files (AST), whether at the top of a module or inside a function.
A unit is a package (`onnx2bir.codegen`, `onnx2bir.runtime.machine`, ...) or a top-level module
(`onnx2bir.compiler`); a unit may import only units of lower layers. Units of one layer do not
import each other, and nothing imports the command line.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCE = {"onnx2bir": "onnx2bir", "patterns": "onnx2bir.patterns", "runtime": "onnx2bir.runtime"}

# Bottom to top: the picture and the list of docs/architecture.md.
LAYERS = [
    ["onnx2bir.errors", "onnx2bir.gc_pause"],
    [
        "onnx2bir.options",
        "onnx2bir.output_paths",
        "onnx2bir.bir",
        "onnx2bir.op_traits",
        "onnx2bir.ray_cluster",
    ],
    ["onnx2bir.graph"],
    ["onnx2bir.frontend", "onnx2bir.runtime.timing"],
    ["onnx2bir.codegen", "onnx2bir.runtime.machine", "onnx2bir.runtime.oracle"],
    ["onnx2bir.kernels"],
    ["onnx2bir.patterns"],
    ["onnx2bir.compiler"],
    ["onnx2bir.validation"],
    ["onnx2bir.reporting"],
    ["onnx2bir.api", "onnx2bir.sweep", "onnx2bir.debug"],
    ["onnx2bir.cli"],
    ["onnx2bir.__main__"],
]
LAYER = {unit: level for level, units in enumerate(LAYERS) for unit in units}


def _modules() -> dict[str, Path]:
    found = {}
    for folder, package in SOURCE.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            name = ".".join((package, *parts)).removesuffix(".__init__")
            found[name] = path
    return found


MODULES = _modules()


def unit_of(module: str) -> str | None:
    """The layer unit a module belongs to (None: the root package, which only names the API,
    and the runtime's, which only holds its three packages)."""
    if module in ("onnx2bir", "onnx2bir.runtime"):
        return None
    for unit in sorted(LAYER, key=len, reverse=True):
        if module == unit or module.startswith(unit + "."):
            return unit
    raise AssertionError(f"{module} is in no layer of docs/architecture.md")


def imports_of(module: str) -> set[str]:
    """The onnx2bir modules `module` imports (a name imported from a package counts as the
    submodule when there is one)."""
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level:
            raise AssertionError(f"{module}: relative import (the layers are read by name)")
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("onnx2bir"):
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in MODULES else node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("onnx2bir"))
    return found


def test_every_module_is_in_a_layer():
    for module in MODULES:
        unit_of(module)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_point_down(module):
    own = unit_of(module)
    if own is None:
        return
    for target in sorted(imports_of(module)):
        other = unit_of(target)
        if other is None or other == own:
            continue
        assert LAYER[other] < LAYER[own], (
            f"{module} ({own}, layer {LAYER[own]}) imports {target} ({other}, layer "
            f"{LAYER[other]}): imports point down (docs/architecture.md#layers)"
        )


def test_a_violation_is_seen():
    """The walk would catch an upward import: the runtime reading the compiler."""
    fake = ast.parse("from onnx2bir.compiler import compile_model")
    target = fake.body[0].module
    assert LAYER[unit_of(target)] > LAYER[unit_of("onnx2bir.runtime.machine.interpreter")]


def test_every_package_is_installed():
    """pyproject.toml lists each package of the tree (a package left out is missing from an
    install, and from `pip install -e`'s mapping of patterns/ and runtime/)."""
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    listed = set(re.findall(r'^\s+"(onnx2bir[a-z_.]*)",$', text, flags=re.M))
    packages = {module for module, path in MODULES.items() if path.name == "__init__.py"} | {
        "onnx2bir"
    }
    assert packages == listed
