"""SplitBatch: run the batch-heavy front of a CNN a few images at a time.

In: the Graph before conv selection. Out: the same computation, with a prefix of its
per-sample nodes (convolutions, pools, elementwise activations and adds, channel concats, means
and maxima over each image)
cloned per group of images, in tiers: tier t runs its nodes on groups of g_t images, the
groups growing from one tier to the next (1, then 2, then 4, ...; each dividing the next and
the batch N). The clones are `<node>/image<j>` for a single image and `<node>/images<j>-<k>` for
images j..k; a tensor computed in groups is stored as its pieces `<tensor>@image<j>`, each the
group of images starting at j, batch g. A Split along the batch feeds the first tier; where a
tier reads a tensor computed in smaller groups, a Concat along the batch makes the group it
needs (`<tensor>@images<j>-<k>`); every tensor that leaves the prefix is put back together by
a Concat along the batch. The last tier's groups run in lockstep, segment by segment, when
its weights are too large to stay on chip from one group to the next (`_lockstep_segments`).
Nothing else changes.

Why (docs/memory_planner.md#batch-split): at batch N the activations of a CNN's first stages
are N times an image's and do not fit SBUF, so each one goes through DRAM between its producer
and its consumers; a few images' do fit, and the nodes of the graph are emitted in order, so
with the prefix cloned per group the memory plan keeps each group's activations on chip from
one layer to the next. The price is that each clone loads its weights again: N / g - 1 extra
reads of a tier's weights, counted here in full although the memory planner later keeps some
of them in SBUF for several clones when there is room (docs/memory_planner.md#shared-weights).
The activations shrink stage by stage while the weights grow, so later stages take larger
groups. The pass picks the tiers (by dynamic programming over the
per-sample nodes in topological order and the divisors of N) that minimise

    sum over tiers of (N / g - 1) x weight bytes of its nodes (a tier of g > 1 only of ops
      whose lowerings walk a group's planes as rows, `GROUP_WALKED`)
    + DRAM round trips of the tensors too large to stay on chip: 2 x bytes of each output whose
      group (its bytes x g / N, or the whole tensor after the prefix) exceeds `SPILL_BYTES`
    + the bytes the Concats copy to regroup tensors between tiers
    + the round trips of the tensors leaving the prefix,

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
        "ReduceMean",
        "ReduceMax",
    }
)


# Per-sample ops whose lowerings walk a batch of a few images a channel plane at a time, the
# rows the memory planner keeps such tensors in (docs/memory_planner.md#layout), so that a
# group of g > 1 images stays on chip as a single image does. BatchNormalization is not among
# them: its lowering packs several images' planes into one tile, an access that steps both
# channels and images, which the planner cannot map to rows; a tier of groups takes none.
GROUP_WALKED = PER_SAMPLE - {"BatchNormalization", "ReduceMean", "ReduceMax"}


@dataclass(frozen=True)
class SplitBatch:
    name: str = "SplitBatch"

    def run(self, graph: Graph, options: CompileOptions) -> PassResult:
        images = _images(graph)
        tiers, saved, lockstep = [], 0, []
        if images:
            batch, inputs = images
            region = _per_sample_nodes(graph, batch, set(inputs))
            tiers, saved = _best_tiers(graph, region, batch, options)
            if tiers:
                lockstep = _lockstep_segments(graph, tiers[-1], batch, _weight_itemsize(options))
                _clone_in_tiers(graph, tiers, batch, inputs, lockstep)
        # the lockstep segment of each node of the last tier (when its groups are in lockstep)
        segment = {name: k for k, nodes in enumerate(lockstep) for name in nodes}
        findings = [
            {
                "node": name,
                "nodes": [name],
                "images": images[0],
                "group": tier.group,
                **(
                    {"lockstep_segment": segment[name]}
                    if tier is tiers[-1] and len(lockstep) > 1
                    else {}
                ),
            }
            for tier in tiers
            for name in tier.nodes
        ]
        stats = [
            Statistic(
                self.name, "split_nodes", "Nodes run a group of images at a time", len(findings)
            ),
            Statistic(self.name, "tiers", "Tiers (group sizes) of the split nodes", len(tiers)),
            Statistic(self.name, "saved_bytes", "Estimated DMA bytes saved", saved),
        ]
        return PassResult(bool(tiers), stats, findings)


@dataclass(frozen=True)
class Tier:
    """Consecutive per-sample nodes (in topological order) run on groups of `group` images."""

    nodes: tuple[str, ...]
    group: int


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
        if data["op_type"] in ("ReduceMean", "ReduceMax") and not _reduces_within_images(
            graph, data
        ):
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


def _reduces_within_images(graph: Graph, data: dict) -> bool:
    """Whether a ReduceMean or ReduceMax of a [N, C, H, W] tensor keeps the batch axis: known
    axes, none of them 0, and the reduced axes kept (a squeeze-and-excitation block's mean over
    the image)."""
    rank = len(graph.tensors[data["inputs"][0]].shape)
    axes = data["attrs"].get("axes")
    if axes is None and len(data["inputs"]) > 1 and data["inputs"][1]:
        info = graph.tensors[data["inputs"][1]]
        axes = info.const.tolist() if info.is_const else None
    if axes is None or not data["attrs"].get("keepdims", 1):
        return False
    return all(int(axis) % rank != 0 for axis in axes)


def _best_tiers(
    graph: Graph, region: list[str], batch: int, options: CompileOptions
) -> tuple[list[Tier], int]:
    """The tiers to clone `region`'s leading nodes in, and the bytes they save (module
    docstring); ([], 0) when no split saves any."""
    weight_itemsize = _weight_itemsize(options)
    count = len(region)
    position = {name: index for index, name in enumerate(region)}
    outputs = [graph.node(name)["outputs"][0] for name in region]
    sizes = [math.prod(graph.tensors[t].shape) * graph.tensors[t].dtype.itemsize for t in outputs]
    weights = [_weight_bytes(graph, name, weight_itemsize) for name in region]
    readers = [  # region positions reading each output; None for a reader outside the region
        [position.get(c) for c, _ in graph.consumers(t)] + ([None] if t in graph.outputs else [])
        for t in outputs
    ]
    groups = [g for g in range(1, batch) if batch % g == 0]
    # ungrouped[k]: how many of region[:k] no tier of groups may take (GROUP_WALKED)
    ungrouped = [0]
    for name in region:
        ungrouped.append(ungrouped[-1] + (graph.node(name)["op_type"] not in GROUP_WALKED))

    def spill(index: int, group: int) -> int:
        return 2 * sizes[index] if sizes[index] * group > SPILL_BYTES * batch else 0

    def prefix_sums(values: list[int]) -> list[int]:
        sums = [0]
        for value in values:
            sums.append(sums[-1] + value)
        return sums

    weight_sums = prefix_sums(weights)
    spill_sums = {g: prefix_sums([spill(i, g) for i in range(count)]) for g in (*groups, batch)}
    # leaving[end]: round trips of the outputs of region[:end] read after it or by the graph
    leaving = [
        sum(2 * sizes[i] for i in range(end) if any(r is None or r >= end for r in readers[i]))
        for end in range(count + 1)
    ]
    # regrouped[first][end]: bytes the Concats copy to regroup the outputs of region[:first]
    # that region[first:end] reads
    reads = [[] for _ in range(count)]  # region positions whose outputs each node reads
    for i, users in enumerate(readers):
        for r in users:
            if r is not None:
                reads[r].append(i)
    regrouped = []
    for first in range(count + 1):
        row, seen, total = [0] * (count + 1), set(), 0
        for end in range(first + 1, count + 1):
            for i in reads[end - 1]:
                if i < first and i not in seen:
                    seen.add(i)
                    total += sizes[i]
            row[end] = total
        regrouped.append(row)
    baseline = spill_sums[batch][count]
    # best[(end, group)]: the cheapest tiers covering region[:end], the last of `group`
    best: dict[tuple[int, int], tuple[int, tuple[Tier, ...]]] = {}
    for end in range(1, count + 1):
        for group in groups:
            for first in range(end):
                if group > 1 and ungrouped[end] > ungrouped[first]:
                    continue
                tier_cost = (batch // group - 1) * (weight_sums[end] - weight_sums[first])
                tier_cost += spill_sums[group][end] - spill_sums[group][first]
                if first == 0:
                    before = [(0, ())]
                else:
                    tier_cost += regrouped[first][end]
                    before = [
                        best[(first, g)]
                        for g in groups
                        if g < group and group % g == 0 and (first, g) in best
                    ]
                for cost_before, tiers_before in before:
                    cost = cost_before + tier_cost
                    if (end, group) not in best or cost < best[(end, group)][0]:
                        tier = Tier(tuple(region[first:end]), group)
                        best[(end, group)] = (cost, (*tiers_before, tier))
    best_cost, best_tiers = baseline, ()
    for (end, _), (cost, tiers) in best.items():
        total = cost + baseline - spill_sums[batch][end] + leaving[end]
        if total < best_cost:
            best_cost, best_tiers = total, tiers
    return list(best_tiers), baseline - best_cost


def _weight_itemsize(options: CompileOptions) -> int:
    cast = cast_dtype(options)  # weights are read in the autocast dtype
    return cast.itemsize if cast is not None else 4


def _weight_bytes(graph: Graph, node: str, itemsize: int) -> int:
    return sum(
        math.prod(graph.tensors[t].shape) * itemsize
        for t in graph.node(node)["inputs"]
        if t and graph.tensors[t].is_const
    )


def _clone_in_tiers(
    graph: Graph,
    tiers: list[Tier],
    batch: int,
    inputs: list[str],
    lockstep: list[tuple[str, ...]],
) -> None:
    """Replace the tiers' nodes by their clones, one per group of images, emitted so that each
    group of a tier runs right after the smaller groups it is made of, the last tier's groups
    in lockstep over the segments `lockstep` (module docstring)."""
    datas = {
        name: {**graph.node(name), "attrs": dict(graph.node(name)["attrs"])}
        for tier in tiers
        for name in tier.nodes
    }
    order = [name for tier in tiers for name in tier.nodes]
    produced = {datas[name]["outputs"][0]: tier.group for tier in tiers for name in tier.nodes}
    inside = set(order)
    leaving = [
        datas[name]["outputs"][0]
        for name in order
        if datas[name]["outputs"][0] in graph.outputs
        or any(c not in inside for c, _ in graph.consumers(datas[name]["outputs"][0]))
    ]
    # Each tensor's own pieces come in the group size of the tier that computes it (a graph
    # input: of the first tier that reads it).
    own_group = dict(produced)
    for tier in tiers:
        for name in tier.nodes:
            for tensor in datas[name]["inputs"]:
                if tensor in inputs:
                    own_group.setdefault(tensor, tier.group)
    for name in order:
        graph.remove_node(name)

    def add_tensor(tensor: str, name: str, group: int) -> str:
        info = graph.tensors[tensor]
        graph.tensors[name] = TensorInfo(name, (group, *info.shape[1:]), info.dtype)
        return name

    def own_piece(tensor: str, first: int) -> str:
        return f"{tensor}@image{first}"

    for x in inputs:
        if x in own_group:
            group = own_group[x]
            pieces = [add_tensor(x, own_piece(x, first), group) for first in range(0, batch, group)]
            graph.add_node(f"{x}/batch_split", "Split", [x], pieces, {"axis": 0})

    def piece(tensor: str, first: int, group: int) -> str:
        """`tensor`'s images first..first+group-1 as one tensor, regrouped if need be."""
        if tensor not in own_group:
            return tensor  # a weight, or an operand shared by the images
        own = own_group[tensor]
        if own == group:
            return own_piece(tensor, first)
        name = f"{tensor}@images{first}-{first + group - 1}"
        if name not in graph.tensors:
            parts = [own_piece(tensor, j) for j in range(first, first + group, own)]
            add_tensor(tensor, name, group)
            node = f"{tensor}/regroup{first}-{first + group - 1}"
            graph.add_node(node, "Concat", parts, [name], {"axis": 0})
        return name

    def run_nodes(tier: Tier, nodes: tuple[str, ...], first: int) -> None:
        for name in nodes:
            data = datas[name]
            graph.add_node(
                image_clone_name(name, first, tier.group),
                data["op_type"],
                [piece(t, first, tier.group) if t else t for t in data["inputs"]],
                [add_tensor(t, own_piece(t, first), tier.group) for t in data["outputs"]],
                data["attrs"],
                domain=data["domain"],
            )

    def run_group(level: int, first: int, nodes: tuple[str, ...] | None = None) -> None:
        tier = tiers[level]
        if level:
            for sub in range(first, first + tier.group, tiers[level - 1].group):
                run_group(level - 1, sub)
        run_nodes(tier, tier.nodes if nodes is None else nodes, first)

    last = tiers[-1]
    firsts = range(0, batch, last.group)
    for first in firsts:
        run_group(len(tiers) - 1, first, lockstep[0])
    for segment in lockstep[1:]:
        for first in firsts:
            run_nodes(last, segment, first)
    for tensor in leaving:
        group = own_group[tensor]
        parts = [own_piece(tensor, first) for first in range(0, batch, group)]
        graph.add_node(f"{tensor}/batch_concat", "Concat", parts, [tensor], {"axis": 0})
    for tensor in set(produced) - set(leaving):
        del graph.tensors[tensor]


