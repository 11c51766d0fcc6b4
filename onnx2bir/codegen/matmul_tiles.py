"""Operand views and tiles of the PE matmul lowerings: a `MatrixView` on a DRAM tensor, the SBUF
and PSUM tiles one matmul reuses (`MatmulTiles`), and `load_tile`, which brings a view into SBUF
— one DMA when its rows are contiguous, else the contiguous transpose loaded and flipped on the
PE array against the resident identity (`lower/matmul.py`, `matmul_panels.py`, the MLP kernel).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from onnx2bir.bir.enums import ActFunc, AluOp, Dtype
from onnx2bir.bir.ir import AccessPattern, MemoryLocation
from onnx2bir.bir.opcodes import MATMUL_MAX_MOVING_FREE, NUM_PARTITIONS, PSUM_BANK_BYTES
from onnx2bir.codegen.arena import Arena
from onnx2bir.codegen.casting import pe_operand_dtype
from onnx2bir.codegen.driver import BirCodeGen
from onnx2bir.codegen.tiling import Affine, Tile, copy_stride


@dataclass(frozen=True)
class MatrixView:
    """A 2-D window on a DRAM tensor: element (i, j) at offset + i·row_stride + j·col_stride."""

    loc: str
    offset: Affine
    rows: int
    cols: int
    row_stride: int
    col_stride: int

    @property
    def T(self) -> MatrixView:  # noqa: N802 - the usual name for a transpose
        return MatrixView(
            self.loc, self.offset, self.cols, self.rows, self.col_stride, self.row_stride
        )

    def window(self, row0: Affine, rows: int, col0: Affine, cols: int) -> MatrixView:
        return MatrixView(
            self.loc,
            self.offset + row0 * self.row_stride + col0 * self.col_stride,
            rows,
            cols,
            self.row_stride,
            self.col_stride,
        )

    def pattern(self) -> list[tuple[int, int]]:
        return [(self.row_stride, self.rows), (self.col_stride, self.cols)]


def _transposed_copy(matrix: np.ndarray) -> np.ndarray:
    """matrixᵀ, contiguous, copied 128 source rows at a time: each block's reads stay in the
    cache (vgg19's first classifier weight, 411 MB: about 0.35 s against 1 s for one copy)."""
    out = np.empty(matrix.shape[::-1], matrix.dtype)
    for start in range(0, matrix.shape[0], 128):
        out[:, start : start + 128] = matrix[start : start + 128].T
    return out


def stored_transposed(cg: BirCodeGen, name: str, node_name: str) -> MatrixView | None:
    """A constant weight read transposed (Gemm's transB, a classifier's weight, or the MLP
    kernel's trans_w1/trans_w2) under the general autocast: stored once as its transpose, a
    compile-time constant of its own `<node>/<name>.T` (docs/autocast.md#weights), so that its
    loads are plain row DMAs, which cast it (and let it be stored in the cast dtype), instead
    of fp32 tiles flipped on the PE array. The returned view is that transpose, row-major. None
    when the weight is computed, not a matrix, read by another node, or the autocast is off."""
    info = cg.graph.tensors[name]
    if not info.is_const or len(info.shape) != 2 or pe_operand_dtype(cg) is Dtype.FP32:
        return None
    if any(user != node_name for user, _ in cg.graph.consumers(name)):
        return None
    stored = f"{node_name}/{name}.T"
    payload = cg.derived_constants.get(stored)
    if payload is None:
        payload = cg.derived_constants[stored] = _transposed_copy(info.const)
    loc = cg.add_dram_const(stored, payload)
    cols, rows = info.shape
    return MatrixView(loc.name, Affine(), rows, cols, cols, 1)


class MatmulTiles:
    """The SBUF/PSUM tiles one matmul lowering reuses across all its loop iterations.

    Operand tiles are fp32 whatever the tensors' dtype (the loading DMA converts), or the
    autocast dtype for an fp32 matmul under `--auto-cast matmult/all`. The staging tile of the
    PE transposes stays fp32: it pairs with the resident fp32 identity.

    With `copies` > 1 every tile holds that many copies side by side; `at(tile, slot)` is the
    element offset of copy `slot` (docs/buffers.md#rotation).
    """

    PSUM_BANKS_PER_COPY = 2  # transposed and acc, one bank each

    def __init__(self, cg: BirCodeGen, model_dtype: Dtype = Dtype.FP32, copies: int = 1) -> None:
        p, dtype = NUM_PARTITIONS, pe_operand_dtype(cg, model_dtype)
        self.copies = copies
        self.moving_dtype = dtype
        self.strides: dict[str, int] = {}
        self.stationary = self._tile(cg, "stationary", p, dtype)
        self.moving = self._tile(cg, "moving", MATMUL_MAX_MOVING_FREE, dtype)
        self.staging = self._tile(cg, "staging", p, Dtype.FP32)
        # One PSUM bank (512 fp32) per copy of each: a copy never straddles two banks.
        self.transposed = cg.psum_tile("transposed", p, (copies - 1) * BANK_FP32 + p)
        self.strides[self.transposed.name] = BANK_FP32
        self.acc = cg.psum_tile("acc", p, copies * MATMUL_MAX_MOVING_FREE)
        self.strides[self.acc.name] = MATMUL_MAX_MOVING_FREE
        self.result = self._tile(cg, "result", MATMUL_MAX_MOVING_FREE, Dtype.FP32)
        self.addend = self._tile(cg, "addend", MATMUL_MAX_MOVING_FREE, Dtype.FP32)

    def _tile(self, cg: BirCodeGen, tag: str, free: int, dtype: Dtype) -> MemoryLocation:
        stride = copy_stride(free, dtype)
        loc = cg.sb_tile(tag, NUM_PARTITIONS, (self.copies - 1) * stride + free, dtype)
        self.strides[loc.name] = stride
        return loc

    def at(self, tile: MemoryLocation, slot: Affine) -> Affine:
        """Element offset of copy `slot` of `tile`."""
        return slot * self.strides[tile.name]

    @staticmethod
    def sb_bytes_per_copy(cg: BirCodeGen, model_dtype: Dtype = Dtype.FP32) -> int:
        """SBUF bytes per partition one copy of the tiles takes."""
        dtype = pe_operand_dtype(cg, model_dtype)
        return (
            copy_stride(NUM_PARTITIONS, dtype) * dtype.itemsize
            + copy_stride(MATMUL_MAX_MOVING_FREE, dtype) * dtype.itemsize
            + NUM_PARTITIONS * 4
            + 2 * MATMUL_MAX_MOVING_FREE * 4
        )


BANK_FP32 = PSUM_BANK_BYTES // 4  # fp32 elements in one PSUM bank


def load_tile(
    cg: BirCodeGen,
    view: MatrixView,
    dst_tile,
    tiles_: MatmulTiles,
    slot: Affine | None = None,
    offset: Affine | int = 0,
) -> AccessPattern:
    """Bring `view` (rows ≤ 128) into `dst_tile` as [rows partitions, cols free], starting at
    free element `offset`; with `slot`, into that copy of `dst_tile` through that copy of the
    staging tiles (`tiles_.at`)."""

    def at(tile) -> Affine:
        return Affine() if slot is None else tiles_.at(tile, slot)

    dst_offset = (Affine() if slot is None else tiles_.at(dst_tile, slot)) + offset
    dst = cg.ap(dst_tile, [(1, view.cols)], dst_offset, partitions=view.rows)
    if view.col_stride == 1 or view.row_stride != 1 or view.rows > NUM_PARTITIONS:
        cg.dma(dst, cg.dram_ap(view.loc, view.offset, view.pattern()))
        return dst
    # Columns are strided, rows contiguous: load the transpose and flip it on the PE array.
    for chunk in range(0, view.cols, NUM_PARTITIONS):
        width = min(NUM_PARTITIONS, view.cols - chunk)
        block = view.T.window(Affine(chunk), width, Affine(), view.rows)
        staged = cg.read_operand(
            cg.ap(tiles_.staging, [(1, view.rows)], at(tiles_.staging), partitions=width),
            cg.dram_ap(block.loc, block.offset, block.pattern()),
        )
        flipped = cg.ap(
            tiles_.transposed, [(1, width)], at(tiles_.transposed), partitions=view.rows
        )
        cg.matmul(flipped, staged, cg.identity(width), accumulate=False)
        cg.tensor_copy(
            cg.ap(dst_tile, [(1, width)], dst_offset + chunk, partitions=view.rows), flipped
        )
    return dst


def weight_copy(arena: Arena, tile: MemoryLocation, copies: int, stride: int, size: int) -> int:
    """Which of `copies` weight copies in `tile` (`stride` elements apart, `size` elements
    each) a node loads: the one that overlaps least the bytes of the weights the last node
    that loaded some holds (`Arena.last_weights`), the first on a tie; those bytes then
    become the last weights. So nodes in a row alternate their copies, and a node's weight
    loads need not wait for the previous node's matmuls (docs/buffers.md#weights)."""
    itemsize = tile.dtype.itemsize

    def span(copy: int) -> tuple[int, int]:
        start = tile.address + copy * stride * itemsize
        return start, start + size * itemsize

    def overlap(copy: int) -> int:
        if arena.last_weights is None:
            return 0
        (start, end), (last_start, last_end) = span(copy), arena.last_weights
        return max(0, min(end, last_end) - max(start, last_start))

    chosen = min(range(copies), key=overlap)
    arena.loaded_weights(*span(chosen))
    return chosen


PANEL_FLIPS = 4  # PE transposes in flight: 128-column fp32 slots of one PSUM bank


class FlipTiles:
    """The staging tile and PSUM slots that transposed operand tiles are flipped through:
    `PANEL_FLIPS` slots per copy (one PSUM bank), so that successive flips do not wait for
    each other's copies, and one copy per rotated row tile. `load_tile` uses copy 0."""

    def __init__(self, cg: BirCodeGen, copies: int) -> None:
        slots = copies * PANEL_FLIPS * NUM_PARTITIONS
        self.staging = cg.sb_tile("staging", NUM_PARTITIONS, slots, Dtype.FP32)
        self.transposed = cg.psum_tile("transposed", NUM_PARTITIONS, slots)

    def at(self, tile: MemoryLocation, slot: Affine) -> Affine:
        return slot * NUM_PARTITIONS


def evict_tile(
    cg: BirCodeGen,
    y: MatrixView,
    rows: Tile,
    cols: Tile,
    total: AccessPattern,
    tile: AccessPattern,
    addend: AccessPattern | None = None,
    alpha: float = 1.0,
    c: MatrixView | None = None,
    beta: float = 1.0,
) -> None:
    """Output tile y[rows, cols] out of PSUM (`total`): alpha·total into `tile`, or straight
    into y's SBUF home when it has one, plus beta·c through `addend` when c is given; then
    stored unless written in place."""
    out = y.window(rows.start, rows.size, cols.start, cols.size)
    out_ap = cg.dram_ap(out.loc, out.offset, out.pattern())
    written = cg.write_operand(tile, out_ap)
    cg.activation(written, total, ActFunc.COPY, scale=alpha)
    if c is not None and beta != 0.0 and addend is not None:
        window = c.window(rows.start, rows.size, cols.start, cols.size)
        cg.dma(addend, cg.dram_ap(window.loc, window.offset, window.pattern()))
        if beta != 1.0:
            cg.tensor_scalar(addend, addend, AluOp.MULTIPLY, beta)
        cg.tensor_tensor(written, written, addend, AluOp.ADD)
    cg.store_result(out_ap, tile, written)
