"""The cast plan's derivation: where the compiled program rounds a value of the model to a
narrower dtype (the plan's types, which a saved program's metadata carries, are in
`onnx2bir/bir/cast_plan.py`).

In: the model's graph as imported (before the passes: the node and tensor names of the ONNX
model), the graph after the passes, the BIR module and the memory plan. Out: a `CastPlan` —
every place where an ONNX node reads one of its inputs through storage narrower than the
model's dtype (`CastPoint`), the nodes whose rounding happens inside one ONNX op and cannot be
repeated by inserting casts around it (`unemulated`), and for each rounded intermediate where
the machine keeps it, so a run can read it (`Probe`); in a program that rounds, every
intermediate the program stores is a probe as well (`_intermediates`).
docs/validation.md#the-emulating-oracle.

The plan is read off the compile's own decisions, never re-derived from the options:

- **operand casts**: a node whose PE matmuls (not the transposes against the identity) take
  operands of a narrower dtype rounds its PE-operand inputs (the op traits' `pe_operands`:
  inputs 0 and 1 of MatMul, Gemm, Conv, ConvTranspose and a two-input Einsum; a bias rides on
  the PSUM eviction in fp32). A raised MLP kernel rounds the PE operands of every matmul of
  its block (the hidden activation included, which never leaves the kernel); the raised
  attention kernel rounds q, kᵀ and v, and inside its online softmax the unnormalised
  probabilities, which no cast around the ONNX ops reproduces: the plan names the kernel
  (`OnlineSoftmax`, `_online_softmax`) and the oracle computes its softmax key tile by key
  tile (runtime/oracle/online_softmax.py); where it cannot, the casts are inexact with the
  reason (`exact` is false);
- **storage casts**: a tensor of the model whose BIR location (DRAM or SBUF home) has a
  narrower dtype than the model gives it is rounded for every reader (`--auto-cast all`, and
  the operand-only tensors and weights `codegen/weight_cast.py` stores in the cast dtype).

A conv or matmul that multiplies integers (`compiled.integer_operands`, patterns/quant) rounds
nothing: its bf16 operands hold the integers exactly (docs/quantization.md#exactness).

- **recurrent ops** (LSTM, GRU, RNN, codegen/lower/recurrent.py): which of the node's PE
  matmuls take narrow operands, and of which of its inputs, is read off the program's data flow
  (`_recurrent_points`): the input projection X·Wᵀ rounds X and W (operand points: a cast
  before the op repeats them); the recurrent product h_{t-1}·Rᵀ rounds R and the state at every
  step (a point of kind "recurrent" on R), which the oracle repeats by computing the node step
  by step (runtime/oracle/emulating.py `recurrent_nodes`). Under the default autocast the
  lowering rounds only the projection: its recurrent matmuls and the gate math are fp32.

A node with narrow PE operands that is none of the above (a Loop whose body multiplies; a fused
attention op decomposed by a pass; a recurrent node whose narrow operands come from no single
input) is `unemulated`, with the reason.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import replace

import onnx

from onnx2bir.bir.cast_plan import (
    Boundary,
    CastPlan,
    CastPoint,
    ExpandedAttention,
    OnlineSoftmax,
    Probe,
)
from onnx2bir.bir.enums import Dtype, MemoryKind, MemoryType, Opcode
from onnx2bir.bir.ir import Module, node_of_origin
from onnx2bir.frontend import attention_block
from onnx2bir.frontend.function_expansion import inlined_body
from onnx2bir.graph import Graph, image_clone_of
from onnx2bir.op_traits import traits

RECURRENT_OPS = ("LSTM", "GRU", "RNN")
IDENTITY_PREFIX = "identity_"  # the PE transposes' identity tiles (docs/bir_codegen.md#prologue)
ONLINE_SOFTMAX = (
    "the attention kernel's online softmax rounds probabilities before they are normalised; "
    "casts around the ONNX ops cannot repeat that"
)


def plan_casts(
    source: Graph,
    compiled: Graph,
    module: Module,
    records: Iterable = (),
    homes: dict | None = None,
) -> CastPlan:
    """The cast plan of `module`, compiled from `source` (module docstring). `records` are the
    pass records (their findings name the blocks a kernel took over); `homes` the memory
    plan's SBUF homes by tensor."""
    function = module.functions[0]
    locations = function.memory_locations
    records = list(records)
    hosts, attention_hosts = kernel_hosts(records, compiled)
    hoisted = _hoisted_scales(records)
    narrow = _narrow_pe_nodes(module, set(compiled.nx))
    points: dict[tuple[str, str], CastPoint] = {}
    unemulated: dict[str, str] = {}

    def add(node: str, tensor: str, dtype: str, kind: str, reason: str | None = None) -> None:
        if tensor and (node, tensor) not in points:
            points[(node, tensor)] = CastPoint(node, tensor, dtype, kind, reason is None, reason)

    def inside(node: str, dtype: str) -> None:
        origin = node if node in source.nx else _source_node(records, node, source)
        op_type = source.node(origin)["op_type"] if origin in source.nx else "?"
        unemulated[origin or node] = (
            f"{op_type} multiplies {dtype} operands inside the op (no ONNX cast can round there)"
        )

    members = {host: [m for m, h in hosts.items() if h == host] for host in set(hosts.values())}
    online: dict[str, OnlineSoftmax] = {}
    online_hosts: dict[str, OnlineSoftmax] = {}
    online_operands: dict[str, list[tuple[str, str]]] = {}
    online_problems: dict[str, str] = {}
    for host in sorted(attention_hosts):
        entry, operands, problem = _online_softmax(source, compiled, host, members[host])
        if entry is None:
            online_problems[host] = f"{ONLINE_SOFTMAX} ({problem})"
        else:
            online[entry.tensor] = online_hosts[host] = entry
            online_operands[host] = operands
    emulated = {m for host in online_operands for m in members[host]}
    expanded: dict[str, ExpandedAttention] = {}
    expanded_nodes: set[str] = set()
    for node, dtype in narrow.items():
        if node in compiled.integer_operands:
            continue  # integers within ±256: exact in bf16, nothing to round
        if node in online_operands:  # the oracle computes the kernel as it computes
            for member, tensor in online_operands[node]:
                add(member, tensor, dtype, "operand")
            continue
        if node in members:  # a raised kernel: every PE op of its block
            reason = online_problems.get(node)
            for member in members[node]:
                if member not in source.nx:  # a pass-made op (an expanded MatMulNBits)
                    inside(member, dtype)
                    continue
                for tensor in _pe_inputs(source, member):
                    add(member, tensor, dtype, "operand", reason)
        elif node in source.nx and source.node(node)["op_type"] in RECURRENT_OPS:
            found = _recurrent_points(function, node, source)
            if found is None:
                inside(node, dtype)
            for tensor, narrow_dtype, kind in found or ():
                add(node, tensor, narrow_dtype, kind)
        elif node in source.nx and _pe_inputs(source, node):
            for tensor in _pe_inputs(source, node):
                add(*_rounded_at(source, hoisted, node, tensor), dtype, "operand")
        elif (clone := image_clone_of(node, source)) and _pe_inputs(source, clone):
            # an image's copy of a model node (patterns/batch_split.py): the same operands
            for tensor in _pe_inputs(source, clone):
                add(clone, tensor, dtype, "operand")
        else:
            origin = _source_node(records, node, source)
            if origin is not None and origin not in expanded_nodes:
                entry = _expanded_attention(source, origin, dtype)
                if entry is not None:
                    expanded[entry.tensor] = entry
                    expanded_nodes.add(origin)
                    for tensor in source.node(origin)["inputs"][:3]:
                        add(origin, tensor, dtype, "operand")
            if origin not in expanded_nodes:
                inside(node, dtype)
    for tensor, info in source.tensors.items():
        # (a tensor computed one image at a time is stored as its images, all alike)
        loc = locations.get(tensor) or locations.get(f"{tensor}@image0")
        if loc is None or info.dtype is not Dtype.FP32 or not loc.dtype.is_float:
            continue
        if loc.dtype.mantissa_bits < Dtype.FP32.mantissa_bits:
            for consumer, _ in source.consumers(tensor):
                add(consumer, tensor, str(loc.dtype), "storage")
    own_storage = {
        name
        for name, loc in locations.items()
        if name not in source.tensors
        and loc.kind is MemoryKind.INTERNAL
        and loc.dtype.is_float
        and loc.dtype.mantissa_bits < Dtype.FP32.mantissa_bits
        and (loc.memory is MemoryType.DRAM or name in (homes or {}))
    }
    for name in sorted(own_storage - _operand_only(function, own_storage)):
        # Storage of the program's own (a Loop body's values, a kernel's layout copy) rounded
        # narrower than fp32: a rounding inside one ONNX op.
        owner = node_of_origin(name, set(compiled.nx))
        origin = owner if owner in source.nx else _source_node(records, owner or name, source)
        if (
            origin is not None
            and origin not in unemulated
            and origin not in emulated
            and origin not in expanded_nodes
        ):
            op_type = source.node(origin)["op_type"]
            dtype = locations[name].dtype
            unemulated[origin] = f"{op_type} stores values of its own in {dtype} ({name})"
    ordered = [points[key] for key in sorted(points, key=_order_key(source))]
    watched = {p.input for p in ordered}
    if ordered or compiled.integer_operands:
        # A program that rounds, or one that sums integers exactly where onnxruntime sums
        # their dequantized floats: a QuantizeLinear after either can land one step apart,
        # so every stored intermediate is checked and fed on (docs/quantization.md#exactness).
        watched |= _intermediates(source)
    probes = _probes(source, compiled, locations, watched, homes or {})
    boundaries: dict[str, Boundary] = {}
    probed = set(probes) | {p.whole for p in probes.values() if p.whole is not None}
    flips: dict[str, list[str]] = {}
    for point in ordered:
        info = source.tensors.get(point.input)
        if not point.exact or point.input in probed or info is None or info.is_const:
            continue
        if point.input in source.inputs:
            continue
        # Rounded where the program never stores it: inside the kernel hosting the node.
        host = hosts.get(point.node)
        entry = online_hosts.get(host)
        if entry is not None and source.node(entry.node)["op_type"] == "Softmax":
            # The oracle allows for its flips inside the emulated softmax (`flips`).
            flips.setdefault(entry.tensor, []).append(point.input)
            continue
        outputs = [t for t in compiled.node(host)["outputs"] if t] if host else []
        kept = [t for t in outputs if t in source.tensors and t in locations]
        if not kept or len(kept) != len(outputs):
            unemulated.setdefault(
                point.node, f"rounds {point.input} to {point.dtype} where no probe can read it"
            )
            continue
        position = source.node(point.node)["inputs"].index(point.input)
        for tensor in kept:
            boundaries[tensor] = Boundary(tensor, point.node, point.input, position, point.dtype)
    probes.update(_probes(source, compiled, locations, set(boundaries) - set(probes), homes or {}))
    for tensor, unread in flips.items():
        online[tensor] = replace(online[tensor], flips=tuple(dict.fromkeys(unread)))
    return CastPlan(tuple(ordered), unemulated, probes, boundaries, online, expanded)


