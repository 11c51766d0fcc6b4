"""The front end: read and check an ONNX model, fix its symbolic dimensions, fold what is known
at compile time, and build the `Graph` the passes work on (`importer.import_model`)."""
