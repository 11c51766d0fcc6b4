"""Sums of products as `np.dot` gives them, without waking BLAS threads.

In: pairs of 1-D float64 vectors, each pair of one length. Out: `np.dot` of each pair, to the
bit (`dots`).

Why: `np.dot` of two float64 vectors is OpenBLAS's ddot, which splits a vector of more than
ONE_THREAD elements over its T threads. Each call then waits for the other threads, and on
cores other processes keep busy a thread is often not running when the call is made: measured
on two shared cores under a load average of 9, a comparison's four sums of 800K elements took
10 ms each where the arithmetic takes 0.1 ms, 7.5 of light resnet50's 8.5 s of comparisons.
(The machine model limits BLAS to one thread while it runs, for the same reason:
runtime/machine/blas.py.)

How, to the bit: ddot adds its threads' partial sums in order to 0.0, thread k summing the
next ceil(rest / (T − k)) elements with the kernel a single-threaded ddot runs. So the sum is
computed here as those chunks' ddots on one thread, added in that order. Before that is
trusted for a thread count T, the split is checked once against `np.dot` itself on vectors of
several lengths; where it does not agree (another BLAS, another ddot), or threadpoolctl is
missing, `np.dot` is called as it is.

Threads of ours (`one_thread`): comparisons run two at a time (runtime/oracle/verdict.py) with
BLAS held on one thread for the whole block, so that one comparison's `dots` cannot see the
thread count another has lowered; `dots` then splits as for the count BLAS had before, and the
sums are the same bits as outside the block.
"""

from __future__ import annotations

import contextlib

import numpy as np

ONE_THREAD = 10_000  # OpenBLAS's ddot runs on one thread up to this many elements
CHECK_LENGTHS = (ONE_THREAD + 1, ONE_THREAD + 7, 65_537, 1_000_003)

_state: dict = {}  # "blas": the OpenBLAS controller or None; thread count -> split agrees


def dots(*pairs: tuple[np.ndarray, np.ndarray]) -> list[np.float64]:
    """`np.dot(x, y)` of each pair (module docstring)."""
    pinned = _state.get("pinned")
    if pinned is not None:  # inside `one_thread`: BLAS is on one thread, the split agrees
        if pinned <= 1:
            return [np.dot(x, y) for x, y in pairs]
        return [_split_dot(x, y, pinned) for x, y in pairs]
    blas = _openblas()
    threads = blas.get_num_threads() if blas is not None else 1
    if threads <= 1 or all(x.size <= ONE_THREAD for x, _ in pairs) or not _agrees(threads):
        return [np.dot(x, y) for x, y in pairs]
    blas.set_num_threads(1)
    try:
        return [_split_dot(x, y, threads) for x, y in pairs]
    finally:
        blas.set_num_threads(threads)


@contextlib.contextmanager
def one_thread():
    """A block in which BLAS runs on one thread and `dots` still gives `np.dot`'s bits at the
    thread count BLAS had before (module docstring). It yields whether that holds; when it
    does not (the split disagrees with this BLAS), nothing is changed and False is yielded:
    the caller must then not compute sums of products from several threads."""
    if _state.get("pinned") is not None:
        yield True
        return
    blas = _openblas()
    threads = blas.get_num_threads() if blas is not None else 1
    if threads > 1 and not _agrees(threads):
        yield False
        return
    if threads > 1:
        blas.set_num_threads(1)
    _state["pinned"] = threads
    try:
        yield True
    finally:
        _state["pinned"] = None
        if threads > 1:
            blas.set_num_threads(threads)


def _split_dot(x: np.ndarray, y: np.ndarray, threads: int) -> np.float64:
    """ddot on `threads` threads, each chunk summed on this one (BLAS limited to one)."""
    if x.size <= ONE_THREAD:
        return np.dot(x, y)
    total = np.float64(0.0)
    start, rest = 0, x.size
    for done in range(threads):
        width = min(-(-rest // (threads - done)), rest)
        if width <= 0:
            break
        total = total + np.dot(x[start : start + width], y[start : start + width])
        start, rest = start + width, rest - width
    return total


def _agrees(threads: int) -> bool:
    """Whether the split gives `np.dot`'s bits at `threads` threads (checked once)."""
    if threads not in _state:
        rng = np.random.default_rng(threads)
        same = True
        for length in CHECK_LENGTHS:
            x, y = rng.standard_normal(length), rng.standard_normal(length)
            expected = np.dot(x, y)
            blas = _openblas()
            blas.set_num_threads(1)
            try:
                got = _split_dot(x, y, threads)
            finally:
                blas.set_num_threads(threads)
            same = same and bool(got == expected)
        _state[threads] = same
    return _state[threads]


def _openblas():
    """The controller of numpy's OpenBLAS (threadpoolctl), or None."""
    if "blas" not in _state:
        try:
            from threadpoolctl import ThreadpoolController
        except ImportError:  # optional: only the speed depends on it
            _state["blas"] = None
        else:
            found = ThreadpoolController().select(internal_api="openblas").lib_controllers
            _state["blas"] = found[0] if len(found) == 1 else None
    return _state["blas"]
