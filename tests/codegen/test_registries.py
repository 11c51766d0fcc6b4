"""The registries are explicit tables, and complete (docs/architecture.md#registries): every
lowering module is in the lowering table, every table key is an ONNX op, every kernel name a
pass can write has a tracer and every tracer a name. (The opcode semantics table has its own
completeness test, tests/runtime/test_semantics.py.)"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
from pathlib import Path

import onnx.defs

from onnx2bir.codegen import lower
from onnx2bir.codegen.lower import GENERIC_LOWERINGS
from onnx2bir.compiler import kernel_table
from onnx2bir.kernels import KERNELS, attention, mlp
from onnx2bir.op_traits import traits
from onnx2bir.patterns.conv.selection import (
    EXPERIMENTAL_KERNEL_REGISTRY,
    FUNCTIONAL_KERNEL_REGISTRY,
)

# Lowering modules reached through another lowering, not through the table: the 3-D conv and
# pool fold their depth into the 2-D ones (lower/conv.py and lower/pool.py dispatch to them),
# and the generic conv's weight-stationary order (lower/conv.py dispatches to it).
SUB_LOWERINGS = {"conv3d", "pool3d", "conv_stationary"}


def test_every_lowering_module_is_in_the_table():
    modules = {m.name for m in pkgutil.iter_modules(lower.__path__)}
    in_table = {fn.__module__.rsplit(".", 1)[1] for fn in GENERIC_LOWERINGS.values()}
    assert modules - in_table == SUB_LOWERINGS
    for name in SUB_LOWERINGS:  # and the modules that reach them import them
        importlib.import_module(f"onnx2bir.codegen.lower.{name}")


def test_every_table_entry_is_an_onnx_op_and_a_lowering_function():
    for key, function in GENERIC_LOWERINGS.items():
        domain, _, op_type = key.rpartition(".")
        if domain:  # a vendor op onnx does not define: the front end must know its shapes
            assert traits(key).output_like_input, key
        else:
            assert onnx.defs.has(op_type), f"{key} is not an ONNX op"
        assert function.__module__.startswith("onnx2bir.codegen.lower.")
        assert list(inspect.signature(function).parameters)[:2] == ["cg", "node"], key


def test_every_kernel_name_a_pass_writes_has_a_tracer():
    table = kernel_table()
    written = [*attention.TARGETS, mlp.TARGET, *(row.name for row in FUNCTIONAL_KERNEL_REGISTRY)]
    assert [name for name in written if name not in table] == []
    assert all(row.trace is not None for row in FUNCTIONAL_KERNEL_REGISTRY)
    assert set(KERNELS) == {*attention.TARGETS, mlp.TARGET}


def test_every_tracer_answers_to_a_name_and_one_name_to_one_tracer():
    rows = [*FUNCTIONAL_KERNEL_REGISTRY, *EXPERIMENTAL_KERNEL_REGISTRY]
    traced: dict[str, object] = {}
    for row in rows:
        if row.trace is not None:
            assert traced.setdefault(row.name, row.trace) is row.trace, row.name
    assert all(row.trace is None for row in EXPERIMENTAL_KERNEL_REGISTRY)  # disabled rows
    assert set(kernel_table()) == set(KERNELS) | set(traced)


def test_lowerings_and_kernels_read_nodes_through_the_typed_view():
    """`node.attr("axis", 0)`, `node.inputs`: no lowering or kernel reads the raw node dict
    by string key (docs/architecture.md#registries)."""
    raw = re.compile(r'\b\w+\["(attrs|inputs|outputs|op_type|name|domain)"\]')
    root = Path(lower.__file__).parents[1]
    files = [*(root / "lower").glob("*.py"), *(root.parent / "kernels").rglob("*.py")]
    hits = [
        f"{path.relative_to(root.parent)}:{number}"
        for path in files
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if raw.search(line)
    ]
    assert hits == []
