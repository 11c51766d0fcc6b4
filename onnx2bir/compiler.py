"""The pipeline: import → pattern passes → BIR code generation.

`compile_model` takes a model (path or ModelProto) and options and returns the imported graph,
the pass manager (with its statistics), and the BIR module.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import onnx

from onnx2bir.bir.cast_plan import CastPlan
from onnx2bir.bir.ir import Module
from onnx2bir.bir.verify import check_module
from onnx2bir.codegen import GENERIC_LOWERINGS, BirCodeGen
from onnx2bir.codegen.cast_plan import kernel_hosts, plan_casts
from onnx2bir.codegen.casting import check_exclusions, resolve_exclusions
from onnx2bir.codegen.driver import kernel_name_of
from onnx2bir.codegen.narrowing import Narrowing, narrowings
from onnx2bir.codegen.planner import MemoryPlan, plan_memory
from onnx2bir.codegen.registry import lowering_key
from onnx2bir.codegen.views import drop_identity_views
from onnx2bir.codegen.weight_cast import store_in_cast_dtype
from onnx2bir.errors import CompileError, UserError
from onnx2bir.frontend.contracts import check_ops
from onnx2bir.frontend.importer import Imported, import_parts, read_model
from onnx2bir.gc_pause import no_cyclic_gc
from onnx2bir.graph import Graph
from onnx2bir.kernels import KERNELS
from onnx2bir.options import CompileOptions
from onnx2bir.patterns.attention.decompose import DecomposeAttention
from onnx2bir.patterns.attention.raising import LowerToCustomNativeKernel
from onnx2bir.patterns.batch_split import SplitBatch
from onnx2bir.patterns.conv.bridges import FoldConvLayoutBridges
from onnx2bir.patterns.conv.epilogue import FuseConvActivation
from onnx2bir.patterns.conv.selection import TransformConvOp
from onnx2bir.patterns.matmul_scale import FuseMatMulScale
from onnx2bir.patterns.mlp.raising import LowerToNKIKernelCC
from onnx2bir.patterns.passes import PassManager
from onnx2bir.patterns.quant.integer import RaiseIntegerMatmuls
from onnx2bir.patterns.quant.nbits import ExpandMatMulNBits
from onnx2bir.patterns.quant.qlinear_ops import ExpandQLinearOps
from onnx2bir.patterns.softmax_guard import FuseSoftmaxNanGuard
from onnx2bir.patterns.vendor_ops import check_vendor_ops


def kernel_table() -> dict:
    """Every kernel by name: the CustomCall targets' table (`onnx2bir.kernels.KERNELS`) and
    the conv kernels the conv registries' rows name with their tracers."""
    from onnx2bir.patterns.conv.selection import (
        EXPERIMENTAL_KERNEL_REGISTRY,
        FUNCTIONAL_KERNEL_REGISTRY,
    )

    rows = [*FUNCTIONAL_KERNEL_REGISTRY, *EXPERIMENTAL_KERNEL_REGISTRY]
    return {**KERNELS, **{row.name: row.trace for row in rows if row.trace is not None}}


def default_passes() -> list:
    """The pattern passes, in the reference pipeline's order, after the quantized models'
    own (patterns/quant): quantized ops become standard ops and integer matmuls first."""
    return [
        ExpandMatMulNBits(),
        ExpandQLinearOps(),
        RaiseIntegerMatmuls(),
        LowerToCustomNativeKernel(),
        DecomposeAttention(),
        LowerToNKIKernelCC(),
        SplitBatch(),
        TransformConvOp(),
        FoldConvLayoutBridges(),
        FuseConvActivation(),
        FuseMatMulScale(),
        FuseSoftmaxNanGuard(),
    ]


@dataclass
class Compilation:
    graph: Graph
    passes: PassManager
    module: Module | None  # None when code generation was not asked for or failed
    timings: dict[str, float] = field(default_factory=dict)
    codegen_error: str | None = None
    source_ops: Counter = field(default_factory=Counter)  # op types as imported, before passes
    options: CompileOptions | None = None  # what it was compiled with
    memory_plan: MemoryPlan | None = None  # None when the planner is off or codegen failed
    # Where the program rounds the model's values (docs/validation.md#the-emulating-oracle);
    # None when code generation failed.
    cast_plan: CastPlan | None = None
    # Every int64 tensor, narrowed to int32 on the device, and whether that is proven safe
    # (onnx2bir/codegen/narrowing.py, docs/neuroncore.md#integers).
    int64: list[Narrowing] = field(default_factory=list)


