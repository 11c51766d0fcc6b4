"""Graph-building helpers for DecomposeAttention (docs/attention.md#decompose): the plain-ONNX
spelling of matmul → stable softmax → matmul, staged node by node for one attention root.

In: a Graph, the name of the root being replaced and the ops that have a generic lowering.
Out: an `Emitter` holding staged nodes named "<root>/decomposed/<part>" and their tensors,
written into the graph by `commit` only once the expansion is complete; `Unsupported`, whose
message is the reason shown to users, when a root cannot be expanded. `emit_core` stages

    S = MatMul(Q, Kᵀ) → Mul/Div(scale) → masks (Add of a bias, Where for a masked fill)
    m = ReduceMax(S, axis −1, keepdims)            the reference's rowmax (MAXIMUM reduce)
    P = Exp(S − m) / ReduceSum(Exp(S − m), axis −1, keepdims)
    Y = MatMul(P, V)

the numerically stable softmax of docs/attention.md#decompose. Where a query row can be fully masked
(ONNX's Attention spec gives such a row a zero output, and the NaN guard `nan_to_zero` zeroes it),
the row max is floored at the lowest finite value and the row sum at the smallest normal, as the
reference's `rowmax = MakeBinaryHlo(MAXIMUM, rowmax2, …)` after the reduces: an all −inf row then
gives exp(−inf) = 0 over a sum of `tiny`, i.e. zeros, and every other row is unchanged (its max is
finite and its sum ≥ 1). A masked fill with a constant condition folds into constants
(`_masked_fill`); `causal_bias` is the constant causal triangle.

Heads (`Heads`, `split_heads`, `merge_heads`, `group_shape`): grouped-query heads are laid out
as Q [B, Hkv, r, S, D] against K/V [B, Hkv, 1, …]: MatMul's broadcasting gives query head h
the key/value head h // r (the spec's interleaved repeat) without copying K or V.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import ml_dtypes
import numpy as np

from onnx2bir.bir.enums import Dtype
from onnx2bir.graph import Graph, TensorInfo

# Opset from which a reduction takes its axes as an input rather than an attribute.
_AXES_INPUT_SINCE = {"ReduceSum": 13, "ReduceMax": 18}


class Unsupported(Exception):
    """A root this pass leaves in place; the message is the reason shown to users."""


def broadcast(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        raise Unsupported(f"shapes {', '.join(map(str, shapes))} do not broadcast") from None


@dataclass
class Emitter:
    """Stages the replacement of one root; `commit` applies it only when it is complete."""

    graph: Graph
    root: str
    available: frozenset[str]
    nodes: list[tuple[str, str, list[str], list[str], dict]] = field(default_factory=list)
    tensors: dict[str, TensorInfo] = field(default_factory=dict)
    remove: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    stage: str = "decomposed"  # node names are "<root>/<stage>/<part>" ("<root>/<part>" if "")
    expect: tuple[bool, bool] = (False, False)  # the staged core has (a mask, a scale)

    # --- queries -------------------------------------------------------------------------
    def info(self, tensor: str) -> TensorInfo:
        return self.tensors.get(tensor) or self.graph.tensors[tensor]

    def shape(self, tensor: str) -> tuple[int, ...]:
        return tuple(self.info(tensor).shape)

    def const_value(self, tensor: str) -> np.ndarray | None:
        return self.info(tensor).const

    def has(self, *ops: str) -> bool:
        return all(op in self.available for op in ops)

    def require(self, op: str, why: str) -> None:
        if op not in self.available:
            raise Unsupported(f"{why} needs {op}, which has no generic lowering")

    # --- staging -------------------------------------------------------------------------
    def _name(self, part: str) -> str:
        base = f"{self.root}/{self.stage}/{part}" if self.stage else f"{self.root}/{part}"
        name, index = base, 1
        while name in self.tensors or name in self.graph.tensors or name in self.graph.nx:
            name, index = f"{base}_{index}", index + 1
        return name

    def const(self, part: str, value: np.ndarray) -> str:
        name = self._name(part)
        value = np.asarray(value)
        self.tensors[name] = TensorInfo(name, value.shape, Dtype.from_numpy(value.dtype), value)
        return name

    def scalar(self, part: str, value: float, dtype: Dtype) -> str:
        return self.const(part, np.asarray(value, dtype=dtype.numpy))

    def node(
        self,
        op_type: str,
        part: str,
        inputs: list[str],
        shape: tuple[int, ...],
        dtype: Dtype | None = None,
        **attrs,
    ) -> str:
        name = self._name(part)
        dtype = dtype or self.info(inputs[0]).dtype
        self.tensors[name] = TensorInfo(name, tuple(shape), dtype)
        self.nodes.append((name, op_type, list(inputs), [name], attrs))
        return name

    def binary(self, op_type: str, part: str, a: str, b: str) -> str:
        shape = broadcast(self.shape(a), self.shape(b))
        return self.node(op_type, part, [a, b], shape, self.info(a).dtype)

    def unary(self, op_type: str, part: str, x: str) -> str:
        return self.node(op_type, part, [x], self.shape(x))

    def matmul(self, part: str, a: str, b: str) -> str:
        (sa, sb) = self.shape(a), self.shape(b)
        if sa[-1] != sb[-2]:
            raise Unsupported(f"{part}: contraction {sa} x {sb} does not match")
        batch = broadcast(sa[:-2], sb[:-2])
        return self.node("MatMul", part, [a, b], (*batch, sa[-2], sb[-1]))

    def reshape(self, part: str, x: str, shape: tuple[int, ...]) -> str:
        if self.shape(x) == tuple(shape):
            return x
        if math.prod(self.shape(x)) != math.prod(shape):
            raise Unsupported(f"cannot reshape {self.shape(x)} to {tuple(shape)}")
        value = self.const_value(x)
        if value is not None:
            return self.const(part, value.reshape(shape))
        target = self.const(f"{part}_shape", np.asarray(shape, dtype=np.int64))
        return self.node("Reshape", part, [x, target], tuple(shape))

    def take(self, part: str, x: str, start: int, stop: int) -> str:
        """x[..., start:stop]: sliced by numpy when x is a constant, by Slice otherwise."""
        value = self.const_value(x)
        if value is not None:
            return self.const(part, value[..., start:stop])
        self.require("Slice", f"splitting the runtime tensor {x!r}")
        bounds = [
            self.const(f"{part}_{what}", np.asarray([bound], dtype=np.int64))
            for what, bound in (("starts", start), ("ends", stop), ("axes", -1))
        ]
        return self.node("Slice", part, [x, *bounds], (*self.shape(x)[:-1], stop - start))

    def transpose(self, part: str, x: str, perm: tuple[int, ...]) -> str:
        shape = self.shape(x)
        return self.node("Transpose", part, [x], tuple(shape[p] for p in perm), perm=list(perm))

    def reduce(self, op_type: str, part: str, x: str) -> str:
        shape = (*self.shape(x)[:-1], 1)
        if self.graph.opset >= _AXES_INPUT_SINCE[op_type]:
            axes = self.const(f"{part}_axes", np.asarray([-1], dtype=np.int64))
            return self.node(op_type, part, [x, axes], shape, keepdims=1)
        return self.node(op_type, part, [x], shape, axes=[-1], keepdims=1)

    # --- commit --------------------------------------------------------------------------
    def finish(self, staged: str, output: str) -> None:
        """Make the staged value `staged` the root's output tensor `output`."""
        want = self.graph.tensors[output]
        got = self.info(staged)
        if tuple(got.shape) != tuple(want.shape) or got.dtype is not want.dtype:
            raise Unsupported(
                f"internal: the expansion gives {got.shape} {got.dtype}, the root "
                f"writes {want.shape} {want.dtype}"
            )
        del self.tensors[staged]
        self.nodes = [
            (
                name,
                op,
                [output if t == staged else t for t in ins],
                [output if t == staged else t for t in outs],
                attrs,
            )
            for name, op, ins, outs, attrs in self.nodes
        ]

    def missing_ops(self) -> list[str]:
        return sorted({op for _, op, _, _, _ in self.nodes} - self.available)

    def commit(self) -> None:
        graph = self.graph
        orphans = {
            t
            for node in self.remove
            for t in (*graph.node(node)["inputs"], *graph.node(node)["outputs"])
        }
        for node in self.remove:
            graph.remove_node(node)
        graph.tensors.update(self.tensors)
        for name, op_type, inputs, outputs, attrs in self.nodes:
            graph.add_node(name, op_type, inputs, outputs, attrs)
        for tensor in orphans:
            if (
                tensor
                and tensor not in graph.producers
                and not graph.uses.get(tensor)
                and tensor not in graph.inputs
                and tensor not in graph.outputs
            ):
                graph.tensors.pop(tensor, None)


