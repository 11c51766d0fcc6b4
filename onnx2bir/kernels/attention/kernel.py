"""The native attention kernel behind the three MM-Softmax-MM CustomCall targets, flash-style
(docs/attention_kernel.md#the-kernel).

In: a CustomCall node with inputs [q, kt, v, *extra]: q [..., Sq, D], kt [..., D, Sk] (K
already transposed), v [..., Sk, Dv], batch dims broadcasting as in numpy matmul (a K/V head
shared by several query heads is read through a zero stride, never copied). Out: O [..., Sq,
Dv] in the node's output dtype, with

    S = steps(q · kt)        the JSON `steps` in order, on the [..., Sq, Sk] scores
    P = softmax(S)           over the keys, computed online (below)
    O = post_steps(P) · v

Steps: {"op": "scale"|"divide", "value"}, {"op": "add", "input": i},
{"op": "masked_fill", "input": i, "value", "fill_on_true"} and {"op": "causal"}
(S[i, j] = −inf for j > i + Sk − Sq); `input` i indexes the extra inputs (node input 3 + i),
which broadcast numpy-style to [..., Sq, Sk]. post_steps: only {"op": "nan_to_zero"}, the
Where(IsNaN(P), 0, P) guard.

Schedule. Queries go in groups of `q_rows` (≤ 128, the partitions), keys in tiles of `k_tile`
(≤ 512, one PSUM bank of fp32 scores); both come from the node's backend_config `sb_shape`.
K and V are loaded a section of 16 key tiles at a time (the DMA converts to the storage
dtype) and every query group runs against the resident section; when there is more than one
section, a group's running max, running sum and accumulator wait in a DRAM scratch between
sections. The query groups are unrolled, so the engines can overlap one group's softmax with
the next group's matmuls. Per query group, qᵀ is formed by PE transposes; then per key tile:
1. (K and V are already in SBUF);
2. S = qᵀᵀ · Kᵀ accumulates in PSUM over 128-row slices of D; ScalarE evicts it with the
   leading scale steps folded into its `scale`; VectorE applies the other steps. The
   WithoutSwap targets hold qᵀ stationary and stream the key tile as the moving operand.
   The swap target (AttentionMMSoftmaxMM) holds a 128-key slice of Kᵀ stationary and
   streams qᵀ: Sᵀ[keys, rows] lands in the (idle) Pᵀ bank, keys on the partitions, and,
   since the softmax reduces along the free axis, each slice is copied to the fp32 `sT`
   tile and PE-transposed back into the scores bank (docs/attention_kernel.md#targets);
3. online softmax, the statistics in fp32: m' = max(m, rowmax S), c = exp(m − m'),
   P = exp(S − m') (storage dtype), l = c·l + Σ P;
4. PV: per 128 keys, P is PE-transposed and O_tile = Σ Pᵀᵀ · V accumulates in PSUM;
   the fp32 accumulator becomes acc = c·acc + O_tile;
and finally O = acc / l. The first key tile of a group skips the rescaling. SBUF holds one
section of K and V and one key tile of S and P, whatever Sk is (attention_plan lists the
tiles).

Causal blocks (a `causal` step): the query groups are unrolled so each knows its diagonal.
Key tiles wholly above it are never computed (no QKᵀ, no PV); tiles wholly below it skip the
mask; the few tiles that cross it get an Iota-built bound, −inf where the key is past the
row. (When a finite masked fill follows the causal step the skipped scores would matter, so
every tile is then computed and masked.)

Cast policy ("matmult-to-bf16 sets storage, not accumulation"): q, Kᵀ, V, P and their PE
transposes are held in `storage_dtype`; PSUM accumulates fp32; the softmax statistics and the
output accumulator are fp32; the scores are fp32, or the storage dtype when the config's
`auto_cast` is "all".

Fully masked rows: the running max starts at −FLT_MAX, not −inf, so exp(S − m') is 0 for a
row of −inf scores instead of NaN (a NaN in P would spread through the PE transpose to its
whole tile). Such a row ends with l = 0 and O = 0 / 0 = NaN, as in ONNX; with the guard, l is
raised to FLT_MIN first and O = 0.

PSUM: qᵀ, S and Pᵀ (also Sᵀ with swap) take one bank each, the PV tile ⌈Dv/512⌉: Dv ≤ 2560.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from onnx2bir.bir.enums import ActFunc, AluOp, Dtype, Engine, Opcode
from onnx2bir.bir.ir import AccessPattern
from onnx2bir.bir.opcodes import MATMUL_MAX_MOVING_FREE, NUM_PARTITIONS, PSUM_NUM_BANKS
from onnx2bir.codegen.driver import BirCodeGen, CodegenError
from onnx2bir.codegen.tiling import Affine, Tile, tile_index, tiles
from onnx2bir.graph import Node
from onnx2bir.kernels.attention.args import KT, OUT, AttentionArgs, Q, Step, V, attention_args
from onnx2bir.kernels.attention.args import STORAGE_DTYPES as STORAGE_DTYPES
from onnx2bir.kernels.attention.args import Extra as Extra
from onnx2bir.kernels.attention.args import json_list as json_list
from onnx2bir.kernels.attention.args import parse_guard as parse_guard
from onnx2bir.kernels.attention.args import parse_steps as parse_steps
from onnx2bir.kernels.attention.plan import TilePlan

P = NUM_PARTITIONS
DV_CHUNK = MATMUL_MAX_MOVING_FREE  # one PSUM bank of the PV tile
FLT_MAX = float(np.finfo(np.float32).max)
FLT_MIN = float(np.finfo(np.float32).tiny)
M_RUN, L_RUN, M_NEW, NEG, CORR, L_TILE = range(6)  # columns of the stats tile


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


def plan_of(a: AttentionArgs) -> TilePlan:
    ops = {step.op for step in a.steps}
    return TilePlan(
        a.q_rows,
        a.k_tile,
        a.d,
        a.dv,
        a.storage,
        a.score_dtype,
        a.out_dtype,
        extra=bool(ops & {"add", "masked_fill"}),
        fill="masked_fill" in ops,
        causal="causal" in ops,
        seq_k=a.sk,
        swap=a.swap,
    )


class AttentionTiles:
    """Every SBUF and PSUM tile of one kernel call, reused across groups and key tiles."""

    def __init__(self, cg: BirCodeGen, a: AttentionArgs) -> None:
        plan = self.plan = plan_of(a)
        self.identity = storage_identity(cg, a.storage)
        sb = {
            tag: cg.sb_tile(tag, P, free, dtype)
            for tag, free, dtype in plan.sb_tiles()
            if tag != "identity"
        }
        self.q, self.qt, self.k, self.v = sb["q"], sb["qT"], sb["k"], sb["v"]
        self.scores, self.probs, self.pt = sb["scores"], sb["probs"], sb["pT"]
        self.stats, self.acc, self.out = sb["stats"], sb["acc"], sb["out"]
        self.extra, self.bound, self.causal = sb.get("extra"), sb.get("bound"), sb.get("causal")
        self.st = sb.get("sT")
        self.qt_ps = cg.psum_tile("qT", P, a.q_rows)
        self.s_ps = cg.psum_tile("scores", P, a.k_tile)
        self.pt_ps = cg.psum_tile("pT", P, a.q_rows)
        self.o_ps = cg.psum_tile("out", P, -(-a.dv // DV_CHUNK) * DV_CHUNK)


def trace_attention(cg: BirCodeGen, node: Node) -> None:
    a = attention_args(cg, node)
    if 3 + -(-a.dv // DV_CHUNK) > PSUM_NUM_BANKS:
        raise cg.fail(f"Dv = {a.dv} needs more than the {PSUM_NUM_BANKS} PSUM banks")
    try:
        t = AttentionTiles(cg, a)
    except CodegenError as exc:
        raise cg.fail(f"the attention tiles do not fit in SBUF: {exc}") from None
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
        self.causal = any(s.op == "causal" for s in steps)
        after = steps[[s.op for s in steps].index("causal") + 1 :] if self.causal else []
        # A finite fill after the causal mask can lift masked scores: then nothing is skipped.
        self.skip = self.causal and not any(
            s.op == "masked_fill" and s.value != -math.inf for s in after
        )
        self.dv_chunks = [(v0, min(DV_CHUNK, a.dv - v0)) for v0 in range(0, a.dv, DV_CHUNK)]
        size = t.plan.section
        self.sections = [(s0, min(size, a.sk - s0)) for s0 in range(0, a.sk, size)]
        # Between sections a query group's running max, sum and accumulator wait in DRAM.
        self.state = (
            cg.dram_scratch("state", (a.sq, a.dv + 2), Dtype.FP32)
            if len(self.sections) > 1
            else None
        )

    def stat(self, column: int, rows: int) -> AccessPattern:
        return self.cg.ap(self.t.stats, [(1, 1)], column, partitions=rows)

    # --- loops -------------------------------------------------------------------------------
    def run(self) -> None:
        self.walk(0, [Affine()] * len(self.a.strides))

    def walk(self, depth: int, offsets: list[Affine]) -> None:
        a, cg = self.a, self.cg
        if depth < len(a.dims):
            for index in tiles(cg, a.dims[depth], 1, "b"):
                inner = [
                    off + index.start * st[depth]
                    for off, st in zip(offsets, a.strides, strict=True)
                ]
                self.walk(depth + 1, inner)
            return
        for index, (s0, sn) in enumerate(self.sections):
            self.load_kv_section(offsets, s0, sn)
            first, final = index == 0, index == len(self.sections) - 1
            if not self.causal:
                # Unrolled: the engines can then overlap one group's softmax with the next
                # group's matmuls (a BIR loop's iterations run one after another).
                for start in range(0, a.sq, a.q_rows):
                    m = Tile(Affine(start), min(a.q_rows, a.sq - start), True)
                    self.query_group(offsets, m, [(s0, s0 + sn, False)], s0, first, final)
                continue
            for start in range(0, a.sq, a.q_rows):
                m = Tile(Affine(start), min(a.q_rows, a.sq - start), True)
                ranges = self.causal_ranges(m)
                clipped = [
                    (max(lo, s0), min(hi, s0 + sn), masked)
                    for lo, hi, masked in ranges
                    if max(lo, s0) < min(hi, s0 + sn)
                ]
                if clipped:  # keys start at 0: section 0 always has some
                    end = ranges[-1][1]
                    self.query_group(offsets, m, clipped, s0, first, end <= s0 + sn)

    def causal_ranges(self, m: Tile) -> list[tuple[int, int, bool]]:
        """The key ranges (start, stop, masked) a causal query group computes."""
        a = self.a
        if not self.skip:
            return [(0, a.sk, True)]
        # Keys past the group's last row are never computed; keys up to the first row's
        # diagonal need no mask (whole tiles of them); the band between is masked.
        start, offset = m.start.const, a.sk - a.sq  # row i sees keys j ≤ i + offset
        end = max(1, min(a.sk, start + m.size + offset))
        clear = max(0, min(end, start + offset + 1)) // a.k_tile * a.k_tile
        return [(0, clear, False), (clear, end, True)] if clear else [(clear, end, True)]

    def query_group(
        self, offsets: list[Affine], m: Tile, ranges, s0: int, first: bool, final: bool
    ) -> None:
        """One group of query rows against key ranges (start, stop, masked) of the section at
        s0; `first`: the group's first section (no state yet), `final`: its last one."""
        cg, a, t = self.cg, self.a, self.t
        self.load_qt(offsets, m)
        if not first:
            self.move_state(m, load=True)
        for start, stop, masked in ranges:
            if masked:  # the mask needs each tile's position: constant starts, no loop
                keys = (
                    Tile(Affine(k0), min(a.k_tile, stop - k0), first and k0 == start)
                    for k0 in range(start, stop, a.k_tile)
                )
            else:  # lazily: the tiles() generator holds the BIR loop open while a tile is used
                keys = (
                    Tile(c.start + start, c.size, first and c.first)
                    for c in tiles(cg, stop - start, a.k_tile, "k", peel_first=first)
                )
            for key in keys:
                self.key_tile(offsets, m, key, masked, s0)
            first = False
        if not final:
            self.move_state(m, load=False)
            return
        rows = m.size
        total = self.stat(L_RUN, rows)
        if a.guard:
            cg.tensor_scalar(total, total, AluOp.MAX, FLT_MIN)
        for v0, vn in self.dv_chunks:
            cg.tensor_scalar(
                cg.ap(t.out, [(1, vn)], v0, partitions=rows),
                cg.ap(t.acc, [(1, vn)], v0, partitions=rows),
                AluOp.DIVIDE,
                total,
            )
        cg.dma(
            cg.dram_ap(a.out, offsets[OUT] + m.start * a.dv, [(a.dv, rows), (1, a.dv)]),
            cg.ap(t.out, [(1, a.dv)], partitions=rows),
        )

    def move_state(self, m: Tile, load: bool) -> None:
        """The group's accumulator and (running max, running sum) from or to DRAM."""
        cg, a, t = self.cg, self.a, self.t
        width = a.dv + 2
        pairs = (
            (cg.ap(t.acc, [(1, a.dv)], partitions=m.size), 0, a.dv),
            (cg.ap(t.stats, [(1, 2)], M_RUN, partitions=m.size), a.dv, 2),
        )
        for tile, column, count in pairs:
            dram = cg.dram_ap(
                self.state.name, m.start * width + column, [(width, m.size), (1, count)]
            )
            cg.dma(tile, dram) if load else cg.dma(dram, tile)

    def load_kv_section(self, offsets: list[Affine], s0: int, sn: int) -> None:
        """Kᵀ[D, keys] per 128 of D, and V[keys, Dv] per key tile, of one section."""
        cg, a, t = self.cg, self.a, self.t
        section, subtiles = t.plan.section, t.plan.k_subtiles
        for dt in tiles(cg, a.d, P, "dk"):
            cg.dma(
                cg.ap(t.k, [(1, sn)], tile_index(dt, P) * section, partitions=dt.size),
                cg.dram_ap(a.kt, offsets[KT] + dt.start * a.sk + s0, [(a.sk, dt.size), (1, sn)]),
            )
        for index, k0 in enumerate(range(0, sn, a.k_tile)):
            size = min(a.k_tile, sn - k0)
            full, rest = divmod(size, P)
            slot = index * subtiles * a.dv
            base = offsets[V] + (s0 + k0) * a.dv
            if full:
                cg.dma(
                    cg.ap(t.v, [(a.dv, full), (1, a.dv)], slot, partitions=P),
                    cg.dram_ap(a.v, base, [(a.dv, P), (P * a.dv, full), (1, a.dv)]),
                )
            if rest:
                cg.dma(
                    cg.ap(t.v, [(1, a.dv)], slot + full * a.dv, partitions=rest),
                    cg.dram_ap(a.v, base + full * P * a.dv, [(a.dv, rest), (1, a.dv)]),
                )

    # --- one query group ------------------------------------------------------------------
    def load_qt(self, offsets: list[Affine], m: Tile) -> None:
        """q rows → qᵀ [D, rows] per 128 of D, by PE transposes."""
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
                cg.ap(t.qt, [(1, m.size)], tile_index(dt, P) * a.q_rows, partitions=dt.size), ps
            )

    def key_tile(self, offsets: list[Affine], m: Tile, c: Tile, masked: bool, s0: int) -> None:
        """Scores, online-softmax update and PV for one key tile of the section at s0."""
        cg, t = self.cg, self.t
        rows = m.size
        # The tile's place in the section: its K columns and its V slot.
        local = Tile(c.start + -s0, c.size, c.first)
        scores = self.score_tile(offsets, m, c, masked, local)
        m_run, m_new, neg = self.stat(M_RUN, rows), self.stat(M_NEW, rows), self.stat(NEG, rows)
        corr, l_run, l_tile = self.stat(CORR, rows), self.stat(L_RUN, rows), self.stat(L_TILE, rows)
        cg.tensor_reduce(m_new, scores, AluOp.MAX, axes=1)
        if c.first:  # −FLT_MAX, not −inf, as the floor: see the module docstring
            cg.tensor_scalar(m_new, m_new, AluOp.MAX, -FLT_MAX)
        else:
            cg.tensor_tensor(m_new, m_new, m_run, AluOp.MAX)
        cg.tensor_scalar(neg, m_new, AluOp.MULTIPLY, -1.0)
        if not c.first:
            cg.activation(corr, m_run, ActFunc.EXP, bias=neg)
        probs = cg.ap(t.probs, [(1, c.size)], partitions=rows)
        cg.activation(probs, scores, ActFunc.EXP, bias=neg)
        cg.tensor_reduce(l_run if c.first else l_tile, probs, AluOp.ADD, axes=1)
        if not c.first:
            cg.tensor_scalar(l_run, l_run, AluOp.MULTIPLY, corr, AluOp.ADD, l_tile)
        cg.tensor_copy(m_run, m_new)
        self.probs_times_v(m, local)
        for j, (v0, vn) in enumerate(self.dv_chunks):
            acc = cg.ap(t.acc, [(1, vn)], v0, partitions=rows)
            tile = cg.ap(t.o_ps, [(1, vn)], j * DV_CHUNK, partitions=rows)
            if c.first:
                cg.tensor_copy(acc, tile)
            else:
                cg.tensor_scalar(acc, acc, AluOp.MULTIPLY, corr)
                cg.tensor_tensor(acc, acc, tile, AluOp.ADD)

    def score_tile(
        self, offsets: list[Affine], m: Tile, c: Tile, masked: bool, local: Tile
    ) -> AccessPattern:
        """S[rows, keys of tile c] with every step applied (the causal one only if masked);
        `local` is the tile's place in the resident section."""
        cg, a, t = self.cg, self.a, self.t
        ps = cg.ap(t.s_ps, [(1, c.size)], partitions=m.size)
        if a.swap:
            self.swapped_scores(m, c, local)
        else:  # S[rows, keys] = qᵀ[D, rows]ᵀ · Kᵀ[D, keys]: the query group is stationary
            for dt in tiles(cg, a.d, P, "d", peel_first=True):
                slot = tile_index(dt, P)
                cg.matmul(
                    ps,
                    cg.ap(t.qt, [(1, m.size)], slot * a.q_rows, partitions=dt.size),
                    cg.ap(
                        t.k, [(1, c.size)], slot * t.plan.section + local.start, partitions=dt.size
                    ),
                    accumulate=not dt.first,
                )
        scores = cg.ap(t.scores, [(1, c.size)], partitions=m.size)
        cg.activation(scores, ps, ActFunc.COPY, scale=self.lead_scale)
        for step in self.steps:
            if step.op == "scale":
                cg.tensor_scalar(scores, scores, AluOp.MULTIPLY, step.value)
            elif step.op == "divide":
                cg.tensor_scalar(scores, scores, AluOp.DIVIDE, step.value)
            elif step.op == "causal":
                if masked:
                    self.causal_mask(scores, m, c)
            else:
                self.extra_step(step, scores, offsets, m, c)
        return scores

    def swapped_scores(self, m: Tile, c: Tile, local: Tile) -> None:
        """S[rows, keys of tile c] into the scores bank, K stationary: per 128 keys,
        Sᵀ[keys, rows] = Kᵀ[D, keys]ᵀ · qᵀ[D, rows] accumulates over D in the Pᵀ bank (free
        until the PV step), is copied to SBUF in fp32 and PE-transposed, against the fp32
        identity, into its columns of the scores bank."""
        cg, a, t = self.cg, self.a, self.t
        for kt in tiles(cg, c.size, P, "ks", peel_first=True):
            st_ps = cg.ap(t.pt_ps, [(1, m.size)], partitions=kt.size)
            for dt in tiles(cg, a.d, P, "d", peel_first=True):
                slot = tile_index(dt, P)
                column = slot * t.plan.section + local.start + kt.start
                cg.matmul(
                    st_ps,
                    cg.ap(t.k, [(1, kt.size)], column, partitions=dt.size),
                    cg.ap(t.qt, [(1, m.size)], slot * a.q_rows, partitions=dt.size),
                    accumulate=not dt.first,
                )
            st = cg.ap(t.st, [(1, m.size)], partitions=kt.size)
            cg.tensor_copy(st, st_ps)
            cg.matmul(
                cg.ap(t.s_ps, [(1, kt.size)], kt.start, partitions=m.size),
                st,
                cg.identity(kt.size),
                accumulate=False,
            )

    def causal_mask(self, scores: AccessPattern, m: Tile, c: Tile) -> None:
        """min(S, B): B[p, x] = −inf where key c0 + x is past row m0 + p, else +inf."""
        cg, a = self.cg, self.a
        delta = m.start.const + (a.sk - a.sq) - c.start.const  # x − p ≤ delta is visible
        bound = cg.ap(self.t.causal, [(1, c.size)], partitions=m.size)
        cg.emit(Opcode.IOTA, Engine.POOL, bound, {}, base=-delta, channel_multiplier=-1, steps=[1])
        # Integer v = x − p − delta: v ≥ 1 → (v − 0.5)·(−inf) = −inf; v ≤ 0 → +inf.
        cg.tensor_scalar(bound, bound, AluOp.SUBTRACT, 0.5, AluOp.MULTIPLY, -math.inf)
        cg.tensor_tensor(scores, scores, bound, AluOp.MIN)

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

    def probs_times_v(self, m: Tile, c: Tile) -> None:
        """O_tile[rows, Dv] = Σ over 128-key slices of Pᵀ[keys, rows]ᵀ · V[keys, Dv], in PSUM;
        `c` is the key tile's place in the section (its V slot)."""
        cg, a, t = self.cg, self.a, self.t
        base = tile_index(c, a.k_tile) * t.plan.k_subtiles * a.dv
        for kt in tiles(cg, c.size, P, "kt", peel_first=True):
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
                    cg.ap(t.o_ps, [(1, vn)], j * DV_CHUNK, partitions=m.size),
                    pt,
                    cg.ap(t.v, [(1, vn)], base + slot * a.dv + v0, partitions=kt.size),
                    accumulate=not kt.first,
                )
