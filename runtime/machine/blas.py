"""One BLAS thread while the machine runs (docs/simulation_speed.md#blas-threads).

In: nothing. Out: `one_blas_thread()`, a context manager that limits numpy's BLAS to one thread
for the duration of a run and restores the previous limit after it; `blas_threads(n)` for
processes that share the cores (`validate --segments`).

Every Matmult multiplies at most a 128 x 128 by a 128 x 512 tile. A BLAS call that small is
over before a second thread has done useful work, and on a machine whose cores are busy the
threads wait for each other: measured on two shared cores, a light_resnet50 run took 7.2 s with
OpenBLAS's default two threads and 1.4 s with one. The limit uses `threadpoolctl`; without it
installed the run goes on with the BLAS defaults (same results, slower).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

try:
    from threadpoolctl import ThreadpoolController
except ImportError:  # optional: only the speed depends on it
    ThreadpoolController = None

_controller = None


@contextlib.contextmanager
def blas_threads(threads: int) -> Iterator[None]:
    """Run the body with numpy's BLAS limited to `threads` threads (a no-op without
    threadpoolctl)."""
    global _controller
    if ThreadpoolController is None:
        yield
        return
    if _controller is None:
        _controller = ThreadpoolController()  # inspects the loaded libraries once
    with _controller.limit(limits=threads, user_api="blas"):
        yield


def one_blas_thread():
    """Run the body with numpy's BLAS limited to one thread."""
    return blas_threads(1)
