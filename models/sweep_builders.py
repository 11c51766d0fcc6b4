"""Builders for models/sweep.py: each returns a function that makes (module, example inputs)
with random weights and a tiny configuration, for torchvision, timm, transformers and torch.

Imports of torch and the model libraries happen inside the builders, so that listing the
architectures needs none of them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Arch:
    name: str
    source: str  # torchvision, timm, transformers, torch
    family: str  # cnn, vit, mlp-mixer, rnn, text-encoder, text-decoder, seq2seq, speech, video
    build: Callable[[], tuple[object, tuple]]


def _image(size: int = 64, channels: int = 3, batch: int = 1):
    import torch

    return (torch.randn(batch, channels, size, size),)


def _tv(name: str, size: int = 64, **kwargs) -> Callable:
    def build():
        import torchvision

        model = getattr(torchvision.models, name)(weights=None, num_classes=10, **kwargs)
        return model, _image(size)

    return build


def _tv_video(name: str) -> Callable:
    def build():
        import torch
        import torchvision

        model = getattr(torchvision.models.video, name)(weights=None, num_classes=10)
        return model, (torch.randn(1, 3, 4, 32, 32),)

    return build


def _tv_segmentation(name: str, size: int = 64, **kwargs) -> Callable:
    """A torchvision segmentation model; its dict output ({"out": logits}) becomes the one
    logits tensor the exporters take."""

    def build():
        import torch
        import torchvision

        class Logits(torch.nn.Module):
            def __init__(self, model):
                super().__init__()
                self.model = model

            def forward(self, image):
                return self.model(image)["out"]

        model = getattr(torchvision.models.segmentation, name)(
            weights=None, weights_backbone=None, num_classes=10, **kwargs
        )
        return Logits(model), _image(size)

    return build


def _timm(name: str, size: int = 64, **kwargs) -> Callable:
    def build():
        import timm

        model = timm.create_model(name, pretrained=False, num_classes=10, **kwargs)
        return model, _image(kwargs.get("img_size", size))

    return build


def _hf_text(model_cls: str, config_cls: str, seq: int = 16, **config) -> Callable:
    def build():
        import torch
        import transformers

        cfg = getattr(transformers, config_cls)(**config)
        model = getattr(transformers, model_cls)(cfg)
        vocab = getattr(cfg, "vocab_size", 100)
        ids = torch.randint(0, vocab, (1, seq))
        return _Ids(model), (ids,)

    return build


def _hf_seq2seq(model_cls: str, config_cls: str, seq: int = 12, **config) -> Callable:
    def build():
        import torch
        import transformers

        cfg = getattr(transformers, config_cls)(**config)
        model = getattr(transformers, model_cls)(cfg)
        ids = torch.randint(0, cfg.vocab_size, (1, seq))
        dec = torch.randint(0, cfg.vocab_size, (1, seq // 2))
        return _Seq2Seq(model), (ids, dec)

    return build


def _hf_pixels(model_cls: str, config_cls: str, size: int = 32, **config) -> Callable:
    def build():
        import torch
        import transformers

        cfg = getattr(transformers, config_cls)(**config)
        model = getattr(transformers, model_cls)(cfg)
        channels = getattr(cfg, "num_channels", 3)
        return _Pixels(model), (torch.randn(1, channels, size, size),)

    return build


def _hf_audio(model_cls: str, config_cls: str, samples: int = 1600, **config) -> Callable:
    def build():
        import torch
        import transformers

        cfg = getattr(transformers, config_cls)(**config)
        model = getattr(transformers, model_cls)(cfg)
        return _Audio(model), (torch.randn(1, samples),)

    return build


def _hf_features(model_cls: str, config_cls: str, frames: int = 32, **config) -> Callable:
    """Speech models that read log-mel features [1, mel, frames] (Whisper's encoder)."""

    def build():
        import torch
        import transformers
        from transformers.models.whisper import modeling_whisper

        cfg = getattr(transformers, config_cls)(**config)
        model = getattr(modeling_whisper, model_cls)(cfg)
        return _Features(model), (torch.randn(1, cfg.num_mel_bins, frames),)

    return build


def _hf_tensor(model_cls: str, config_cls: str, keyword: str, shape: tuple, **config) -> Callable:
    """A transformers model fed one random tensor of `shape` as its argument `keyword`
    (spectrogram frames, a multichannel series, video frames)."""
    return _hf_inputs(model_cls, config_cls, {keyword: shape}, **config)


def _hf_inputs(model_cls: str, config_cls: str, inputs: dict, **config) -> Callable:
    """A transformers model fed one tensor per keyword of `inputs`: a shape gives standard
    normal values, ("ids", shape, high) integers in [0, high)."""

    def build():
        import torch
        import transformers

        cfg = getattr(transformers, config_cls)(**config)
        model = getattr(transformers, model_cls)(cfg)
        values = []
        for spec in inputs.values():
            if spec[0] == "ids":
                _, shape, high = spec
                values.append(torch.randint(0, high, shape))
            else:
                values.append(torch.randn(*spec))
        return _Keyword(model, tuple(inputs)), tuple(values)

    return build


def _diffusers_unet() -> Callable:
    """A two-level Stable-Diffusion-style UNet (diffusers' UNet2DConditionModel): a latent
    [1, 4, 16, 16], a timestep and 8 text-encoder states to cross-attend to."""

    def build():
        import diffusers
        import torch

        class Denoiser(torch.nn.Module):
            def __init__(self, unet):
                super().__init__()
                self.unet = unet

            def forward(self, latent, timestep, text):
                return self.unet(latent, timestep, encoder_hidden_states=text).sample

        unet = diffusers.UNet2DConditionModel(
            sample_size=16,
            in_channels=4,
            out_channels=4,
            layers_per_block=1,
            block_out_channels=(32, 64),
            down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
            up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
            cross_attention_dim=32,
            attention_head_dim=8,
            norm_num_groups=8,
        )
        inputs = (torch.randn(1, 4, 16, 16), torch.tensor([10.0]), torch.randn(1, 8, 32))
        return Denoiser(unet), inputs

    return build


def _wrappers():
    import torch

    class Ids(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, ids):
            out = (
                self.model(input_ids=ids, use_cache=False)
                if _takes_cache(self.model)
                else (self.model(input_ids=ids))
            )
            return out[0]

    class Seq2Seq(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, ids, dec):
            return self.model(input_ids=ids, decoder_input_ids=dec, use_cache=False)[0]

    class Pixels(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, pixels):
            return self.model(pixel_values=pixels)[0]

    class Audio(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, audio):
            return self.model(input_values=audio)[0]

    class Features(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, features):
            return self.model(input_features=features)[0]

    class Keyword(torch.nn.Module):
        def __init__(self, model, keywords: tuple[str, ...]):
            super().__init__()
            self.model = model
            self.keywords = keywords

        def forward(self, *values):
            return self.model(**dict(zip(self.keywords, values, strict=True)))[0]

    return Ids, Seq2Seq, Pixels, Audio, Features, Keyword


def _takes_cache(model) -> bool:
    import inspect

    return "use_cache" in inspect.signature(model.forward).parameters


def _Ids(model):  # noqa: N802 - wrapper factories named after the classes they build
    return _wrappers()[0](model)


def _Seq2Seq(model):  # noqa: N802
    return _wrappers()[1](model)


def _Pixels(model):  # noqa: N802
    return _wrappers()[2](model)


def _Audio(model):  # noqa: N802
    return _wrappers()[3](model)


def _Features(model):  # noqa: N802
    return _wrappers()[4](model)


def _Keyword(model, keywords: tuple[str, ...]):  # noqa: N802
    return _wrappers()[5](model, keywords)


def _torch_rnn(kind: str, layers: int = 1, bidirectional: bool = False) -> Callable:
    def build():
        import torch

        class Tagger(torch.nn.Module):
            def __init__(self):
                super().__init__()
                cls = getattr(torch.nn, kind)
                self.rnn = cls(
                    16, 24, num_layers=layers, batch_first=True, bidirectional=bidirectional
                )
                self.head = torch.nn.Linear(24 * (2 if bidirectional else 1), 5)

            def forward(self, x):
                return self.head(self.rnn(x)[0])

        return Tagger(), (torch.randn(1, 10, 16),)

    return build


_TEXT = dict(
    vocab_size=100,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    max_position_embeddings=64,
)
_DECODER = dict(
    vocab_size=100,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    max_position_embeddings=64,
    num_key_value_heads=2,
)
_VIT = dict(
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    image_size=32,
    patch_size=8,
)
