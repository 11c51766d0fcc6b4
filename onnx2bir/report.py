"""What the compiler found and decided for a model, as JSON and as text.

In: a `Compilation`. Out: `{"model", "ops": {op_type: count}, "instructions": {...},
"statistics": [...], "convs": [...], "attention": [...], "mlp": [...]}`. The per-block lists
are filled from the findings of the passes that recognise those blocks; keys follow the
public contract in DESIGN.md and are never renamed.
"""

from __future__ import annotations

from collections import Counter

from onnx2bir.compiler import Compilation


def build_report(model: str, compilation: Compilation) -> dict:
    fn = compilation.module.functions[0]
    engines: Counter = Counter(inst.engine.value for inst in fn.instructions())
    findings = {record.name: record.result.findings for record in compilation.passes.records}
    return {
        "model": model,
        "ops": dict(sorted(compilation.graph.op_counts().items())),
        "instructions": {"total": sum(engines.values()), "per_engine": dict(sorted(
            engines.items()))},
        "statistics": [stat.to_json() for stat in compilation.passes.statistics],
        "convs": findings.get("TransformConvOp", []),
        "attention": findings.get("LowerToCustomNativeKernel", []),
        "mlp": findings.get("LowerToNKIKernelCC", []),
    }


def format_report(doc: dict) -> str:
    lines = [f"model {doc['model']}", "", "ops:"]
    width = max((len(op) for op in doc["ops"]), default=0)
    for op, count in doc["ops"].items():
        lines.append(f"  {op:<{width}}  {count}")
    inst = doc["instructions"]
    per_engine = ", ".join(f"{engine} {count}" for engine, count in inst["per_engine"].items())
    lines += ["", f"BIR instructions: {inst['total']} ({per_engine})"]
    if doc["statistics"]:
        lines += ["", "statistics:"]
        lines += [f"  {s['value']!s:>8}  {s['description']}" for s in doc["statistics"]]
    return "\n".join(lines)