def _hoisted_scales(records: Iterable) -> dict[str, set[str]]:
    """MatMul → the Muls (or Divs) by a constant on its operands that FuseMatMulScale moved
    onto its eviction (patterns/matmul_scale.py): the MatMul then reads, and rounds, the
    unscaled operand."""
    found: dict[str, set[str]] = {}
    for record in records:
        for finding in record.result.findings:
            host, scale = finding.get("host"), finding.get("fused")
            if host and scale:
                found.setdefault(host, set()).add(scale)
    return found


def _rounded_at(
    source: Graph, hoisted: dict[str, set[str]], node: str, tensor: str
) -> tuple[str, str]:
    """(the node, the tensor it reads) where the program rounds `node`'s operand `tensor`:
    the operand itself, or, when a scale on it was hoisted onto the product's eviction, the
    scale's input (the oracle rounds it there, and the scale follows in fp32)."""
    producer = source.producer(tensor)
    if producer is None or producer not in hoisted.get(node, ()):
        return node, tensor
    live = [t for t in source.node(producer)["inputs"] if t and not source.tensors[t].is_const]
    return (producer, live[0]) if len(live) == 1 else (node, tensor)


def _online_softmax(
    source: Graph, compiled: Graph, host: str, members: list[str]
) -> tuple[OnlineSoftmax | None, list[tuple[str, str]], str | None]:
    """(the plan's entry, the (node, tensor) PE operands the kernel rounds, None) when the
    oracle can compute raised attention kernel `host` key tile by key tile
    (runtime/oracle/online_softmax.py), else (None, [], why not). `members`: the source nodes
    the kernel replaced — a matched block, or one fused `Attention` node, whose ONNX function
    body the oracle computes."""
    data = compiled.node(host)
    attrs = data["attrs"]
    config = json.loads(attrs.get("backend_config") or "{}")
    if config.get("auto_cast") == "all":
        return None, [], "its scores are stored narrow, rounded after every score step"
    if source.opset < attention_block.MIN_OPSET:
        return None, [], f"opset {source.opset} predates Gather along a negative axis"
    kt_shape = compiled.tensors[data["inputs"][1]].shape
    head_dim, seq_k = int(kt_shape[-2]), int(kt_shape[-1])
    storage = str(attrs.get("storage_dtype"))
    standard = ("", "ai.onnx")
    foreign = [m for m in members if source.node(m).get("domain", "") not in standard]
    if foreign:
        data = source.node(foreign[0])
        return None, [], f"{data['domain']}.{data['op_type']} has no ONNX definition to compute"
    fused = [m for m in members if source.node(m)["op_type"] == "Attention"]
    if fused:
        name = fused[0]
        nodes = _fused_body(source, name)
        if nodes is None:
            return None, [], f"Attention {name!r} has no ONNX function body at its opset"
        softmaxes = [n.name for n in nodes if n.op_type == "Softmax"]
        if len(softmaxes) != 1:
            return None, [], f"the function body of {name!r} has {len(softmaxes)} Softmax nodes"
        softmax = softmaxes[0]
        inputs = source.node(name)["inputs"]
        operands = [(name, t) for t in inputs[:3] if t]
    else:
        nodes = [_as_proto(m, source.node(m)) for m in members]
        softmax = next((m for m in members if source.node(m)["op_type"] == "Softmax"), None)
        if softmax is None:
            return None, [], "the block has no Softmax"
    block, problem = attention_block.read_block(nodes, softmax)
    if block is None:
        return None, [], problem
    if fused:
        tensor = source.node(name)["outputs"][0]
    else:
        tensor = block.pv.output[0]
        operands = [(block.qk.name, t) for t in block.qk.input[:2]]
        operands.append((block.pv.name, block.pv.input[1]))
    outside = [
        t for t in (block.softmax.input[0], block.pv.input[1], tensor) if t in source.tensors
    ]
    if any(source.tensors[t].dtype is not Dtype.FP32 for t in outside):
        return None, [], "the block does not compute in float32"
    key_tile = int((config.get("sb_shape") or [0, 0])[1])
    if key_tile <= 0:
        return None, [], "the kernel's configuration gives no key tile"
    entry = OnlineSoftmax(
        tensor, fused[0] if fused else softmax, key_tile, storage, head_dim, seq_k
    )
    return entry, operands, None


