"""The ONNX backend test suite (onnx.backend.test) on `onnx2bir.api.backend`, plus the rep's own
tests.

In: every case onnx ships (node, pytorch-converted, pytorch-operator, simple, real). Out: one
unittest method per case and device, as `BackendTest` builds them. A case runs if onnx2bir
claims all of its ops; known failures are strict xfails with the reason and the expected
exception from `expected_failures.toml`. Expected outputs are the suite's own (numpy for node
cases, stored .pb files for the others), compared at the suite's rtol 1e-3 / atol 1e-7.

Which cases run (docs/backend_tests.md):
- a case's op types are those of the nodes in its model's graph: a direct node case is one node
  (test_conv_with_strides_padding → {Conv}); an `_expanded` case is the op's function body
  (test_softmax_axis_0_expanded → {ReduceMax, Sub, Exp, ReduceSum, Div});
- the case runs if every op type is in `GENERIC_LOWERINGS` (read at import, so a new lowering
  brings its cases in) or is folded by the importer (`FOLDED_OPS`), and every graph input,
  output and initializer is a tensor of a machine dtype; otherwise `BackendTest.exclude`
  skips it, with the reason at the head of the pattern (`pytest -rs` shows it);
- real ("light") models are excluded: their weights are all 0.02 and the reference output is
  written by onnx's ReferenceEvaluator into ~/.onnx; tests/models runs the same topologies
  with seeded random weights against onnxruntime instead.

Only the CPU device is claimed, so the suite itself skips every `_cuda` variant. The whole run
takes 15-30 s on 2 cores (about 7 s of it is onnx building the node cases): nothing is `slow`.
"""

from __future__ import annotations

import re
import tomllib
import warnings
from collections import defaultdict
from pathlib import Path

import numpy as np
import onnx
import onnx.backend.test
import pytest
from onnx import TensorProto, helper

from onnx2bir.api.backend import Onnx2BirBackend, Onnx2BirRep
from onnx2bir.bir.enums import Dtype
from onnx2bir.codegen import GENERIC_LOWERINGS
from onnx2bir.errors import MachineError, UserError

EXPECTED_FAILURES = Path(__file__).with_name("expected_failures.toml")
# The importer folds every Constant, and every Shape and Size (all shapes are static there).
FOLDED_OPS = frozenset({"Constant", "Shape", "Size"})
# Ops the quantized models' passes rewrite into lowered ones (patterns/quant).
QUANT_PASS_OPS = frozenset(
    {"QLinearConv", "QLinearMatMul", "ConvInteger", "MatMulInteger", "DynamicQuantizeLinear"}
)
SUPPORTED_OPS = frozenset(GENERIC_LOWERINGS) | FOLDED_OPS | QUANT_PASS_OPS
MACHINE_ELEM_TYPES = frozenset(
    helper.np_dtype_to_tensor_dtype(dtype.numpy) for dtype in Dtype if not dtype.autocast_only
)
OUT_OF_SCOPE = {"Real": "light real model: constant 0.02 weights, ReferenceEvaluator output"}
RAISES = {
    "UserError": UserError,
    "MachineError": MachineError,
    "AssertionError": AssertionError,
    "ValueError": ValueError,
    "AttributeError": AttributeError,
}


class RecordingBackendTest(onnx.backend.test.BackendTest):
    """BackendTest that keeps each case it builds, so the plan reads the same models."""

    def __init__(self, *args, **kwargs) -> None:
        # Building the node cases takes ~6 s; keeping them avoids building them twice.
        self.cases: dict[str, tuple[str, object]] = {}
        super().__init__(*args, **kwargs)

    def _add_model_test(self, model_test, kind: str) -> None:
        self.cases[model_test.name] = (kind, model_test)
        super()._add_model_test(model_test, kind)


def case_model(model_test) -> onnx.ModelProto:
    """The case's model: in memory for node cases, model.onnx for the others."""
    if model_test.model is not None:
        return model_test.model
    return onnx.load(str(Path(model_test.model_dir) / "model.onnx"))


def op_types(model: onnx.ModelProto) -> set[str]:
    return {
        node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"
        for node in model.graph.node
    }


def exclusion_reason(kind: str, model_test) -> str | None:
    """Why onnx2bir does not run a case, or None if it does."""
    if kind in OUT_OF_SCOPE:
        return OUT_OF_SCOPE[kind]
    model = case_model(model_test)
    unsupported = sorted(op_types(model) - SUPPORTED_OPS)
    if unsupported:
        return f"no generic lowering for {', '.join(unsupported)}"
    graph = model.graph
    for value in [*graph.input, *graph.output]:
        if not value.type.HasField("tensor_type"):
            return f"{value.type.WhichOneof('value')} input or output"
    elem_types = [value.type.tensor_type.elem_type for value in [*graph.input, *graph.output]]
    elem_types += [init.data_type for init in graph.initializer]
    for elem_type in elem_types:
        if elem_type not in MACHINE_ELEM_TYPES:
            return f"dtype {TensorProto.DataType.Name(elem_type)} is not a machine dtype"
    return None


