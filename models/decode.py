"""Decoder LLMs as they are exported for serving: the decode step against a KV cache, and
prefill with a padding mask.

In:  nothing. Llama (grouped-query: 4 query heads sharing 2 key/value heads), Qwen2 (the same
     heads, biased q/k/v projections) and Mistral (the same heads, its default sliding window
     of 4096) are built from transformers config objects — 2 layers, hidden 128, head dim 32,
     MLP 256, vocabulary 256, eager attention — after ``torch.manual_seed(0)``, with the
     biases (Qwen2's q/k/v) and RMSNorm weights seeded away from transformers' zeros and ones
     as a trained model's are (an Add of zeros would be dropped at import); no hub function is
     called (``HF_HUB_OFFLINE=1``).
Out: ``models/decode/<family>_decode.onnx`` — one new token (``input_ids`` [1, 1],
     ``attention_mask`` [1, 128], ``position_ids`` [1, 1]) against a KV cache of ``PAST`` = 127
     positions (inputs ``past_key_values.<layer>.key`` / ``.value`` [1, 2, 127, 32]; outputs
     ``logits`` [1, 1, 256] and ``present.<layer>.key`` / ``.value`` [1, 2, 128, 32]);
     ``models/decode/<family>_prefill.onnx`` — 128 tokens (``input_ids``, ``attention_mask``
     [1, 128]; output ``logits`` [1, 128, 256]); and ``llama_prefill_1024.onnx``, one Llama
     layer at 1024 tokens, the shortest prefill the attention raise takes (> 1007 tokens).

Each file is exported by the TorchScript exporter (``torch.onnx.export(..., dynamo=False)``,
opset 17), the one serving exports of Hugging Face decoders have used, with static shapes; the
KV cache enters as flat tensors that the wrapper (``DecodeStep``) puts into a ``DynamicCache``
(the transformers 5 cache API: ``DynamicCache(config=...)``, ``update(key, value, layer)``) and
leaves as each layer's ``keys`` and ``values``. ``--exporter dynamo`` writes the torch.export
exporter's files (opset 18) into ``.cache/decode/`` instead, ``--dynamic`` with dynamic batch
and sequence axes (``batch``, ``seq``, ``past``, ``total``; onnx2bir then needs ``--dim`` or
``--inputs``). Node metadata is stripped (``strip_metadata.py``); the model keeps only its
``onnx2bir.decode.*`` metadata_props (name, kind, exporter, opset, lengths, padding, config,
library versions).

The check: ``onnx.checker``, then onnxruntime against torch on the seeded inputs to
``TOLERANCE`` — token ids from ``torch.Generator().manual_seed(1)``, the past K/V standard
normal from the same generator, the decode step's mask all ones and its position 127, the
prefill's mask with its last ``PADDING`` positions zero (a right-padded sequence); the script
exits non-zero if a check fails.

    python models/decode.py                    # all seven -> models/decode/
    python models/decode.py llama_decode       # some
    python models/decode.py --exporter dynamo  # -> models/.cache/decode/
    python models/decode.py --check            # rebuild in memory, compare bytes
    python models/decode.py --list

Needs torch, transformers, onnx and onnxruntime; onnx2bir itself only reads the .onnx files.
"""

from __future__ import annotations

import argparse
import collections
import io
import json
import os
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from strip_metadata import strip_exporter_metadata  # noqa: E402
from zoo import trained_biases  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

MODELS_DIR = Path(__file__).resolve().parent
DECODE_DIR = MODELS_DIR / "decode"
CACHE_DIR = MODELS_DIR / ".cache" / "decode"
SEED = 0
INPUT_SEED = 1
TOLERANCE = 1e-4
META_PREFIX = "onnx2bir.decode."
OPSET = {"torchscript": 17, "dynamo": 18}

PAST = 127  # cached positions before the decode step's token
SEQ = 128  # prefill length
PADDING = 16  # trailing zeros of the prefill's attention_mask
LONG_SEQ = 1024
LONG_PADDING = 100
ARCH = dict(
    vocab_size=256,
    hidden_size=128,
    intermediate_size=256,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=2048,
    tie_word_embeddings=False,
    attn_implementation="eager",
)