# --- the shared core --------------------------------------------------------------------------
def lowest(dtype: Dtype) -> float:
    return float(ml_dtypes.finfo(dtype.numpy).min)


def causal_bias(
    seq_q: int, seq_k: int, offset: int, dtype: Dtype, fill: float = -np.inf
) -> np.ndarray:
    """[seq_q, seq_k]: 0 where query i may see key j (j ≤ i + offset), `fill` elsewhere."""
    allowed = np.arange(seq_k)[None, :] <= np.arange(seq_q)[:, None] + offset
    return np.where(allowed, 0.0, fill).astype(dtype.numpy)


def emit_core(
    em: Emitter,
    q: str,
    kt: str,
    v: str,
    steps: list[tuple],
    guard: bool = False,
    nan_to_zero: bool = False,
) -> str:
    """MatMul → score steps → stable softmax → MatMul. Steps: ("scale"|"divide", value),
    ("softcap", value), ("add", tensor), ("fill", condition, value, fill_on_true)."""
    x = em.matmul("qk", q, kt)
    dtype = em.info(x).dtype
    kinds = {step[0] for step in steps}
    em.expect = (bool(kinds & {"add", "fill"}), bool(kinds & {"scale", "divide", "softcap"}))
    for index, step in enumerate(steps):
        kind = step[0]
        if kind in ("scale", "divide"):
            op = "Mul" if kind == "scale" else "Div"
            x = em.binary(op, kind, x, em.scalar(f"{kind}_value", step[1], dtype))
        elif kind == "softcap":
            em.require("Tanh", "softcap")
            cap = em.scalar("softcap_value", step[1], dtype)
            x = em.binary(
                "Mul",
                "softcap",
                em.unary("Tanh", "softcap_tanh", em.binary("Div", "softcap_div", x, cap)),
                cap,
            )
        elif kind == "add":
            x = em.binary("Add", f"bias{index}", x, step[1])
        elif kind == "fill":
            x = _masked_fill(em, index, x, *step[1:])
        else:
            raise Unsupported(f"unknown score step {kind!r}")
    if nan_to_zero:
        # Softmax is NaN on a fully masked (all −inf) row; the guard makes that row 0 with
        # arithmetic alone. It is needed even with Where: the generic Where is a min/max select
        # that lets a NaN through from the branch it does not take.
        guard = True
        if not em.has("IsNaN", "Where"):
            em.notes.append(
                "nan_to_zero realised by the fully-masked-row guard alone (IsNaN/Where have no "
                "lowering); differs only where the scores hold NaN or +inf"
            )
            nan_to_zero = False
    rowmax = em.reduce("ReduceMax", "rowmax", x)
    if guard:
        rowmax = em.binary("Max", "rowmax_floor", rowmax, em.scalar("lowest", lowest(dtype), dtype))
    exp = em.unary("Exp", "exp", em.binary("Sub", "shift", x, rowmax))
    total = em.reduce("ReduceSum", "rowsum", exp)
    if guard:
        tiny = float(ml_dtypes.finfo(dtype.numpy).tiny)
        total = em.binary("Max", "rowsum_floor", total, em.scalar("tiny", tiny, dtype))
    probs = em.binary("Div", "probs", exp, total)
    if nan_to_zero:
        isnan = em.node("IsNaN", "isnan", [probs], em.shape(probs), Dtype.BOOL)
        probs = em.node(
            "Where",
            "nan_to_zero",
            [isnan, em.scalar("zero", 0.0, dtype), probs],
            em.shape(probs),
            dtype,
        )
    return em.matmul("pv", probs, v)


