"""The memory kind and storage of a graph tensor's DRAM location (docs/memory_kinds.md)."""

from __future__ import annotations

from onnx2bir.bir.enums import MemoryKind
from onnx2bir.graph import Graph


def dram_kind(graph: Graph, overrides: dict[str, MemoryKind], tensor: str) -> MemoryKind:
    """createMemLoc's kind predicates, in the reference order (docs/memory_kinds.md).

    An override (`tensor_memkind`) wins. Then: a model weight feeding the function is an
    ExternalInputParameter (its payload supplied at load time), a graph input an
    ExternalInput, a weight that is also a graph output an ExternalOutputParameter, a
    computed graph output an ExternalOutput, a constant folded at compile time Const, and
    everything else Internal. A folded constant that is also a graph output stays Const and
    is published through an ExternalOutput copy (`BirCodeGen.output_location`): only a
    location codegen writes can be an ExternalOutput.
    """
    override = overrides.get(tensor)
    if override is not None:
        return override
    info = graph.tensors[tensor]
    parameter = tensor in graph.parameters and info.is_const
    outputs = graph.outputs
    if parameter and tensor not in outputs:
        return MemoryKind.EXTERNAL_INPUT_PARAMETER
    if tensor in graph.inputs:
        return MemoryKind.EXTERNAL_INPUT
    if parameter:
        return MemoryKind.EXTERNAL_OUTPUT_PARAMETER
    if tensor in outputs and not info.is_const:
        return MemoryKind.EXTERNAL_OUTPUT
    if info.is_const:
        return MemoryKind.CONST
    return MemoryKind.INTERNAL


def kept_fp32(graph: Graph, tensor: str) -> bool:
    """Whether a node `--auto-cast-exclude` keeps in fp32 reads or writes `tensor`."""
    keep = graph.keep_fp32
    if not keep:
        return False
    nodes = [node for node, _ in graph.consumers(tensor)]
    return graph.producer(tensor) in keep or any(node in keep for node in nodes)
