"""Model zoo: small seeded PyTorch / transformers models exported to ONNX for onnx2bir tests.

In:  nothing. Every model is built from code (or from a ``transformers`` config object) after
     ``torch.manual_seed(0)``; no hub function is called and nothing is downloaded.
Out: ``models/<name>.onnx`` for the small configs (committed, each a single self-contained file
     of at most 2 MB, opset 18, static shapes, batch 1), or ``models/.cache/<name>_large.onnx``
     with ``--large`` (git-ignored, for benchmarks). ``--sdpa`` re-exports the transformers
     models with ``attn_implementation="sdpa"`` into ``models/.cache/<name>_sdpa.onnx`` for
     comparison only.

Each model is exported with ``torch.onnx.export(..., dynamo=True, opset_version=18)``; the legacy
TorchScript exporter is used only if the dynamo exporter raises. For the CNNs the exporter's
BatchNorm-into-Conv fusion rules are switched off so that BatchNormalization stays in the graph
(see ``_without_batchnorm_fusion``); every BatchNorm gets seeded, calibrated statistics first.
Node metadata (the exporter's stack traces, module scopes and FX nodes) is stripped
(``strip_metadata.py``). Which exporter produced a file
is stored in its ``metadata_props`` (key ``onnx2bir.zoo.exporter``) together with the zoo name,
the attention / MLP block counts by construction and the config. For every model the script
prints the exporter, opset, file size and op-type counts, runs ``onnx.checker`` and checks that
onnxruntime matches torch on seeded random inputs (token ids within the vocabulary, attention
mask of ones) to ``TOLERANCE``; it exits non-zero if a check fails.

Run from anywhere::

    python models/zoo.py                   # all small models -> models/<name>.onnx
    python models/zoo.py bert gpt2         # some of them
    python models/zoo.py --large           # bigger configs -> models/.cache/<name>_large.onnx
    python models/zoo.py --sdpa bert       # sdpa variant -> models/.cache/bert_sdpa.onnx
    python models/zoo.py --variants        # transformers models at opset 20 (eager, sdpa)
                                           # and 23 (sdpa) -> models/hf/<name>_op<N>_<attn>.onnx
    python models/zoo.py --variants bert --opset 23   # one of them
    python models/zoo.py --list

The ``--variants`` files are committed stripped of doc strings and ``metadata_props`` (each
under 1 MB); ``models/MANIFEST.md`` lists them. Use the export venv and run them one at a time
(``nice -n 10``): each export takes a core for up to two minutes.

Import: ``from models.zoo import ZOO, build, export_model`` (run from the repository root).
Needs torch, onnxscript, onnx, onnxruntime and (for the transformers models) transformers; the
onnx2bir tool itself only reads the produced .onnx files.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import io
import json
import logging
import math
import os
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from strip_metadata import strip_exporter_metadata  # noqa: E402

# transformers is imported lazily by the builders; it must never reach the hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

MODELS_DIR = Path(__file__).resolve().parent
CACHE_DIR = MODELS_DIR / ".cache"
OPSET = 18
SEED = 0
INPUT_SEED = 1
MAX_SMALL_BYTES = 2 * 1024 * 1024
MAX_VARIANT_BYTES = 1000 * 1000  # committed opset/attention variants (models/hf/)
VARIANTS_DIR = MODELS_DIR / "hf"
# The transformers models exported as variants: opset 20 (eager and sdpa) and 23 (sdpa; the
# exporter writes one onnx.Attention per block there).
HF_VARIANTS = ("bert", "gpt2", "llama", "t5_encoder", "vit", "whisper_encoder")
VARIANT_SETS = ((20, "eager"), (20, "sdpa"), (23, "sdpa"))
TOLERANCE = 1e-4
META_PREFIX = "onnx2bir.zoo."

# Ops that deserve a mention in the report when an export contains them.
NOTABLE_OPS = frozenset(
    {
        "Expand",
        "Where",
        "IsNaN",
        "If",
        "Loop",
        "Scan",
        "And",
        "Or",
        "Not",
        "Equal",
        "Less",
        "LessOrEqual",
        "Greater",
        "GreaterOrEqual",
        "Range",
        "Trilu",
        "GatherND",
        "ScatterND",
        "CumSum",
        "ConstantOfShape",
        "Shape",
        "Size",
        "Split",
        "Slice",
        "Gather",
        "Log",
        "Min",
        "Max",
        "Abs",
        "Pow",
        "Erf",
        "Tanh",
        "BatchNormalization",
        "LayerNormalization",
        "Resize",
        "ConvTranspose",
        "HardSwish",
        "HardSigmoid",
        "Cast",
        "Attention",
        "RotaryEmbedding",
        "RMSNormalization",
        "Gelu",
    }
)


# --------------------------------------------------------------------------------------------
# Built model description
# --------------------------------------------------------------------------------------------


@dataclass
class Built:
    """A model ready for export: module, example inputs (in order) and block counts."""

    module: nn.Module
    inputs: dict[str, torch.Tensor]
    output_names: list[str]
    attention_blocks: int
    mlp_blocks: int
    config: dict[str, object]
    batchnorms: int = 0  # BatchNorm modules by construction (to spot exporter folding)


@dataclass(frozen=True)
class ZooEntry:
    name: str
    summary: str
    builder: Callable[[bool, str], Built]  # (large, attn_implementation) -> Built
    uses_transformers: bool = False
    notes: tuple[str, ...] = field(default_factory=tuple)


def _generator() -> torch.Generator:
    return torch.Generator().manual_seed(INPUT_SEED)


def _float_input(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=_generator())


def _token_inputs(vocab: int, seq: int) -> dict[str, torch.Tensor]:
    ids = torch.randint(0, vocab, (1, seq), generator=_generator(), dtype=torch.int64)
    return {"input_ids": ids, "attention_mask": torch.ones(1, seq, dtype=torch.int64)}


def _count(module: nn.Module, kind: type) -> int:
    return sum(isinstance(m, kind) for m in module.modules())


def trained_biases(model) -> None:
    """Give every bias seeded random values (std 0.02). transformers initialises biases to
    zero, and the import drops an Add of a constant zero (frontend/folding.py): an export with
    zero biases would lose every projection's bias Add, which a trained model keeps. For the
    exports whose device time is compared with published latencies (models/inf2_table.py,
    models/calibration.py)."""
    import torch

    generator = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("bias"):
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.02)


def _calibrate_batchnorm(module: nn.Module, shape: tuple[int, ...]) -> None:
    """Give every BatchNorm seeded affine parameters and the statistics of one random batch.

    With default running statistics (mean 0, variance 1) a BatchNorm in eval mode is almost the
    identity and activations drift block after block. Instead the running statistics are set to
    the per-channel statistics of a seeded batch of 4 (one forward pass in train mode with
    ``momentum=None``, i.e. a cumulative average), so the exported BatchNormalization nodes do
    real work. The generator is separate from the global one, so weights do not shift.
    """
    gen = torch.Generator().manual_seed(1234)
    norms = [m for m in module.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    with torch.no_grad():
        for norm in norms:
            norm.weight.copy_(torch.empty_like(norm.weight).uniform_(0.8, 1.2, generator=gen))
            norm.bias.copy_(torch.empty_like(norm.bias).uniform_(-0.1, 0.1, generator=gen))
            norm.reset_running_stats()
            norm.momentum = None
        module.train()
        module(torch.randn(4, *shape[1:], generator=gen))
    for norm in norms:
        norm.momentum = 0.1
    module.eval()


# --------------------------------------------------------------------------------------------
# CNNs
# --------------------------------------------------------------------------------------------


class BasicBlock(nn.Module):
    """ResNet BasicBlock: conv3x3-BN-ReLU-conv3x3-BN, plus a 1x1 conv-BN shortcut if needed."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.down: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return self.relu(y + self.down(x))


