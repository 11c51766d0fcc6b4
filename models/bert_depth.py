"""BERT (hidden 256, 4 heads, sequence 128, batch 1) at several depths, for the speed benchmark.

In: layer counts (default 2, 12 and 24). Out: ``models/.cache/bert_h256_L<layers>.onnx``
(git-ignored), random weights after ``torch.manual_seed(0)``, eager attention, opset 18, the
zoo's exporter. Every encoder layer is the same computation, so convert and simulate time
should grow linearly with the depth; benchmarks/bench_models.py measures how they do.

Run with the export venv::

    nice -n 10 /work/venv-export/bin/python models/bert_depth.py          # 2, 12 and 24 layers
    nice -n 10 /work/venv-export/bin/python models/bert_depth.py 12       # one depth
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

HIDDEN, HEADS, SEQ, VOCAB = 256, 4, 128, 8000
DEPTHS = (2, 12, 24)
CACHE = Path(__file__).resolve().parent / ".cache"


def path_of(layers: int) -> Path:
    """Where the export for `layers` encoder layers lives (read without torch)."""
    return CACHE / f"bert_h256_L{layers}.onnx"


def build(layers: int):
    """The zoo's `Built` for a BERT of `layers` encoder layers."""
    import torch
    from transformers import BertConfig, BertModel

    from models.zoo import Built, TokenWrapper, _token_inputs

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        num_hidden_layers=layers,
        num_attention_heads=HEADS,
        intermediate_size=4 * HIDDEN,
        max_position_embeddings=SEQ,
        hidden_act="gelu",
        attn_implementation="eager",
    )
    model = BertModel(config, add_pooling_layer=False)
    model.eval()
    return Built(
        TokenWrapper(model, "last_hidden_state"),
        _token_inputs(VOCAB, SEQ),
        ["last_hidden_state"],
        attention_blocks=layers,
        mlp_blocks=layers,
        config={"layers": layers, "hidden": HIDDEN, "seq": SEQ},
    )


def main(argv: list[str]) -> int:
    import onnx
    import torch

    from models.strip_metadata import strip_exporter_metadata
    from models.zoo import _export

    CACHE.mkdir(exist_ok=True)
    for layers in [int(a) for a in argv] or DEPTHS:
        out = path_of(layers)
        if out.exists():
            print(f"{out}: exists")
            continue
        start = time.time()
        with torch.no_grad():
            proto, exporter = _export(build(layers))
        strip_exporter_metadata(proto)
        onnx.save(proto, out)
        print(f"{out}: {exporter}, {out.stat().st_size / 1e6:.1f} MB, {time.time() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
