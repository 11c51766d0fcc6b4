"""Exports for the Inf2 table rows: ResNet-18/34/50/101/152, VGG-11/16, ViT-base, and the
encoders BERT-base/large, RoBERTa-base/large, DistilBERT-base, ALBERT-base and ELECTRA-base.

The rows of the Neuron "Inf2 Inference Performance" table (Inf2.xlarge, FP32 models compiled
with matmult -> bf16 autocast, P50 latency per call on one NeuronCore-v2; vision at 224 x 224,
encoders at sequence 128) that benchmarks/device_time.py compares its estimate with, beside the
batch-4 BERT rows of models/calibration.py.

In: nothing. The CNNs are torchvision's (``weights=None``, so torchvision's own initialisation
after ``torch.manual_seed(0)``); the encoders are transformers models built from config objects
(``torch.manual_seed(0)``, random weights, no hub call) at the released models' sizes and
vocabularies, their biases given seeded random values as a trained model's are (transformers
starts them at zero, and the import drops an Add of a constant zero). Out:
``models/.cache/inf2_<row>[_L<layers>].onnx`` (git-ignored):

- a CNN row is one export at its batch (``inf2_resnet50_b8.onnx``);
- an encoder row is exported with 1 and 2 layers (the benchmark extrapolates linearly in the
  number of layers, as for the calibration rows) and, with ``--full``, at its full depth.

Each export is the zoo's (``models/zoo.py _export``: the dynamo exporter at opset 18, exporter
metadata stripped), with its default optimizer: unlike the zoo's own CNNs, a BatchNorm is folded
into the convolution before it, as a deployment compiler does (the Neuron compiler folds it
too); the batch norms of the random ResNets are first given the statistics of one seeded batch
(``models/zoo.py _calibrate_batchnorm``), so the folded weights are not the identity's.

``--export-form`` writes the same rows in other forms (``FORMS``), to check that the compiler
reaches the same program from each: the TorchScript exporter (``torch.onnx.export(...,
dynamo=False)``, opset 18, its defaults) beside the dynamo one, transformers' ``sdpa``
attention beside ``eager``, and for the ViT row torchvision's ``vit_b_16`` (``weights=None``,
cut to the same layers; its ``nn.MultiheadAttention`` packs q, k and v in one projection)
beside transformers' ``ViTForImageClassification``. The default form, ``dynamo``, keeps the
original file names; another form's exports are ``inf2_<row>.<form>[_L<layers>].onnx``.

Run with the export venv, one at a time::

    nice -n 10 /work/venv-export/bin/python models/inf2_table.py            # every row
    nice -n 10 /work/venv-export/bin/python models/inf2_table.py vgg16_b1   # one
    nice -n 10 /work/venv-export/bin/python models/inf2_table.py --full vit_base_b1
    nice -n 10 /work/venv-export/bin/python models/inf2_table.py --export-form all   # every form
    nice -n 10 /work/venv-export/bin/python models/inf2_table.py --export-form torchvision \
        vit_base_b1

This module's tables (ROWS, path_of, exports_of) are read by benchmarks/device_time.py without
torch: torch, torchvision and transformers are imported only where a model is built.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

CACHE = Path(__file__).resolve().parent / ".cache"
IMAGE, SEQ = 224, 128
LAYERS = (1, 2)


@dataclass(frozen=True)
class Row:
    """One row of the published table."""

    model: str  # torchvision name, or "vit_base", "bert_base", "roberta_base"
    batch: int
    published_ms: float  # P50 latency per call, one NeuronCore-v2
    throughput: float  # published inferences per second, the whole chip (CORES cores)
    depth: int = 0  # encoder layers of the released model; 0 for a CNN (exported whole)
    vocab: int = 0  # token rows of the embedding table (encoders with token input)

    @property
    def encoder(self) -> bool:
        return self.depth > 0

    @property
    def calls_in_flight(self) -> float:
        """Little's law on the published pair: throughput (calls per second) x latency."""
        return self.throughput / self.batch * self.published_ms * 1e-3

    @property
    def core_ms_per_call(self) -> float:
        """The most device time one call can take at the published throughput: a call runs on
        one core and a core runs one call at a time, so the cores in use (the calls in flight,
        at most CORES) each finish a call every cores x batch / throughput seconds."""
        cores = min(CORES, max(1, round(self.calls_in_flight)))
        return cores * self.batch / self.throughput * 1e3


CORES = 2  # NeuronCore-v2s of the one Inferentia2 chip of an Inf2.xlarge


