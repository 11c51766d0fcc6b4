"""`onnx2bir report` and `profile`: the passes' decisions, costs and memory as a document,
text, an HTML page, Netron annotations and a device timeline."""
