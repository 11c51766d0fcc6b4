"""A model as validate needs it, and a simulation that keeps the machine.

In: a model (path or ModelProto) and compile options. Out: `Prepared` — the folded ONNX
skeleton (constants and shape math computed, every tensor typed; the large weights the importer
holds aside are typed graph inputs, their values in `weights`), the graph built from it before
the passes (node names and order match the skeleton's nodes, so a node can be found in
either), and the compilation — plus `simulate`, which runs the whole program and returns the
machine, whose DRAM then holds every tensor the program materialises, named after it.

`prepare` imports with `importer.import_parts`, which keeps the skeleton and the weights that
`import_model` drops.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from onnx2bir.compiler import Compilation, compile_graph, import_or_refuse
from onnx2bir.frontend.importer import build_graph
from onnx2bir.gc_pause import no_cyclic_gc
from onnx2bir.graph import Graph
from onnx2bir.options import CompileOptions
from onnx2bir.runtime.machine import interpreter
from onnx2bir.runtime.machine.machine import Machine
from onnx2bir.runtime.machine.progress import chain

ObserverFactory = Callable[[Machine], Callable]


@dataclass
class Prepared:
    """A model as validate needs it: the folded ONNX skeleton and the weights held aside, the
    graph before the passes (node names and order match the skeleton's nodes), and the
    compilation."""

    folded: onnx.ModelProto
    weights: dict[str, np.ndarray]
    pristine: Graph
    compilation: Compilation


def prepare(
    source: str | Path | onnx.ModelProto,
    options: CompileOptions,
    input_shapes=None,
    dims=None,
    keep_going: bool = False,
    input_values=None,
) -> Prepared:
    """Import, fold and compile, as `compile_model` does, keeping the folded skeleton."""
    with no_cyclic_gc():
        start = time.perf_counter()
        imported = import_or_refuse(source, input_shapes, dims, input_values)
        timings = {"import": time.perf_counter() - start}
        folded, weights = imported.folded, imported.weights
        # The passes rewrite the graph they get: keep a second, untouched build of the skeleton.
        pristine = build_graph(folded, imported.graph.name, weights)
        compilation = compile_graph(imported.graph, options, timings=timings, keep_going=keep_going)
        return Prepared(folded, weights, pristine, compilation)


def simulate(
    compilation: Compilation,
    feeds: dict[str, np.ndarray],
    observer: Callable | None = None,
    factories: Iterable[ObserverFactory] = (),
    before: dict | None = None,
) -> Machine:
    """Run the whole program; return the machine (its DRAM holds every tensor).

    `factories` make observers that need the machine (test hooks that perturb a result).
    """
    module = compilation.module
    function = module.functions[0]
    machine = interpreter.load_machine(module, function, feeds)
    observers = [factory(machine) for factory in factories]
    interpreter.execute(machine, function.entry, chain(observer, *observers), before)
    return machine


def output_values(compilation: Compilation, machine: Machine) -> dict[str, np.ndarray]:
    """Graph outputs by tensor name (an output location may be a copy named `t:output`)."""
    function = compilation.module.functions[0]
    return {
        tensor: machine.read(location)
        for tensor, location in zip(compilation.graph.outputs, function.outputs, strict=True)
    }


def conv_findings(compilation: Compilation) -> dict[str, dict]:
    """TransformConvOp's finding for each conv, by node name (kernel or fallback_reason)."""
    result = compilation.passes.result_of("TransformConvOp")
    return {f["node"]: f for f in (result.findings if result else [])}


def lowering_of(compilation: Compilation, node: str) -> str:
    """What code generation ran for a node of the graph before the passes."""
    from onnx2bir.codegen.driver import kernel_name_of

    graph = compilation.graph
    if node not in graph.nx:
        host = _block_hosts(compilation).get(node)
        return f"fused into {host}" if host else "replaced by a pass"
    data = graph.node(node)
    kernel = kernel_name_of(data)
    return f"kernel.{kernel}" if kernel else f"generic.{data['op_type']}"


def fused_into(compilation: Compilation, node: str) -> str | None:
    """The node a pass fused `node` into, which now writes its output (a conv's Relu, run on
    the conv's eviction); None for a node that is still there or was replaced otherwise."""
    if node in compilation.graph.nx:
        return None
    return _block_hosts(compilation).get(node)


def _block_hosts(compilation: Compilation) -> dict[str, str]:
    """Node → the kernel node a pass raised its block to (findings that list `nodes`)."""
    from onnx2bir.codegen.driver import kernel_name_of

    graph = compilation.graph
    hosts = {}
    for record in compilation.passes.records:
        for finding in record.result.findings:
            members = finding.get("nodes") or []
            if finding.get("host") in graph.nx:  # nodes fused into one that stays
                kept = [finding["host"]]
            else:
                kept = [n for n in members if n in graph.nx and kernel_name_of(graph.node(n))]
            if kept:
                hosts.update(dict.fromkeys((n for n in members if n not in graph.nx), kept[0]))
    return hosts


def value_infos(model: onnx.ModelProto) -> dict[str, onnx.ValueInfoProto]:
    graph = model.graph
    return {vi.name: vi for vi in [*graph.input, *graph.value_info, *graph.output]}


def value_info(
    name: str, infos: dict[str, onnx.ValueInfoProto], graph: Graph
) -> onnx.ValueInfoProto:
    """The inferred type of `name`, or one made from the graph's tensor table."""
    if name in infos:
        return infos[name]
    info = graph.tensors[name]
    elem = helper.np_dtype_to_tensor_dtype(info.dtype.numpy)
    return helper.make_tensor_value_info(name, elem, list(info.shape))
