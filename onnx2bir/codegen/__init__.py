"""BIR code generation: the driver (`driver.py`), the machinery the lowerings share, and the
generic lowerings of the ONNX ops with their table (`lower/`, `GENERIC_LOWERINGS`).
"""

from onnx2bir.codegen.driver import BirCodeGen, CodegenError
from onnx2bir.codegen.lower import GENERIC_LOWERINGS

__all__ = ["GENERIC_LOWERINGS", "BirCodeGen", "CodegenError"]
