"""A progress bar for long simulations, driven by the interpreter's observer hook.

In: a BIR function (to count the instructions a run will execute: each loop body times its trip
count) and a stream (stderr). Out: an observer for `interpreter.run_function` / `execute` that
counts executed instructions and redraws one line at most every `interval` seconds, starting
only after `delay` seconds, so short runs print nothing.

Cost: the observer is one call, one increment and one mask test per instruction; the clock is
read every 64 instructions. An instruction's semantics costs microseconds of numpy work, so
the bar stays well under 1% of the simulation (benchmarks/ measures it, tests do not).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

from onnx2bir.bir.ir import BasicBlock, Function, Loop

_CHECK_MASK = 63
WIDTH = 30
# No time-left estimate before this share of the instructions has run: the first ones (weight
# DMAs, the first tiles) are not typical, and an estimate from 0.3% of a run is off by 100x.
ETA_MIN_FRACTION = 0.05


def dynamic_instruction_count(block: BasicBlock) -> int:
    """How many instructions running `block` executes (loops unrolled by their trip count)."""
    total = 0
    for item in block.items:
        if isinstance(item, Loop):
            total += item.trip_count * dynamic_instruction_count(item.body)
        else:
            total += 1
    return total


def chain(*observers: Callable | None) -> Callable | None:
    """One observer calling each non-None observer in turn (None when there are none)."""
    live = [obs for obs in observers if obs is not None]
    if not live:
        return None
    if len(live) == 1:
        return live[0]

    def both(ins, loop_values) -> None:
        for obs in live:
            obs(ins, loop_values)

    return both


class ProgressBar:
    """`observer` counts instructions; `close()` erases the line."""

    def __init__(
        self,
        function: Function,
        stream: TextIO | None = None,
        label: str = "simulate",
        delay: float = 1.0,
        interval: float = 0.1,
    ):
        self.stream = stream if stream is not None else sys.stderr
        self.total = max(1, dynamic_instruction_count(function.entry))
        self.label = label
        self.delay, self.interval = delay, interval
        self.count = 0
        self.start = time.perf_counter()
        self._next_draw = self.start + delay
        self._drawn = False

    def observer(self, ins, loop_values) -> None:
        self.count += 1
        if self.count & _CHECK_MASK:
            return
        now = time.perf_counter()
        if now >= self._next_draw:
            self._next_draw = now + self.interval
            self.draw(now)

    def draw(self, now: float | None = None) -> None:
        now = time.perf_counter() if now is None else now
        fraction = min(1.0, self.count / self.total)
        filled = int(fraction * WIDTH)
        elapsed = now - self.start
        if fraction >= ETA_MIN_FRACTION:
            left = f"~{elapsed * (1 - fraction) / fraction:.0f}s left"
        else:
            left = "estimating time left"
        self.stream.write(
            f"\r{self.label} [{'#' * filled}{'.' * (WIDTH - filled)}] "
            f"{100 * fraction:5.1f}%  {self.count}/{self.total} instructions  "
            f"{elapsed:.1f}s, {left} "
        )
        self.stream.flush()
        self._drawn = True

    def close(self) -> None:
        if self._drawn:
            self.stream.write("\r\033[K")
            self.stream.flush()


def progress_for(function: Function, enabled: bool, label: str = "simulate") -> ProgressBar | None:
    """A bar on stderr when `enabled` and stderr is a terminal, else None."""
    if not enabled or not sys.stderr.isatty():
        return None
    return ProgressBar(function, sys.stderr, label)
