"""`validate --localize`: which node went wrong first, by how much, and on which kernel.

In: the folded ONNX model and the graph built from it before the passes (`Prepared`), the
machine after a full run (every ONNX tensor the program materialises is a DRAM location named
after it), the inputs, and the tolerance policy. Out: a JSON-ready dict with one record per
node in topological order, the first node that exceeds its tolerance, the first node whose
value is NaN or ±inf on each side, and each conv's kernel or fallback reason next to its error.
Each node with PE matmuls also carries `pe_dtype`, the dtype its matmul operands are stored in
(the general autocast's cast dtype, or float32).

Streaming (docs/validation.md#localize-streaming: marking every tensor at once runs out of memory).
The machine holds its DRAM whatever we do; the oracle side is bounded: intermediates are exposed as
extra outputs of the folded model in batches of at most `budget_bytes`, in topological order, each
batch compared with the machine's DRAM and freed before the next run. Kept per tensor: a few
numbers. The weights go to onnxruntime as inputs of the skeleton, never re-serialised
(`ExposingOracle`).

Own vs carried error (docs/validation.md#own-vs-carried). The first failing node (and the first node
that makes NaN/inf, when it differs) is run alone on onnxruntime's values of its inputs
(`onnx2bir.validation.alone`): over tolerance alone, its own error; within, error carried in from
earlier nodes and amplified here.

Tensors a pass fused away (inside a raised attention block) have no DRAM location; their
nodes are reported as "fused", and the block's output is compared at the node producing it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

from onnx2bir.bir.cast_plan import CastPlan
from onnx2bir.bir.enums import Dtype, MemoryType, Opcode
from onnx2bir.bir.ir import node_of_origin
from onnx2bir.graph import Graph
from onnx2bir.options import CompileOptions
from onnx2bir.patterns.findings import describe_blocks
from onnx2bir.runtime.machine.machine import Machine
from onnx2bir.runtime.oracle.compare import ERROR_KEYS, compare_output, tensor_record
from onnx2bir.runtime.oracle.emulating import run_emulating
from onnx2bir.runtime.oracle.tolerance import TolerancePolicy
from onnx2bir.runtime.oracle.verdict import bound_for, check_narrow, taints
from onnx2bir.validation.alone import diagnose, run_alone, runtime_inputs
from onnx2bir.validation.prepared import ObserverFactory, Prepared, conv_findings, lowering_of

DEFAULT_BUDGET_BYTES = 256 << 20


# --- the oracle with intermediates exposed --------------------------------------------------
class ExposingOracle:
    """The emulating oracle (`runtime/oracle/emulating.py`) on the folded skeleton, with chosen
    tensors as its outputs, resynchronised at the tensors of `machine_values`.

    The weights the importer held aside stay graph inputs of the skeleton and are fed with the
    inputs, so each run serialises only the skeleton: no copy of the weights per batch and no
    2 GB protobuf limit.
    """

    def __init__(self, prepared: Prepared, machine_values: dict[str, np.ndarray] | None = None):
        self.folded = prepared.folded
        self.graph = prepared.pristine
        self.weights = prepared.weights
        self.plan = prepared.compilation.cast_plan or CastPlan()
        self.machine_values = machine_values or {}

    def run(self, feeds: dict[str, np.ndarray], names: list[str]) -> dict[str, np.ndarray]:
        if not names:
            return {}
        return run_emulating(
            self.folded, self.graph, self.weights, self.plan, feeds, self.machine_values, names
        )


# --- the walk -------------------------------------------------------------------------------


def _nbytes(graph: Graph, tensor: str) -> int:
    info = graph.tensors[tensor]
    return math.prod(info.shape) * info.dtype.itemsize


def _batches(graph: Graph, tensors: list[str], budget: int) -> list[list[str]]:
    batches, current, size = [], [], 0
    for tensor in tensors:
        nbytes = _nbytes(graph, tensor)
        if current and size + nbytes > budget:
            batches.append(current)
            current, size = [], 0
        current.append(tensor)
        size += nbytes
    if current:
        batches.append(current)
    return batches


def localize(
    prepared: Prepared,
    machine: Machine,
    feeds: dict[str, np.ndarray],
    policy: TolerancePolicy,
    options: CompileOptions,
    budget_bytes: int = DEFAULT_BUDGET_BYTES,
    factories: Iterable[ObserverFactory] = (),
    machine_values: dict[str, np.ndarray] | None = None,
) -> dict:
    """Compare every intermediate, in topological order (module docstring), with the
    emulating oracle resynchronised at `machine_values` (the verdict's choice)."""
    graph, compilation = prepared.pristine, prepared.compilation
    locations = machine.locations
    machine_values = machine_values or {}
    found_taints = taints(graph, compilation.cast_plan or CastPlan(), set(machine_values))
    convs = conv_findings(compilation)
    pe_dtypes = pe_operand_dtypes(graph, compilation.module)
    # A tensor is charged to the node that writes it in the program: a node fused into one
    # that stays (a Relu run on its conv's eviction) hands its output to that node.
    written = compilation.graph.producers
    owner = {
        t: writer if (writer := written.get(t, name)) in graph.nx else name
        for name, data in graph.nodes()
        for t in data["outputs"]
        if t
    }
    charged: dict[str, list[str]] = {}
    for tensor, node in owner.items():
        charged.setdefault(node, []).append(tensor)
    plan: list[tuple[str, dict, list[str], list[str]]] = []
    for name, data in graph.nodes():
        outputs = [t for t in data["outputs"] if t]
        compared = [
            t
            for t in charged.get(name, [])
            if t in locations
            and locations[t].memory is MemoryType.DRAM
            and not graph.tensors[t].is_const
        ]
        fused = [t for t in outputs if t not in locations or owner[t] != name]
        plan.append((name, data, compared, fused))
    tensor_results: dict[str, dict] = {}
    oracle = ExposingOracle(prepared, machine_values)
    wanted = [t for _, _, compared, _ in plan for t in compared]
    batches = _batches(graph, wanted, budget_bytes)
    producer = {t: (name, data) for name, data, compared, _ in plan for t in compared}
    for batch in batches:
        reference = oracle.run(feeds, batch)
        for tensor in batch:
            node, data = producer[tensor]
            ref = reference.pop(tensor)
            tol, kind = bound_for(policy, graph, tensor, ref, found_taints.get(tensor))
            stored = locations[tensor].dtype
            value = machine.read(tensor)
            if stored.is_float and stored.mantissa_bits < Dtype.FP32.mantissa_bits:
                result = check_narrow(tensor, value, stored, ref, tol)
            else:
                result = compare_output(tensor, value, ref, tol.atol, tol.rtol, tol.source)
            tensor_results[tensor] = tensor_record(result) | {"bound": kind}
            del ref
    nodes = [
        _node_record(name, data, compared, fused, tensor_results, graph, convs, compilation)
        | ({"pe_dtype": pe_dtypes[name]} if name in pe_dtypes else {})
        for name, data, compared, fused in plan
    ]
    doc = {
        "nodes_total": len(nodes),
        "nodes_compared": sum(1 for n in nodes if n["status"] in ("ok", "FAIL")),
        "tensors_compared": len(tensor_results),
        "oracle_batches": len(batches),
        "budget_bytes": budget_bytes,
        "nodes": nodes,
        "first_failing": None,
        "first_nonfinite_machine": _first(nodes, "nonfinite_machine"),
        "first_nonfinite_onnxruntime": _first(nodes, "nonfinite_onnxruntime"),
        "convs": [_conv_row(n) for n in nodes if n["node"] in convs],
    }
    tolerances = {t: (r["atol"], r["rtol"]) for t, r in tensor_results.items()}

    def alone(record: dict) -> dict:
        names = runtime_inputs(prepared, record["node"])
        values = {t: feeds[t] for t in names if t in feeds}
        values.update(oracle.run(feeds, [t for t in names if t not in values]))
        return run_alone(prepared, record["node"], values, options, factories, tolerances)

    first = next((n for n in nodes if n["status"] == "FAIL"), None)
    if first is not None:
        doc["first_failing"] = diagnose(first, alone(first))
    nan_node = doc["first_nonfinite_machine"]
    if nan_node is not None and (first is None or nan_node["node"] != first["node"]):
        nan_node["local"] = alone(next(n for n in nodes if n["node"] == nan_node["node"]))
    return doc


def _first(nodes: list[dict], key: str) -> dict | None:
    for record in nodes:
        if record.get(key):
            return {
                "node": record["node"],
                "op_type": record["op_type"],
                "tensors": [t["tensor"] for t in record["tensors"] if t[key]],
                "count": record[key],
                "inputs_finite": not record[f"input_{key}"],
                "kernel": record.get("kernel"),
                "lowering": record["lowering"],
            }
    return None


def _conv_row(record: dict) -> dict:
    keys = (
        "node",
        "op_type",
        "kernel",
        "registry_entry",
        "fallback_reason",
        "status",
        "max_abs_err",
        "max_rel_err",
        "cosine",
        "atol",
        "rtol",
        "min_atol",
        "min_rtol",
        "input_max_abs_err",
        "pe_dtype",
    )
    return {key: record.get(key) for key in keys}


def pe_operand_dtypes(graph: Graph, module) -> dict[str, str]:
    """Per node of `graph`, the operand dtypes of its PE matmuls as the BIR stores them
    ("bfloat16", or "bfloat16 x float32" when stationary and moving differ); PE transposes
    against the identity are data movement and left out."""
    from onnx2bir.codegen.driver import IDENTITY

    found: dict[str, set[str]] = {}
    if module is None:
        return {}
    names = {name for name, _ in graph.nodes()}
    function = module.functions[0]
    locations = function.memory_locations
    for ins in function.instructions():
        if ins.opcode is not Opcode.MATMULT or ins.srcs["moving"].loc == IDENTITY:
            continue
        node = node_of_origin(ins.origin.node, names)
        if node is None:
            continue
        stat = locations[ins.srcs["stationary"].loc].dtype
        mov = locations[ins.srcs["moving"].loc].dtype
        found.setdefault(node, set()).add(str(stat) if stat is mov else f"{stat} x {mov}")
    return {node: ", ".join(sorted(kinds)) for node, kinds in found.items()}


def _node_record(name, data, compared, fused, tensor_results, graph, convs, compilation) -> dict:
    tensors = [tensor_results[t] for t in compared]
    inputs = [tensor_results[t] for t in data["inputs"] if t in tensor_results]
    record = {
        "node": name,
        "op_type": data["op_type"],
        "outputs": [t for t in data["outputs"] if t],
        "lowering": lowering_of(compilation, name),
        "idiom": describe_blocks(compilation.passes.records).get(name),
        "status": ("FAIL" if any(not t["passed"] for t in tensors) else "ok")
        if tensors
        else ("fused" if fused else "not compared"),
        "tensors": tensors,
        "input_max_abs_err": max((t["max_abs_err"] for t in inputs), default=0.0),
        "input_max_rel_err": max((t["max_rel_err"] for t in inputs), default=0.0),
        "nonfinite_machine": sum(t["nonfinite_machine"] for t in tensors),
        "nonfinite_onnxruntime": sum(t["nonfinite_onnxruntime"] for t in tensors),
        "input_nonfinite_machine": sum(t["nonfinite_machine"] for t in inputs),
        "input_nonfinite_onnxruntime": sum(t["nonfinite_onnxruntime"] for t in inputs),
    }
    if tensors:
        worst = max(tensors, key=lambda t: (not t["passed"], t["max_abs_err"]))
        for key in ERROR_KEYS:
            record[key] = worst[key]
        record["passed"] = record["status"] == "ok"
    if name in convs:
        finding = convs[name]
        record["kernel"] = finding.get("kernel")
        record["registry_entry"] = finding.get("registry_entry")
        record["fallback_reason"] = finding.get("fallback_reason")
    return record