def _expanded_attention(source: Graph, name: str, dtype: str) -> ExpandedAttention | None:
    """The plan's entry for fused node `name` when it is an ai.onnx `Attention` the compile
    decomposed and the oracle can compute through its ONNX function body (one Softmax, then
    the PV MatMul, in float32), else None."""
    data = source.node(name)
    if data["op_type"] != "Attention" or data.get("domain", "") not in ("", "ai.onnx"):
        return None
    if source.opset < attention_block.MIN_OPSET:
        return None
    outputs = [t for t in data["outputs"] if t]
    if len(outputs) != 1 or any(source.tensors[t].dtype is not Dtype.FP32 for t in outputs):
        return None  # a KV cache or qk output: the decomposition does not take those
    nodes = _fused_body(source, name)
    softmaxes = [n.name for n in nodes or () if n.op_type == "Softmax"]
    if len(softmaxes) != 1:
        return None
    block, _ = attention_block.read_block(nodes, softmaxes[0])
    if block is None:
        return None
    seq_k = int(source.tensors[data["inputs"][1]].shape[-2])
    return ExpandedAttention(outputs[0], name, dtype, seq_k)


def _as_proto(name: str, data: dict) -> onnx.NodeProto:
    return onnx.helper.make_node(
        data["op_type"], data["inputs"], data["outputs"], name=name, **data["attrs"]
    )


