"""Structural causality (docs/attention.md#structural-causality): whether a score mask masks
exactly the keys above the diagonal, read from the subgraph that produces it.

In: the graph, the mask tensor of an `add` score step or the condition of a `masked_fill`
(Where) step with its fill and the branch it fills, and the block's seq_q, seq_k. Out:
`causal_problem` — None when the step sets exactly the scores with key index > query index +
(seq_k − seq_q) to a very negative number (≤ −1e4) and leaves the others as they are (the
semantics `match._is_causal_mask` checks on folded constants, which keep that check), else the
reason; a reason that starts with "not structural" means the subgraph holds something the
reading does not take.

Pattern. The mask's producing subgraph, read backwards from the mask by an abstract
interpretation over the index structure of each tensor's last two dims (r = row, the query;
c = column, the key); the tensor is never evaluated, so a 16384 x 16384 mask costs as little as
an 8 x 8 one. The domain:
- `Const(v)`: the same value everywhere;
- `Affine(row, col, offset)`: row·r + col·c + offset (Range, arange constants, index sums);
- `Steps(breaks, values)`: a step function of d = c − r (a triangle, a band): values[i] for
  breaks[i−1] ≤ d < breaks[i].
Leading dims never enter a value: an op that would make a value depend on one (a Reshape that
moves r or c into the leading dims, a constant that differs between heads) is refused.
Check. The ops interpreted (`_RULES`): constants (initializers, Constant, ConstantOfShape,
Range — a constant is read as one of the three forms, or refused), Trilu with a constant k,
comparisons (Less, LessOrEqual, Greater, GreaterOrEqual, Equal) of affine indices whose
difference is a function of c − r, Where, And/Or/Xor/Not, Add/Sub/Mul/Div/Neg/Min/Max, Cast,
CastLike, and the shape ops that only add, drop or broadcast dims of size 1 or slice
(Unsqueeze, Squeeze, Reshape, Expand, Identity, Transpose, Slice with constant starts). A
tensor whose row or column dim is 1 is pinned at index 0 there (numpy broadcasting). Anything
else refuses, with the node and op named.
Rewrite. `drop_replaced_masks`: once the raise has replaced a causal step by the kernel's own
`{"op": "causal"}` step (patterns/attention/raising.py), the mask is no longer one of the
CustomCall's inputs, and the raise removes the subgraph that produced it, now read by nothing
(`Graph.remove_dead_producers`): it is never computed (a 16384² fp32 mask would be 1 GiB).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from onnx2bir.graph import Graph
from onnx2bir.patterns.queries import cone_ops

MASKED = -1e4  # a score this low or lower is masked (match._is_causal_mask's bound)
MAX_STEPS = 8  # pieces of a step function read from a constant
MAX_NODES = 200  # producer nodes one reading may visit


class NotStructural(Exception):
    """The subgraph holds something the reading does not take; the message says what (and,
    once `located`, at which node)."""

    def __init__(self, message: str, located: bool = False) -> None:
        super().__init__(message)
        self.located = located


# --- the domain --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Const:
    value: object  # a numpy scalar


@dataclass(frozen=True)
class Affine:
    row: float
    col: float
    offset: float


@dataclass(frozen=True)
class Steps:
    breaks: tuple[int, ...]
    values: tuple  # len(breaks) + 1 numpy scalars


Value = Const | Affine | Steps


def steps(breaks, values) -> Value:
    """The step function, adjacent equal pieces merged; a single piece is a Const."""
    out_breaks, out_values = [], [values[0]]
    for at, value in zip(breaks, values[1:], strict=True):
        if _same(value, out_values[-1]):
            continue
        out_breaks.append(int(at))
        out_values.append(value)
    if not out_breaks:
        return Const(out_values[0])
    return Steps(tuple(out_breaks), tuple(out_values))


def affine(row, col, offset) -> Value:
    return Const(np.asarray(offset)[()]) if row == 0 and col == 0 else Affine(row, col, offset)


def _same(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype.kind == "f" and b.dtype.kind == "f" and np.isnan(a) and np.isnan(b):
        return True
    return bool(a == b) and a.dtype == b.dtype


def at(value: Value, d: int):
    """A Const's or Steps' value at d = c − r."""
    if isinstance(value, Const):
        return value.value
    return value.values[int(np.searchsorted(value.breaks, d, side="right"))]


def depends(value: Value) -> set[str]:
    """The axes ("r", "c") the value depends on."""
    if isinstance(value, Affine):
        return {axis for axis, coef in (("r", value.row), ("c", value.col)) if coef != 0}
    return {"r", "c"} if isinstance(value, Steps) else set()


def describe(value: Value) -> str:
    if isinstance(value, Const):
        return f"constant {_num(value.value)}"
    if isinstance(value, Affine):
        return f"{_num(value.row)}·query + {_num(value.col)}·key + {_num(value.offset)}"
    pieces = []
    for i, value_i in enumerate(value.values):
        lo = f"{value.breaks[i - 1]} ≤ " if i else ""
        hi = f" < {value.breaks[i]}" if i < len(value.breaks) else ""
        pieces.append(f"{_num(value_i)} for {lo}key − query{hi}")
    return ", ".join(pieces)


def _num(x) -> str:
    x = np.asarray(x)[()]
    return str(bool(x)) if isinstance(x, np.bool_) else f"{float(x):g}"


# --- elementwise arithmetic on the domain ---------------------------------------------------------
def combine(fn, args: list[Value], dtype) -> Value:
    """fn applied elementwise to Const/Steps arguments, the result in `dtype`."""
    if any(isinstance(a, Affine) for a in args):
        raise NotStructural("an index (affine) value meets a mask value")
    breaks = sorted({b for a in args if isinstance(a, Steps) for b in a.breaks})
    points = [breaks[0] - 1, *breaks] if breaks else [0]
    values = []
    with np.errstate(all="ignore"):
        for d in points:
            result = np.asarray(fn(*(at(a, d) for a in args)))
            values.append(_cast(result, dtype))
    return steps(breaks, values)


def _cast(x, dtype):
    with np.errstate(all="ignore"):
        return np.asarray(x).astype(dtype)[()]


def pin(value: Value, shape: tuple[int, ...]) -> Value:
    """The value of a tensor of `shape`, read at index 0 along a row or column dim of size 1
    (numpy broadcasting reads it there whatever the other operand's index)."""
    rows = shape[-2] if len(shape) >= 2 else 1
    cols = shape[-1] if len(shape) >= 1 else 1
    if isinstance(value, Affine):
        return affine(value.row if rows > 1 else 0, value.col if cols > 1 else 0, value.offset)
    if isinstance(value, Steps) and (rows == 1 or cols == 1):
        span = range(0, cols) if rows == 1 else range(-(rows - 1), 1)
        seen = {
            at(value, d).item() for d in (span.start, span.stop - 1, *value.breaks) if d in span
        }
        if len(seen) > 1:
            axis = "key" if rows == 1 else "query"
            raise NotStructural(f"a step function of the {axis} index alone")
        return Const(at(value, span.start))
    return value


def relabel(value: Value, mapping: dict[str, str]) -> Value:
    """Rename the axes the value depends on: {"r": "c"} moves r onto the column axis."""
    if isinstance(value, Const):
        return value
    if isinstance(value, Affine):
        coef = {"r": 0, "c": 0}
        for axis, c in (("r", value.row), ("c", value.col)):
            if c:
                coef[mapping[axis]] += c
        return affine(coef["r"], coef["c"], value.offset)
    if mapping == {"r": "r", "c": "c"}:
        return value
    if mapping == {"r": "c", "c": "r"}:  # d → −d: [t_i, t_i+1) becomes [1 − t_i+1, 1 − t_i)
        return steps([1 - b for b in reversed(value.breaks)], list(reversed(value.values)))
    raise NotStructural("moves a mask axis onto the other")


def shift(value: Value, row0: int, col0: int, row_step: int = 1, col_step: int = 1) -> Value:
    """The value at (row0 + row_step·r, col0 + col_step·c) (a Slice)."""
    if isinstance(value, Const):
        return value
    if isinstance(value, Affine):
        return affine(
            value.row * row_step,
            value.col * col_step,
            value.offset + value.row * row0 + value.col * col0,
        )
    if row_step != 1 or col_step != 1:
        raise NotStructural("a strided slice of a triangle")
    delta = col0 - row0  # d = d' + delta
    return steps([b - delta for b in value.breaks], list(value.values))


# --- reading the subgraph -------------------------------------------------------------------------
class Reader:
    """The abstract value of each tensor of the mask's cone, read from its producers."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.memo: dict[str, Value] = {}
        self.visited = 0

    def shape(self, tensor: str) -> tuple[int, ...]:
        return tuple(self.graph.tensors[tensor].shape)

    def dtype(self, tensor: str) -> np.dtype:
        return self.graph.tensors[tensor].dtype.numpy

    def value(self, tensor: str) -> Value:
        if tensor not in self.memo:
            self.memo[tensor] = pin(self._read(tensor), self.shape(tensor))
        return self.memo[tensor]

    def _read(self, tensor: str) -> Value:
        info = self.graph.tensors.get(tensor)
        if info is not None and info.is_const:
            return from_constant(info.const)
        node = self.graph.producer(tensor)
        if node is None:
            raise NotStructural(f"reads the graph input {tensor!r}")  # its reader is named
        self.visited += 1
        if self.visited > MAX_NODES:
            raise NotStructural(f"more than {MAX_NODES} producer nodes", located=True)
        data = self.graph.node(node)
        rule = _RULES.get(data["op_type"]) if data.get("domain", "") in ("", "ai.onnx") else None
        if rule is None:
            raise NotStructural(f"{data['op_type']} {node!r} is not read", located=True)
        try:
            return rule(self, data)
        except NotStructural as exc:
            if exc.located:
                raise
            raise NotStructural(f"{data['op_type']} {node!r}: {exc}", located=True) from None

    def const(self, tensor: str) -> np.ndarray:
        """A small constant operand (a shape, k, starts): its value, or refused."""
        info = self.graph.tensors.get(tensor)
        if info is not None and info.is_const:
            return np.asarray(info.const)
        node = self.graph.producer(tensor)
        if node is not None and self.graph.node(node)["op_type"] == "Constant":
            return _constant_array(self.graph.node(node))
        raise NotStructural(f"{tensor!r} is not a constant")


def from_constant(array: np.ndarray) -> Value:
    """A constant as Const, Affine (an index) or Steps (a triangle), else refused."""
    array = np.asarray(array)
    if array.size == 0:
        raise NotStructural("an empty constant")
    first = array.reshape(-1)[0]
    if _all_equal(array, first):
        return Const(first[()])
    rows, cols = (array.shape[-2], array.shape[-1]) if array.ndim >= 2 else (1, array.shape[-1])
    planes = array.reshape(-1, rows, cols)
    if not _all_equal(planes, planes[0]):
        raise NotStructural("a constant that differs along a leading dim")
    plane = planes[0]
    if plane.dtype.kind in "iuf" and np.all(np.isfinite(plane)):
        row = plane[1, 0] - plane[0, 0] if rows > 1 else 0
        col = plane[0, 1] - plane[0, 0] if cols > 1 else 0
        index = plane[0, 0] + row * np.arange(rows)[:, None] + col * np.arange(cols)[None, :]
        if np.array_equal(index, plane):
            return affine(row.item() if rows > 1 else 0, col.item() if cols > 1 else 0, first)
    # d = c − r runs over −(rows − 1) … cols − 1: the first column upwards, then the first row.
    line = np.concatenate([plane[::-1, 0], plane[0, 1:]])
    windows = np.lib.stride_tricks.sliding_window_view(line, cols)[::-1]
    if not _all_equal(plane, windows):
        raise NotStructural("a constant that is not a function of key − query")
    changes = np.flatnonzero(line[1:] != line[:-1]) + 1
    if len(changes) >= MAX_STEPS:
        raise NotStructural(f"a constant with more than {MAX_STEPS} steps along key − query")
    return steps(
        [int(i) - (rows - 1) for i in changes], [line[0][()], *(line[i][()] for i in changes)]
    )


def _all_equal(a: np.ndarray, b) -> bool:
    return bool(np.array_equal(a, np.broadcast_to(b, a.shape), equal_nan=a.dtype.kind == "f"))


# --- the ops ------------------------------------------------------------------------------------
def _out(r: Reader, node: dict):
    return r.dtype(node["outputs"][0])


def _scalar(r: Reader, tensor: str):
    value = r.const(tensor)
    if value.size != 1:
        raise NotStructural(f"{tensor!r} is not a scalar")
    return value.reshape(-1)[0]


def _same_value(r: Reader, node: dict) -> Value:
    """Expand, Identity: the value is unchanged (broadcasting aligns the last dims)."""
    return r.value(node["inputs"][0])


def _relabel_dims(r: Reader, node: dict) -> Value:
    """Unsqueeze, Squeeze, Reshape, Flatten: allowed when the dims other than 1 keep their
    sizes and order, and the row and column dims stay the last two."""
    source, out = node["inputs"][0], node["outputs"][0]
    value = r.value(source)
    shape_in, shape_out = r.shape(source), r.shape(out)
    if len(shape_in) >= 2 and len(shape_out) >= 2 and shape_in[-2:] == shape_out[-2:]:
        return value  # only the leading dims change
    kept_in = [i for i, n in enumerate(shape_in) if n != 1]
    kept_out = [i for i, n in enumerate(shape_out) if n != 1]
    if [shape_in[i] for i in kept_in] != [shape_out[i] for i in kept_out]:
        raise NotStructural(f"reshapes {list(shape_in)} to {list(shape_out)}")
    where = dict(zip(kept_in, kept_out, strict=True))
    return _move(value, shape_in, shape_out, where)


def _move(value: Value, shape_in, shape_out, where: dict[int, int]) -> Value:
    """Relabel a value whose input axes go to output axes `where`."""
    names_in = {len(shape_in) - 2: "r", len(shape_in) - 1: "c"}
    names_out = {len(shape_out) - 2: "r", len(shape_out) - 1: "c"}
    mapping = {}
    for axis in depends(value):
        index = next(i for i, name in names_in.items() if name == axis)
        target = names_out.get(where.get(index, -1))
        if target is None:
            raise NotStructural("moves the query or key dim into the leading dims")
        mapping[axis] = target
    return relabel(value, mapping)


def _transpose(r: Reader, node: dict) -> Value:
    source = node["inputs"][0]
    shape_in = r.shape(source)
    perm = node["attrs"].get("perm") or list(reversed(range(len(shape_in))))
    where = {axis: position for position, axis in enumerate(perm)}
    return _move(r.value(source), shape_in, r.shape(node["outputs"][0]), where)


def _unary(fn):
    def rule(r: Reader, node: dict) -> Value:
        value = r.value(node["inputs"][0])
        if isinstance(value, Affine):
            if fn is np.negative:
                return affine(-value.row, -value.col, -value.offset)
            raise NotStructural("applied to an index")
        return combine(fn, [value], _out(r, node))

    return rule


def _cast_rule(r: Reader, node: dict) -> Value:
    value = r.value(node["inputs"][0])
    dtype = _out(r, node)
    if isinstance(value, Affine):
        coefs = (value.row, value.col, value.offset)
        if dtype.kind == "f" or (dtype.kind in "iu" and all(float(x).is_integer() for x in coefs)):
            return value
        raise NotStructural(f"casts an index to {dtype}")
    return combine(lambda x: x, [value], dtype)


_ARITH = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.divide}
_COMPARE = {
    "Less": np.less,
    "LessOrEqual": np.less_equal,
    "Greater": np.greater,
    "GreaterOrEqual": np.greater_equal,
    "Equal": np.equal,
}
_LOGIC = {"And": np.logical_and, "Or": np.logical_or, "Xor": np.logical_xor}


def _binary(r: Reader, node: dict) -> Value:
    op = node["op_type"]
    a, b = (r.value(t) for t in node["inputs"][:2])
    dtype = _out(r, node)
    if op == "Div" and dtype.kind in "iu":
        raise NotStructural("integer division")
    fn = _ARITH.get(op) or _COMPARE.get(op) or _LOGIC[op]
    if isinstance(a, Affine) or isinstance(b, Affine):
        return _on_indices(op, fn, a, b, dtype)
    return combine(fn, [a, b], dtype)


def _as_affine(value: Value) -> Affine:
    if isinstance(value, Affine):
        return value
    if isinstance(value, Const) and np.asarray(value.value).dtype.kind in "iuf":
        return Affine(0, 0, np.asarray(value.value).item())
    raise NotStructural("an index (affine) value meets a mask value")


def _on_indices(op: str, fn, a: Value, b: Value, dtype) -> Value:
    """Arithmetic and comparisons of affine indices (Range, arange constants)."""
    a, b = _as_affine(a), _as_affine(b)
    if op in ("Add", "Sub"):
        sign = 1 if op == "Add" else -1
        return affine(a.row + sign * b.row, a.col + sign * b.col, a.offset + sign * b.offset)
    if op in ("Mul", "Div"):
        if op == "Mul" and a.row == a.col == 0:
            a, b = b, a
        if b.row or b.col:
            raise NotStructural("a product of two indices")
        k = b.offset if op == "Mul" else 1 / b.offset
        return affine(a.row * k, a.col * k, a.offset * k)
    if op not in _COMPARE:
        raise NotStructural(f"{op} of indices")
    # a − b = col·(c − r) + offset when it is a function of key − query alone.
    diff = Affine(a.row - b.row, a.col - b.col, a.offset - b.offset)
    if diff.row != -diff.col:
        raise NotStructural(
            f"compares {describe(a)} with {describe(b)}: not a function of key − query"
        )
    if diff.col == 0:
        return Const(_cast(fn(diff.offset, 0), dtype))
    # The comparison can change only near d = −offset/col: read a few points around it.
    x = -diff.offset / diff.col
    lo, hi = math.floor(x) - 1, math.ceil(x) + 1
    points = range(lo, hi + 1)
    values = [_cast(fn(diff.col * d + diff.offset, 0), dtype) for d in points]
    return steps(list(points)[1:], values)


def _minmax(r: Reader, node: dict) -> Value:
    fn = np.minimum if node["op_type"] == "Min" else np.maximum
    return combine(fn, [r.value(t) for t in node["inputs"] if t], _out(r, node))


def _where(r: Reader, node: dict) -> Value:
    cond, x, y = (r.value(t) for t in node["inputs"])
    if isinstance(cond, Const):
        return x if bool(cond.value) else y
    return combine(np.where, [cond, x, y], _out(r, node))


def _trilu(r: Reader, node: dict) -> Value:
    source = node["inputs"][0]
    k = int(_scalar(r, node["inputs"][1])) if len(node["inputs"]) > 1 and node["inputs"][1] else 0
    value = r.value(source)
    if isinstance(value, Affine):
        raise NotStructural("a triangle of an index")
    dtype = _out(r, node)
    zero = np.zeros((), dtype)[()]
    if node["attrs"].get("upper", 1):
        keep = Steps((k,), (np.False_, np.True_))  # c − r ≥ k
    else:
        keep = Steps((k + 1,), (np.True_, np.False_))  # c − r ≤ k
    return combine(lambda m, x: np.where(m, x, zero), [keep, value], dtype)


def _constant_of_shape(r: Reader, node: dict) -> Value:
    value = node["attrs"].get("value")
    return Const(
        np.zeros((), np.float32)[()] if value is None else np.asarray(value).reshape(-1)[0]
    )


def _constant(r: Reader, node: dict) -> Value:
    return from_constant(_constant_array(node))


def _constant_array(node: dict) -> np.ndarray:
    attrs = node["attrs"]
    for key in ("value", "value_float", "value_int", "value_floats", "value_ints"):
        if key in attrs:
            value = np.asarray(attrs[key])
            if key in ("value_float", "value_floats"):
                value = value.astype(np.float32)
            elif key in ("value_int", "value_ints"):
                value = value.astype(np.int64)
            return value
    raise NotStructural("a Constant without a value")


def _range(r: Reader, node: dict) -> Value:
    start, _, delta = (_scalar(r, t) for t in node["inputs"])
    return affine(0, delta.item(), start.item())


def _cast_like(r: Reader, node: dict) -> Value:
    return _cast_rule(r, node)


def _slice(r: Reader, node: dict) -> Value:
    source = node["inputs"][0]
    shape = r.shape(source)
    rank = len(shape)
    inputs = list(node["inputs"]) + [""] * 5
    if inputs[1]:
        starts = r.const(inputs[1]).reshape(-1)
        axes = r.const(inputs[3]).reshape(-1) if inputs[3] else np.arange(len(starts))
        strides = r.const(inputs[4]).reshape(-1) if inputs[4] else np.ones(len(starts), int)
    else:  # opset < 10: attributes
        starts = np.asarray(node["attrs"]["starts"])
        axes = np.asarray(node["attrs"].get("axes", range(len(starts))))
        strides = np.ones(len(starts), int)
    origin = {rank - 2: 0, rank - 1: 0}
    stride = {rank - 2: 1, rank - 1: 1}
    for start, axis, step in zip(starts, axes, strides, strict=True):
        axis, start, step = int(axis) % rank, int(start), int(step)
        if axis not in origin:
            continue  # a leading dim: the value does not depend on it
        if step < 1:
            raise NotStructural("a reversed slice")
        start = min(max(start + shape[axis] if start < 0 else start, 0), shape[axis])
        origin[axis], stride[axis] = start, step
    value = r.value(source)
    if rank < 2:
        return shift(value, 0, origin[rank - 1], 1, stride[rank - 1])
    return shift(value, origin[rank - 2], origin[rank - 1], stride[rank - 2], stride[rank - 1])


_RULES = {
    "Identity": _same_value,
    "Expand": _same_value,
    "Unsqueeze": _relabel_dims,
    "Squeeze": _relabel_dims,
    "Reshape": _relabel_dims,
    "Flatten": _relabel_dims,
    "Transpose": _transpose,
    "Slice": _slice,
    "Cast": _cast_rule,
    "CastLike": _cast_like,
    "Not": _unary(np.logical_not),
    "Neg": _unary(np.negative),
    **dict.fromkeys([*_ARITH, *_COMPARE, *_LOGIC], _binary),
    "Min": _minmax,
    "Max": _minmax,
    "Where": _where,
    "Trilu": _trilu,
    "ConstantOfShape": _constant_of_shape,
    "Constant": _constant,
    "Range": _range,
}


# --- the check ----------------------------------------------------------------------------------
def causal_problem(
    graph: Graph,
    tensor: str,
    seq_q: int,
    seq_k: int,
    fill: float | None = None,
    fill_on_true: bool = True,
) -> str | None:
    """None when the step masks exactly the keys above the diagonal, else the reason.

    `tensor` is an `add` step's mask (fill None) or a `masked_fill` step's condition, `fill`
    the value Where writes and `fill_on_true` whether it writes it where the condition holds.
    """
    shape = tuple(graph.tensors[tensor].shape)
    if len(shape) >= 1 and shape[-1] not in (1, seq_k):
        return f"mask has {shape[-1]} columns, not {seq_k} keys"
    if len(shape) >= 2 and shape[-2] not in (1, seq_q):
        return f"mask has {shape[-2]} rows, not {seq_q} queries"
    try:
        value = Reader(graph).value(tensor)
    except NotStructural as exc:
        return f"not structural: {exc}"
    return value_problem(value, seq_q, seq_k, fill, fill_on_true)


def value_problem(
    value: Value,
    seq_q: int,
    seq_k: int,
    fill: float | None = None,
    fill_on_true: bool = True,
) -> str | None:
    """`causal_problem` for a value already read: None when the step it describes masks exactly
    the keys above the diagonal, else the reason."""
    if isinstance(value, Affine):
        return f"the mask is an index ({describe(value)})"
    if fill is not None:
        if not fill <= MASKED:
            return f"fills {fill:g}, not a masking value (≤ {MASKED:g})"
        fills = value if fill_on_true else combine(np.logical_not, [value], np.dtype(bool))
        masked = combine(lambda m: np.where(m, -np.inf, 0.0), [fills], np.dtype(np.float32))
        where = "holds" if fill_on_true else "does not hold"
        step = f"fills {fill:g} where the condition ({describe(value)}) {where}"
    else:
        masked, step = value, f"adds {describe(value)}"
    offset = seq_k - seq_q  # row i sees keys j ≤ i + offset
    lowest, highest = -(seq_q - 1), seq_k - 1
    points = sorted({lowest, highest, offset, offset + 1, *getattr(masked, "breaks", ())})
    for d in points:
        if not lowest <= d <= highest:
            continue
        score = np.asarray(at(masked, d)).astype(np.float64)
        if d > offset and not score <= MASKED:
            what = f"leaves key − query = {d} unmasked"
        elif d <= offset and score <= MASKED:
            what = f"masks key − query = {d}"
        elif d <= offset and score != 0:
            what = f"changes the score at key − query = {d}"
        else:
            continue
        return f"{what}: the step {step}; the causal mask masks key − query > {offset}"
    return None


def looks_causal(graph: Graph, tensor: str) -> bool:
    """Whether the mask's cone holds an op causal masks are built from (the report then says
    why a mask that looks causal is not taken as such)."""
    return bool(_TRIANGLE_OPS & cone_ops(graph, tensor))


_TRIANGLE_OPS = {"Trilu", "Range", "Less", "LessOrEqual", "Greater", "GreaterOrEqual"}


# --- the rewrite --------------------------------------------------------------------------------
def drop_replaced_masks(
    steps_: list[dict], extras: list[str]
) -> tuple[list[dict], list[str], list[str]]:
    """The steps and extra inputs without the extras no step reads any more (a mask the kernel's
    causal step replaced), the steps' input indices renumbered; and the dropped extras."""
    used = sorted({s["input"] for s in steps_ if "input" in s})
    number = {old: new for new, old in enumerate(used)}
    kept = [extras[i] for i in used]
    dropped = [t for i, t in enumerate(extras) if i not in number and t not in kept]
    renumbered = [{**s, "input": number[s["input"]]} if "input" in s else s for s in steps_]
    return renumbered, kept, dropped