def _lockstep_segments(
    graph: Graph, tier: Tier, batch: int, weight_itemsize: int
) -> list[tuple[str, ...]]:
    """The last tier's nodes cut into segments that its groups run in lockstep: every group
    runs a segment before any group runs the next, so the clones of a node run close together
    and the memory plan can keep its weights in one SBUF home for all of them
    (docs/memory_planner.md#shared-weights).

    Only when the tier's weights take more than `SPILL_BYTES`: smaller weights stay on chip
    from one group to the next as they are, and lockstep only holds more activations. A cut
    after a node is taken when the activations crossing it (computed before it, or brought in
    from before the tier, and read by the tier after it) take at most `SPILL_BYTES` for every
    group but one: what the other groups hold while one group runs the next segment. One
    segment, the whole tier, otherwise."""
    nodes = tier.nodes
    weights = sum(_weight_bytes(graph, name, weight_itemsize) for name in nodes)
    if batch // tier.group < 2 or weights <= SPILL_BYTES:
        return [nodes]
    last_read: dict[str, int] = {}  # each activation the tier reads: its last reader
    born: dict[str, int] = {}  # its writer's position; -1 for one from before the tier
    for index, name in enumerate(nodes):
        data = graph.node(name)
        for tensor in data["inputs"]:
            if tensor and not graph.tensors[tensor].is_const:
                last_read[tensor] = index
                born.setdefault(tensor, -1)
        born[data["outputs"][0]] = index

    def held(tensor: str) -> int:  # the other groups' pieces of `tensor`, in bytes
        info = graph.tensors[tensor]
        size = math.prod(info.shape) * info.dtype.itemsize
        return size - size * tier.group // batch

    segments, start = [], 0
    for cut in range(len(nodes) - 1):
        crossing = [t for t, end in last_read.items() if born[t] <= cut < end]
        if sum(held(t) for t in crossing) <= SPILL_BYTES:
            segments.append(nodes[start : cut + 1])
            start = cut + 1
    segments.append(nodes[start:])
    return segments
