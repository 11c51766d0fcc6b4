"""Decoder LLMs at the sizes people deploy: Qwen2-0.5B, Llama-3.2-1B and a 7B-class Mistral,
as prefill and as the decode step, with seeded random weights and external data.

In:  nothing. Each size is a transformers config object written from the published
     architecture numbers (no hub call; ``HF_HUB_OFFLINE=1``):

     ============  ======  ======  ==========  =====  =======  ====  ===========================
     size          hidden  layers  heads (KV)  MLP    vocab    tied  position encoding
     ============  ======  ======  ==========  =====  =======  ====  ===========================
     qwen2-0.5b    896     24      14 (2)      4864   151936   yes   rope θ 1e6; q/k/v biases
     llama-3.2-1b  2048    16      32 (8)      8192   128256   yes   rope θ 5e5, llama3 scaling
                                                                     (factor 32, 1/4, 8192)
     mistral-7b    4096    32      32 (8)      14336  32000    no    rope θ 1e4, window 4096
     ============  ======  ======  ==========  =====  =======  ====  ===========================

     (Qwen2-0.5B, Llama-3.2-1B and Mistral-7B-v0.1; eager attention.) ``--layers N`` keeps
     the width and cuts the depth; ``--tiny`` keeps each family's structure (biases, rope
     scaling, tying, window) at hidden 64, 4 heads on 2 KV heads, MLP 128, vocabulary 512 —
     the test sizes.
Out: ``models/.cache/llm/<size>_<form>[_<N>layers][_fp16][_torchscript][_<method>][_tiny]``
     ``.onnx`` and its one external-data file, the same name with ``.data``. Forms, batch 1:
     ``prefill128`` — ``input_ids``, ``attention_mask`` [1, 128] -> ``logits`` [1, 128, vocab];
     ``decode127`` — one token (``input_ids`` [1, 1], ``attention_mask`` [1, 128],
     ``position_ids`` [1, 1]) against a 127-position cache (``past_key_values.<layer>.key`` /
     ``.value`` [1, KV heads, 127, head dim]) -> ``logits`` [1, 1, vocab] and
     ``present.<layer>.key`` / ``.value`` [1, KV heads, 128, head dim].
     The wrappers, inputs and conventions are those of ``decode.py`` (``Prefill``,
     ``DecodeStep``, ``inputs_of``: token ids and past K/V from ``Generator().manual_seed(1)``,
     the prefill's last 16 mask positions zero, the decode step's position 127).

Weights: every parameter is drawn by ``weight(name, shape)`` from its own NumPy generator,
seeded by (``SEED``, CRC-32 of the parameter's name): N(0, 0.02²) for projections and
embeddings (transformers' ``initializer_range``), 1 + 0.1·N(0, 1) for RMSNorm weights and
0.02·N(0, 1) for biases (as ``decode.py`` does, so that no Add of zeros or Mul of ones is
folded away and no two weights are equal). A parameter's values depend only on its name and
shape, so the same layer has the same weights however the file is made.

Two methods write a file:

``export`` (the default up to 1B): the whole model is built in torch and exported —
  ``torch.onnx.export(..., dynamo=True)`` (opset 18; ``--exporter torchscript`` for opset 17),
  saved with external data to a temporary directory, then the graph's node metadata is
  stripped (``strip_metadata.py``), ``onnx2bir.llm.*`` metadata_props are set and the data file
  is moved next to the ``.onnx`` (one file; the TorchScript exporter's per-tensor files are
  gathered into one).

``stitch`` (the default for mistral-7b, whose 7.24 G parameters are 29.0 GB in fp32 and do not
  fit in memory next to torch): a 2-layer model of the same width is exported as above (the
  template). Each of its initializers is matched by value to the torch parameter it holds,
  as it is or transposed (the exporter folds the Transpose of each Linear weight into a new
  initializer). The nodes of layer 0 and layer 1 are told apart by the exporter's name scopes
  (``model.model.layers.<i>``; the TorchScript exporter's node names); layer 1 must read
  exactly one value of layer 0 (the hidden state), and only the final norm and the LM head
  may read layer 1. Layers 2 .. N-1 are copies of layer 1's nodes with their values renamed,
  the hidden state chained from the layer before, their ``past_key_values.<k>.*`` inputs and
  ``present.<k>.*`` outputs renamed by layer, and their weights those of
  ``model.layers.<k>.*``; the final norm reads the last layer. Constants (shapes, the folded
  rotary tables and masks) are shared as the exporter shares them. The data file is written
  one tensor at a time, each weight drawn by ``weight()`` (then transposed or cast as its
  template initializer was), 64-byte aligned; tensors under 1 KiB stay inline. Peak memory is
  the template's plus one tensor. The check (``--layers 3`` below) stitches a 3-layer file
  from the 2-layer template and compares it with a 3-layer torch model holding the same
  weights.

The check (on by default, ``--no-check`` skips it): ``onnx.checker`` on the path, then
onnxruntime on the file against the torch module's own outputs on the seeded inputs; the
largest |difference| over all outputs is printed and must be within ``TOLERANCE`` (fp32
1e-3, fp16 5e-2: at full width the logits are sums over 896-4096 products). It holds the
model twice (torch and onnxruntime), so at full depth run it on a few layers.

Before writing, the free disk space is compared with the file's size; the script stops
(exit 2) when it does not fit.

    python models/llm_sizes.py qwen2-0.5b --form prefill --layers 2     # checked
    python models/llm_sizes.py qwen2-0.5b --form prefill --no-check     # 24 layers, 1.98 GB
    python models/llm_sizes.py mistral-7b --form decode --layers 3      # stitched, checked
    python models/llm_sizes.py all --tiny                               # every size and form
    python models/llm_sizes.py --list

Needs torch, transformers, onnx, onnxscript and onnxruntime; onnx2bir only reads the files.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
import time
import warnings
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parent))
from decode import OPSET, PADDING, DecodeStep, Export, Prefill, inputs_of  # noqa: E402
from strip_metadata import strip_exporter_metadata  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

MODELS_DIR = Path(__file__).resolve().parent
LLM_DIR = MODELS_DIR / ".cache" / "llm"
SEED = 0
TOLERANCE = {"fp32": 1e-3, "fp16": 5e-2}
META_PREFIX = "onnx2bir.llm."
FORMS = {"prefill": "prefill128", "decode": "decode127"}
INLINE_BYTES = 1024  # smaller tensors stay in the .onnx file
ALIGN = 64  # offsets of tensors in the data file
TEMPLATE_LAYERS = 2


@dataclass(frozen=True)
class Size:
    """One published architecture: its transformers family, config and default method."""

    name: str
    family: str  # "qwen2" | "llama" | "mistral"
    config: dict = field(hash=False)
    method: str  # "export" | "stitch"
    source: str  # the model whose config.json the numbers are from


SIZES = {
    s.name: s
    for s in [
        Size(
            "qwen2-0.5b",
            "qwen2",
            dict(
                hidden_size=896,
                num_hidden_layers=24,
                num_attention_heads=14,
                num_key_value_heads=2,
                intermediate_size=4864,
                vocab_size=151936,
                max_position_embeddings=131072,
                rms_norm_eps=1e-6,
                tie_word_embeddings=True,
                rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
                use_sliding_window=False,
                max_window_layers=24,
            ),
            "export",
            "Qwen/Qwen2-0.5B",
        ),
        Size(
            "llama-3.2-1b",
            "llama",
            dict(
                hidden_size=2048,
                num_hidden_layers=16,
                num_attention_heads=32,
                num_key_value_heads=8,
                head_dim=64,
                intermediate_size=8192,
                vocab_size=128256,
                max_position_embeddings=131072,
                rms_norm_eps=1e-5,
                tie_word_embeddings=True,
                rope_parameters={
                    "rope_type": "llama3",
                    "rope_theta": 500000.0,
                    "factor": 32.0,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 8192,
                },
            ),
            "export",
            "meta-llama/Llama-3.2-1B",
        ),
        Size(
            "mistral-7b",
            "mistral",
            dict(
                hidden_size=4096,
                num_hidden_layers=32,
                num_attention_heads=32,
                num_key_value_heads=8,
                head_dim=128,
                intermediate_size=14336,
                vocab_size=32000,
                max_position_embeddings=32768,
                rms_norm_eps=1e-5,
                tie_word_embeddings=False,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                sliding_window=4096,
            ),
            "stitch",
            "mistralai/Mistral-7B-v0.1",
        ),
    ]
}
TINY = dict(
    hidden_size=64,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    intermediate_size=128,
    vocab_size=512,
)


# ---------------------------------------------------------------------------------------------
# configs, weights, torch modules


def config_of(size: Size, layers: int | None = None, tiny: bool = False):
    """The transformers config of `size` with `layers` decoder layers (default: all)."""
    import transformers

    classes = {
        "llama": transformers.LlamaConfig,
        "qwen2": transformers.Qwen2Config,
        "mistral": transformers.MistralConfig,
    }
    values = {**size.config, **(TINY if tiny else {}), "attn_implementation": "eager"}
    if layers is not None:
        values["num_hidden_layers"] = layers
    if size.family == "qwen2":
        values["max_window_layers"] = values["num_hidden_layers"]
    return classes[size.family](**values)


def parameter_count(config) -> int:
    """The parameters of the causal LM of `config`, counted from its numbers."""
    hidden, heads, kv = config.hidden_size, config.num_attention_heads, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    bias = config.model_type == "qwen2" or getattr(config, "attention_bias", False)
    attention = hidden * head_dim * (2 * heads + 2 * kv) + bias * head_dim * (heads + 2 * kv)
    layer = attention + 3 * hidden * config.intermediate_size + 2 * hidden
    embeddings = config.vocab_size * hidden * (1 if config.tie_word_embeddings else 2)
    return config.num_hidden_layers * layer + embeddings + hidden


def file_bytes(config, dtype: str) -> int:
    """About the size of the data file: every parameter, and the exporter's transposed copy of
    a tied embedding matrix for the LM head."""
    tied = config.vocab_size * config.hidden_size if config.tie_word_embeddings else 0
    return (parameter_count(config) + tied) * (2 if dtype == "fp16" else 4)


def weight(name: str, shape: tuple[int, ...]) -> np.ndarray:
    """The seeded float32 values of the parameter `name` (module docstring)."""
    rng = np.random.default_rng([SEED, zlib.crc32(name.encode())])
    values = rng.standard_normal(shape, dtype=np.float32)
    if name.endswith("norm.weight"):
        return np.add(np.multiply(values, 0.1, out=values), 1.0, out=values)
    std = 0.02  # the configs' initializer_range, also for biases
    return np.multiply(values, std, out=values)


def build(size: Size, layers: int | None = None, dtype: str = "fp32", tiny: bool = False):
    """The causal LM of `size` in eval mode, every parameter from `weight()`."""
    import torch
    import transformers
    from transformers.initialization import no_init_weights

    classes = {
        "llama": transformers.LlamaForCausalLM,
        "qwen2": transformers.Qwen2ForCausalLM,
        "mistral": transformers.MistralForCausalLM,
    }
    config = config_of(size, layers, tiny)
    with no_init_weights():  # every parameter is written below
        model = classes[size.family](config)
    model.tie_weights()  # which post_init() leaves to the skipped initialisation
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            parameter.copy_(torch.from_numpy(weight(name, tuple(parameter.shape))))
    if dtype == "fp16":
        model = model.half()
    return model.eval()


def module_and_feeds(model, form: str, dtype: str):
    """decode.py's wrapper for `form` around `model`, and its seeded inputs by name."""
    import torch

    entry = Export(f"llm_{form}", "llm", form)
    feeds, outputs = inputs_of(entry, model.config)
    if dtype == "fp16":
        feeds = {k: v.half() if v.is_floating_point() else v for k, v in feeds.items()}
    module = DecodeStep(model) if form == "decode" else Prefill(model)
    assert torch.is_tensor(feeds["input_ids"])
    return module, feeds, outputs