def load_expected_failures(path: Path = EXPECTED_FAILURES) -> list[dict]:
    """The [[xfail]] entries: `cases` (regex), `raises` and `reason`."""
    with path.open("rb") as file:
        entries = tomllib.load(file).get("xfail", [])
    for entry in entries:
        if set(entry) != {"cases", "raises", "reason"} or entry["raises"] not in RAISES:
            raise ValueError(f"{path.name}: malformed entry {entry}")
    return entries


def expected_failure(name: str) -> dict | None:
    for entry in XFAIL:
        if re.fullmatch(entry["cases"], name, re.VERBOSE):
            return entry
    return None


def build_suite() -> tuple[RecordingBackendTest, dict[str, str]]:
    """The suite with every case onnx2bir does not run excluded; returns the exclusions too."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # numpy overflow warnings from onnx's case generators
        suite = RecordingBackendTest(Onnx2BirBackend, __name__)
    excluded = {}
    for name, (kind, model_test) in suite.cases.items():
        reason = exclusion_reason(kind, model_test)
        if reason is not None:
            excluded[name] = reason
    by_reason = defaultdict(list)
    for name, reason in excluded.items():
        by_reason[reason].append(name)
    for reason, names in sorted(by_reason.items()):
        alternatives = "|".join(re.escape(name) for name in sorted(names))
        # One pattern per reason, the reason first as a regex comment (it ends at a ")").
        comment = reason.replace("(", "[").replace(")", "]")
        suite.exclude(f"(?#{comment})^(?:{alternatives})_(?:cpu|cuda)$")
    return suite, excluded


XFAIL = load_expected_failures()
SUITE, EXCLUDED = build_suite()
INCLUDED = frozenset(SUITE.cases) - set(EXCLUDED)


def mark_expected_failures(test_cases: dict[str, type]) -> dict[str, type]:
    for test_case in test_cases.values():
        for attribute in dir(test_case):
            name = attribute.removesuffix("_cpu")
            if name == attribute or name not in INCLUDED:
                continue
            entry = expected_failure(name)
            if entry is not None:
                mark = pytest.mark.xfail(
                    reason=entry["reason"], raises=RAISES[entry["raises"]], strict=True
                )
                setattr(test_case, attribute, mark(getattr(test_case, attribute)))
    return test_cases


globals().update(mark_expected_failures(SUITE.test_cases))


def test_every_expected_failure_names_a_case_that_runs():
    """An entry matching no case that runs is stale (the case left or was renamed)."""
    stale = [
        entry["cases"]
        for entry in XFAIL
        if not any(re.fullmatch(entry["cases"], name, re.VERBOSE) for name in INCLUDED)
    ]
    assert not stale, f"expected_failures.toml entries that match no running case: {stale}"


# --- the rep itself: what the suite does not exercise ------------------------------------------


def relu_model(shape: list) -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


def test_symbolic_dims_are_fixed_from_the_inputs_and_recompiled_per_shape():
    rep = Onnx2BirBackend.prepare(relu_model(["N", 4]))
    for rows in (2, 3, 2):
        x = np.random.default_rng(rows).standard_normal((rows, 4)).astype(np.float32)
        np.testing.assert_array_equal(rep.run([x])[0], np.maximum(x, 0))
    assert rep.compiled_shapes == [((2, 4),), ((3, 4),)]


def test_a_static_dim_that_the_input_contradicts_is_refused():
    rep = Onnx2BirBackend.prepare(relu_model([2, 4]))
    with pytest.raises(ValueError, match="declares"):
        rep.run([np.zeros((3, 4), np.float32)])


def test_outputs_follow_graph_output_order_with_declared_dtypes():
    nodes = [
        helper.make_node("Add", ["a", "b"], ["total"]),
        helper.make_node("Mul", ["a", "b"], ["product"]),
    ]
    graph = helper.make_graph(
        nodes,
        "two_outputs",
        [helper.make_tensor_value_info(name, TensorProto.INT64, [3]) for name in "ab"],
        [
            helper.make_tensor_value_info(name, TensorProto.INT64, [3])
            for name in ("product", "total")
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    a, b = np.array([1, 2, 3], np.int64), np.array([4, 5, 6], np.int64)
    outputs = Onnx2BirBackend.run_model(model, {"b": b, "a": a})
    np.testing.assert_array_equal(outputs[0], a * b)
    np.testing.assert_array_equal(outputs["total"], a + b)
    assert outputs[0].dtype == np.int64 and outputs.total.dtype == np.int64


def test_run_node_wraps_one_node_in_a_model():
    x = np.linspace(-2, 2, 12, dtype=np.float32).reshape(3, 4)
    (y,) = Onnx2BirBackend.run_node(
        helper.make_node("Softmax", ["x"], ["y"], axis=1), [x], opset_version=13
    )
    expected = np.exp(x) / np.exp(x).sum(axis=1, keepdims=True)
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-6)


def test_only_the_cpu_device_is_supported():
    assert Onnx2BirBackend.supports_device("CPU")
    assert not Onnx2BirBackend.supports_device("CUDA")
    assert not Onnx2BirBackend.supports_device("NEURON")
    assert isinstance(Onnx2BirBackend.prepare(relu_model([1]), "CPU", rtol=1e-3), Onnx2BirRep)
