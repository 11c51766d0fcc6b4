"""Shared test helpers: one-node ONNX models and the end-to-end check against onnxruntime.

`assert_matches_onnxruntime(model)` compiles the model, runs the BIR on the machine model with
seeded inputs (with the uninitialised-read check on: no instruction may read memory nothing
wrote unless it is marked can_read_uninit), runs onnxruntime on the same inputs and asserts
that every output agrees within `atol + rtol·|reference|`, the comparison of each output shown
in the failure message. `is_copy(inst)` tells a copy from a computation.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from onnx2bir.bir.enums import ActFunc, Opcode
from onnx2bir.bir.ir import Instruction
from onnx2bir.bir.verify import verify_module
from onnx2bir.compiler import compile_graph, import_graph
from onnx2bir.options import CompileOptions
from onnx2bir.runtime.machine.uninit import run_checked
from onnx2bir.runtime.oracle.compare import FP32_ATOL, FP32_RTOL, compare_output
from onnx2bir.runtime.oracle.ort import run_onnxruntime, synthesize_inputs

# onnxruntime 1.2x reads IR version 10 models; opsets up to 21 belong to IR 10.
IR_VERSION = 10

Shape = Sequence[int]


def make_model(
    nodes: onnx.NodeProto | Sequence[onnx.NodeProto],
    inputs: dict[str, Shape],
    outputs: dict[str, Shape | None],
    opset: int = 18,
    initializers: dict[str, np.ndarray] | None = None,
    elem_type: int = TensorProto.FLOAT,
) -> onnx.ModelProto:
    """A checked model of `nodes`; output shapes may be None (left to shape inference)."""
    nodes = [nodes] if isinstance(nodes, onnx.NodeProto) else list(nodes)
    graph = helper.make_graph(
        nodes,
        "test",
        [
            helper.make_tensor_value_info(name, elem_type, list(shape))
            for name, shape in inputs.items()
        ],
        [
            helper.make_tensor_value_info(name, elem_type, None if shape is None else list(shape))
            for name, shape in outputs.items()
        ],
        [
            numpy_helper.from_array(np.asarray(value), name)
            for name, value in (initializers or {}).items()
        ],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=IR_VERSION
    )
    # Output shapes left as None come from onnx's shape inference (strict: a bad model fails).
    model = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    onnx.checker.check_model(model, full_check=True)
    return model


def one_node_model(
    op_type: str,
    inputs: dict[str, Shape],
    out_shape: Shape | None = None,
    opset: int = 18,
    initializers: dict[str, np.ndarray] | None = None,
    extra_inputs: Sequence[str] = (),
    **attrs: object,
) -> onnx.ModelProto:
    """`y = op_type(*inputs, *initializers, *extra_inputs)`; "" in extra_inputs skips a slot."""
    names = [*inputs, *(initializers or {}), *extra_inputs]
    node = helper.make_node(op_type, names, ["y"], **attrs)
    return make_model(node, inputs, {"y": out_shape}, opset, initializers)


class OnnxWriter:
    """Writes a float graph node by node: `input` declares an input, `const` an initializer,
    `op` a node with a fresh output name, `model` the opset-18 model with inferred shapes."""

    def __init__(self):
        self.nodes, self.inputs, self.inits, self.count = [], [], [], 0

    def input(self, name, shape, dtype=TensorProto.FLOAT):
        self.inputs.append(helper.make_tensor_value_info(name, dtype, list(shape)))
        return name

    def const(self, value, dtype=np.float32):
        name = f"c{self.count}"
        self.count += 1
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype), name))
        return name

    def op(self, op_type, inputs, name=None, **attrs):
        out = f"t{self.count}"
        self.count += 1
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=name or out, **attrs))
        return out

    def reshape(self, x, shape):
        return self.op("Reshape", [x, self.const(np.array(shape, np.int64), np.int64)])

    def model(self, output, extra_outputs=()):
        outs = [
            helper.make_tensor_value_info(o, TensorProto.FLOAT, None)
            for o in (output, *extra_outputs)
        ]
        graph = helper.make_graph(self.nodes, "attention", self.inputs, outs, self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
        return onnx.shape_inference.infer_shapes(model)


def is_copy(inst: Instruction) -> bool:
    """A DmaCopy, a TensorCopy, or ScalarE's copy: an Activation of the identity, unscaled and
    without bias (NeuronCore-v2 has no TensorCopy on ScalarE, docs/neuroncore.md#rules)."""
    if inst.opcode in (Opcode.DMA_COPY, Opcode.TENSOR_COPY):
        return True
    return (
        inst.opcode is Opcode.ACTIVATION
        and inst.attrs.get("func") == ActFunc.COPY
        and inst.attrs.get("scale") == 1.0
        and not inst.attrs.get("bias_value")
        and "bias" not in inst.srcs
    )


def assert_matches_onnxruntime(
    model: onnx.ModelProto,
    seed: int = 0,
    atol: float = FP32_ATOL,
    rtol: float = FP32_RTOL,
    feeds: dict[str, np.ndarray] | None = None,
    passes: list | None = None,
) -> dict[str, np.ndarray]:
    """Compile, verify, simulate and compare every output with onnxruntime; returns outputs.

    `passes` None runs the default pattern passes; `[]` runs none, so every node goes to its
    generic lowering.
    """
    # fp32 tolerance: compiled without the autocast (which rounds matmul operands to bf16).
    compiled = compile_graph(import_graph(model), CompileOptions(auto_cast="none"), passes)
    problems = verify_module(compiled.module)
    assert not problems, "the BIR fails the verifier:\n" + "\n".join(problems[:20])
    if feeds is None:
        feeds = synthesize_inputs(compiled.graph, seed)
    got = run_checked(compiled.module, feeds)  # also: no read of unwritten memory
    ref = run_onnxruntime(model, feeds)
    failures = []
    for name, expected in ref.items():
        location = name if name in got else f"{name}:output"
        result = compare_output(name, got[location], expected, atol, rtol)
        if not result.passed:
            failures.append(result.to_json())
    assert not failures, "outputs differ from onnxruntime:\n" + "\n".join(map(str, failures))
    return got