# ---------------------------------------------------------------------------------------------
# the exporters


def torch_export(module, feeds: dict, outputs: list[str], exporter: str, directory: Path) -> Path:
    """Export `module` into `directory` with external data; the path of the .onnx."""
    import torch

    path = directory / "model.onnx"
    names = dict(input_names=list(feeds), output_names=outputs, opset_version=OPSET[exporter])
    with warnings.catch_warnings(), torch.no_grad(), _quiet():
        warnings.simplefilter("ignore")
        if exporter == "dynamo":
            program = torch.onnx.export(module, tuple(feeds.values()), dynamo=True, **names)
            program.save(str(path), external_data=True)
            del program
        else:
            torch.onnx.export(module, tuple(feeds.values()), str(path), dynamo=False, **names)
    return path


@contextlib.contextmanager
def _quiet():
    """Silence the exporter's progress lines on stdout."""
    with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink):
        yield


def tensor_bytes(tensor: onnx.TensorProto, directory: Path) -> bytes:
    """The raw little-endian bytes of an initializer, read from external data if it has it."""
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        info = {e.key: e.value for e in tensor.external_data}
        with open(directory / info["location"], "rb") as f:
            f.seek(int(info.get("offset", 0)))
            return f.read(int(info["length"]) if "length" in info else -1)
    return numpy_helper.to_array(tensor).tobytes()