class ResNet18(nn.Module):
    """ResNet-18 layout (stem 7x7/2 + maxpool, 4 stages of 2 BasicBlocks, GAP, FC)."""

    def __init__(self, widths: tuple[int, int, int, int], num_classes: int) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, widths[0], 7, 2, 3, bias=False),
            nn.BatchNorm2d(widths[0]),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(3, 2, 1),
        )
        blocks: list[nn.Module] = []
        cin = widths[0]
        for stage, width in enumerate(widths):
            stride = 1 if stage == 0 else 2
            blocks += [BasicBlock(cin, width, stride), BasicBlock(width, width, 1)]
            cin = width
        self.blocks = nn.Sequential(*blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(self.blocks(self.stem(x)))
        return self.fc(torch.flatten(x, 1))


def build_resnet18(large: bool, attn: str) -> Built:
    widths, size, classes = ((64, 128, 256, 512), 224, 1000) if large else ((8, 16, 32, 64), 64, 10)
    shape = (1, 3, size, size)
    module = ResNet18(widths, classes)
    _calibrate_batchnorm(module, shape)
    return Built(
        module,
        {"input": _float_input(*shape)},
        ["logits"],
        attention_blocks=0,
        mlp_blocks=0,
        config={"widths": widths, "image": size, "classes": classes, "blocks": [2, 2, 2, 2]},
        batchnorms=_count(module, nn.BatchNorm2d),
    )


class SqueezeExcite(nn.Module):
    """GAP -> 1x1 conv -> ReLU -> 1x1 conv -> Hardsigmoid -> scale the input."""

    def __init__(self, channels: int, squeeze: int) -> None:
        super().__init__()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Conv2d(channels, squeeze, 1)
        self.relu = nn.ReLU(inplace=True)
        self.fc2 = nn.Conv2d(squeeze, channels, 1)
        self.gate = nn.Hardsigmoid()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gate(self.fc2(self.relu(self.fc1(self.pool(x)))))


def _make_divisible(value: float, divisor: int = 8) -> int:
    new = max(divisor, int(value + divisor / 2) // divisor * divisor)
    return new + divisor if new < 0.9 * value else new


def _conv_bn_act(cin: int, cout: int, k: int, stride: int, groups: int, act: str) -> nn.Sequential:
    layers: list[nn.Module] = [
        nn.Conv2d(cin, cout, k, stride, (k - 1) // 2, groups=groups, bias=False),
        nn.BatchNorm2d(cout),
    ]
    if act == "HS":
        layers.append(nn.Hardswish())
    elif act == "RE":
        layers.append(nn.ReLU(inplace=True))
    return nn.Sequential(*layers)


class InvertedResidual(nn.Module):
    """MobileNetV3 block: 1x1 expand, depthwise kxk, optional SE, 1x1 project, residual."""

    def __init__(
        self, cin: int, k: int, exp: int, cout: int, se: bool, act: str, stride: int
    ) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        if exp != cin:
            layers.append(_conv_bn_act(cin, exp, 1, 1, 1, act))
        layers.append(_conv_bn_act(exp, exp, k, stride, exp, act))  # depthwise
        if se:
            layers.append(SqueezeExcite(exp, _make_divisible(exp // 4)))
        layers.append(_conv_bn_act(exp, cout, 1, 1, 1, "none"))
        self.body = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.body(x)
        return x + y if self.residual else y


# (kernel, expanded channels, out channels, squeeze-excite, activation, stride)
_MBV3_SMALL = [
    (3, 16, 16, True, "RE", 2),
    (3, 48, 24, False, "RE", 2),
    (3, 64, 24, False, "RE", 1),
    (5, 72, 40, True, "HS", 2),
    (5, 120, 40, True, "HS", 1),
    (5, 144, 48, True, "HS", 1),
]
# torchvision's mobilenet_v3_small settings.
_MBV3_LARGE = [
    (3, 16, 16, True, "RE", 2),
    (3, 72, 24, False, "RE", 2),
    (3, 88, 24, False, "RE", 1),
    (5, 96, 40, True, "HS", 2),
    (5, 240, 40, True, "HS", 1),
    (5, 240, 40, True, "HS", 1),
    (5, 120, 48, True, "HS", 1),
    (5, 144, 48, True, "HS", 1),
    (5, 288, 96, True, "HS", 2),
    (5, 576, 96, True, "HS", 1),
    (5, 576, 96, True, "HS", 1),
]


class MobileNetV3(nn.Module):
    def __init__(self, settings: list, last: int, hidden: int, num_classes: int) -> None:
        super().__init__()
        layers: list[nn.Module] = [_conv_bn_act(3, 16, 3, 2, 1, "HS")]
        cin = 16
        for k, exp, cout, se, act, stride in settings:
            layers.append(InvertedResidual(cin, k, exp, cout, se, act, stride))
            cin = cout
        layers.append(_conv_bn_act(cin, last, 1, 1, 1, "HS"))
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(
            nn.Linear(last, hidden), nn.Hardswish(), nn.Dropout(0.2), nn.Linear(hidden, num_classes)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(self.features(x))
        return self.classifier(torch.flatten(x, 1))


def build_mobilenetv3(large: bool, attn: str) -> Built:
    if large:
        settings, last, hidden, size, classes = _MBV3_LARGE, 576, 1024, 224, 1000
    else:
        settings, last, hidden, size, classes = _MBV3_SMALL, 288, 256, 64, 10
    shape = (1, 3, size, size)
    module = MobileNetV3(settings, last, hidden, classes)
    _calibrate_batchnorm(module, shape)
    return Built(
        module,
        {"input": _float_input(*shape)},
        ["logits"],
        attention_blocks=0,
        mlp_blocks=1,  # classifier Linear -> Hardswish -> Linear (SE blocks are 1x1 convs)
        config={"blocks": len(settings), "last": last, "hidden": hidden, "image": size},
        batchnorms=_count(module, nn.BatchNorm2d),
    )


def _double_conv(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(cin, cout, 3, padding=1, bias=False),
        nn.BatchNorm2d(cout),
        nn.ReLU(inplace=True),
        nn.Conv2d(cout, cout, 3, padding=1, bias=False),
        nn.BatchNorm2d(cout),
        nn.ReLU(inplace=True),
    )


class UNet(nn.Module):
    """3-level UNet: MaxPool down, two ConvTranspose2d ups and one bilinear nn.Upsample up."""

    def __init__(self, base: int, num_classes: int) -> None:
        super().__init__()
        c1, c2, c3, c4 = base, 2 * base, 4 * base, 8 * base
        self.enc1, self.enc2, self.enc3 = (
            _double_conv(3, c1),
            _double_conv(c1, c2),
            _double_conv(c2, c3),
        )
        self.pool = nn.MaxPool2d(2)
        self.bottleneck = _double_conv(c3, c4)
        self.up3 = nn.ConvTranspose2d(c4, c3, 2, stride=2)
        self.dec3 = _double_conv(2 * c3, c3)
        self.up2 = nn.ConvTranspose2d(c3, c2, 2, stride=2)
        self.dec2 = _double_conv(2 * c2, c2)
        self.up1 = nn.Sequential(
            nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False),
            nn.Conv2d(c2, c1, 1),
        )
        self.dec1 = _double_conv(2 * c1, c1)
        self.head = nn.Conv2d(c1, num_classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        e1 = self.enc1(x)
        e2 = self.enc2(self.pool(e1))
        e3 = self.enc3(self.pool(e2))
        b = self.bottleneck(self.pool(e3))
        d3 = self.dec3(torch.cat([self.up3(b), e3], dim=1))
        d2 = self.dec2(torch.cat([self.up2(d3), e2], dim=1))
        d1 = self.dec1(torch.cat([self.up1(d2), e1], dim=1))
        return self.head(d1)


def build_unet(large: bool, attn: str) -> Built:
    base, size = (32, 256) if large else (8, 64)
    shape = (1, 3, size, size)
    module = UNet(base, num_classes=2)
    _calibrate_batchnorm(module, shape)
    return Built(
        module,
        {"input": _float_input(*shape)},
        ["logits"],
        attention_blocks=0,
        mlp_blocks=0,
        config={"base": base, "image": size, "classes": 2, "levels": 3},
        batchnorms=_count(module, nn.BatchNorm2d),
    )


# --------------------------------------------------------------------------------------------
# Conv1d speech front end
# --------------------------------------------------------------------------------------------


class ConvLayerNormGelu(nn.Module):
    """Conv1d -> LayerNorm over channels (via transposes) -> GELU (erf)."""

    def __init__(self, cin: int, cout: int, k: int, stride: int) -> None:
        super().__init__()
        self.conv = nn.Conv1d(cin, cout, k, stride, bias=False)
        self.norm = nn.LayerNorm(cout)
        self.act = nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x)
        x = self.norm(x.transpose(1, 2)).transpose(1, 2)
        return self.act(x)


class SpeechFrontEnd(nn.Module):
    """wav2vec2-style feature encoder: 7 strided Conv1d (total stride 320) + projection."""

    LAYERS = [(10, 5), (3, 2), (3, 2), (3, 2), (3, 2), (2, 2), (2, 2)]

    def __init__(self, channels: int, dim: int) -> None:
        super().__init__()
        layers = []
        cin = 1
        for k, stride in self.LAYERS:
            layers.append(ConvLayerNormGelu(cin, channels, k, stride))
            cin = channels
        self.convs = nn.Sequential(*layers)
        self.norm = nn.LayerNorm(channels)
        self.proj = nn.Linear(channels, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.convs(x).transpose(1, 2)  # (B, T, C)
        return self.proj(self.norm(x))


def build_speech(large: bool, attn: str) -> Built:
    channels, dim, samples = (512, 768, 16000) if large else (32, 64, 4000)
    module = SpeechFrontEnd(channels, dim)
    return Built(
        module,
        {"input": _float_input(1, 1, samples)},
        ["features"],
        attention_blocks=0,
        mlp_blocks=0,
        config={"channels": channels, "dim": dim, "samples": samples, "layers": 7},
    )


# --------------------------------------------------------------------------------------------
# Hand-written attention models
# --------------------------------------------------------------------------------------------


class MHABlock(nn.Module):
    """Pre-LN transformer block: x + MHA(LN(x)), then x + MLP(LN(x)) with a ReLU MLP."""

    def __init__(self, dim: int, heads: int, hidden: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Linear(hidden, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.norm1(x)
        x = x + self.attn(y, y, y, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


def build_mha(large: bool, attn: str) -> Built:
    dim, heads, seq = (256, 8, 256) if large else (64, 4, 16)
    module = MHABlock(dim, heads, 4 * dim)
    return Built(
        module,
        {"input": _float_input(1, seq, dim)},
        ["output"],
        attention_blocks=1,
        mlp_blocks=1,
        config={"dim": dim, "heads": heads, "seq": seq, "mlp_hidden": 4 * dim},
    )


class LongAttention(nn.Module):
    """One attention block written out: Q/K/V Linear, MatMul, Mul(1/sqrt(d)), Softmax, MatMul."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.q, self.k, self.v = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.out = nn.Linear(dim, dim)
        self.scale = 1.0 / math.sqrt(self.head_dim)

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        return x.reshape(b, s, self.heads, self.head_dim).transpose(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self._split(self.q(x)), self._split(self.k(x)), self._split(self.v(x))
        scores = torch.matmul(q, k.transpose(-1, -2)) * self.scale
        probs = torch.softmax(scores, dim=-1)
        ctx = torch.matmul(probs, v).transpose(1, 2).reshape(b, s, d)
        return self.out(ctx)


def build_long_attention(large: bool, attn: str) -> Built:
    dim, heads, seq = (256, 2, 4096) if large else (128, 2, 1024)
    module = LongAttention(dim, heads)
    return Built(
        module,
        {"input": _float_input(1, seq, dim)},
        ["output"],
        attention_blocks=1,
        mlp_blocks=0,
        config={"dim": dim, "heads": heads, "head_dim": dim // heads, "seq": seq},
    )


# --------------------------------------------------------------------------------------------
# transformers models (built from config objects with seeded random weights; no hub calls)
# --------------------------------------------------------------------------------------------


class TokenWrapper(nn.Module):
    """Calls a transformers model with (input_ids, attention_mask) and returns one tensor."""

    def __init__(self, model: nn.Module, output: str) -> None:
        super().__init__()
        self.model, self.output = model, output

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, return_dict=True)
        return out[self.output]


class PixelWrapper(nn.Module):
    def __init__(self, model: nn.Module, output: str) -> None:
        super().__init__()
        self.model, self.output = model, output

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.model(pixel_values=pixel_values, return_dict=True)[self.output]


def _hf_config_dict(config) -> dict[str, object]:
    keep = (
        "model_type",
        "vocab_size",
        "hidden_size",
        "n_embd",
        "d_model",
        "num_hidden_layers",
        "n_layer",
        "num_layers",
        "num_attention_heads",
        "n_head",
        "num_heads",
        "num_key_value_heads",
        "intermediate_size",
        "d_ff",
        "d_kv",
        "hidden_act",
        "activation_function",
        "feed_forward_proj",
        "image_size",
        "patch_size",
        "relative_attention_num_buckets",
        "relative_attention_max_distance",
        "max_position_embeddings",
        "n_positions",
        "rms_norm_eps",
    )
    out = {key: getattr(config, key) for key in keep if hasattr(config, key)}
    out["attn_implementation"] = config._attn_implementation
    return out


def build_bert(large: bool, attn: str) -> Built:
    from transformers import BertConfig, BertModel

    hidden, layers, heads, seq, vocab = (256, 4, 4, 128, 8000) if large else (64, 2, 4, 16, 1000)
    config = BertConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=4 * hidden,
        max_position_embeddings=max(64, seq),
        hidden_act="gelu",
        attn_implementation=attn,
    )
    model = BertModel(config, add_pooling_layer=False)
    return Built(
        TokenWrapper(model, "last_hidden_state"),
        _token_inputs(vocab, seq),
        ["last_hidden_state"],
        attention_blocks=layers,
        mlp_blocks=layers,
        config={**_hf_config_dict(config), "seq": seq},
    )


def build_gpt2(large: bool, attn: str) -> Built:
    from transformers import GPT2Config, GPT2LMHeadModel

    hidden, layers, heads, seq, vocab = (256, 4, 4, 128, 8000) if large else (64, 2, 4, 16, 1000)
    config = GPT2Config(
        vocab_size=vocab,
        n_positions=max(64, seq),
        n_embd=hidden,
        n_layer=layers,
        n_head=heads,
        activation_function="gelu_new",
        bos_token_id=vocab - 1,
        eos_token_id=vocab - 1,
        use_cache=False,
        attn_implementation=attn,
    )
    model = GPT2LMHeadModel(config)  # LM head tied to the token embedding
    return Built(
        TokenWrapper(model, "logits"),
        _token_inputs(vocab, seq),
        ["logits"],
        attention_blocks=layers,
        mlp_blocks=layers,
        config={**_hf_config_dict(config), "seq": seq},
    )


def build_vit(large: bool, attn: str) -> Built:
    from transformers import ViTConfig, ViTForImageClassification

    if large:  # ViT-Tiny/16 at 224
        hidden, layers, heads, image, patch, classes = 192, 12, 3, 224, 16, 1000
    else:
        hidden, layers, heads, image, patch, classes = 64, 2, 4, 32, 8, 10
    config = ViTConfig(
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=4 * hidden,
        image_size=image,
        patch_size=patch,
        num_channels=3,
        num_labels=classes,
        attn_implementation=attn,
    )
    model = ViTForImageClassification(config)
    return Built(
        PixelWrapper(model, "logits"),
        {"input": _float_input(1, 3, image, image)},
        ["logits"],
        attention_blocks=layers,
        mlp_blocks=layers,
        config={**_hf_config_dict(config), "tokens": (image // patch) ** 2 + 1},
    )


def build_llama(large: bool, attn: str) -> Built:
    from transformers import LlamaConfig, LlamaForCausalLM

    if large:
        hidden, layers, heads, kv, inter, seq, vocab = 256, 4, 8, 2, 688, 128, 8000
    else:
        hidden, layers, heads, kv, inter, seq, vocab = 64, 2, 4, 2, 128, 16, 1000
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        max_position_embeddings=max(64, seq),
        hidden_act="silu",
        tie_word_embeddings=False,
        use_cache=False,
        attn_implementation=attn,
    )
    model = LlamaForCausalLM(config)
    return Built(
        TokenWrapper(model, "logits"),
        _token_inputs(vocab, seq),
        ["logits"],
        attention_blocks=layers,
        mlp_blocks=layers,
        config={**_hf_config_dict(config), "seq": seq},
    )


def build_t5(large: bool, attn: str) -> Built:
    from transformers import T5Config, T5EncoderModel

    if large:
        d_model, layers, heads, d_kv, d_ff, seq, vocab = 256, 4, 8, 32, 1024, 512, 8000
    else:
        # seq 128, not 16: at seq <= 90 the exporter's constant folding (inputs of at most 8192
        # elements) turns the whole relative-position-bias computation into one constant.
        d_model, layers, heads, d_kv, d_ff, seq, vocab = 64, 2, 4, 16, 128, 128, 1000
    config = T5Config(
        vocab_size=vocab,
        d_model=d_model,
        d_kv=d_kv,
        d_ff=d_ff,
        num_layers=layers,
        num_heads=heads,
        relative_attention_num_buckets=32,
        relative_attention_max_distance=128,
        feed_forward_proj="relu",
        is_encoder_decoder=False,
        use_cache=False,
        attn_implementation=attn,
    )
    model = T5EncoderModel(config)
    return Built(
        TokenWrapper(model, "last_hidden_state"),
        _token_inputs(vocab, seq),
        ["last_hidden_state"],
        attention_blocks=layers,
        mlp_blocks=layers,
        config={**_hf_config_dict(config), "seq": seq},
    )


class FeatureWrapper(nn.Module):
    def __init__(self, model: nn.Module, output: str) -> None:
        super().__init__()
        self.model, self.output = model, output

    def forward(self, input_features: torch.Tensor) -> torch.Tensor:
        return self.model(input_features=input_features, return_dict=True)[self.output]


def build_whisper_encoder(large: bool, attn: str) -> Built:
    from transformers import WhisperConfig
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    d_model, layers, heads, mels, frames = (256, 4, 4, 80, 1500) if large else (64, 2, 4, 16, 32)
    config = WhisperConfig(
        d_model=d_model,
        encoder_layers=layers,
        encoder_attention_heads=heads,
        encoder_ffn_dim=4 * d_model,
        decoder_layers=1,
        decoder_attention_heads=heads,
        decoder_ffn_dim=4 * d_model,
        num_mel_bins=mels,
        max_source_positions=frames,
        vocab_size=100,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        decoder_start_token_id=1,
        attn_implementation=attn,
    )
    model = WhisperEncoder(config)
    return Built(
        FeatureWrapper(model, "last_hidden_state"),
        {"input_features": _float_input(1, mels, 2 * frames)},
        ["last_hidden_state"],
        attention_blocks=layers,
        mlp_blocks=layers,
        config={**_hf_config_dict(config), "frames": frames},
    )


ZOO: dict[str, ZooEntry] = {
    entry.name: entry
    for entry in [
        ZooEntry(
            "resnet18",
            "ResNet-18 layout: 7x7 stem, MaxPool, 8 BasicBlocks with BatchNorm, GAP, FC",
            build_resnet18,
        ),
        ZooEntry(
            "mobilenetv3",
            "MobileNetV3-Small style: hard-swish, depthwise convs, SE with hard-sigmoid",
            build_mobilenetv3,
        ),
        ZooEntry(
            "unet",
            "3-level UNet: ConvTranspose2d ups, skip Concat, one bilinear Upsample (Resize)",
            build_unet,
        ),
        ZooEntry(
            "speech_conv1d",
            "wav2vec2-style Conv1d stack (stride 320), LayerNorm over channels, GELU",
            build_speech,
        ),
        ZooEntry(
            "bert",
            "transformers BertModel encoder with attention_mask",
            build_bert,
            uses_transformers=True,
        ),
        ZooEntry(
            "gpt2",
            "transformers GPT2LMHeadModel, causal mask, gelu_new",
            build_gpt2,
            uses_transformers=True,
        ),
        ZooEntry(
            "vit",
            "transformers ViTForImageClassification, image 32, patch 8",
            build_vit,
            uses_transformers=True,
        ),
        ZooEntry(
            "llama",
            "transformers LlamaForCausalLM: RMSNorm, SwiGLU, RoPE, GQA (4 q / 2 kv heads)",
            build_llama,
            uses_transformers=True,
        ),
        ZooEntry(
            "mha",
            "pre-LN block with nn.MultiheadAttention(batch_first=True) and a ReLU MLP",
            build_mha,
        ),
        ZooEntry(
            "t5_encoder",
            "transformers T5EncoderModel: relative position bias, RMS-style T5LayerNorm, ReLU FFN",
            build_t5,
            uses_transformers=True,
        ),
        ZooEntry(
            "whisper_encoder",
            "transformers WhisperEncoder: Conv1d stem (strides 1, 2), 32 frames, GELU MLP",
            build_whisper_encoder,
            uses_transformers=True,
        ),
        ZooEntry(
            "long_attention",
            "one hand-written attention block, seq 1024, 2 heads of dim 64, no mask",
            build_long_attention,
        ),
    ]
}


# --------------------------------------------------------------------------------------------
# Export and checks
# --------------------------------------------------------------------------------------------


def build(name: str, large: bool = False, attn_implementation: str = "eager") -> Built:
    """Build zoo model ``name`` in eval mode with ``torch.manual_seed(SEED)`` weights."""
    entry = ZOO[name]
    torch.manual_seed(SEED)
    built = entry.builder(large, attn_implementation)
    built.module.eval()
    return built


@contextlib.contextmanager
def _without_batchnorm_fusion() -> Iterator[bool]:
    """Drop onnxscript's fuse-BatchNorm-into-Conv/Gemm rules from the exporter's optimizer.

    ``torch.onnx.export(..., dynamo=True)`` runs ``onnxscript.optimizer.optimize``, whose
    default rewrite rules include ``_fuse_batchnorm`` (BatchNormalization folded into the
    preceding Conv, ConvTranspose or Gemm). The zoo keeps BatchNormalization in the graph, so
    for the export only those three rules are removed; every other optimization (constant
    folding, the remaining rewrite rules, CSE) runs as usual. Yields whether the rules were
    found and removed (False if onnxscript changed its private layout).
    """
    try:
        from onnxscript import rewriter
        from onnxscript.rewriter.rules.common import _fuse_batchnorm
    except ImportError:
        yield False
        return
    original = getattr(rewriter, "_DEFAULT_REWRITE_RULES", None)
    fusion = set(_fuse_batchnorm.rules)
    if original is None or not fusion & set(original):
        yield False
        return
    rewriter._DEFAULT_REWRITE_RULES = tuple(r for r in original if r not in fusion)
    try:
        yield True
    finally:
        rewriter._DEFAULT_REWRITE_RULES = original


def _export(built: Built, opset: int = OPSET) -> tuple[onnx.ModelProto, str]:
    """Export with dynamo, falling back to the legacy exporter; returns (model, exporter).

    Models with BatchNorm are exported with the BatchNorm fusion rules switched off (see
    ``_without_batchnorm_fusion``); the exporter string then says so.
    """
    args = tuple(built.inputs.values())
    common = {
        "input_names": list(built.inputs),
        "output_names": built.output_names,
        "opset_version": opset,
    }
    try:
        with warnings.catch_warnings(), contextlib.ExitStack() as stack:
            warnings.simplefilter("ignore")
            suffix = ""
            if built.batchnorms and stack.enter_context(_without_batchnorm_fusion()):
                suffix = " (optimizer without fuse_batchnorm)"
            program = torch.onnx.export(built.module, args, dynamo=True, verbose=False, **common)
        if program is None:
            raise RuntimeError("dynamo exporter returned no program")
        return program.model_proto, "dynamo" + suffix
    except Exception as exc:  # any dynamo failure triggers the fallback
        reason = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
        buffer = io.BytesIO()
        legacy = dict(common)
        how = ""
        if built.batchnorms:
            # In EVAL mode the legacy exporter folds BatchNorm into Conv; PRESERVE keeps it (the
            # module is in eval mode, so the nodes get training_mode=0).
            legacy["training"] = torch.onnx.TrainingMode.PRESERVE
            how = "training=PRESERVE; "
        torch.onnx.export(built.module, args, buffer, dynamo=False, **legacy)
        return onnx.load_from_string(buffer.getvalue()), f"legacy ({how}dynamo failed: {reason})"


def _set_metadata(proto: onnx.ModelProto, entries: dict[str, str]) -> None:
    kept = [p for p in proto.metadata_props if not p.key.startswith(META_PREFIX)]
    del proto.metadata_props[:]
    proto.metadata_props.extend(kept)
    for key, value in entries.items():
        proto.metadata_props.add(key=META_PREFIX + key, value=value)


def _write_atomic(data: bytes, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.chmod(temporary, 0o644)
        with os.fdopen(handle, "wb") as stream:
            stream.write(data)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def op_counts(proto: onnx.ModelProto) -> collections.Counter:
    """Op-type counts over the main graph, subgraphs and local functions (domain-qualified)."""
    counts: collections.Counter = collections.Counter()

    def visit(nodes: Iterable[onnx.NodeProto]) -> None:
        for node in nodes:
            key = (
                node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"
            )
            counts[key] += 1
            for attribute in node.attribute:
                if attribute.type == onnx.AttributeProto.GRAPH:
                    visit(attribute.g.node)
                for graph in attribute.graphs:
                    visit(graph.node)

    visit(proto.graph.node)
    for function in proto.functions:
        visit(function.node)
    return counts


@dataclass
class Result:
    name: str
    path: Path
    exporter: str
    size: int
    counts: collections.Counter
    max_abs_error: float
    attention_blocks: int
    mlp_blocks: int
    inputs: list[tuple[str, str, list[int]]]
    outputs: list[tuple[str, str, list[int]]]
    notes: list[str]
    ok: bool
    opset: int = OPSET


def _value_infos(values) -> list[tuple[str, str, list[int]]]:
    out = []
    for value in values:
        tensor_type = value.type.tensor_type
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor_type.elem_type).name
        dims = [
            d.dim_value if d.HasField("dim_value") else d.dim_param for d in tensor_type.shape.dim
        ]
        out.append((value.name, dtype, dims))
    return out


def variant_path(name: str, opset: int, attn_implementation: str) -> Path:
    """Where a transformers model exported at another opset or attention goes (committed)."""
    return VARIANTS_DIR / f"{name}_op{opset}_{attn_implementation}.onnx"


def strip_for_commit(proto: onnx.ModelProto) -> None:
    """Drop doc strings and every metadata_props entry (model, graph, nodes): a committed
    variant carries only the graph; zoo.py records how it was made."""
    proto.doc_string = ""
    del proto.metadata_props[:]

    def visit(graph: onnx.GraphProto) -> None:
        graph.doc_string = ""
        del graph.metadata_props[:]
        for node in graph.node:
            node.doc_string = ""
            del node.metadata_props[:]
            for attribute in node.attribute:
                if attribute.type == onnx.AttributeProto.GRAPH:
                    visit(attribute.g)
                for sub in attribute.graphs:
                    visit(sub)

    visit(proto.graph)
    for function in proto.functions:
        function.doc_string = ""
        for node in function.node:
            node.doc_string = ""
            del node.metadata_props[:]


def export_model(
    name: str,
    large: bool = False,
    attn_implementation: str = "eager",
    path: Path | None = None,
    opset: int = OPSET,
    variant: bool = False,
) -> Result:
    """Build, export, save and check one zoo model; returns what was measured.

    `variant`: an HF variant at `opset` with `attn_implementation`, written stripped (no doc
    strings, no metadata_props) to models/hf/<name>_op<opset>_<attn>.onnx."""
    built = build(name, large, attn_implementation)
    if path is None and variant:
        path = variant_path(name, opset, attn_implementation)
    if path is None:
        if large:
            path = CACHE_DIR / f"{name}_large.onnx"
        elif attn_implementation != "eager":
            path = CACHE_DIR / f"{name}_{attn_implementation}.onnx"
        else:
            path = MODELS_DIR / f"{name}.onnx"
    with torch.no_grad():
        expected = built.module(*built.inputs.values()).numpy()

    proto, exporter = _export(built, opset)
    meta = {
        "name": name,
        "size": "large" if large else "small",
        "exporter": exporter.split(" ")[0],
        "exporter_detail": exporter,
        "opset": str(opset),
        "seed": str(SEED),
        "attention_blocks": str(built.attention_blocks),
        "mlp_blocks": str(built.mlp_blocks),
        "config": json.dumps(built.config, sort_keys=True),
        "torch_version": torch.__version__,
    }
    if ZOO[name].uses_transformers:
        import transformers

        meta["transformers_version"] = transformers.__version__
    _set_metadata(proto, meta)
    strip_exporter_metadata(proto)  # node metadata: the exporter's stack traces and scopes
    proto.doc_string = f"onnx2bir model zoo: {name} ({ZOO[name].summary}); {exporter}"
    if variant:
        strip_for_commit(proto)

    notes: list[str] = []
    ok = True
    if any(t.data_location == onnx.TensorProto.EXTERNAL for t in proto.graph.initializer):
        notes.append("FAIL: external data")
        ok = False
    data = proto.SerializeToString()
    onnx.checker.check_model(proto, full_check=True)
    _write_atomic(data, path)
    size = len(data)
    if not large and attn_implementation == "eager" and size > MAX_SMALL_BYTES:
        notes.append(f"FAIL: {size} bytes > {MAX_SMALL_BYTES}")
        ok = False
    if variant and size > MAX_VARIANT_BYTES:
        notes.append(f"FAIL: {size} bytes > {MAX_VARIANT_BYTES} for a committed variant")
        ok = False

    counts = op_counts(proto)
    if built.batchnorms and counts.get("BatchNormalization", 0) != built.batchnorms:
        notes.append(
            f"BatchNorm: {built.batchnorms} modules but "
            f"{counts.get('BatchNormalization', 0)} BatchNormalization nodes (folded?)"
        )
    if proto.functions:
        notes.append("local functions: " + ", ".join(f.name for f in proto.functions))
    odd_domains = sorted({k.rsplit(".", 1)[0] for k in counts if "." in k})
    if odd_domains:
        notes.append("non-standard domains: " + ", ".join(odd_domains))

    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    names_in = [i.name for i in session.get_inputs()]
    if names_in != list(built.inputs):
        notes.append(f"FAIL: graph inputs {names_in}, expected {list(built.inputs)}")
        ok = False
    feed = {key: value.numpy() for key, value in built.inputs.items()}
    (actual,) = session.run(None, feed)
    if actual.shape != expected.shape:
        notes.append(f"FAIL: shape {actual.shape} vs torch {expected.shape}")
        ok = False
        max_abs = float("inf")
    else:
        max_abs = float(np.max(np.abs(actual.astype(np.float64) - expected)))
    if not max_abs <= TOLERANCE:
        notes.append(f"FAIL: max |ort - torch| = {max_abs:.3g} > {TOLERANCE:g}")
        ok = False
    if not np.all(np.isfinite(actual)) or float(np.std(actual)) == 0.0:
        notes.append("FAIL: output not finite or constant")
        ok = False

    return Result(
        name=name,
        path=path,
        exporter=exporter,
        size=size,
        counts=counts,
        max_abs_error=max_abs,
        attention_blocks=built.attention_blocks,
        mlp_blocks=built.mlp_blocks,
        inputs=_value_infos(proto.graph.input),
        outputs=_value_infos(proto.graph.output),
        notes=notes,
        ok=ok,
        opset=opset,
    )


def _format_counts(counts: collections.Counter) -> str:
    return ", ".join(f"{op}={n}" for op, n in sorted(counts.items()))


def _print_result(result: Result, seconds: float) -> None:
    print(f"== {result.name}  ({seconds:.1f} s)")
    print(f"   file: {result.path} ({result.size} bytes = {result.size / 1024:.1f} KiB)")
    print(f"   exporter: {result.exporter}, opset {result.opset}")
    for kind, values in (("inputs", result.inputs), ("outputs", result.outputs)):
        text = ", ".join(f"{n} {d}{dims}" for n, d, dims in values)
        print(f"   {kind}: {text}")
    print(f"   ops ({sum(result.counts.values())} nodes): {_format_counts(result.counts)}")
    notable = sorted(op for op in result.counts if op in NOTABLE_OPS or "." in op)
    if notable:
        print("   notable: " + ", ".join(f"{op}={result.counts[op]}" for op in notable))
    print(f"   blocks by construction: attention={result.attention_blocks} mlp={result.mlp_blocks}")
    print(f"   onnxruntime vs torch: max |diff| = {result.max_abs_error:.3g}")
    for note in result.notes:
        print(f"   note: {note}")
    print(f"   check: {'OK' if result.ok else 'FAILED'}")


def _print_table(results: list[Result]) -> None:
    header = ("name", "exporter", "opset", "KiB", "nodes", "attn", "mlp", "max|diff|", "ok")
    rows = [
        (
            r.name,
            r.exporter.split(" ")[0],
            str(r.opset),
            f"{r.size / 1024:.1f}",
            str(sum(r.counts.values())),
            str(r.attention_blocks),
            str(r.mlp_blocks),
            f"{r.max_abs_error:.2g}",
            "OK" if r.ok else "FAIL",
        )
        for r in results
    ]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    for row in [header, tuple("-" * w for w in widths), *rows]:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)))
    total = sum(r.size for r in results)
    print(f"total size: {total} bytes ({total / 1024 / 1024:.2f} MiB)")


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="zoo model names (default: all; see --list)")
    parser.add_argument(
        "--large", action="store_true", help="bigger configs into models/.cache/<name>_large.onnx"
    )
    parser.add_argument(
        "--sdpa",
        action="store_true",
        help='transformers models with attn_implementation="sdpa" into models/.cache/',
    )
    parser.add_argument(
        "--variants",
        action="store_true",
        help="the transformers models at opset 20 (eager, sdpa) and 23 (sdpa) into models/hf/",
    )
    parser.add_argument("--opset", type=int, help="with --variants: only this opset (20 or 23)")
    parser.add_argument(
        "--attn", choices=("eager", "sdpa"), help="with --variants: only this attention"
    )
    parser.add_argument("--list", action="store_true", help="print the model names and exit")
    args = parser.parse_args(list(argv) if argv is not None else None)

    if args.list:
        for entry in ZOO.values():
            print(f"{entry.name:16s} {entry.summary}")
        return 0
    unknown = [n for n in args.names if n not in ZOO]
    if unknown:
        parser.error(f"unknown model(s) {unknown}; known: {', '.join(ZOO)}")
    names = args.names or list(ZOO)
    attn = "eager"
    if args.sdpa:
        attn = "sdpa"
        names = [n for n in names if ZOO[n].uses_transformers]

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    # "torchvision is not installed" registration warnings and onnxscript constant-folding
    # chatter ("Evaluation failed: cannot reshape ...", seen on BERT) are not ours to fix.
    for logger in ("torch.onnx", "onnxscript.optimizer"):
        logging.getLogger(logger).setLevel(logging.ERROR)
    results = []
    jobs = [(name, attn, OPSET, False) for name in names]
    if args.variants:
        jobs = [
            (name, impl, opset, True)
            for name in (args.names or HF_VARIANTS)
            for opset, impl in VARIANT_SETS
            if (args.opset in (None, opset)) and (args.attn in (None, impl))
        ]
    for name, impl, opset, variant in jobs:
        start = time.perf_counter()
        result = export_model(
            name, large=args.large, attn_implementation=impl, opset=opset, variant=variant
        )
        _print_result(result, time.perf_counter() - start)
        results.append(result)
    print()
    _print_table(results)
    failed = [r.name for r in results if not r.ok]
    print("checks: " + ("OK" if not failed else f"FAILED ({', '.join(failed)})"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