@dataclass(frozen=True)
class Export:
    """One file: a family's decode step or prefill, its layers and lengths."""

    name: str
    family: str
    kind: str  # "decode" | "prefill"
    layers: int = 2
    seq: int = SEQ  # prefill tokens
    padding: int = PADDING  # trailing zeros of the prefill's mask


FAMILIES = ("llama", "qwen2", "mistral")
EXPORTS = {
    e.name: e
    for e in [
        *(Export(f"{family}_decode", family, "decode") for family in FAMILIES),
        *(Export(f"{family}_prefill", family, "prefill") for family in FAMILIES),
        Export("llama_prefill_1024", "llama", "prefill", 1, LONG_SEQ, LONG_PADDING),
    ]
}


def build(family: str, layers: int) -> nn.Module:
    """The seeded causal LM of `family` with `layers` decoder layers, in eval mode."""
    import transformers

    classes = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
        "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
    }
    config_class, model_class = classes[family]
    config = config_class(num_hidden_layers=layers, **ARCH)
    torch.manual_seed(SEED)
    model = model_class(config).eval()
    trained_biases(model)
    trained_norms(model)
    return model


def trained_norms(model: nn.Module) -> None:
    """Give every RMSNorm weight seeded values around 1 (1 + 0.1·N(0, 1)): transformers
    initialises them to ones, which a trained model's are not."""
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" in name and name.endswith("weight"):
                noise = torch.randn(parameter.shape, generator=generator) * 0.1
                parameter.copy_(1.0 + noise)


class DecodeStep(nn.Module):
    """One token against a KV cache given as flat tensors: (input_ids, attention_mask,
    position_ids, past key 0, past value 0, ...) -> (logits, present key 0, value 0, ...)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, position_ids, *past):
        from transformers import DynamicCache

        cache = DynamicCache(config=self.model.config)
        for layer in range(len(past) // 2):
            cache.update(past[2 * layer], past[2 * layer + 1], layer)
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=cache,
            use_cache=True,
        )
        present = [t for layer in out.past_key_values.layers for t in (layer.keys, layer.values)]
        return (out.logits, *present)


class Prefill(nn.Module):
    """(input_ids, attention_mask) -> logits, no cache."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
        return out.logits


def inputs_of(entry: Export, config) -> tuple[dict[str, torch.Tensor], list[str]]:
    """The seeded inputs by name, and the output names."""
    generator = torch.Generator().manual_seed(INPUT_SEED)
    vocab = config.vocab_size
    if entry.kind == "prefill":
        mask = torch.ones(1, entry.seq, dtype=torch.int64)
        mask[:, entry.seq - entry.padding :] = 0
        ids = torch.randint(0, vocab, (1, entry.seq), generator=generator)
        return {"input_ids": ids, "attention_mask": mask}, ["logits"]
    kv_heads = config.num_key_value_heads
    head_dim = config.hidden_size // config.num_attention_heads
    feeds = {
        "input_ids": torch.randint(0, vocab, (1, 1), generator=generator),
        "attention_mask": torch.ones(1, PAST + 1, dtype=torch.int64),
        "position_ids": torch.tensor([[PAST]], dtype=torch.int64),
    }
    outputs = ["logits"]
    for layer in range(config.num_hidden_layers):
        for part in ("key", "value"):
            shape = (1, kv_heads, PAST, head_dim)
            feeds[f"past_key_values.{layer}.{part}"] = torch.randn(*shape, generator=generator)
            outputs.append(f"present.{layer}.{part}")
    return feeds, outputs


def dynamic_axes(entry: Export, feeds: dict, outputs: list[str]) -> dict[str, dict[int, str]]:
    axes = {"input_ids": {0: "batch", 1: "seq"}, "logits": {0: "batch", 1: "seq"}}
    if entry.kind == "prefill":
        return {**axes, "attention_mask": {0: "batch", 1: "seq"}}
    axes.update(attention_mask={0: "batch", 1: "total"}, position_ids={0: "batch", 1: "seq"})
    axes.update({name: {0: "batch", 2: "past"} for name in feeds if name.startswith("past_")})
    axes.update({name: {0: "batch", 2: "total"} for name in outputs if name.startswith("present")})
    return axes


