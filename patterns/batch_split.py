"""SplitBatch: run the batch-heavy front of a CNN one image at a time.

In: the Graph before conv selection. Out: the same computation, with a prefix of its
per-sample nodes (convolutions, pools, elementwise activations and adds, channel concats)
cloned once per image: the image inputs are split along the batch by a Split node, image j
runs the prefix's clones (`<node>/image<j>`, tensors `<tensor>@image<j>`), and every tensor
that leaves the prefix is put back together by a Concat along the batch. Nothing else changes.

Why (docs/memory_planner.md#batch-split): at batch N the activations of a CNN's first stages
are N times an image's and do not fit SBUF, so each one goes through DRAM between its producer
and its consumers; one image's do fit, and the nodes of the graph are emitted in order, so
with the prefix cloned per image the memory plan keeps each image's activations on chip from
one layer to the next. The price is that each clone loads its weights again: N - 1 extra
reads of the prefix's weights. The pass picks the prefix (a leading run of the per-sample
nodes, in topological order) that minimises

    (N - 1) x weight bytes of the prefix + DRAM round trips of the full-batch tensors left
    after it (2 x bytes of each output larger than `SPILL_BYTES`) + the round trips of the
    tensors leaving the prefix,

and leaves the graph alone when no prefix beats none.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from onnx2bir.codegen.casting import cast_dtype
from onnx2bir.graph import Graph, TensorInfo, image_clone_name
from onnx2bir.options import CompileOptions
from onnx2bir.patterns.passes import PassResult, Statistic

# A full-batch tensor larger than this (a quarter of SBUF: 48 KiB of each of the 128
# partitions, docs/neuroncore.md#memory) is counted as going through DRAM.
SPILL_BYTES = 48 * 1024 * 128

# Ops that compute each sample from that sample alone (and their attributes allow it).
PER_SAMPLE = frozenset(
    {
        "Conv",
        "Relu",
        "LeakyRelu",
        "Elu",
        "Sigmoid",
        "HardSigmoid",
        "HardSwish",
        "Tanh",
        "Clip",
        "Identity",
        "Add",
        "Sub",
        "Mul",
        "Div",
        "MaxPool",
        "AveragePool",
        "GlobalAveragePool",
        "GlobalMaxPool",
        "BatchNormalization",
        "Concat",
    }
)


@dataclass(frozen=True)
class SplitBatch:
    name: str = "SplitBatch"

    def run(self, graph: Graph, options: CompileOptions) -> PassResult:
        images = _images(graph)
        prefix, saved = [], 0
        if images:
            batch, inputs = images
            region = _per_sample_nodes(graph, batch, set(inputs))
            prefix, saved = _best_prefix(graph, region, batch, options)
            if prefix:
                _clone_per_image(graph, prefix, batch, inputs)
        findings = [
            {"node": name, "nodes": [name], "images": images[0] if images else 0} for name in prefix
        ]
        stats = [
            Statistic(self.name, "split_nodes", "Nodes run one image at a time", len(prefix)),
            Statistic(self.name, "saved_bytes", "Estimated DMA bytes saved", saved),
        ]
        return PassResult(bool(prefix), stats, findings)


def _images(graph: Graph) -> tuple[int, list[str]] | None:
    """(batch, the 4-D graph inputs) when every graph input is a batch of N > 1 images."""
    shapes = [tuple(graph.tensors[name].shape) for name in graph.inputs]
    if not shapes or any(len(shape) != 4 for shape in shapes):
        return None
    batch = shapes[0][0]
    if not isinstance(batch, int) or batch < 2 or any(s[0] != batch for s in shapes):
        return None
    return batch, list(graph.inputs)


def _per_sample_nodes(graph: Graph, batch: int, inputs: set[str]) -> list[str]:
    """The nodes, in topological order, that compute each image from that image alone, fed
    by the image inputs through such nodes only."""
    region: list[str] = []
    produced = set(inputs)
    for name in graph.topological_order():
        data = graph.node(name)
        if data["domain"] or data["op_type"] not in PER_SAMPLE or len(data["outputs"]) != 1:
            continue
        if data["op_type"] == "Concat":
            rank = len(graph.tensors[data["outputs"][0]].shape)
            if int(data["attrs"].get("axis", 0)) % rank == 0:
                continue
        out = graph.tensors[data["outputs"][0]]
        if len(out.shape) != 4 or out.shape[0] != batch or data["outputs"][0] in graph.outputs:
            continue
        ok = any(t in produced for t in data["inputs"] if t)
        parameters = data["op_type"] in ("Conv", "BatchNormalization")
        for index, tensor in enumerate(data["inputs"]):
            if not tensor or tensor in produced:
                continue
            info = graph.tensors[tensor]
            # A constant is shared by the images: a conv's or batch norm's parameters, or an
            # operand without a batch axis of its own (broadcast over the batch).
            shared = info.is_const and (
                (parameters and index > 0) or len(info.shape) < 4 or info.shape[0] == 1
            )
            ok = ok and shared
        if ok:
            region.append(name)
            produced.add(data["outputs"][0])
    return region


def _best_prefix(
    graph: Graph, region: list[str], batch: int, options: CompileOptions
) -> tuple[list[str], int]:
    """The leading run of `region` to clone per image, and the bytes it saves (module
    docstring); ([], 0) when none saves any."""
    cast = cast_dtype(options)  # weights are read in the autocast dtype
    weight_itemsize = cast.itemsize if cast is not None else 4

    def tensor_bytes(tensor: str) -> int:
        info = graph.tensors[tensor]
        return math.prod(info.shape) * info.dtype.itemsize

    def spill(tensor: str) -> int:
        size = tensor_bytes(tensor)
        return 2 * size if size > SPILL_BYTES else 0

    outputs = [graph.node(name)["outputs"][0] for name in region]
    weights = [
        sum(
            math.prod(graph.tensors[t].shape) * weight_itemsize
            for t in graph.node(name)["inputs"]
            if t and graph.tensors[t].is_const
        )
        for name in region
    ]
    spills = [spill(t) for t in outputs]
    baseline = sum(spills)
    best_cost, best_k = baseline, 0
    reloads = 0
    for k in range(1, len(region) + 1):
        reloads += (batch - 1) * weights[k - 1]
        inside = set(region[:k])
        leaving = [
            t
            for t in outputs[:k]
            if t in graph.outputs or any(c not in inside for c, _ in graph.consumers(t))
        ]
        cost = reloads + sum(spills[k:]) + sum(2 * tensor_bytes(t) for t in leaving)
        if cost < best_cost:
            best_cost, best_k = cost, k
    return region[:best_k], baseline - best_cost


def _clone_per_image(graph: Graph, prefix: list[str], batch: int, inputs: list[str]) -> None:
    inside = set(prefix)
    datas = [(name, graph.node(name)) for name in prefix]
    produced = {data["outputs"][0] for _, data in datas}
    read = {t for _, data in datas for t in data["inputs"] if t}
    leaving = [
        t
        for t in sorted(produced, key=[d["outputs"][0] for _, d in datas].index)
        if t in graph.outputs or any(c not in inside for c, _ in graph.consumers(t))
    ]
    datas = [(name, {**data, "attrs": dict(data["attrs"])}) for name, data in datas]
    for name in prefix:
        graph.remove_node(name)

    def piece(tensor: str, image: int) -> str:
        return f"{tensor}@image{image}"

    def add_piece(tensor: str, image: int) -> str:
        info = graph.tensors[tensor]
        name = piece(tensor, image)
        graph.tensors[name] = TensorInfo(name, (1, *info.shape[1:]), info.dtype)
        return name

    for x in inputs:
        if x in read:
            pieces = [add_piece(x, j) for j in range(batch)]
            graph.add_node(f"{x}/batch_split", "Split", [x], pieces, {"axis": 0})
    for image in range(batch):
        for name, data in datas:
            graph.add_node(
                image_clone_name(name, image),
                data["op_type"],
                [piece(t, image) if t in produced or t in inputs else t for t in data["inputs"]],
                [add_piece(t, image) for t in data["outputs"]],
                data["attrs"],
                domain=data["domain"],
            )
    for tensor in leaving:
        graph.add_node(
            f"{tensor}/batch_concat",
            "Concat",
            [piece(tensor, image) for image in range(batch)],
            [tensor],
            {"axis": 0},
        )
    for tensor in produced - set(leaving):
        del graph.tensors[tensor]
