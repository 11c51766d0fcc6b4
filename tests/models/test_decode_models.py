"""Decoder LLMs as they are exported for serving, models/decode/ (written by `models/decode.py`):
Llama, Qwen2 and Mistral (grouped-query, 4 query heads on 2 KV heads), each as the decode step
— one token against a KV cache of 127 past positions, `past_key_values.*` in, `present.*` out —
and as prefill at 128 tokens with a right-padded `attention_mask`.

Each file validates against onnxruntime (the verdict, docs/validation.md) under the default
autocast and under `--auto-cast none`, on the inputs a server feeds it: the decode step's
position 127 and a mask of ones (then with a few cached positions masked out), the prefill's
mask with its last 16 positions zero. The attention findings are checked against facts read
off the file itself, not off the passes: one block per layer, seq_q the new tokens, seq_k the
cached positions plus the new ones (the past input's length + 1), the mask split into key
padding (and the causal triangle for prefill), refused by the sequence gate with its reason.
"""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path

import numpy as np
import onnx
import pytest

from onnx2bir.api import validate
from onnx2bir.compiler import compile_model
from onnx2bir.options import CompileOptions

DECODE = Path(__file__).resolve().parents[2] / "models" / "decode"
FAMILIES = ("llama", "qwen2", "mistral")
NAMES = [f"{family}_{kind}" for kind in ("decode", "prefill") for family in FAMILIES]
BOTH_FLAGS = CompileOptions(
    enable_native_kernel_attention=True, enable_native_kernel_attention_bf16=True
)
PADDING = 16  # models/decode.py PADDING: the prefill's trailing zeros
# An absolute path of a machine or a Python source file (as test_committed_models_clean.py).
PATH_LIKE = re.compile(r"(^|[\s'\"(])(/(home|work|tmp|usr|root|opt|Users)/|[A-Za-z]:\\)|\.py\b")


def path_of(name: str) -> Path:
    return DECODE / f"{name}.onnx"


@cache
def model_of(name: str) -> onnx.ModelProto:
    return onnx.load(str(path_of(name)))


def meta(name: str) -> dict[str, str]:
    prefix = "onnx2bir.decode."
    props = model_of(name).metadata_props
    return {p.key[len(prefix) :]: p.value for p in props if p.key.startswith(prefix)}


def input_shapes(name: str) -> dict[str, tuple[int, ...]]:
    return {
        v.name: tuple(d.dim_value for d in v.type.tensor_type.shape.dim)
        for v in model_of(name).graph.input
    }


def serving_inputs(name: str, masked_past: int = 0) -> dict[str, np.ndarray]:
    """What a server feeds the file: token ids in the vocabulary, the decode step's position
    after its cache and its past K/V, the prefill's right-padded mask."""
    rng = np.random.default_rng(7)
    shapes = input_shapes(name)
    vocab = json.loads(meta(name)["config"])["vocab_size"]
    feeds = {"input_ids": rng.integers(0, vocab, shapes["input_ids"], dtype=np.int64)}
    mask = np.ones(shapes["attention_mask"], np.int64)
    if "position_ids" in shapes:
        past = shapes["past_key_values.0.key"][2]
        feeds["position_ids"] = np.full(shapes["position_ids"], past, np.int64)
        mask[:, past - masked_past : past] = 0
        for key, shape in shapes.items():
            if key.startswith("past_key_values."):
                feeds[key] = rng.standard_normal(shape, dtype=np.float32)
    else:
        mask[:, -PADDING:] = 0
    feeds["attention_mask"] = mask
    return feeds


def attention(compilation) -> list[dict]:
    findings = compilation.passes.result_of("LowerToCustomNativeKernel").findings
    return [f for f in findings if f.get("is_attention")]


def test_every_export_is_committed_and_clean():
    """Seven files, each carrying its provenance and nothing about the exporting machine."""
    assert sorted(p.stem for p in DECODE.glob("*.onnx")) == sorted([*NAMES, "llama_prefill_1024"])
    for path in DECODE.glob("*.onnx"):
        model = onnx.load(str(path))
        assert not any(n.metadata_props or n.doc_string for n in model.graph.node), path.name
        assert path.stat().st_size < 2 * 1024 * 1024, path.name
        record = meta(path.stem)
        assert record["name"] == path.stem and record["exporter"].startswith("torchscript")
        assert not [v for v in record.values() if PATH_LIKE.search(v)]


@pytest.mark.parametrize("name", [f"{family}_decode" for family in FAMILIES])
def test_decode_step_has_the_kv_cache_interface(name):
    shapes = input_shapes(name)
    outputs = {
        v.name: tuple(d.dim_value for d in v.type.tensor_type.shape.dim)
        for v in model_of(name).graph.output
    }
    assert shapes["input_ids"] == (1, 1) and shapes["position_ids"] == (1, 1)
    assert shapes["attention_mask"] == (1, 128)
    for layer in range(2):
        for part in ("key", "value"):
            assert shapes[f"past_key_values.{layer}.{part}"] == (1, 2, 127, 32)
            assert outputs[f"present.{layer}.{part}"] == (1, 2, 128, 32)
    assert outputs["logits"] == (1, 1, 256)


@pytest.mark.parametrize("auto_cast", ["matmult", "none"])
@pytest.mark.parametrize("name", NAMES)
def test_export_validates_against_onnxruntime(name, auto_cast):
    result = validate(
        path_of(name), serving_inputs(name), options=CompileOptions(auto_cast=auto_cast)
    )
    assert result.passed, result.text()


@pytest.mark.parametrize("name", [f"{family}_decode" for family in FAMILIES])
def test_decode_step_with_masked_cache_positions_validates(name):
    """Positions masked out of the cache (a sequence that was padded) reach the scores only
    through the key-padding mask."""
    result = validate(path_of(name), serving_inputs(name, masked_past=5))
    assert result.passed, result.text()


@pytest.mark.parametrize("name", NAMES)
def test_attention_blocks_found_with_their_lengths(name):
    """One block per layer, seq_q the new tokens and seq_k the keys they see (read off the
    file's inputs), the mask split, refused by the sequence gate."""
    shapes = input_shapes(name)
    layers = json.loads(meta(name)["config"])["num_hidden_layers"]
    seq_q = shapes["input_ids"][1]
    past = shapes["past_key_values.0.key"][2] if "position_ids" in shapes else 0
    found = attention(compile_model(path_of(name), BOTH_FLAGS, keep_going=True))
    assert len(found) == layers
    for block in found:
        assert (block["seq_q"], block["seq_k"], block["head_dim"]) == (seq_q, past + seq_q, 32)
        assert block["status"] == "refused"
        assert block["reason"] == f"sequence {seq_q} <= 1007"
        variant = block["variant"]
        assert "grouped-query K/V read once per group" in variant
        if past:
            assert "key padding only mask split: the padding read as [1, 1, 1, 128]" in variant
            assert "K/V cache: past 'past_key_values." in variant
        else:
            assert "causal triangle and key padding mask split" in variant
            assert "K/V cache" not in variant
