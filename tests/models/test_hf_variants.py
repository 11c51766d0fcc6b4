"""The transformers models exported at opset 20 (eager and sdpa attention) and opset 23 (sdpa:
one onnx.Attention node per block), models/hf/ (written by `models/zoo.py --variants`).

Compiled with both attention flags, every model must find each of its attention blocks —
matched MatMul-Softmax-MatMul or fused onnx.Attention — and refuse it for the sequence gate
(these tiny configs have 16 to 128 tokens, the raise needs more than 1007), raise each MLP
block, and validate against onnxruntime."""

from __future__ import annotations

from pathlib import Path

import pytest

from onnx2bir.compiler import compile_model
from onnx2bir.options import CompileOptions
from onnx2bir.runtime.machine.interpreter import run_function
from onnx2bir.runtime.oracle.compare import compare_output
from onnx2bir.runtime.oracle.ort import run_onnxruntime, synthesize_inputs

HF = Path(__file__).resolve().parents[2] / "models" / "hf"
# Blocks found and raised are under test, compared at fp32 tolerance: no general autocast.
RAISE = CompileOptions(
    enable_native_kernel_attention=True,
    enable_native_kernel_attention_bf16=True,
    auto_cast="none",
)
# model: (tokens, MLP activation)
MODELS = {
    "bert": (16, "gelu"),
    "gpt2": (16, "gelu_tanh"),
    "llama": (16, "swiglu"),
    "t5_encoder": (128, "relu"),
    "vit": (17, "gelu"),
    "whisper_encoder": (32, "gelu"),
}
VARIANTS = ("op20_eager", "op20_sdpa", "op23_sdpa")
# onnx.Attention in the opset-23 exports (T5's sdpa export falls back to the TorchScript
# exporter, which writes the attention out).
FUSED = {f"{name}_op23_sdpa" for name in MODELS} - {"t5_encoder_op23_sdpa"}


def blocks(compilation):
    attention = compilation.passes.result_of("LowerToCustomNativeKernel").findings
    mlp = compilation.passes.result_of("LowerToNKIKernelCC").findings
    return [a for a in attention if a["is_attention"]], mlp


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("name", sorted(MODELS))
def test_hf_variant_blocks_found_and_validates(name, variant):
    stem = f"{name}_{variant}"
    path = HF / f"{stem}.onnx"
    compilation = compile_model(path, RAISE, keep_going=True)
    attention, mlp = blocks(compilation)
    tokens, activation = MODELS[name]
    assert len(attention) == 2
    assert all(a["status"] == "refused" for a in attention)
    assert all(a["reason"] == f"sequence {tokens} <= 1007" for a in attention)
    expected_source = "onnx.Attention" if stem in FUSED else "MatMul-Softmax-MatMul"
    assert {a["source"] for a in attention} == {expected_source}
    assert [m["activation"] for m in mlp] == [activation, activation]
    assert all(m["status"] == "raised" for m in mlp)
    assert compilation.codegen_error is None, compilation.codegen_error
    feeds = synthesize_inputs(compilation.graph, 0)
    actual = run_function(compilation.module, feeds)
    for output, reference in run_onnxruntime(path, feeds).items():
        got = actual[output] if output in actual else actual[f"{output}:output"]
        result = compare_output(output, got, reference)
        assert result.passed, result.to_json()
