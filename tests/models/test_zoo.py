"""The PyTorch-exported zoo in models/: every model validates against onnxruntime with the
default passes, and the tests assert what the passes found — conv kernels per model, attention
blocks found, MLP blocks raised — against what each model contains by construction
(models/MANIFEST.md)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from onnx2bir.compiler import compile_model
from onnx2bir.options import CompileOptions
from onnx2bir.patterns.conv.selection import CONV2D_DEPTHWISE, REP_NHWC
from onnx2bir.runtime.machine.schedule import parse_schedule, run_scheduled
from onnx2bir.runtime.oracle.compare import compare_output
from onnx2bir.runtime.oracle.ort import run_onnxruntime, synthesize_inputs

MODELS = Path(__file__).resolve().parents[2] / "models"

# model: (conv kernels, attention blocks, MLP activations raised)
EXPECTED = {
    "resnet18": ({REP_NHWC: 20}, 0, []),
    # The classifier head Gemm → HardSwish → Gemm is an MLP (models/MANIFEST.md).
    "mobilenetv3": ({REP_NHWC: 19, CONV2D_DEPTHWISE: 6, None: 2}, 0, ["hardswish"]),
    "unet": ({REP_NHWC: 16, None: 2}, 0, []),
    "speech_conv1d": ({REP_NHWC: 7}, 0, []),
    "bert": ({}, 2, ["gelu", "gelu"]),
    "gpt2": ({}, 2, ["gelu_tanh", "gelu_tanh"]),
    "vit": ({REP_NHWC: 1}, 2, ["gelu", "gelu"]),
    "llama": ({}, 2, ["swiglu", "swiglu"]),
    "mha": ({}, 1, ["relu"]),
    "t5_encoder": ({}, 2, ["relu", "relu"]),
    "long_attention": ({}, 1, []),
}


def validate(path: Path, options: CompileOptions | None = None):
    """Compiled without the general autocast unless `options` say otherwise: the outputs are
    compared at fp32 tolerance (tests/models/test_autocast_models.py has the autocast runs)."""
    compilation = compile_model(path, options or CompileOptions(auto_cast="none"))
    feeds = synthesize_inputs(compilation.graph, 0)
    # Run with the race detector on: a missing dependency edge fails the model test.
    run = run_scheduled(compilation.module, feeds, parse_schedule("program"), check_races=True)
    assert run.races == [], [race.message() for race in run.races[:5]]
    actual = run.outputs
    expected = run_onnxruntime(path, feeds)
    return compilation, actual, expected


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_zoo_model_validates_and_passes_find_its_blocks(name):
    compilation, actual, expected = validate(MODELS / f"{name}.onnx")
    for output, reference in expected.items():
        result = compare_output(output, actual[output], reference)
        assert result.passed, result.to_json()
    convs, attention, mlp = EXPECTED[name]
    findings = {r.name: r.result.findings for r in compilation.passes.records}
    assert Counter(f["kernel"] for f in findings["TransformConvOp"]) == Counter(convs)
    blocks = [f for f in findings["LowerToCustomNativeKernel"] if f["is_attention"]]
    assert len(blocks) == attention
    # The attention flag is off by default: every block is found and none is raised.
    assert all(b["reason"] == "enable-native-kernel-attention is off" for b in blocks)
    raised = [f["activation"] for f in findings["LowerToNKIKernelCC"] if f["target"]]
    assert raised == mlp


LONG = MODELS / "long_attention.onnx"
RAISE = dict(enable_native_kernel_attention=True, enable_native_kernel_attention_bf16=True)


def test_long_context_raise_fires_only_with_the_flag():
    off, _, _ = validate(LONG)
    assert off.source_ops["Softmax"] == 1 and off.graph.op_counts()["Softmax"] == 1
    (block,) = off.passes.result_of("LowerToCustomNativeKernel").findings
    assert block["seq_q"] == 1024 and block["target"] is None
    on = compile_model(LONG, CompileOptions(**RAISE))
    (block,) = on.passes.result_of("LowerToCustomNativeKernel").findings
    assert block["target"] == "AttentionMMSoftmaxMMWithoutSwap" and block["reason"] is None
    assert "Softmax" not in on.graph.op_counts()


@pytest.mark.parametrize(
    "cast, unit", [("matmult-to-bf16", 2.0**-8), ("matmult-to-fp16", 2.0**-11)]
)
def test_long_context_raised_kernel_within_the_storage_tolerance(cast, unit):
    compilation, actual, expected = validate(
        LONG, CompileOptions(native_kernel_cast_type=cast, auto_cast="none", **RAISE)
    )
    ((name, reference),) = expected.items()
    # Storage rounding (unit u) of q, kᵀ, v and P, fp32 accumulation: the output moves by a
    # few u of its scale; the bound allows 4u·max|ref| absolute and 2u relative.
    scale = float(abs(reference).max())
    result = compare_output(name, actual[name], reference, atol=4 * unit * scale, rtol=2 * unit)
    assert result.passed, result.to_json()
    assert result.cosine > 0.9999
