"""Structural causality (docs/attention.md#structural-causality): a score mask is recognised as
the causal triangle from the subgraph that produces it, whatever its size.

Each form is written as PyTorch's dynamo exporter (torch 2.14, transformers 5.24) writes it —
after its optimizer, which folds the aranges into index constants and leaves the S x S ops —
or as onnx2bir's own folding leaves it. The analysis runs on the unfolded graph at a small
size, and its answer is checked against the mask onnxruntime computes from the same subgraph,
compared with the triangle key > query + (seq_k − seq_q). Near-misses (k = 0, lower instead of
upper, a transposed comparison, a harmless fill, the wrong corner of a cached mask, the
top-left alignment of unequal lengths) must be refused.

End to end: single-head attention at 16384 tokens with Trilu(ones, k=1) → Where(mask, -inf,
scores) — a mask too big to fold — gets the causal target and about half the PE time of the
full block, and the mask's subgraph is gone from the graph; at 2048 tokens, with the folder's
limit lowered so the mask stays a subgraph, the raised block matches onnxruntime.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnx2bir.frontend.folding as folding
from onnx2bir.bir.enums import Engine
from onnx2bir.compiler import compile_model
from onnx2bir.frontend.importer import build_graph, import_model
from onnx2bir.options import CompileOptions
from onnx2bir.patterns.attention.causal import causal_problem
from onnx2bir.patterns.attention.match import _is_causal_mask
from onnx2bir.patterns.attention.raising import LowerToCustomNativeKernel
from onnx2bir.runtime.machine.interpreter import run_function
from onnx2bir.runtime.oracle.compare import compare_output
from onnx2bir.runtime.oracle.ort import run_onnxruntime, synthesize_inputs
from onnx2bir.runtime.timing import cost

RAISE = CompileOptions(
    enable_native_kernel_attention=True, enable_native_kernel_attention_bf16=True
)
CAUSAL, FULL = "CausalAttentionMMSoftmaxMMWithoutSwap", "AttentionMMSoftmaxMMWithoutSwap"
FMIN = float(np.finfo(np.float32).min)
U = 2.0**-8


@dataclass
class Mask:
    """A mask subgraph: nodes and initializers ending in `out`, and the score step reading it:
    `fill` None for an Add, else Where's fill and whether it fills where the condition holds."""

    sq: int
    sk: int
    nodes: list = field(default_factory=list)
    inits: list = field(default_factory=list)
    out: str = ""
    fill: float | None = None
    on_true: bool = True
    count: int = 0

    def const(self, value, dtype=None) -> str:
        name = f"m_c{self.count}"
        self.count += 1
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype), name))
        return name

    def op(self, op_type, *inputs, **attrs) -> str:
        out = f"m_t{self.count}"
        self.count += 1
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], name=out, **attrs))
        self.out = out
        return out

    def where(self, fill, on_true=True) -> Mask:
        self.fill, self.on_true = fill, on_true
        return self

    # --- what exporters write -------------------------------------------------------------
    def full(self, value, dtype, rows=None, cols=None, how="expand") -> str:
        """torch.ones/full((rows, cols)): Expand of a scalar (dynamo) or ConstantOfShape."""
        shape = self.const([rows or self.sq, cols or self.sk], np.int64)
        if how == "expand":
            return self.op("Expand", self.const(value, dtype), shape)
        tensor = numpy_helper.from_array(np.asarray([value], dtype))
        return self.op("ConstantOfShape", shape, value=tensor)

    def trilu(self, x, k, upper) -> str:
        return self.op("Trilu", x, self.const(k, np.int64), upper=int(upper))

    def index(self, axis: str, rank=2, offset=0, how="const") -> str:
        """arange(n) as a row ([n, 1]) or column ([1, n]) index: a constant (what the dynamo
        exporter's optimizer leaves) or Range → Unsqueeze (its raw form)."""
        n = self.sq if axis == "row" else self.sk
        shape = [1] * (rank - 2) + ([n, 1] if axis == "row" else [1, n])
        if how == "const":
            return self.const((np.arange(n) + offset).reshape(shape), np.int64)
        arange = self.op(
            "Range",
            self.const(offset, np.int64),
            self.const(n + offset, np.int64),
            self.const(1, np.int64),
        )
        axes = list(range(rank - 2)) + [rank - 1 if axis == "row" else rank - 2]
        return self.op("Unsqueeze", arange, self.const(axes, np.int64))


