"""Public architectures as their libraries export them, models/idioms/ (written by
`models/idioms.py`): timm and transformers Swin, timm CaiT, BLOOM (ALiBi), DeBERTa-v2
(disentangled attention), timm EVA-02 (rotary, SwiGLU with an inner LayerNorm) and eager Llama
with and without grouped-query attention.

The expected attention and MLP blocks per model are counted by hand from each architecture
(`EXPECTED` in models/idioms.py, written to models/idioms/EXPECTED.json, which this test reads:
no torch needed). Compiled with both attention flags, each expected block must appear as a
finding of its pass, raised or refused with a reason, and no more blocks than that:

- attention (LowerToCustomNativeKernel): a finding marked `is_attention`, or a refusal whose
  nodes include one of the model's Softmax nodes;
- MLP (LowerToNKIKernelCC): a finding, raised or refused with a reason.

Every model also validates against onnxruntime with every attention block of the kernel's
form raised, and with none."""

from __future__ import annotations

import hashlib
import json
import re
from functools import cache
from pathlib import Path

import onnx
import pytest

from onnx2bir.api import validate
from onnx2bir.compiler import compile_model
from onnx2bir.options import CompileOptions
from onnx2bir.patterns.attention import raising

IDIOMS = Path(__file__).resolve().parents[2] / "models" / "idioms"
EXPECTED = json.loads((IDIOMS / "EXPECTED.json").read_text())
NAMES = sorted(EXPECTED)
# Blocks found and raised are under test, compared at fp32 tolerance: no general autocast.
RAISE = CompileOptions(
    enable_native_kernel_attention=True,
    enable_native_kernel_attention_bf16=True,
    auto_cast="none",
)
OFF = CompileOptions(auto_cast="none")
# An absolute path of a machine or a Python source file (as test_committed_models_clean.py).
PATH_LIKE = re.compile(r"(^|[\s'\"(])(/(home|work|tmp|usr|root|opt|Users)/|[A-Za-z]:\\)|\.py\b")


def path_of(name: str) -> Path:
    return IDIOMS / f"{name}.onnx"


@cache
def softmax_nodes(name: str) -> frozenset[str]:
    model = onnx.load(str(path_of(name)), load_external_data=False)
    return frozenset(n.name for n in model.graph.node if n.op_type == "Softmax")


def attention_findings(compilation, name: str) -> list:
    softmax = softmax_nodes(name)
    findings = compilation.passes.result_of("LowerToCustomNativeKernel").findings
    return [
        f
        for f in findings
        if f.get("is_attention") or (f["status"] == "refused" and softmax & set(f["nodes"]))
    ]


def mlp_findings(compilation) -> list:
    return list(compilation.passes.result_of("LowerToNKIKernelCC").findings)


def decided(finding) -> bool:
    """Raised, or refused with its reason."""
    return finding["status"] == "raised" or (finding["status"] == "refused" and finding["reason"])


def summary(findings) -> list[str]:
    return [
        f"{f['status']}: {f.get('reason') or f.get('target')} {list(f['nodes'])}" for f in findings
    ]


def test_every_committed_idiom_has_expected_counts():
    committed = sorted(p.stem for p in IDIOMS.glob("*.onnx"))
    assert committed == NAMES
    for name, record in EXPECTED.items():
        assert record["attention"] > 0 and record["mlp"] > 0, name
        # The export has one Softmax per attention block (the script's cross-check).
        assert len(softmax_nodes(name)) == record["softmax_nodes"] == record["attention"], name


@pytest.mark.parametrize("name", NAMES)
def test_idiom_file_is_the_recorded_export(name):
    """EXPECTED.json describes these bytes; nothing about the exporting machine is kept."""
    data = path_of(name).read_bytes()
    assert hashlib.sha256(data).hexdigest() == EXPECTED[name]["sha256"]
    model = onnx.load_from_string(data)
    assert not model.doc_string and not model.graph.doc_string
    assert not any(node.metadata_props or node.doc_string for node in model.graph.node)
    assert not any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer)
    meta = {p.key: p.value for p in model.metadata_props}
    assert meta["onnx2bir.idioms.name"] == name
    assert int(meta["onnx2bir.idioms.attention_blocks"]) == EXPECTED[name]["attention"]
    assert int(meta["onnx2bir.idioms.mlp_blocks"]) == EXPECTED[name]["mlp"]
    assert not [v for v in meta.values() if PATH_LIKE.search(v)]


@pytest.mark.parametrize("name", NAMES)
def test_idiom_attention_blocks_found(name):
    compilation = compile_model(path_of(name), RAISE, keep_going=True)
    found = attention_findings(compilation, name)
    covered = {n for f in found for n in f["nodes"]}
    missing = sorted(softmax_nodes(name) - covered)
    assert len(found) == EXPECTED[name]["attention"], (
        f"{len(found)} attention findings, expected {EXPECTED[name]['attention']}; "
        f"Softmax nodes in no finding: {missing}; findings: {summary(found)}"
    )
    assert all(decided(f) for f in found), summary(found)


@pytest.mark.parametrize("name", NAMES)
def test_idiom_mlp_blocks_found(name):
    compilation = compile_model(path_of(name), RAISE, keep_going=True)
    found = mlp_findings(compilation)
    assert len(found) == EXPECTED[name]["mlp"], (
        f"{len(found)} MLP findings, expected {EXPECTED[name]['mlp']}: {summary(found)}"
    )
    assert all(decided(f) for f in found), summary(found)


@pytest.mark.parametrize("raised", [True, False], ids=["raise", "no_raise"])
@pytest.mark.parametrize("name", NAMES)
def test_idiom_validates(name, raised, monkeypatch):
    """The verdict (docs/validation.md) with every attention block of the kernel's form
    raised — these exports have 17 to 128 tokens, so the raise's sequence gate is lowered for
    them — and with none."""
    if raised:
        monkeypatch.setattr(raising, "MIN_SEQUENCE", 0)
    result = validate(path_of(name), options=RAISE if raised else OFF)
    assert result.passed, result.text()
    if raised:
        found = attention_findings(result.details, name)
        blocks = [f for f in found if f.get("is_attention")]
        assert blocks and all(f["status"] == "raised" for f in blocks), summary(blocks)
