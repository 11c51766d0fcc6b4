"""The architectures of the sweep (models/sweep.py): name, source, family and builder.

Names start with their source: tv_ (torchvision), timm_, hf_ (transformers), torch_,
diffusers_.
"""

from __future__ import annotations

from sweep_builders import (
    _DECODER,
    _TEXT,
    _VIT,
    Arch,
    _diffusers_unet,
    _hf_audio,
    _hf_features,
    _hf_inputs,
    _hf_pixels,
    _hf_seq2seq,
    _hf_tensor,
    _hf_text,
    _timm,
    _torch_rnn,
    _tv,
    _tv_segmentation,
    _tv_video,
)


def _archs() -> list[Arch]:
    tv = [
        ("resnet18", {}),
        ("resnet34", {}),
        ("resnet50", {}),
        ("resnext50_32x4d", {}),
        ("wide_resnet50_2", {}),
        ("mobilenet_v2", {}),
        ("mobilenet_v3_small", {}),
        ("mobilenet_v3_large", {}),
        ("efficientnet_b0", {}),
        ("efficientnet_v2_s", {}),
        ("regnet_x_400mf", {}),
        ("regnet_y_400mf", {}),
        ("shufflenet_v2_x0_5", {}),
        ("squeezenet1_0", {}),
        ("squeezenet1_1", {}),
        ("densenet121", {}),
        ("mnasnet0_5", {}),
        ("alexnet", {}),
        ("vgg11", {}),
        ("vgg11_bn", {}),
        ("convnext_tiny", {}),
        ("googlenet", {"aux_logits": False, "init_weights": True}),
    ]
    archs = [Arch(f"tv_{n}", "torchvision", "cnn", _tv(n, **kw)) for n, kw in tv]
    archs += [
        Arch(
            "tv_inception_v3",
            "torchvision",
            "cnn",
            _tv("inception_v3", 96, aux_logits=False, init_weights=True),
        ),
        Arch("tv_vit_b_32", "torchvision", "vit", _tv("vit_b_32", 64, image_size=64)),
        Arch("tv_swin_t", "torchvision", "vit", _tv("swin_t", 64)),
        Arch("tv_maxvit_t", "torchvision", "vit", _tv("maxvit_t", 224)),  # 7x7 windows at stride 32
    ]
    archs += [
        Arch(f"tv_{n}", "torchvision", "video", _tv_video(n))
        for n in ("r3d_18", "mc3_18", "r2plus1d_18")
    ]
    timm_cnn = [
        "resnet10t",
        "resnet18d",
        "seresnext26d_32x4d",
        "res2net50_14w_8s",
        "dla34",
        "cspresnet50",
        "rexnet_100",
        "ghostnet_100",
        "lcnet_050",
        "mobilenetv3_small_050",
        "tinynet_e",
        "efficientnet_b0",
        "mixnet_s",
        "regnetx_002",
        "regnety_002",
        "densenet121",
        "dpn68",
        "vovnet39a",
        "selecsls42b",
        "repvgg_a0",
        "mobileone_s0",
        "hrnet_w18_small",
        "convnext_atto",
        "convnext_nano",
        "edgenext_xx_small",
        "poolformer_s12",
        "fastvit_t8",
        "inception_next_tiny",
        "mobilevitv2_050",
        "hgnetv2_b0",
        "ese_vovnet19b_dw",
        "gernet_s",
        "resnest14d",
        "nf_resnet26",
        "darknet17",
        "cspdarknet53",
    ]
    archs += [Arch(f"timm_{n}", "timm", "cnn", _timm(n)) for n in timm_cnn]
    timm_vit = [
        ("vit_tiny_patch16_224", {"img_size": 32}),
        ("deit_tiny_patch16_224", {"img_size": 32}),
        ("deit_tiny_distilled_patch16_224", {"img_size": 32}),
        ("cait_xxs24_224", {"img_size": 32}),
        ("xcit_nano_12_p16_224", {"img_size": 32}),
        ("pvt_v2_b0", {}),
        ("levit_128s", {"img_size": 64}),
        ("mobilevit_xxs", {}),
        ("coatnet_nano_rw_224", {"img_size": 64}),
        ("maxvit_nano_rw_256", {"img_size": 64}),
        ("swin_tiny_patch4_window7_224", {"img_size": 56}),
        ("efficientformer_l1", {"size": 224}),  # attention biases fixed for a 7x7 last stage
        ("beit_base_patch16_224", {"img_size": 32, "depth": 2}),
        ("eva02_tiny_patch14_224", {"img_size": 28}),
        ("vit_small_patch16_rope_224", {"img_size": 32}),
    ]
    archs += [Arch(f"timm_{n}", "timm", "vit", _timm(n, **kw)) for n, kw in timm_vit]
    timm_mixer = [
        ("mixer_s16_224", {"img_size": 32}),
        ("resmlp_12_224", {"img_size": 32}),
        ("gmlp_ti16_224", {"img_size": 32}),
        ("convmixer_768_32", {}),
    ]
    archs += [Arch(f"timm_{n}", "timm", "mlp-mixer", _timm(n, **kw)) for n, kw in timm_mixer]
    archs += [Arch("timm_sequencer2d_s", "timm", "rnn", _timm("sequencer2d_s", 64))]
    enc = [
        ("bert", "BertModel", "BertConfig", _TEXT),
        ("roberta", "RobertaModel", "RobertaConfig", {**_TEXT, "max_position_embeddings": 66}),
        (
            "distilbert",
            "DistilBertModel",
            "DistilBertConfig",
            dict(vocab_size=100, dim=32, n_layers=2, n_heads=4, hidden_dim=64),
        ),
        ("albert", "AlbertModel", "AlbertConfig", {**_TEXT, "embedding_size": 16}),
        ("electra", "ElectraModel", "ElectraConfig", {**_TEXT, "embedding_size": 16}),
        (
            "xlm_roberta",
            "XLMRobertaModel",
            "XLMRobertaConfig",
            {**_TEXT, "max_position_embeddings": 66},
        ),
        ("mpnet", "MPNetModel", "MPNetConfig", {**_TEXT, "max_position_embeddings": 66}),
        (
            "mobilebert",
            "MobileBertModel",
            "MobileBertConfig",
            {**_TEXT, "embedding_size": 16, "intra_bottleneck_size": 16, "true_hidden_size": 16},
        ),
        ("squeezebert", "SqueezeBertModel", "SqueezeBertConfig", {**_TEXT, "embedding_size": 32}),
        ("deberta_v2", "DebertaV2Model", "DebertaV2Config", _TEXT),
        (
            "camembert",
            "CamembertModel",
            "CamembertConfig",
            {**_TEXT, "max_position_embeddings": 66},
        ),
        ("ernie", "ErnieModel", "ErnieConfig", _TEXT),
        (
            "funnel",
            "FunnelBaseModel",
            "FunnelConfig",
            dict(vocab_size=100, d_model=32, n_head=4, d_head=8, d_inner=64, block_sizes=[1, 1]),
        ),
        (
            "clip_text",
            "CLIPTextModel",
            "CLIPTextConfig",
            dict(
                vocab_size=100,
                hidden_size=32,
                num_hidden_layers=2,
                num_attention_heads=4,
                intermediate_size=64,
                max_position_embeddings=32,
            ),
        ),
        (
            "t5_encoder",
            "T5EncoderModel",
            "T5Config",
            dict(vocab_size=100, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4),
        ),
    ]
    archs += [
        Arch(f"hf_{n}", "transformers", "text-encoder", _hf_text(m, c, **cfg))
        for n, m, c, cfg in enc
    ]
    dec = [
        (
            "gpt2",
            "GPT2Model",
            "GPT2Config",
            dict(vocab_size=100, n_embd=32, n_layer=2, n_head=4, n_positions=64),
        ),
        (
            "gpt_neo",
            "GPTNeoModel",
            "GPTNeoConfig",
            dict(
                vocab_size=100,
                hidden_size=32,
                num_layers=2,
                num_heads=4,
                attention_types=[[["global", "local"], 1]],
                max_position_embeddings=64,
            ),
        ),
        ("gpt_neox", "GPTNeoXModel", "GPTNeoXConfig", _TEXT),
        (
            "gptj",
            "GPTJModel",
            "GPTJConfig",
            dict(vocab_size=100, n_embd=32, n_layer=2, n_head=4, n_positions=64, rotary_dim=4),
        ),
        (
            "opt",
            "OPTModel",
            "OPTConfig",
            dict(
                vocab_size=100,
                hidden_size=32,
                num_hidden_layers=2,
                num_attention_heads=4,
                ffn_dim=64,
                max_position_embeddings=64,
                word_embed_proj_dim=32,
            ),
        ),
        (
            "bloom",
            "BloomModel",
            "BloomConfig",
            dict(vocab_size=100, hidden_size=32, n_layer=2, n_head=4),
        ),
        ("llama", "LlamaModel", "LlamaConfig", _DECODER),
        ("mistral", "MistralModel", "MistralConfig", _DECODER),
        ("qwen2", "Qwen2Model", "Qwen2Config", _DECODER),
        ("qwen3", "Qwen3Model", "Qwen3Config", {**_DECODER, "head_dim": 8}),
        ("phi", "PhiModel", "PhiConfig", _DECODER),
        ("phi3", "Phi3Model", "Phi3Config", {**_DECODER, "pad_token_id": 0}),
        ("gemma", "GemmaModel", "GemmaConfig", {**_DECODER, "head_dim": 8}),
        ("gemma2", "Gemma2Model", "Gemma2Config", {**_DECODER, "head_dim": 8}),
        ("stablelm", "StableLmModel", "StableLmConfig", _DECODER),
        (
            "falcon",
            "FalconModel",
            "FalconConfig",
            dict(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4),
        ),
        (
            "codegen",
            "CodeGenModel",
            "CodeGenConfig",
            dict(vocab_size=100, n_embd=32, n_layer=2, n_head=4, n_positions=64, rotary_dim=4),
        ),
        ("olmo", "OlmoModel", "OlmoConfig", _DECODER),
        ("granite", "GraniteModel", "GraniteConfig", _DECODER),
        ("starcoder2", "Starcoder2Model", "Starcoder2Config", _DECODER),
    ]
    archs += [
        Arch(f"hf_{n}", "transformers", "text-decoder", _hf_text(m, c, **cfg))
        for n, m, c, cfg in dec
    ]
    encoder_decoder = dict(  # one layer each side, also DETR's
        d_model=32,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
    )
    s2s = dict(vocab_size=100, **encoder_decoder, max_position_embeddings=64)
    archs += [
        Arch("hf_bart", "transformers", "seq2seq", _hf_seq2seq("BartModel", "BartConfig", **s2s)),
        Arch(
            "hf_mbart", "transformers", "seq2seq", _hf_seq2seq("MBartModel", "MBartConfig", **s2s)
        ),
        Arch(
            "hf_marian",
            "transformers",
            "seq2seq",
            _hf_seq2seq(
                "MarianModel", "MarianConfig", **s2s, pad_token_id=0, decoder_start_token_id=0
            ),
        ),
        Arch(
            "hf_pegasus",
            "transformers",
            "seq2seq",
            _hf_seq2seq("PegasusModel", "PegasusConfig", **s2s),
        ),
        Arch(
            "hf_t5",
            "transformers",
            "seq2seq",
            _hf_seq2seq(
                "T5Model",
                "T5Config",
                vocab_size=100,
                d_model=32,
                d_kv=8,
                d_ff=64,
                num_layers=1,
                num_heads=4,
            ),
        ),
    ]
    archs += [
        Arch("hf_vit", "transformers", "vit", _hf_pixels("ViTModel", "ViTConfig", **_VIT)),
        Arch("hf_deit", "transformers", "vit", _hf_pixels("DeiTModel", "DeiTConfig", **_VIT)),
        Arch("hf_beit", "transformers", "vit", _hf_pixels("BeitModel", "BeitConfig", **_VIT)),
        Arch("hf_dinov2", "transformers", "vit", _hf_pixels("Dinov2Model", "Dinov2Config", **_VIT)),
        Arch(
            "hf_clip_vision",
            "transformers",
            "vit",
            _hf_pixels("CLIPVisionModel", "CLIPVisionConfig", **_VIT),
        ),
        Arch(
            "hf_siglip_vision",
            "transformers",
            "vit",
            _hf_pixels("SiglipVisionModel", "SiglipVisionConfig", **_VIT),
        ),
        Arch(
            "hf_convnext",
            "transformers",
            "cnn",
            _hf_pixels(
                "ConvNextModel",
                "ConvNextConfig",
                64,
                hidden_sizes=[16, 32, 48, 64],
                depths=[1, 1, 1, 1],
            ),
        ),
        Arch(
            "hf_resnet",
            "transformers",
            "cnn",
            _hf_pixels(
                "ResNetModel",
                "ResNetConfig",
                64,
                hidden_sizes=[16, 32, 48, 64],
                depths=[1, 1, 1, 1],
                embedding_size=16,
            ),
        ),
        Arch(
            "hf_regnet",
            "transformers",
            "cnn",
            _hf_pixels(
                "RegNetModel",
                "RegNetConfig",
                64,
                hidden_sizes=[16, 32, 48, 64],
                depths=[1, 1, 1, 1],
                embedding_size=16,
                groups_width=8,
            ),
        ),
        Arch(
            "hf_segformer",
            "transformers",
            "vit",
            _hf_pixels(
                "SegformerModel",
                "SegformerConfig",
                64,
                hidden_sizes=[16, 32, 48, 64],
                depths=[1, 1, 1, 1],
                num_attention_heads=[1, 1, 2, 2],
                decoder_hidden_size=32,
            ),
        ),
        Arch(
            "hf_swin",
            "transformers",
            "vit",
            _hf_pixels(
                "SwinModel",
                "SwinConfig",
                32,
                embed_dim=16,
                depths=[1, 1],
                num_heads=[2, 2],
                window_size=4,
                patch_size=2,
            ),
        ),
        Arch(
            "hf_mobilevit",
            "transformers",
            "vit",
            _hf_pixels(
                "MobileViTModel",
                "MobileViTConfig",
                64,
                hidden_sizes=[16, 24, 32],
                neck_hidden_sizes=[8, 8, 16, 16, 24, 24, 32],
            ),
        ),
        Arch(
            "hf_poolformer",
            "transformers",
            "cnn",
            _hf_pixels(
                "PoolFormerModel",
                "PoolFormerConfig",
                64,
                hidden_sizes=[16, 32, 48, 64],
                depths=[1, 1, 1, 1],
            ),
        ),
    ]
    speech = dict(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        conv_dim=(16, 16),
        conv_stride=(5, 2),
        conv_kernel=(10, 3),
        num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=4,
    )
    archs += [
        Arch(
            "hf_wav2vec2",
            "transformers",
            "speech",
            _hf_audio("Wav2Vec2Model", "Wav2Vec2Config", **speech),
        ),
        Arch(
            "hf_hubert",
            "transformers",
            "speech",
            _hf_audio("HubertModel", "HubertConfig", **speech),
        ),
        Arch(
            "hf_wavlm", "transformers", "speech", _hf_audio("WavLMModel", "WavLMConfig", **speech)
        ),
        Arch(
            "hf_data2vec_audio",
            "transformers",
            "speech",
            _hf_audio("Data2VecAudioModel", "Data2VecAudioConfig", **speech),
        ),
        Arch(
            "hf_whisper_encoder",
            "transformers",
            "speech",
            _hf_features(
                "WhisperEncoder",
                "WhisperConfig",
                32,
                d_model=32,
                encoder_layers=2,
                encoder_attention_heads=4,
                encoder_ffn_dim=64,
                num_mel_bins=16,
                max_source_positions=16,
            ),
        ),
    ]
    archs += [
        Arch("torch_lstm", "torch", "rnn", _torch_rnn("LSTM")),
        Arch("torch_lstm_2layer_bidir", "torch", "rnn", _torch_rnn("LSTM", 2, True)),
        Arch("torch_gru", "torch", "rnn", _torch_rnn("GRU")),
        Arch("torch_rnn_tanh", "torch", "rnn", _torch_rnn("RNN")),
    ]
    # Appended last: an architecture's export opset follows its place in this list.
    archs += [
        Arch(f"tv_{name}", "torchvision", "segmentation", _tv_segmentation(name, **kwargs))
        for name, kwargs in (
            ("fcn_resnet50", {"aux_loss": False}),
            ("deeplabv3_mobilenet_v3_large", {"aux_loss": False}),
            ("lraspp_mobilenet_v3_large", {}),
        )
    ]
    archs += [
        Arch(
            "hf_yolos",
            "transformers",
            "detection",
            _hf_pixels(
                "YolosForObjectDetection",
                "YolosConfig",
                **{**_VIT, "image_size": [32, 32]},  # YOLOS takes a [height, width] pair
                num_detection_tokens=10,
            ),
        ),
        Arch(
            "hf_detr",
            "transformers",
            "detection",
            _hf_pixels(
                "DetrForObjectDetection",
                "DetrConfig",
                64,
                use_timm_backbone=False,
                use_pretrained_backbone=False,
                backbone_config={
                    "model_type": "resnet",
                    "embedding_size": 16,
                    "hidden_sizes": [16, 32, 48, 64],
                    "depths": [1, 1, 1, 1],
                    "out_features": ["stage4"],
                },
                **encoder_decoder,
                num_queries=10,
                num_labels=10,
            ),
        ),
        Arch(
            "hf_dpt",
            "transformers",
            "depth",
            _hf_pixels(
                "DPTForDepthEstimation",
                "DPTConfig",
                **{**_VIT, "num_hidden_layers": 4},  # one layer per reassembled stage
                backbone_out_indices=[0, 1, 2, 3],
                neck_hidden_sizes=[16, 32, 48, 64],
                fusion_hidden_size=32,
                head_hidden_size=16,
                # At the default 0.02 the head's final ReLU zeroes every depth value.
                initializer_range=0.08,
            ),
        ),
    ]
    small = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
    video = dict(**small, image_size=32, patch_size=8, num_frames=4)
    archs += [
        Arch(
            "hf_ast",
            "transformers",
            "speech",
            _hf_tensor(
                "ASTModel",
                "ASTConfig",
                "input_values",
                (1, 32, 16),  # [batch, frames, mel bins]
                **small,
                patch_size=8,
                frequency_stride=8,
                time_stride=8,
                max_length=32,
                num_mel_bins=16,
            ),
        ),
        Arch(
            "hf_patchtst",
            "transformers",
            "time-series",
            _hf_tensor(
                "PatchTSTModel",
                "PatchTSTConfig",
                "past_values",
                (1, 32, 3),  # [batch, time steps, channels]
                num_input_channels=3,
                context_length=32,
                patch_length=8,
                patch_stride=8,
                d_model=32,
                num_attention_heads=4,
                num_hidden_layers=2,
                ffn_dim=64,
            ),
        ),
        Arch(
            "hf_timesformer",
            "transformers",
            "video",
            _hf_tensor(
                "TimesformerModel", "TimesformerConfig", "pixel_values", (1, 4, 3, 32, 32), **video
            ),
        ),
        Arch(
            "hf_videomae",
            "transformers",
            "video",
            _hf_tensor(
                "VideoMAEModel",
                "VideoMAEConfig",
                "pixel_values",
                (1, 4, 3, 32, 32),  # [batch, frames, channels, height, width]
                **video,
                tubelet_size=2,
            ),
        ),
        Arch(
            "hf_mamba",
            "transformers",
            "state-space",
            _hf_text(
                "MambaModel",
                "MambaConfig",
                vocab_size=100,
                hidden_size=32,
                state_size=8,
                num_hidden_layers=2,
                expand=2,
                conv_kernel=4,
            ),
        ),
        Arch(
            "hf_rwkv",
            "transformers",
            "state-space",
            _hf_text(
                "RwkvModel",
                "RwkvConfig",
                vocab_size=100,
                hidden_size=32,
                num_hidden_layers=2,
                attention_hidden_size=32,
                intermediate_size=64,
                context_length=16,
            ),
        ),
        Arch("diffusers_unet", "diffusers", "diffusion", _diffusers_unet()),
        Arch(
            "hf_clip",
            "transformers",
            "multimodal",
            _hf_inputs(
                "CLIPModel",
                "CLIPConfig",
                # two captions against three images: logits per image, [3, 2]
                {"input_ids": ("ids", (2, 8), 100), "pixel_values": (3, 3, 32, 32)},
                text_config={**small, "vocab_size": 100, "max_position_embeddings": 16},
                vision_config={**small, "image_size": 32, "patch_size": 8},
                projection_dim=16,
            ),
        ),
        Arch(
            "hf_perceiver",
            "transformers",
            "text-encoder",
            _hf_inputs(
                "PerceiverForMaskedLM",
                "PerceiverConfig",
                {"inputs": ("ids", (1, 16), 100)},
                num_latents=8,
                d_latents=32,
                d_model=32,
                num_blocks=1,
                num_self_attends_per_block=2,
                num_self_attention_heads=4,
                num_cross_attention_heads=4,
                vocab_size=100,
                max_position_embeddings=32,
            ),
        ),
    ]
    return archs


ARCHS = {arch.name: arch for arch in _archs()}