def triu_bool(sq, sk=None, k=1, upper=True, how="expand"):
    """torch.triu(torch.ones(S, S, dtype=bool), 1) → masked_fill(mask, -inf)."""
    m = Mask(sq, sk or sq)
    m.trilu(m.full(True, bool, how=how), k, upper)
    return m.where(-np.inf)


FORMS = {}


def form(builder):
    """Register a form that must be recognised: builder(s) gives its mask at s tokens."""
    FORMS[builder.__name__] = builder
    return builder


form(triu_bool)


@form
def triu_bool_fill(s):
    return triu_bool(s, s, how="fill")


@form
def tril_eq0(s):
    """masked_fill(torch.tril(torch.ones(S, S)) == 0, finfo.min)"""
    m = Mask(s, s)
    m.op("Equal", m.trilu(m.full(1.0, np.float32), 0, False), m.const(0.0, np.float32))
    return m.where(FMIN)


@form
def tril_not(s):
    """masked_fill(~torch.tril(torch.ones(S, S, dtype=bool)), -inf)"""
    m = Mask(s, s)
    m.op("Not", m.trilu(m.full(True, bool), 0, False))
    return m.where(-np.inf)


@form
def tril_keep(s):
    """torch.where(tril, scores, finfo.min): the fill on the false branch"""
    m = Mask(s, s)
    m.trilu(m.full(True, bool), 0, False)
    return m.where(FMIN, on_true=False)


@form
def triu_add(s):
    """scores + torch.triu(torch.full((S, S), -inf), 1)"""
    m = Mask(s, s)
    m.trilu(m.full(-np.inf, np.float32), 1, True)
    return m


@form
def one_minus_tril_add(s):
    """scores + (1 - tril(ones)) * finfo.min"""
    m = Mask(s, s)
    tril = m.trilu(m.full(1.0, np.float32, how="fill"), 0, False)
    m.op("Mul", m.op("Sub", m.const(1.0, np.float32), tril), m.const(FMIN, np.float32))
    return m


@form
def range_gt(s):
    """masked_fill(arange[None, :] > arange[:, None], -inf)"""
    m = Mask(s, s)
    m.op("Greater", m.index("col"), m.index("row"))
    return m.where(-np.inf)


@form
def range_gt_raw(s):
    """the same, unoptimized: Range → Unsqueeze"""
    m = Mask(s, s)
    m.op("Greater", m.index("col", how="range"), m.index("row", how="range"))
    return m.where(-np.inf)


@form
def range_le_add(s):
    """scores + where(arange[None, :] <= arange[:, None], 0, -inf)"""
    m = Mask(s, s)
    le = m.op("LessOrEqual", m.index("col"), m.index("row"))
    m.op("Where", le, m.const(0.0, np.float32), m.const(-np.inf, np.float32))
    return m


@form
def range_ge_add(s):
    """scores + where(row >= col, 0, -inf)"""
    m = Mask(s, s)
    ge = m.op("GreaterOrEqual", m.index("row"), m.index("col"))
    m.op("Where", ge, m.const(0.0, np.float32), m.const(-np.inf, np.float32))
    return m


@form
def range_less(s):
    """masked_fill(row < col, -inf)"""
    m = Mask(s, s)
    m.op("Less", m.index("row"), m.index("col"))
    return m.where(-np.inf)


@form
def llama_eager(s):
    """transformers' eager Llama mask without attention_mask: and_masks(causal, batch-index
    equality), as Where(..., 0, finfo.min) added to the scores"""
    m = Mask(s, s)
    le = m.op("LessOrEqual", m.index("col", rank=4), m.index("row", rank=4))
    causal = m.op("And", m.const(True, bool), le)
    zeros_row = m.const(np.zeros((1, 1, s, 1)), np.int64)
    same = m.op("Equal", zeros_row, m.const(np.zeros((1, 1, 1, s)), np.int64))
    both = m.op("And", causal, same)
    m.op("Where", both, m.const(0.0, np.float32), m.const(FMIN, np.float32))
    return m


def cached(sq, sk, start, rows, cols):
    """GPT-2's cached max-length mask, a constant: bias[:, :, start:start+rows, :cols]"""
    m = Mask(sq, sk)
    bias = np.tril(np.ones((2 * sk, 2 * sk), bool)).reshape(1, 1, 2 * sk, 2 * sk)
    starts, ends = m.const([start, 0], np.int64), m.const([start + rows, cols], np.int64)
    m.op("Slice", m.const(bias, bool), starts, ends, m.const([2, 3], np.int64))
    return m.where(FMIN, on_true=False)