def unsupported_ops(graph: Graph) -> Counter:
    """Op types (with counts) that neither a kernel nor a generic lowering handles."""
    missing: Counter = Counter()
    for _, data in graph.nodes():
        op_type = data["op_type"]
        kernel_name = kernel_name_of(data)
        if kernel_name is not None:
            if kernel_name not in kernel_table():
                missing[f"{op_type}:{kernel_name}"] += 1
        elif lowering_key(op_type, data["domain"]) not in GENERIC_LOWERINGS:
            missing[lowering_key(op_type, data["domain"])] += 1
    return missing


def check_supported(graph: Graph) -> None:
    missing = unsupported_ops(graph)
    if missing:
        listing = ", ".join(f"{op} x{count}" for op, count in sorted(missing.items()))
        hints = "".join(f"; {hint}" for hint in _runtime_if_hints(graph))
        raise CompileError(f"unsupported ops in {graph.name}: {listing}{hints}")


def _runtime_if_hints(graph: Graph) -> list[str]:
    """For each If left in the graph: its condition is computed at run time, and from which
    graph inputs, which `--input-value` can fix so the If folds to one branch."""
    hints = []
    for name, data in graph.nodes():
        if data["op_type"] != "If" or data["domain"] not in ("", "ai.onnx"):
            continue
        sources, seen, stack = set(), set(), [data["inputs"][0]]
        while stack:
            tensor = stack.pop()
            if tensor in seen:
                continue
            seen.add(tensor)
            if tensor in graph.inputs:
                sources.add(tensor)
            elif (producer := graph.producer(tensor)) is not None:
                stack.extend(t for t in graph.node(producer)["inputs"] if t)
        fix = " ".join(f"--input-value {s}=V" for s in sorted(sources))
        hints.append(
            f"If {name!r} picks its branch at run time (its condition comes from "
            + (f"input {', '.join(map(repr, sorted(sources)))}; {fix} fixes it, and the If "
               "folds to the branch taken)" if sources else "values computed at run time)")
        )  # fmt: skip
    return hints


def generate_bir(graph: Graph, options: CompileOptions) -> tuple[Module, MemoryPlan | None]:
    """BIR for `graph`: with the memory planner on, a first pass with every tensor in DRAM
    feeds `plan_memory`, and a second pass generates code with the tensors it placed in SBUF
    (docs/memory_planner.md)."""
    kernels = kernel_table()
    if not options.memory_plan:
        module = BirCodeGen(graph, options, GENERIC_LOWERINGS, kernels).run()
        store_in_cast_dtype(module, module.functions[0], options)
        return module, None
    derived: dict = {}  # constants computed at compile time, made once for both passes
    first = BirCodeGen(
        graph, options, GENERIC_LOWERINGS, kernels, planning_run=True, derived_constants=derived
    )
    planned, needs = first.generate()
    plan = plan_memory(planned.functions[0], graph, needs)
    second = BirCodeGen(
        graph, options, GENERIC_LOWERINGS, kernels, memory_plan=plan, derived_constants=derived
    )
    module, used = second.generate()
    # The plan placed the homes under the arenas the first pass measured: the second pass
    # must allocate exactly those.
    for item, need in used.sbuf.items():
        if need != needs.sbuf.get(item):
            raise CompileError(
                f"node {used.nodes[item]!r}: the memory plan's second pass allocated "
                f"{need} SBUF bytes per partition where the first allocated "
                f"{needs.sbuf.get(item)} (docs/memory_planner.md#two-passes)"
            )
    plan.psum_high_water = max(used.psum.values(), default=0)
    store_in_cast_dtype(module, module.functions[0], options)
    return module, plan


def record_provenance(
    module: Module, source: Graph, options: CompileOptions, plan: CastPlan
) -> None:
    """Write into the module's metadata what it was compiled from and with, so a saved
    program can be checked against its model later (`onnx2bir run --model`): the compile
    options, the input shapes, the inputs fixed to values, and the cast plan."""
    module.metadata["compile_options"] = options.to_json()
    module.metadata["input_shapes"] = {
        name: list(source.tensors[name].shape) for name in source.inputs
    }
    if source.pinned_inputs:
        module.metadata["input_values"] = {
            name: value.tolist() for name, value in source.pinned_inputs.items()
        }
    module.metadata["cast_plan"] = plan.to_json()


def import_graph(
    source: str | Path | onnx.ModelProto, input_shapes=None, dims=None, input_values=None
) -> Graph:
    return import_or_refuse(source, input_shapes, dims, input_values).graph