@dataclass(frozen=True)
class ExportForm:
    """How a row's model is written to ONNX: the exporter, the attention implementation of a
    transformers model, and where the model comes from (transformers, or torchvision's
    `vit_b_16` for the ViT row). The compiler should reach the same program from each."""

    name: str
    exporter: str  # "dynamo" (torch.onnx.export(dynamo=True)) or "torchscript" (dynamo=False)
    attention: str = "eager"  # transformers attn_implementation: "eager" or "sdpa"
    source: str = "transformers"  # or "torchvision" (ViT-base only)

    def applies_to(self, row: Row) -> bool:
        """In: a row. Out: whether the row's model can be written in this form (CNNs take only
        the exporter axis, torchvision's ViT only the ViT row)."""
        if self.source == "torchvision":
            return row.model == "vit_base"
        return row.encoder or self.attention == "eager"


DEFAULT_FORM = "dynamo"  # the original exports, under their original file names
FORMS = {
    form.name: form
    for form in (
        ExportForm("dynamo", "dynamo", "eager"),
        ExportForm("dynamo-sdpa", "dynamo", "sdpa"),
        ExportForm("torchscript", "torchscript", "eager"),
        ExportForm("torchscript-sdpa", "torchscript", "sdpa"),
        ExportForm("torchvision", "torchscript", source="torchvision"),
        ExportForm("torchvision-dynamo", "dynamo", source="torchvision"),
    )
}


def forms_of(name: str) -> list[str]:
    """In: a row name. Out: the names of the export forms that apply to it, the default first."""
    return [f for f, form in FORMS.items() if form.applies_to(ROWS[name])]


# The published table: about-neuron/benchmarks/inf2/{latency,throughput}_data_*.csv of the
# Neuron SDK repository (P50 latency, throughput of the same row).
ROWS = {
    "resnet18_b1": Row("resnet18", 1, 0.596, 1669.796),
    "resnet50_b1": Row("resnet50", 1, 0.83, 1218.875),
    "resnet50_b8": Row("resnet50", 8, 7.283, 4393.304),
    "vgg16_b1": Row("vgg16", 1, 1.956, 508.665),
    "vit_base_b1": Row("vit_base", 1, 1.322, 746.139, depth=12),
    "bert_base_b1": Row("bert_base", 1, 0.999, 1998.210, depth=12, vocab=30522),
    "roberta_base_b1": Row("roberta_base", 1, 0.999, 1989.261, depth=12, vocab=50265),
    # Further rows of the same tables, added as a check that the gains are general: no
    # program change was made while watching them.
    "resnet34_b1": Row("resnet34", 1, 0.718, 1394.211),
    "resnet101_b1": Row("resnet101", 1, 1.007, 994.691),
    "resnet152_b1": Row("resnet152", 1, 1.185, 837.784),
    "vgg11_b1": Row("vgg11", 1, 1.59, 629.189),
    "resnet18_b8": Row("resnet18", 8, 4.587, 6949.174),
    # The encoder table's other rows (Neuron 2.25-2.26, PyTorch 2.7-2.8), added the same way.
    "distilbert_base_b1": Row("distilbert_base", 1, 0.579, 3401.966, depth=6, vocab=30522),
    "albert_base_b1": Row("albert_base", 1, 0.937, 2119.785, depth=12, vocab=30000),
    "electra_base_b1": Row("electra_base", 1, 0.996, 2020.455, depth=12, vocab=30522),
    "bert_large_b1": Row("bert_large", 1, 2.694, 738.645, depth=24, vocab=30522),
    "roberta_large_b1": Row("roberta_large", 1, 2.693, 738.884, depth=24, vocab=50265),
}


def path_of(name: str, layers: int | None = None, form: str = DEFAULT_FORM) -> Path:
    """The export of row `name` (an encoder's with `layers` layers) in export form `form`."""
    stem = f"inf2_{name}" if form == DEFAULT_FORM else f"inf2_{name}.{form}"
    if ROWS[name].encoder:
        return CACHE / f"{stem}_L{layers}.onnx"
    return CACHE / f"{stem}.onnx"


def exports_of(name: str, full: bool = False, form: str = DEFAULT_FORM) -> list[Path]:
    row = ROWS[name]
    if not row.encoder:
        return [path_of(name, form=form)]
    depths = (*LAYERS, row.depth) if full else LAYERS
    return [path_of(name, layers, form) for layers in depths]


