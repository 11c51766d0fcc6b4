"""`no_cyclic_gc()`: run a block with Python's cyclic garbage collector paused, then resume it.

Compiling a model and running it on the machine allocate many short-lived objects (graph
attributes, instructions, access patterns; operand views, loop-value dicts), nearly all freed
by reference counting. Each burst of allocations still triggers the cyclic collector, which
then walks every object the process holds, the compiled module and graph among them (80 000
to 130 000 objects for the light CNNs and BERT). Paused, convert of BERT-24 and a
light_densenet121 run are each about 10% faster (docs/simulation_speed.md#garbage-collection).
Whatever cycles the block leaves are collected once the collector is back on.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


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
