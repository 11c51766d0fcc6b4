"""Every elementwise lowering computes straight from and into the SBUF homes the memory plan
keeps (docs/memory_planner.md#direct-operands), scratch tiles included: each op sits between
two Negs so its input and output are resident intermediates, and the program is checked
against onnxruntime, in program order and race-free under a random schedule."""

from __future__ import annotations

import re

import numpy as np
import pytest
from conftest import FP32_ATOL, FP32_RTOL, IR_VERSION, is_copy
from onnx import TensorProto, helper, numpy_helper

from onnx2bir.bir.enums import MemoryType
from onnx2bir.bir.verify import verify_module
from onnx2bir.compiler import compile_model
from onnx2bir.options import CompileOptions
from onnx2bir.runtime.machine.interpreter import run_function
from onnx2bir.runtime.machine.schedule import parse_schedule, run_scheduled
from onnx2bir.runtime.oracle.ort import run_onnxruntime

SHAPE = [3, 200, 48]  # 600 rows of 48: five row tiles, the last one partial (predicated)
# 12800 rows of 48: a home 100 x 48 elements wide, past the end of a scratch tile (2 x 2048):
# scratch must be addressed where the walk's tile is, not at the home's offsets.
WIDE = [2, 6400, 48]
SCRATCH_CASES = ["HardSwish", "Elu", "Round", "Mod", "IsInf"]
F32 = TensorProto.FLOAT


def _const(name, value, dtype=np.float32):
    return numpy_helper.from_array(np.asarray(value, dtype), name)


# op -> (nodes from "a" to "b", initializers); "a" and "b" are resident.
CASES = {
    "Gelu": ([helper.make_node("Gelu", ["a"], ["b"])], []),
    "GeluTanh": ([helper.make_node("Gelu", ["a"], ["b"], approximate="tanh")], []),
    "HardSigmoid": ([helper.make_node("HardSigmoid", ["a"], ["b"])], []),
    "HardSwish": ([helper.make_node("HardSwish", ["a"], ["b"])], []),
    "LeakyRelu": ([helper.make_node("LeakyRelu", ["a"], ["b"], alpha=0.1)], []),
    "LeakyReluSteep": ([helper.make_node("LeakyRelu", ["a"], ["b"], alpha=2.0)], []),
    "PRelu": (
        [helper.make_node("PRelu", ["a", "slope"], ["b"])],
        [_const("slope", np.linspace(-1, 1, 48))],
    ),
    "Elu": ([helper.make_node("Elu", ["a"], ["b"])], []),
    "Selu": ([helper.make_node("Selu", ["a"], ["b"])], []),
    "Celu": ([helper.make_node("Celu", ["a"], ["b"], alpha=0.5)], []),
    "ThresholdedRelu": ([helper.make_node("ThresholdedRelu", ["a"], ["b"], alpha=0.3)], []),
    "Softsign": ([helper.make_node("Softsign", ["a"], ["b"])], []),
    "Mish": ([helper.make_node("Mish", ["a"], ["b"])], []),
    "Clip": (
        [helper.make_node("Clip", ["a", "lo", "hi"], ["b"])],
        [_const("lo", -0.5), _const("hi", 0.75)],
    ),
    "Sin": ([helper.make_node("Sin", ["a"], ["b"])], []),
    "Floor": ([helper.make_node("Floor", ["a"], ["b"])], []),
    "Ceil": ([helper.make_node("Ceil", ["a"], ["b"])], []),
    "Round": ([helper.make_node("Round", ["a"], ["b"])], []),
    "Mod": (
        [
            helper.make_node("Cast", ["a"], ["ai"], to=TensorProto.INT32),
            helper.make_node("Mod", ["ai", "m"], ["bi"], fmod=0),
            helper.make_node("Cast", ["bi"], ["b"], to=F32),
        ],
        [_const("m", np.arange(1, 49) * np.where(np.arange(48) % 2, 1, -1), np.int32)],
    ),
    "Fmod": (
        [helper.make_node("Mod", ["a", "m"], ["b"], fmod=1)],
        [_const("m", np.linspace(0.3, 1.7, 48))],
    ),
    "Mean": ([helper.make_node("Mean", ["a", "a", "a"], ["b"])], []),
    "Scale": ([helper.make_node("Mul", ["a", "c"], ["b"])], [_const("c", 0.125)]),
    "IsInf": (
        [
            helper.make_node("Div", ["one", "a"], ["r"]),
            helper.make_node("IsInf", ["r"], ["inf"]),
            helper.make_node("Where", ["inf", "a", "r"], ["b"]),
        ],
        [_const("one", 1.0)],
    ),
    "IsNaNNotXor": (
        [
            helper.make_node("Greater", ["a", "zero"], ["pos"]),
            helper.make_node("Not", ["pos"], ["neg"]),
            helper.make_node("IsNaN", ["a"], ["nan"]),
            helper.make_node("Xor", ["neg", "nan"], ["pick"]),
            helper.make_node("Where", ["pick", "a", "zero"], ["b"]),
        ],
        [_const("zero", 0.0)],
    ),
    "Quantize": (
        [
            helper.make_node("QuantizeLinear", ["a", "s", "z"], ["q"]),
            helper.make_node("DequantizeLinear", ["q", "s", "z"], ["b"]),
        ],
        [_const("s", 0.02), _const("z", 128, np.uint8)],
    ),
}


