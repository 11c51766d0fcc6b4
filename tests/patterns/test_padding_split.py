"""Causal-and-padding masks split into the kernel's causal step and a key-padding step
(docs/attention.md#padding-split, patterns/attention/padding.py).

The forms are written as decoder exports write them — transformers 5 through the TorchScript
and the dynamo exporters, the De Morgan spellings, a sum of a causal mask and a padding bias,
an encoder's padding-only mask — on a graph with an `attention_mask` input. For each, the split
is checked against the mask onnxruntime computes from the same subgraph on random padding: the
causal triangle (when the split says causal) and the padding terms, evaluated by onnxruntime,
rebuild the mask exactly. Near-misses (a sliding-window band, a 2-D runtime mask, a raw
integer padding bias) are refused with the reason.

End to end on the committed exports (models/decode/): raised with the sequence gate lowered,
each prefill gets the causal target with the padding as a [1, 1, 1, 128] step and no S × S
mask left in the graph, and validates against onnxruntime — while a split that drops the
padding step, or the causal one, fails. `llama_prefill_1024` is raised as it is (1024 > 1007
tokens). A row whose keys the padding removes entirely (left padding, an all-zero mask) is
the model's too: the raise's fix-up gives it the mean of V, checked against onnxruntime on
the original model with a bound the raise without the fix-up fails.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx2bir.api import validate
from onnx2bir.compiler import compile_model
from onnx2bir.frontend.importer import build_graph
from onnx2bir.options import CompileOptions
from onnx2bir.patterns.attention import padding as padding_module
from onnx2bir.patterns.attention import raising
from onnx2bir.patterns.attention.padding import padding_split
from onnx2bir.runtime.machine.interpreter import run_function
from onnx2bir.runtime.oracle.ort import run_onnxruntime

DECODE = Path(__file__).resolve().parents[2] / "models" / "decode"
FMIN = float(np.finfo(np.float32).min)
RAISE = CompileOptions(
    enable_native_kernel_attention=True, enable_native_kernel_attention_bf16=True
)
CAUSAL = "CausalAttentionMMSoftmaxMMWithoutSwap"
B, S = 2, 8


class Mask:
    """A mask subgraph on an `am` [B, S] int64 input: nodes, initializers, the tensor a score
    step reads (`out`), and that step's fill (None for an Add) and branch."""

    def __init__(self) -> None:
        self.nodes, self.inits, self.count = [], [], 0
        self.out, self.fill, self.on_true = "", None, True

    def const(self, value, dtype) -> str:
        name = f"c{self.count}"
        self.count += 1
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype), name))
        return name

    def op(self, op_type, *inputs, **attrs) -> str:
        out = f"t{self.count}"
        self.count += 1
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], name=out, **attrs))
        self.out = out
        return out

    def where(self, fill, on_true=True):
        self.fill, self.on_true = fill, on_true
        return self

    # --- what exporters write -----------------------------------------------------------------
    def padding(self) -> str:
        """Cast(am → bool) as [B, 1, 1, S]."""
        cast = self.op("Cast", "am", to=TensorProto.BOOL)
        return self.op("Unsqueeze", cast, self.const([1, 2], np.int64))

    def causal(self, op="LessOrEqual") -> str:
        """key ≤ query from index constants (the TorchScript exporter's form)."""
        col = self.const(np.arange(S).reshape(1, 1, 1, S), np.int64)
        row = self.const(np.arange(S).reshape(1, 1, S, 1), np.int64)
        return self.op(op, col, row)

    def select(self, keep) -> Mask:
        self.op("Where", keep, self.const(0.0, np.float32), self.const(FMIN, np.float32))
        return self


def hf_dynamo() -> Mask:
    """Where(And(And(True, triangle constant), padding), 0, min): transformers 5, dynamo"""
    m = Mask()
    triangle = m.const(np.tril(np.ones((S, S), bool)).reshape(1, 1, S, S), bool)
    return m.select(m.op("And", m.op("And", m.const(True, bool), triangle), m.padding()))


def hf_torchscript() -> Mask:
    """Where(Expand(And(Cast(LessOrEqual(col, row)), padding)), 0, min): TorchScript exporter"""
    m = Mask()
    both = m.op("And", m.op("Cast", m.causal(), to=TensorProto.BOOL), m.padding())
    return m.select(m.op("Expand", both, m.const([B, 1, S, S], np.int64)))


def masked_or() -> Mask:
    """Where(Or(key > query, Not(padding)), min, 0): the masked positions, De Morgan"""
    m = Mask()
    masked = m.op("Or", m.causal("Greater"), m.op("Not", m.padding()))
    m.op("Where", masked, m.const(FMIN, np.float32), m.const(0.0, np.float32))
    return m


