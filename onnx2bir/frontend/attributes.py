"""ONNX node attributes as the Graph holds them: plain Python values, strings decoded,
tensors as numpy arrays (the importer and the function-body expansion both read them)."""

from __future__ import annotations

import onnx
from onnx import numpy_helper


def attr_value(attr: onnx.AttributeProto):
    """The attribute's value: str for bytes, an array for a tensor, lists element-wise."""
    value = onnx.helper.get_attribute_value(attr)
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, onnx.TensorProto):
        return numpy_helper.to_array(value)
    if isinstance(value, list):
        return [v.decode() if isinstance(v, bytes) else v for v in value]
    return value