def layers_of(path: Path) -> int | None:
    """In: an export's path. Out: its encoder layers (None for a CNN's export)."""
    stem = path.stem
    return int(stem.rsplit("_L", 1)[1]) if "_L" in stem else None


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _cnn(row: Row):
    import torch
    import torchvision

    from models.zoo import Built, _calibrate_batchnorm

    torch.manual_seed(0)
    model = getattr(torchvision.models, row.model)(weights=None)
    model.eval()
    shape = (row.batch, 3, IMAGE, IMAGE)
    if any(isinstance(m, torch.nn.BatchNorm2d) for m in model.modules()):
        _calibrate_batchnorm(model, shape)
    pixels = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
    # batchnorms=0: the exporter's optimizer folds them into the convolutions.
    return Built(model, {"input": pixels}, ["logits"], 0, 0, {"name": row.model, **vars(row)})


def _sizes(layers: int, large: bool = False, attention: str = "eager") -> dict:
    """A base-size (or large) encoder's transformers config sizes, cut to `layers` layers."""
    return dict(
        hidden_size=1024 if large else 768,
        num_hidden_layers=layers,
        num_attention_heads=16 if large else 12,
        intermediate_size=4096 if large else 3072,
        attn_implementation=attention,
    )


def _token_model(row: Row, layers: int, attention: str = "eager"):
    """The transformers encoder of a token row, at the released model's sizes, cut to `layers`
    layers; returns (model, lowest token id used)."""
    from transformers import (
        AlbertConfig,
        AlbertModel,
        BertConfig,
        BertModel,
        DistilBertConfig,
        DistilBertModel,
        ElectraConfig,
        ElectraModel,
        RobertaConfig,
        RobertaModel,
    )

    large = row.model.endswith("_large")
    sizes = dict(_sizes(layers, large, attention), vocab_size=row.vocab)
    if row.model in ("bert_base", "bert_large"):  # bert-{base,large}-uncased
        config = BertConfig(**sizes, max_position_embeddings=512)
        return BertModel(config, add_pooling_layer=False), 0
    if row.model in ("roberta_base", "roberta_large"):
        config = RobertaConfig(
            **sizes,
            max_position_embeddings=514,
            type_vocab_size=1,
            layer_norm_eps=1e-5,
            pad_token_id=1,
        )
        # no padding (1) or special tokens: every position counts
        return RobertaModel(config, add_pooling_layer=False), 3
    if row.model == "electra_base":  # google/electra-base-discriminator
        config = ElectraConfig(**sizes, embedding_size=768, max_position_embeddings=512)
        return ElectraModel(config), 0
    if row.model == "albert_base":  # albert-base-v2: 128-wide embeddings, one shared layer
        config = AlbertConfig(**sizes, embedding_size=128, hidden_act="gelu_new")
        return AlbertModel(config, add_pooling_layer=False), 0
    if row.model == "distilbert_base":  # distilbert-base-uncased
        config = DistilBertConfig(
            vocab_size=row.vocab, n_layers=layers, attn_implementation=attention
        )
        return DistilBertModel(config), 0
    raise ValueError(f"no encoder for {row.model!r}")


