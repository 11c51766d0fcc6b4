"""The float64 arithmetic a program's matmuls cost on this CPU, with nothing else around it.

The machine computes every Matmult as a float64 product of its tile (K <= 128, M <= 128,
N <= 512) rounded once to fp32 (docs/simulation_speed.md#what-must-not-change): per-tile
results must not depend on where a column sits, which fp32 BLAS does not promise. That puts a
floor under `simulate` that no dispatch or data-movement work can go below: the time of the
tile products themselves, on operands already contiguous in float64 and one BLAS thread (two
threads gain little on products this small: see `python benchmarks/gemm_floor.py`).

In: a compiled Function. Out: `pe_products` counts its executed Matmult instances by
(K, M, N), leaving out transposes (moving operand = the identity tile: the machine copies
those); `floor_seconds` times each shape as a float64 GEMM and sums count x time.

Script: ``python benchmarks/gemm_floor.py`` prints the float64 and fp32 GEMM throughput of
tile-sized and large products on one and two threads, and how often a column of a tile product
computed alone differs from the same column computed in its tile, in fp32 and in float64 (the
reason the machine sums in float64).
"""

from __future__ import annotations

import time
from collections import Counter

import numpy as np

from onnx2bir.bir.enums import Opcode
from onnx2bir.bir.ir import BasicBlock, Function, Loop
from onnx2bir.codegen.driver import IDENTITY


def pe_products(function: Function) -> Counter:
    """Executed Matmult instances by (K, M, N), transposes left out. A static loop multiplies
    its body by its trip count; a runtime-controlled loop's body counts once."""
    products: Counter = Counter()

    def walk(block: BasicBlock, trips: int) -> None:
        for item in block.items:
            if isinstance(item, Loop):
                walk(item.body, trips * (item.trip_count if isinstance(item.stop, int) else 1))
            elif item.opcode is Opcode.MATMULT and item.srcs["moving"].loc != IDENTITY:
                stationary, moving = item.srcs["stationary"], item.srcs["moving"]
                shape = (
                    stationary.num_partitions,
                    stationary.free_size,
                    moving.free_size,
                )
                products[shape] += trips

    walk(function.entry, 1)
    return products


def gemm_seconds(k: int, m: int, n: int, dtype=np.float64, repeats: int = 20) -> float:
    """Best time of one stationaryᵀ · moving product of this shape (operands contiguous)."""
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((k, m)).astype(dtype), rng.standard_normal((k, n)).astype(dtype)
    out = np.empty((m, n), dtype)
    np.matmul(a.T, b, out=out)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        np.matmul(a.T, b, out=out)
        best = min(best, time.perf_counter() - start)
    return best


def floor_seconds(products: Counter) -> tuple[float, float]:
    """(seconds, GFLOP) of the products as float64 GEMMs on one BLAS thread."""
    from onnx2bir.runtime.machine.blas import one_blas_thread

    seconds = flops = 0.0
    with one_blas_thread():
        for (k, m, n), count in products.items():
            seconds += count * gemm_seconds(k, m, n)
            flops += count * 2.0 * k * m * n
    return seconds, flops / 1e9


def position_dependence(dtype, trials: int = 400, seed: int = 1) -> int:
    """Of `trials` random tile shapes (K <= 128, M <= 128, N <= 512, fp32 values), how many
    give one output column other bits when computed alone than inside its tile (one thread)."""
    from onnx2bir.runtime.machine.blas import one_blas_thread

    rng = np.random.default_rng(seed)
    differ = 0
    with one_blas_thread():
        for _ in range(trials):
            k, m, n = (int(rng.integers(1, top + 1)) for top in (128, 128, 512))
            a = rng.standard_normal((k, m)).astype(np.float32).astype(dtype)
            b = rng.standard_normal((k, n)).astype(np.float32).astype(dtype)
            j = int(rng.integers(0, n))
            whole = (a.T @ b).astype(np.float32)[:, j]
            alone = (a.T @ b[:, j : j + 1]).astype(np.float32)[:, 0]
            differ += whole.tobytes() != alone.tobytes()
    return differ


def main() -> None:
    from threadpoolctl import threadpool_limits

    shapes = [
        (128, 128, 49),
        (128, 128, 196),
        (128, 128, 512),
        (128, 128, 8192),
        (1024, 1024, 1024),
    ]
    print("| threads | dtype | K x M x N | GFLOP/s |")
    print("|---:|---|---|---:|")
    for threads in (1, 2):
        with threadpool_limits(threads, user_api="blas"):
            for dtype in (np.float64, np.float32):
                for k, m, n in shapes:
                    seconds = gemm_seconds(k, m, n, dtype, repeats=10)
                    rate = 2.0 * k * m * n / seconds / 1e9
                    print(f"| {threads} | {np.dtype(dtype).name} | {k} x {m} x {n} | {rate:.0f} |")
    for dtype in (np.float32, np.float64):
        differ = position_dependence(dtype)
        name = np.dtype(dtype).name
        print(f"{name}: a column alone differs from the same column in its tile in {differ}/400")


if __name__ == "__main__":
    main()
