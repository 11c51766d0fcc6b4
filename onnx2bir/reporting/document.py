"""What the compiler found and decided for a model, as JSON and as text.

In: a `Compilation` (code generation may have failed; the report says so). Out, following
DESIGN.md's contract:

    {"model", "compiles", "codegen_error", "ops": {op_type: count},
     "ops_after_passes": {op_type: count},
     "convs": [{"node", "kernel" | null, "fallback_reason" | null, ...attrs, "walk",
                "model_stride", "closest_refusals"}],
     "statistics": {"total_conv_ops", "matched_conv_ops", "conv_kernel_match_percentage",
                    "per_kernel": {name: count}},
     "attention": [{"nodes", "variant", "target" | null, "reason" | null, "status", "source",
                    "packaging": {op: count}, "sb_bytes", "sb_shape" (raised), ...}],
     "mlp": [{"nodes", "activation", "target", ...}],
     "attention_refused", "mlp_refused": candidates whose check refused them, with the reason,
     "decomposed_attention": DecomposeAttention's findings (an onnx.Attention it could not
        decompose adds "expanded": whether its ONNX function body replaced it, "raise_reason",
        "note", and "new_nodes", "body_ops" or "expansion_reason"),
     "pass_statistics": [{"pass", "name", "description", "value"}],
     "instructions": {"total", "per_engine", "dynamic_instances", "dynamic_per_engine",
                      "dynamic_exact"} | null,
     "dependencies": {"Flow", "Anti", "Output", "Ordered", "loop_carried"} | null (edges of
        each kind between streams; loop_carried counts those carried by a loop),
     "loops": {"static", "parallel", "sequential", "multi_buffered", "runtime"} | null (loops
        of more than one trip; multi_buffered counts those whose iterations rotate buffer
        copies, docs/buffers.md#reporting),
     "cost": {"estimated_seconds", "busy_seconds", "dma_bytes", "model"} | null,
     "autocast": {"auto_cast", "auto_cast_type", "text", "native_kernel_cast_type", "excluded",
                  "kept_fp32",
                  "matmul_operand_dtypes": {"<stationary> x <moving>": count} | null},
     "casts": [{"node", "input", "dtype", "kind", "exact", "reason"?}] (the cast plan: node
        reads input rounded to dtype; docs/validation.md#the-emulating-oracle),
     "cast_plan": {"casts", "unemulated", "probes", "boundaries", "online_softmax",
                   "expanded_attention"}
        (online_softmax: [{"tensor", "node", "key_tile", "dtype", "head_dim", "seq_k"}], the
        raised attention kernels the oracle computes key tile by key tile,
        docs/validation.md#online-softmax; expanded_attention: [{"tensor", "node", "dtype",
        "seq_k"}], decomposed Attention nodes it computes through their ONNX function body,
        docs/validation.md#expanded-attention),
     "memory": the memory planner's decisions (onnx2bir/reporting/memory.py) | null,
     "int64": [{"tensor", "kind", "proven", "range" | null, "reason", "root" | null}] (every
        int64 tensor, narrowed to int32 on the device; onnx2bir/codegen/narrowing.py),
     "quantized": [{"node", "op_type", "form", "path": "integer" | "float", "reason" | null,
        "bound", "weight", "weight_dtype", "weight_bytes"}] (every quantized conv and matmul:
        on the exact integer path, or left on the float path and why; docs/quantization.md),
     "quantized_summary": {"integer", "float", "integer_weight_bytes", "dma_bytes_weights"}
        | null (null for a model with no quantized conv or matmul),
     "batch_split": {"images", "tiers": [{"group", "nodes", "first", "last",
        "lockstep_segments"?}]} | null (the per-sample front run a group of images at a time,
        tier by tier, the last tier's groups in lockstep when it has the key;
        docs/memory_planner.md#batch-split),
     "notes": [{"flag", "message"}] (added by onnx2bir.report(): flags that changed nothing)}

`model_stride` is the stride as the model wrote it: for a ConvTranspose the canonical (backward)
form keeps the stride as `rhs_dilation` and a unit `stride` (docs/conv_backward.md).
`closest_refusals` is the walk ranked by relevance (`rank_refusals`).

Keys are a public interface: add freely, never rename or drop.
"""