def import_or_refuse(
    source: str | Path | onnx.ModelProto, input_shapes=None, dims=None, input_values=None
) -> Imported:
    """`importer.import_parts`, except that a model with ops no lowering handles, in domains
    whose ops never fold (ai.onnx.ml, com.microsoft, ...), is refused as not compiling, with
    every such op and its count, when the import stops at a shape it cannot infer past them:
    the model is fine, onnx2bir lacks the ops."""
    try:
        return import_parts(source, input_shapes, dims, input_values)
    except UserError as exc:
        model = read_model(source)
        check_ops(model)  # an op its domain does not define: a broken model, said so
        declared = {entry.domain for entry in model.opset_import}
        missing = _foreign_unsupported(model.graph, declared)
        if not missing:
            raise
        listing = ", ".join(f"{op} x{count}" for op, count in sorted(missing.items()))
        name = Path(source).name.removesuffix(".onnx") if isinstance(source, (str, Path)) else (
            source.graph.name or "model"
        )  # fmt: skip
        raise CompileError(
            f"unsupported ops in {name}: {listing} (no lowering; the import stopped at them: {exc})"
        ) from exc


def _foreign_unsupported(graph: onnx.GraphProto, declared: set[str]) -> Counter:
    """Ops outside the ai.onnx domain, at any depth, that no generic lowering handles, in
    domains the model imports (a node of a domain it does not import is a broken model)."""
    missing: Counter = Counter()
    for node in graph.node:
        key = lowering_key(node.op_type, node.domain)
        foreign = node.domain not in ("", "ai.onnx") and node.domain in declared
        if foreign and key not in GENERIC_LOWERINGS:
            missing[key] += 1
        for attr in node.attribute:
            for body in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else attr.graphs:
                missing.update(_foreign_unsupported(body, declared))
    return missing


def compile_graph(
    graph: Graph,
    options: CompileOptions,
    passes: list | None = None,
    timings: dict[str, float] | None = None,
    keep_going: bool = False,
) -> Compilation:
    """Run the passes, then generate BIR and verify it (`bir.verify`).

    With `keep_going`, a failure to generate code is recorded in `codegen_error` instead of
    raised, so a report can still show what the passes found.
    """
    timings = {} if timings is None else timings
    source_ops = graph.op_counts()
    vendor_error = None  # refused before the passes, which must not absorb a vendor op
    try:
        check_vendor_ops(graph, kernel_table())
    except UserError as exc:
        if not keep_going:
            raise
        vendor_error = str(exc)
    start = time.perf_counter()
    source = graph.snapshot()  # the model's names, for the cast plan
    check_exclusions(source, options.auto_cast_exclude)
    manager = PassManager(default_passes() if passes is None else passes)
    manager.run(graph, options)
    drop_identity_views(graph)
    hosts, _ = kernel_hosts(manager.records, graph)
    graph.keep_fp32 = resolve_exclusions(source, graph, hosts, options.auto_cast_exclude)
    timings["passes"] = time.perf_counter() - start
    compilation = Compilation(graph, manager, None, timings, source_ops=source_ops, options=options)
    compilation.int64 = narrowings(graph)
    start = time.perf_counter()
    try:
        if vendor_error:
            raise UserError(vendor_error)
        check_supported(graph)
        module, compilation.memory_plan = generate_bir(graph, options)
        homes = compilation.memory_plan.homes if compilation.memory_plan else {}
        compilation.cast_plan = plan_casts(source, graph, module, manager.records, homes)
        record_provenance(module, source, options, compilation.cast_plan)
        timings["codegen"] = time.perf_counter() - start
        start = time.perf_counter()
        check_module(module, f"the BIR generated for {graph.name}")
        timings["verify"] = time.perf_counter() - start
        compilation.module = module
    except UserError as exc:
        if not keep_going:
            # The model was read and checked: failing here means it does not compile (exit 1).
            if isinstance(exc, CompileError):
                raise
            raise CompileError(str(exc)) from exc
        compilation.codegen_error = str(exc)
    timings.setdefault("codegen", time.perf_counter() - start)
    return compilation


def compile_model(
    source: str | Path | onnx.ModelProto,
    options: CompileOptions | None = None,
    input_shapes=None,
    dims=None,
    keep_going: bool = False,
    input_values=None,
) -> Compilation:
    """Import `source` (a path or a ModelProto), run the passes and generate BIR.

    `input_shapes` ({input: shape}) and `dims` ({symbol: size}) fix symbolic dimensions;
    `input_values` ({input: values}) makes inputs constants (`--input-value`).
    Raises `UserError` when the model cannot be read or its shapes are not fixed, and
    `CompileError` when it reads but does not compile (with `keep_going`, that failure is
    recorded in `codegen_error` instead). The public entry point is `onnx2bir.compile`.
    """
    timings: dict[str, float] = {}
    with no_cyclic_gc():
        start = time.perf_counter()
        graph = import_graph(source, input_shapes, dims, input_values)
        timings["import"] = time.perf_counter() - start
        return compile_graph(
            graph, options or CompileOptions(), timings=timings, keep_going=keep_going
        )
