"""Idioms: public attention architectures exported the way their libraries write them, each with
hand-checked attention and MLP block counts, for measuring the attention and MLP matchers.

In:  nothing. Every model is built from a timm model name or a transformers config object with
     tiny sizes, after ``torch.manual_seed(0)`` (timm ``pretrained=False``; no hub function is
     called, ``HF_HUB_OFFLINE=1``).
Out: ``models/idioms/<name>.onnx`` (single self-contained files under ``MAX_BYTES``, opset 20,
     static shapes, batch 1) and ``models/idioms/EXPECTED.json``: per model the attention and
     MLP block counts of ``EXPECTED`` below (derived from the architecture, not from running a
     detector), with how each was made (exporter, opset, attention implementation, config,
     library versions). The tests read the JSON, so they need no torch.

Families (``IDIOMS``): timm Swin and transformers Swin (window attention with a gathered
relative position bias, and a shifted-window mask in the shifted blocks), timm CaiT
(talking-heads self-attention, then class attention with one query), transformers BLOOM (ALiBi
bias, eager), DeBERTa-v2/v3 (disentangled c2p and p2c terms added to the scores), timm EVA-02
(rotary embeddings, SwiGLU MLP with a LayerNorm before the down projection), transformers
Llama with eager attention (grouped-query and plain multi-head).

Each model is exported with ``torch.onnx.export(..., dynamo=True, opset_version=20)`` through
``zoo._export`` (the legacy exporter only if dynamo raises; the exporter is recorded). timm
models are created with ``exportable=True``, as timm's own ``onnx_export.py`` does: their
attention modules then take the written-out path (``q @ kᵀ``, softmax, ``@ v``) instead of
``F.scaled_dot_product_attention``. The transformers models use ``attn_implementation="eager"``.
Node metadata and doc strings are stripped (``strip_metadata.py``); the model keeps only its
``onnx2bir.idioms.*`` metadata_props (name, exporter, opset, attention, versions, config, the
expected counts). The script runs ``onnx.checker``, compares onnxruntime with torch to
``TOLERANCE``, prints op counts, the Softmax count next to the expected attention blocks, and
the op chain between each Softmax and the MatMuls around it; it exits non-zero if a check fails.

    /work/venv-export/bin/python models/idioms.py             # all -> models/idioms/
    /work/venv-export/bin/python models/idioms.py bloom cait  # some
    /work/venv-export/bin/python models/idioms.py --check     # rebuild in memory, compare bytes
    /work/venv-export/bin/python models/idioms.py --list

Needs torch, onnxscript, onnx, onnxruntime, timm and transformers; onnx2bir itself only reads
the .onnx files and EXPECTED.json.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import zoo  # noqa: E402  (sets HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE)
from strip_metadata import strip_exporter_metadata  # noqa: E402
from zoo import Built, PixelWrapper, TokenWrapper, _export, _float_input, _token_inputs  # noqa: E402

IDIOMS_DIR = Path(__file__).resolve().parent / "idioms"
EXPECTED_JSON = IDIOMS_DIR / "EXPECTED.json"
OPSET = 20
SEED = zoo.SEED
TOLERANCE = zoo.TOLERANCE
MAX_BYTES = 600 * 1024
META_PREFIX = "onnx2bir.idioms."
# Text models run at 128 tokens: at 16 the exporter's constant folding (inputs of at most 8192
# elements) turns DeBERTa's relative-position buckets into constants, which an export with a
# dynamic sequence (or a longer one) never does. (The causal comparison is folded either way.)
TEXT_SEQ = 128
VOCAB = 256

# --------------------------------------------------------------------------------------------
# Expected blocks, by hand from each architecture (the modules the config creates). "Attention"
# is one softmax-over-keys block; "MLP" the feed-forward of a layer: Linear -> activation ->
# Linear, or gated Linear * act(Linear) -> Linear (EVA-02: with a LayerNorm before the down
# projection). Patch embeddings (Conv), patch merging (one Linear), classifier heads (one
# Linear) and CaiT's talking-heads projections (Linear over heads, no activation) are not MLPs.
# --------------------------------------------------------------------------------------------
EXPECTED: dict[str, dict[str, int]] = {
    # depths (2, 2) -> 4 SwinTransformerBlocks, each one WindowAttention (window 7: stage 1 at
    # 14x14 tokens has 4 windows, block 0 regular, block 1 shifted by 3 with the -100 mask;
    # stage 2 at 7x7 is one window, so timm sets shift 0 in both its blocks) and one Mlp
    # fc1 -> GELU -> fc2 -> 4 attention, 4 MLP.
    "swin_timm": {"attention": 4, "mlp": 4},
    # depths [2, 2] -> 4 SwinLayers, each SwinAttention (same windows and shifts as timm: HF sets
    # shift 0 when the resolution is not larger than the window) and SwinIntermediate (dense ->
    # GELU) + SwinOutput (dense) -> 4 attention, 4 MLP.
    "swin_hf": {"attention": 4, "mlp": 4},
    # depth 2 LayerScaleBlocks (TalkingHeadAttn over 16 patch tokens, + Mlp) and
    # depth_token_only 2 LayerScaleBlockClassAttn (ClassAttn: the class token's one query
    # against class + 16 patch tokens, + Mlp on the class token) -> 2 + 2 = 4 attention,
    # 2 + 2 = 4 MLP.
    "cait": {"attention": 4, "mlp": 4},
    # n_layer 2 -> 2 BloomBlocks: BloomAttention (ALiBi + causal mask) and BloomMLP
    # dense_h_to_4h -> BloomGelu (tanh form) -> dense_4h_to_h -> 2 attention, 2 MLP.
    "bloom": {"attention": 2, "mlp": 2},
    # num_hidden_layers 2 -> 2 DebertaV2Layers: DisentangledSelfAttention (c2p and p2c terms)
    # and DebertaV2Intermediate (dense -> GELU) + DebertaV2Output (dense) -> 2 attention, 2 MLP.
    # (conv_kernel_size 0: no ConvLayer; embedding_size = hidden_size: no embed_proj.)
    "deberta_v2": {"attention": 2, "mlp": 2},
    # depth 2 -> 2 EvaBlocks: EvaAttention (rotary on the 16 patch tokens, not on the class
    # token) and, with swiglu_mlp and scale_mlp, SwiGLU fc1_g/fc1_x -> SiLU(g) * x -> LayerNorm ->
    # fc2 -> 2 attention, 2 MLP.
    "eva02": {"attention": 2, "mlp": 2},
    # num_hidden_layers 2 -> 2 LlamaDecoderLayers: LlamaAttention (4 query heads sharing 2
    # key/value heads) and LlamaMLP down(silu(gate) * up) -> 2 attention, 2 MLP.
    "llama_eager_gqa": {"attention": 2, "mlp": 2},
    # num_hidden_layers 2, num_key_value_heads = num_attention_heads = 4 -> 2 attention, 2 MLP.
    "llama_eager_mha": {"attention": 2, "mlp": 2},
}


@dataclass(frozen=True)
class Idiom:
    name: str
    source: str  # "timm" or "transformers"
    summary: str
    attention: str  # how the attention is computed in the export
    builder: Callable[[], Built]


# --------------------------------------------------------------------------------------------
# timm
# --------------------------------------------------------------------------------------------
IMAGE_INPUT = "input"


def _timm(name: str, **kwargs) -> tuple[nn.Module, dict]:
    """timm model `name` with `kwargs` overriding its defaults, random weights, exportable."""
    import timm

    model = timm.create_model(name, pretrained=False, exportable=True, **kwargs)
    config = {"timm_model": name, "pretrained": False, "exportable": True, **kwargs}
    return model, config


def _jsonable(value):
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, type):
        return value.__name__
    return value


def _fused_attention_modules(module: nn.Module) -> list[str]:
    return [n for n, m in module.named_modules() if getattr(m, "fused_attn", False)]


def build_swin_timm() -> Built:
    kwargs = dict(
        img_size=56,
        patch_size=4,
        window_size=7,
        embed_dim=32,
        depths=(2, 2),
        num_heads=(2, 4),
        mlp_ratio=2.0,
        num_classes=10,
    )
    model, config = _timm("swin_tiny_patch4_window7_224", **kwargs)
    shifts = [tuple(b.shift_size) for layer in model.layers for b in layer.blocks]
    assert shifts == [(0, 0), (3, 3), (0, 0), (0, 0)], shifts
    config["shift_sizes"] = shifts
    return Built(model, {IMAGE_INPUT: _float_input(1, 3, 56, 56)}, ["logits"], 4, 4, config)


def build_cait() -> Built:
    kwargs = dict(
        img_size=32,
        patch_size=8,
        embed_dim=32,
        depth=2,
        depth_token_only=2,
        num_heads=4,
        mlp_ratio=4.0,
        # cait_xxs24's init_values 1e-5 scales every residual branch by 1e-5: the output would
        # hardly depend on the attention and MLP blocks under test.
        init_values=1.0,
        num_classes=10,
    )
    model, config = _timm("cait_xxs24_224", **kwargs)
    return Built(model, {IMAGE_INPUT: _float_input(1, 3, 32, 32)}, ["logits"], 4, 4, config)


def build_eva02() -> Built:
    kwargs = dict(
        img_size=56,
        patch_size=14,
        embed_dim=64,
        depth=2,
        num_heads=2,
        # eva02_tiny has no norm in its SwiGLU; eva02_base/large set scale_mlp=True, which
        # builds timm's SwiGLU(norm_layer=LayerNorm): fc1_g, fc1_x, SiLU, LayerNorm, fc2.
        scale_mlp=True,
        num_classes=10,
        # Eva multiplies its freshly initialised head by 0.001; logits of 1e-4 would make
        # every comparison of the output uninformative.
        head_init_scale=1.0,
    )
    model, config = _timm("eva02_tiny_patch14_224", **kwargs)
    from timm.layers import SwiGLU

    for block in model.blocks:
        assert isinstance(block.mlp, SwiGLU) and isinstance(block.mlp.norm, nn.LayerNorm)
    config["mlp"] = "SwiGLU(norm_layer=LayerNorm)"
    config["mlp_hidden"] = model.blocks[0].mlp.fc2.in_features
    return Built(model, {IMAGE_INPUT: _float_input(1, 3, 56, 56)}, ["logits"], 2, 2, config)


# --------------------------------------------------------------------------------------------
# transformers
# --------------------------------------------------------------------------------------------
def _hf_config(config, keep: Iterable[str] = ()) -> dict[str, object]:
    out = zoo._hf_config_dict(config)
    for key in keep:
        if hasattr(config, key):
            out[key] = _jsonable(getattr(config, key))
    return out


def build_swin_hf() -> Built:
    from transformers import SwinConfig, SwinModel

    config = SwinConfig(
        image_size=56,
        patch_size=4,
        num_channels=3,
        embed_dim=32,
        depths=[2, 2],
        num_heads=[2, 4],
        window_size=7,
        mlp_ratio=2.0,
        hidden_act="gelu",
        attn_implementation="eager",
    )
    model = SwinModel(config, add_pooling_layer=False)
    # transformers initialises the relative position bias tables to zero; give them values
    # like timm's (trunc_normal, std 0.02) so the gathered bias is not an all-zero Add.
    with torch.no_grad():
        for module in model.modules():
            table = getattr(module, "relative_position_bias_table", None)
            if table is not None:
                nn.init.trunc_normal_(table, std=0.02)
    pixels = _float_input(1, 3, 56, 56)
    with torch.no_grad():
        model.eval()(pixel_values=pixels)  # each SwinLayer settles its window and shift here
    shifts = [b.shift_size for stage in model.encoder.layers for b in stage.blocks]
    assert shifts == [0, 3, 0, 0], shifts
    keep = ("embed_dim", "depths", "num_heads", "window_size", "mlp_ratio", "image_size")
    cfg = {
        **_hf_config(config, keep),
        "shift_sizes": shifts,
        "relative_position_bias": "trunc_normal(0.02)",
    }
    return Built(
        PixelWrapper(model, "last_hidden_state"),
        {IMAGE_INPUT: pixels},
        ["last_hidden_state"],
        4,
        4,
        cfg,
    )


def _text(model: nn.Module, config, keep: Iterable[str], blocks: int) -> Built:
    return Built(
        TokenWrapper(model, "last_hidden_state"),
        _token_inputs(config.vocab_size, TEXT_SEQ),
        ["last_hidden_state"],
        blocks,
        blocks,
        {**_hf_config(config, keep), "seq": TEXT_SEQ},
    )


def build_bloom() -> Built:
    from transformers import BloomConfig, BloomModel

    config = BloomConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        n_layer=2,
        n_head=4,
        use_cache=False,
        attn_implementation="eager",
    )
    model = BloomModel(config)
    return _text(
        model, config, ("n_head", "n_layer", "apply_residual_connection_post_layernorm"), 2
    )


def build_deberta_v2() -> Built:
    from transformers import DebertaV2Config, DebertaV2Model

    # deberta-v3 style: shared attention keys, log buckets, LayerNorm on the relative embeddings.
    config = DebertaV2Config(
        vocab_size=VOCAB,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        hidden_act="gelu",
        max_position_embeddings=512,
        type_vocab_size=0,
        relative_attention=True,
        position_buckets=32,
        max_relative_positions=-1,
        pos_att_type="p2c|c2p",
        share_att_key=True,
        norm_rel_ebd="layer_norm",
        position_biased_input=False,
        attn_implementation="eager",
    )
    assert config.pos_att_type == ["p2c", "c2p"], config.pos_att_type
    model = DebertaV2Model(config)
    keep = (
        "relative_attention",
        "position_buckets",
        "max_relative_positions",
        "pos_att_type",
        "share_att_key",
        "norm_rel_ebd",
        "position_biased_input",
        "type_vocab_size",
    )
    return _text(model, config, keep, 2)


def _llama(kv_heads: int) -> Built:
    from transformers import LlamaConfig, LlamaModel

    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=kv_heads,
        max_position_embeddings=256,
        hidden_act="silu",
        use_cache=False,
        attn_implementation="eager",
    )
    return _text(LlamaModel(config), config, (), 2)


def build_llama_gqa() -> Built:
    return _llama(2)


def build_llama_mha() -> Built:
    return _llama(4)


IDIOMS: dict[str, Idiom] = {
    idiom.name: idiom
    for idiom in [
        Idiom(
            "swin_timm",
            "timm",
            "timm swin_tiny_patch4_window7_224 reduced: image 56, embed 32, depths (2, 2)",
            "written out (exportable=True): (q*scale) @ kᵀ + relative position bias "
            "(+ shifted-window mask), softmax, @ v",
            build_swin_timm,
        ),
        Idiom(
            "swin_hf",
            "transformers",
            "transformers SwinModel: image 56, embed 32, depths [2, 2], window 7",
            "eager",
            build_swin_hf,
        ),
        Idiom(
            "cait",
            "timm",
            "timm cait_xxs24_224 reduced: image 32, embed 32, depth 2 + 2 class-attention",
            "written out (exportable=True): talking heads (Linear over heads before and after "
            "the softmax); class attention with one query",
            build_cait,
        ),
        Idiom(
            "bloom",
            "transformers",
            "transformers BloomModel: hidden 64, 2 layers, 4 heads, ALiBi",
            "eager",
            build_bloom,
        ),
        Idiom(
            "deberta_v2",
            "transformers",
            "transformers DebertaV2Model (v3 style): relative attention, p2c|c2p, 32 buckets",
            "eager",
            build_deberta_v2,
        ),
        Idiom(
            "eva02",
            "timm",
            "timm eva02_tiny_patch14_224 reduced: image 56, embed 64, depth 2, scale_mlp",
            "written out (exportable=True): rotary q/k, (q*scale) @ kᵀ, softmax, @ v",
            build_eva02,
        ),
        Idiom(
            "llama_eager_gqa",
            "transformers",
            "transformers LlamaModel: hidden 64, 2 layers, 4 q / 2 kv heads",
            "eager",
            build_llama_gqa,
        ),
        Idiom(
            "llama_eager_mha",
            "transformers",
            "transformers LlamaModel: hidden 64, 2 layers, 4 q / 4 kv heads",
            "eager",
            build_llama_mha,
        ),
    ]
}
assert set(IDIOMS) == set(EXPECTED)


def build(name: str) -> Built:
    torch.manual_seed(SEED)
    built = IDIOMS[name].builder()
    built.module.eval()
    expected = EXPECTED[name]
    assert (built.attention_blocks, built.mlp_blocks) == (expected["attention"], expected["mlp"])
    fused = _fused_attention_modules(built.module)
    assert not fused, f"{name}: modules still on F.scaled_dot_product_attention: {fused}"
    return built


# --------------------------------------------------------------------------------------------
# Graph inspection (the cross-checks printed per export)
# --------------------------------------------------------------------------------------------
def softmax_chains(proto: onnx.ModelProto, limit: int = 16) -> list[tuple[list[str], list[str]]]:
    """Per Softmax: the ops on the shortest path from the nearest MatMul of two computed operands
    upstream (the QK product) to it, and from it to the nearest such MatMul downstream (the PV
    product); a MatMul with a constant weight (a Linear) is a step, not an end. Each op shows
    its other operands in brackets: ``c`` a constant, ``in`` a graph input, else the producing
    op type."""
    graph = proto.graph
    constants = {i.name for i in graph.initializer}
    constants |= {o for n in graph.node if n.op_type == "Constant" for o in n.output}
    producer = {o: n for n in graph.node for o in n.output}
    consumers: dict[str, list] = collections.defaultdict(list)
    for node in graph.node:
        for name in node.input:
            consumers[name].append(node)

    def operand(name: str) -> str:
        if name in constants:
            return "c"
        return producer[name].op_type if name in producer else "in"

    def is_product(node) -> bool:
        return node.op_type == "MatMul" and all(i not in constants for i in node.input)

    def label(node, along: str) -> str:
        others = [operand(i) for i in node.input if i and i != along]
        return node.op_type + (f"[{','.join(others)}]" if others else "")

    def search(start, step) -> list[tuple[object, str]]:
        """Breadth first along `step` (node -> [(next node, tensor between)]) to a product."""
        frontier, seen = [(start, [])], {id(start)}
        for _ in range(limit):
            following = []
            for node, path in frontier:
                for nxt, tensor in step(node):
                    if id(nxt) in seen:
                        continue
                    seen.add(id(nxt))
                    if is_product(nxt):
                        return [*path, (nxt, tensor)]
                    following.append((nxt, [*path, (nxt, tensor)]))
            frontier = following
        return [(None, "")]

    def parents(node):
        return [(producer[i], i) for i in node.input if i in producer and i not in constants]

    def children(node):
        return [(c, o) for o in node.output for c in consumers.get(o, [])]

    chains = []
    for node in graph.node:
        if node.op_type != "Softmax":
            continue
        up_path = search(node, parents)
        up = []
        for index, (n, _) in enumerate(up_path):
            if n is None:
                up.append("?")
            elif is_product(n):
                up.append("MatMul")
            else:
                # the tensor the path continues upward along (to the next element)
                along = up_path[index + 1][1] if index + 1 < len(up_path) else ""
                up.append(label(n, along))
        down_path = search(node, children)
        down = []
        for n, tensor in down_path:
            down.append("?" if n is None else label(n, tensor))
        chains.append((list(reversed(up)), down))
    return chains


def describe_chains(proto: onnx.ModelProto) -> list[str]:
    counts = collections.Counter(
        " -> ".join([*up, "Softmax", *down]) for up, down in softmax_chains(proto)
    )
    return [f"{n} x {chain}" for chain, n in counts.items()]


# --------------------------------------------------------------------------------------------
# Export and checks
# --------------------------------------------------------------------------------------------
@dataclass
class Result:
    name: str
    path: Path
    data: bytes
    exporter: str
    counts: collections.Counter
    max_abs_error: float
    record: dict
    notes: list[str]
    ok: bool


def versions() -> dict[str, str]:
    import onnxscript
    import timm
    import transformers

    return {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "timm": timm.__version__,
        "onnxscript": onnxscript.__version__,
        "onnx": onnx.__version__,
        "onnxruntime": ort.__version__,
    }


def export_idiom(name: str) -> Result:
    idiom = IDIOMS[name]
    built = build(name)
    with torch.no_grad():
        expected = built.module(*built.inputs.values()).numpy()
    proto, exporter = _export(built, OPSET)
    strip_exporter_metadata(proto)
    zoo.strip_for_commit(proto)  # doc strings and every metadata_props entry
    record = {
        "attention": EXPECTED[name]["attention"],
        "mlp": EXPECTED[name]["mlp"],
        "source": idiom.source,
        "summary": idiom.summary,
        "attn_implementation": idiom.attention,
        "exporter": exporter,
        "opset": OPSET,
        "seed": SEED,
        "inputs": {
            k: [str(v.dtype).replace("torch.", ""), list(v.shape)] for k, v in built.inputs.items()
        },
        "config": json.loads(json.dumps(built.config, default=_jsonable, sort_keys=True)),
        "versions": versions(),
    }
    del record["versions"]["transformers" if idiom.source == "timm" else "timm"]
    meta = {
        "name": name,
        "attention_blocks": str(record["attention"]),
        "mlp_blocks": str(record["mlp"]),
        "attn_implementation": idiom.attention,
        "exporter": exporter,
        "opset": str(OPSET),
        "config": json.dumps(record["config"], sort_keys=True),
        "versions": json.dumps(record["versions"], sort_keys=True),
    }
    for key, value in meta.items():
        proto.metadata_props.add(key=META_PREFIX + key, value=value)

    notes: list[str] = []
    ok = True
    if any(t.data_location == onnx.TensorProto.EXTERNAL for t in proto.graph.initializer):
        notes.append("FAIL: external data")
        ok = False
    if not exporter.startswith("dynamo"):
        notes.append(f"exporter fell back: {exporter}")
    onnx.checker.check_model(proto, full_check=True)
    data = proto.SerializeToString()
    if len(data) > MAX_BYTES:
        notes.append(f"FAIL: {len(data)} bytes > {MAX_BYTES}")
        ok = False
    counts = zoo.op_counts(proto)
    softmax = counts.get("Softmax", 0)
    if softmax != record["attention"]:
        notes.append(f"Softmax count {softmax} != {record['attention']} attention blocks")
    record["softmax_nodes"] = softmax
    record["softmax_chains"] = describe_chains(proto)

    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
    names_in = [i.name for i in session.get_inputs()]
    if names_in != list(built.inputs):
        notes.append(f"FAIL: graph inputs {names_in}, expected {list(built.inputs)}")
        ok = False
    (actual,) = session.run(None, {k: v.numpy() for k, v in built.inputs.items()})
    if actual.shape != expected.shape:
        notes.append(f"FAIL: shape {actual.shape} vs torch {expected.shape}")
        ok, max_abs = False, float("inf")
    else:
        max_abs = float(np.max(np.abs(actual.astype(np.float64) - expected)))
    if not max_abs <= TOLERANCE:
        notes.append(f"FAIL: max |ort - torch| = {max_abs:.3g} > {TOLERANCE:g}")
        ok = False
    if not np.all(np.isfinite(actual)) or float(np.std(actual)) == 0.0:
        notes.append("FAIL: output not finite or constant")
        ok = False
    record["max_abs_error"] = float(f"{max_abs:.2g}")
    record["bytes"] = len(data)
    record["sha256"] = hashlib.sha256(data).hexdigest()
    return Result(
        name, IDIOMS_DIR / f"{name}.onnx", data, exporter, counts, max_abs, record, notes, ok
    )


def _print(result: Result, seconds: float, proto: onnx.ModelProto) -> None:
    r = result.record
    print(f"== {result.name}  ({seconds:.1f} s)")
    print(f"   file: {result.path.name} ({r['bytes']} bytes = {r['bytes'] / 1024:.1f} KiB)")
    print(f"   exporter: {result.exporter}, opset {OPSET}, attention: {r['attn_implementation']}")
    print(f"   inputs: {r['inputs']}")
    print(f"   ops ({sum(result.counts.values())} nodes): {zoo._format_counts(result.counts)}")
    print(
        f"   expected blocks: attention={r['attention']} mlp={r['mlp']}; "
        f"Softmax nodes in the graph: {r['softmax_nodes']}"
    )
    for line in describe_chains(proto):
        print(f"   softmax chain: {line}")
    print(f"   onnxruntime vs torch: max |diff| = {result.max_abs_error:.3g}")
    print(f"   sha256: {r['sha256']}")
    for note in result.notes:
        print(f"   note: {note}")
    print(f"   check: {'OK' if result.ok else 'FAILED'}")


def _write_expected(records: dict[str, dict]) -> None:
    current = json.loads(EXPECTED_JSON.read_text()) if EXPECTED_JSON.exists() else {}
    current.update(records)
    ordered = {name: current[name] for name in IDIOMS if name in current}
    # One line per field: the file stays readable and its diffs small.
    lines = []
    for name, record in ordered.items():
        fields = [
            f"    {json.dumps(k)}: {json.dumps(v, ensure_ascii=False)}" for k, v in record.items()
        ]
        lines.append(f"  {json.dumps(name)}: {{\n" + ",\n".join(fields) + "\n  }")
    text = "{\n" + ",\n".join(lines) + "\n}\n"
    zoo._write_atomic(text.encode(), EXPECTED_JSON)


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="models (default: all; see --list)")
    parser.add_argument("--list", action="store_true", help="print the model names and exit")
    parser.add_argument(
        "--check",
        action="store_true",
        help="rebuild in memory and compare with the committed files; write nothing",
    )
    args = parser.parse_args(list(argv) if argv is not None else None)
    if args.list:
        for idiom in IDIOMS.values():
            print(f"{idiom.name:16s} {idiom.summary}")
        return 0
    unknown = [n for n in args.names if n not in IDIOMS]
    if unknown:
        parser.error(f"unknown model(s) {unknown}; known: {', '.join(IDIOMS)}")
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    for logger in ("torch.onnx", "onnxscript.optimizer"):
        logging.getLogger(logger).setLevel(logging.ERROR)

    results, differ = [], []
    for name in args.names or list(IDIOMS):
        start = time.perf_counter()
        result = export_idiom(name)
        _print(result, time.perf_counter() - start, onnx.load_from_string(result.data))
        results.append(result)
        if args.check:
            if not result.path.exists() or result.path.read_bytes() != result.data:
                differ.append(name)
        elif result.ok:
            zoo._write_atomic(result.data, result.path)
    if not args.check:
        _write_expected({r.name: r.record for r in results if r.ok})
    print()
    for r in results:
        rec = r.record
        print(
            f"{r.name:16s} {rec['bytes'] / 1024:7.1f} KiB  attn {rec['attention']} "
            f"(Softmax {rec['softmax_nodes']})  mlp {rec['mlp']}  max|diff| {r.max_abs_error:.2g}  "
            f"{'OK' if r.ok else 'FAIL'}  {rec['sha256'][:16]}"
        )
    failed = [r.name for r in results if not r.ok]
    if differ:
        print("differ from the committed files: " + ", ".join(differ))
    print("checks: " + ("OK" if not failed else f"FAILED ({', '.join(failed)})"))
    return 1 if failed or differ else 0


if __name__ == "__main__":
    sys.exit(main())
