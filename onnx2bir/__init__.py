"""onnx2bir: ONNX models → BIR for a NeuronCore-like accelerator, run on a numpy model of the
hardware and checked against onnxruntime."""

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