def tensor_nbytes(tensor: onnx.TensorProto) -> int:
    itemsize = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
    return int(np.prod(tensor.dims, dtype=np.int64)) * itemsize


def layer_of(node: onnx.NodeProto) -> int | None:
    """The decoder layer a node belongs to: the dynamo exporter's name scopes, else the
    TorchScript exporter's node name (``/model/model/layers.3/...``)."""
    for prop in node.metadata_props:
        if prop.key == "pkg.torch.onnx.name_scopes":
            found = re.findall(r"'(?:model\.)?model\.layers\.(\d+)'", prop.value)
            return int(found[0]) if found else None
    found = re.search(r"/layers\.(\d+)/", node.name)
    return int(found.group(1)) if found else None


def match_weights(proto: onnx.ModelProto, directory: Path, model) -> dict[str, tuple[str, bool]]:
    """For each initializer holding a parameter of `model`: (the parameter's name, whether it
    is stored transposed). Matched by the bytes' digest; raises when one is ambiguous."""

    def digest(array: np.ndarray) -> str:
        array = np.ascontiguousarray(array)
        return f"{array.dtype}{array.shape}" + hashlib.blake2b(array.tobytes()).hexdigest()

    digests: dict[str, list[tuple[str, bool]]] = collections.defaultdict(list)
    for name, parameter in model.named_parameters():
        array = parameter.detach().numpy()
        digests[digest(array)].append((name, False))
        if array.ndim == 2:
            digests[digest(array.T)].append((name, True))
    found = {}
    for tensor in proto.graph.initializer:
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)
        array = np.frombuffer(tensor_bytes(tensor, directory), dtype).reshape(tensor.dims)
        candidates = digests.get(digest(array), [])
        if len(candidates) > 1:
            raise SystemExit(f"initializer {tensor.name} matches several weights: {candidates}")
        if candidates:
            found[tensor.name] = candidates[0]
    missing = {n for n, _ in model.named_parameters()} - {n for n, _ in found.values()}
    if missing:
        raise SystemExit(f"parameters not found among the initializers: {sorted(missing)[:5]}")
    return found