from __future__ import annotations

from collections import Counter

from onnx2bir.bir.enums import DepKind, Opcode
from onnx2bir.bir.ir import DoWhile, DynamicLoop, Loop
from onnx2bir.codegen.instances import estimate_instances
from onnx2bir.codegen.tiling import BUFFERED_LOOPS
from onnx2bir.compiler import Compilation
from onnx2bir.options import CompileOptions
from onnx2bir.reporting.cost import cost_json, cost_text
from onnx2bir.reporting.memory import memory_json, memory_text
from onnx2bir.runtime.timing import cost as cost_model

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


def loop_counts(module) -> dict:
    """Static loops of the first function with more than one trip (scope regions are one-trip
    loops and not counted): how many are parallel, sequential and multi-buffered; and how
    many runtime loops (DynamicFor, DoWhile) there are."""
    buffered = module.metadata.get(BUFFERED_LOOPS, {})
    counts = dict.fromkeys(("static", "parallel", "sequential", "multi_buffered", "runtime"), 0)

    def walk(block) -> None:
        for item in block.items:
            if not isinstance(item, Loop):
                continue
            if isinstance(item, DynamicLoop | DoWhile):
                counts["runtime"] += 1
            elif item.trip_count > 1:
                counts["static"] += 1
                counts["parallel" if item.parallel else "sequential"] += 1
                counts["multi_buffered"] += item.axis in buffered
            walk(item.body)

    walk(module.functions[0].entry)
    return counts


def build_report(model: str, compilation: Compilation) -> dict:
    findings = {
        record.name: [_as_json(f) for f in record.result.findings]
        for record in compilation.passes.records
    }
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
    instructions = cost = dependencies = loops = None
    if compilation.module is not None:
        dependencies = dependency_counts(compilation.module)
        loops = loop_counts(compilation.module)
        engines = Counter(i.engine.value for i in compilation.module.functions[0].instructions())
        instances = estimate_instances(compilation.module.functions[0])
        instructions = {
            "total": sum(engines.values()),
            "per_engine": dict(sorted(engines.items())),
            # estimate_instances: loop trips expanded; a lower bound when not exact.
            "dynamic_instances": instances.dynamic,
            "dynamic_per_engine": instances.dynamic_per_engine,
            "dynamic_exact": instances.exact,
        }
        estimate = cost_model.estimate(compilation.module)
        cost = cost_json(estimate)
        # A loop whose trip count is known only at run time is costed as one trip.
        cost["lower_bound"] = not instances.exact
    convs = [
        {**conv, "model_stride": model_stride(conv), "closest_refusals": rank_refusals(conv)}
        for conv in findings.get("TransformConvOp", [])
    ]
    return {
        "model": model,
        "compiles": compilation.module is not None,
        "codegen_error": compilation.codegen_error,
        "ops": dict(sorted(compilation.source_ops.items())),
        "ops_after_passes": dict(sorted(compilation.graph.op_counts().items())),
        "convs": convs,
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
        "loops": loops,
        "cost": cost,
        "autocast": autocast_summary(compilation),
        "casts": cast_plan_json(compilation)["casts"],
        "cast_plan": cast_plan_json(compilation),
        "memory": memory_json(compilation),
        "int64": [n.to_json() for n in compilation.int64],
        "quantized": findings.get("RaiseIntegerMatmuls", []),
        "quantized_summary": _quantized_summary(findings.get("RaiseIntegerMatmuls", []), cost),
        "batch_split": _batch_split(findings.get("SplitBatch", [])),
    }


