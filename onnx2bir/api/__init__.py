"""The Python API: the commands as functions (docs/api.md).

`compile`, `validate`, `report` and `run`, their results `Compilation`, `ValidationResult` and
`Report`, `compile_options`, validate's option groups (`InputOptions`, `ToleranceOptions`,
`ValidationRunOptions`), and the onnx backend (`onnx2bir.api.backend`).
"""

from onnx2bir.api.commands import (
    Compilation,
    Report,
    compile,
    read_input_arrays,
    report,
    run,
    write_bir,
)
from onnx2bir.api.options import (
    InputOptions,
    ToleranceOptions,
    ValidationRunOptions,
    compile_options,
)
from onnx2bir.api.validate import ValidationResult, validate

__all__ = [
    "Compilation",
    "InputOptions",
    "Report",
    "ToleranceOptions",
    "ValidationResult",
    "ValidationRunOptions",
    "compile",
    "compile_options",
    "read_input_arrays",
    "report",
    "run",
    "validate",
    "write_bir",
]