def stitch(
    proto: onnx.ModelProto, weights: dict[str, tuple[str, bool]], layers: int
) -> tuple[onnx.ModelProto, dict[str, tuple[str, bool]]]:
    """The template `proto` (2 layers, external data not loaded) with layer 1 replicated to
    `layers` layers, and the weights of the result's initializers (module docstring)."""
    graph = proto.graph
    by_layer = collections.defaultdict(list)
    # A node outside the layers' scopes that reads a layer's cache input belongs to that layer
    # (the TorchScript exporter names the cache's Concat "/Concat_2", for instance).
    cache_layer = {}
    for value in graph.input:
        found = re.match(r"past_key_values\.(\d+)\.", value.name)
        if found:
            cache_layer[value.name] = int(found.group(1))
    for node in graph.node:
        layer = layer_of(node)
        if layer is None:
            layers_read = {cache_layer[v] for v in node.input if v in cache_layer}
            if len(layers_read) == 1:
                layer = layers_read.pop()
                cache_layer.update(dict.fromkeys(node.output, layer))
        by_layer[layer].append(node)
    for value in graph.input:
        wrong = [
            n.name for k, n in _readers(by_layer, value.name) if k != cache_layer.get(value.name, k)
        ]
        if wrong:
            raise SystemExit(f"{value.name} is read outside its layer by {wrong[:3]}")
    if sorted(k for k in by_layer if k is not None) != [0, 1]:
        raise SystemExit(f"template has layers {sorted(k for k in by_layer if k is not None)}")
    produced = {k: {v for n in nodes for v in n.output} for k, nodes in by_layer.items()}
    outside = by_layer[None]
    # The epilogue: nodes outside the layers that depend on layer 1 (final norm, LM head).
    after, epilogue = set(produced[1]), []
    for node in outside:
        if after.intersection(node.input):
            epilogue.append(node)
            after.update(node.output)
    prologue = [n for n in outside if n not in epilogue]
    reads_of_1 = [v for n in by_layer[1] for v in n.input if v not in produced[1]]
    # Values of layer 0 that depend on its weights; the others (the rotary tables' Unsqueeze,
    # which the exporter computes once and shares) are read by every layer as they are.
    weighted = {v for n in by_layer[0] for v in n.input if v in weights}
    for node in by_layer[0]:
        if weighted.intersection(node.input):
            weighted.update(node.output)
    hidden_in = sorted({v for v in reads_of_1 if v in produced[0] and v in weighted})
    if len(hidden_in) != 1:
        raise SystemExit(f"layer 1 reads {len(hidden_in)} values of layer 0: {hidden_in}")
    layer1_out = {v for n in epilogue for v in n.input if v in produced[1]}
    if len(layer1_out) != 1:
        raise SystemExit(f"the epilogue reads {len(layer1_out)} values of layer 1")
    hidden_out = layer1_out.pop()
    if any(set(n.input) & produced[1] for n in prologue + by_layer[0]):
        raise SystemExit("a node before layer 1 reads layer 1")
    for value in graph.output:
        found = re.match(r"present\.(\d+)\.", value.name)
        if found and value.name not in produced[int(found.group(1))]:
            raise SystemExit(f"{value.name} is not written by layer {found.group(1)}")
    initializers = {t.name: t for t in graph.initializer}
    read_elsewhere = {v for n in outside + by_layer[0] for v in n.input}
    # The initializers that each layer has its own copy of, in the template's order: layer 1's
    # weights, and the constants that only layer 1 reads (the exporter folds each layer's
    # rotary tables of the prefill into constants of its own).
    per_layer = [t.name for t in graph.initializer if t.name in set(reads_of_1)]
    per_layer = [v for v in per_layer if v not in read_elsewhere]
    for v in per_layer:
        if v in weights and ".layers.1." not in weights[v][0]:
            raise SystemExit(f"layer 1 reads {v}, the weight {weights[v][0]}")
        if v not in weights and tensor_nbytes(initializers[v]) > 1 << 20:
            raise SystemExit(f"layer 1 reads a large initializer {v} that is no weight")
    for v in read_elsewhere & set(reads_of_1) & set(weights):
        if ".layers.1." in weights[v][0]:
            raise SystemExit(f"initializer {v} of layer 1 is read outside it")

    def layer_name(name: str, k: int) -> str:
        if re.search(r"\.1\.(key|value)$", name) and name.startswith(("past_", "present")):
            return re.sub(r"\.1\.(key|value)$", rf".{k}.\1", name)
        if ".layers.1." in name:
            return name.replace(".layers.1.", f".layers.{k}.")
        return f"{name}_layer{k}"

    new_nodes = list(prologue) + list(by_layer[0]) + list(by_layer[1])
    new_inits = list(graph.initializer)
    new_weights = dict(weights)
    values = {v.name: v for v in graph.value_info}
    new_values = list(graph.value_info)
    inputs = {v.name: v for v in graph.input}
    outputs = {v.name: v for v in graph.output}
    extra_inputs, extra_outputs = {}, {}
    previous = hidden_out
    for k in range(2, layers):
        rename = {v: layer_name(v, k) for v in produced[1]}
        rename[hidden_in[0]] = previous
        for v in per_layer:
            rename[v] = layer_name(v, k)
            tensor = onnx.TensorProto()
            tensor.CopyFrom(initializers[v])
            tensor.name = rename[v]
            new_inits.append(tensor)
            if v in weights:
                param, transposed = weights[v]
                new_weights[rename[v]] = (param.replace(".layers.1.", f".layers.{k}."), transposed)
        for v in sorted(set(reads_of_1) & set(inputs)):
            if v.startswith("past_"):
                rename[v] = layer_name(v, k)
                extra_inputs.setdefault(k, []).append((v, rename[v]))
        for node in by_layer[1]:
            copy = onnx.NodeProto()
            copy.CopyFrom(node)
            copy.name = f"{node.name}_layer{k}"
            copy.input[:] = [rename.get(v, v) for v in node.input]
            copy.output[:] = [rename[v] for v in node.output]
            new_nodes.append(copy)
        for v in produced[1]:
            if v in values:
                info = onnx.ValueInfoProto()
                info.CopyFrom(values[v])
                info.name = rename[v]
                new_values.append(info)
            if v in outputs:
                extra_outputs.setdefault(k, []).append((v, rename[v]))
        previous = rename[hidden_out]
    for node in epilogue:
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        copy.input[:] = [previous if v == hidden_out else v for v in node.input]
        new_nodes.append(copy)

    def ordered(template_values, extra: dict) -> list[onnx.ValueInfoProto]:
        result = list(template_values)
        for k in sorted(extra):
            for old, new in sorted(extra[k], key=lambda p: p[1].endswith("value")):
                info = onnx.ValueInfoProto()
                info.CopyFrom({v.name: v for v in template_values}[old])
                info.name = new
                result.append(info)
        return result

    out = onnx.ModelProto()
    out.CopyFrom(proto)
    g = out.graph
    del g.node[:], g.initializer[:], g.value_info[:], g.input[:], g.output[:]
    g.node.extend(new_nodes)
    g.initializer.extend(new_inits)
    g.value_info.extend(new_values)
    g.input.extend(ordered(list(graph.input), extra_inputs))
    g.output.extend(ordered(list(graph.output), extra_outputs))
    names = [v for n in g.node for v in n.output] + [t.name for t in g.initializer]
    duplicates = [v for v, c in collections.Counter(names).items() if c > 1]
    if duplicates:
        raise SystemExit(f"stitched names defined twice: {duplicates[:5]}")
    return out, new_weights


