"""Whole models through compile, machine and oracle."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from onnx2bir.compiler import compile_model
from onnx2bir.options import CompileOptions
from onnx2bir.runtime.machine.schedule import parse_schedule, run_scheduled
from onnx2bir.runtime.oracle.compare import compare_output
from onnx2bir.runtime.oracle.ort import run_onnxruntime, synthesize_inputs

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "models"))

from light import LIGHT_MODELS, light_model_path, light_source_path  # noqa: E402

FP32 = CompileOptions(auto_cast="none")  # compared at fp32 tolerance: no autocast


def validate(model_path: Path, seed: int = 0):
    compilation = compile_model(model_path, FP32)
    feeds = synthesize_inputs(compilation.graph, seed)
    # Run with the race detector on: a missing dependency edge fails the model test.
    run = run_scheduled(compilation.module, feeds, parse_schedule("program"), check_races=True)
    assert run.races == [], [race.message() for race in run.races[:5]]
    actual = run.outputs
    expected = run_onnxruntime(model_path, feeds)
    return compilation, [
        compare_output(name, actual[name], expected[name]) for name in compilation.graph.outputs
    ]


def kernel_counts(compilation) -> dict:
    findings = compilation.passes.result_of("TransformConvOp").findings
    counts: dict = {}
    for finding in findings:
        counts[finding["kernel"]] = counts.get(finding["kernel"], 0) + 1
    return counts


def test_small_cnn_exported_from_pytorch():
    compilation, results = validate(ROOT / "models" / "small_cnn.onnx")
    assert all(r.passed for r in results), results
    assert compilation.source_ops["Conv"] == 5
    # Four dense convs fit rep_nhwc (C_in x kH <= 128); the grouped conv (g=4) falls back.
    assert kernel_counts(compilation) == {"Conv2d_dw_fb01_io01_01bf_rep_nhwc_Pcinh": 4, None: 1}


def test_light_squeezenet_with_random_weights():
    compilation, results = validate(light_model_path("squeezenet"))
    assert all(r.passed for r in results), results
    counts = compilation.source_ops
    assert counts["Conv"] == 26 and counts["Concat"] == 8 and "ConstantOfShape" not in counts
    # The 1x1 convs reading 256 or more channels exceed 128 partitions and fall back.
    assert kernel_counts(compilation) == {"Conv2d_dw_fb01_io01_01bf_rep_nhwc_Pcinh": 20, None: 6}
    # Random weights make the output informative: a constant softmax would hide errors.
    (result,) = results
    assert result.cosine > 0.99999


@pytest.mark.slow
@pytest.mark.parametrize(
    "name",
    [
        "bvlc_alexnet",
        "densenet121",
        "inception_v1",
        "inception_v2",
        "resnet50",
        "shufflenet",
        "vgg19",
        "zfnet512",
    ],
)
def test_light_models_with_random_weights(name):
    _, results = validate(light_model_path(name))
    assert all(r.passed for r in results), results


def test_light_inception_v1_as_shipped():
    """Every weight 0.02: the last Gemm's 1000 columns are equal, its logits near 8e20, and the
    softmax is uniform only if the machine gives equal columns bit-identical results."""
    _, results = validate(light_source_path("inception_v1"))
    (result,) = results
    assert result.passed, result


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(LIGHT_MODELS))
def test_light_models_as_shipped(name):
    """No weight replacement: the ConstantOfShape weights are Memsets on the machine."""
    _, results = validate(light_source_path(name))
    assert all(r.passed for r in results), results
