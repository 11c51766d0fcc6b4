"""Generic lowering of CumProd: CumSum's VectorE scan (`lower_index._cumsum_dve`) with
multiply, starting from 1.

Rows of the [outer, length, inner] view on partitions; along the axis a BIR loop multiplies
each column by the running product of the columns before it (exclusive shifts by one, reverse
walks the axis backwards). Integers stay exact (int32 on GpSimd); floats are fp32 tiles.
"""

from __future__ import annotations

import math

from onnx2bir.bir.enums import AluOp, Dtype
from onnx2bir.codegen.driver import BirCodeGen
from onnx2bir.codegen.lower.index import _cumsum_dve, _cumsum_layout, scan_axis
from onnx2bir.graph import Node


def lower_cumprod(cg: BirCodeGen, node: Node) -> None:
    x, out = node.inputs[0], node.outputs[0]
    shape = tuple(cg.graph.tensors[x].shape)
    axis = scan_axis(cg, node)
    if math.prod(shape) == 0:
        return
    dtype = Dtype.FP32 if cg.graph.tensors[x].dtype.is_float else Dtype.INT64
    _cumsum_dve(
        cg,
        cg.dram(x).name,
        cg.dram(out).name,
        _cumsum_layout(shape, axis),
        bool(node.attr("exclusive", 0)),
        bool(node.attr("reverse", 0)),
        AluOp.MULTIPLY,
        dtype,
    )
