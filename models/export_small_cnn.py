"""Export the small test CNN to ONNX.

In:  nothing (the weights come from ``torch.manual_seed(0)``; no downloads).
Out: ``models/small_cnn.onnx`` next to this script: a single self-contained ONNX file
     (opset 18, no external data) with one input ``input`` (float32, 1x3x32x32) and one
     output ``logits`` (float32, 1x10). The script prints the exporter used, the op-type
     counts, the file size, and the largest difference between onnxruntime and torch.

Run from anywhere: ``python models/export_small_cnn.py``. It needs torch, onnxscript, onnx and
onnxruntime; the onnx2bir tool itself only ever reads the produced .onnx file.
"""

from __future__ import annotations

import collections
import io
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from strip_metadata import strip_exporter_metadata  # noqa: E402

OUT_PATH = Path(__file__).resolve().parent / "small_cnn.onnx"
OPSET = 18
INPUT_SHAPE = (1, 3, 32, 32)
MAX_BYTES = 500 * 1024
TOLERANCE = 1e-4

# Ops the first onnx2bir op set is expected to handle; anything else is reported.
SUPPORTED_OPS = frozenset(
    {
        "Conv",
        "Relu",
        "Add",
        "MaxPool",
        "GlobalAveragePool",
        "ReduceMean",
        "Flatten",
        "Reshape",
        "Gemm",
        "MatMul",
        "Identity",
        "Constant",
        "Shape",
        "Gather",
        "Concat",
        "Unsqueeze",
    }
)


class SmallCNN(nn.Module):
    """Conv stem, strided conv, a residual block, a dilated grouped conv, pooling, linear head."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, kernel_size=3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, kernel_size=3, stride=2, padding=1, bias=True)
        self.res_conv1 = nn.Conv2d(32, 32, kernel_size=3, padding=1)
        self.res_conv2 = nn.Conv2d(32, 32, kernel_size=3, padding=1)
        self.gconv = nn.Conv2d(32, 32, kernel_size=3, padding=2, dilation=2, groups=4)
        self.pool = nn.MaxPool2d(2)
        self.gap = nn.AdaptiveAvgPool2d(1)
        self.flatten = nn.Flatten()
        self.fc = nn.Linear(32, num_classes)
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.conv1(x))
        x = self.relu(self.conv2(x))
        y = self.relu(self.res_conv1(x))
        x = self.relu(self.res_conv2(y) + x)
        x = self.relu(self.gconv(x))
        x = self.gap(self.pool(x))
        return self.fc(self.flatten(x))


def export(model: nn.Module, example: torch.Tensor) -> tuple[onnx.ModelProto, str]:
    """Export with the dynamo exporter, falling back to the legacy exporter if it fails.

    Returns the model and a short description of the exporter that produced it.
    """
    common = {"input_names": ["input"], "output_names": ["logits"], "opset_version": OPSET}
    try:
        program = torch.onnx.export(model, (example,), dynamo=True, **common)
        if program is None:
            raise RuntimeError("dynamo exporter returned no program")
        return program.model_proto, "dynamo"
    except Exception as exc:  # any dynamo failure triggers the fallback
        reason = f"{type(exc).__name__}: {exc}".splitlines()[0]
        buffer = io.BytesIO()
        torch.onnx.export(model, (example,), buffer, dynamo=False, **common)
        return onnx.load_from_string(buffer.getvalue()), f"legacy (dynamo failed: {reason})"


def main() -> int:
    torch.manual_seed(0)
    model = SmallCNN().eval()
    example = torch.randn(*INPUT_SHAPE, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = model(example).numpy()

    proto, exporter = export(model, example)
    strip_exporter_metadata(proto)  # node metadata: the exporter's stack traces and scopes
    onnx.checker.check_model(proto, full_check=True)
    onnx.save_model(proto, OUT_PATH, save_as_external_data=False)

    size = OUT_PATH.stat().st_size
    counts = collections.Counter(node.op_type for node in proto.graph.node)
    print(f"exporter: {exporter}")
    print(f"wrote {OUT_PATH} ({size} bytes, opset {OPSET})")
    print("op-type counts: " + ", ".join(f"{op}={n}" for op, n in sorted(counts.items())))
    unsupported = sorted(set(counts) - SUPPORTED_OPS)
    print(f"ops outside the first op set: {unsupported if unsupported else 'none'}")

    ok = True
    if size >= MAX_BYTES:
        print(f"FAIL: {size} bytes is not below {MAX_BYTES}")
        ok = False
    if any(t.data_location == onnx.TensorProto.EXTERNAL for t in proto.graph.initializer):
        print("FAIL: the model references external data")
        ok = False

    session = ort.InferenceSession(str(OUT_PATH), providers=["CPUExecutionProvider"])
    names_in = [i.name for i in session.get_inputs()]
    names_out = [o.name for o in session.get_outputs()]
    if names_in != ["input"] or names_out != ["logits"]:
        print(f"FAIL: graph inputs {names_in} / outputs {names_out}")
        ok = False
    (actual,) = session.run(None, {"input": example.numpy()})
    max_diff = float(np.max(np.abs(actual - expected)))
    print(f"onnxruntime vs torch: max |diff| = {max_diff:.3g} (tolerance {TOLERANCE:g})")
    if actual.shape != expected.shape or not max_diff <= TOLERANCE:
        print("FAIL: onnxruntime output does not match torch")
        ok = False
    print("checks: " + ("OK" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