def _batch_split(split: list[dict]) -> dict | None:
    """The tiers of the batch split, from SplitBatch's findings (one per node, in order)."""
    if not split:
        return None
    tiers: list[dict] = []
    for finding in split:
        if not tiers or tiers[-1]["group"] != finding["group"]:
            tiers.append({"group": finding["group"], "nodes": 0, "first": finding["node"]})
        tiers[-1]["nodes"] += 1
        tiers[-1]["last"] = finding["node"]
        if "lockstep_segment" in finding:
            tiers[-1]["lockstep_segments"] = finding["lockstep_segment"] + 1
    return {"images": split[0]["images"], "tiers": tiers}


def batch_split_text(split: dict | None) -> list[str]:
    if not split:
        return []
    parts = [
        f"{t['nodes']} nodes ({t['first']} .. {t['last']}) "
        + ("an image at a time" if t["group"] == 1 else f"{t['group']} images at a time")
        + (
            f", the groups in lockstep over {t['lockstep_segments']} segments"
            if "lockstep_segments" in t
            else ""
        )
        for t in split["tiers"]
    ]
    return [f"batch split ({split['images']} images): " + "; ".join(parts)]


def _quantized_summary(quantized: list[dict], cost: dict | None) -> dict | None:
    """How many quantized convs and matmuls run on integers, the bytes of their integer
    weights, and what the program's DMAs read out of weights in all."""
    if not quantized:
        return None
    integer = [q for q in quantized if q["path"] == "integer"]
    return {
        "integer": len(integer),
        "float": len(quantized) - len(integer),
        "integer_weight_bytes": sum(q.get("weight_bytes", 0) for q in integer),
        "dma_bytes_weights": cost["dma_bytes_weights"] if cost else None,
    }


def cast_plan_json(compilation: Compilation) -> dict:
    """Where the program rounds the model's values (onnx2bir/codegen/cast_plan.py): "casts"
    [{"node", "input", "dtype", "kind", "exact", "reason"?}], "unemulated" [{"node",
    "reason"}], "probes", "boundaries", "online_softmax"; empty lists when the model did not
    compile."""
    plan = compilation.cast_plan
    if plan is None:
        return {
            "casts": [],
            "unemulated": [],
            "probes": [],
            "boundaries": [],
            "online_softmax": [],
            "expanded_attention": [],
        }
    return plan.to_json()


def autocast_summary(compilation: Compilation) -> dict:
    """The general autocast the model was compiled with, and the operand dtypes of its PE
    matmuls (PE transposes against the identity included) as the BIR has them."""
    options = compilation.options or CompileOptions()
    pairs = None
    if compilation.module is not None:
        function = compilation.module.functions[0]
        locations = function.memory_locations
        counts: Counter = Counter()
        for ins in function.instructions():
            if ins.opcode is Opcode.MATMULT:
                stat, mov = (locations[ins.srcs[r].loc].dtype for r in ("stationary", "moving"))
                counts[f"{stat} x {mov}"] += 1
        pairs = dict(sorted(counts.items()))
    return {
        "auto_cast": options.auto_cast,
        "auto_cast_type": options.auto_cast_type,
        "text": options.autocast_text,
        "native_kernel_cast_type": options.native_kernel_cast_type,
        "matmul_operand_dtypes": pairs,
        "excluded": list(options.auto_cast_exclude),
        "kept_fp32": _kept_fp32(compilation.graph.keep_fp32),
    }


def _kept_fp32(names) -> list[str]:
    """The nodes kept in fp32, without the ones a pass made from another listed node."""
    return sorted(n for n in names if not any(n.startswith(other + "/") for other in names))


def _backward(conv: dict) -> bool:
    return conv.get("op_type") == "ConvTranspose"


def _as_json(finding) -> dict:
    """A pass's finding as JSON: typed findings (patterns/findings.py) serialise themselves."""
    return finding.to_json() if hasattr(finding, "to_json") else finding


def model_stride(conv: dict) -> list[int]:
    """The stride the model wrote: a ConvTranspose's lives in `rhs_dilation` (backward form)."""
    return list(conv["rhs_dilation"] if _backward(conv) else conv["stride"])