def _readers(by_layer: dict, value: str):
    return [(k, n) for k, nodes in by_layer.items() for n in nodes if value in n.input]


def write_model(
    proto: onnx.ModelProto,
    path: Path,
    source: Path,
    weights: dict[str, tuple[str, bool]] | None = None,
) -> int:
    """Write `proto` to `path` and all its initializers of 1 KiB or more to one data file next
    to it, one tensor at a time: a weight in `weights` drawn by `weight()` (transposed and cast
    as its initializer is), any other read from `source` (the template's directory).
    Returns the data file's size."""
    weights = weights or {}
    data_path = path.with_suffix(".data")
    partial = data_path.with_name(data_path.name + ".partial")
    offset = 0
    with open(partial, "wb") as f:
        for tensor in proto.graph.initializer:
            nbytes = tensor_nbytes(tensor)
            if tensor.name in weights:
                param, transposed = weights[tensor.name]
                dims = tuple(tensor.dims)
                values = weight(param, dims[::-1] if transposed else dims)
                values = values.T if transposed else values
                dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)
                raw = np.ascontiguousarray(values, dtype=dtype).tobytes()
                del values
            elif tensor.data_location == onnx.TensorProto.EXTERNAL or nbytes >= INLINE_BYTES:
                raw = tensor_bytes(tensor, source)
            else:
                continue  # small and inline: stays as it is
            assert len(raw) == nbytes, (tensor.name, len(raw), nbytes)
            for name in ("raw_data", "float_data", "int32_data", "int64_data", "double_data"):
                tensor.ClearField(name)
            del tensor.external_data[:]
            if nbytes < INLINE_BYTES:
                tensor.data_location = onnx.TensorProto.DEFAULT
                tensor.raw_data = raw
                continue
            pad = -offset % ALIGN
            f.write(b"\0" * pad)
            offset += pad
            f.write(raw)
            tensor.data_location = onnx.TensorProto.EXTERNAL
            for key, value in (
                ("location", data_path.name),
                ("offset", offset),
                ("length", nbytes),
            ):
                tensor.external_data.add(key=key, value=str(value))
            offset += nbytes
            del raw
    partial.replace(data_path)
    path.write_bytes(proto.SerializeToString())
    return offset