def masked_fill() -> Mask:
    """scores.masked_fill(Or(key > query, Not(padding)), -inf): the condition"""
    m = Mask()
    m.op("Or", m.causal("Greater"), m.op("Not", m.padding()))
    return m.where(-np.inf)


def sum_bounded() -> Mask:
    """triu(full(min), 1) + (1 − Cast(Cast(am → bool) → float)) · min: a padding bias ≤ 0"""
    m = Mask()
    triangle = m.const(np.triu(np.full((S, S), FMIN, np.float32), 1), np.float32)
    keep = m.op("Cast", m.padding(), to=TensorProto.FLOAT)
    bias = m.op("Mul", m.op("Sub", m.const(1.0, np.float32), keep), m.const(FMIN, np.float32))
    m.op("Add", triangle, bias)
    return m


def padding_only() -> Mask:
    """An encoder's Where(And(True everywhere, padding), 0, min): no causal part"""
    m = Mask()
    return m.select(m.op("And", m.const(np.ones((1, 1, S, S), bool), bool), m.padding()))


FORMS = [hf_dynamo, hf_torchscript, masked_or, masked_fill, padding_only]


def hf_small_fill() -> Mask:
    """Where(And(triangle, padding), 0, −1e4): a fill that does not absorb the score"""
    m = Mask()
    triangle = m.const(np.tril(np.ones((S, S), bool)).reshape(1, 1, S, S), bool)
    keep = m.op("And", triangle, m.padding())
    m.op("Where", keep, m.const(0.0, np.float32), m.const(-1e4, np.float32))
    return m


def band() -> Mask:
    """A sliding window of 3 keys AND padding: not the causal triangle"""
    m = Mask()
    window = np.tril(np.ones((S, S), bool)) & np.triu(np.ones((S, S), bool), -2)
    return m.select(m.op("And", m.const(window.reshape(1, 1, S, S), bool), m.padding()))


def sum_raw() -> Mask:
    """triu(full(min), 1) + (1 − Cast(am → float)) · min: am = 2 would unmask a key"""
    m = Mask()
    triangle = m.const(np.triu(np.full((S, S), FMIN, np.float32), 1), np.float32)
    keep = m.op("Unsqueeze", m.op("Cast", "am", to=TensorProto.FLOAT), m.const([1, 2], np.int64))
    bias = m.op("Mul", m.op("Sub", m.const(1.0, np.float32), keep), m.const(FMIN, np.float32))
    m.op("Add", triangle, bias)
    return m


def two_d() -> Mask:
    """causal AND a [B, 1, S, S] runtime mask: depends on the query"""
    m = Mask()
    full = m.op("Cast", "am2", to=TensorProto.BOOL)
    return m.select(m.op("And", m.op("Cast", m.causal(), to=TensorProto.BOOL), full))


REFUSED = {
    sum_bounded: "a row the padding masks entirely gets min + min = −inf",
    hf_small_fill: "fills -10000, which does not absorb the score",
    band: "the terms besides the padding are not the causal triangle: masks key − query = -7",
    sum_raw: "is not bounded above by 0 (unbounded)",
    two_d: "term 't0' [2, 1, 8, 8] depends on the query and is not read structurally",
}