def _fused_body(source: Graph, name: str) -> list[onnx.NodeProto] | None:
    """The function body of fused `Attention` node `name`, for its inputs' types."""
    data = source.node(name)
    types = {}
    for tensor in data["inputs"]:
        if tensor:
            info = source.tensors[tensor]
            elem = onnx.helper.np_dtype_to_tensor_dtype(info.dtype.numpy)
            types[tensor] = onnx.helper.make_tensor_type_proto(elem, list(info.shape))
    try:
        node = _as_proto(name, data)
    except (TypeError, ValueError):
        return None
    return inlined_body(node, source.opset, types)


def _intermediates(source: Graph) -> set[str]:
    """The model's float intermediates (neither weights, inputs nor outputs): in a program
    that rounds, each one the program stores is a probe, so every segment between two stored
    values is checked on its own — a flip, or an fp32 difference that a later cancellation
    makes large, cannot carry further (docs/validation.md#resynchronisation)."""
    return {
        tensor
        for tensor, info in source.tensors.items()
        if info.dtype.is_float
        and not info.is_const
        and tensor not in source.inputs
        and tensor not in source.outputs
    }


def _order_key(source: Graph):
    rank = {name: index for index, name in enumerate(source.nx.nodes)}
    return lambda key: (rank.get(key[0], len(rank)), key[1])


