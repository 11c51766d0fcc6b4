"""Cutting an ONNX model into a smaller one that onnxruntime still loads.

In: the model as the user gave it and onnxruntime's value of every tensor on one set of inputs
(`all_values`). Out: `Cut`s — a model made of some of the nodes, in their order, with

- **outputs** where the cut ends: the tensors its nodes make that a later node or the graph
  reads (`truncated`), or one node's outputs (`upstream`);
- **inputs** where the cut begins: a tensor its nodes read but no kept node makes becomes a
  graph input fed with onnxruntime's value when it is a float that depends on the graph's
  inputs, and a constant (an initializer holding that value) otherwise — indices, shapes and
  values computed from weights alone stay constants, as the compiler needs them;
- the model's opset imports, functions and initializers that the kept nodes read.

The node order is the model's (ONNX requires it topological), so "node k" means the same node in
every cut. docs/debug.md#reduce; `validate --segments` (docs/validation.md#segments) cuts a
model into consecutive pieces with `Cutter.segment`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnx2bir.errors import UserError
from onnx2bir.runtime.oracle.ort import run_onnxruntime


def subgraph_reads(node: onnx.NodeProto) -> list[str]:
    """The tensors a node reads: its inputs, and the outer-scope names its subgraph
    attributes (a Loop's or an If's body) read without defining them."""
    reads = [name for name in node.input if name]
    for attribute in node.attribute:
        graphs = list(attribute.graphs) + ([attribute.g] if attribute.HasField("g") else [])
        for graph in graphs:
            defined = {i.name for i in graph.input} | {i.name for i in graph.initializer}
            for inner in graph.node:
                reads.extend(t for t in subgraph_reads(inner) if t not in defined)
                defined.update(inner.output)
    return list(dict.fromkeys(reads))


def all_values(
    model: onnx.ModelProto, feeds: dict[str, np.ndarray], only: set[str] | None = None
) -> dict[str, np.ndarray]:
    """onnxruntime's value of every tensor of the model (inputs, initializers and each node's
    outputs) on `feeds`; with `only`, of the node outputs among `only` and the graph outputs
    (onnxruntime returns fewer tensors, which is faster)."""
    proto = onnx.ModelProto()
    proto.CopyFrom(model)
    listed = {output.name for output in proto.graph.output}
    for node in proto.graph.node:
        for name in node.output:
            if name and name not in listed and (only is None or name in only):
                proto.graph.output.append(onnx.ValueInfoProto(name=name))
                listed.add(name)
    values = dict(feeds)
    values.update({i.name: numpy_helper.to_array(i) for i in model.graph.initializer})
    values.update(run_onnxruntime(proto, feeds))
    return values


@dataclass
class Cut:
    """A model made of some nodes of the original, with the values of its graph inputs."""

    model: onnx.ModelProto
    feeds: dict[str, np.ndarray]
    nodes: list[int]  # indices of the kept nodes in the original's order
    frozen: list[str] = field(default_factory=list)  # cut tensors made constants

    @property
    def size(self) -> int:
        return len(self.nodes)


class Cutter:
    """Cuts of one model (module docstring). `values` may be None when onnxruntime cannot run
    the model: cuts then keep the model's own inputs (`truncated`, `upstream`) and cannot
    begin later (`upstream` with first > 0 raises)."""

    def __init__(self, model: onnx.ModelProto, feeds: dict, values: dict | None):
        self.model = model
        self.nodes = list(model.graph.node)
        self.feeds = feeds
        self.values = values
        self.initializers = {i.name: i for i in model.graph.initializer}
        self.graph_inputs = [i.name for i in model.graph.input if i.name not in self.initializers]
        self.graph_outputs = [o.name for o in model.graph.output]
        self.reads = [subgraph_reads(node) for node in self.nodes]
        self.dynamic = self._dynamic()

    def _dynamic(self) -> set[str]:
        """Tensors whose value depends on a graph input."""
        found = set(self.graph_inputs)
        for node, reads in zip(self.nodes, self.reads, strict=True):
            if any(t in found for t in reads):
                found.update(t for t in node.output if t)
        return found

    # --- the two kinds of cut ------------------------------------------------------------------
    def truncated(self, last: int) -> Cut:
        """Nodes 0..last; its outputs are every tensor they make that a later node or the graph
        reads (the model stopped after node `last`)."""
        kept = list(range(last + 1))
        later = {t for reads in self.reads[last + 1 :] for t in reads} | set(self.graph_outputs)
        made = [t for i in kept for t in self.nodes[i].output if t]
        outputs = [t for t in made if t in later] or [t for t in self.nodes[last].output if t]
        return self._build(kept, outputs, first=0)

    def upstream(self, last: int, first: int = 0) -> Cut:
        """The nodes among first..last that node `last`'s outputs need; its outputs are node
        `last`'s. Tensors it reads from before `first` become inputs or constants."""
        if first > 0 and self.values is None:
            raise UserError("onnxruntime cannot run the model, so a cut cannot begin later")
        needed = set(self.reads[last])
        kept = [last]
        for index in range(last - 1, first - 1, -1):
            if any(t in needed for t in self.nodes[index].output if t):
                kept.append(index)
                needed.update(self.reads[index])
        kept.reverse()
        return self._build(kept, [t for t in self.nodes[last].output if t], first)

    def segment(self, first: int, last: int) -> Cut:
        """Nodes first..last, all of them; its outputs are every tensor they make that a later
        node or the graph reads. Tensors it reads from before `first` become inputs or
        constants, as in `upstream`."""
        if first > 0 and self.values is None:
            raise UserError("onnxruntime cannot run the model, so a cut cannot begin later")
        later = {t for reads in self.reads[last + 1 :] for t in reads} | set(self.graph_outputs)
        kept = list(range(first, last + 1))
        made = [t for i in kept for t in self.nodes[i].output if t]
        return self._build(kept, [t for t in made if t in later], first)

    # --- building one ---------------------------------------------------------------------------
    def _build(self, kept: list[int], outputs: list[str], first: int) -> Cut:
        made = {t for i in kept for t in self.nodes[i].output if t}
        read = list(dict.fromkeys(t for i in kept for t in self.reads[i]))
        inputs, initializers, feeds, frozen = [], [], {}, []
        for name in read:
            if name in made:
                continue
            if name in self.initializers:
                initializers.append(self.initializers[name])
            elif name in self.graph_inputs:
                inputs.append(self._value_info(name, self.feeds.get(name)))
                if name in self.feeds:
                    feeds[name] = self.feeds[name]
            else:  # made by a node before the cut
                value = self.values[name]
                if name in self.dynamic and np.asarray(value).dtype.kind == "f":
                    inputs.append(self._value_info(name, value))
                    feeds[name] = value
                else:
                    initializers.append(numpy_helper.from_array(np.asarray(value), name))
                    frozen.append(name)
        graph = helper.make_graph(
            [self.nodes[i] for i in kept],
            self.model.graph.name,
            inputs,
            [self._value_info(name, (self.values or {}).get(name)) for name in outputs],
            initializers,
        )
        model = helper.make_model(
            graph,
            opset_imports=list(self.model.opset_import),
            ir_version=self.model.ir_version,
            producer_name=f"onnx2bir (a cut of {self.model.graph.name or 'a model'})",
        )
        model.functions.extend(self.model.functions)
        return Cut(model, feeds, kept, frozen)

    def _value_info(self, name: str, value) -> onnx.ValueInfoProto:
        """A typed value info: from the value when there is one, else the model's own."""
        if value is not None:
            array = np.asarray(value)
            elem = helper.np_dtype_to_tensor_dtype(array.dtype)
            return helper.make_tensor_value_info(name, elem, list(array.shape))
        graph = self.model.graph
        for info in [*graph.input, *graph.output, *graph.value_info]:
            if info.name == name:
                return info
        return onnx.ValueInfoProto(name=name)  # onnxruntime accepts an untyped output