@form
def cached_slice(s):
    return cached(s, s, 0, s, s)


@form
def cached_trilu_slice(s):
    """the cached mask built at run time: tril(ones(2S, 2S))[:S, :S]"""
    m = Mask(s, s)
    big = m.trilu(m.full(True, bool, 2 * s, 2 * s), 0, False)
    m.op("Slice", big, m.const([0, 0], np.int64), m.const([s, s], np.int64))
    return m.where(FMIN, on_true=False)


@form
def cast_not_unsqueeze_expand(s):
    """Cast, Not, Unsqueeze and Expand to [1, 2, S, S] on the way"""
    m = Mask(s, s)
    tril = m.trilu(m.full(1.0, np.float32), 0, False)
    cond = m.op("Not", m.op("Cast", tril, to=TensorProto.BOOL))
    cond = m.op("Unsqueeze", cond, m.const([0, 1], np.int64))
    m.op("Expand", cond, m.const([1, 2, s, s], np.int64))
    return m.where(-np.inf)


@form
def reshape_add(s):
    """a Reshape to [1, 1, S, S] of an additive triangle"""
    m = Mask(s, s)
    tri = m.trilu(m.full(-1e9, np.float32), 1, True)
    m.op("Reshape", tri, m.const([1, 1, s, s], np.int64))
    return m


@form
def transposed_tril(s):
    """the transpose of a strict lower triangle is the strict upper one"""
    m = Mask(s, s)
    m.op("Transpose", m.trilu(m.full(True, bool), -1, False), perm=[1, 0])
    return m.where(-np.inf)


@form
def unequal_trilu(s):
    """unequal lengths: the diagonal at the bottom right, triu(ones(q, k), 1 + k - q)"""
    sq, sk = s // 2, s
    m = Mask(sq, sk)
    m.trilu(m.full(True, bool), 1 + sk - sq, True)
    return m.where(-np.inf)


@form
def unequal_range(s):
    sq, sk = s // 2, s
    m = Mask(sq, sk)
    m.op("Greater", m.index("col"), m.index("row", offset=sk - sq))
    return m.where(-np.inf)


