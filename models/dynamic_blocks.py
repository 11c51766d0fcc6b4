"""BERT-style encoders and Llama-style decoders quantized by onnxruntime's `quantize_dynamic`,
built without torch (tests/codegen/test_dynamic_quant_exact.py), and the steps
`models/dynamic_heldout.py` shares (quantizing, exposing the integer tensors).

In: a size (`EncoderSize`, `DecoderSize`) and a seed. Out: an `onnx.ModelProto` as a user's
export would be after `quant_pre_process` and `quantize_dynamic` with its defaults:
DynamicQuantizeLinear (uint8, per tensor) before every MatMul with a constant weight, which
becomes a MatMulInteger with int8 weights; the attention matmuls of two activations stay
float. The float model is written with onnx.helper in the ops the torch exporter writes
(Gather, LayerNormalization or the RMSNorm arithmetic, MatMul + Add, Reshape, Transpose,
Softmax, Erf-GELU or SiLU, a rotary embedding of Slice/Neg/Concat), weights seeded normal
(std `weight_std`, transformers' initialisation) or uniform, biases non-zero.

`with_integer_outputs` makes every integer tensor onnxruntime's tool wrote a graph output
(each DynamicQuantizeLinear's y and zero point, each MatMulInteger's int32), so the verdict
compares each of them exactly.
"""

from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17  # LayerNormalization; ReduceMean still takes its axes as an attribute
IR_VERSION = 10
F = TensorProto.FLOAT


@dataclass(frozen=True)
class EncoderSize:
    hidden: int = 64
    heads: int = 4
    layers: int = 2
    seq: int = 16
    ffn: int = 256
    vocab: int = 128


@dataclass(frozen=True)
class DecoderSize:
    hidden: int = 64
    heads: int = 4
    layers: int = 2
    seq: int = 16
    ffn: int = 172
    vocab: int = 256


class _Graph:
    """Nodes, initializers and fresh names for one float model."""

    def __init__(self, seed: int, weight_std: float, uniform: bool):
        self.rng = np.random.default_rng(seed)
        self.std, self.uniform = weight_std, uniform
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.count = 0

    def name(self, label: str) -> str:
        self.count += 1
        return f"{label}_{self.count}"

    def const(self, label: str, value) -> str:
        name = self.name(label)
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def weight(self, label: str, shape: tuple[int, ...]) -> str:
        if self.uniform:
            value = self.rng.uniform(-1, 1, shape) * self.std * math.sqrt(3)
        else:
            value = self.rng.standard_normal(shape) * self.std
        return self.const(label, value.astype(np.float32))

    def op(self, op_type: str, inputs: list[str], label: str | None = None, **attrs) -> str:
        out = self.name(label or op_type.lower())
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=out, **attrs))
        return out

    def linear(self, x: str, n_in: int, n_out: int, bias: bool) -> str:
        y = self.op("MatMul", [x, self.weight("w", (n_in, n_out))])
        if bias:
            y = self.op("Add", [y, self.weight("b", (n_out,))])
        return y

    def model(self, inputs, output: str, shape: list[int]) -> onnx.ModelProto:
        graph = helper.make_graph(
            self.nodes, "g", inputs, [helper.make_tensor_value_info(output, F, shape)], self.inits
        )
        model = helper.make_model(
            graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION
        )
        onnx.checker.check_model(model, full_check=True)
        return model


def _heads(g: _Graph, x: str, seq: int, heads: int, head_dim: int, perm) -> str:
    shaped = g.op("Reshape", [x, g.const("shape", np.array([1, seq, heads, head_dim]))])
    return g.op("Transpose", [shaped], perm=perm)


