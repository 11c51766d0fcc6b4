"""BIR code generation: the driver (`driver.py`) and the generic lowering table.

Importing this package registers every generic lowering in `GENERIC_LOWERINGS`.
"""

from onnx2bir.codegen import (  # noqa: F401  (imported to register their lowerings)
    lower_arg,
    lower_conv,
    lower_conv_transpose,
    lower_data,
    lower_depth_space,
    lower_einsum,
    lower_elementwise,
    lower_fill,
    lower_gather,
    lower_gather_elements,
    lower_index,
    lower_layout,
    lower_logic,
    lower_loop,
    lower_math,
    lower_matmul,
    lower_nonlinear,
    lower_norm,
    lower_norm_groups,
    lower_onehot,
    lower_pool,
    lower_quant,
    lower_recurrent,
    lower_reduce,
    lower_resize,
    lower_rotary,
    lower_rotary_ms,
    lower_scan,
    lower_scatter,
    lower_scatter_nd,
    lower_softmax,
    lower_topk,
)
from onnx2bir.codegen.driver import BirCodeGen, CodegenError
from onnx2bir.codegen.registry import GENERIC_LOWERINGS

__all__ = ["GENERIC_LOWERINGS", "BirCodeGen", "CodegenError"]
