"""The attention raise on the command line: --verbose log lines, --dynamic-dma-sbuf-bytes, and
the raised entry's packaging and SBUF bytes in report --json."""

from __future__ import annotations

import json
from pathlib import Path

from onnx2bir.cli.commands import main

LONG = Path(__file__).resolve().parents[2] / "models" / "long_attention.onnx"
FLAGS = ["--enable-native-kernel-attention", "--enable-native-kernel-attention-bf16"]


def run(argv, capsys):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def attention_entry(out: str) -> dict:
    (entry,) = json.loads(out)["attention"]
    return entry


def test_verbose_logs_the_match_and_the_cast(capsys):
    code, _, err = run(["report", LONG, *FLAGS, "--verbose"], capsys)
    assert code == 0
    assert (
        "Found match (node_matmul, node_mul, node_softmax, node_matmul_1 with params 5: "
        "1024, 1024, 64, 0, bfloat16) for native kernel AttentionMMSoftmaxMMWithoutSwap" in err
    )
    assert " Casting matmult to bf16 for native kernel " in err


def test_verbose_warns_when_the_kernel_is_disabled_and_quiet_without_it(capsys):
    _, _, err = run(["report", LONG, "--verbose"], capsys)
    assert "LowerToCustomNativeKernel pass is enabled but none of the kernels is enabled." in err
    _, _, err = run(["report", LONG], capsys)
    assert err == ""


def test_report_json_packaging_and_sb_bytes_differ_for_matmult_and_all(capsys):
    entries = {}
    for cast in ("matmult-to-bf16", "all-to-bf16"):
        code, out, _ = run(
            ["report", LONG, "--json", *FLAGS, "--native-kernel-cast-type", cast], capsys
        )
        assert code == 0
        entries[cast] = attention_entry(out)
    matmult, cast_all = entries["matmult-to-bf16"], entries["all-to-bf16"]
    # docs/attention_kernel.md#packaging: q, kᵀ, v and the output reshaped, q, kᵀ, v transposed
    # and cast, the output cast back (the causal mask is the kernel's own: no mask operand).
    packaging = {"Cast": 4, "Reshape": 4, "Transpose": 3}
    assert matmult["packaging"] == cast_all["packaging"] == packaging
    # fp32 scores under matmult: 2 bytes more per key of the 512-key tile.
    assert matmult["sb_bytes"] - cast_all["sb_bytes"] == 2 * 512


def test_dynamic_dma_bytes_can_refuse_the_raise(capsys):
    code, out, _ = run(
        ["report", LONG, "--json", *FLAGS, "--dynamic-dma-sbuf-bytes", "190000"], capsys
    )
    entry = attention_entry(out)
    assert code == 0 and entry["target"] is None
    assert "for dynamic DMA) > 196608" in entry["reason"]


def test_negative_dynamic_dma_bytes_is_a_one_line_error(capsys):
    code, _, err = run(["report", LONG, "--dynamic-dma-sbuf-bytes", "-1"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "--dynamic-dma-sbuf-bytes -1 is not valid" in err


def test_report_text_lists_refused_mlp_candidates_with_the_reason(tmp_path, capsys):
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="dot1"),
        helper.make_node("Floor", ["h"], ["a"], name="floor"),
        helper.make_node("MatMul", ["a", "w2"], ["y"], name="dot2"),
    ]
    weights = [numpy_helper.from_array(np.ones((8, 8), np.float32), n) for n in ("w1", "w2")]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])],
        weights,
    )
    path = tmp_path / "floor_mlp.onnx"
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    onnx.save(model, path)
    code, out, _ = run(["report", path], capsys)
    assert code == 0
    assert "MLP: 1 candidate(s) refused" in out
    assert (
        "ending at dot2: not raised: Floor 'floor' is elementwise but has no MLP kernel step" in out
    )