def _attention(g: _Graph, q: str, k: str, v: str, seq: int, heads: int, hidden: int, mask):
    """softmax(q·kᵀ / √d + mask)·v for [1, heads, seq, head_dim] q, v and [.., head_dim, seq]
    k, merged back to [1, seq, hidden]."""
    head_dim = hidden // heads
    scores = g.op("MatMul", [q, k])
    scores = g.op("Mul", [scores, g.const("scale", np.float32(1 / math.sqrt(head_dim)))])
    if mask is not None:
        scores = g.op("Add", [scores, mask])
    probs = g.op("Softmax", [scores], axis=-1)
    context = g.op("Transpose", [g.op("MatMul", [probs, v])], perm=[0, 2, 1, 3])
    return g.op("Reshape", [context, g.const("shape", np.array([1, seq, hidden]))])


def _token_input(size) -> tuple[list, str]:
    ids = helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, size.seq])
    return [ids], "input_ids"


def float_encoder(
    size: EncoderSize, seed: int = 0, weight_std: float = 0.02, uniform: bool = False
) -> onnx.ModelProto:
    """A DistilBERT-style encoder: embeddings + positions, LayerNorm, then per layer
    self-attention and a GELU FFN, each with a residual and a post-LayerNorm."""
    g = _Graph(seed, weight_std, uniform)
    inputs, ids = _token_input(size)
    h, s = size.hidden, size.seq
    x = g.op("Gather", [g.weight("word_embeddings", (size.vocab, h)), ids])
    x = g.op("Add", [x, g.weight("position_embeddings", (1, s, h))])

    def norm(t: str) -> str:
        gamma = g.const("gamma", (1 + g.rng.standard_normal(h) * 0.1).astype(np.float32))
        beta = g.const("beta", (g.rng.standard_normal(h) * 0.02).astype(np.float32))
        return g.op("LayerNormalization", [t, gamma, beta], axis=-1, epsilon=1e-12)

    x = norm(x)
    for _ in range(size.layers):
        q = _heads(g, g.linear(x, h, h, True), s, size.heads, h // size.heads, [0, 2, 1, 3])
        k = _heads(g, g.linear(x, h, h, True), s, size.heads, h // size.heads, [0, 2, 3, 1])
        v = _heads(g, g.linear(x, h, h, True), s, size.heads, h // size.heads, [0, 2, 1, 3])
        context = _attention(g, q, k, v, s, size.heads, h, None)
        x = norm(g.op("Add", [x, g.linear(context, h, h, True)]))
        inner = g.linear(x, h, size.ffn, True)
        erf = g.op("Erf", [g.op("Mul", [inner, g.const("rsqrt2", np.float32(1 / math.sqrt(2)))])])
        one = g.op("Add", [erf, g.const("one", np.float32(1))])
        gelu = g.op("Mul", [g.op("Mul", [inner, one]), g.const("half", np.float32(0.5))])
        x = norm(g.op("Add", [x, g.linear(gelu, size.ffn, h, True)]))
    return g.model(inputs, x, [1, s, h])


def _rms_norm(g: _Graph, x: str, hidden: int) -> str:
    square = g.op("Mul", [x, x])
    mean = g.op("ReduceMean", [square], axes=[-1], keepdims=1)
    root = g.op("Sqrt", [g.op("Add", [mean, g.const("eps", np.float32(1e-6))])])
    normed = g.op("Mul", [x, g.op("Reciprocal", [root])])
    weight = (1 + g.rng.standard_normal(hidden) * 0.1).astype(np.float32)
    return g.op("Mul", [normed, g.const("rms_weight", weight)])


def _rotary(g: _Graph, x: str, seq: int, head_dim: int) -> str:
    """x·cos + rotate_half(x)·sin on [1, heads, seq, head_dim] (Llama's rotate_half: the
    halves swapped, the second negated)."""
    half = head_dim // 2
    inv = 1.0 / (10000 ** (np.arange(half) / half))
    angles = np.outer(np.arange(seq), inv)
    cos = np.concatenate([np.cos(angles)] * 2, axis=-1).astype(np.float32)
    sin = np.concatenate([np.sin(angles)] * 2, axis=-1).astype(np.float32)
    axes = g.const("axes", np.array([3]))
    first = g.op("Slice", [x, g.const("s", np.array([0])), g.const("e", np.array([half])), axes])
    end = g.const("e", np.array([head_dim]))
    second = g.op("Slice", [x, g.const("s", np.array([half])), end, axes])
    rotated = g.op("Concat", [g.op("Neg", [second]), first], axis=-1)
    return g.op(
        "Add",
        [g.op("Mul", [x, g.const("cos", cos)]), g.op("Mul", [rotated, g.const("sin", sin)])],
    )


def float_decoder(
    size: DecoderSize, seed: int = 0, weight_std: float = 0.02, uniform: bool = False
) -> onnx.ModelProto:
    """A Llama-style decoder: token embeddings, per layer RMSNorm, causal self-attention with
    rotary q and k, a residual, RMSNorm, a SwiGLU MLP and a residual; a last RMSNorm and the
    LM head, all without biases."""
    g = _Graph(seed, weight_std, uniform)
    inputs, ids = _token_input(size)
    h, s, heads = size.hidden, size.seq, size.heads
    d = h // heads
    x = g.op("Gather", [g.weight("embed_tokens", (size.vocab, h)), ids])
    causal = np.triu(np.full((s, s), -1e4, np.float32), k=1)
    mask = g.const("causal_mask", causal)
    for _ in range(size.layers):
        n = _rms_norm(g, x, h)
        q = _rotary(g, _heads(g, g.linear(n, h, h, False), s, heads, d, [0, 2, 1, 3]), s, d)
        k = _rotary(g, _heads(g, g.linear(n, h, h, False), s, heads, d, [0, 2, 1, 3]), s, d)
        k = g.op("Transpose", [k], perm=[0, 1, 3, 2])
        v = _heads(g, g.linear(n, h, h, False), s, heads, d, [0, 2, 1, 3])
        context = _attention(g, q, k, v, s, heads, h, mask)
        x = g.op("Add", [x, g.linear(context, h, h, False)])
        n = _rms_norm(g, x, h)
        gate, up = g.linear(n, h, size.ffn, False), g.linear(n, h, size.ffn, False)
        silu = g.op("Mul", [gate, g.op("Sigmoid", [gate])])
        x = g.op("Add", [x, g.linear(g.op("Mul", [silu, up]), size.ffn, h, False)])
    logits = g.linear(_rms_norm(g, x, h), h, size.vocab, False)
    return g.model(inputs, logits, [1, s, size.vocab])


def quantize_dynamic_defaults(model: onnx.ModelProto) -> onnx.ModelProto:
    """onnxruntime's `quant_pre_process` (without the symbolic shape inference, as
    onnx2bir.sweep.quantize runs it), then `quantize_dynamic` with its defaults."""
    from onnxruntime.quantization import quant_pre_process, quantize_dynamic

    with tempfile.TemporaryDirectory(prefix="onnx2bir-dynamic-") as folder:
        source = Path(folder) / "float.onnx"
        prepared, out = Path(folder) / "prepared.onnx", Path(folder) / "quantized.onnx"
        onnx.save(model, str(source))
        quant_pre_process(str(source), str(prepared), skip_symbolic_shape=True)
        quantize_dynamic(str(prepared), str(out))
        return onnx.load(str(out))


def integer_tensors(model: onnx.ModelProto) -> list[str]:
    """The integer tensors onnxruntime's tool wrote: each DynamicQuantizeLinear's y and zero
    point, each MatMulInteger's and ConvInteger's int32 output, in graph order."""
    names = []
    for node in model.graph.node:
        if node.op_type == "DynamicQuantizeLinear":
            names += [node.output[0], node.output[2]]
        elif node.op_type in ("MatMulInteger", "ConvInteger"):
            names.append(node.output[0])
    return names


def with_integer_outputs(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `model` whose integer tensors (`integer_tensors`) are graph outputs too."""
    inferred = onnx.shape_inference.infer_shapes(model)
    infos = {value.name: value for value in inferred.graph.value_info}
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    present = {value.name for value in copy.graph.output}
    for name in integer_tensors(model):
        if name not in present:
            copy.graph.output.append(infos[name])
    return copy


def token_ids(vocab: int, seq: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"input_ids": rng.integers(0, vocab, (1, seq)).astype(np.int64)}