def _masked_fill(
    em: Emitter, index: int, x: str, cond: str, value: float, fill_on_true: bool
) -> str:
    """`Where(cond, value, x)` (or with the roles swapped); a constant `cond` folds into
    constants so no Where is needed: x + fill for an infinite fill, else x·keep + fill."""
    dtype = em.info(x).dtype
    mask = em.const_value(cond)
    if mask is not None:
        filled = mask.astype(bool) if fill_on_true else ~mask.astype(bool)
        fill = np.where(filled, value, 0.0).astype(dtype.numpy)
        if not math.isinf(value):
            keep = em.const(f"keep{index}", (~filled).astype(dtype.numpy))
            x = em.binary("Mul", f"keep{index}", x, keep)
        return em.binary("Add", f"fill{index}", x, em.const(f"fill{index}_value", fill))
    em.require("Where", "a masked fill with a runtime condition")
    fill = em.scalar(f"fill{index}_value", value, dtype)
    inputs = [cond, fill, x] if fill_on_true else [cond, x, fill]
    shape = broadcast(em.shape(cond), em.shape(x))
    return em.node("Where", f"fill{index}", inputs, shape, dtype)


# --- heads -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Heads:
    """Head layout of one attention: query heads grouped as (kv heads, group) when r > 1."""

    batch: int
    q_heads: int
    kv_heads: int
    seq_q: int
    seq_k: int
    head: int
    v_head: int

    @property
    def group(self) -> int:
        return self.q_heads // self.kv_heads

    @property
    def q_dims(self) -> tuple[int, ...]:
        return (self.kv_heads, self.group) if self.group > 1 else (self.q_heads,)

    @property
    def kv_dims(self) -> tuple[int, ...]:
        return (self.kv_heads, 1) if self.group > 1 else (self.kv_heads,)


