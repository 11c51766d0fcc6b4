"""Held-out `quantize_dynamic` models, exported from torch, validated integer tensor by integer
tensor (docs/quantization.md#dynamic-figures).

In: nothing (or names from `CONFIGS`). transformers' DistilBertModel and LlamaForCausalLM at
three sizes each, with their own random initialisation after `torch.manual_seed(0)` (no hub
call), exported by torch's dynamo exporter at opset 18 (`zoo.py`'s `_export`), then onnxruntime's
`quant_pre_process` and `quantize_dynamic` with its defaults, as a user would run them. Out:
`models/.cache/dynamic/<name>_dynamic.onnx`, and for each model the verdict of
`onnx2bir.validate` under the default autocast and under `--auto-cast none`, with every integer
tensor onnxruntime's tool wrote made a graph output (`dynamic_blocks.with_integer_outputs`), so
each DynamicQuantizeLinear's y and zero point and each MatMulInteger's int32 is compared at the
exact bound. Prints a Markdown table; exit status 1 when a validation fails.

    python models/dynamic_heldout.py                       # all six
    python models/dynamic_heldout.py distilbert_h768 llama_h256

Needs torch, transformers and onnxscript (the export venv of `zoo.py`); onnx2bir itself only
reads the .onnx files. All six take about 3 minutes on 2 cores, exports included.
"""

from __future__ import annotations

import os
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import onnx

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from dynamic_blocks import (  # noqa: E402
    integer_tensors,
    quantize_dynamic_defaults,
    token_ids,
    with_integer_outputs,
)

OUT = HERE / ".cache" / "dynamic"
VOCAB = 8000
# name: (kind, hidden, layers, heads, key/value heads, intermediate, seq)
CONFIGS = {
    "distilbert_h256": ("distilbert", 256, 2, 4, 4, 1024, 64),
    "distilbert_h512": ("distilbert", 512, 4, 8, 8, 2048, 128),
    "distilbert_h768": ("distilbert", 768, 6, 12, 12, 3072, 128),
    "llama_h256": ("llama", 256, 2, 4, 2, 688, 64),
    "llama_h512": ("llama", 512, 3, 8, 4, 1376, 128),
    "llama_h768": ("llama", 768, 4, 12, 4, 2048, 128),
}


def build(name: str):
    """The torch module of one config, wrapped as zoo.py wraps token models."""
    import torch
    from zoo import Built, TokenWrapper, _token_inputs

    kind, hidden, layers, heads, kv, inter, seq = CONFIGS[name]
    torch.manual_seed(0)
    if kind == "distilbert":
        from transformers import DistilBertConfig, DistilBertModel

        config = DistilBertConfig(
            vocab_size=VOCAB,
            dim=hidden,
            n_layers=layers,
            n_heads=heads,
            hidden_dim=inter,
            max_position_embeddings=512,
            attn_implementation="eager",
        )
        module, output = DistilBertModel(config).eval(), "last_hidden_state"
    else:
        from transformers import LlamaConfig, LlamaForCausalLM

        config = LlamaConfig(
            vocab_size=VOCAB,
            hidden_size=hidden,
            intermediate_size=inter,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=kv,
            max_position_embeddings=256,
            hidden_act="silu",
            tie_word_embeddings=False,
            use_cache=False,
            attn_implementation="eager",
        )
        module, output = LlamaForCausalLM(config).eval(), "logits"
    wrapped = TokenWrapper(module, output)
    return Built(wrapped, _token_inputs(VOCAB, seq), [output], layers, layers, {})


def export_quantized(name: str) -> onnx.ModelProto:
    """Export one config and quantize it with `quantize_dynamic`'s defaults; cached."""
    from strip_metadata import strip_exporter_metadata
    from zoo import _export

    path = OUT / f"{name}_dynamic.onnx"
    if path.exists():
        return onnx.load(str(path))
    proto, _ = _export(build(name), 18)
    strip_exporter_metadata(proto)
    quantized = quantize_dynamic_defaults(proto)
    OUT.mkdir(parents=True, exist_ok=True)
    onnx.save(quantized, str(path))
    return quantized


def validate(name: str, model: onnx.ModelProto) -> dict:
    """The row of one model: its counts and both verdicts."""
    import onnx2bir

    seq = CONFIGS[name][-1]
    feeds = token_ids(VOCAB, seq)
    if any(value.name == "attention_mask" for value in model.graph.input):
        feeds["attention_mask"] = np.ones((1, seq), np.int64)
    exposed = with_integer_outputs(model)
    accumulators = {n.output[0] for n in model.graph.node if n.op_type == "MatMulInteger"}
    casts = {
        n.output[0] for n in model.graph.node if n.op_type == "Cast" and n.input[0] in accumulators
    }
    ops = Counter(n.op_type for n in model.graph.node)
    row = {
        "name": name,
        "config": CONFIGS[name],
        "ops": ops,
        "integers": len(integer_tensors(model)),
    }
    for auto_cast in ("matmult", "none"):
        doc = onnx2bir.validate(exposed, inputs=feeds, auto_cast=auto_cast).document
        exact = [o for o in doc["outputs"] if o["bound"] == "exact"]
        checkpoints = doc["checkpoints"]
        row[auto_cast] = {
            "passed": doc["passed"],
            "checkpoints": len(checkpoints),
            "checkpoints_passed": sum(c["passed"] for c in checkpoints),
            "exact": sum(o["max_abs_err"] == 0 for o in exact),
            "exact_err": max((o["max_abs_err"] for o in exact), default=0.0),
            "cast_err": max(
                (c["max_abs_err"] for c in checkpoints if c["name"] in casts), default=0.0
            ),
        }
    return row


def table(rows: list[dict]) -> str:
    lines = [
        "| model | hidden, layers, heads (kv), FFN, seq | MatMulInteger / DynamicQuantizeLinear | "
        "integer tensors exact (error 0) | checkpoints passed | default | `--auto-cast none` |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        kind, hidden, layers, heads, kv, inter, seq = row["config"]
        heads_text = f"{heads}" if kv == heads else f"{heads} ({kv})"
        a, b = row["matmult"], row["none"]
        verdict = {True: "PASS", False: "FAIL"}
        lines.append(
            f"| {row['name']} | {hidden}, {layers}, {heads_text}, {inter}, {seq} | "
            f"{row['ops']['MatMulInteger']} / {row['ops']['DynamicQuantizeLinear']} | "
            f"{a['exact']}/{row['integers']} | {a['checkpoints_passed']}/{a['checkpoints']} | "
            f"{verdict[a['passed']]} | {verdict[b['passed']]} |"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    names = argv or list(CONFIGS)
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        print(f"unknown: {', '.join(unknown)}; known: {', '.join(CONFIGS)}", file=sys.stderr)
        return 2
    rows = []
    for name in names:
        row = validate(name, export_quantized(name))
        a, b = row["matmult"], row["none"]
        print(
            f"{name}: default {'PASS' if a['passed'] else 'FAIL'}, none "
            f"{'PASS' if b['passed'] else 'FAIL'}; largest error on an integer tensor "
            f"{max(a['exact_err'], b['exact_err'])}, on an accumulator cast to float "
            f"{max(a['cast_err'], b['cast_err'])}",
            flush=True,
        )
        rows.append(row)
    print(table(rows))
    return 0 if all(r["matmult"]["passed"] and r["none"]["passed"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
