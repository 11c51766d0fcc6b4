"""The attention CustomCall's operands and attributes, read and checked for the attention
kernel (docs/attention.md#attention-raise).

In: the code generator and a CustomCall node with inputs [q, kt, v, *extra] and the attributes
`steps` and `post_steps` (JSON lists, the vocabulary in `attention_kernel`'s docstring) and
`storage_dtype`. Out: `AttentionArgs` — the DRAM location names; Sq, Sk, D, Dv; the batch dims
(unit dims dropped, contiguous neighbours merged) with each operand's element strides along
them, in the order out, q, kt, v, extras; each extra input's strides along a score row and a
key; the parsed steps; whether the NaN guard is on; the storage, score and output dtypes; the
tile sizes from the node's `backend_config` (`sb_shape` = [query rows per group, keys per tile,
bytes per partition], bounded by `psum_shape`; the defaults of `attention_plan.tile_sizes`
when absent) and whether everything is cast (`auto_cast` "all": the scores are held in the
storage dtype too). A node that breaks the contract fails through `cg.fail` with the reason.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from onnx2bir.bir.enums import Dtype
from onnx2bir.codegen.driver import BirCodeGen
from onnx2bir.codegen.tiling import broadcast_strides, merge_broadcast_dims
from onnx2bir.graph import Node
from onnx2bir.kernels.attention import ATTENTION
from onnx2bir.kernels.attention.plan import MAX_K_TILE, MAX_Q_ROWS, tile_sizes

STORAGE_DTYPES = {"float32": Dtype.FP32, "bfloat16": Dtype.BF16, "float16": Dtype.FP16}
OUT, Q, KT, V = range(4)  # operand order in offsets and strides; extras follow


@dataclass(frozen=True)
class Step:
    op: str  # scale | divide | add | masked_fill | causal
    value: float = 0.0
    input: int = -1
    fill_on_true: bool = True


@dataclass(frozen=True)
class Extra:
    """An extra input broadcast to [..., Sq, Sk]: its element strides along a row and a key."""

    name: str
    row_stride: int
    col_stride: int
    is_bool: bool


SWAP_TARGET = ATTENTION  # the target whose first matmul swaps operand roles


@dataclass(frozen=True)
class AttentionArgs:
    q: str  # DRAM location names
    kt: str
    v: str
    out: str
    sq: int
    sk: int
    d: int
    dv: int
    dims: tuple[int, ...]  # batch dims, unit dims dropped and contiguous neighbours merged
    strides: tuple[tuple[int, ...], ...]  # per operand (out, q, kt, v, *extras) along dims
    extras: tuple[Extra, ...]
    steps: tuple[Step, ...]
    guard: bool
    storage: Dtype
    out_dtype: Dtype
    q_rows: int = 128  # query rows per group (partitions of the score tile)
    k_tile: int = 512  # keys per online-softmax step
    score_dtype: Dtype = Dtype.FP32
    swap: bool = False  # QKᵀ with the K tile stationary and Q moving (the swap target)

    @property
    def kv_depth(self) -> int:
        """The batch depth at which K and V are loaded: outside the dims they broadcast over."""
        depth = len(self.dims)
        while depth and self.strides[KT][depth - 1] == 0 and self.strides[V][depth - 1] == 0:
            depth -= 1
        return depth


def json_list(cg: BirCodeGen, attrs: dict, key: str) -> list:
    try:
        raw = json.loads(attrs.get(key) or "[]")
    except json.JSONDecodeError as exc:
        raise cg.fail(f"attr {key} is not JSON: {exc}") from None
    if not isinstance(raw, list):
        raise cg.fail(f"attr {key} is not a JSON list: {raw!r}")
    return raw


def parse_steps(cg: BirCodeGen, attrs: dict, n_extra: int) -> tuple[Step, ...]:
    steps = []
    for item in json_list(cg, attrs, "steps"):
        op = item.get("op") if isinstance(item, dict) else None
        if op in ("scale", "divide"):
            steps.append(Step(op, float(item["value"])))
        elif op in ("add", "masked_fill"):
            index = item.get("input")
            if not isinstance(index, int) or not 0 <= index < n_extra:
                raise cg.fail(f"step {item!r} names extra input {index!r}; the node has {n_extra}")
            steps.append(
                Step(op, float(item.get("value", 0.0)), index, bool(item.get("fill_on_true", True)))
            )
        elif op == "causal":
            steps.append(Step(op))
        else:
            raise cg.fail(f"unknown score step {item!r}")
    return tuple(steps)


def parse_guard(cg: BirCodeGen, attrs: dict) -> bool:
    raw = json_list(cg, attrs, "post_steps")
    ops = [item.get("op") if isinstance(item, dict) else item for item in raw]
    if any(op != "nan_to_zero" for op in ops):
        raise cg.fail(f"unsupported post_steps {raw!r} (only nan_to_zero)")
    return bool(ops)


def tile_config(cg: BirCodeGen, attrs: dict, sq: int, sk: int) -> tuple[int, int, bool]:
    """(query rows, keys per tile, cast all) from the backend_config, checked."""
    raw = attrs.get("backend_config") or "{}"
    try:
        config = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise cg.fail(f"backend_config is not JSON: {exc}") from None
    if not isinstance(config, dict):
        raise cg.fail(f"backend_config is not a JSON object: {raw!r}")
    q_rows, k_tile = tile_sizes(sq, sk)
    psum = config.get("psum_shape") or [MAX_Q_ROWS, MAX_K_TILE]
    shape = config.get("sb_shape")
    if shape:
        if not (
            isinstance(shape, list) and len(shape) >= 2 and all(isinstance(v, int) for v in shape)
        ):
            raise cg.fail(f"sb_shape {shape!r} is not a list of ints")
        q_rows, k_tile = min(shape[0], sq), min(shape[1], sk)
    limit_q, limit_k = min(MAX_Q_ROWS, psum[0]), min(MAX_K_TILE, psum[1])
    if not (1 <= q_rows <= limit_q and 1 <= k_tile <= limit_k):
        raise cg.fail(
            f"sb_shape tiles {q_rows} x {k_tile} exceed the PSUM tile {limit_q} x {limit_k}"
        )
    return q_rows, k_tile, config.get("auto_cast") == "all"


def attention_args(cg: BirCodeGen, node: Node) -> AttentionArgs:
    attrs = node.attrs
    q, kt, v, *extra_names = node.inputs
    out = node.outputs[0]
    shape = {name: tuple(cg.graph.tensors[name].shape) for name in (q, kt, v, out, *extra_names)}
    rank = len(shape[out])
    for name, dims in shape.items():
        # Leading unit dims past the output's rank broadcast over nothing.
        while len(dims) > rank and dims[0] == 1:
            dims = dims[1:]
        shape[name] = dims
    *_, sq, d = shape[q]
    d_k, sk = shape[kt][-2:]
    sk_v, dv = shape[v][-2:]
    if d_k != d or sk_v != sk or shape[out][-2:] != (sq, dv) or min(map(len, shape.values())) < 2:
        raise cg.fail(
            f"shapes q {shape[q]}, kt {shape[kt]}, v {shape[v]} -> {shape[out]} "
            "are not an attention"
        )
    batch = shape[out][:-2]
    score_shape = (*batch, sq, sk)
    strides = []
    for name, rows, cols in ((out, sq, dv), (q, sq, d), (kt, d, sk), (v, sk, dv)):
        if len(shape[name]) - 2 > len(batch):
            raise cg.fail(f"input {name!r} has more batch dims than the output")
        strides.append(tuple(s * rows * cols for s in broadcast_strides(shape[name][:-2], batch)))
    extras = []
    for name in extra_names:
        padded = (1,) * (len(score_shape) - len(shape[name])) + shape[name]
        if len(padded) != len(score_shape) or any(
            s not in (1, t) for s, t in zip(padded, score_shape, strict=True)
        ):
            raise cg.fail(
                f"extra input {name!r} {shape[name]} does not broadcast to the scores {score_shape}"
            )
        full = broadcast_strides(shape[name], score_shape)
        strides.append(full[:-2])
        dtype = cg.graph.tensors[name].dtype
        extras.append(Extra(cg.dram(name).name, full[-2], full[-1], dtype is Dtype.BOOL))
    dims, merged = merge_broadcast_dims(batch, strides)
    storage = STORAGE_DTYPES.get(attrs.get("storage_dtype", "float32"))
    if storage is None:
        raise cg.fail(f"unknown storage_dtype {attrs.get('storage_dtype')!r}")
    q_rows, k_tile, cast_all = tile_config(cg, attrs, sq, sk)
    return AttentionArgs(
        cg.dram(q).name,
        cg.dram(kt).name,
        cg.dram(v).name,
        cg.dram(out).name,
        sq,
        sk,
        d,
        dv,
        dims,
        tuple(merged),
        tuple(extras),
        parse_steps(cg, attrs, len(extras)),
        parse_guard(cg, attrs),
        storage,
        cg.graph.tensors[out].dtype,
        q_rows,
        k_tile,
        storage if cast_all else Dtype.FP32,
        attrs.get("custom_call_target") == SWAP_TARGET,
    )
