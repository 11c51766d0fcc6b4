"""onnx2bir as an ONNX backend (`onnx.backend.base`), for the ONNX backend test suite.

In: an ONNX model (`prepare`, `run_model`) or one node with its inputs (`run_node`). Out: the
model's outputs, in graph output order and with the dtypes the graph declares, computed by
compiling the model to BIR and running it on the machine model.

Shapes are static in BIR, so an `Onnx2BirRep` compiles on its first `run`, with every runtime
input's shape taken from the arrays it is given (this also fixes symbolic dimensions), and
compiles again for each new combination of input shapes. Only the CPU device is claimed: the
machine model is plain numpy. See docs/backend_tests.md for the conformance run.

A backend computes ONNX's semantics, fp32 for fp32 models, so it compiles without the general
autocast (`--auto-cast none`) unless `options` ask for it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper
from onnx.backend.base import Backend, BackendRep, Device, DeviceType, namedtupledict

from onnx2bir.bir.ir import Module
from onnx2bir.compiler import compile_model
from onnx2bir.frontend.importer import runtime_inputs
from onnx2bir.options import CompileOptions
from onnx2bir.runtime.machine.interpreter import run_function

Shapes = tuple[tuple[int, ...], ...]


class Onnx2BirRep(BackendRep):
    """A prepared model: compiled lazily, once per combination of input shapes."""

    def __init__(self, model: onnx.ModelProto, options: CompileOptions | None = None) -> None:
        self.model = model
        self.options = options or CompileOptions(auto_cast="none")
        self.input_names = [value.name for value in runtime_inputs(model)]
        self.output_names = [value.name for value in model.graph.output]
        self.output_dtypes = [_declared_dtype(value) for value in model.graph.output]
        self._declared_shapes = [_declared_shape(value) for value in runtime_inputs(model)]
        self._modules: dict[Shapes, tuple[Module, list[str]]] = {}
        self._outputs_type = namedtupledict("Outputs", self.output_names)

    @property
    def compiled_shapes(self) -> list[Shapes]:
        """The input-shape combinations compiled so far, in graph input order."""
        return list(self._modules)

    def run(self, inputs: Any, **kwargs: Any) -> tuple[np.ndarray, ...]:
        """Outputs in graph output order; `inputs` is a list (graph input order), dict or array."""
        feeds = self._feeds(inputs)
        shapes = tuple(feeds[name].shape for name in self.input_names)
        module, locations = self._compiled(shapes)
        results = run_function(module, feeds)
        values = [
            np.asarray(results[location], dtype=dtype)  # dtype None: a non-tensor output
            for location, dtype in zip(locations, self.output_dtypes, strict=True)
        ]
        return self._outputs_type(*values)

    def _feeds(self, inputs: Any) -> dict[str, np.ndarray]:
        if isinstance(inputs, Mapping):
            missing = [name for name in self.input_names if name not in inputs]
            if missing:
                raise ValueError(f"no value for input(s) {', '.join(missing)}")
            arrays = [inputs[name] for name in self.input_names]
        else:
            arrays = [inputs] if isinstance(inputs, np.ndarray) else list(inputs)
            if len(arrays) != len(self.input_names):
                raise ValueError(
                    f"the model has {len(self.input_names)} input(s) "
                    f"({', '.join(self.input_names)}), got {len(arrays)} value(s)"
                )
        feeds = {}
        for name, declared, value in zip(
            self.input_names, self._declared_shapes, arrays, strict=True
        ):
            array = np.asarray(value)
            if declared is not None and not _fits(array.shape, declared):
                raise ValueError(
                    f"input {name!r} has shape {array.shape}, the model declares "
                    f"{tuple(d if d is not None else '?' for d in declared)}"
                )
            feeds[name] = array
        return feeds

    def _compiled(self, shapes: Shapes) -> tuple[Module, list[str]]:
        """The module for these input shapes and the DRAM location of each graph output."""
        if shapes not in self._modules:
            input_shapes = dict(zip(self.input_names, shapes, strict=True))
            compilation = compile_model(self.model, self.options, input_shapes=input_shapes)
            function = compilation.module.functions[0]
            # The code generator binds graph outputs to function outputs in graph order.
            self._modules[shapes] = (compilation.module, list(function.outputs))
        return self._modules[shapes]


class Onnx2BirBackend(Backend):
    """`prepare` / `run_model` / `run_node` over the BIR compiler and the machine model."""

    @classmethod
    def supports_device(cls, device: str) -> bool:
        try:
            return Device(device).type == DeviceType.CPU
        except (AttributeError, ValueError):
            return False

    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> Onnx2BirRep:
        """Check the model and return a rep; `options` is the only keyword used (rtol etc. pass)."""
        if not cls.supports_device(device):
            raise ValueError(f"onnx2bir runs on device CPU only, not {device!r}")
        super().prepare(model, device, **kwargs)
        options = kwargs.get("options")
        return Onnx2BirRep(model, options if isinstance(options, CompileOptions) else None)

    @classmethod
    def run_model(
        cls, model: onnx.ModelProto, inputs: Any, device: str = "CPU", **kwargs: Any
    ) -> tuple[np.ndarray, ...]:
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(
        cls,
        node: onnx.NodeProto,
        inputs: Any,
        device: str = "CPU",
        outputs_info: Sequence[tuple[np.dtype, tuple[int, ...]]] | None = None,
        **kwargs: Any,
    ) -> tuple[np.ndarray, ...]:
        """Wrap `node` in a one-node model (opset `opset_version`, default latest) and run it."""
        super().run_node(node, inputs, device, outputs_info, **kwargs)
        model = node_model(node, inputs, outputs_info, kwargs.get("opset_version"))
        return cls.prepare(model, device, **kwargs).run(inputs)


def node_model(
    node: onnx.NodeProto,
    inputs: Any,
    outputs_info: Sequence[tuple[np.dtype, tuple[int, ...]]] | None = None,
    opset_version: int | None = None,
) -> onnx.ModelProto:
    """A model whose graph is `node`, its inputs typed from the arrays it will be fed."""
    names = [name for name in node.input if name]
    if isinstance(inputs, Mapping):
        arrays = [np.asarray(inputs[name]) for name in names]
    else:
        arrays = [np.asarray(v) for v in ([inputs] if isinstance(inputs, np.ndarray) else inputs)]
    if len(arrays) != len(names):
        raise ValueError(f"node {node.op_type} has {len(names)} input(s), got {len(arrays)}")
    graph_inputs = [
        helper.make_tensor_value_info(
            name, helper.np_dtype_to_tensor_dtype(array.dtype), list(array.shape)
        )
        for name, array in zip(names, arrays, strict=True)
    ]
    if outputs_info is None:
        graph_outputs = [helper.make_empty_tensor_value_info(name) for name in node.output]
    else:
        graph_outputs = [
            helper.make_tensor_value_info(
                name, helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), list(shape)
            )
            for name, (dtype, shape) in zip(node.output, outputs_info, strict=True)
        ]
    graph = helper.make_graph([node], f"{node.op_type}_node", graph_inputs, graph_outputs)
    opset = opset_version or onnx.defs.onnx_opset_version()
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(node.domain, opset)])
    # Output types left empty are filled in by shape inference, as a converter would.
    return onnx.shape_inference.infer_shapes(model)


def _declared_dtype(value: onnx.ValueInfoProto) -> np.dtype | None:
    elem_type = value.type.tensor_type.elem_type
    return helper.tensor_dtype_to_np_dtype(elem_type) if elem_type else None


def _declared_shape(value: onnx.ValueInfoProto) -> tuple[int | None, ...] | None:
    """Static dims as ints, symbolic or unknown dims as None; None if the rank is unknown."""
    tensor_type = value.type.tensor_type
    if not tensor_type.HasField("shape"):
        return None
    return tuple(
        dim.dim_value if dim.HasField("dim_value") else None for dim in tensor_type.shape.dim
    )


def _fits(shape: tuple[int, ...], declared: tuple[int | None, ...]) -> bool:
    return len(shape) == len(declared) and all(
        want is None or want == got for got, want in zip(shape, declared, strict=True)
    )