def estimated_bytes(proto: onnx.ModelProto) -> int:
    return sum(tensor_nbytes(t) for t in proto.graph.initializer)


def need_disk(directory: Path, nbytes: int, what: str) -> None:
    """Stop with exit 2 when `nbytes` (plus 1 GiB) do not fit in `directory`'s free space."""
    directory.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(directory).free
    if nbytes + (1 << 30) > free:
        print(f"{what}: needs {nbytes / 1e9:.2f} GB, {free / 1e9:.2f} GB free", file=sys.stderr)
        raise SystemExit(2)


def set_metadata(proto: onnx.ModelProto, record: dict[str, str]) -> None:
    del proto.metadata_props[:]
    for key, value in record.items():
        proto.metadata_props.add(key=META_PREFIX + key, value=str(value))


# ---------------------------------------------------------------------------------------------
# one file


@dataclass(frozen=True)
class Job:
    size: str
    form: str = "prefill"  # "prefill" | "decode"
    layers: int | None = None  # default: the size's
    dtype: str = "fp32"
    exporter: str = "dynamo"
    method: str | None = None  # default: the size's
    tiny: bool = False

    def resolved(self) -> Job:
        size = SIZES[self.size]
        layers = self.layers or (
            config_of(size).num_hidden_layers if not self.tiny else TEMPLATE_LAYERS
        )
        method = self.method or size.method
        return Job(self.size, self.form, layers, self.dtype, self.exporter, method, self.tiny)

    def path(self, directory: Path = LLM_DIR) -> Path:
        job = self.resolved()
        full = config_of(SIZES[job.size]).num_hidden_layers
        parts = [job.size, FORMS[job.form]]
        if job.layers != full:
            parts.append(f"{job.layers}layers")
        if job.dtype != "fp32":
            parts.append(job.dtype)
        if job.exporter != "dynamo":
            parts.append(job.exporter)
        if job.method != SIZES[job.size].method:
            parts.append(job.method)
        if job.tiny:
            parts.append("tiny")
        return directory / ("_".join(parts) + ".onnx")