def _operand_only(function, names: set[str]) -> set[str]:
    """The locations of `names` read only by DMAs into on-chip tiles of their own dtype (a
    padded or flipped copy of an operand, stored as its reader loads it)."""
    if not names:
        return set()
    locations = function.memory_locations
    refused: set[str] = set()
    for ins in function.instructions():
        for ap, is_write in ins.accesses():
            if is_write or ap.loc not in names or ap.loc in refused:
                continue
            dst = locations[ins.dst.loc] if ins.dst is not None else None
            if (
                dst is None
                or dst.memory is MemoryType.DRAM
                or dst.dtype is not locations[ap.loc].dtype
            ):
                refused.add(ap.loc)
    return names - refused


def _target(data: dict) -> str | None:
    return data["attrs"].get("custom_call_target") if data["op_type"] == "CustomCall" else None


def _pe_inputs(source: Graph, node: str) -> list[str]:
    data = source.node(node)
    slots = traits(data["op_type"]).pe_operands
    inputs = data["inputs"]
    if data["op_type"] == "Einsum" and len([t for t in inputs if t]) != 2:
        return []
    return [inputs[i] for i in slots if i < len(inputs) and inputs[i]]


def _narrow_pe_nodes(module: Module, nodes: set[str]) -> dict[str, str]:
    """Compiled node → the narrower dtype its PE matmuls' operands are stored in."""
    function = module.functions[0]
    locations = function.memory_locations
    found: dict[str, str] = {}
    for ins in function.instructions():
        if ins.opcode is not Opcode.MATMULT:
            continue
        if ins.srcs["moving"].loc.startswith(IDENTITY_PREFIX):
            continue  # a transpose: data movement, exact
        dtypes = [locations[ins.srcs[r].loc].dtype for r in ("stationary", "moving")]
        narrowest = min(dtypes, key=lambda d: d.mantissa_bits)
        if narrowest.mantissa_bits >= Dtype.FP32.mantissa_bits:
            continue
        node = node_of_origin(ins.origin.node, nodes)
        if node is not None:
            found.setdefault(node, str(narrowest))
    return found


