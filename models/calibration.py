"""Calibration models: BERT-base, DistilBERT-base and BERT-large at sequence 128, batch 4.

In: nothing (transformers configs built in code, random weights after ``torch.manual_seed(0)``,
biases seeded random as a trained model's are (``models/zoo.py trained_biases``), no hub call).
Out: ``models/.cache/calib_<name>_L<layers>.onnx`` (git-ignored) with 1 and 2
encoder layers each. The published Inf2 latencies these are compared with
(benchmarks/device_time.md) are for the full depth (12, 6 and 24 layers); the benchmark
estimates a 1-layer and a 2-layer export and extrapolates linearly in the number of layers
(every encoder layer is the same computation), which keeps each export small and fast on a
shared machine. The vocabulary is the released models' (30,522 tokens, the uncased
checkpoints'); ``--vocab N`` exports a table of N tokens instead, to show that the estimate does
not depend on it (the lookup is an indirect DMA of the rows looked up).

Run with the export venv, one at a time::

    nice -n 10 /work/venv-export/bin/python models/calibration.py            # all
    nice -n 10 /work/venv-export/bin/python models/calibration.py bert_base  # one
    nice -n 10 /work/venv-export/bin/python models/calibration.py --full distilbert_base
    nice -n 10 /work/venv-export/bin/python models/calibration.py --vocab 1024 bert_base

``--full`` also exports the full depth, which benchmarks/device_time.py then compiles to check
the extrapolation.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# MODELS and path_of are read by benchmarks/device_time.py without torch: torch, transformers
# and the zoo's exporter are imported only where a model is built.

BATCH, SEQ, VOCAB = 4, 128, 30522
CACHE = Path(__file__).resolve().parent / ".cache"
# name: (model family, hidden, heads, intermediate, full depth)
MODELS = {
    "bert_base": ("bert", 768, 12, 3072, 12),
    "distilbert_base": ("distilbert", 768, 12, 3072, 6),
    "bert_large": ("bert", 1024, 16, 4096, 24),
}
LAYERS = (1, 2)


def build(name: str, layers: int, vocab: int = VOCAB):
    """The zoo's `Built` (module, inputs) for `name` cut to `layers` encoder layers."""
    import torch
    from transformers import BertConfig, BertModel, DistilBertConfig, DistilBertModel

    from models.zoo import Built, TokenWrapper, trained_biases

    family, hidden, heads, inter, _ = MODELS[name]
    torch.manual_seed(0)
    if family == "bert":
        config = BertConfig(
            vocab_size=vocab,
            hidden_size=hidden,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            intermediate_size=inter,
            max_position_embeddings=512,
            attn_implementation="eager",
        )
        model = BertModel(config, add_pooling_layer=False)
    else:
        config = DistilBertConfig(
            vocab_size=vocab,
            dim=hidden,
            n_layers=layers,
            n_heads=heads,
            hidden_dim=inter,
            max_position_embeddings=512,
            attn_implementation="eager",
        )
        model = DistilBertModel(config)
    trained_biases(model)  # a trained model's biases are not zero
    model.eval()
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (BATCH, SEQ), generator=generator, dtype=torch.int64)
    inputs = {"input_ids": ids, "attention_mask": torch.ones(BATCH, SEQ, dtype=torch.int64)}
    return Built(
        TokenWrapper(model, "last_hidden_state"),
        inputs,
        ["last_hidden_state"],
        attention_blocks=layers,
        mlp_blocks=layers,
        config={"name": name, "layers": layers, "batch": BATCH, "seq": SEQ},
    )


def path_of(name: str, layers: int, vocab: int = VOCAB) -> Path:
    return CACHE / f"calib_{name}_L{layers}_v{vocab}.onnx"


def main(argv: list[str]) -> int:
    import onnx
    import torch

    from models.strip_metadata import strip_exporter_metadata
    from models.zoo import _export

    parser = argparse.ArgumentParser(
        prog="models/calibration.py",
        description="Export the calibration encoders (batch 4, sequence 128) at 1 and 2 layers "
        "to models/.cache/ (an export that exists is kept); run with the export venv.",
    )
    parser.add_argument(
        "models", nargs="*", metavar="MODEL", help=f"models (default all): {', '.join(MODELS)}"
    )
    parser.add_argument("--full", action="store_true", help="also export the full depth")
    parser.add_argument("--vocab", type=int, default=VOCAB, help=f"vocabulary (default {VOCAB})")
    args = parser.parse_args(argv)
    unknown = [n for n in args.models if n not in MODELS]
    if unknown:
        parser.error(f"unknown models {', '.join(unknown)}; models: {', '.join(MODELS)}")
    full, vocab, names = args.full, args.vocab, args.models or list(MODELS)
    CACHE.mkdir(exist_ok=True)
    for name in names:
        for layers in (*LAYERS, MODELS[name][4]) if full else LAYERS:
            out = path_of(name, layers, vocab)
            if out.exists():
                print(f"{out}: exists")
                continue
            start = time.time()
            with torch.no_grad():
                proto, exporter = _export(build(name, layers, vocab))
            strip_exporter_metadata(proto)
            onnx.save(proto, out)
            print(
                f"{out}: {exporter}, {out.stat().st_size / 1e6:.1f} MB, {time.time() - start:.0f} s"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