def run(job: Job, directory: Path = LLM_DIR, check: bool = True, log=print) -> dict:
    """Write the file of `job` (and check it); returns its path, sizes, times and error."""
    import torch
    import transformers

    job = job.resolved()
    size = SIZES[job.size]
    path = job.path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(os.cpu_count() or 1)
    start = time.perf_counter()
    template_layers = TEMPLATE_LAYERS if job.method == "stitch" else job.layers
    if job.method == "stitch" and job.layers < TEMPLATE_LAYERS:
        raise SystemExit(f"stitch needs at least {TEMPLATE_LAYERS} layers")
    config = config_of(size, job.layers, job.tiny)
    total = parameter_count(config)
    template = file_bytes(config_of(size, template_layers, job.tiny), job.dtype)
    need_disk(
        directory, template + file_bytes(config, job.dtype) * (job.method == "stitch"), path.name
    )
    model = build(size, template_layers, job.dtype, job.tiny)
    assert sum(p.numel() for p in model.parameters()) == parameter_count(model.config)
    module, feeds, outputs = module_and_feeds(model, job.form, job.dtype)
    with tempfile.TemporaryDirectory(dir=directory, prefix=".export-") as tmp:
        exported = torch_export(module, feeds, outputs, job.exporter, Path(tmp))
        log(f"  exported {template_layers} layers in {time.perf_counter() - start:.1f} s")
        proto = onnx.load(str(exported), load_external_data=False)
        weights = None
        if job.method == "stitch":
            template_weights = match_weights(proto, Path(tmp), model)
            proto, weights = stitch(proto, template_weights, job.layers)
        del module, model  # check_file() builds its own
        strip_exporter_metadata(proto)
        record = {
            "name": path.stem,
            "size": job.size,
            "config_of": size.source + (" (tiny width)" if job.tiny else ""),
            "form": job.form,
            "past": 127 if job.form == "decode" else 0,
            "seq": 1 if job.form == "decode" else 128,
            "padding": 0 if job.form == "decode" else PADDING,
            "layers": job.layers,
            "dtype": job.dtype,
            "exporter": f"{job.exporter} (dynamo={job.exporter == 'dynamo'})",
            "opset": OPSET[job.exporter],
            "method": job.method
            + (f" (layer 1 of a {TEMPLATE_LAYERS}-layer export)" if job.method == "stitch" else ""),
            "seed": SEED,
            "parameters": total,
            "config": json.dumps(config.to_diff_dict(), sort_keys=True, default=str),
            "torch_version": torch.__version__,
            "transformers_version": transformers.__version__,
        }
        set_metadata(proto, record)
        nbytes = estimated_bytes(proto)
        need_disk(directory, nbytes, str(path.name))
        if job.method == "export" and _one_data_file(proto):
            data = _move_data(proto, Path(tmp), path)
        else:
            data = write_model(proto, path, Path(tmp), weights)
    seconds = time.perf_counter() - start
    result = {
        "path": path,
        "onnx_bytes": path.stat().st_size,
        "data_bytes": data,
        "parameters": total,
        "seconds": seconds,
        "nodes": len(proto.graph.node),
    }
    log(
        f"{path.relative_to(MODELS_DIR) if path.is_relative_to(MODELS_DIR) else path}: "
        f"{total / 1e6:.1f} M parameters, .onnx {result['onnx_bytes'] / 1e6:.2f} MB, "
        f".data {data / 1e9:.3f} GB, {len(proto.graph.node)} nodes, {seconds:.1f} s"
    )
    if check:
        result["error"] = check_file(job, path)
        log(f"  max |onnxruntime - torch| {result['error']:.3g} (tolerance {TOLERANCE[job.dtype]})")
    return result