def export(entry: Export, exporter: str = "torchscript", dynamic: bool = False):
    """(the ONNX model, the module, its inputs) for `entry`."""
    model = build(entry.family, entry.layers)
    module = DecodeStep(model) if entry.kind == "decode" else Prefill(model)
    feeds, outputs = inputs_of(entry, model.config)
    names = dict(input_names=list(feeds), output_names=outputs, opset_version=OPSET[exporter])
    if dynamic:
        names["dynamic_axes"] = dynamic_axes(entry, feeds, outputs)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        if exporter == "dynamo":
            program = torch.onnx.export(module, tuple(feeds.values()), dynamo=True, **names)
            proto = program.model_proto
        else:
            buffer = io.BytesIO()
            torch.onnx.export(module, tuple(feeds.values()), buffer, dynamo=False, **names)
            proto = onnx.load_from_string(buffer.getvalue())
    strip_exporter_metadata(proto)
    _set_metadata(proto, entry, exporter, dynamic, model.config)
    return proto, module, feeds


def _set_metadata(proto, entry: Export, exporter: str, dynamic: bool, config) -> None:
    import transformers

    record = {
        "name": entry.name,
        "kind": entry.kind,
        "exporter": f"{exporter} (dynamo={exporter == 'dynamo'})",
        "opset": str(OPSET[exporter]),
        "dynamic_axes": str(dynamic),
        "past": str(PAST if entry.kind == "decode" else 0),
        "seq": str(1 if entry.kind == "decode" else entry.seq),
        "padding": str(0 if entry.kind == "decode" else entry.padding),
        "seed": str(SEED),
        "config": json.dumps(
            {"model_type": config.model_type, "num_hidden_layers": entry.layers, **ARCH},
            sort_keys=True,
        ),
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
    }
    del proto.metadata_props[:]
    for key, value in record.items():
        proto.metadata_props.add(key=META_PREFIX + key, value=value)


def check(proto, module: nn.Module, feeds: dict) -> float:
    """The largest |onnxruntime − torch| over the outputs; raises past TOLERANCE."""
    onnx.checker.check_model(proto)
    with torch.no_grad():
        expected = module(*feeds.values())
    expected = expected if isinstance(expected, tuple) else (expected,)
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    got = session.run(None, {name: t.numpy() for name, t in feeds.items()})
    error = max(float(np.abs(a - b.numpy()).max()) for a, b in zip(got, expected, strict=True))
    if not error <= TOLERANCE:
        raise SystemExit(f"onnxruntime differs from torch by {error:.3g} > {TOLERANCE}")
    return error


def target(entry: Export, exporter: str, dynamic: bool) -> Path:
    if exporter == "torchscript" and not dynamic:
        return DECODE_DIR / f"{entry.name}.onnx"
    suffix = ("_dynamo" if exporter == "dynamo" else "") + ("_dynamic" if dynamic else "")
    return CACHE_DIR / f"{entry.name}{suffix}.onnx"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help=f"of {', '.join(EXPORTS)} (default: all)")
    parser.add_argument("--exporter", choices=sorted(OPSET), default="torchscript")
    parser.add_argument("--dynamic", action="store_true", help="dynamic batch/sequence axes")
    parser.add_argument("--check", action="store_true", help="compare with the files, write none")
    parser.add_argument("--list", action="store_true")
    args = parser.parse_args(argv)
    if args.list:
        for entry in EXPORTS.values():
            print(entry.name, entry.kind, f"{entry.layers} layers", target(entry, "torchscript", 0))
        return 0
    if args.dynamic and args.exporter == "dynamo":
        parser.error("--dynamic takes the TorchScript exporter's dynamic_axes; dynamo needs shapes")
    unknown = [n for n in args.names if n not in EXPORTS]
    if unknown:
        parser.error(f"unknown {unknown}; known: {', '.join(EXPORTS)}")
    failed = 0
    for name in args.names or list(EXPORTS):
        entry = EXPORTS[name]
        proto, module, feeds = export(entry, args.exporter, args.dynamic)
        error = check(proto, module, feeds)
        data = proto.SerializeToString()
        path = target(entry, args.exporter, args.dynamic)
        ops = collections.Counter(node.op_type for node in proto.graph.node)
        print(f"{name}: {len(data)} bytes, max |ort - torch| {error:.2g}, {dict(ops)}")
        if args.check:
            same = path.exists() and path.read_bytes() == data
            failed += not same
            print(f"  {path.relative_to(MODELS_DIR)}: {'same bytes' if same else 'DIFFERS'}")
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        print(f"  wrote {path.relative_to(MODELS_DIR)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
