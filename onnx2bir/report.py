"""What the compiler found and decided for a model, as JSON and as text.

In: a `Compilation` (code generation may have failed; the report says so). Out, following
DESIGN.md's contract:

    {"model", "compiles", "codegen_error", "ops": {op_type: count},
     "ops_after_passes": {op_type: count},
     "convs": [{"node", "kernel" | null, "fallback_reason" | null, ...attrs, "walk"}],
     "statistics": {"total_conv_ops", "matched_conv_ops", "conv_kernel_match_percentage",
                    "per_kernel": {name: count}},
     "attention": [{"nodes", "variant", "target" | null, "reason" | null, ...}],
     "mlp": [{"nodes", "activation", "target", ...}],
     "attention_refused", "mlp_refused": candidates whose check refused them, with the reason,
     "decomposed_attention": DecomposeAttention's findings,
     "pass_statistics": [{"pass", "name", "description", "value"}],
     "instructions": {"total", "per_engine"} | null,
     "dependencies": {"Flow", "Anti", "Output", "Ordered", "loop_carried"} | null (edges of
        each kind between streams; loop_carried counts those carried by a loop),
     "cost": {"estimated_seconds", "busy_seconds", "dma_bytes", "model"} | null}

Keys are a public interface: add freely, never rename or drop.
"""

from __future__ import annotations

from collections import Counter

from onnx2bir.bir.enums import DepKind
from onnx2bir.compiler import Compilation
from onnx2bir.runtime import cost as cost_model

_CONV_STAT_KEYS = ("total_conv_ops", "matched_conv_ops", "conv_kernel_match_percentage")


def dependency_counts(module) -> dict:
    """Edges of the first function by kind, and how many of them are loop-carried."""
    counts = dict.fromkeys([kind.value for kind in DepKind], 0)
    carried = 0
    for inst in module.functions[0].instructions():
        for dep in inst.deps:
            counts[dep.kind.value] += 1
            carried += dep.carried_by is not None
    return {**counts, "loop_carried": carried}


def build_report(model: str, compilation: Compilation) -> dict:
    findings = {record.name: record.result.findings for record in compilation.passes.records}
    attention = findings.get("LowerToCustomNativeKernel", [])
    mlp = findings.get("LowerToNKIKernelCC", [])
    conv_stats = compilation.passes.result_of("TransformConvOp")
    statistics: dict = {"per_kernel": {}}
    for stat in conv_stats.statistics if conv_stats else []:
        if stat.name in _CONV_STAT_KEYS:
            statistics[stat.name] = (
                float(stat.value) if stat.name == "conv_kernel_match_percentage" else stat.value
            )
        else:
            statistics["per_kernel"][stat.name.removeprefix("kernel_")] = stat.value
    instructions = cost = dependencies = None
    if compilation.module is not None:
        engines = Counter(i.engine.value for i in compilation.module.functions[0].instructions())
        instructions = {"total": sum(engines.values()), "per_engine": dict(sorted(engines.items()))}
        dependencies = dependency_counts(compilation.module)
        estimate = cost_model.estimate(compilation.module)
        cost = {
            "estimated_seconds": estimate.total_seconds,
            "busy_seconds": {e.value: t for e, t in sorted(estimate.busy_seconds.items())},
            "dma_bytes": estimate.dma_bytes,
            "model": "runtime/cost.py (NeuronCore-v2 clocks and instruction costs)",
        }
    return {
        "model": model,
        "compiles": compilation.module is not None,
        "codegen_error": compilation.codegen_error,
        "ops": dict(sorted(compilation.source_ops.items())),
        "ops_after_passes": dict(sorted(compilation.graph.op_counts().items())),
        "convs": findings.get("TransformConvOp", []),
        "statistics": statistics,
        "attention": [a for a in attention if a.get("is_attention", True)],
        "mlp": [m for m in mlp if m.get("activation")],
        # Softmaxes and activations a pattern reached but whose check refused the block.
        "attention_refused": [a for a in attention if not a.get("is_attention", True)],
        "mlp_refused": [m for m in mlp if not m.get("activation")],
        "decomposed_attention": findings.get("DecomposeAttention", []),
        "pass_statistics": [stat.to_json() for stat in compilation.passes.statistics],
        "instructions": instructions,
        "dependencies": dependencies,
        "cost": cost,
    }


def _conv_geometry(conv: dict) -> str:
    kernel = "x".join(str(d) for d in conv["kernel_shape"][2:])
    stride = "x".join(str(s) for s in conv["stride"])
    return (
        f"{conv['input_shape'][1]}->{conv['result_shape'][1]} k{kernel} s{stride} "
        f"g{conv['feature_group_count']}"
    )


