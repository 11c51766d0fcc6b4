"""The quantized zoo models, models/quantized/ (written by models/quantize.py with onnxruntime's
quantization tool): what each file is, and (slow) that each validates under the default
autocast and under `--auto-cast none`, and that the script rebuilds the same bytes."""

from __future__ import annotations

import hashlib
import re
import sys
from pathlib import Path

import onnx
import pytest

from onnx2bir.options import CompileOptions
from onnx2bir.runtime.oracle.tolerance import TolerancePolicy
from onnx2bir.sweep.quantize import onnx_ir_missing
from onnx2bir.validation.run import run_validate

ROOT = Path(__file__).resolve().parents[2]
QUANTIZED = ROOT / "models" / "quantized"
MODELS = ("resnet18", "mobilenetv3", "bert", "vit", "llama")
# resnet18 and mobilenetv3 have no MatMul with a constant weight: no int4 file.
FILES = [f"{m}_{v}" for m in MODELS for v in ("qdq", "qop", "dynamic")] + [
    f"{m}_int4" for m in ("bert", "vit", "llama")
]
# The ops each variant must contain: what onnxruntime's tool writes for it.
WRITES = {
    "qdq": {"QuantizeLinear", "DequantizeLinear"},
    "qop": {"QuantizeLinear", "DequantizeLinear"},
    "dynamic": {"DynamicQuantizeLinear"},
    "int4": {"MatMulNBits"},
}
AUTOCAST = {"default": CompileOptions(), "none": CompileOptions(auto_cast="none")}
META = "onnx2bir.quantize."


def _meta(model: onnx.ModelProto) -> dict[str, str]:
    return {
        p.key.removeprefix(META): p.value for p in model.metadata_props if p.key.startswith(META)
    }


def test_the_folder_holds_each_variant_and_nothing_else():
    assert sorted(p.stem for p in QUANTIZED.glob("*.onnx")) == sorted(FILES)


@pytest.mark.parametrize("stem", FILES)
def test_a_quantized_file_is_what_its_name_says(stem):
    name, variant = stem.rsplit("_", 1)
    data = (QUANTIZED / f"{stem}.onnx").read_bytes()
    model = onnx.load_from_string(data)
    meta = _meta(model)
    assert meta["variant"] == variant and meta["source"] == f"{name}.onnx"
    # Made from the committed float model as it is now: a re-exported zoo needs a re-quantize.
    source = (ROOT / "models" / f"{name}.onnx").read_bytes()
    assert meta["source_sha256"] == hashlib.sha256(source).hexdigest()
    ops = {node.op_type for node in model.graph.node}
    assert WRITES[variant] <= ops, sorted(ops)
    if variant == "qop":
        assert any(op.startswith("QLinear") or op == "QGemm" for op in ops)
    if variant in ("qdq", "int4"):
        assert not any(op.startswith("QLinear") for op in ops)
    # Stripped like the exports (models/strip_metadata.py).
    assert not any(node.metadata_props or node.doc_string for node in model.graph.node)
    # MANIFEST.md records the file's sha256.
    manifest = (ROOT / "models" / "MANIFEST.md").read_text()
    row = re.search(rf"^\| `quantized/{stem}\.onnx` \|.*$", manifest, flags=re.M)
    assert row, f"no MANIFEST.md row for quantized/{stem}.onnx"
    assert f"`{hashlib.sha256(data).hexdigest()}`" in row.group(0)


@pytest.mark.slow
@pytest.mark.parametrize("autocast", sorted(AUTOCAST))
@pytest.mark.parametrize("stem", FILES)
def test_quantized_model_validates(stem, autocast):
    """`onnx2bir validate` (with `--auto-cast none` for "none"): every output and checked
    intermediate against the emulating oracle at its bound."""
    doc, _, _ = run_validate(str(QUANTIZED / f"{stem}.onnx"), AUTOCAST[autocast], TolerancePolicy())
    assert doc["passed"], [
        (o["name"], o["max_abs_err"], o["atol"], o["tolerance_source"]) for o in doc["outputs"]
    ] + [(c["name"], c["max_abs_err"]) for c in doc["checkpoints"] if not c["passed"]]


@pytest.mark.slow
@pytest.mark.parametrize("stem", FILES)
def test_the_script_rebuilds_the_same_bytes(stem, tmp_path):
    import onnxruntime

    name, variant = stem.rsplit("_", 1)
    path = QUANTIZED / f"{stem}.onnx"
    recorded = _meta(onnx.load(str(path), load_external_data=False))["onnxruntime"]
    if recorded != onnxruntime.__version__:
        # the quantizer's output is what this version of it writes; another version may round
        # a scale differently, which is not a defect of the file (validation still runs on it)
        pytest.skip(f"made with onnxruntime {recorded}, this is {onnxruntime.__version__}")
    if variant == "int4" and onnx_ir_missing():  # the [test] extra installs it
        pytest.skip(onnx_ir_missing())
    sys.path.insert(0, str(ROOT / "models"))
    try:
        import quantize as script
    finally:
        sys.path.pop(0)
    samples = script.calibration_inputs(ROOT / "models" / f"{name}.onnx")
    row = script.one(name, variant, tmp_path, False, samples)
    assert (tmp_path / path.name).read_bytes() == path.read_bytes(), row["sha256"]
