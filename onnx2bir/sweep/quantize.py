"""Quantize a float ONNX model with onnxruntime's own tool (docs/sweep.md#quantized-models).

In: a float model file and a variant name. Out: the quantized `onnx.ModelProto`, written by
`onnxruntime.quantization`, nothing of ours in its graph. The variants:

- `qdq`: `quant_pre_process` (without the symbolic shape inference, which needs sympy and is
  not needed for static shapes), then `quantize_static` with `QuantFormat.QDQ`, onnxruntime's
  defaults: int8 activations and weights, per tensor, MinMax calibration.
- `qop`: the same with `QuantFormat.QOperator` (QLinearConv, QLinearMatMul, QLinearAdd, ...),
  the same int8 types. (onnxruntime advises uint8 activations for QOperator on x86-64, for
  speed; with them its quantizer writes an invalid QGemm for bert, a uint8 bias.)
- `dynamic`: `quant_pre_process`, then `quantize_dynamic` (int8 weights; activations
  quantized at run time by DynamicQuantizeLinear, uint8): MatMulInteger, ConvInteger.
- `int4`: `MatMulNBitsQuantizer`, 4-bit symmetric weights in blocks of 32 along K, for every
  MatMul with a constant weight (Gemm and Conv are left as they are). It needs the `onnx_ir`
  package, which onnx2bir does not depend on: without it `QuantizeFailed` says so.

Before `quantize_static` and `quantize_dynamic`, every float initializer read by more than one
node gets a copy per node (`unshare_initializers`): exporters merge equal constants (BERT's
zero biases are one initializer read by its LayerNorms, Adds and Gemms), and onnxruntime's
quantizer then names two quantized forms of it alike — its QOperator BERT reads an int8 tensor
as a QGemm's int32 bias, a model onnxruntime itself refuses to load.

Calibration (`calibration_inputs`, for `qdq` and `qop`): `CALIBRATION_SAMPLES` inputs, sample k
drawn as `onnx2bir validate --seed k` draws its inputs (runtime/oracle/ort.py: floats standard
normal, token ids within the gathered table), except that attention masks are all ones.
The same model and onnxruntime version give the same bytes on every run.
"""

from __future__ import annotations

import contextlib
import logging
import re
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx

VARIANTS = ("qdq", "qop", "dynamic", "int4")
CALIBRATION_SAMPLES = 8
INT4_BLOCK_SIZE = 32
ONNX_IR_HINT = "--quantize int4 needs the onnx_ir package: pip install onnx_ir"
_TEMPORARY = re.compile(r"\S*/(ort\.quant\.|onnx2bir-quantize-)[^/\s]*/")


class QuantizeFailed(Exception):
    """onnxruntime's quantization tool failed on the model; the message says at which step."""


def onnx_ir_missing() -> str | None:
    """Why the int4 variant cannot run here (onnx_ir is not installed), or None."""
    try:
        import onnx_ir  # noqa: F401
    except ImportError:
        return ONNX_IR_HINT
    return None


def calibration_inputs(path: Path, count: int = CALIBRATION_SAMPLES) -> list[dict]:
    """`count` feeds for the calibration (module docstring); onnx2bir's import reads the model
    to find token ids and masks, so a model it refuses raises its UserError here."""
    from onnx2bir.frontend.importer import import_model
    from onnx2bir.runtime.oracle.ort import mask_reason, synthesize_inputs

    graph = import_model(path)
    masks = [name for name in graph.inputs if mask_reason(graph, name)]
    samples = []
    for seed in range(count):
        feeds = synthesize_inputs(graph, seed)
        for name in masks:
            feeds[name] = np.ones_like(feeds[name])
        samples.append(feeds)
    return samples


