"""Quantize zoo models with onnxruntime's own tool into `models/quantized/<name>_<variant>.onnx`.

For resnet18, mobilenetv3, bert, vit and llama (the committed `models/<name>.onnx`), writes the
variants of `onnx2bir.sweep.quantize` (the same code `onnx2bir sweep --quantize` runs):

- `qdq`: `quant_pre_process` + `quantize_static(QuantFormat.QDQ)`, int8 activations and weights;
- `qop`: the same with `QuantFormat.QOperator`;
- `dynamic`: `quant_pre_process` + `quantize_dynamic`;
- `int4`: `MatMulNBitsQuantizer`, 4-bit symmetric, blocks of 32 (needs `pip install onnx_ir`;
  without it the int4 files are skipped with a message). resnet18 and mobilenetv3 have no
  MatMul with a constant weight (their linears are Gemm): the 4-bit quantizer would change
  nothing, so they have no int4 file.

Calibration: 8 seeded inputs, sample k drawn as `onnx2bir validate --seed k` draws its inputs,
attention masks all ones. Each file is stripped like the exports (`strip_metadata.py`: no node
metadata, no doc strings), keeps its source's `onnx2bir.zoo.*` metadata and gains
`onnx2bir.quantize.*` keys (variant, source file and its sha256, onnxruntime version). With one
onnxruntime version the files are the same byte for byte on every run.

    python models/quantize.py                        # every model and variant
    python models/quantize.py bert llama --variant qdq --variant int4
    python models/quantize.py --check                # rebuild in memory, compare with the files

Each file is checked with `onnx.checker` and run by onnxruntime on the first calibration input; the
script prints its op counts, size, sha256 and its output's agreement with the float model, then
a Markdown table for `MANIFEST.md`. Exit status 1 if a variant fails or (`--check`) differs.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
import onnx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from strip_metadata import strip_exporter_metadata  # noqa: E402

from onnx2bir.sweep.quantize import (  # noqa: E402
    VARIANTS,
    QuantizeFailed,
    calibration_inputs,
    onnx_ir_missing,
    quantize_model,
    quantized_ops,
)

MODELS = ("resnet18", "mobilenetv3", "bert", "vit", "llama")
OUT = HERE / "quantized"
META = "onnx2bir.quantize."


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def finish(model: onnx.ModelProto, source: Path, variant: str) -> onnx.ModelProto:
    """Strip the quantized model and record where it came from (module docstring)."""
    import onnxruntime

    strip_exporter_metadata(model)
    original = onnx.load(str(source), load_external_data=False)
    del model.metadata_props[:]
    for entry in original.metadata_props:
        model.metadata_props.add(key=entry.key, value=entry.value)
    provenance = {
        "variant": variant,
        "source": source.name,
        "source_sha256": sha256(source.read_bytes()),
        "onnxruntime": onnxruntime.__version__,
        "tool": "models/quantize.py (onnx2bir.sweep.quantize)",
    }
    if variant == "int4":
        import onnx_ir

        provenance["onnx_ir"] = onnx_ir.__version__
    for key, value in provenance.items():
        model.metadata_props.add(key=META + key, value=value)
    model.doc_string = f"{original.doc_string}; quantized by onnxruntime ({variant})"
    return model


def _run(path_or_bytes, feeds: dict) -> list[np.ndarray]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(path_or_bytes, options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def agreement(source: Path, data: bytes, feeds: dict) -> tuple[float, float]:
    """(max abs difference, cosine) of the quantized model's first output against the float
    model's, on the same input."""
    reference = _run(str(source), feeds)[0].astype(np.float64).ravel()
    try:
        quantized = _run(data, feeds)[0].astype(np.float64).ravel()
    except Exception as exc:  # onnxruntime refuses what its own quantizer wrote
        raise QuantizeFailed(f"onnxruntime cannot run the result: {exc}") from exc
    if not np.all(np.isfinite(quantized)):
        raise QuantizeFailed("the quantized model's output is not finite")
    cosine = float(
        reference @ quantized / (np.linalg.norm(reference) * np.linalg.norm(quantized) or 1.0)
    )
    return float(np.max(np.abs(reference - quantized))), cosine


