"""The oracle side: onnxruntime (plain and emulating the program's roundings), comparison,
tolerance and the verdict."""