def model_dilation(conv: dict) -> list[int]:
    """The kernel dilation the model wrote: the backward form keeps it in `lhs_dilation`."""
    return list(conv.get("lhs_dilation" if _backward(conv) else "rhs_dilation") or [])


# How close a registry entry came, from its refusal. Nearest: a size or capacity limit (the
# conv has the entry's form and misses on a number). Then: groups or depthwise-ness. Furthest:
# an entry for another kind of convolution altogether (forward vs transposed, 1-D, layout).
_NEAR_MISS_MARKERS = (" > ", "partitions", "bytes", "not low", "SBUF", "exceeds", " >= ", " < ")
_OTHER_KIND_MARKERS = (
    "lhs_dilation",
    "backward form",
    "not a backward",
    "not 1-D",
    "not NHWC",
    "experimental",
)


def _distance(refusal: str) -> int:
    if any(marker in refusal for marker in _OTHER_KIND_MARKERS):
        return 2
    if any(marker in refusal for marker in _NEAR_MISS_MARKERS):
        return 0
    return 1


def rank_refusals(conv: dict) -> list[dict]:
    """The registry walk ranked by relevance, the entry that came closest first (`_distance`:
    a missed size limit, then a group/depthwise mismatch, then an entry for another kind of
    convolution); registry order within each rank."""
    return sorted(conv.get("walk") or [], key=lambda step: _distance(step["refused"]))


def _conv_geometry(conv: dict) -> str:
    kern_perm = conv.get("kern_perm") or list(range(len(conv["kernel_shape"])))
    kernel = "x".join(str(conv["kernel_shape"][axis]) for axis in kern_perm[2:])
    stride = "x".join(str(s) for s in model_stride(conv))
    dilation = model_dilation(conv)
    dil = "" if all(d == 1 for d in dilation) else " d" + "x".join(map(str, dilation))
    kind = "T " if _backward(conv) else ""
    # The backward form groups on batch_group_count (docs/conv_backward.md); show either.
    groups = conv["feature_group_count"] * conv.get("batch_group_count", 1)
    return (
        f"{kind}{conv['input_shape'][1]}->{conv['result_shape'][1]} k{kernel} s{stride}{dil} "
        f"g{groups}"
    )


GEOMETRY_LEGEND = (
    "geometry: input->output channels, kernel size (k), stride (s) as the model wrote it, "
    "dilation (d, when not 1), groups (g); T marks a ConvTranspose"
)


def _quantized_lines(doc: dict) -> list[str]:
    summary = doc.get("quantized_summary")
    if not summary:
        return []
    lines = [
        f"quantized convs and matmuls: {summary['integer']} on the exact integer path, "
        f"{summary['float']} on the float path (docs/quantization.md)"
    ]
    if summary["dma_bytes_weights"] is not None and summary["integer_weight_bytes"]:
        ratio = summary["dma_bytes_weights"] / summary["integer_weight_bytes"]
        lines.append(
            f"  weights: {summary['integer_weight_bytes']:,} bytes of integers; the program's "
            f"DMAs read {summary['dma_bytes_weights']:,} bytes of the model's weights and "
            "constants "
            f"({ratio:.2f}x)"
        )
    for entry in doc["quantized"]:
        if entry["path"] != "integer" or entry.get("reason"):
            lines.append(
                f"  {entry['node']} ({entry['form']}): {entry['path']} - {entry['reason']}"
            )
    return lines


