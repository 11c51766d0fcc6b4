"""`onnx2bir report MODEL --annotate OUT.onnx`: the compiler's decisions as node metadata.

In: the original model file and what the compiler decided for it (`Prepared`: the folded
model, the graph before the passes, the compilation; and the report document). Out: the
original model, unchanged but for `NodeProto.metadata_props` entries (Netron shows them in a
node's properties), written atomically. onnxruntime ignores node metadata, so the annotated
model loads and runs as the original does.

Keys, all prefixed `onnx2bir.` (an existing entry with the same key is replaced):
- `lowering`: `kernel.<name>` or `generic.<op>` — what code generation ran for the node;
  `folded` when its value is computed at compile time; `replaced by a pass` when a pass
  absorbed it into another node (an attention block);
- `node`: the name onnx2bir gives the node, when the model leaves it unnamed;
- `kernel`, `registry_entry` (convolutions matched to a kernel) or `fallback_reason`
  (convolutions left to the generic lowering, every registry entry's refusal);
- `idiom`: the attention or MLP block the node belongs to, and whether it was raised;
- `instructions`: how many BIR instructions the node produced.
The model gets `onnx2bir.reporting.annotated` and the conv statistics in its own metadata_props.

Nodes are matched to the compiled graph by their output tensor names, which the importer's
folding keeps; a node inside a subgraph (If/Loop bodies) is left alone.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections import Counter
from pathlib import Path

import onnx

from onnx2bir import output_paths
from onnx2bir.patterns.findings import BlockFinding, Idiom
from onnx2bir.validation.prepared import Prepared, conv_findings, lowering_of

PREFIX = "onnx2bir."
_PROTOBUF_LIMIT = (2 << 30) - (64 << 20)


def node_annotations(prepared: Prepared, doc: dict) -> dict[tuple[str, ...], dict[str, str]]:
    """Metadata per node, keyed by the node's output names (as in the ONNX file)."""
    compilation, graph = prepared.compilation, prepared.pristine
    convs = conv_findings(compilation)
    idioms = _idioms(doc)
    counts: Counter = Counter()
    if compilation.module is not None:
        counts.update(ins.origin.node for ins in compilation.module.functions[0].instructions())
    result = {}
    for proto, name in zip(prepared.folded.graph.node, graph.nx.nodes, strict=True):
        # The name onnx2bir uses; annotate_model keeps it only where the file has none.
        meta = {"lowering": lowering_of(compilation, name), "node": name}
        finding = convs.get(name)
        if finding is not None:
            if finding.get("kernel"):
                meta["kernel"] = finding["kernel"]
                meta["registry_entry"] = finding.get("registry_entry") or ""
            else:
                meta["fallback_reason"] = finding.get("fallback_reason") or "no kernel"
        if name in idioms:
            meta["idiom"] = idioms[name]
        own = counts[name] + sum(n for origin, n in counts.items() if origin.startswith(f"{name}/"))
        if own:
            meta["instructions"] = str(own)
        result[tuple(proto.output)] = meta
    return result


def _idioms(doc: dict) -> dict[str, str]:
    idioms = {}
    for idiom in (Idiom.ATTENTION, Idiom.MLP):
        for entry in doc.get(str(idiom), []) or []:
            if not entry.get("is_attention", True):
                continue
            finding = BlockFinding.from_json(idiom, entry)
            for node in finding.nodes:
                idioms[node] = finding.describe()
    return idioms


def _set(props, key: str, value: str) -> None:
    key = PREFIX + key
    for entry in props:
        if entry.key == key:
            entry.value = value
            return
    entry = props.add()
    entry.key, entry.value = key, value


def annotate_model(
    model_path: str | Path, prepared: Prepared, doc: dict, out_path: str | Path
) -> int:
    """Write the annotated copy of `model_path` to `out_path`; returns nodes annotated."""
    model_path = Path(model_path)
    out_path = output_paths.check_file(out_path, "--annotate")
    model = onnx.load(str(model_path))
    annotations = node_annotations(prepared, doc)
    folded_outputs = {output for key in annotations for output in key}
    annotated = 0
    for node in model.graph.node:
        meta = annotations.get(tuple(node.output))
        if meta is None and node.output and not folded_outputs.intersection(node.output):
            meta = {"lowering": "folded"}
        if meta is None:
            continue
        if node.name:
            meta = {key: value for key, value in meta.items() if key != "node"}
        for key, value in meta.items():
            _set(node.metadata_props, key, value)
        annotated += 1
    stats = doc.get("statistics", {})
    _set(model.metadata_props, "annotated", "kernel, fallback_reason, idiom, lowering per node")
    if "conv_kernel_match_percentage" in stats:
        _set(
            model.metadata_props,
            "conv_kernel_match",
            f"{stats['matched_conv_ops']} of {stats['total_conv_ops']} "
            f"({stats['conv_kernel_match_percentage']:.2f}%)",
        )
    _write_atomically(model, out_path)
    return annotated


def _write_atomically(model: onnx.ModelProto, out_path: Path) -> None:
    if model.ByteSize() <= _PROTOBUF_LIMIT:
        output_paths.replace_file(out_path, lambda staged: onnx.save_model(model, str(staged)))
        return
    # Past protobuf's 2 GB the tensors go to OUT.onnx.data, written first: a reader that sees
    # the new model must find the bytes it describes.
    data = out_path.parent / (out_path.name + ".data")
    output_paths.check_file(data, "--annotate (external data)")
    staging = Path(tempfile.mkdtemp(prefix=f".{out_path.name[:64]}.", dir=out_path.parent))
    try:
        onnx.save_model(
            model,
            str(staging / out_path.name),
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location=data.name,
        )
        output_paths.replace_file(data, lambda staged: os.replace(staging / data.name, staged))
        output_paths.replace_file(
            out_path, lambda staged: os.replace(staging / out_path.name, staged)
        )
    finally:
        shutil.rmtree(staging, ignore_errors=True)
