"""Tools for a model that fails: `reduce` (the smallest model that still fails) and, on its
cuts, `subgraph` (cutting an ONNX model) and `failure` (what still failing means).
docs/debug.md."""
