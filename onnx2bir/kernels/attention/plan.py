"""The attention kernel's tile plan: tile shapes, the SBUF it reserves, the `sb_shape` function.

In: the tile sizes (query rows per group, keys per tile), head dims and dtypes. Out: the list
of SBUF tiles the flash-style kernel allocates (`TilePlan.sb_tiles`), their bytes per
partition, and `sb_shape`, the function the attention raise asks before it rewrites a block
(docs/attention_kernel.md#sbuf-reservation).

None of these sizes grows with the sequence beyond one K/V section: K and V are held in SBUF a
section (16 key tiles, 8192 keys at the default tile) at a time and the softmax runs online,
so every block of 8192 keys or more reserves the same SBUF, and a shorter one less.

`sb_shape(seq_q, seq_k, causal, dtype, cast_matmult)` keeps the reference compiler's
signature (two lengths, a causal flag, the element type, a trailing flag) and returns
(query rows per group, keys per tile, bytes reserved per partition). The trailing flag is
"only the matmuls are cast" (`--native-kernel-cast-type matmult-to-…`): the scores then stay
fp32 while Q, K, V and P take the cast type, which costs 2 bytes more per key column than
`all-to-…`, where the scores are held in the cast type as well — the reference's "+2" term.
When the raise would pick the swap target (not causal, unequal lengths) the reservation adds
the fp32 `sT` tile the swapped QKᵀ stages its transposed scores in. The head dims are not
arguments: the raise only fires for head dim ≤ 128, so the reservation assumes 128.
"""

from __future__ import annotations

from dataclasses import dataclass

from onnx2bir.bir.enums import Dtype
from onnx2bir.bir.opcodes import MATMUL_MAX_MOVING_FREE, NUM_PARTITIONS, SB_ALIGN

MAX_Q_ROWS = NUM_PARTITIONS  # a query group fills at most the 128 partitions
MAX_K_TILE = MATMUL_MAX_MOVING_FREE  # one PSUM bank of fp32 scores per key tile
RESERVED_HEAD_DIM = 128  # the raise's head-dim gate
STATS = 6  # fp32 per row: running max, running sum, new max, −max, correction, tile sum
SECTION_TILES = 16  # key tiles of K and V held in SBUF at once (8192 keys at 512 per tile)


def _aligned(nbytes: int) -> int:
    return -(-nbytes // SB_ALIGN) * SB_ALIGN


@dataclass(frozen=True, slots=True)
class TilePlan:
    """Tile sizes and dtypes of one kernel call."""

    q_rows: int
    k_tile: int
    d: int
    dv: int
    storage: Dtype  # Q, K, V, P (matmul operands)
    scores: Dtype  # S: fp32, or the cast type when everything is cast
    out: Dtype
    extra: bool = True  # an extra input (mask, bias) is read per key tile
    fill: bool = True  # a masked fill needs a bound tile
    causal: bool = False
    swap: bool = False  # Sᵀ slices are staged in fp32 for their transpose back

    @property
    def d_tiles(self) -> int:
        return -(-self.d // NUM_PARTITIONS)

    seq_k: int = MAX_K_TILE * SECTION_TILES

    @property
    def k_subtiles(self) -> int:
        return -(-self.k_tile // NUM_PARTITIONS)

    @property
    def section(self) -> int:
        """Keys of K and V resident in SBUF at once: whole key tiles, at most SECTION_TILES."""
        return min(self.k_tile * SECTION_TILES, self.seq_k)

    @property
    def section_tiles(self) -> int:
        return -(-self.section // self.k_tile)

    def sb_tiles(self) -> list[tuple[str, int, Dtype]]:
        """(tag, elements per partition, dtype) of every SBUF tile, in allocation order."""
        s, fp32 = self.storage, Dtype.FP32
        tiles = [
            ("q", self.d, s),
            ("qT", self.d_tiles * self.q_rows, s),
            ("k", self.d_tiles * self.section, s),
            ("v", self.section_tiles * self.k_subtiles * self.dv, s),
            ("scores", self.k_tile, self.scores),
            ("probs", self.k_tile, s),
            ("pT", self.q_rows, s),
            ("stats", STATS, fp32),
            ("acc", self.dv, fp32),
            ("out", self.dv, self.out),
        ]
        if s is not Dtype.FP32:
            tiles.insert(0, ("identity", NUM_PARTITIONS, s))
        if self.extra:
            tiles.append(("extra", self.k_tile, fp32))
        if self.fill:
            tiles.append(("bound", self.k_tile, fp32))
        if self.causal:
            tiles.append(("causal", self.k_tile, fp32))
        if self.swap:
            tiles.append(("sT", self.q_rows, fp32))
        return tiles

    def partition_bytes(self) -> int:
        return sum(_aligned(free * dtype.itemsize) for _, free, dtype in self.sb_tiles())


def tile_sizes(seq_q: int, seq_k: int) -> tuple[int, int]:
    """Query rows per group and keys per tile for the given lengths (the defaults)."""
    return min(MAX_Q_ROWS, seq_q), min(MAX_K_TILE, seq_k)


def sb_shape(
    seq_q: int, seq_k: int, causal: bool, dtype: Dtype, cast_matmult: bool
) -> tuple[int, int, int]:
    """(query rows, keys per tile, SBUF bytes per partition) the kernel reserves."""
    q_rows, k_tile = tile_sizes(seq_q, seq_k)
    plan = TilePlan(
        q_rows,
        k_tile,
        RESERVED_HEAD_DIM,
        RESERVED_HEAD_DIM,
        dtype,
        Dtype.FP32 if cast_matmult else dtype,
        Dtype.FP32,
        causal=causal,
        seq_k=seq_k,
        swap=not causal and seq_q != seq_k,  # the raise's choice of the swap target
    )
    return q_rows, k_tile, plan.partition_bytes()