def _recurrent_points(function, node: str, source: Graph) -> list[tuple[str, str, str]] | None:
    """(input tensor, dtype, kind) for each narrow PE operand of recurrent node `node`, from
    the program's data flow: walking the node's instructions in program order, each location
    written holds what the instruction's reads hold (the model tensors it derives from; a tile
    is reloaded whole for each use). A matmul whose operands derive from R (input 2) is the
    recurrent product: R and the state are rounded (kind "recurrent" on R); any other is the
    input projection, each narrow operand holding X or W alone (kind "operand"). None when a
    narrow operand holds anything else, or the recurrent product's operands differ in dtype."""
    inputs = source.node(node)["inputs"]
    tensors = {t for t in inputs if t}
    recurrent_weight = inputs[2]
    locations = function.memory_locations
    held: dict[str, frozenset[str]] = {t: frozenset([t]) for t in tensors}
    found: dict[str, tuple[str, str]] = {}
    for ins in function.instructions():
        if node_of_origin(ins.origin.node, {node}) is None:
            continue
        reads, writes = [], []
        for ap, is_write in ins.accesses():
            (writes if is_write else reads).append(ap.loc)
        if ins.opcode is Opcode.MATMULT and not ins.srcs["moving"].loc.startswith(IDENTITY_PREFIX):
            operands = [ins.srcs[role].loc for role in ("stationary", "moving")]
            dtypes = [locations[loc].dtype for loc in operands]
            narrow = [
                (held.get(loc, frozenset()), dtype)
                for loc, dtype in zip(operands, dtypes, strict=True)
                if dtype.mantissa_bits < Dtype.FP32.mantissa_bits
            ]
            recurrent = any(recurrent_weight in held.get(loc, ()) for loc in operands)
            if narrow and recurrent:
                if len(narrow) != 2 or dtypes[0] is not dtypes[1]:
                    return None
                found.setdefault(recurrent_weight, (str(dtypes[0]), "recurrent"))
            elif narrow:  # the input projection
                for origin, dtype in narrow:
                    tensor = next(iter(origin)) if len(origin) == 1 else None
                    if tensor is None or inputs.index(tensor) not in (0, 1):
                        return None
                    found.setdefault(tensor, (str(dtype), "operand"))
        derived = frozenset().union(*(held.get(loc, frozenset()) for loc in reads))
        for loc in writes:
            if loc not in tensors:
                held[loc] = derived
    return [(tensor, dtype, kind) for tensor, (dtype, kind) in found.items()]


def kernel_hosts(records: Iterable, compiled: Graph) -> tuple[dict[str, str], set[str]]:
    """Node of the imported graph → the raised kernel node its block became, and the kernel
    nodes that are attention blocks (their findings say `is_attention`)."""
    hosts: dict[str, str] = {}
    attention: set[str] = set()
    for record in records:
        for finding in record.result.findings:
            members = list(finding.get("nodes") or [])
            kept = [n for n in members if n in compiled.nx and _target(compiled.node(n))]
            if kept:
                hosts.update(dict.fromkeys(members, kept[0]))
                if finding.get("is_attention"):
                    attention.add(kept[0])
    return hosts, attention


def _source_node(records: Iterable, node: str, source: Graph) -> str | None:
    """The imported node a pass-made node stands for (a decomposed fused op names its nodes
    `<op>/...`): the longest member of a finding that is the node or a prefix of it."""
    best = None
    for record in records:
        for finding in record.result.findings:
            for member in finding.get("nodes") or []:
                if member in source.nx and (node == member or node.startswith(member + "/")):
                    if best is None or len(member) > len(best):
                        best = member
    return best


def _probes(
    source: Graph, compiled: Graph, locations: dict, watched: set[str], homes: dict
) -> dict[str, Probe]:
    """Where the machine holds each watched intermediate the program stores."""
    probes = {}
    for tensor in sorted(watched):
        info = source.tensors.get(tensor)
        if info is None or info.is_const or tensor in source.inputs:
            continue  # a weight or an input: the oracle has the same values
        loc = locations.get(tensor)
        producer = compiled.producer(tensor)
        if loc is None and producer is None:
            probes.update(_image_probes(tensor, compiled, locations, homes))
            continue
        if loc is None or producer is None:
            continue  # inside a kernel: never stored
        home = homes.get(tensor)
        resident = home is not None and loc.memory is MemoryType.SB
        inner = home.inner if resident else None
        group = home.group if resident and home.group else None
        probes[tensor] = Probe(tensor, tensor, producer, inner, group=group)
    return probes


def _image_probes(tensor: str, compiled: Graph, locations: dict, homes: dict) -> dict:
    """Probes of the pieces of `tensor` when the program computes it a group of images at a
    time (`<tensor>@image<j>`, images j.. as many as its batch, patterns/batch_split.py); none
    unless every piece is stored."""
    pieces = {}
    part = 0
    while (name := f"{tensor}@image{part}") in compiled.tensors:
        loc, producer = locations.get(name), compiled.producer(name)
        if loc is None or producer is None:
            return {}
        home = homes.get(name)
        resident = home is not None and loc.memory is MemoryType.SB
        inner = home.inner if resident else None
        group = home.group if resident and home.group else None
        images = compiled.tensors[name].shape[0]
        pieces[name] = Probe(
            name, name, producer, inner, group, whole=tensor, part=part, images=images
        )
        part += images
    return pieces