def write_atomically(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def one(name: str, variant: str, out: Path, check: bool, samples: list[dict]) -> dict | None:
    """Quantize one model one way; returns its summary row, or None when skipped."""
    source = HERE / f"{name}.onnx"
    model = quantize_model(source, variant, samples)
    if variant == "int4" and "MatMulNBits" not in quantized_ops(model):
        print(f"{name} int4: skipped, no MatMul with a constant weight (nothing to quantize)")
        return None
    model = finish(model, source, variant)
    onnx.checker.check_model(model, full_check=True)
    data = model.SerializeToString()
    path = out / f"{name}_{variant}.onnx"
    row = {
        "file": path.name,
        "variant": variant,
        "size": len(data),
        "sha256": sha256(data),
        "ops": Counter(node.op_type for node in model.graph.node),
        "quantized": quantized_ops(model),
    }
    row["max_abs"], row["cosine"] = agreement(source, data, samples[0])
    if check:
        row["same"] = path.exists() and path.read_bytes() == data
    else:
        write_atomically(path, data)
    ops = ", ".join(f"{op}={n}" for op, n in row["ops"].most_common())
    state = {True: " (same bytes)", False: " (DIFFERS from the file)"}.get(row.get("same"), "")
    print(
        f"{path.relative_to(HERE.parent) if path.is_relative_to(HERE.parent) else path}: "
        f"{len(data)} bytes, sha256 {row['sha256'][:16]}{state}\n"
        f"  vs float: max abs {row['max_abs']:.3g}, cosine {row['cosine']:.5f}\n  ops: {ops}"
    )
    return row


def table(rows: list[dict]) -> str:
    """The rows of MANIFEST.md's quantized table."""
    lines = [
        "| File | Size | Nodes | Quantized ops | vs float: max abs, cosine | sha256 |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        quantized = " ".join(f"{op}={n}" for op, n in sorted(r["quantized"].items()))
        lines.append(
            f"| `quantized/{r['file']}` | {r['size'] / 1024:.0f} KiB | {sum(r['ops'].values())} "
            f"| {quantized} | {r['max_abs']:.2g}, {r['cosine']:.4f} | `{r['sha256']}` |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", metavar="NAME", help=f"of {', '.join(MODELS)}")
    parser.add_argument(
        "--variant", action="append", choices=VARIANTS, help="repeatable; default: all four"
    )
    parser.add_argument("--out", type=Path, default=OUT, help="folder (default models/quantized)")
    parser.add_argument(
        "--check", action="store_true", help="write nothing; compare with the existing files"
    )
    args = parser.parse_args(argv)
    unknown = sorted(set(args.names) - set(MODELS))
    if unknown:
        parser.error(f"unknown model {', '.join(unknown)}; choose from {', '.join(MODELS)}")
    variants = args.variant or list(VARIANTS)
    if "int4" in variants and onnx_ir_missing():
        print(f"int4 skipped: {onnx_ir_missing()}")
        variants = [v for v in variants if v != "int4"]
    args.out.mkdir(parents=True, exist_ok=True)
    rows, failed = [], []
    for name in args.names or MODELS:
        samples = calibration_inputs(HERE / f"{name}.onnx")
        for variant in variants:
            try:
                row = one(name, variant, args.out, args.check, samples)
            except (QuantizeFailed, onnx.checker.ValidationError) as exc:
                print(f"{name} {variant}: FAILED: {exc}")
                failed.append(f"{name}_{variant}")
                continue
            if row is not None:
                rows.append(row)
                if row.get("same") is False:
                    failed.append(row["file"])
    import onnxruntime

    print(f"\nonnxruntime {onnxruntime.__version__}; {len(rows)} files")
    print(table(rows))
    if failed:
        print(f"failed or different: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
