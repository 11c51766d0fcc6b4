"""The fused MLP kernel behind the AwsNeuronMLPNKI CustomCall (docs/attention.md#mlp-raise).

In: a CustomCall node with inputs [x, w1, b1, w2, b2, w_up, b_up] ("" for an absent one):
x [..., K], w1 [K, H] ([H, K] with attr trans_w1 = 1, Gemm's transB), b1 [H], w2 [H, N]
([N, H] with trans_w2), b2 [N], and for SwiGLU the up projection w_up, b_up shaped like w1,
b1 (transposed when attr trans_w_up is 1; it defaults to trans_w1). Out: y [..., N] in the
node's output dtype, with

    h = act(x·w1 + b1)                 relu | gelu (erf) | gelu_tanh | silu
                                       | quick_gelu: z·sigmoid(1.702·z)
                                       | swiglu: silu(x·w1 + b1) · (x·w_up + b_up)
    y = h·w2 + b2

or `activation` "program" with attr `program` (JSON, patterns/mlp/region.py): registers 0
(x·w1 + b1) and 1 (x·w_up + b_up, gated forms) and steps, each writing a new register —
{"kind": "act", "func"} a ScalarE function, {"kind": "scalar", "func", "value", "reverse"} and
{"kind": "tensor", "func", "b"} VectorE ALU ops; h is register `out`. Each register is a
[H-tile, block] fp32 SBUF tile (`program_step`).

Fused projection (docs/mlp.md#fused): with attrs w1_offset / w_up_offset, w1 and w_up (often
one tensor) hold more than H output features and the projections are H of them from each
offset, as are b1 and b_up of their (longer) biases; H is then w2's rows.

Inner norm (docs/mlp.md#inner-norm): with attr `norm` ("layer" or "rms") and `norm_epsilon`,
inputs 7 and 8 are its scale and shift [H] ("" for absent), and

    y = norm(h)·w2 + b2    layer: (h − mean_H(h)) / √(var_H(h) + ε) · scale + shift
                           rms:   h / √(mean_H(h²) + ε) · scale (+ shift)

over the hidden features of each token (`MlpEmitter.normalize`): h of the whole token block is
in SBUF before the down projection starts, so the norm is a pass over it between the matmuls.

The MLP raise carries no cast policy of its own (docs/attention.md#mlp-raise): its matmuls
follow the general autocast like any MatMul (docs/autocast.md). Under `--auto-cast matmult/all`
the PE operands xᵀ, hᵀ, w1, w_up and w2 are stored in the cast dtype — the TensorCopy out of the
transpose's PSUM tile, the weight DMAs and the activation that writes hᵀ are the casts — while
x (the transposes' stationary, paired with the fp32 identity) and every other tile stay fp32.
The gated activations compute z in place in its PSUM tile, so hᵀ is rounded once, at the end.

Layout. The first matmul produces hᵀ directly, so h needs no transpose between the two:
hᵀ[H, tokens] = Σ_K w1[K, H]ᵀ · xᵀ[K, tokens] puts H on partitions, where b1 is a
per-partition column and rides on the ScalarE activation that evicts PSUM; and hᵀ is
exactly the stationary operand of the second matmul, y[tokens, N] = Σ_H hᵀ[H, tokens]ᵀ ·
w2[H, N], which leaves tokens on partitions and N contiguous for the output DMA (b2 is added
on VectorE from a partition-broadcast tile). Tokens go in blocks of up to 512 (one PSUM bank
as the first matmul's moving free size); within a block the second matmul runs per 128
tokens, each into its own PSUM bank, so every w2 tile is loaded once per block.

The point of the fused kernel: hᵀ for a whole token block stays in SBUF between the two
matmuls (⌈H/128⌉·block·4 bytes per partition), never going through DRAM. When that, xᵀ
and the working tiles do not fit, the block shrinks (512 → 256 → 128 tokens); H too large
even for 128 tokens fails with `cg.fail`.

Weights held whole (docs/mlp.md#weights). When every weight comes in whole 128-row tiles and
together they fit in what the kernel's tiles leave of each partition, less room for the
activations live around the block (`activation_room`: a base-size encoder's w1 and w2, 36 KiB
each in bf16, at any batch up to 4; a large one's, 64 KiB each, at batch 1), each is loaded
once, before any compute and for every token block, by unrolled DMAs of about CHUNK_BYTES per
partition that take the DMA queues in turn: w1 (and w_up) by runs of hidden tiles, w2 by runs
of row tiles, in the order the matmuls use them. The hidden loop and w2's row loop run once
per chunk, so each run waits only for its own chunk's DMA, and no load waits for a matmul to
free a buffer: a weight load depends on nothing of the node, so it runs while earlier nodes
compute.

Otherwise weights stream per block: for each 128-column
block of w1/w_up (the stationaries) and each ≤512-column block of w2 (the movings), one DMA
brings every 128-row tile of the block when the weight's rows come in whole tiles and its
columns are contiguous. A block larger than WEIGHT_BLOCK_BYTES per partition (a classifier's
25,088 input features) comes in groups of row tiles, all of one size (`balanced`), one DMA
per group, the groups' copies
rotating so that the next group loads while this one is multiplied (`row_group`,
`MlpEmitter.weight_rows`). Otherwise tile by tile, transposed ones flipped on the PE array by
`matmul_tiles.load_tile`. Under the autocast a constant transposed weight (trans_w1, trans_w2:
Gemm's transB) read by this node only is stored transposed at compile time
(`matmul_tiles.stored_transposed`, docs/autocast.md#weights), so it is never flipped.
b1 and b_up are loaded once, one column per hidden tile. x is read in place when the memory
plan keeps it in SBUF, and its flips rotate over four 128-column PSUM slots of one bank, so the
PE array flips the next K tile while the previous one is copied out; hᵀ accumulates in two
PSUM banks when they are free, so the next hidden tile's matmuls need not wait for this one's
activation.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass

from onnx2bir.bir.enums import ActFunc, AluOp, Dtype
from onnx2bir.bir.ir import AccessPattern
from onnx2bir.bir.opcodes import (
    MATMUL_MAX_MOVING_FREE,
    NUM_PARTITIONS,
    SB_ALIGN,
    SBUF_BYTES_PER_PARTITION,
)
from onnx2bir.codegen.act_range import reciprocal_sqrt
from onnx2bir.codegen.casting import pe_operand_dtype
from onnx2bir.codegen.driver import BirCodeGen
from onnx2bir.codegen.matmul_tiles import (
    BANK_FP32,
    PANEL_FLIPS,
    MatrixView,
    load_tile,
    stored_transposed,
)
from onnx2bir.codegen.tiling import (
    Affine,
    Tile,
    buffer_count,
    copy_stride,
    tile_count,
    tile_index,
    tiles,
)
from onnx2bir.graph import Node

P = NUM_PARTITIONS
N_CHUNK = MATMUL_MAX_MOVING_FREE
TOKEN_BLOCKS = (512, 256, 128)
QUICK_GELU_ALPHA = 1.702
LUT_ACTIVATIONS = {
    "relu": ActFunc.RELU,
    "gelu": ActFunc.GELU,
    "gelu_tanh": ActFunc.GELU_TANH,
    "silu": ActFunc.SILU,
}
ACTIVATIONS = (*LUT_ACTIVATIONS, "quick_gelu", "swiglu")
PROGRAM = "program"  # the activation given as steps (attr `program`)
NORMS = ("layer", "rms")  # attr `norm`: the inner normalisation over the hidden features


@dataclass(frozen=True)
class MlpArgs:
    x: MatrixView  # [T, K]
    w1: MatrixView  # [K, H]
    b1: str | None
    w2: MatrixView  # [H, N]
    b2: str | None
    w_up: MatrixView | None  # [K, H]
    b_up: str | None
    y: MatrixView  # [T, N]
    activation: str
    out_dtype: Dtype
    program: dict | None = None  # activation "program": {"sources", "out", "steps"}
    bias_offsets: tuple[int, int] = (0, 0)  # b1's and b_up's first element (fused projection)
    norm: str | None = None  # "layer" or "rms": the inner normalisation over H
    norm_epsilon: float = 0.0
    norm_scale: str | None = None  # [H]
    norm_bias: str | None = None  # [H]

    @property
    def registers(self) -> int:
        return self.program["sources"] + len(self.program["steps"]) if self.program else 0

    @property
    def tokens(self) -> int:
        return self.x.rows

    @property
    def k(self) -> int:
        return self.x.cols

    @property
    def h(self) -> int:
        return self.w2.rows

    @property
    def n(self) -> int:
        return self.w2.cols


def _row_major(loc: str, rows: int, cols: int) -> MatrixView:
    return MatrixView(loc, Affine(), rows, cols, cols, 1)


def mlp_args(cg: BirCodeGen, node: Node) -> MlpArgs:
    attrs = node.attrs
    names = [*node.inputs, *[""] * 9][:9]
    x, w1, b1, w2, b2, w_up, b_up, norm_scale, norm_bias = names
    out = node.outputs[0]
    norm = attrs.get("norm") or None
    if norm not in (None, *NORMS):
        raise cg.fail(f"norm {norm!r} is not one of {', '.join(NORMS)}")
    if (norm_scale or norm_bias) and norm is None:
        raise cg.fail(f"inputs {names}: a norm scale or bias without attr norm")
    activation = attrs.get("activation", "")
    if activation not in (*ACTIVATIONS, PROGRAM):
        raise cg.fail(
            f"activation {activation!r} is not one of {', '.join((*ACTIVATIONS, PROGRAM))}"
        )
    program = None
    if activation == PROGRAM:
        try:
            program = json.loads(attrs.get("program") or "")
            gated = program["sources"] == 2
        except (ValueError, KeyError, TypeError) as exc:
            raise cg.fail(f"attr program is not a valid program: {exc}") from None
    else:
        gated = activation == "swiglu"
    if not (x and w1 and w2) or gated != bool(w_up):
        raise cg.fail(f"inputs {names}: x, w1, w2 are required, w_up exactly for gated forms")
    tensors = cg.graph.tensors
    x_shape = tuple(tensors[x].shape)
    k, t = x_shape[-1], math.prod(x_shape[:-1])

    def weight(name: str, transposed: bool, rows: int) -> MatrixView:
        shape = tuple(tensors[name].shape)
        if len(shape) != 2:
            raise cg.fail(f"weight {name!r} {shape} is not a matrix")
        # A constant transposed weight is stored transposed at compile time under the
        # autocast (docs/autocast.md#weights): plain row DMAs that cast, no PE flips.
        stored = stored_transposed(cg, name, node.name) if transposed else None
        if stored is not None:
            view = stored
        else:
            view = _row_major(cg.dram(name).name, *shape)
            view = view.T if transposed else view
        if view.rows != rows:
            raise cg.fail(f"weight {name!r} {shape} does not contract {rows} features")
        return view

    def bias(name: str, size: int, offset: int | None = None) -> str | None:
        """A [size] vector, or (`offset` given: a fused projection's bias) `size` elements of
        a longer one from `offset`."""
        if not name:
            return None
        count = math.prod(tensors[name].shape)
        if count != size if offset is None else offset + size > count:
            shape = tuple(tensors[name].shape)
            raise cg.fail(f"bias {name!r} {shape} has no [{size}] from {offset or 0}")
        return cg.dram(name).name

    def hidden_part(view: MatrixView, name: str, offset: int, h: int) -> MatrixView:
        """Columns offset .. offset + h of a fused projection's weight."""
        if not fused:
            return view
        if offset < 0 or offset + h > view.cols:
            raise cg.fail(
                f"weight {name!r} {tuple(tensors[name].shape)} has no {h} hidden features "
                f"from {offset}"
            )
        return view.window(0, view.rows, offset, h)

    fused = "w1_offset" in attrs or "w_up_offset" in attrs
    offsets = int(attrs.get("w1_offset", 0)), int(attrs.get("w_up_offset", 0))
    w1_full = weight(w1, bool(attrs.get("trans_w1", 0)), k)
    if len(tensors[w2].shape) != 2:
        raise cg.fail(f"weight {w2!r} {tuple(tensors[w2].shape)} is not a matrix")
    w2_rows = tensors[w2].shape[1 if attrs.get("trans_w2", 0) else 0]
    h = w2_rows if fused else w1_full.cols
    w1_view = hidden_part(w1_full, w1, offsets[0], h)
    w2_view = weight(w2, bool(attrs.get("trans_w2", 0)), h)
    trans_up = attrs.get("trans_w_up", attrs.get("trans_w1", 0))
    up_view = weight(w_up, bool(trans_up), k) if w_up else None
    if up_view is not None:
        if not fused and up_view.cols != h:
            raise cg.fail(f"w_up {tensors[w_up].shape} does not match w1 {tensors[w1].shape}")
        up_view = hidden_part(up_view, w_up, offsets[1], h)
    n = w2_view.cols
    out_shape = tuple(tensors[out].shape)
    if out_shape[-1:] != (n,) or math.prod(out_shape[:-1]) != t:
        # Token-major order is all that matters: a Reshape between the dots (GPT-2) is fine.
        raise cg.fail(f"output {out_shape} does not hold {t} tokens of {n} features")
    return MlpArgs(
        _row_major(cg.dram(x).name, t, k),
        w1_view,
        bias(b1, h, offsets[0] if fused else None),
        w2_view,
        bias(b2, n),
        up_view,
        bias(b_up, h, offsets[1] if fused else None),
        _row_major(cg.dram(out).name, t, n),
        activation,
        tensors[out].dtype,
        program,
        offsets,
        norm,
        float(attrs.get("norm_epsilon", 0.0)),
        bias(norm_scale, h),
        bias(norm_bias, h),
    )


def _row_bytes(elements: int, itemsize: int = 4) -> int:
    return -(-elements * itemsize // SB_ALIGN) * SB_ALIGN


WEIGHT_BLOCK_BYTES = 32 * 1024  # SBUF per partition one weight's column block may take


def row_group(view: MatrixView, width: int, itemsize: int) -> int:
    """Row tiles of a column block of `width` that one DMA brings: all of them when the block
    fits in WEIGHT_BLOCK_BYTES, else as many as fit (a classifier's 25,088-row weight comes in
    groups); 0 when the weight cannot come in blocks (its columns are strided or its rows are
    not whole 128-row tiles) and is loaded one tile at a time."""
    if view.col_stride != 1 or view.rows % P:
        return 0
    per_tile = min(width, view.cols) * itemsize
    return max(1, min(view.rows // P, WEIGHT_BLOCK_BYTES // per_tile))


def balanced(group: int, row_tiles: int) -> int:
    """Row tiles per group when `row_tiles` come in as few groups of at most `group` as they
    need, all of one size but the last (VGG's 196 row tiles in four groups of 49, not three
    of 64 and one of 4). A small last group is a DMA of little but fixed cost that every
    column block waits for: in VGG-16's classifier each block of four loads took 27.0 us
    against 23.6 us for its bytes at the core's DMA bandwidth (docs/mlp.md#weights)."""
    return -(-row_tiles // -(-row_tiles // group))


def with_peeled_copy(group: int, copies: int) -> int:
    """Copies a weight tile is allocated with: its rotating copies, plus the peeled first
    group's own when it comes in row groups that rotate (`MlpTiles.rotating_groups`)."""
    return copies + 1 if group and copies > 1 else copies


def whole_rows(view: MatrixView, width: int, itemsize: int) -> bool:
    """Whether one DMA brings every row tile of a column block of `width`."""
    group = row_group(view, width, itemsize)
    return group > 0 and group == view.rows // P


def weight_columns(view: MatrixView, width: int, itemsize: int) -> int:
    """Free elements of the SBUF tile that holds one load of `view`: a group of row tiles of
    a column block, or one tile."""
    width = min(width, view.cols)
    return max(1, row_group(view, width, itemsize)) * width


LIVE_ACTIVATIONS = 3  # activations live around the block: input, output, residual stream
CHUNK_BYTES = 4 * 1024  # SBUF per partition one DMA of a weight held whole brings, at least


def activation_room(a: MlpArgs) -> int:
    """SBUF bytes per partition that weights held whole leave for the activations around the
    block (docs/mlp.md#weights): its input, its output and the residual stream an encoder keeps
    beside them, each counted at the wider of the input and output (fp32, the tokens on
    partitions), so that the memory plan can still keep them on chip. An encoder
    at batch 1 (one tile of tokens) leaves little; at batch 4 (four tiles) BERT-large's MLP
    weights then stream instead of pushing the layer's hidden states out to DRAM."""
    return LIVE_ACTIVATIONS * tile_count(a.tokens, P) * max(a.k, a.n) * Dtype.FP32.itemsize


def chunkable(view: MatrixView) -> bool:
    """Whether a weight comes in DMAs of whole 128-row tiles: contiguous rows of whole tiles."""
    return view.col_stride == 1 and view.rows % P == 0


def chunks(extent: int, tile_bytes: int) -> list[tuple[int, int]]:
    """(start, size) of the runs of 128-wide tiles of [0, extent) one DMA each brings when a
    weight is held whole: as many tiles as make CHUNK_BYTES per partition (`tile_bytes` per
    tile), so that the loads spread over the DMA queues and the first runs are multiplied
    while the last ones are still arriving."""
    step = max(1, CHUNK_BYTES // max(1, tile_bytes)) * P
    return [(start, min(step, extent - start)) for start in range(0, extent, step)]


def load_weight_rows(
    cg: BirCodeGen, view: MatrixView, tile, rows: Tile, cols: Tile, width: int, offset: Affine
) -> None:
    """Row tiles `rows` (whole 128-row tiles) of `view`'s columns `cols` in one DMA: row tile r
    of them at free offset `offset` + r · width of `tile`, rows within the tile on partitions."""
    cg.dma(
        cg.ap(tile, [(width, rows.size // P), (1, cols.size)], offset, partitions=P),
        cg.dram_ap(
            view.loc,
            view.offset + rows.start * view.row_stride + cols.start,
            [(view.row_stride, P), (P * view.row_stride, rows.size // P), (1, cols.size)],
        ),
    )


def sbuf_bytes(a: MlpArgs, block: int, pe_bytes: int = 4) -> int:
    """Bytes per partition the kernel's SBUF tiles take for a token block (see MlpTiles);
    `pe_bytes`, the size of a PE operand element."""
    k_tiles, h_tiles = -(-a.k // P), -(-a.h // P)
    gated = a.activation in ("quick_gelu", "swiglu")
    return (
        _row_bytes(a.k)  # x rows
        + _row_bytes(k_tiles * block)  # xᵀ
        + _row_bytes(h_tiles * block)  # hᵀ
        + _row_bytes(P)  # staging
        + _row_bytes(weight_columns(a.w1, P, pe_bytes), pe_bytes)  # w1
        + (_row_bytes(weight_columns(a.w_up, P, pe_bytes), pe_bytes) if a.w_up is not None else 0)
        + _row_bytes(weight_columns(a.w2, N_CHUNK, pe_bytes), pe_bytes)  # w2
        + _row_bytes(N_CHUNK) * 2  # b2, y
        + _row_bytes(2 * h_tiles)  # b1, b_up: one column per hidden tile
        + (_row_bytes(block) if gated else 0)  # the gate's second operand
        + a.registers * _row_bytes(block)  # the program's registers
        + (_norm_bytes(a, block, pe_bytes) if a.norm else 0)
    )


def _norm_bytes(a: MlpArgs, block: int, pe_bytes: int) -> int:
    """The inner norm's tiles (see MlpTiles): h before the norm in fp32 (unless hᵀ is fp32
    itself), the ones, the square, the mean and rstd rows, the scale and shift columns."""
    h_tiles = -(-a.h // P)
    raw = _row_bytes(h_tiles * block) if pe_bytes != 4 else 0
    return raw + _row_bytes(P) + 3 * _row_bytes(block) + _row_bytes(2 * h_tiles)


def token_block(cg: BirCodeGen, a: MlpArgs) -> int:
    """The largest token block whose hᵀ fits in SBUF beside the rest (identity reserved)."""
    available = SBUF_BYTES_PER_PARTITION - _row_bytes(P)
    pe_bytes = pe_operand_dtype(cg, a.out_dtype).itemsize
    for block in TOKEN_BLOCKS:
        block = min(block, a.tokens)
        if sbuf_bytes(a, block, pe_bytes) <= available:
            return block
    raise cg.fail(
        f"H = {a.h}, K = {a.k}: hᵀ and xᵀ for even 128 tokens need "
        f"{sbuf_bytes(a, min(P, a.tokens), pe_bytes)} bytes per partition, SBUF has {available}"
    )


class MlpTiles:
    """The kernel's SBUF and PSUM tiles; `staging` and `transposed` are what `load_tile`
    uses to flip a transposed weight tile."""

    def __init__(self, cg: BirCodeGen, a: MlpArgs, block: int) -> None:
        fp32 = Dtype.FP32
        pe = pe_operand_dtype(cg, a.out_dtype)  # the PE operands' dtype under the autocast
        self.x = cg.sb_tile("x", P, a.k, fp32)
        self.xt = cg.sb_tile("xT", P, -(-a.k // P) * block, pe)
        self.h = cg.sb_tile("hT", P, -(-a.h // P) * block, pe)
        self.staging = cg.sb_tile("staging", P, P, fp32)
        self.b2 = cg.sb_tile("b2", P, N_CHUNK, fp32)
        self.y = cg.sb_tile("y", P, N_CHUNK, a.out_dtype)
        # b1 and b_up, loaded once: column j holds the biases of hidden tile j.
        self.h_tiles = -(-a.h // P)
        self.bias = cg.sb_tile("bias", P, 2 * self.h_tiles, fp32)
        gated = a.activation in ("quick_gelu", "swiglu")
        self.gate = cg.sb_tile("gate", P, block, fp32) if gated else None
        self.registers = [cg.sb_tile(f"r{i}", P, block, fp32) for i in range(a.registers)]
        # The inner norm (docs/mlp.md#inner-norm): the activation writes h in fp32 (into hᵀ
        # itself when that is fp32), the norm writes hᵀ. Its row sums come from the PE array
        # (a ones stationary: every partition gets the sum over the hidden tile's partitions),
        # accumulated in the first bank of h's PSUM tile, free between the two matmuls.
        self.raw = self.h
        if a.norm:
            if pe is not fp32:
                self.raw = cg.sb_tile("h_raw", P, self.h_tiles * block, fp32)
            self.ones = cg.sb_tile("ones", P, P, fp32)
            self.square = cg.sb_tile("square", P, block, fp32)
            self.mean = cg.sb_tile("mean", P, block, fp32)
            self.rstd = cg.sb_tile("rstd", P, block, fp32)
            self.affine = cg.sb_tile("norm_affine", P, 2 * self.h_tiles, fp32)
        # The flips of x go through PANEL_FLIPS 128-column slots of one bank, so that one
        # flip need not wait for the previous one's copy out of PSUM.
        self.transposed = cg.psum_tile("transposed", P, PANEL_FLIPS * P)
        self.up_ps = cg.psum_tile("up", P, block) if a.w_up is not None else None
        self.y_ps = cg.psum_tile("y", P, -(-block // P) * N_CHUNK)
        # hᵀ accumulates in a bank per hidden tile in flight: with a second one, the next
        # tile's matmuls need not wait for this one's activation to empty its bank.
        self.h_banks = 2 if cg.psum_free_banks() >= 2 and tile_count(a.h, P) > 1 else 1
        self.h_ps = cg.psum_tile("h", P, (self.h_banks - 1) * BANK_FP32 + block)
        # A weight tile holds every 128-row tile of one column block (`whole_rows`), a group
        # of them when the block is larger than WEIGHT_BLOCK_BYTES (`row_group`), or one
        # 128 x 128 tile when the weight is transposed or its rows are not whole tiles; with
        # room left, two copies, so that the next load is in flight while this one is
        # multiplied (docs/buffers.md#rotation). Whole blocks rotate with the column blocks,
        # groups with the row groups (`MlpEmitter.weight_rows`).
        self.strides: dict[str, int] = {}
        self.pe_bytes = pe.itemsize
        self.pe_dtype = pe
        first = [view for view in (a.w1, a.w_up) if view is not None]
        if self.held_whole(cg, a, first, pe):
            return
        self.hidden_group = self.grouped(first, P)
        self.output_group = self.grouped([a.w2], N_CHUNK)
        width1 = max(weight_columns(view, P, pe.itemsize) for view in first)
        width2 = weight_columns(a.w2, N_CHUNK, pe.itemsize)
        per_copy1 = copy_stride(width1, pe) * pe.itemsize * len(first)
        per_copy2 = copy_stride(width2, pe) * pe.itemsize
        # The first weights' copies leave room for one copy of w2.
        h_trips = tile_count(a.h, P)
        if self.hidden_group:
            self.hidden_group, self.w1_copies = self.rotating_groups(
                cg, first, P, h_trips, a.k, per_copy2
            )
            width1 = self.hidden_group * min(P, first[0].cols)
            self.hidden_copies = min(2, h_trips)  # for the PSUM banks of hᵀ only
        else:
            self.w1_copies = buffer_count(cg, h_trips, per_copy1, limit=2, reserved=per_copy2)
            self.hidden_copies = self.w1_copies
        copies1 = with_peeled_copy(self.hidden_group, self.w1_copies)
        self.w1 = self._weight(cg, "w1", width1, pe, copies1)
        self.w_up = self._weight(cg, "w_up", width1, pe, copies1) if a.w_up is not None else None
        n_trips = tile_count(a.n, N_CHUNK)
        if self.output_group:
            self.output_group, self.w2_copies = self.rotating_groups(
                cg, [a.w2], N_CHUNK, n_trips, a.h, 0
            )
            width2 = self.output_group * min(N_CHUNK, a.w2.cols)
            self.output_copies = 1
        else:
            self.w2_copies = self.output_copies = buffer_count(cg, n_trips, per_copy2, limit=2)
        self.w2 = self._weight(
            cg, "w2", width2, pe, with_peeled_copy(self.output_group, self.w2_copies)
        )

    def rotating_groups(
        self,
        cg: BirCodeGen,
        views: list[MatrixView],
        width: int,
        blocks: int,
        extent: int,
        reserved: int,
    ) -> tuple[int, int]:
        """(row tiles per group, rotating copies) of weights `views` that come in row groups of
        column blocks `width` wide, `blocks` blocks of `extent` rows. The first group of a
        block opens the accumulation and is peeled out of the group loop; it takes a copy of
        its own, so that no load in the loop waits for its matmuls, and the other groups
        rotate over two copies. Groups halve until the three copies fit; when not even groups
        of one tile do, the largest groups in one copy (every load then waits for the last
        group's matmuls). Either way the groups are then evened out (`balanced`)."""
        largest = group = self.grouped(views, width)
        while group:
            per_copy = copy_stride(group * min(width, views[0].cols), self.pe_dtype)
            per_copy *= self.pe_dtype.itemsize * len(views)
            trips = blocks * tile_count(extent, group * P)
            copies = buffer_count(cg, trips, per_copy, limit=2, reserved=reserved + per_copy)
            if copies > 1:
                return balanced(group, tile_count(extent, P)), copies
            group //= 2
        return balanced(largest, tile_count(extent, P)), 1

    def held_whole(self, cg: BirCodeGen, a: MlpArgs, first: list[MatrixView], pe: Dtype) -> bool:
        """Every weight in SBUF whole, when all come in whole row tiles and together fit in
        what the kernel's tiles leave of each partition less `activation_room`: w1 (and w_up)
        as K/128 row tiles of H columns, w2 as H/128 row tiles of N columns, loaded once,
        before any compute, in chunks (`chunks`: w1's by hidden tiles, w2's by row tiles), one
        DMA each. No load then waits for a matmul to free a buffer, the chunks take different
        DMA queues, and a weight with no input of the node to wait for is loaded while earlier
        nodes compute. The weights of every token block are the same tiles."""
        views = [*first, a.w2]
        whole = sum(copy_stride(v.rows // P * v.cols, pe) * pe.itemsize for v in views)
        room = cg.sb_free_bytes() - activation_room(a)
        self.whole = all(chunkable(v) for v in views) and whole <= room
        if not self.whole:
            return False
        k_tiles = a.k // P
        self.w1_chunks = chunks(a.h, k_tiles * P * pe.itemsize)
        self.w2_chunks = chunks(a.h, a.n * pe.itemsize)
        self.hidden_group = self.output_group = 0
        self.w1_copies = self.w2_copies = self.output_copies = 1
        self.hidden_copies = min(2, tile_count(a.h, P))  # for the PSUM banks of hᵀ only
        self.w1 = self._weight(cg, "w1", k_tiles * a.h, pe, 1)
        self.w_up = self._weight(cg, "w_up", k_tiles * a.h, pe, 1) if a.w_up is not None else None
        self.w2 = self._weight(cg, "w2", a.h // P * a.n, pe, 1)
        # The next node with two copies of its weights loads the one away from these
        # (docs/buffers.md#weights).
        cg.arena.loaded_weights(self.w1.address, self.w2.address + self.w2.bytes_per_partition)
        return True

    def grouped(self, views: list[MatrixView], width: int) -> int:
        """Row tiles per load when the weights `views` (read together) come in row groups
        rather than whole column blocks or single tiles; 0 otherwise."""
        groups = [row_group(view, width, self.pe_bytes) for view in views]
        if min(groups) == 0 or all(g == v.rows // P for g, v in zip(groups, views, strict=True)):
            return 0
        return min(groups)

    def _weight(self, cg: BirCodeGen, tag: str, free: int, dtype: Dtype, copies: int):
        stride = copy_stride(free, dtype)
        loc = cg.sb_tile(tag, P, (copies - 1) * stride + free, dtype)
        self.strides[loc.name] = stride
        return loc

    def at(self, tile, slot: Affine) -> Affine:
        """Element offset of copy `slot` of a weight tile."""
        return slot * self.strides[tile.name]


def trace_mlp(cg: BirCodeGen, node: Node) -> None:
    a = mlp_args(cg, node)
    block = token_block(cg, a)
    MlpEmitter(cg, a, MlpTiles(cg, a, block), block).run()


class MlpEmitter:
    def __init__(self, cg: BirCodeGen, a: MlpArgs, t: MlpTiles, block: int) -> None:
        self.cg, self.a, self.t, self.block = cg, a, t, block

    def run(self) -> None:
        self.load_biases()
        if self.t.whole:
            self.load_whole()
        for blk in tiles(self.cg, self.a.tokens, self.block, "tok"):
            self.load_x_transposed(blk)
            self.hidden(blk)
            if self.a.norm:
                self.normalize(blk)
            self.output(blk)

    def load_biases(self) -> None:
        """b1 and b_up into their columns of the bias tile, the norm's scale and shift into
        theirs, once for the whole kernel; the norm's ones."""
        cg, a, t = self.cg, self.a, self.t
        columns = [(a.b1, t.bias, 0, a.bias_offsets[0]), (a.b_up, t.bias, 1, a.bias_offsets[1])]
        if a.norm:
            columns += [(a.norm_scale, t.affine, 0, 0), (a.norm_bias, t.affine, 1, 0)]
            cg.memset(cg.ap(t.ones, [(1, P)], partitions=P), 1.0)
        for name, tile, column, offset in columns:
            if name is not None:
                self.load_columns(name, tile, column * t.h_tiles, offset)

    def load_whole(self) -> None:
        """Every weight into its whole tile (MlpTiles.held_whole), chunk by chunk in the order
        the matmuls use them: w1 (with w_up) by runs of hidden tiles, then w2 by runs of row
        tiles. The DMAs are unrolled, so they take the DMA queues in turn."""
        cg, a, t = self.cg, self.a, self.t
        every_k = Tile(Affine(), a.k, True)
        for start, size in t.w1_chunks:
            cols = Tile(Affine(start), size, False)
            for view, tile in ((a.w1, t.w1), (a.w_up, t.w_up)):
                if view is not None:
                    load_weight_rows(cg, view, tile, every_k, cols, a.h, Affine(start))
        every_n = Tile(Affine(), a.n, True)
        for start, size in t.w2_chunks:
            rows = Tile(Affine(start), size, False)
            load_weight_rows(cg, a.w2, t.w2, rows, every_n, a.n, Affine(start // P * a.n))

    def load_columns(self, name: str, tile, base: int, offset: int) -> None:
        """Elements offset .. offset + H of vector `name`, one column per hidden tile."""
        cg = self.cg
        full, rest = divmod(self.a.h, P)
        if full:
            cg.dma(
                cg.ap(tile, [(1, full)], base, partitions=P),
                cg.dram_ap(name, Affine(offset), [(1, P), (P, full)]),
            )
        if rest:
            cg.dma(
                cg.ap(tile, [(1, 1)], base + full, partitions=rest),
                cg.dram_ap(name, Affine(offset + full * P), [(1, rest), (1, 1)]),
            )

    def load_x_transposed(self, blk: Tile) -> None:
        """xᵀ[K, block] from 128-token rows (read in place when x has an SBUF home), flipped
        per K tile on the PE array through `PANEL_FLIPS` rotating PSUM slots."""
        cg, a, t = self.cg, self.a, self.t
        for ts in tiles(cg, blk.size, P, "tx"):
            rows = cg.read_operand(
                cg.ap(t.x, [(1, a.k)], partitions=ts.size),
                cg.dram_ap(a.x.loc, (blk.start + ts.start) * a.k, [(a.k, ts.size), (1, a.k)]),
            )
            for kc in tiles(cg, a.k, P, "kx", buffers=PANEL_FLIPS):
                flipped = cg.ap(t.transposed, [(1, ts.size)], kc.slot * P, partitions=kc.size)
                cg.matmul(
                    flipped,
                    cg.columns(rows, kc.start, kc.size),
                    cg.identity(ts.size),
                    accumulate=False,
                )
                cg.tensor_copy(
                    cg.ap(
                        t.xt,
                        [(1, ts.size)],
                        tile_index(kc, P) * self.block + ts.start,
                        partitions=kc.size,
                    ),
                    flipped,
                )

    def hidden(self, blk: Tile) -> None:
        """hᵀ[H, block] = act(w1ᵀ·xᵀ + b1), kept in SBUF."""
        cg, a, t = self.cg, self.a, self.t
        for hc in self.hidden_tiles():
            bank = hc.slot if t.h_banks == t.hidden_copies else Affine()
            acc = cg.ap(t.h_ps, [(1, blk.size)], bank * BANK_FP32, partitions=hc.size)
            up = cg.ap(t.up_ps, [(1, blk.size)], partitions=hc.size) if t.up_ps else None
            loads = [(v, tile) for v, tile in ((a.w1, t.w1), (a.w_up, t.w_up)) if v is not None]
            rows = self.weight_rows(loads, a.k, hc, P, "k", hc.slot, t.hidden_group, t.w1_copies)
            for kc, weight in rows:
                moving = cg.ap(
                    t.xt, [(1, blk.size)], tile_index(kc, P) * self.block, partitions=kc.size
                )
                cg.matmul(acc, weight(a.w1, t.w1), moving, accumulate=not kc.first)
                if up is not None:
                    cg.matmul(up, weight(a.w_up, t.w_up), moving, accumulate=not kc.first)
            h = cg.ap(t.raw, [(1, blk.size)], tile_index(hc, P) * self.block, partitions=hc.size)
            self.activate(h, acc, up, hc, blk)

    def hidden_tiles(self) -> Iterator[Tile]:
        """The hidden tiles, under a loop per chunk of w1 when the weights are held whole (so
        that a chunk's matmuls wait for that chunk's DMA only), else under one loop."""
        cg, t = self.cg, self.t
        runs = t.w1_chunks if t.whole else [(0, self.a.h)]
        for start, size in runs:
            for hc in tiles(cg, size, P, "h", buffers=t.hidden_copies):
                yield Tile(hc.start + start, hc.size, hc.first, hc.slot)

    def normalize(self, blk: Tile) -> None:
        """hᵀ = norm(h) over the H partitions of every token (docs/mlp.md#inner-norm):
        layer: (h − mean)·rstd·scale + shift, rstd = 1/√(mean((h − mean)²) + ε) (two passes:
        the mean, then the centred squares); rms: h·rstd·scale (+ shift), rstd = 1/√(mean(h²)
        + ε). A sum over H is a matmul per hidden tile of a ones stationary by the tile,
        accumulating [128, tokens] in PSUM: the sum of every token on every partition, so the
        mean and rstd rows apply to any hidden tile as they are."""
        cg, a, t = self.cg, self.a, self.t
        sums = cg.ap(t.h_ps, [(1, blk.size)], partitions=P)
        mean = cg.ap(t.mean, [(1, blk.size)], partitions=P)
        rstd = cg.ap(t.rstd, [(1, blk.size)], partitions=P)

        def raw(hc: Tile) -> AccessPattern:
            return cg.ap(t.raw, [(1, blk.size)], tile_index(hc, P) * self.block, partitions=hc.size)

        def row_sum(values, name: str) -> None:
            for hc in tiles(cg, a.h, P, name, peel_first=True):
                ones = cg.ap(t.ones, [(1, P)], partitions=hc.size)
                cg.matmul(sums, ones, values(hc), accumulate=not hc.first)

        def squares(hc: Tile) -> AccessPattern:
            square = cg.ap(t.square, [(1, blk.size)], partitions=hc.size)
            cg.activation(square, raw(hc), ActFunc.SQUARE)
            return square

        if a.norm == "layer":
            row_sum(raw, "hsum")
            cg.activation(mean, sums, ActFunc.COPY, scale=1.0 / a.h)
            for hc in tiles(cg, a.h, P, "hc"):
                part = cg.ap(t.mean, [(1, blk.size)], partitions=hc.size)
                cg.tensor_tensor(raw(hc), raw(hc), part, AluOp.SUBTRACT)
        row_sum(squares, "hsq")
        reciprocal_sqrt(cg, rstd, sums, 1.0 / a.h, a.norm_epsilon)
        for hc in tiles(cg, a.h, P, "hn"):
            h = cg.ap(t.h, [(1, blk.size)], tile_index(hc, P) * self.block, partitions=hc.size)
            part = cg.ap(t.rstd, [(1, blk.size)], partitions=hc.size)
            affine = self.norm_columns(hc)
            if not affine:
                cg.tensor_tensor(h, raw(hc), part, AluOp.MULTIPLY)
                continue
            cg.tensor_tensor(raw(hc), raw(hc), part, AluOp.MULTIPLY)
            (op0, scalar0), *more = affine
            op1, scalar1 = more[0] if more else (None, None)
            cg.tensor_scalar(h, raw(hc), op0, scalar0, op1, scalar1)

    def norm_columns(self, hc: Tile) -> list[tuple[AluOp, AccessPattern]]:
        """(op, column) of the norm's scale (multiply) and shift (add) present, for hidden
        tile `hc`: per-partition scalars of one TensorScalar."""
        t, a = self.t, self.a
        return [
            (op, self.cg.ap(t.affine, [(1, 1)], base + tile_index(hc, P), partitions=hc.size))
            for name, op, base in (
                (a.norm_scale, AluOp.MULTIPLY, 0),
                (a.norm_bias, AluOp.ADD, t.h_tiles),
            )
            if name is not None
        ]

    def weight_rows(
        self, loads, extent: int, cols: Tile, width: int, name: str, slot, group: int, copies: int
    ):
        """The 128-row tiles of the weights `loads` ([(view, tile)], read together) for columns
        `cols` of a block `width` wide, under the loops that bring them: yields (rows, operand),
        `rows.first` on the tile that opens the accumulation and operand(view, tile) the
        weight's [rows, cols] tile. Whole column blocks are loaded here in copy `slot`; with
        a row `group` (MlpTiles.grouped), each group of row tiles is loaded by one DMA per
        weight in a loop of its own whose `copies` rotate, and the row tiles run inside it."""
        cg, t = self.cg, self.t
        if t.whole:
            yield from self.whole_rows(loads, extent, cols, name)
            return
        if not group:
            for view, tile in loads:
                if whole_rows(view, width, t.pe_bytes):
                    every = Tile(Affine(), view.rows, True)
                    at = t.at(tile, slot)
                    load_weight_rows(cg, view, tile, every, cols, min(width, view.cols), at)
            for rows in tiles(cg, extent, P, name, peel_first=True):
                yield rows, lambda v, tile, r=rows: self.weight_tile(v, tile, r, cols, width, slot)
            return
        width = min(width, loads[0][0].cols)
        for rg in tiles(cg, extent, group * P, f"{name}g", peel_first=True, buffers=copies):
            if rg.first and copies > 1:  # the peeled group's own copy (`rotating_groups`)
                rg = Tile(rg.start, rg.size, True, Affine(copies))
            for view, tile in loads:
                load_weight_rows(cg, view, tile, rg, cols, width, t.at(tile, rg.slot))
            for kc in tiles(cg, rg.size, P, name, peel_first=rg.first):
                base = tile_index(kc, P) * width

                def operand(view, tile, rg=rg, base=base, size=kc.size) -> AccessPattern:
                    return cg.ap(
                        tile, [(1, cols.size)], t.at(tile, rg.slot) + base, partitions=size
                    )

                yield Tile(rg.start + kc.start, kc.size, rg.first and kc.first), operand

    def whole_rows(self, loads, extent: int, cols: Tile, name: str):
        """weight_rows for weights held whole: row tile r of a weight of C columns at free
        offset r·C of its tile. w2's row tiles run under a loop per chunk (`MlpTiles.w2_chunks`,
        whose DMAs they wait for); w1's (the K tiles) under one loop, their chunk being the
        hidden tile's."""
        cg = self.cg
        runs = self.t.w2_chunks if loads[0][1] is self.t.w2 else [(0, extent)]
        for index, (start, size) in enumerate(runs):
            for rows in tiles(cg, size, P, name, peel_first=index == 0):
                rows = Tile(rows.start + start, rows.size, rows.first and index == 0)

                def operand(view, tile, rows=rows) -> AccessPattern:
                    at = tile_index(rows, P) * view.cols + cols.start
                    return cg.ap(tile, [(1, cols.size)], at, partitions=rows.size)

                yield rows, operand

    def weight_tile(
        self, view: MatrixView, tile, rows: Tile, cols: Tile, width: int, slot: Affine
    ) -> AccessPattern:
        """Rows `rows` x columns `cols` of a weight, in copy `slot` of its tile: a slice of
        its loaded column block, or one tile loaded (and flipped when transposed) now."""
        copy = self.t.at(tile, slot)
        if whole_rows(view, width, self.t.pe_bytes):
            width = min(width, view.cols)
            return self.cg.ap(
                tile, [(1, cols.size)], copy + tile_index(rows, P) * width, partitions=rows.size
            )
        window = view.window(rows.start, rows.size, cols.start, cols.size)
        return load_tile(self.cg, window, tile, self.t, offset=copy)

    def bias_column(self, name: str | None, column: int, hc: Tile) -> AccessPattern | None:
        if name is None:
            return None
        base = column * self.t.h_tiles
        return self.cg.ap(self.t.bias, [(1, 1)], base + tile_index(hc, P), partitions=hc.size)

    def activate(
        self, h: AccessPattern, acc: AccessPattern, up: AccessPattern | None, hc: Tile, blk: Tile
    ) -> None:
        cg, a, t = self.cg, self.a, self.t
        b1 = self.bias_column(a.b1, 0, hc)
        if a.program is not None:
            self.run_program(h, acc, up, hc, blk, b1)
            return
        if a.activation in LUT_ACTIVATIONS:
            cg.activation(h, acc, LUT_ACTIVATIONS[a.activation], bias=b1)
            return
        # The first factor is computed in place in PSUM (fp32), so h is written once.
        gate = cg.ap(t.gate, [(1, blk.size)], partitions=hc.size)
        if a.activation == "quick_gelu":  # z = x·w1 + b1; h = z · sigmoid(1.702·z)
            cg.activation(acc, acc, ActFunc.COPY, bias=b1)
            cg.activation(gate, acc, ActFunc.SIGMOID, scale=QUICK_GELU_ALPHA)
            cg.tensor_tensor(h, acc, gate, AluOp.MULTIPLY)
            return
        # swiglu: h = silu(x·w1 + b1) · (x·w_up + b_up)
        cg.activation(acc, acc, ActFunc.SILU, bias=b1)
        b_up = self.bias_column(a.b_up, 1, hc)
        if b_up is None:
            cg.activation(gate, up, ActFunc.COPY)  # two TensorTensor inputs never both in PSUM
        else:
            cg.tensor_scalar(gate, up, AluOp.ADD, b_up)
        cg.tensor_tensor(h, acc, gate, AluOp.MULTIPLY)

    def run_program(self, h, acc, up, hc: Tile, blk: Tile, b1) -> None:
        """The activation as the region's program, one instruction per step."""
        cg, a, program = self.cg, self.a, self.a.program
        regs = [cg.ap(tile, [(1, blk.size)], partitions=hc.size) for tile in self.t.registers]
        cg.activation(regs[0], acc, ActFunc.COPY, bias=b1)
        if program["sources"] == 2:
            b_up = self.bias_column(a.b_up, 1, hc)
            if b_up is None:
                cg.tensor_copy(regs[1], up)
            else:
                cg.tensor_scalar(regs[1], up, AluOp.ADD, b_up)
        for step in program["steps"]:
            program_step(cg, regs, step)
        cg.tensor_copy(h, regs[program["out"]])

    def output(self, blk: Tile) -> None:
        """y[block, N] = hᵀᵀ·w2 + b2, per 128 tokens into separate PSUM banks."""
        cg, a, t = self.cg, self.a, self.t
        for nc in tiles(cg, a.n, N_CHUNK, "n", buffers=t.output_copies):
            if a.b2 is not None:  # b2 broadcast to every partition by a stride-0 DMA
                cg.dma(
                    cg.ap(t.b2, [(1, nc.size)], partitions=P),
                    cg.dram_ap(a.b2, nc.start, [(0, P), (1, nc.size)]),
                )
            rows = self.weight_rows(
                [(a.w2, t.w2)], a.h, nc, N_CHUNK, "h2", nc.slot, t.output_group, t.w2_copies
            )
            for hc, weight in rows:
                w2 = weight(a.w2, t.w2)
                for ts in tiles(cg, blk.size, P, "ty"):
                    cg.matmul(
                        self.y_acc(ts, nc),
                        cg.ap(
                            t.h,
                            [(1, ts.size)],
                            tile_index(hc, P) * self.block + ts.start,
                            partitions=hc.size,
                        ),
                        w2,
                        accumulate=not hc.first,
                    )
            for ts in tiles(cg, blk.size, P, "ty"):
                y = cg.ap(t.y, [(1, nc.size)], partitions=ts.size)
                if a.b2 is not None:
                    cg.tensor_tensor(
                        y,
                        self.y_acc(ts, nc),
                        cg.ap(t.b2, [(1, nc.size)], partitions=ts.size),
                        AluOp.ADD,
                    )
                else:
                    cg.activation(y, self.y_acc(ts, nc), ActFunc.COPY)
                cg.dma(
                    cg.dram_ap(
                        a.y.loc,
                        (blk.start + ts.start) * a.n + nc.start,
                        [(a.n, ts.size), (1, nc.size)],
                    ),
                    y,
                )

    def y_acc(self, ts: Tile, nc: Tile) -> AccessPattern:
        return self.cg.ap(
            self.t.y_ps, [(1, nc.size)], tile_index(ts, P) * N_CHUNK, partitions=ts.size
        )


def program_step(cg: BirCodeGen, regs: list[AccessPattern], step: dict) -> None:
    dst, a = regs[step["dst"]], regs[step["a"]]
    if step["kind"] == "act":
        cg.activation(dst, a, ActFunc(step["func"]))
    elif step["kind"] == "scalar":
        cg.tensor_scalar(dst, a, AluOp(step["func"]), step["value"], reverse0=step["reverse"])
    else:
        cg.tensor_tensor(dst, a, regs[step["b"]], AluOp(step["func"]))
