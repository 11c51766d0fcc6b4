"""onnx2bir: ONNX models → BIR for a NeuronCore-like accelerator, run on a numpy model of the
hardware and checked against onnxruntime.

The Python API (docs/api.md): `compile`, `validate`, `report`, `run`, and their results
`Compilation`, `ValidationResult`, `Report`; `CompileOptions` and the errors.
"""

import os as _os

# The subpackages onnx2bir.patterns and onnx2bir.runtime live in the checkout's top-level
# folders patterns/ and runtime/; an install maps them into this package (pyproject.toml,
# package-dir). When this package is imported straight from a checkout (`python -m pytest`
# puts the checkout first on sys.path), let the import system look beside it as well.
_here = _os.path.dirname(__file__)
_checkout = _os.path.dirname(_here)
if not _os.path.isdir(_os.path.join(_here, "runtime")) and _os.path.isfile(
    _os.path.join(_checkout, "runtime", "__init__.py")
):
    __path__.append(_checkout)

__version__ = "0.1.0"  # pyproject.toml's version (a test keeps them equal)

# The API is loaded on first use, so `import onnx2bir.bir` does not load the whole compiler.
_API = {
    "Compilation": "onnx2bir.api.commands",
    "Report": "onnx2bir.api.commands",
    "ValidationResult": "onnx2bir.api.commands",
    "compile": "onnx2bir.api.commands",
    "report": "onnx2bir.api.commands",
    "run": "onnx2bir.api.commands",
    "validate": "onnx2bir.api.commands",
    "CompileError": "onnx2bir.errors",
    "MachineError": "onnx2bir.errors",
    "UserError": "onnx2bir.errors",
    "CompileOptions": "onnx2bir.options",
}
__all__ = ["__version__", *_API]


def __getattr__(name: str):
    if name in _API:
        import importlib

        return getattr(importlib.import_module(_API[name]), name)
    raise AttributeError(f"module 'onnx2bir' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_API))
