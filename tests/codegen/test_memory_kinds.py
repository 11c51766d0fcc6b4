"""Memory kinds of DRAM locations, as createMemLoc decides them (docs/memory_kinds.md).

Weights (the model's initializers) are ExternalInputParameter, their payload carried by the
module and supplied at load time; constants folded at compile time are Const; a weight that is
a graph output is an ExternalOutputParameter; `tensor_memkind` overrides the predicates. Every
case runs on the machine and is compared with onnxruntime.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import assert_matches_onnxruntime, make_model
from onnx import helper, numpy_helper

from onnx2bir.bir.enums import MemoryKind
from onnx2bir.bir.json_io import read_module, write_module
from onnx2bir.bir.verify import verify_module
from onnx2bir.codegen import GENERIC_LOWERINGS, BirCodeGen
from onnx2bir.compiler import compile_model, import_graph, kernel_table
from onnx2bir.options import CompileOptions
from onnx2bir.runtime.machine.interpreter import run_function
from onnx2bir.runtime.oracle.ort import run_onnxruntime

FP32 = CompileOptions(auto_cast="none")  # values compared exactly: no autocast

W = np.arange(12, dtype=np.float32).reshape(3, 4) / 7


def weight_model():
    """y = relu(x @ w) + c, w an initializer, c a Constant node (folded); w is also an output."""
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["m"]),
        helper.make_node("Relu", ["m"], ["r"]),
        helper.make_node(
            "Constant", [], ["c"], value=numpy_helper.from_array(np.full(4, 0.5, np.float32))
        ),
        helper.make_node("Add", ["r", "c"], ["y"]),
    ]
    return make_model(nodes, {"x": (2, 3)}, {"y": (2, 4), "w": (3, 4)}, initializers={"w": W})


def kinds(module) -> dict[str, MemoryKind]:
    return {name: loc.kind for name, loc in module.functions[0].memory_locations.items()}


def test_weights_are_parameters_and_folded_constants_const():
    model = weight_model()
    module = compile_model(model, FP32).module
    found = kinds(module)
    assert found["x"] is MemoryKind.EXTERNAL_INPUT
    # w is read by MatMul and published as a graph output: an ExternalOutputParameter.
    assert found["w"] is MemoryKind.EXTERNAL_OUTPUT_PARAMETER
    assert found["c"] is MemoryKind.CONST
    assert found["y"] is MemoryKind.EXTERNAL_OUTPUT
    assert found["m"] is MemoryKind.INTERNAL
    assert "w:output" not in found  # published in place, no copy
    assert not verify_module(module)
    assert_matches_onnxruntime(model)


def test_a_weight_read_only_is_an_external_input_parameter():
    model = make_model(
        helper.make_node("MatMul", ["x", "w"], ["y"]),
        {"x": (2, 3)},
        {"y": (2, 4)},
        initializers={"w": W},
    )
    module = compile_model(model, FP32).module
    assert kinds(module)["w"] is MemoryKind.EXTERNAL_INPUT_PARAMETER
    np.testing.assert_array_equal(module.constants["w"], W)
    assert_matches_onnxruntime(model)


def test_parameters_are_supplied_at_load_time(tmp_path):
    """The payload travels in the sidecar; a caller may pass other weights when loading."""
    model = make_model(
        helper.make_node("MatMul", ["x", "w"], ["y"]),
        {"x": (2, 3)},
        {"y": (2, 4)},
        initializers={"w": W},
    )
    module = compile_model(model, FP32).module
    json_path, _ = write_module(module, tmp_path, "mm")
    loaded = read_module(json_path)
    assert kinds(loaded)["w"] is MemoryKind.EXTERNAL_INPUT_PARAMETER
    x = np.ones((2, 3), np.float32)
    np.testing.assert_allclose(run_function(loaded, {"x": x})["y"], x @ W, rtol=1e-6)
    other = -W
    got = run_function(loaded, {"x": x, "w": other})["y"]
    np.testing.assert_allclose(got, x @ other, rtol=1e-6)
    ref = run_onnxruntime(model, {"x": x})["y"]
    np.testing.assert_allclose(run_function(loaded, {"x": x})["y"], ref, rtol=1e-6)


def test_tensor_memkind_overrides_the_predicates():
    model = make_model(
        helper.make_node("MatMul", ["x", "w"], ["y"]),
        {"x": (2, 3)},
        {"y": (2, 4)},
        initializers={"w": W},
    )
    graph = import_graph(model)
    override = {"w": MemoryKind.CONST}
    module = BirCodeGen(
        graph, FP32, GENERIC_LOWERINGS, kernel_table(), tensor_memkind=override
    ).run()
    assert kinds(module)["w"] is MemoryKind.CONST
    assert not verify_module(module)
    x = np.ones((2, 3), np.float32)
    np.testing.assert_allclose(run_function(module, {"x": x})["y"], x @ W, rtol=1e-6)


MODELS = Path(__file__).parents[2] / "models"


@pytest.mark.parametrize("model_name", sorted(p.stem for p in MODELS.glob("*.onnx")))
def test_zoo_weights_are_parameters_unless_folded(model_name):
    """Every initializer of the model that reaches the BIR unchanged is a parameter."""
    compilation = compile_model(MODELS / f"{model_name}.onnx")
    found = kinds(compilation.module)
    parameters = compilation.graph.parameters
    placed = [name for name in parameters if name in found]
    assert placed, "every zoo model has weights that reach the BIR unchanged"
    for name in placed:
        assert found[name] in (
            MemoryKind.EXTERNAL_INPUT_PARAMETER,
            MemoryKind.EXTERNAL_OUTPUT_PARAMETER,
        ), (name, found[name])
    # Whatever else holds a payload was computed at compile time (folded or re-laid out).
    for name, kind in found.items():
        if kind is MemoryKind.CONST:
            assert name not in parameters
