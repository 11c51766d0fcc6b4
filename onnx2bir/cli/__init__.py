"""The `onnx2bir` command (docs/cli.md): `main` parses the flags and calls the API; one module
per command group (`run`: run a saved program; the sweep's parser lives with the sweep), and
`flag_groups` for the flags the model commands share (docs/cli.md#flag-groups)."""

from onnx2bir.cli.commands import main

__all__ = ["main"]