def format_report(doc: dict, all_reasons: bool = False) -> str:
    """The report for a person; `all_reasons` lists every refusal instead of the closest."""
    lines = [
        f"model {doc['model']}: "
        + ("compiles" if doc["compiles"] else f"does NOT compile: {doc['codegen_error']}")
    ]
    cast = doc.get("autocast")
    if cast:
        lines.append(
            f"autocast: {cast['text']} (the attention kernel follows --native-kernel-cast-type "
            f"{cast['native_kernel_cast_type']})"
        )
        if cast["matmul_operand_dtypes"]:
            listing = ", ".join(f"{k} x{v}" for k, v in cast["matmul_operand_dtypes"].items())
            lines.append(f"  PE matmul operand dtypes (stationary x moving): {listing}")
        if cast.get("excluded"):
            kept = cast["kept_fp32"]
            shown = ", ".join(kept[:8]) + (f", ... ({len(kept)} in all)" if len(kept) > 8 else "")
            lines.append(f"  kept in fp32 (--auto-cast-exclude): {shown or 'nothing compiled'}")
    plan = doc.get("cast_plan") or {}
    if plan.get("casts"):
        kinds = Counter(point["dtype"] for point in plan["casts"])
        lines.append(
            f"  cast plan: {len(plan['casts'])} node inputs rounded ("
            + ", ".join(f"{n} to {d}" for d, n in sorted(kinds.items()))
            + "; --json lists them)"
        )
    for entry in plan.get("online_softmax", []):
        lines.append(
            f"  attention kernel at {entry['node']}: the oracle computes its online softmax "
            f"in key tiles of {entry['key_tile']}, rounding to {entry['dtype']} as it does"
        )
    for entry in plan.get("unemulated", []):
        lines.append(
            f"  rounds inside one op (validate uses its statistical bound): "
            f"{entry['node']}: {entry['reason']}"
        )
    narrowed = doc.get("int64") or []
    if narrowed:
        proven = sum(1 for n in narrowed if n["proven"])
        lines.append(
            f"int64: {len(narrowed)} tensor(s) narrowed to int32 on the device, {proven} proven "
            "to fit (docs/neuroncore.md#integers)"
        )
    lines += _quantized_lines(doc)
    lines += [f"note: {note['flag']}: {note['message']}" for note in doc.get("notes", [])]
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
        geo = max(len(_conv_geometry(conv)) for conv in doc["convs"])
        lines += [
            "",
            f"  {GEOMETRY_LEGEND}",
            f"  {'node':<{width}}  {'geometry':<{geo}}  kernel, or GENERIC and the closest "
            "registry entries' refusals",
        ]
        for conv in doc["convs"]:
            outcome = conv["kernel"] or f"GENERIC - {_first_reasons(conv, all_reasons)}"
            lines.append(f"  {conv['node']:<{width}}  {_conv_geometry(conv):<{geo}}  {outcome}")
    blocks = doc["attention"]
    if blocks:
        raised = sum(1 for a in blocks if a["target"])
        lines += [
            "",
            f"attention: {len(blocks)} block(s) found, {raised} raised "
            "(gates: docs/attention.md#gates)",
            "  first node: how the block is spelled (scale, masks, K transpose, heads)",
            "      -> the kernel it was raised to, or why not",
        ]
        generic = {  # an onnx.Attention DecomposeAttention could not decompose
            d["nodes"][0]: d for d in doc.get("decomposed_attention", []) if "expanded" in d
        }
        for a in blocks:
            head = a["nodes"][0] if a["nodes"] else "?"
            outcome = a["target"] or f"not raised: {a['reason']}"
            shape = (
                f" [seq {a['seq_q']}x{a['seq_k']}, head dim {a['head_dim']}, {a['dtype']}]"
                if "seq_q" in a
                else ""
            )
            lines.append(f"  {head}: {a['variant'] or '-'}{shape}")
            lines.append(f"      -> {outcome}")
            if head in generic:
                d = generic[head]
                path = (
                    f"its ONNX function body ({d['new_nodes']} nodes)"
                    if d["expanded"]
                    else f"stays (no function body: {d['expansion_reason']})"
                )
                lines.append(f"      -> not decomposed: {d['reason']}; {path}")
            if a.get("packaging") is not None:
                built = ", ".join(f"{op} {n}" for op, n in a["packaging"].items()) or "none"
                lines.append(
                    f"      packaging: {built}; SBUF {a['sb_bytes']} bytes/partition "
                    f"(tiles {a['sb_shape'][0]} x {a['sb_shape'][1]})"
                )
    if doc["mlp"]:
        raised = sum(1 for m in doc["mlp"] if m["target"])
        lines += [
            "",
            f"MLP: {len(doc['mlp'])} block(s) found, {raised} raised to AwsNeuronMLPNKI",
            "  first node: activation -> kernel, or why not",
        ]
        for m in doc["mlp"]:
            outcome = m["target"] or f"not raised: {m['reason']}"
            lines.append(f"  {m['nodes'][0]}: {m['activation'] or '-'} -> {outcome}")
    refused = doc.get("mlp_refused") or []
    if refused:
        lines += ["", f"MLP: {len(refused)} candidate(s) refused"]
    for m in refused:
        lines.append(f"  ending at {m['nodes'][-1]}: not raised: {m['reason']}")
    width = max([len("op type")] + [len(op) for op in doc["ops"]])
    lines += ["", "ops in the model, as imported:", f"  {'op type':<{width}}  count"]
    lines += [f"  {op:<{width}}  {count}" for op, count in doc["ops"].items()]
    if doc["instructions"]:
        inst = doc["instructions"]
        per_engine = ", ".join(f"{e} {n}" for e, n in inst["per_engine"].items())
        lines += ["", f"BIR instructions: {inst['total']} ({per_engine})"]
        if "dynamic_instances" in inst:
            bound = "" if inst["dynamic_exact"] else "at least "
            dynamic = ", ".join(f"{e} {n}" for e, n in inst["dynamic_per_engine"].items())
            lines.append(
                f"dynamic instances (loop trips expanded): {bound}{inst['dynamic_instances']} "
                f"({dynamic})"
            )
    if doc.get("dependencies"):
        deps = doc["dependencies"]
        kinds = ", ".join(f"{k} {n}" for k, n in deps.items() if k != "loop_carried")
        lines.append(
            f"dependency edges between streams: {kinds}; {deps['loop_carried']} loop-carried"
        )
    if doc.get("loops"):
        loops = doc["loops"]
        lines.append(
            f"loops of more than one trip: {loops['static']} static ({loops['parallel']} "
            f"parallel, {loops['sequential']} sequential; {loops['multi_buffered']} "
            f"multi-buffered), {loops['runtime']} runtime"
        )
    if doc.get("cost"):
        lines += cost_text(doc["cost"])
    lines += batch_split_text(doc.get("batch_split"))
    lines += memory_text(doc.get("memory"))
    return "\n".join(lines)


