"""models/llm_sizes.py at test width: each size's family (Qwen2-0.5B, Llama-3.2-1B and the
7B-class Mistral configs at hidden 64, 4 heads on 2 KV heads, vocabulary 512, 2 layers) as
prefill and as the decode step, written by the script's own code path (the torch export for
Qwen2 and Llama, the stitched file for Mistral) into one .onnx and one .data file, and checked
with onnxruntime against the torch module holding the same weights.

The stitch is also checked where it replicates: a 3-layer file stitched from the 2-layer
template has the nodes, initializers, inputs and outputs of the 3-layer export and computes the
same outputs.
"""

from __future__ import annotations

import collections
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("onnxscript")
ort = pytest.importorskip("onnxruntime")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "models"))
import llm_sizes  # noqa: E402

SIZES = list(llm_sizes.SIZES)


@pytest.mark.parametrize("form", ["prefill", "decode"])
@pytest.mark.parametrize("size", SIZES)
def test_tiny_export_matches_torch(size, form, tmp_path):
    job = llm_sizes.Job(size, form, tiny=True)
    result = llm_sizes.run(job, tmp_path, check=True, log=lambda *_: None)
    assert result["error"] <= 1e-5
    path = result["path"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([path.name, path.stem + ".data"])
    model = onnx.load(str(path), load_external_data=False)
    meta = {p.key: p.value for p in model.metadata_props}
    assert meta["onnx2bir.llm.method"].startswith(llm_sizes.SIZES[size].method)
    assert meta["onnx2bir.llm.layers"] == "2"
    assert not any(n.metadata_props for n in model.graph.node)  # stripped
    locations = {
        e.value for t in model.graph.initializer for e in t.external_data if e.key == "location"
    }
    assert locations == {path.stem + ".data"}
    names = [v.name for v in model.graph.input]
    if form == "decode":
        assert names[:3] == ["input_ids", "attention_mask", "position_ids"]
        assert names[3:] == [f"past_key_values.{i}.{p}" for i in range(2) for p in ("key", "value")]
        outputs = [v.name for v in model.graph.output]
        assert outputs == ["logits"] + [
            f"present.{i}.{p}" for i in range(2) for p in ("key", "value")
        ]
    else:
        assert names == ["input_ids", "attention_mask"]


def _summary(path: Path):
    model = onnx.load(str(path), load_external_data=False)
    graph = model.graph

    def shapes(values):
        return [(v.name, tuple(d.dim_value for d in v.type.tensor_type.shape.dim)) for v in values]

    return (
        collections.Counter(n.op_type for n in graph.node),
        len(graph.initializer),
        shapes(graph.input),
        shapes(graph.output),
    )


def _run(path: Path, feeds) -> list[np.ndarray]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {k: v.numpy() for k, v in feeds.items()})


@pytest.mark.parametrize("form", ["prefill", "decode"])
def test_stitched_layers_equal_the_export(form, tmp_path):
    quiet = dict(check=False, log=lambda *_: None)
    stitched = llm_sizes.run(llm_sizes.Job("mistral-7b", form, 3, tiny=True), tmp_path, **quiet)
    exported = llm_sizes.Job("mistral-7b", form, 3, method="export", tiny=True)
    exported = llm_sizes.run(exported, tmp_path, **quiet)
    assert stitched["path"] != exported["path"]
    assert _summary(stitched["path"]) == _summary(exported["path"])
    model = llm_sizes.build(llm_sizes.SIZES["mistral-7b"], 3, tiny=True)
    _, feeds, _ = llm_sizes.module_and_feeds(model, form, "fp32")
    for a, b in zip(_run(stitched["path"], feeds), _run(exported["path"], feeds), strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
    assert llm_sizes.check_file(llm_sizes.Job("mistral-7b", form, 3, tiny=True), stitched["path"])


def test_weights_depend_on_the_name_only():
    a = llm_sizes.weight("model.layers.5.mlp.up_proj.weight", (8, 4))
    assert np.array_equal(a, llm_sizes.weight("model.layers.5.mlp.up_proj.weight", (8, 4)))
    assert not np.array_equal(a, llm_sizes.weight("model.layers.6.mlp.up_proj.weight", (8, 4)))
    norm = llm_sizes.weight("model.norm.weight", (1000,))
    assert abs(norm.mean() - 1) < 0.02 and 0.05 < norm.std() < 0.15
    assert 0.015 < a.std() < 0.025 or a.size < 100


def test_full_configs_have_the_published_numbers():
    expect = {
        "qwen2-0.5b": (896, 24, 14, 2, 4864, 151936, True, 494_032_768),
        "llama-3.2-1b": (2048, 16, 32, 8, 8192, 128256, True, 1_235_814_400),
        "mistral-7b": (4096, 32, 32, 8, 14336, 32000, False, 7_241_732_096),
    }
    for name, numbers in expect.items():
        c = llm_sizes.config_of(llm_sizes.SIZES[name])
        got = (
            c.hidden_size,
            c.num_hidden_layers,
            c.num_attention_heads,
            c.num_key_value_heads,
            c.intermediate_size,
            c.vocab_size,
            c.tie_word_embeddings,
        )
        assert got == numbers[:-1], name
        assert llm_sizes.parameter_count(c) == numbers[-1], name
    llama = llm_sizes.config_of(llm_sizes.SIZES["llama-3.2-1b"]).rope_parameters
    assert llama["rope_type"] == "llama3" and llama["factor"] == 32.0


def test_refuses_a_file_that_does_not_fit(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        llm_sizes.need_disk(tmp_path, 1 << 62, "huge.onnx")
    assert stop.value.code == 2
    assert "huge.onnx: needs" in capsys.readouterr().err
