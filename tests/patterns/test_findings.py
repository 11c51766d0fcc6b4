"""Typed findings: the report's JSON, the one line --annotate and --localize show, and the
status of each block."""

from __future__ import annotations

import json
from pathlib import Path

from onnx2bir.compiler import compile_model
from onnx2bir.options import CompileOptions
from onnx2bir.patterns.findings import BlockFinding, Idiom, Status, describe_blocks

LONG = Path(__file__).resolve().parents[2] / "models" / "long_attention.onnx"


def test_status_follows_target_and_reason():
    raised = BlockFinding.of(Idiom.MLP, ["a", "b"], "relu", target="AwsNeuronMLPNKI")
    refused = BlockFinding.of(Idiom.MLP, ["a"], None, reason="Floor 'a' has no step")
    found = BlockFinding.of(Idiom.ATTENTION, ["s"], "plain")
    assert (raised.status, refused.status, found.status) == (
        Status.RAISED,
        Status.REFUSED,
        Status.FOUND,
    )
    assert raised.describe() == "mlp (relu): raised to AwsNeuronMLPNKI"
    assert refused.describe() == "mlp (-): not raised: Floor 'a' has no step"
    assert found.describe() == "attention (plain): found"


def test_json_keys_round_trip_and_mapping_reads():
    finding = BlockFinding.of(
        Idiom.ATTENTION, ["qk", "pv"], "scale", reason="sequence 16 <= 1007", seq_q=16
    )
    doc = finding.to_json()
    assert doc == {
        "nodes": ["qk", "pv"],
        "variant": "scale",
        "target": None,
        "reason": "sequence 16 <= 1007",
        "status": "refused",
        "seq_q": 16,
    }
    assert json.loads(json.dumps(doc)) == doc
    assert BlockFinding.from_json(Idiom.ATTENTION, doc) == finding
    assert finding["reason"] == doc["reason"] and finding.get("missing") is None


def test_a_compilation_describes_its_blocks_per_node():
    options = CompileOptions(
        enable_native_kernel_attention=True, enable_native_kernel_attention_bf16=True
    )
    compilation = compile_model(LONG, options)
    (finding,) = compilation.passes.result_of("LowerToCustomNativeKernel").findings
    assert isinstance(finding, BlockFinding) and finding.status is Status.RAISED
    described = describe_blocks(compilation.passes.records)
    assert set(finding.nodes) <= set(described)
    assert described["node_softmax"].startswith("attention (scale Mul(0.125) after QK")
    assert described["node_softmax"].endswith("raised to AttentionMMSoftmaxMMWithoutSwap")
