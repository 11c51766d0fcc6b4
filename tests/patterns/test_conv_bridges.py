"""FoldConvLayoutBridges (patterns/conv/bridges.py, docs/conv_selection.md#bridges): a conv
kernel reads and writes the framework's tensors through its strides, the Transposes that
bridged them are gone, and the program still computes what onnxruntime computes."""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pytest
from conftest import assert_matches_onnxruntime, make_model
from onnx import helper

from onnx2bir.compiler import compile_graph, import_graph
from onnx2bir.errors import MachineError
from onnx2bir.options import CompileOptions
from onnx2bir.patterns.conv.bridges import FoldConvLayoutBridges
from onnx2bir.patterns.conv.selection import REP_NHWC, TransformConvOp
from onnx2bir.runtime.machine.interpreter import run_function
from onnx2bir.runtime.machine.uninit import run_checked
from onnx2bir.runtime.oracle.compare import FP32_ATOL, FP32_RTOL, compare_output
from onnx2bir.runtime.oracle.ort import run_onnxruntime, synthesize_inputs


def _w(seed: int, *shape: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32)


def _chain(batch: int = 1):
    """Conv(16 -> 32, 3x3) -> Relu -> Conv(32 -> 24, 1x1) -> Add(x-shaped skip): both convs go
    to rep_nhwc (C_in x kH <= 128), each bridged in and out."""
    nodes = [
        helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], name="c0", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c0"], ["r0"], name="r0"),
        helper.make_node("Conv", ["r0", "w1"], ["c1"], name="c1"),
        helper.make_node("Relu", ["c1"], ["y"], name="r1"),
    ]
    inits = {"w0": _w(1, 32, 16, 3, 3), "b0": _w(2, 32), "w1": _w(3, 24, 32, 1, 1)}
    return make_model(nodes, {"x": (batch, 16, 12, 12)}, {"y": None}, initializers=inits)


def _passes():
    return [TransformConvOp(), FoldConvLayoutBridges()]


def _compile(model, passes):
    return compile_graph(import_graph(model), CompileOptions(auto_cast="none"), passes)


def test_the_bridges_fold_into_the_kernels():
    compiled = _compile(_chain(), _passes())
    graph = compiled.graph
    kernels = [d for _, d in graph.nodes() if d["op_type"] == "NativeKernel"]
    assert [d["attrs"]["func_name"] for d in kernels] == [REP_NHWC, REP_NHWC]
    assert not [n for n, d in graph.nodes() if d["op_type"] == "Transpose"]
    # each kernel reads and writes NCHW: the canonical (b, f, 0, 1) axes in order
    for data in kernels:
        attrs = json.loads(data["attrs"]["attrs"])
        assert attrs["in_perm"] == [0, 1, 2, 3] and attrs["out_perm"] == [0, 1, 2, 3]
    stats = {s.name: s.value for s in compiled.passes.result_of("FoldConvLayoutBridges").statistics}
    assert stats == {"folded_input_bridges": 2, "folded_output_bridges": 2}
    # the conv between the two Relus is written straight into an SBUF home
    assert compiled.memory_plan.decisions["c0"].resident


def test_folded_kernels_match_onnxruntime():
    for batch in (1, 2):
        assert_matches_onnxruntime(_chain(batch), passes=_passes())


def test_without_the_fold_the_bridges_stay():
    graph = _compile(_chain(), [TransformConvOp()]).graph
    transposes = sorted(n for n, d in graph.nodes() if d["op_type"] == "Transpose")
    assert transposes == [
        "c0/input_transpose",
        "c0/output_transpose",
        "c1/input_transpose",
        "c1/output_transpose",
    ]


@dataclass(frozen=True)
class _ForgetOutputPerm:
    """Folds the bridges, then puts back the kernel's own out_perm: the kernel would write the
    framework's tensor in its 01bf layout."""

    name: str = "ForgetOutputPerm"

    def run(self, graph, options):
        kernels = [d for _, d in graph.nodes() if d["op_type"] == "NativeKernel"]
        before = [json.loads(d["attrs"]["attrs"])["out_perm"] for d in kernels]
        result = FoldConvLayoutBridges().run(graph, options)
        for data, out_perm in zip(kernels, before, strict=True):
            attrs = json.loads(data["attrs"]["attrs"])
            attrs["out_perm"] = out_perm
            data["attrs"]["attrs"] = json.dumps(attrs)
        return result


def test_a_wrong_output_layout_is_caught():
    model = _chain()
    compiled = _compile(model, [TransformConvOp(), _ForgetOutputPerm()])
    feeds = synthesize_inputs(compiled.graph, 0)
    # the machine refuses the Relu's read of the conv result's unwritten elements
    with pytest.raises(MachineError, match="that nothing wrote"):
        run_checked(compiled.module, feeds)
    # and without that check the numbers are wrong
    got = run_function(compiled.module, feeds)
    want = run_onnxruntime(model, feeds)
    assert not compare_output("y", got["y"], want["y"], FP32_ATOL, FP32_RTOL).passed
