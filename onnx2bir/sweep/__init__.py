"""`onnx2bir sweep`: many models, each in its own process or as a Ray task (docs/sweep.md)."""

from onnx2bir.sweep.run import (
    CATEGORIES,
    add_parser,
    cmd_sweep,
    collect,
    format_summary,
    memory_estimate,
    run_guarded,
    run_one,
    sweep,
)

__all__ = [
    "CATEGORIES",
    "add_parser",
    "cmd_sweep",
    "collect",
    "format_summary",
    "memory_estimate",
    "run_guarded",
    "run_one",
    "sweep",
]