def split_heads(
    em: Emitter, tensor: str, role: str, h: Heads, dims: tuple[int, ...], seq: int, size: int
) -> str:
    """[B, H, S, d] or [B, S, H·d] → [B, *dims, S, d] ([B, *dims, d, S] for role "k")."""
    n = len(dims)
    if len(em.shape(tensor)) == 4:
        x = em.reshape(f"{role}_groups", tensor, (h.batch, *dims, seq, size))
        if role != "k":
            return x
        rank = n + 3
        return em.transpose("kt", x, (*range(rank - 2), rank - 1, rank - 2))
    x = em.reshape(f"{role}_split", tensor, (h.batch, seq, *dims, size))
    heads = tuple(range(2, 2 + n))
    perm = (0, *heads, 2 + n, 1) if role == "k" else (0, *heads, 1, 2 + n)
    return em.transpose("kt" if role == "k" else f"{role}_heads", x, perm)


def merge_heads(em: Emitter, out: str, h: Heads, rank: int) -> str:
    """[B, *q_dims, Sq, Dv] → the root's [B, Hq, Sq, Dv] or [B, Sq, Hq·Dv]."""
    if rank == 4:
        return em.reshape("y_heads", out, (h.batch, h.q_heads, h.seq_q, h.v_head))
    n = len(h.q_dims)
    x = em.transpose("y_merge", out, (0, n + 1, *range(1, n + 1), n + 2))
    return em.reshape("y", x, (h.batch, h.seq_q, h.q_heads * h.v_head))


def group_shape(shape: tuple[int, ...], h: Heads) -> tuple[int, ...]:
    """A shape broadcastable to [B, Hq, Sq, T] → one broadcastable to [B, *q_dims, Sq, T]."""
    if h.group == 1 or len(shape) <= 2:
        return tuple(shape)
    b, heads, sq, t = (1,) * (4 - len(shape)) + tuple(shape)
    return (b, *((1, 1) if heads == 1 else (h.kv_heads, h.group)), sq, t)
