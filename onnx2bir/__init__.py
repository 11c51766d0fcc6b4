"""onnx2bir: ONNX models → BIR for a NeuronCore-like accelerator, run on a numpy model of the
hardware and checked against onnxruntime.

The Python API (docs/api.md): `compile`, `validate`, `report`, `run`, and their results
`Compilation`, `ValidationResult`, `Report`; `CompileOptions` and the errors.
"""

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