def format_report(doc: dict) -> str:
    lines = [
        f"model {doc['model']}: "
        + ("compiles" if doc["compiles"] else f"does NOT compile: {doc['codegen_error']}")
    ]
    stats = doc["statistics"]
    if stats.get("total_conv_ops"):
        lines += [
            "",
            f"convolutions: {stats['matched_conv_ops']} of {stats['total_conv_ops']} "
            f"matched to kernels ({stats['conv_kernel_match_percentage']:.2f}%)",
        ]
        for name, count in stats["per_kernel"].items():
            if count:
                lines.append(f"  {count:>4}  {name}")
    if doc["convs"]:
        width = max(len(conv["node"]) for conv in doc["convs"])
        lines += ["", f"  {'node':<{width}}  {'geometry':<22} kernel / why it fell back"]
        for conv in doc["convs"]:
            outcome = conv["kernel"] or f"GENERIC - {_first_reasons(conv)}"
            lines.append(f"  {conv['node']:<{width}}  {_conv_geometry(conv):<22} {outcome}")
    blocks = doc["attention"]
    if blocks:
        raised = sum(1 for a in blocks if a["target"])
        lines += ["", f"attention: {len(blocks)} block(s) found, {raised} raised"]
        for a in blocks:
            head = a["nodes"][0] if a["nodes"] else "?"
            outcome = a["target"] or f"not raised: {a['reason']}"
            lines.append(f"  {head}: {a['variant'] or '-'}")
            lines.append(f"      -> {outcome}")
    if doc["mlp"]:
        raised = sum(1 for m in doc["mlp"] if m["target"])
        lines += ["", f"MLP: {raised} block(s) raised to AwsNeuronMLPNKI"]
        for m in doc["mlp"]:
            outcome = m["target"] or f"not raised: {m['reason']}"
            lines.append(f"  {m['nodes'][0]}: {m['activation'] or '-'} -> {outcome}")
    lines += ["", "ops:"]
    width = max((len(op) for op in doc["ops"]), default=0)
    lines += [f"  {op:<{width}}  {count}" for op, count in doc["ops"].items()]
    if doc["instructions"]:
        inst = doc["instructions"]
        per_engine = ", ".join(f"{e} {n}" for e, n in inst["per_engine"].items())
        lines += ["", f"BIR instructions: {inst['total']} ({per_engine})"]
    if doc.get("dependencies"):
        deps = doc["dependencies"]
        kinds = ", ".join(f"{k} {n}" for k, n in deps.items() if k != "loop_carried")
        lines.append(
            f"dependency edges between streams: {kinds}; {deps['loop_carried']} loop-carried"
        )
    if doc.get("cost"):
        cost = doc["cost"]
        busy = ", ".join(f"{e} {t * 1e6:.0f} us" for e, t in cost["busy_seconds"].items() if t)
        lines.append(
            f"estimated device time: {cost['estimated_seconds'] * 1e6:.0f} us "
            f"(busy: {busy}; DMA bytes {cost['dma_bytes']})"
        )
    return "\n".join(lines)


def _first_reasons(conv: dict, count: int = 3) -> str:
    """The refusals of the first registry entries, shortened for the table."""
    walk = conv["walk"]
    text = "; ".join(f"{step['entry']}: {step['refused']}" for step in walk[:count])
    return text + (f"; … ({len(walk) - count} more, see --explain)" if len(walk) > count else "")


def explain_conv(doc: dict, node: str) -> str:
    """The whole registry walk for one conv."""
    for conv in doc["convs"]:
        if conv["node"] == node:
            lines = [
                f"{conv['op_type']} {node}: {_conv_geometry(conv)}",
                f"  input {conv['input_shape']} kernel {conv['kernel_shape']} "
                f"result {conv['result_shape']}",
                f"  stride {conv['stride']} padding {conv['padding']} rhs_dilation "
                f"{conv['rhs_dilation']} lhs_dilation {conv['lhs_dilation']} "
                f"dtype {conv['dtype']}",
            ]
            for index, step in enumerate(conv["walk"], 1):
                lines.append(f"  {index:>2}. {step['entry']:<22} refused: {step['refused']}")
            if conv["kernel"]:
                lines.append(
                    f"  {len(conv['walk']) + 1:>2}. {conv['registry_entry']:<22} "
                    f"MATCHED -> {conv['kernel']}"
                )
            else:
                lines.append("  -> no kernel: the generic conv lowering runs it")
            return "\n".join(lines)
    names = ", ".join(conv["node"] for conv in doc["convs"]) or "none"
    raise KeyError(f"no convolution named {node!r}; the model's convolutions: {names}")
