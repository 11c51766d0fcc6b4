"""Filter-tap grouping for the column-packing conv kernels: which taps share one matmul.

In: the kernel's spatial size (kH, kW) and the partitions one tap takes (C_in for the dense
kernel, 1 for the depthwise one), or a tap block and the conv's `ConvKernelArgs`. Out: the taps
as groups of at most 128 // width taps, one matmul each, each group a tuple of `TapBlock`
rectangles whose `first` is the block's tap slot in the group (its partitions start at
first · width); `weight_taps` gives a block's element offset and dims in w, the kernel flip
applied.

INFERRED (docs/neuroncore.md#convolution, K-replication): whole kernel rows per group when
that needs no more matmuls than the minimum ⌈taps·width / 128⌉ (then a group's im2col and
weights are one DMA each); otherwise runs of 128 // width consecutive row-major taps, each one
to three rectangles (a DMA each, ≤ 5 dims), so the matmul count is the minimum.
"""

from __future__ import annotations

from dataclasses import dataclass

from onnx2bir.bir.opcodes import NUM_PARTITIONS
from onnx2bir.kernels.conv.common import ConvKernelArgs


@dataclass(frozen=True)
class TapBlock:
    """A rectangle of filter taps stacked from tap slot `first` of its group on."""

    row: int
    rows: int
    col: int
    cols: int
    first: int

    @property
    def taps(self) -> int:
        return self.rows * self.cols


TapGroup = tuple[TapBlock, ...]  # the taps of one matmul


def group_taps(group: TapGroup) -> int:
    return sum(block.taps for block in group)


def tap_groups(k_h: int, k_w: int, width: int) -> list[TapGroup]:
    """The kernel's taps in groups of at most 128 / `width` (one matmul each).

    Whole kernel rows per group when that costs no extra matmul (one DMA per group), else runs
    of 128 / width consecutive taps in row-major order, each split into at most three
    rectangles (a row's tail, whole rows, a row's head).
    """
    fit = NUM_PARTITIONS // width
    taps = k_h * k_w
    count = -(-taps // fit)
    if k_w <= fit and -(-k_h // (fit // k_w)) == count:
        per = -(-k_h // count)
        return [(TapBlock(i, min(per, k_h - i), 0, k_w, 0),) for i in range(0, k_h, per)]
    return [_run(start, min(start + fit, taps), k_w) for start in range(0, taps, fit)]


def _run(start: int, stop: int, k_w: int) -> TapGroup:
    """Taps [start, stop) of the row-major kernel as rectangles."""
    blocks, tap = [], start
    while tap < stop:
        i, j = divmod(tap, k_w)
        if j == 0 and stop - tap >= k_w:
            rows = (stop - tap) // k_w
            blocks.append(TapBlock(i, rows, 0, k_w, tap - start))
            tap += rows * k_w
        else:
            cols = min(k_w - j, stop - tap)
            blocks.append(TapBlock(i, 1, j, cols, tap - start))
            tap += cols
    return tuple(blocks)


def weight_taps(args: ConvKernelArgs, block: TapBlock) -> tuple[int, list[tuple[int, int]]]:
    """(element offset, [(stride, rows), (stride, cols)]) of a block's taps in w, flip applied."""
    _, _, ws_h, ws_w = args.w_strides
    if args.rhs_reversal:
        first = (args.k_h - 1 - block.row) * ws_h + (args.k_w - 1 - block.col) * ws_w
        return first, [(-ws_h, block.rows), (-ws_w, block.cols)]
    return block.row * ws_h + block.col * ws_w, [(ws_h, block.rows), (ws_w, block.cols)]