def _pixel_input(model):
    """In: a torch module called as model(pixels). Out: the same module called with the
    keyword pixel_values, so every ViT form has transformers' input name."""
    import torch

    class PixelValues(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.model = inner

        def forward(self, pixel_values):
            return self.model(pixel_values)

    return PixelValues(model)


def _torchvision_vit(layers: int):
    """torchvision's `vit_b_16` (weights=None) cut to `layers` encoder layers: the same
    ViT-base (patch 16, 224, hidden 768, 12 heads, MLP 3072, 1,000 classes) as transformers'."""
    import torchvision

    return torchvision.models.VisionTransformer(
        image_size=IMAGE,
        patch_size=16,
        num_layers=layers,
        num_heads=12,
        hidden_dim=768,
        mlp_dim=3072,
        num_classes=1000,
    )


def _vit(row: Row, layers: int, form: ExportForm):
    """In: the ViT row, its layers and export form. Out: the zoo's `Built` of the classifier."""
    import torch
    from transformers import ViTConfig, ViTForImageClassification

    from models.zoo import Built, PixelWrapper, trained_biases

    config = {"name": row.model, "layers": layers, "batch": row.batch, "form": form.name}
    if form.source == "torchvision":
        model = _pixel_input(_torchvision_vit(layers))
    else:  # google/vit-base-patch16-224: 1,000 ImageNet classes
        sizes = _sizes(layers, attention=form.attention)
        vit = ViTConfig(**sizes, image_size=IMAGE, patch_size=16, num_channels=3, num_labels=1000)
        model = PixelWrapper(ViTForImageClassification(vit), "logits")
    trained_biases(model)
    model.eval()
    pixels = torch.randn(row.batch, 3, IMAGE, IMAGE, generator=torch.Generator().manual_seed(1))
    return Built(model, {"pixel_values": pixels}, ["logits"], layers, layers, config)


def _encoder(row: Row, layers: int, form: ExportForm):
    import torch

    from models.zoo import Built, TokenWrapper, trained_biases

    torch.manual_seed(0)
    config = {"name": row.model, "layers": layers, "batch": row.batch, "form": form.name}
    if row.model == "vit_base":
        return _vit(row, layers, form)
    model, low = _token_model(row, layers, form.attention)
    trained_biases(model)
    model.eval()
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(low, row.vocab, (row.batch, SEQ), generator=generator, dtype=torch.int64)
    inputs = {"input_ids": ids, "attention_mask": torch.ones(row.batch, SEQ, dtype=torch.int64)}
    return Built(
        TokenWrapper(model, "last_hidden_state"),
        inputs,
        ["last_hidden_state"],
        layers,
        layers,
        config,
    )


def build(name: str, layers: int | None = None, form: str = DEFAULT_FORM):
    """The zoo's `Built` (module, inputs) for row `name` (an encoder cut to `layers`)."""
    row = ROWS[name]
    return _encoder(row, layers, FORMS[form]) if row.encoder else _cnn(row)


def export(built, form: str):
    """In: a `Built` and an export form's name. Out: (ModelProto, exporter description).

    The dynamo form is the zoo's export (`models/zoo.py _export`: opset 18, the exporter's
    default optimizer, which folds BatchNorm into the conv before it); the TorchScript forms
    call `torch.onnx.export(..., dynamo=False, opset_version=18)` with its defaults (eval
    mode, constant folding, which folds BatchNorm too)."""
    import io

    import onnx
    import torch

    from models.zoo import OPSET, _export

    if FORMS[form].exporter == "dynamo":
        return _export(built)
    buffer = io.BytesIO()
    args = tuple(built.inputs.values())
    names = dict(input_names=list(built.inputs), output_names=built.output_names)
    torch.onnx.export(built.module, args, buffer, dynamo=False, opset_version=OPSET, **names)
    return onnx.load_from_string(buffer.getvalue()), "torchscript"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="models/inf2_table.py",
        description="Export the Inf2 table's rows to models/.cache/ (an export that exists is "
        "kept); run with the export venv (torch, torchvision, transformers).",
    )
    parser.add_argument(
        "rows", nargs="*", metavar="ROW", help=f"rows (default all): {', '.join(ROWS)}"
    )
    parser.add_argument("--full", action="store_true", help="also export encoders at full depth")
    parser.add_argument(
        "--export-form",
        action="append",
        choices=[*FORMS, "all"],
        help=f"export forms (repeatable; default {DEFAULT_FORM}; 'all': every form of a row)",
    )
    args = parser.parse_args(argv)
    names = args.rows or list(ROWS)
    unknown = [n for n in names if n not in ROWS]
    if unknown:
        parser.error(f"unknown rows {', '.join(unknown)}; rows: {', '.join(ROWS)}")
    full = args.full
    forms = args.export_form or [DEFAULT_FORM]
    import onnx  # the export venv's packages, needed only past --help
    import torch

    from models.strip_metadata import strip_exporter_metadata

    CACHE.mkdir(exist_ok=True)
    for name, form, out in _planned(names, forms, full):
        if out.exists():
            print(f"{out}: exists")
            continue
        start = time.time()
        # A TorchScript export traces with autograd on, as a user's call does: under no_grad
        # nn.MultiheadAttention (torchvision's ViT) takes its fused fast path, which the
        # TorchScript exporter cannot write.
        with torch.set_grad_enabled(FORMS[form].exporter == "torchscript"):
            proto, exporter = export(build(name, layers_of(out), form), form)
        strip_exporter_metadata(proto)
        ops: dict[str, int] = {}
        for node in proto.graph.node:
            ops[node.op_type] = ops.get(node.op_type, 0) + 1
        onnx.save(proto, out)
        print(
            f"{out}: {exporter}, {out.stat().st_size / 1e6:.1f} MB, "
            f"{time.time() - start:.0f} s, sha256 {sha256(out)}\n  ops {ops}"
        )
    return 0


def _planned(names: list[str], forms: list[str], full: bool):
    """In: rows, form names (or "all"), whether encoders go to full depth. Out: (row, form,
    path) of every export to make, in order."""
    for name in names:
        chosen = forms_of(name) if "all" in forms else [f for f in forms if f in forms_of(name)]
        for form in chosen:
            for out in exports_of(name, full, form):
                yield name, form, out


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
