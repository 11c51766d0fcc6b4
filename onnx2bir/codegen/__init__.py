"""BIR code generation: the driver (`driver.py`), the machinery the lowerings share, and the
generic lowerings of the ONNX ops (`lower/`).

Importing this package fills the generic lowering table, `GENERIC_LOWERINGS`.
"""

from onnx2bir.codegen import lower  # noqa: F401  (fills the lowering table)
from onnx2bir.codegen.driver import BirCodeGen, CodegenError
from onnx2bir.codegen.registry import GENERIC_LOWERINGS

__all__ = ["GENERIC_LOWERINGS", "BirCodeGen", "CodegenError"]
