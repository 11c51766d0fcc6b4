"""The node alone: own error vs error carried in (docs/validation.md#own-vs-carried).

In: a node of the graph before the passes, onnxruntime's values of its inputs (exposed from
the full model), the compile options. The node is rebuilt as a one-node ONNX model — constant
inputs stay initializers, so the pass selects the same kernel, and the node keeps its name —
compiled and simulated by onnx2bir, and compared with the emulating oracle of the one-node
model (onnxruntime rounding where the node's program rounds, runtime/oracle/emulating.py) on
the same inputs, at the tolerance the tensor had in the model. Out: the local comparison and
a verdict:

- "own error": alone, on exact inputs, the node is over tolerance (or makes NaN/inf from
  finite inputs): its lowering or kernel is wrong;
- "carried in": alone it is within tolerance; its inputs arrive with (sub-tolerance) error
  from earlier nodes, which it amplifies (`amplification` = its error / its inputs' error);
- "unknown": the node cannot be run alone (a subgraph attribute, an unsupported op).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
import onnx
from onnx import helper, numpy_helper

from onnx2bir.errors import MachineError, UserError
from onnx2bir.kernels import attention as attention_kernel
from onnx2bir.kernels import mlp as mlp_kernel
from onnx2bir.options import CompileOptions
from onnx2bir.runtime.oracle.compare import (
    ERROR_KEYS,
    compare_output,
    nonfinite_count,
    tensor_record,
)
from onnx2bir.runtime.oracle.emulating import run_emulating
from onnx2bir.validation.prepared import (
    ObserverFactory,
    Prepared,
    conv_findings,
    lowering_of,
    output_values,
    prepare,
    simulate,
    value_info,
    value_infos,
)


def diagnose(record: dict, local: dict) -> dict:
    """The first failing node's entry: its error in the model, alone, and the verdict."""
    entry = {
        key: record.get(key)
        for key in (
            "node",
            "op_type",
            "lowering",
            "kernel",
            "registry_entry",
            "fallback_reason",
            *ERROR_KEYS,
            "input_max_abs_err",
            "input_max_rel_err",
            "nonfinite_machine",
            "nonfinite_onnxruntime",
        )
    }
    entry["tensors"] = [t["tensor"] for t in record["tensors"] if not t["passed"]]
    entry["local"] = local
    input_err = record["input_max_abs_err"] or 0.0
    fused = _fused_kernel(record)
    if (
        fused
        and not local.get("error")
        and local["passed"]
        and not record.get("input_failed", False)
        and input_err <= (record.get("atol") or 0.0)
    ):
        # A raised kernel replaces a whole block; alone, the node is only its last op, so the
        # one-node replay says nothing about the kernel. Exact inputs, wrong output: own error.
        entry["verdict"] = "own error"
        entry["explanation"] = (
            f"the node is the output of the fused kernel {fused}, whose inputs arrive within "
            f"tolerance ({input_err:.3g} max abs) while its output is off by "
            f"{record['max_abs_err']:.3g}: the error arises inside the kernel (a one-node "
            "replay cannot rebuild a fused block)"
        )
    elif local.get("error"):
        entry["verdict"] = "unknown"
        entry["explanation"] = f"the node could not be run alone: {local['error']}"
    elif local["nonfinite_machine"] and not record["input_nonfinite_machine"]:
        entry["verdict"] = "own error"
        entry["explanation"] = (
            f"alone, on onnxruntime's (finite) values of its inputs, the node produces "
            f"{local['nonfinite_machine']} NaN/inf values: its lowering or kernel is wrong"
        )
    elif not local["passed"]:
        entry["verdict"] = "own error"
        entry["explanation"] = (
            f"alone, on onnxruntime's values of its inputs, the node is off by "
            f"{local['max_abs_err']:.3g} (max abs): its lowering or kernel is wrong"
        )
    else:
        entry["verdict"] = "carried in"
        entry["explanation"] = (
            f"alone, on exact inputs, the node is within tolerance ({local['max_abs_err']:.3g} "
            f"max abs); its inputs arrive with up to {input_err:.3g} error from earlier nodes, "
            f"which it amplifies to {record['max_abs_err']:.3g}"
        )
    if input_err > 0 and math.isfinite(input_err):
        entry["amplification"] = record["max_abs_err"] / input_err
    return entry