@form
def unequal_cached_slice(s):
    """bias[:, :, k-q:k, :k]"""
    return cached(s // 2, s, s - s // 2, s // 2, s)


def near_misses(s: int) -> dict[str, tuple[Mask, str]]:
    """Forms that must be refused, with a fragment of the reason."""
    out = {
        "k0": (triu_bool(s, s, k=0), "masks key − query = 0"),
        "lower": (triu_bool(s, s, upper=False), "masks key − query = "),
    }
    m = Mask(s, s)
    m.op("Greater", m.index("row"), m.index("col"))
    out["transposed_compare"] = (m.where(-np.inf), "masks key − query = ")
    out["fill_zero"] = (triu_bool(s, s).where(0.0), "not a masking value")
    out["fill_positive"] = (triu_bool(s, s).where(1e4), "not a masking value")
    m = Mask(s, s)
    m.trilu(m.full(-1.0, np.float32), 1, True)
    out["add_minus_one"] = (m, "leaves key − query = 1 unmasked")

    # a cached mask sliced one row down: bias[1:S+1, :S]
    out["wrong_corner"] = (cached(s, s, 1, s, s), "leaves key − query = 1 unmasked")

    sq, sk = s // 2, s
    # bias[:, :, :q, :k]: the top-left corner, wrong for q < k
    out["unequal_top_left_slice"] = (cached(sq, sk, 0, sq, sk), "masks key − query = 1")
    m = Mask(sq, sk)  # triu(ones(q, k), 1): ONNX's top-left alignment
    m.trilu(m.full(True, bool), 1, True)
    out["unequal_wrong_offset"] = (m.where(-np.inf), f"causal mask masks key − query > {sk - sq}")

    m = Mask(s, s)  # a band: two triangles
    upper = m.trilu(m.full(True, bool), 1, True)
    lower = m.trilu(m.full(True, bool), -2, False)
    m.op("Or", upper, m.op("Not", lower))
    out["band"] = (m.where(-np.inf), "masks key − query = -")

    m = Mask(s, s)
    m.op("Greater", m.index("col"), m.op("Mul", m.index("row"), m.const(2, np.int64)))
    out["not_key_minus_query"] = (m.where(-np.inf), "not a function of key − query")

    m = Mask(s, s)  # a different triangle per head
    heads = np.stack([np.triu(np.ones((s, s), bool), 1), np.triu(np.ones((s, s), bool), 2)])
    m.op("Identity", m.const(heads[None], bool))
    out["per_head"] = (m.where(-np.inf), "differs along a leading dim")
    return out


# --- the analysis against onnxruntime -----------------------------------------------------------
def mask_model(mask: Mask) -> onnx.ModelProto:
    graph = helper.make_graph(
        mask.nodes, "mask", [], [helper.make_tensor_value_info(mask.out, 0, None)], mask.inits
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    return onnx.shape_inference.infer_shapes(model, data_prop=True)


def analyse(mask: Mask) -> str | None:
    """The structural answer on the graph as built: nothing folded."""
    graph = build_graph(mask_model(mask), "mask")
    return causal_problem(graph, mask.out, mask.sq, mask.sk, mask.fill, mask.on_true)


def is_causal_by_value(mask: Mask) -> bool:
    """The mask onnxruntime computes, compared with the triangle."""
    (value,) = run_onnxruntime(mask_model(mask), {}).values()
    shape = (*value.shape[:-2], mask.sq, mask.sk)
    value = np.broadcast_to(value, np.broadcast_shapes(value.shape, shape))
    if mask.fill is None:
        return _is_causal_mask(value, mask.sq, mask.sk)
    masked = value.astype(bool) if mask.on_true else ~value.astype(bool)
    above = np.arange(mask.sk)[None, :] > np.arange(mask.sq)[:, None] + (mask.sk - mask.sq)
    return bool(mask.fill <= -1e4 and np.all(masked == above))


@pytest.mark.parametrize("size", [8, 64])
@pytest.mark.parametrize("name", list(FORMS))
def test_form_is_recognised_and_onnxruntime_agrees(name, size):
    mask = FORMS[name](size)
    assert is_causal_by_value(mask), "the test's form is not causal"
    assert analyse(mask) is None


@pytest.mark.parametrize("size", [8, 64])
@pytest.mark.parametrize("name", list(near_misses(8)))
def test_near_miss_is_refused_and_onnxruntime_agrees(name, size):
    mask, reason = near_misses(size)[name]
    assert not is_causal_by_value(mask), "the test's near-miss is causal"
    problem = analyse(mask)
    assert problem is not None and reason in problem, problem


def test_a_runtime_operand_is_not_structural():
    """The transformers Llama mask with an attention_mask input: padding read at run time."""
    m = Mask(8, 8)
    le = m.op("LessOrEqual", m.index("col", rank=4), m.index("row", rank=4))
    padding = m.op("Cast", m.op("Unsqueeze", "am", m.const([1, 2], np.int64)), to=TensorProto.BOOL)
    m.op("Where", m.op("And", le, padding), m.const(0.0, np.float32), m.const(FMIN, np.float32))
    model = mask_model(m)
    model.graph.input.append(helper.make_tensor_value_info("am", TensorProto.INT64, [1, 8]))
    model = onnx.shape_inference.infer_shapes(model)
    problem = causal_problem(build_graph(model, "mask"), m.out, 8, 8)
    assert problem.startswith("not structural: Unsqueeze ")
    assert problem.endswith(": reads the graph input 'am'")


# --- end to end ---------------------------------------------------------------------------------
def attention(seq: int, mask: Mask | None, head_dim: int = 128) -> onnx.ModelProto:
    """Single-head attention, q/k/v [1, 1, seq, head_dim], with the mask as its score step."""
    nodes = [
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q", "kt"], ["qk"]),
        helper.make_node("Mul", ["qk", "scale"], ["scores"]),
    ]
    inits = [numpy_helper.from_array(np.array(head_dim**-0.5, np.float32), "scale")]
    scores = "scores"
    if mask is not None:
        nodes += mask.nodes
        inits += mask.inits
        if mask.fill is None:
            nodes.append(helper.make_node("Add", [scores, mask.out], ["masked"]))
        else:
            fill = numpy_helper.from_array(np.array(mask.fill, np.float32), "fill")
            inits.append(fill)
            branches = ["fill", scores] if mask.on_true else [scores, "fill"]
            nodes.append(helper.make_node("Where", [mask.out, *branches], ["masked"]))
        scores = "masked"
    nodes += [
        helper.make_node("Softmax", [scores], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["y"]),
    ]
    shape = [1, 1, seq, head_dim]
    graph = helper.make_graph(
        nodes,
        "attention",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in "qkv"],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


def compiled(seq: int, mask: Mask | None):
    start = time.perf_counter()
    compilation = compile_model(attention(seq, mask), RAISE)
    seconds = time.perf_counter() - start
    (entry,) = compilation.passes.result_of("LowerToCustomNativeKernel").findings
    pe = cost.estimate(compilation.module).busy_seconds[Engine.PE]
    return compilation, entry, pe, seconds


@functools.cache
def full_block(seq: int) -> tuple[str, float]:
    """The target and PE time of the same block without a mask."""
    _, entry, pe, _ = compiled(seq, None)
    return entry["target"], pe


def check_causal_block(seq: int, name: str) -> None:
    mask = FORMS[name](seq)
    assert seq * seq > folding._FOLD_MAX_ELEMENTS  # the mask does not fold
    full_target, full_pe = full_block(seq)
    compilation, entry, pe, _ = compiled(seq, mask)
    assert full_target == FULL
    assert entry["target"] == CAUSAL, entry
    assert "(structural)" in entry["variant"]
    assert pe <= 0.55 * full_pe, (pe, full_pe)
    # The mask's subgraph is gone: the kernel masks itself, nothing computes the S x S mask.
    graph = compilation.graph
    assert dict(graph.op_counts()) == {"Cast": 4, "Transpose": 1, "CustomCall": 1}
    (call,) = [d for _, d in graph.nodes() if d["op_type"] == "CustomCall"]
    assert len(call["inputs"]) == 3
    assert all(v.size < seq * seq for v in compilation.module.constants.values())


@pytest.mark.parametrize("name", ["triu_bool", "range_gt", "llama_eager", "triu_add"])
def test_16384_tokens_causal_mask_too_big_to_fold_gets_the_causal_target(name):
    check_causal_block(16384, name)


@pytest.mark.slow
def test_32768_tokens_causal_mask_gets_the_causal_target():
    check_causal_block(32768, "triu_bool")


def test_4096_tokens_folded_mask_keeps_the_constant_path():
    """At 4096 tokens the triangle folds: recognised as a constant, and no longer an input of
    the CustomCall."""
    compilation, entry, _, _ = compiled(4096, triu_bool(4096))
    assert entry["target"] == CAUSAL and "(constant)" in entry["variant"]
    (call,) = [d for _, d in compilation.graph.nodes() if d["op_type"] == "CustomCall"]
    assert len(call["inputs"]) == 3


@pytest.mark.parametrize("name", ["triu_bool", "llama_eager"])
def test_2048_tokens_structural_causal_block_matches_onnxruntime(name, monkeypatch):
    """The folder's limit lowered below 2048², so the mask stays a subgraph and the structural
    path decides; the raised block runs on the machine against onnxruntime within the bf16
    bound of tests/kernels/test_attention_long.py."""
    seq, head_dim = 2048, 32
    monkeypatch.setattr(folding, "_FOLD_MAX_ELEMENTS", 1 << 20)
    model = attention(seq, FORMS[name](seq), head_dim)
    compilation = compile_model(model, RAISE)
    (entry,) = compilation.passes.result_of("LowerToCustomNativeKernel").findings
    assert entry["target"] == CAUSAL and "(structural)" in entry["variant"], entry
    feeds = synthesize_inputs(compilation.graph, 0)
    got = run_function(compilation.module, feeds)
    got = got["y"] if "y" in got else got["y:output"]
    expected = run_onnxruntime(model, feeds)["y"]
    result = compare_output("y", got, expected, 2 * U * np.abs(feeds["v"]).max(), 2 * U)
    assert result.passed, result.to_json()


def test_16384_tokens_near_miss_keeps_the_full_target_and_says_why():
    """triu(ones, 0) masks the diagonal too: not causal, and the finding says why."""
    graph = import_model(attention(16384, triu_bool(16384, k=0)))
    (entry,) = LowerToCustomNativeKernel().run(graph, RAISE).findings
    assert entry["target"] == FULL
    assert "not the causal triangle: masks key − query = 0" in entry["variant"]
    assert "Trilu" in graph.op_counts()  # not raised as causal: the mask stays