def _first_reasons(conv: dict, all_reasons: bool = False, count: int = 2) -> str:
    """The closest entries' refusals (`rank_refusals`), shortened for the table; the reason
    the registry was not walked at all (a 3-D conv) when there are none."""
    ranked = conv.get("closest_refusals") or rank_refusals(conv)
    if not ranked:
        return conv.get("fallback_reason") or "no registry entry was tried"
    shown = ranked if all_reasons else ranked[:count]
    text = "; ".join(f"{step['entry']}: {step['refused']}" for step in shown)
    more = len(ranked) - len(shown)
    return text + (f"; ({more} more: --explain {conv['node']})" if more else "")


def explain_conv(doc: dict, node: str) -> str:
    """The whole registry walk for one conv."""
    for conv in doc["convs"]:
        if conv["node"] == node:
            lines = [
                f"{conv['op_type']} {node}: {_conv_geometry(conv)}",
                f"  input {conv['input_shape']} kernel {conv['kernel_shape']} "
                f"result {conv['result_shape']} kern_perm {conv.get('kern_perm')}",
                f"  stride {conv['stride']} padding {conv['padding']} rhs_dilation "
                f"{conv['rhs_dilation']} lhs_dilation {conv['lhs_dilation']} "
                f"feature_group_count {conv['feature_group_count']} batch_group_count "
                f"{conv['batch_group_count']} dtype {conv['dtype']}",
            ]
            if conv["op_type"] == "ConvTranspose":
                lines.append(
                    "  backward form: rhs_dilation carries the stride, lhs_dilation the "
                    "kernel dilation, batch_group_count the groups"
                )
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