def _one_data_file(proto: onnx.ModelProto) -> bool:
    locations = {
        e.value for t in proto.graph.initializer for e in t.external_data if e.key == "location"
    }
    return len(locations) == 1


def _move_data(proto: onnx.ModelProto, source: Path, path: Path) -> int:
    """Move the exporter's one data file next to `path` and point the initializers at it."""
    data_path = path.with_suffix(".data")
    (location,) = {
        e.value for t in proto.graph.initializer for e in t.external_data if e.key == "location"
    }
    for tensor in proto.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = data_path.name
    shutil.move(source / location, data_path)
    path.write_bytes(proto.SerializeToString())
    return data_path.stat().st_size


def check_file(job: Job, path: Path) -> float:
    """The largest |onnxruntime − torch| over all outputs of the file at `path` against the torch
    model of the same size, layers and weights; stops the script past TOLERANCE."""
    import onnxruntime as ort
    import torch

    job = job.resolved()
    onnx.checker.check_model(str(path))
    model = build(SIZES[job.size], job.layers, job.dtype, job.tiny)
    module, feeds, _ = module_and_feeds(model, job.form, job.dtype)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = module(*feeds.values())
    expected = [
        t.float().numpy() for t in (expected if isinstance(expected, tuple) else [expected])
    ]
    del module, model
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    got = session.run(None, {name: t.numpy() for name, t in feeds.items()})
    error = max(
        float(np.abs(a.astype(np.float32) - b).max()) for a, b in zip(got, expected, strict=True)
    )
    if not error <= TOLERANCE[job.dtype]:
        raise SystemExit(f"{path.name}: onnxruntime differs from torch by {error:.3g}")
    return error


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Sizes: "
        + "; ".join(f"{s.name} ({s.source} config, method {s.method})" for s in SIZES.values())
        + ". See the module docstring (and models/README.md) for the stitch method.",
    )
    parser.add_argument("sizes", nargs="*", help=f"of {', '.join(SIZES)}, or all")
    parser.add_argument(
        "--form", choices=[*FORMS, "both"], default="both", help="prefill (128 tokens), decode"
    )
    parser.add_argument("--layers", type=int, help="decoder layers (default: the size's)")
    parser.add_argument("--dtype", choices=sorted(TOLERANCE), default="fp32")
    parser.add_argument("--exporter", choices=sorted(OPSET), default="dynamo")
    parser.add_argument(
        "--method", choices=["export", "stitch"], help="default: stitch for mistral-7b"
    )
    parser.add_argument("--tiny", action="store_true", help="hidden 64, vocab 512 (test size)")
    parser.add_argument("--no-check", dest="check", action="store_false", help="skip the check")
    parser.add_argument("--out", type=Path, default=LLM_DIR, help="directory (models/.cache/llm)")
    parser.add_argument("--list", action="store_true", help="print the sizes and file names")
    args = parser.parse_args(argv)
    if args.list or not args.sizes:
        for size in SIZES.values():
            config = config_of(size)
            print(f"{size.name}: {size.source}, {config.num_hidden_layers} layers, {size.method}")
            for form in FORMS:
                print(f"  {Job(size.name, form).path(args.out)}")
        return 0
    names = list(SIZES) if args.sizes == ["all"] else args.sizes
    unknown = [n for n in names if n not in SIZES]
    if unknown:
        parser.error(f"unknown {unknown}; known: {', '.join(SIZES)}")
    forms = list(FORMS) if args.form == "both" else [args.form]
    for name in names:
        for form in forms:
            job = Job(name, form, args.layers, args.dtype, args.exporter, args.method, args.tiny)
            run(job, args.out, args.check)
    return 0


if __name__ == "__main__":
    sys.exit(main())
