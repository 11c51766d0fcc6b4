"""The native attention kernel behind the three MM-Softmax-MM CustomCall targets
(docs/attention.md#targets).

In: a CustomCall node with inputs [q, kt, v, *extra]: q [..., Sq, D], kt [..., D, Sk] (K
already transposed), v [..., Sk, Dv], batch dims broadcasting as in numpy matmul. Out:
O [..., Sq, Dv] in the node's output dtype, with

    S = steps(q · kt)        fp32; the JSON `steps` in order, on the [..., Sq, Sk] scores
    P = exp(S − rowmax) / Σ  the stable softmax DecomposeAttention spells out
                             (docs/attention.md#decompose)
    O = post_steps(P) · v

Steps: {"op": "scale"|"divide", "value"}, {"op": "add", "input": i},
{"op": "masked_fill", "input": i, "value", "fill_on_true"} and {"op": "causal"}
(S[i, j] = −inf for j > i + Sk − Sq); `input` i indexes the extra inputs (node input 3 + i),
which broadcast numpy-style to [..., Sq, Sk]. post_steps: only {"op": "nan_to_zero"}, the
Where(IsNaN(P), 0, P) guard.

Cast policy ("matmult-to-bf16 sets storage, not accumulation"): every matmul operand in SBUF
— q, kt, v, P and their PE transposes — is held in `storage_dtype`; the loading DMAs convert
whatever dtype arrives. Accumulation is fp32 PSUM, the scores and the softmax statistics are
fp32, and P is rounded to the storage dtype once, by the ScalarE exp that produces it.

Machine layout, per (batch, query tile of ≤128 rows), with K and V resident in SBUF for the
batch index (loaded once per KV head when they broadcast over the inner batch dims, GQA):
1. q tile [rows, D] → PE transpose per 128 of D (identity of the storage dtype) → qᵀ;
2. per key chunk of 512 (a PSUM bank): S = Σ_D qᵀ[D, rows]ᵀ · kt[D, keys] in PSUM; ScalarE
   evicts it into the fp32 score row with the leading scale/divide steps as its `scale`;
   VectorE applies the other steps and the chunk's row max;
3. ScalarE exp(S + (−max)) with the negated max as its per-partition bias writes P (storage
   dtype); VectorE sums P;
4. per key tile of 128: PE transposes P → Pᵀ [keys, rows], then O += Pᵀᵀ · v[keys, Dv];
5. O / Σ on VectorE straight out of PSUM (normalising O costs Dv per row, normalising P
   would cost Sk), DMA out.

Masks are selects, not arithmetic (−inf · 0 would be NaN): a masked_fill builds a bound B
(−inf where the fill applies, +inf elsewhere) from the condition and takes min(S, B), then
max with min(−B, value) when the value is not −inf. The causal bound is one Iota-built tile
per kernel call, B[p, x] = ±inf by the sign of x − X0 − p − (Sk − Sq), read through a window
at offset (key start − row start + X0): the same affine index for every tile.

Fully masked rows. ONNX's softmax of an all −inf row is NaN; the guard turns it into 0. A NaN
in P would spread to every row of its tile through the PE transpose (NaN · 0 in the identity
matmul, docs/neuroncore.md#pe-array), so the negated max is clamped to FLT_MAX: such a row gets
P = 0 and Σ = 0, and O = 0 / 0 = NaN for that row alone, as in ONNX. With the guard, Σ is
raised to FLT_MIN first, giving O = 0. (Σ ≥ 1 in any other row: its max contributes
exp(0).) Scores of +inf or NaN — only from non-finite inputs or a +inf fill — are outside
this contract.

The node is read into `AttentionArgs` by `attention_args`; this module lays out the tiles and
emits the instructions.

Limit: the whole fp32 score row, P, and K and V stay in SBUF, about
4·⌈D/128⌉ + 4·Dv/128 + 4 (+4 causal) bytes per key per partition with fp32 storage and half
the K/V/P share with bf16/fp16: Sk ≈ 10 000 keys at D = Dv = 128. Longer rows fail with
`cg.fail` (an online-softmax variant would lift this). PSUM holds 3 + ⌈Dv/512⌉ banks, so
Dv ≤ 2560.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from onnx2bir.bir.enums import ActFunc, AluOp, Dtype, Engine, Opcode
from onnx2bir.bir.ir import AccessPattern
from onnx2bir.bir.opcodes import MATMUL_MAX_MOVING_FREE, NUM_PARTITIONS, PSUM_NUM_BANKS
from onnx2bir.codegen.driver import BirCodeGen, CodegenError
from onnx2bir.codegen.lower_conv import tile_index
from onnx2bir.codegen.tiling import Affine, Tile, tiles
from onnx2bir.kernels import kernel
from onnx2bir.kernels.attention_args import KT, OUT, AttentionArgs, Q, Step, V, attention_args
from onnx2bir.kernels.attention_args import STORAGE_DTYPES as STORAGE_DTYPES
from onnx2bir.kernels.attention_args import Extra as Extra
from onnx2bir.kernels.attention_args import json_list as json_list
from onnx2bir.kernels.attention_args import parse_guard as parse_guard
from onnx2bir.kernels.attention_args import parse_steps as parse_steps

TARGETS = (
    "AttentionMMSoftmaxMM",
    "AttentionMMSoftmaxMMWithoutSwap",
    "CausalAttentionMMSoftmaxMMWithoutSwap",
)
P = NUM_PARTITIONS
KEY_CHUNK = MATMUL_MAX_MOVING_FREE  # one PSUM bank of fp32 scores
FLT_MAX = float(np.finfo(np.float32).max)
FLT_MIN = float(np.finfo(np.float32).tiny)


def storage_identity(cg: BirCodeGen, dtype: Dtype) -> Callable[[int], AccessPattern]:
    """I[n, n] in `dtype` for PE transposes: the resident fp32 one, or a copy loaded per call
    (the PE array pairs fp32 only with fp32, bf16/fp16 with each other)."""
    if dtype is Dtype.FP32:
        return cg.identity
    name = f"identity_matrices.{dtype}"
    if name not in cg.function.memory_locations:
        cg.add_dram_const(name, np.eye(P, dtype=np.float32).astype(dtype.numpy))
    tile = cg.sb_tile(f"identity_{dtype}", P, P, dtype)
    cg.dma(cg.ap(tile), cg.dram_ap(name, Affine(), [(P, P), (1, P)]))
    return lambda n: cg.ap(tile, [(1, n)], partitions=n)


def load_row_tiles(cg: BirCodeGen, tile, loc: str, offset: Affine, rows: int, cols: int) -> None:
    """tile[r mod 128, (r div 128)·cols + c] = M[r, c] for a row-major DRAM matrix M."""
    full, rest = divmod(rows, P)
    if full:
        cg.dma(
            cg.ap(tile, [(cols, full), (1, cols)], partitions=P),
            cg.dram_ap(loc, offset, [(cols, P), (P * cols, full), (1, cols)]),
        )
    if rest:
        cg.dma(
            cg.ap(tile, [(1, cols)], full * cols, partitions=rest),
            cg.dram_ap(loc, offset + full * P * cols, [(cols, rest), (1, cols)]),
        )


class AttentionTiles:
    """Every SBUF and PSUM tile of one kernel call, reused across batches and query tiles."""

    def __init__(self, cg: BirCodeGen, a: AttentionArgs) -> None:
        s, fp32 = a.storage, Dtype.FP32
        d_tiles, k_tiles = -(-a.d // P), -(-a.sk // P)
        ops = {step.op for step in a.steps}
        self.identity = storage_identity(cg, s)
        self.k = cg.sb_tile("k", P, d_tiles * a.sk, s)
        self.v = cg.sb_tile("v", P, k_tiles * a.dv, s)
        self.q = cg.sb_tile("q", P, a.d, s)
        self.qt = cg.sb_tile("qT", P, d_tiles * P, s)
        self.scores = cg.sb_tile("scores", P, a.sk, fp32)
        self.probs = self.scores if s is fp32 else cg.sb_tile("probs", P, a.sk, s)
        self.pt = cg.sb_tile("pT", P, P, s)
        self.rowmax = cg.sb_tile("rowmax", P, -(-a.sk // KEY_CHUNK), fp32)
        self.stats = cg.sb_tile("stats", P, 2, fp32)  # −max, Σ
        self.extra = (
            cg.sb_tile("extra", P, KEY_CHUNK, fp32) if ops & {"add", "masked_fill"} else None
        )
        self.bound = cg.sb_tile("bound", P, KEY_CHUNK, fp32) if "masked_fill" in ops else None
        self.causal_x0 = (a.sq - 1) // P * P  # start of the last query tile
        self.causal = (
            cg.sb_tile("causal", P, a.sk + self.causal_x0, fp32) if "causal" in ops else None
        )
        self.out = cg.sb_tile("out", P, a.dv, a.out_dtype)
        self.qt_ps = cg.psum_tile("qT", P, P)
        self.s_ps = cg.psum_tile("scores", P, KEY_CHUNK)
        self.pt_ps = cg.psum_tile("pT", P, P)
        self.o_ps = cg.psum_tile("out", P, -(-a.dv // KEY_CHUNK) * KEY_CHUNK)


@kernel(TARGETS[0])
@kernel(TARGETS[1])
@kernel(TARGETS[2])
def trace_attention(cg: BirCodeGen, node: dict) -> None:
    a = attention_args(cg, node)
    if 3 + -(-a.dv // KEY_CHUNK) > PSUM_NUM_BANKS:
        raise cg.fail(f"Dv = {a.dv} needs more than the {PSUM_NUM_BANKS} PSUM banks")
    try:
        t = AttentionTiles(cg, a)
    except CodegenError as exc:
        raise cg.fail(
            f"Sk = {a.sk} keys do not fit: the kernel keeps the fp32 score row, P and the "
            f"resident K and V in SBUF (longer rows need an online softmax). {exc}"
        ) from None
    AttentionEmitter(cg, a, t).run()


class AttentionEmitter:
    def __init__(self, cg: BirCodeGen, a: AttentionArgs, t: AttentionTiles) -> None:
        self.cg, self.a, self.t = cg, a, t
        self.lead_scale = 1.0
        steps = list(a.steps)
        while steps and steps[0].op in ("scale", "divide"):
            step = steps.pop(0)
            self.lead_scale *= step.value if step.op == "scale" else 1.0 / step.value
        self.steps = steps  # after the leading scales, which ride on the PSUM eviction
        self.dv_chunks = [(v0, min(KEY_CHUNK, a.dv - v0)) for v0 in range(0, a.dv, KEY_CHUNK)]

    def run(self) -> None:
        if self.t.causal is not None:
            self.build_causal_bound()
        self.walk(0, [Affine()] * len(self.a.strides))

    def build_causal_bound(self) -> None:
        """causal[p, x] = −inf where x − X0 − p > Sk − Sq (a key past the row), else +inf."""
        cg, a, tile = self.cg, self.a, self.t.causal
        x0 = self.t.causal_x0
        cg.emit(
            Opcode.IOTA,
            Engine.POOL,
            cg.ap(tile),
            {},
            base=-x0 - (a.sk - a.sq),
            channel_multiplier=-1,
            steps=[1],
        )
        # Integer v: v ≥ 1 → (v − 0.5)·(−inf) = −inf; v ≤ 0 → +inf.
        cg.tensor_scalar(cg.ap(tile), cg.ap(tile), AluOp.SUBTRACT, 0.5, AluOp.MULTIPLY, -math.inf)

    def walk(self, depth: int, offsets: list[Affine]) -> None:
        a, cg = self.a, self.cg
        if depth == a.kv_depth:
            self.load_kv(offsets)
        if depth < len(a.dims):
            for index in tiles(cg, a.dims[depth], 1, "b"):
                inner = [
                    off + index.start * st[depth]
                    for off, st in zip(offsets, a.strides, strict=True)
                ]
                self.walk(depth + 1, inner)
            return
        for m in tiles(cg, a.sq, P, "q"):
            self.query_tile(offsets, m)

    def load_kv(self, offsets: list[Affine]) -> None:
        a, t = self.a, self.t
        load_row_tiles(self.cg, t.k, a.kt, offsets[KT], a.d, a.sk)
        load_row_tiles(self.cg, t.v, a.v, offsets[V], a.sk, a.dv)

    def query_tile(self, offsets: list[Affine], m: Tile) -> None:
        cg, a, t = self.cg, self.a, self.t
        cg.dma(
            cg.ap(t.q, [(1, a.d)], partitions=m.size),
            cg.dram_ap(a.q, offsets[Q] + m.start * a.d, [(a.d, m.size), (1, a.d)]),
        )
        for dt in tiles(cg, a.d, P, "dq"):
            ps = cg.ap(t.qt_ps, [(1, m.size)], partitions=dt.size)
            cg.matmul(
                ps,
                cg.ap(t.q, [(1, dt.size)], dt.start, partitions=m.size),
                t.identity(m.size),
                accumulate=False,
            )
            cg.tensor_copy(
                cg.ap(t.qt, [(1, m.size)], tile_index(dt, P) * P, partitions=dt.size), ps
            )
        neg_max = cg.ap(t.stats, [(1, 1)], 0, partitions=m.size)
        total = cg.ap(t.stats, [(1, 1)], 1, partitions=m.size)
        single = a.sk <= KEY_CHUNK
        for c in tiles(cg, a.sk, KEY_CHUNK, "kc"):
            chunk = self.score_chunk(offsets, m, c)
            if single:
                cg.tensor_reduce(neg_max, chunk, AluOp.MAX, axes=1, negate=True)
            else:
                cg.tensor_reduce(
                    cg.ap(t.rowmax, [(1, 1)], tile_index(c, KEY_CHUNK), partitions=m.size),
                    chunk,
                    AluOp.MAX,
                    axes=1,
                )
        if not single:
            cg.tensor_reduce(
                neg_max,
                cg.ap(t.rowmax, [(1, -(-a.sk // KEY_CHUNK))], partitions=m.size),
                AluOp.MAX,
                axes=1,
                negate=True,
            )
        # An all −inf row: exp(−inf + FLT_MAX) = 0 rather than NaN (see the module docstring).
        cg.tensor_scalar(neg_max, neg_max, AluOp.MIN, FLT_MAX)
        probs = cg.ap(t.probs, [(1, a.sk)], partitions=m.size)
        cg.activation(
            probs, cg.ap(t.scores, [(1, a.sk)], partitions=m.size), ActFunc.EXP, bias=neg_max
        )
        cg.tensor_reduce(total, probs, AluOp.ADD, axes=1)
        if a.guard:
            cg.tensor_scalar(total, total, AluOp.MAX, FLT_MIN)
        self.probs_times_v(m)
        for j, (v0, vn) in enumerate(self.dv_chunks):
            cg.tensor_scalar(
                cg.ap(t.out, [(1, vn)], v0, partitions=m.size),
                cg.ap(t.o_ps, [(1, vn)], j * KEY_CHUNK, partitions=m.size),
                AluOp.DIVIDE,
                total,
            )
        cg.dma(
            cg.dram_ap(a.out, offsets[OUT] + m.start * a.dv, [(a.dv, m.size), (1, a.dv)]),
            cg.ap(t.out, [(1, a.dv)], partitions=m.size),
        )

    def score_chunk(self, offsets: list[Affine], m: Tile, c: Tile) -> AccessPattern:
        """S[rows, keys of chunk c] into the fp32 score row, with every step applied."""
        cg, a, t = self.cg, self.a, self.t
        ps = cg.ap(t.s_ps, [(1, c.size)], partitions=m.size)
        for dt in tiles(cg, a.d, P, "d", peel_first=True):
            slot = tile_index(dt, P)
            cg.matmul(
                ps,
                cg.ap(t.qt, [(1, m.size)], slot * P, partitions=dt.size),
                cg.ap(t.k, [(1, c.size)], slot * a.sk + c.start, partitions=dt.size),
                accumulate=not dt.first,
            )
        chunk = cg.ap(t.scores, [(1, c.size)], c.start, partitions=m.size)
        cg.activation(chunk, ps, ActFunc.COPY, scale=self.lead_scale)
        for step in self.steps:
            if step.op == "scale":
                cg.tensor_scalar(chunk, chunk, AluOp.MULTIPLY, step.value)
            elif step.op == "divide":
                cg.tensor_scalar(chunk, chunk, AluOp.DIVIDE, step.value)
            elif step.op == "causal":
                window = cg.ap(
                    t.causal, [(1, c.size)], c.start + m.start * -1 + t.causal_x0, partitions=m.size
                )
                cg.tensor_tensor(chunk, chunk, window, AluOp.MIN)
            else:
                self.extra_step(step, chunk, offsets, m, c)
        return chunk

    def extra_step(
        self, step: Step, chunk: AccessPattern, offsets: list[Affine], m: Tile, c: Tile
    ) -> None:
        cg, t = self.cg, self.t
        extra = self.a.extras[step.input]
        values = cg.ap(t.extra, [(1, c.size)], partitions=m.size)
        start = offsets[4 + step.input] + m.start * extra.row_stride + c.start * extra.col_stride
        cg.dma(
            values,
            cg.dram_ap(extra.name, start, [(extra.row_stride, m.size), (extra.col_stride, c.size)]),
        )
        if step.op == "add":
            cg.tensor_tensor(chunk, chunk, values, AluOp.ADD)
            return
        bound = cg.ap(t.bound, [(1, c.size)], partitions=m.size)
        if not extra.is_bool:  # a float condition holds where nonzero: 1 − (c == 0)
            cg.tensor_scalar(bound, values, AluOp.IS_EQUAL, 0.0, AluOp.SUBTRACT, 1.0, reverse1=True)
            values = bound
        # cond ∈ {0, 1} → bound = −inf where the fill applies, +inf where S is kept.
        cg.tensor_scalar(
            bound,
            values,
            AluOp.SUBTRACT,
            0.5,
            AluOp.MULTIPLY,
            -math.inf if step.fill_on_true else math.inf,
        )
        cg.tensor_tensor(chunk, chunk, bound, AluOp.MIN)
        if step.value != -math.inf:  # raise the filled places from −inf to the value
            cg.tensor_scalar(bound, bound, AluOp.MULTIPLY, -1.0, AluOp.MIN, step.value)
            cg.tensor_tensor(chunk, chunk, bound, AluOp.MAX)

    def probs_times_v(self, m: Tile) -> None:
        """O[rows, Dv] = Σ over key tiles of Pᵀ[keys, rows]ᵀ · v[keys, Dv], in PSUM."""
        cg, a, t = self.cg, self.a, self.t
        for kt in tiles(cg, a.sk, P, "kt", peel_first=True):
            pt_ps = cg.ap(t.pt_ps, [(1, m.size)], partitions=kt.size)
            cg.matmul(
                pt_ps,
                cg.ap(t.probs, [(1, kt.size)], kt.start, partitions=m.size),
                t.identity(m.size),
                accumulate=False,
            )
            pt = cg.ap(t.pt, [(1, m.size)], partitions=kt.size)
            cg.activation(pt, pt_ps, ActFunc.COPY)
            slot = tile_index(kt, P)
            for j, (v0, vn) in enumerate(self.dv_chunks):
                cg.matmul(
                    cg.ap(t.o_ps, [(1, vn)], j * KEY_CHUNK, partitions=m.size),
                    pt,
                    cg.ap(t.v, [(1, vn)], slot * a.dv + v0, partitions=kt.size),
                    accumulate=not kt.first,
                )
