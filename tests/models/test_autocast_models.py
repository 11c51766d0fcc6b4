"""Whole models under the general autocast: the device's default against the emulating oracle
and `--auto-cast none` against plain onnxruntime, both at the fp32 bound (docs/validation.md).
Slow: every zoo and light model."""

from __future__ import annotations

import sys
from pathlib import Path

import onnx
import pytest

from onnx2bir.options import CompileOptions
from onnx2bir.runtime.oracle.tolerance import FP32_ATOL, FP32_RTOL, TolerancePolicy
from onnx2bir.validation.run import run_validate

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "models"))

from light import LIGHT_MODELS, light_model_path  # noqa: E402

ZOO = sorted(p.stem for p in (ROOT / "models").glob("*.onnx"))
LIGHT = sorted(LIGHT_MODELS.values())
DEVICE = CompileOptions()  # the default: matmult / bf16, what the device computes
FP32 = CompileOptions(auto_cast="none")


def _path(name: str) -> Path:
    return ROOT / "models" / f"{name}.onnx" if name in ZOO else light_model_path(name)


def _check(name: str, options: CompileOptions) -> None:
    """The model passes against the emulating oracle, every float output at the fp32 bound
    (the oracle rounds where the program rounds: docs/validation.md#verdict)."""
    doc, _, _ = run_validate(str(_path(name)), options, TolerancePolicy())
    outputs = doc["outputs"]
    assert doc["passed"], [
        (o["name"], o["max_abs_err"], o["atol"], o["tolerance_source"]) for o in outputs
    ] + [(c["name"], c["max_abs_err"]) for c in doc["checkpoints"] if not c["passed"]]
    for entry in outputs:
        assert entry["bound"] in ("fp32", "exact"), (entry["name"], entry["tolerance_source"])
        if entry["bound"] == "fp32":
            assert (entry["atol"], entry["rtol"]) == (FP32_ATOL, FP32_RTOL)
    ops = {node.op_type for node in onnx.load(str(_path(name))).graph.node}
    if options.auto_cast == "none" or not ops & {"MatMul", "Gemm", "Conv", "ConvTranspose"}:
        assert not doc["casts"]  # nothing for the autocast to round


@pytest.mark.slow
@pytest.mark.parametrize("name", ZOO + LIGHT)
def test_device_autocast_matches_the_emulating_oracle(name):
    _check(name, DEVICE)


@pytest.mark.slow
@pytest.mark.parametrize("name", ZOO + LIGHT)
def test_no_autocast_at_fp32_tolerance(name):
    _check(name, FP32)


def test_resnet18_under_the_device_autocast():
    """One zoo model in the default suite: the deepest chain of casts (D = 18) among them."""
    assert (DEVICE.auto_cast, DEVICE.auto_cast_type) == ("matmult", "bf16")
    _check("resnet18", DEVICE)