def _model(case: str, shape: list[int]):
    body, inits = CASES[case]
    nodes = [
        helper.make_node("Neg", ["x"], ["a"], name="first"),
        *body,
        helper.make_node("Neg", ["b"], ["y"], name="last"),
    ]
    graph = helper.make_graph(
        nodes,
        case,
        [helper.make_tensor_value_info("x", F32, shape)],
        [helper.make_tensor_value_info("y", F32, shape)],
        inits,
    )
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=IR_VERSION
    )


@pytest.mark.parametrize(
    "case, shape",
    [(case, SHAPE) for case in CASES] + [(case, WIDE) for case in SCRATCH_CASES],
    ids=[*CASES, *(f"{case}-wide" for case in SCRATCH_CASES)],
)
def test_the_op_computes_in_the_homes_of_its_input_and_output(case, shape):
    model = _model(case, shape)
    x = (np.random.default_rng(7).standard_normal(shape) * 2).astype(np.float32)
    x[0, 0, :4] = [0.0, 0.5, -1.5, 2.5]  # zeros and rounding ties
    compilation = compile_model(model, CompileOptions())
    assert not verify_module(compilation.module)
    function = compilation.module.functions[0]
    # No operand staged through the walk's tiles ("<node>/x<k>#<n>"): no copy between a home
    # and such a tile (a load or store of the home would be one).
    homes = {n for n, loc in function.memory_locations.items() if loc.memory is MemoryType.SB}
    homes = {n for n in homes if "/" not in n and n != "identity_fp32"}
    assert {"a", "b"} <= homes
    for inst in function.instructions():
        names = {ap.loc for ap in (inst.dst, *inst.srcs.values()) if ap is not None}
        staged = {n for n in names if re.search(r"/x\d+#", n)}
        assert not (is_copy(inst) and names & homes and staged), (
            inst.origin.node,
            inst.opcode,
            names,
        )
    got = run_function(compilation.module, {"x": x})["y"]
    want = run_onnxruntime(model, {"x": x})["y"]
    np.testing.assert_allclose(got, want, rtol=FP32_RTOL, atol=FP32_ATOL)
    scheduled = run_scheduled(compilation.module, {"x": x}, parse_schedule("random:1"), True)
    assert scheduled.race_count == 0, scheduled.races[:3]
    np.testing.assert_array_equal(scheduled.outputs["y"], got)