def mask_model(m: Mask) -> onnx.ModelProto:
    inputs = [
        helper.make_tensor_value_info("am", TensorProto.INT64, [B, S]),
        helper.make_tensor_value_info("am2", TensorProto.INT64, [B, 1, S, S]),
    ]
    out = helper.make_tensor_value_info(m.out, 0, None)
    graph = helper.make_graph(m.nodes, "mask", inputs, [out], m.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    return onnx.shape_inference.infer_shapes(model)


def with_outputs(model: onnx.ModelProto, names: list[str]) -> onnx.ModelProto:
    """The model with intermediate tensors `names` as outputs too (for onnxruntime)."""
    extra = onnx.ModelProto()
    extra.CopyFrom(model)
    known = {v.name: v for v in model.graph.value_info}
    have = {v.name for v in model.graph.output}
    extra.graph.output.extend(known[n] for n in names if n not in have)
    return extra


def split_of(m: Mask):
    model = mask_model(m)
    graph = build_graph(model, "mask")
    return model, padding_split(graph, m.out, S, S, m.fill, m.on_true)


def random_padding(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "am": rng.integers(0, 2, (B, S)).astype(np.int64),
        "am2": rng.integers(0, 2, (B, 1, S, S)).astype(np.int64),
    }


def rebuilt(split, terms: dict[str, np.ndarray], fill: float | None) -> np.ndarray:
    """The mask as the split describes it, from the padding terms onnxruntime computed."""
    causal = np.tril(np.ones((S, S), bool)) if split.causal else np.ones((S, S), bool)
    if split.form == "sum":
        with np.errstate(over="ignore"):  # min + min is −inf, as onnxruntime computes it
            return np.where(causal, 0.0, FMIN).astype(np.float32) + terms[split.padding[0].tensor]
    keep = np.broadcast_to(causal, (B, 1, S, S))
    for term in split.padding:
        value = terms[term.tensor].astype(bool)
        keep = keep & (value if term.keep else ~value)
    if fill is not None:  # a masked_fill condition: where the fill applies
        return ~keep
    return np.where(keep, np.float32(0), np.float32(split.fill))


@pytest.mark.parametrize("build", FORMS, ids=lambda b: b.__name__)
def test_split_rebuilds_the_mask_onnxruntime_computes(build):
    m = build()
    model, (split, why) = split_of(m)
    assert split is not None, why
    assert split.causal is (build is not padding_only)
    assert split.shape[-2] == 1 and split.shape[-1] == S
    names = [t.tensor for t in split.padding]
    for seed in range(4):
        feeds = random_padding(seed)
        values = run_onnxruntime(with_outputs(model, names), feeds)
        expected = np.broadcast_to(values[m.out], (B, 1, S, S))
        got = np.broadcast_to(rebuilt(split, values, m.fill), (B, 1, S, S))
        if m.fill is None and split.form != "sum":
            np.testing.assert_array_equal(got, expected)
        elif m.fill is None:  # the sum: the same masked set, the same kept values
            np.testing.assert_array_equal(got <= -1e4, expected <= -1e4)
            np.testing.assert_array_equal(got[got > -1e4], expected[expected > -1e4])
        else:
            np.testing.assert_array_equal(got, expected.astype(bool))


@pytest.mark.parametrize("build", list(REFUSED), ids=lambda b: b.__name__)
def test_near_miss_is_refused_with_its_reason(build):
    _, (split, why) = split_of(build())
    assert split is None and why is not None and REFUSED[build] in why, why


# --- end to end on the committed exports ----------------------------------------------------------
def prefill_inputs(name: str, left: int = 0, right: int = 16) -> dict[str, np.ndarray]:
    model = onnx.load(str(DECODE / f"{name}.onnx"), load_external_data=False)
    seq = model.graph.input[0].type.tensor_type.shape.dim[1].dim_value
    ids = np.random.default_rng(3).integers(0, 256, (1, seq), dtype=np.int64)
    mask = np.ones((1, seq), np.int64)
    mask[:, :left] = 0
    mask[:, seq - right :] = 0
    return {"input_ids": ids, "attention_mask": mask}


def kernel_nodes(compilation) -> list[dict]:
    """The attention kernel's CustomCalls (not the MLP kernel's)."""
    graph = compilation.graph
    return [
        d
        for _, d in graph.nodes()
        if d["op_type"] == "CustomCall" and "Attention" in d["attrs"]["custom_call_target"]
    ]


@pytest.mark.parametrize("family", ["llama", "qwen2", "mistral"])
def test_raised_prefill_takes_the_causal_kernel_and_validates(family, monkeypatch):
    monkeypatch.setattr(raising, "MIN_SEQUENCE", 0)
    name = f"{family}_prefill"
    result = validate(DECODE / f"{name}.onnx", prefill_inputs(name), options=RAISE)
    assert result.passed, result.text()
    calls = kernel_nodes(result.details)
    assert len(calls) == 2 and {c["attrs"]["custom_call_target"] for c in calls} == {CAUSAL}
    for call in calls:
        steps = [s["op"] for s in json.loads(call["attrs"]["steps"])]
        assert steps == ["scale", "add", "causal"]
        (bias,) = call["inputs"][3:]  # the padding bias, laid out for the kernel
        assert np.prod(result.details.graph.tensors[bias].shape) == 128
    # No S x S mask is computed any more: every tensor of 128 x 128 is a score or probability.
    graph = result.details.graph
    masks = [
        d["name"]
        for _, d in graph.nodes()
        if d["op_type"] in ("Where", "And", "Expand")
        and tuple(graph.tensors[d["outputs"][0]].shape[-2:]) == (128, 128)
    ]
    assert masks == []


@pytest.mark.parametrize("drop", ["padding", "causal"])
def test_a_wrong_split_fails_against_onnxruntime(drop, monkeypatch):
    monkeypatch.setattr(raising, "MIN_SEQUENCE", 0)
    original = padding_module.split_steps

    def wrong(split, step, operand):
        kept = original(split, step, operand)
        return [s for s in kept if (s["op"] == "causal") is (drop == "padding")]

    monkeypatch.setattr(raising, "split_steps", wrong)
    name = "llama_prefill"
    result = validate(DECODE / f"{name}.onnx", prefill_inputs(name), options=RAISE)
    assert not result.passed
    failed = {c["producer"] for c in result.to_json()["checkpoints"] if not c["passed"]}
    # Exactly the blocks' outputs (each layer's PV MatMul) leave their bound.
    assert failed == {f"/model/model/layers.{i}/self_attn/MatMul_1" for i in range(2)}


def test_raised_decode_step_reads_the_padding_alone(monkeypatch):
    """The decode step's mask keeps every key but the padded ones: the kernel reads the
    [1, 1, 1, 128] padding, no causal step; with cached positions masked out it validates."""
    monkeypatch.setattr(raising, "MIN_SEQUENCE", 0)
    path = DECODE / "llama_decode.onnx"
    model = onnx.load(str(path), load_external_data=False)
    rng = np.random.default_rng(4)
    feeds = {}
    for value in model.graph.input:
        shape = [d.dim_value for d in value.type.tensor_type.shape.dim]
        feeds[value.name] = rng.standard_normal(shape, dtype=np.float32)
    feeds["input_ids"] = np.array([[17]], np.int64)
    feeds["position_ids"] = np.array([[127]], np.int64)
    feeds["attention_mask"] = np.ones((1, 128), np.int64)
    feeds["attention_mask"][:, 3:9] = 0
    result = validate(path, feeds, options=RAISE)
    assert result.passed, result.text()
    for call in kernel_nodes(result.details):
        assert [s["op"] for s in json.loads(call["attrs"]["steps"])] == ["scale", "add"]


def test_1024_token_prefill_is_raised_causal_and_validates():
    """1024 > 1007 tokens: raised without lowering the gate, the last 100 positions padding."""
    name = "llama_prefill_1024"
    result = validate(DECODE / f"{name}.onnx", prefill_inputs(name, right=100), options=RAISE)
    assert result.passed, result.text()
    (call,) = kernel_nodes(result.details)
    assert call["attrs"]["custom_call_target"] == CAUSAL
    assert [s["op"] for s in json.loads(call["attrs"]["steps"])] == ["scale", "add", "causal"]


def _machine_against_plain_onnxruntime(feeds: dict, monkeypatch, fix: bool = True) -> np.ndarray:
    """Per query row, the largest |machine − onnxruntime| of the logits of the ORIGINAL
    llama_prefill (2 layers, 128 tokens), raised with the split (and the fix-up unless `fix`
    is off), the kernel's bf16 storage the only cast."""
    monkeypatch.setattr(raising, "MIN_SEQUENCE", 0)
    if not fix:
        monkeypatch.setattr(padding_module.PaddingSplit, "uniform_rows", property(lambda s: False))
    path = DECODE / "llama_prefill.onnx"
    compilation = compile_model(path, replace(RAISE, auto_cast="none"))
    got = run_function(compilation.module, feeds)
    got = got.get("logits", got.get("logits:output"))
    expected = run_onnxruntime(path, feeds)["logits"]
    return np.abs(got - expected).max(axis=-1)


BF16_ROWS = 0.02  # the rows that keep a key: the kernel's bf16 storage (measured ≤ 6e-3)


@pytest.mark.parametrize("left", [10, 128], ids=["left_padded", "all_zero"])
def test_rows_the_padding_masks_entirely_match_the_model(left, monkeypatch):
    """Left padding: the first `left` queries keep no key (all of them for an all-zero mask).
    The model spreads those rows over all keys; the raise's fix-up gives the mean of V there,
    so every row matches onnxruntime on the original model to the kernel's bf16 storage —
    and the same bound rejects the split without the fix-up (the kernel's average over the
    keys up to the row)."""
    feeds = prefill_inputs("llama_prefill", left=left, right=0)
    error = _machine_against_plain_onnxruntime(feeds, monkeypatch)
    assert error.max() < BF16_ROWS, error.max(axis=0)
    old = _machine_against_plain_onnxruntime(feeds, monkeypatch, fix=False)
    assert old[:, :left].max() > BF16_ROWS, old[:, :left].max()
    if left < old.shape[1]:  # the fix-up changes no row that keeps a key
        assert old[:, left:].max() < BF16_ROWS
        np.testing.assert_array_equal(error[:, left:], old[:, left:])
