"""The process settings a machine run uses, restored after it (docs/simulation_speed.md).

In: nothing. Out: `one_blas_thread()`, a context manager that limits numpy's BLAS to one thread
for the duration of a run, and `no_cyclic_gc()`, one that pauses Python's cyclic garbage
collector; both restore the previous state after.

Every Matmult multiplies at most a 128 x 128 by a 128 x 512 tile. A BLAS call that small is
over before a second thread has done useful work, and on a machine whose cores are busy the
threads wait for each other: measured on two shared cores, a light_resnet50 run took 7.2 s with
OpenBLAS's default two threads and 1.4 s with one. The limit uses `threadpoolctl`; without it
installed the run goes on with the BLAS defaults (same results, slower).

A run allocates many short-lived objects (views, operand tuples, loop-value dicts), all freed
by reference counting, none in reference cycles; each allocation burst still triggers the
cyclic collector, which then walks every object the process holds (the compiled module and
graph: 80 000 to 130 000 of them). Paused, a light_densenet121 run is about 10% faster.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

try:
    from threadpoolctl import ThreadpoolController
except ImportError:  # optional: only the speed depends on it
    ThreadpoolController = None

_controller = None


@contextlib.contextmanager
def one_blas_thread() -> Iterator[None]:
    """Run the body with numpy's BLAS limited to one thread (a no-op without threadpoolctl)."""
    global _controller
    if ThreadpoolController is None:
        yield
        return
    if _controller is None:
        _controller = ThreadpoolController()  # inspects the loaded libraries once
    with _controller.limit(limits=1, user_api="blas"):
        yield


@contextlib.contextmanager
def no_cyclic_gc() -> Iterator[None]:
    """Run the body with the cyclic garbage collector paused (if it was on), then resume it."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
