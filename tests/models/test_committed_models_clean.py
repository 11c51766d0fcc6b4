"""Committed models carry nothing about the machine that exported them: no node metadata (the
exporter's stack traces with local file paths, module scopes), no doc strings on nodes or
values, no absolute path anywhere in the file's strings."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import onnx
import pytest

ROOT = Path(__file__).resolve().parents[2]
MODELS = sorted((ROOT / "models").glob("*.onnx"))
# An absolute path of a machine: /home/..., /work/..., C:\..., or a Python source file.
PATH_LIKE = re.compile(r"(^|[\s'\"(])(/(home|work|tmp|usr|root|opt|Users)/|[A-Za-z]:\\)|\.py\b")


def _graphs(graph: onnx.GraphProto):
    yield graph
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                yield from _graphs(attribute.g)
            for sub in attribute.graphs:
                yield from _graphs(sub)


def test_there_are_committed_models():
    assert len(MODELS) >= 12


@pytest.mark.parametrize("path", MODELS, ids=lambda p: p.name)
def test_committed_model_has_no_exporter_metadata(path):
    model = onnx.load(str(path), load_external_data=False)
    for graph in _graphs(model.graph):
        assert not graph.doc_string and not list(graph.metadata_props)
        for node in graph.node:
            assert not list(node.metadata_props), (node.name, node.metadata_props[0].key)
            assert not node.doc_string, node.name
        for value in [*graph.input, *graph.output, *graph.value_info, *graph.initializer]:
            assert not value.doc_string, value.name
    texts = [model.doc_string, *(e.key + "=" + e.value for e in model.metadata_props)]
    assert not [t for t in texts if PATH_LIKE.search(t)]


def test_the_strip_keeps_weights_and_nodes_and_drops_stack_traces(tmp_path):
    sys.path.insert(0, str(ROOT / "models"))
    try:
        from strip_metadata import strip_file
    finally:
        sys.path.pop(0)
    model = onnx.load(str(ROOT / "models" / "small_cnn.onnx"))
    node = model.graph.node[0]
    node.metadata_props.add(key="pkg.torch.onnx.stack_trace", value='File "/home/me/x.py"')
    node.doc_string = "made by /home/me/export.py"
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    assert strip_file(path) == 2
    stripped = onnx.load(str(path))
    assert not list(stripped.graph.node[0].metadata_props) and not stripped.graph.node[0].doc_string
    assert [n.SerializeToString() for n in stripped.graph.node[1:]] == [
        n.SerializeToString() for n in model.graph.node[1:]
    ]
    assert [i.SerializeToString() for i in stripped.graph.initializer] == [
        i.SerializeToString() for i in model.graph.initializer
    ]
