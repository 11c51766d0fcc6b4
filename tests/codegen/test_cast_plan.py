"""The cast plan: read off the compiled program, for each kind of rounding it makes; and the
plan a saved program carries in its metadata."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from conftest import make_model
from onnx import helper

from onnx2bir.bir.cast_plan import CastPlan
from onnx2bir.bir.json_io import read_module, write_module
from onnx2bir.compiler import compile_model
from onnx2bir.options import CompileOptions

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "models"


def _pairs(plan: CastPlan) -> set[tuple[str, str, str]]:
    return {(p.node, p.input, p.kind) for p in plan.points}


def _gemm_conv_model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    return make_model(
        [
            helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
            helper.make_node("Flatten", ["c"], ["f"], name="flat"),
            helper.make_node("Gemm", ["f", "g", "gb"], ["y"], name="fc", transB=1),
        ],
        {"x": (1, 4, 6, 6)},
        {"y": None},
        initializers={
            "w": rng.standard_normal((8, 4, 3, 3)).astype(np.float32),
            "b": rng.standard_normal(8).astype(np.float32),
            "g": rng.standard_normal((5, 288)).astype(np.float32),
            "gb": rng.standard_normal(5).astype(np.float32),
        },
    )


def test_matmult_rounds_the_pe_operands_not_the_biases():
    plan = compile_model(_gemm_conv_model()).cast_plan
    assert _pairs(plan) == {
        ("conv", "x", "operand"),
        ("conv", "w", "operand"),
        ("fc", "f", "operand"),
        ("fc", "g", "operand"),
    }
    assert {p.dtype for p in plan.points} == {"bfloat16"}
    assert all(p.exact for p in plan.points) and not plan.unemulated
    # Every intermediate the program stores: the conv's output and the Gemm's rounded operand
    # (x is an input, w and g weights: the oracle has them).
    assert set(plan.probes) == {"c", "f"}


def test_auto_cast_none_rounds_nothing():
    plan = compile_model(_gemm_conv_model(), CompileOptions(auto_cast="none")).cast_plan
    assert plan.points == () and not plan.probes and not plan.unemulated


def test_the_cast_type_is_the_plans_dtype():
    plan = compile_model(_gemm_conv_model(), CompileOptions(auto_cast_type="fp8_e4m3")).cast_plan
    assert {p.dtype for p in plan.points} == {"float8_e4m3"}


def test_a_depthwise_conv_on_the_pe_array_rounds_its_operands_and_validates():
    # The 2-D depthwise kernel multiplies on the PE array (diag(w_tap) x the input window),
    # so under the autocast its input and weights are bf16 like any conv's, the oracle
    # rounds them there, and the program validates.
    from onnx2bir.api import validate

    rng = np.random.default_rng(0)
    model = make_model(
        helper.make_node("Conv", ["x", "w"], ["y"], name="dw", group=8, pads=[1, 1, 1, 1]),
        {"x": (1, 8, 10, 10)},
        {"y": None},
        initializers={"w": rng.standard_normal((8, 1, 3, 3)).astype(np.float32)},
    )
    compilation = compile_model(model)
    (finding,) = compilation.passes.result_of("TransformConvOp").findings
    assert "depthwise" in finding["kernel"]
    assert {(p.node, p.input, p.dtype) for p in compilation.cast_plan.points} == {
        ("dw", "x", "bfloat16"),
        ("dw", "w", "bfloat16"),
    }
    result = validate(model)
    assert result.passed, result.text()


def test_auto_cast_all_rounds_every_stored_intermediate_for_every_reader():
    plan = compile_model(_gemm_conv_model(), CompileOptions(auto_cast="all")).cast_plan
    assert ("flat", "c", "storage") in _pairs(plan)  # the conv's output, stored in bf16
    assert {"c", "f"} <= set(plan.probes)


def test_a_raised_mlp_rounds_its_hidden_inside_and_its_output_is_a_boundary():
    compilation = compile_model(MODELS / "bert.onnx")
    plan = compilation.cast_plan
    (raised, _) = [f for f in compilation.passes.result_of("LowerToNKIKernelCC").findings]
    boundary = next(b for b in plan.boundaries.values() if b.node in raised.nodes)
    assert (boundary.node, boundary.operand, "operand") in _pairs(plan)  # the hidden, rounded
    assert boundary.operand not in plan.probes  # never stored
    assert boundary.position == 0 and boundary.operand.startswith("gelu")
    assert boundary.tensor in plan.probes  # the kernel's output is read from the machine
    kernel = compilation.graph.node(boundary.node)  # the CustomCall keeps the down MatMul's name
    assert kernel["op_type"] == "CustomCall" and boundary.tensor in kernel["outputs"]


def test_the_raised_attention_kernel_is_emulated_key_tile_by_key_tile():
    options = CompileOptions(
        enable_native_kernel_attention=True, enable_native_kernel_attention_bf16=True
    )
    compilation = compile_model(MODELS / "long_attention.onnx", options)
    plan = compilation.cast_plan
    ((raised,),) = [
        [f for f in compilation.passes.result_of("LowerToCustomNativeKernel").findings if f.target]
    ]
    (entry,) = plan.online.values()
    assert entry.node in raised.nodes and entry.key_tile == raised["sb_shape"][1]
    assert entry.dtype == raised["storage_dtype"]
    assert all(p.exact for p in plan.points) and not plan.unemulated
    # q, kᵀ and v are rounded as the kernel rounds them; P is rounded inside the emulation
    rounded = {p.input for p in plan.points if p.node in raised.nodes}
    assert len(rounded) == 3 and not any("softmax" in t.lower() for t in rounded)
    assert entry.tensor in plan.probes  # the kernel's output is read from the machine


def test_attention_with_narrow_scores_stays_approximate():
    options = CompileOptions(
        enable_native_kernel_attention=True,
        enable_native_kernel_attention_bf16=True,
        native_kernel_cast_type="all-to-bf16",
    )
    plan = compile_model(MODELS / "long_attention.onnx", options).cast_plan
    inexact = [p for p in plan.points if not p.exact]
    assert not plan.online
    assert inexact and all("online softmax" in p.reason for p in inexact)
    assert all("stored narrow" in p.reason for p in inexact)


def test_a_loop_that_stores_its_values_narrow_is_unemulated():
    plan = compile_model(MODELS / "loop_cumsum.onnx", CompileOptions(auto_cast="all")).cast_plan
    ((node, reason),) = plan.unemulated.items()
    assert "Loop" in reason and "bfloat16" in reason


def test_a_saved_program_carries_its_plan_and_options(tmp_path):
    compilation = compile_model(MODELS / "resnet18.onnx")
    write_module(compilation.module, tmp_path, "resnet18")
    module = read_module(tmp_path / "resnet18.bir.json")
    assert CastPlan.from_json(module.metadata["cast_plan"]) == compilation.cast_plan
    assert module.metadata["compile_options"]["auto_cast_type"] == "bf16"
    assert module.metadata["input_shapes"] == {"input": [1, 3, 64, 64]}


def test_a_scale_hoisted_onto_the_eviction_moves_the_rounding_to_its_input():
    """SDPA as exporters write it scales q and kᵀ by √(1/√d) each; FuseMatMulScale moves both
    factors onto the product's eviction, so the program rounds the unscaled q and kᵀ
    (patterns/matmul_scale.py) and the plan says so, where the oracle can round them."""
    from onnx2bir.api import validate

    root = np.float32((64**-0.5) ** 0.5)
    nodes = [
        helper.make_node("Mul", ["q", "root"], ["qs"], name="scale_q"),
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1], name="kt"),
        helper.make_node("Mul", ["kt", "root"], ["kts"], name="scale_k"),
        helper.make_node("MatMul", ["qs", "kts"], ["s"], name="qk"),
        helper.make_node("Softmax", ["s"], ["p"], axis=-1, name="softmax"),
        helper.make_node("MatMul", ["p", "v"], ["y"], name="pv"),
    ]
    model = make_model(
        nodes,
        {"q": [2, 32, 64], "k": [2, 32, 64], "v": [2, 32, 64]},
        {"y": [2, 32, 64]},
        initializers={"root": np.array(root)},
    )
    compilation = compile_model(model)
    pairs = _pairs(compilation.cast_plan)
    assert {("scale_q", "q", "operand"), ("scale_k", "kt", "operand")} <= pairs
    assert ("qk", "qs", "operand") not in pairs and not compilation.cast_plan.unemulated
    doc = validate(model).to_json()
    assert doc["passed"] and doc["emulation"]["statistical"] == []
