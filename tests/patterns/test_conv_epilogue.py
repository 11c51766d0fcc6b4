"""FuseConvActivation (patterns/conv/epilogue.py, docs/conv_selection.md#fused-activations): a
Relu that only a conv reads runs on the conv's PSUM eviction, on every conv lowering that
evicts through ScalarE, and the program still computes what onnxruntime computes."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from conftest import assert_matches_onnxruntime, make_model
from onnx import helper

from onnx2bir.bir.enums import ActFunc, Opcode
from onnx2bir.compiler import compile_graph, import_graph
from onnx2bir.options import CompileOptions
from onnx2bir.patterns.conv.bridges import FoldConvLayoutBridges
from onnx2bir.patterns.conv.epilogue import FuseConvActivation
from onnx2bir.patterns.conv.selection import TransformConvOp
from onnx2bir.runtime.machine.interpreter import run_function
from onnx2bir.runtime.oracle.compare import FP32_ATOL, FP32_RTOL, compare_output
from onnx2bir.runtime.oracle.ort import run_onnxruntime, synthesize_inputs


def _w(seed: int, *shape: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32)


def _chain(c_in: int = 16, groups: int = 1, kernel: int = 3, height: int = 14, width: int = 14):
    """Conv(c_in -> 32, kernel, bias) -> Relu -> Conv(32 -> 24, 1x1) -> Relu: about half of each
    conv's outputs are negative, so a Relu left out changes the numbers."""
    pad = kernel // 2
    nodes = [
        helper.make_node(
            "Conv", ["x", "w0", "b0"], ["c0"], name="c0", pads=[pad] * 4, group=groups
        ),
        helper.make_node("Relu", ["c0"], ["r0"], name="r0"),
        helper.make_node("Conv", ["r0", "w1"], ["c1"], name="c1"),
        helper.make_node("Relu", ["c1"], ["y"], name="r1"),
    ]
    inits = {
        "w0": _w(1, 32, c_in // groups, kernel, kernel),
        "b0": _w(2, 32),
        "w1": _w(3, 24, 32, 1, 1),
    }
    return make_model(nodes, {"x": (1, c_in, height, width)}, {"y": None}, initializers=inits)


KERNELS = [TransformConvOp(), FoldConvLayoutBridges(), FuseConvActivation()]
GENERIC = [FuseConvActivation()]


def _compile(model, passes):
    return compile_graph(import_graph(model), CompileOptions(auto_cast="none"), passes)


def _evictions(module) -> list[str]:
    """The functions of the ScalarE activations that read PSUM."""
    fn = module.functions[0]
    return [
        i.attrs["func"]
        for i in fn.instructions()
        if i.opcode is Opcode.ACTIVATION
        and fn.memory_locations[i.srcs["in"].loc].memory.value == "PSUM"
    ]


@pytest.mark.parametrize(
    "model, passes, lowering",
    [
        (_chain(), KERNELS, "rep_nhwc kernels"),
        # 400 rows of 122 padded columns replicated per kernel row overflow SBUF: no rep_nhwc
        (_chain(c_in=3, height=400, width=120), KERNELS, "column packing, then a generic conv"),
        (_chain(c_in=32, groups=32), KERNELS, "the 2-D depthwise kernel, then rep_nhwc"),
        (_chain(), GENERIC, "generic convs, weights stationary"),
        (_chain(groups=2), GENERIC, "generic convs, block by block"),
    ],
)
def test_relus_run_on_the_evictions(model, passes, lowering):
    compiled = _compile(model, passes)
    assert not [n for n, d in compiled.graph.nodes() if d["op_type"] == "Relu"], lowering
    stats = {s.name: s.value for s in compiled.passes.result_of("FuseConvActivation").statistics}
    assert stats == {"fused": 2}
    assert set(_evictions(compiled.module)) == {ActFunc.RELU.value}, lowering
    assert_matches_onnxruntime(model, passes=passes)


def test_a_relu_beside_another_reader_stays():
    """c0 feeds the Relu and the Add: the Relu cannot move into the conv, and the finding
    says why; c1's Relu still fuses."""
    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["c0"], name="c0", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c0"], ["r0"], name="r0"),
        helper.make_node("Conv", ["r0", "w1"], ["c1"], name="c1"),
        helper.make_node("Relu", ["c1"], ["r1"], name="r1"),
        helper.make_node("Add", ["r1", "c0"], ["y"], name="skip"),
    ]
    inits = {"w0": _w(1, 8, 8, 3, 3), "w1": _w(3, 8, 8, 1, 1)}
    model = make_model(nodes, {"x": (1, 8, 10, 10)}, {"y": None}, initializers=inits)
    compiled = _compile(model, GENERIC)
    relus = [n for n, d in compiled.graph.nodes() if d["op_type"] == "Relu"]
    assert relus == ["r0"]
    findings = compiled.passes.result_of("FuseConvActivation").findings
    (refusal,) = [f for f in findings if "reason" in f]
    assert refusal["node"] == "c0" and "has 2 readers" in refusal["reason"]
    (fusion,) = [f for f in findings if "fused" in f]
    assert fusion == {"nodes": ["c1", "r1"], "host": "c1", "fused": "r1"}
    assert_matches_onnxruntime(model, passes=GENERIC)


def test_a_conv_that_is_a_graph_output_keeps_its_relu():
    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["c0"], name="c0"),
        helper.make_node("Relu", ["c0"], ["y"], name="r0"),
    ]
    model = make_model(
        nodes, {"x": (1, 4, 6, 6)}, {"c0": None, "y": None}, initializers={"w0": _w(1, 4, 4, 1, 1)}
    )
    compiled = _compile(model, GENERIC)
    assert [n for n, d in compiled.graph.nodes() if d["op_type"] == "Relu"] == ["r0"]
    (finding,) = compiled.passes.result_of("FuseConvActivation").findings
    assert "graph output" in finding["reason"]


@dataclass(frozen=True)
class _DropRelus:
    """Fuses, then forgets the activation the convs were to apply: the Relus are gone and the
    evictions copy."""

    name: str = "DropRelus"

    def run(self, graph, options):
        result = FuseConvActivation().run(graph, options)
        for _, data in graph.nodes():
            data["attrs"].pop("fused_activation", None)
        return result


def test_a_dropped_relu_is_caught():
    model = _chain()
    compiled = _compile(model, [_DropRelus()])
    assert set(_evictions(compiled.module)) == {ActFunc.COPY.value}
    feeds = synthesize_inputs(compiled.graph, 0)
    got = run_function(compiled.module, feeds)
    want = run_onnxruntime(model, feeds)
    assert not compare_output("y", got["y"], want["y"], FP32_ATOL, FP32_RTOL).passed
