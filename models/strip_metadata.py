"""Strip what an exporter leaves behind about the machine that ran it.

PyTorch's exporters record, on every node, the Python stack trace of the call that made it
(absolute file paths of the exporting machine), the module hierarchy, the FX node and the
name scopes, and optimisers add their rule names. None of it is needed to run or read the
model; a published model should not carry its builder's paths. `strip_exporter_metadata`
removes every node's `metadata_props` and `doc_string` (subgraphs included) and the doc
strings of graphs, values and initializers. The model's own `metadata_props` and
`doc_string` (the zoo's provenance record) are kept, and no weight or node is touched.

    python models/strip_metadata.py models/*.onnx     # strip committed models in place

The export scripts (`zoo.py`, `export_small_cnn.py`) call it before saving.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import onnx


def _clear_doc(message) -> int:
    """Clear a doc_string field; clearing (not assigning "") keeps an unset field unset."""
    if message.HasField("doc_string"):
        message.ClearField("doc_string")
        return 1
    return 0


def _strip_graph(graph: onnx.GraphProto) -> int:
    removed = len(graph.metadata_props) + _clear_doc(graph)
    del graph.metadata_props[:]
    for value in [*graph.input, *graph.output, *graph.value_info, *graph.initializer]:
        removed += _clear_doc(value)
    for node in graph.node:
        removed += len(node.metadata_props) + _clear_doc(node)
        del node.metadata_props[:]
        for attribute in node.attribute:
            removed += _clear_doc(attribute)
            if attribute.type == onnx.AttributeProto.GRAPH:
                removed += _strip_graph(attribute.g)
            for sub in attribute.graphs:
                removed += _strip_graph(sub)
    return removed


def strip_exporter_metadata(model: onnx.ModelProto) -> int:
    """Strip `model` in place (module docstring); returns how many entries were removed."""
    removed = _strip_graph(model.graph)
    for function in model.functions:
        for node in function.node:
            removed += len(node.metadata_props) + _clear_doc(node)
            del node.metadata_props[:]
    return removed


def strip_file(path: Path) -> int:
    """Strip one model file in place, atomically; the initializers must come out unchanged."""
    model = onnx.load(str(path), load_external_data=False)
    before = [init.SerializeToString() for init in model.graph.initializer]
    removed = strip_exporter_metadata(model)
    after = [init.SerializeToString() for init in model.graph.initializer]
    if before != after:
        raise AssertionError(f"{path}: stripping changed an initializer")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "wb") as handle:
        handle.write(model.SerializeToString())
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
    return removed


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python models/strip_metadata.py MODEL.onnx...", file=sys.stderr)
        return 2
    for name in argv:
        path = Path(name)
        size = path.stat().st_size
        removed = strip_file(path)
        print(f"{path}: {removed} entries removed, {size} -> {path.stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
