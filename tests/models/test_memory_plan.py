"""The memory planner on whole models (docs/memory_planner.md): DMA traffic against the
compulsory bytes (every weight, constant, graph input and output once), planner on and off."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from onnx2bir.compiler import compile_model
from onnx2bir.options import CompileOptions
from onnx2bir.runtime.timing.cost import estimate

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "models"))
from light import light_model_path  # noqa: E402


def _traffic(path, plan: bool):
    report = estimate(compile_model(path, CompileOptions(memory_plan=plan)).module)
    return report.dma_bytes, report.compulsory_dma_bytes


@pytest.mark.parametrize("name", ["small_cnn", "resnet18", "mobilenetv3"])
def test_the_plan_cuts_dma_traffic_of_the_zoo_cnns(name):
    path = ROOT / "models" / f"{name}.onnx"
    planned, compulsory = _traffic(path, True)
    unplanned, same = _traffic(path, False)
    assert same == compulsory
    assert compulsory <= planned < unplanned / 1.4


@pytest.mark.slow
def test_light_resnet50_moves_its_weights_once_in_bf16_and_little_else():
    planned, compulsory = _traffic(light_model_path("resnet50", 0), True)
    # 25.6M weights, stored in bf16 under the default autocast (docs/autocast.md#weights):
    # 51 MB no program can avoid, and about 102 MB if they travelled in fp32.
    assert 50e6 < compulsory < 60e6
    # What else moves is activations that keep a DRAM round trip (the convolution kernels'
    # output layouts, the stem's padded input, one pooling output): 17.6 MB, 1.34x in all.
    assert planned <= 1.35 * compulsory