FUSED_KERNELS = (
    *attention_kernel.TARGETS,
    mlp_kernel.TARGET,
)


def _fused_kernel(record: dict) -> str | None:
    """The raised kernel (spanning several ONNX nodes) the node's value comes from, if any."""
    lowering = record.get("lowering") or ""
    name = lowering.removeprefix("kernel.")
    return name if lowering.startswith("kernel.") and name in FUSED_KERNELS else None


def one_node_model(prepared: Prepared, node: str, runtime_inputs: list[str]) -> onnx.ModelProto:
    """The node alone: constant inputs (weights included) as initializers, the rest as graph
    inputs."""
    folded, graph = prepared.folded, prepared.pristine
    index = list(graph.nx.nodes).index(node)
    proto = onnx.NodeProto()
    proto.CopyFrom(folded.graph.node[index])
    proto.name = node
    infos = value_infos(folded)
    outputs = [t for t in graph.node(node)["outputs"] if t]
    constants = dict.fromkeys(t for t in proto.input if t and graph.tensors[t].is_const)
    one = helper.make_graph(
        [proto],
        f"{node}.alone",
        [value_info(t, infos, graph) for t in runtime_inputs],
        [value_info(t, infos, graph) for t in outputs],
        [numpy_helper.from_array(np.asarray(graph.tensors[t].const), t) for t in constants],
    )
    model = helper.make_model(one, ir_version=max(folded.ir_version, 4))
    del model.opset_import[:]
    model.opset_import.extend(folded.opset_import)
    return model


def runtime_inputs(prepared: Prepared, node: str) -> list[str]:
    """The node's inputs that are not constants: fed from the model's run."""
    graph = prepared.pristine
    names: list[str] = []
    for tensor in graph.node(node)["inputs"]:
        if tensor and tensor not in names and not graph.tensors[tensor].is_const:
            names.append(tensor)
    return names


def run_alone(
    prepared: Prepared,
    node: str,
    values: dict[str, np.ndarray],
    options: CompileOptions,
    factories: Iterable[ObserverFactory],
    tolerances: dict[str, tuple[float, float]],
) -> dict:
    """Compile and simulate the node alone on `values` (by input name); compare with
    onnxruntime at `tolerances` (atol, rtol by output tensor, as in the model)."""
    graph = prepared.pristine
    proto = prepared.folded.graph.node[list(graph.nx.nodes).index(node)]
    if any(
        a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in proto.attribute
    ):
        return {"error": "the node has a subgraph attribute"}
    try:
        model = one_node_model(prepared, node, list(values))
        alone = prepare(model, options)
        if alone.compilation.module is None:
            return {"error": alone.compilation.codegen_error}
        machine = simulate(alone.compilation, values, factories=factories)
        got = output_values(alone.compilation, machine)
        expected = run_emulating(
            alone.folded,
            alone.pristine,
            alone.weights,
            alone.compilation.cast_plan,
            values,
            None,
            list(got),
        )
    except (UserError, MachineError, ValueError) as exc:
        return {"error": str(exc).splitlines()[0]}
    results = []
    for tensor, value in got.items():
        atol, rtol = tolerances.get(tensor, (0.0, 0.0))
        results.append(
            compare_output(tensor, value, expected[tensor], atol, rtol, "as in the model")
        )
    alone_convs = conv_findings(alone.compilation)
    return {
        "passed": all(r.passed for r in results),
        "max_abs_err": max(r.max_abs_err for r in results),
        "max_rel_err": max(r.max_rel_err for r in results),
        "mismatches": sum(r.mismatches for r in results),
        "kernel": alone_convs[node].get("kernel") if node in alone_convs else None,
        "lowering": lowering_of(alone.compilation, node),
        "nonfinite_machine": sum(nonfinite_count(r, "machine") for r in results),
        "tensors": [tensor_record(r) for r in results],
        "error": None,
    }