def unshare_initializers(model: onnx.ModelProto) -> int:
    """Give each node but the first that reads a shared float initializer its own copy (module
    docstring); returns how many copies were made. Subgraphs are left as they are."""
    from onnx import numpy_helper

    floats = {
        init.name: init
        for init in model.graph.initializer
        if init.data_type
        in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)
    }
    names = {init.name for init in model.graph.initializer}
    names |= {out for node in model.graph.node for out in node.output}
    names |= {value.name for value in model.graph.input}
    seen: set[str] = set()
    copies = 0
    for node in model.graph.node:
        for slot, name in enumerate(node.input):
            if name not in floats:
                continue
            if name not in seen:
                seen.add(name)
                continue
            number = 1
            while f"{name}_copy{number}" in names:
                number += 1
            copy = numpy_helper.to_array(floats[name])
            fresh = f"{name}_copy{number}"
            model.graph.initializer.append(numpy_helper.from_array(copy, fresh))
            names.add(fresh)
            node.input[slot] = fresh
            copies += 1
    return copies


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """onnxruntime's quantizer logs advice, per-node progress and, when its pre-processing
    cannot optimize the model, a traceback at level ERROR before it goes on without the
    optimization; its numpy arithmetic warns on a degenerate range (a constant, a mask of
    ±3.4e38). A sweep prints one line a model, so those records and warnings are held back.
    What fails raises, and the sweep records it."""
    import onnxruntime

    previous = logging.root.manager.disable
    logging.disable(logging.ERROR)
    onnxruntime.set_default_logger_severity(3)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(previous)
        onnxruntime.set_default_logger_severity(2)


def _step(what: str, call, *args, **kwargs):
    try:
        return call(*args, **kwargs)
    except Exception as exc:
        detail = " ".join(f"{type(exc).__name__}: {exc}".split())
        detail = _TEMPORARY.sub("", detail)  # the quantizer's temporary folders: noise
        raise QuantizeFailed(f"onnxruntime quantization, {what}: {detail}") from exc


def quantize_model(
    path: Path, variant: str, calibration: list[dict] | None = None
) -> onnx.ModelProto:
    """The `variant` of the float model at `path` (module docstring). `calibration` defaults to
    `calibration_inputs(path)` for the static variants. Raises QuantizeFailed when onnxruntime's
    tool fails, UserError when onnx2bir cannot read the model to draw calibration inputs."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}")
    if variant == "int4":
        return _int4(path)
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quant_pre_process,
        quantize_dynamic,
        quantize_static,
    )

    if variant in ("qdq", "qop") and calibration is None:
        calibration = calibration_inputs(path)

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.samples = iter(calibration or [])

        def get_next(self) -> dict | None:
            return next(self.samples, None)

    with tempfile.TemporaryDirectory(prefix="onnx2bir-quantize-") as folder, _quiet():
        prepared, out = Path(folder) / "prepared.onnx", Path(folder) / "quantized.onnx"
        _step(
            "pre-processing (quant_pre_process)",
            quant_pre_process,
            str(path),
            str(prepared),
            skip_symbolic_shape=True,
        )
        prepared_model = onnx.load(str(prepared))
        if unshare_initializers(prepared_model):
            onnx.save(prepared_model, str(prepared))
        if variant == "dynamic":
            _step("quantize_dynamic", quantize_dynamic, str(prepared), str(out))
        else:
            _step(
                f"quantize_static ({variant})",
                quantize_static,
                str(prepared),
                str(out),
                Reader(),
                quant_format=QuantFormat.QDQ if variant == "qdq" else QuantFormat.QOperator,
                activation_type=QuantType.QInt8,
                weight_type=QuantType.QInt8,
            )
        return onnx.load(str(out))


def _int4(path: Path) -> onnx.ModelProto:
    missing = onnx_ir_missing()
    if missing:
        raise QuantizeFailed(missing)
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    model = _step("reading the model", onnx.load, str(path))
    with _quiet():
        quantizer = _step(
            "MatMulNBitsQuantizer",
            MatMulNBitsQuantizer,
            model,
            bits=4,
            block_size=INT4_BLOCK_SIZE,
            is_symmetric=True,
        )
        _step("MatMulNBitsQuantizer.process", quantizer.process)
    return quantizer.model.model


def quantized_ops(model: onnx.ModelProto) -> dict[str, int]:
    """Counts of the nodes onnxruntime's tool writes (Q/DQ, QLinear*, *Integer, MatMulNBits)."""
    counts: dict[str, int] = {}
    for node in model.graph.node:
        op = node.op_type
        if (
            op in ("QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "QGemm")
            or op.startswith("QLinear")
            or op.endswith("Integer")
            or op == "MatMulNBits"
        ):
            counts[op] = counts.get(op, 0) + 1
    return counts
