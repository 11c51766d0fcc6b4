"""One model of a sweep: validate or report it, in a child process, into a record.

`run_one` never raises: whatever happens becomes the record's category and one-line reason
(docs/sweep.md). With a quantization variant, the model is first quantized by onnxruntime's
tool (`onnx2bir.sweep.quantize`) into a temporary file, and that file is validated; a failure
of the quantizer is the category "quantize". `run_guarded` runs it in a forked child so that a
crash, an out-of-memory kill or a hang (past the timeout) costs only that model.
`memory_estimate` is what a Ray task asks for.
"""

from __future__ import annotations

import multiprocessing
import sys
import tempfile
import time
from pathlib import Path

from onnx2bir.errors import MachineError, UserError

DEFAULT_TIMEOUT = 1800.0
META_PREFIX = "onnx2bir.sweep."
_MB = 1 << 20


def model_name(path: Path) -> str:
    return path.name.removesuffix(".onnx").removesuffix(".export-error")


def memory_estimate(path: Path) -> int:
    """Bytes a validation of the model needs, roughly: the weights are held by onnxruntime, the
    import and the machine's DRAM (about 5 copies), plus 400 MB for the interpreter and
    onnxruntime themselves."""
    size = path.stat().st_size if path.exists() else 0
    return 400 * _MB + 5 * size


def one_line(text: str, limit: int = 240) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


RUN_FILE_KEYS = ("dims", "input_shapes", "input_values", "inputs")


def run_file(path: Path) -> dict:
    """The sizes and fixed inputs a model is run with, from `<name>.run.json` beside it
    (docs/sweep.md#run-files): `dims` {symbol: size}, `input_shapes` {input: [sizes]},
    `input_values` {input: [values]}, `inputs` an .npz file or test_data_set folder (relative
    to the run file's folder) that validate reads the inputs from; {} without the file."""
    import json

    side = path.with_name(f"{model_name(path)}.run.json")
    if not side.is_file():
        return {}
    try:
        doc = json.loads(side.read_text())
    except (OSError, ValueError) as exc:
        raise UserError(f"{side}: not a readable JSON run file ({exc})") from exc
    if not isinstance(doc, dict) or set(doc) - set(RUN_FILE_KEYS):
        raise UserError(f"{side}: a run file is an object with the keys {', '.join(RUN_FILE_KEYS)}")
    if not all(isinstance(doc.get(key, {}), dict) for key in RUN_FILE_KEYS[:3]):
        raise UserError(f"{side}: each of {', '.join(RUN_FILE_KEYS[:3])} maps names to values")
    if not isinstance(doc.get("inputs", ""), str):
        raise UserError(f"{side}: inputs names a file or folder beside the run file")
    return {
        "dims": {k: int(v) for k, v in doc.get("dims", {}).items()},
        "input_shapes": {
            k: tuple(int(d) for d in v) for k, v in doc.get("input_shapes", {}).items()
        },
        "input_values": dict(doc.get("input_values", {})),
        "inputs": str(side.parent / doc["inputs"]) if doc.get("inputs") else None,
    }


def _metadata(path: Path) -> dict[str, str]:
    import onnx

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception:
        return {}
    return {
        p.key.removeprefix(META_PREFIX): p.value
        for p in model.metadata_props
        if p.key.startswith(META_PREFIX)
    }


def _summary_of(doc: dict) -> dict:
    convs = doc.get("convs") or []
    ops = doc.get("ops") or {}
    return {
        "ops": sum(ops.values()),
        "op_types": len(ops),
        "convs": {"matched": sum(1 for c in convs if c.get("kernel")), "total": len(convs)},
        "attention": len(doc.get("attention") or []),
        "mlp": len(doc.get("mlp") or []),
    }


def run_one(path: str, report_only: bool = False, quantize: str | None = None) -> dict:
    """Validate (or report) one model, first quantized by onnxruntime's tool when `quantize`
    names a variant; never raises: the record says what happened."""
    from onnx2bir.sweep.quantize import QuantizeFailed

    job_path = Path(path)
    record = blank_record(job_path, quantize)
    record["category"] = None
    start = time.perf_counter()
    if job_path.suffix == ".export-error":
        record.update(category="export", reason=one_line(job_path.read_text() or "no reason"))
        return record
    record.update({k: v for k, v in _metadata(job_path).items() if k in ("source", "family")})
    try:
        if quantize:
            with tempfile.TemporaryDirectory(prefix="onnx2bir-sweep-") as folder:
                target = _quantized(job_path, quantize, Path(folder), record)
                _run(target, report_only, record)
        else:
            _run(job_path, report_only, record)
    except QuantizeFailed as exc:
        record.update(category="quantize", reason=one_line(str(exc)))
    except MachineError as exc:
        record.update(category="crash", reason=one_line(f"machine rejected: {exc}"))
    except UserError as exc:
        message = str(exc)
        category = "unsupported op" if message.startswith("unsupported ops") else "codegen refusal"
        record.update(category=category, reason=one_line(message))
    except Exception as exc:  # an onnx2bir bug: recorded, the sweep goes on
        record.update(category="crash", reason=one_line(f"{type(exc).__name__}: {exc}"))
    record["times"]["total"] = round(time.perf_counter() - start, 3)
    if record["category"] is None:
        record.update(passed=True, verdict="pass")
    return record


def _quantized(path: Path, variant: str, folder: Path, record: dict) -> Path:
    """The model quantized by onnxruntime's tool, saved in `folder` under the model's name."""
    import onnx

    from onnx2bir.sweep.quantize import quantize_model

    start = time.perf_counter()
    model = quantize_model(path, variant)
    target = folder / f"{model_name(path)}.onnx"
    onnx.save(model, str(target))
    record["times"]["quantize"] = round(time.perf_counter() - start, 3)
    return target


def _run(path: Path, report_only: bool, record: dict) -> None:
    from onnx2bir.compiler import compile_model
    from onnx2bir.options import CompileOptions
    from onnx2bir.reporting import document as report
    from onnx2bir.runtime.oracle.tolerance import TolerancePolicy
    from onnx2bir.validation.run import run_validate

    options = CompileOptions()
    how = run_file(path)
    shapes, dims, values = how.get("input_shapes"), how.get("dims"), how.get("input_values")
    if report_only:
        compilation = compile_model(path, options, shapes, dims, True, values)
        record.update(_summary_of(report.build_report(str(path), compilation)))
        record["times"]["compile"] = round(sum(compilation.timings.values()), 3)
        if compilation.codegen_error:
            raise UserError(compilation.codegen_error)
        return
    seen: dict = {}

    def on_compiled(compilation) -> None:
        seen["compilation"] = compilation
        record.update(_summary_of(report.build_report(str(path), compilation)))

    try:
        doc, _, _ = run_validate(
            str(path),
            options,
            TolerancePolicy(),
            input_shapes=shapes,
            dims=dims,
            input_values=values,
            inputs=how.get("inputs"),
            on_compiled=on_compiled,
            progress=False,
            check_races=True,
        )
    except UserError:
        if "compilation" not in seen:  # refused before code generation: report what it found
            compilation = compile_model(path, options, shapes, dims, True, values)
            record.update(_summary_of(report.build_report(str(path), compilation)))
        raise
    timings = doc["timings"]
    record["times"].update(
        compile=round(sum(timings.get(k, 0.0) for k in ("import", "passes", "codegen")), 3),
        simulate=timings.get("simulate"),
        onnxruntime=timings.get("onnxruntime"),
    )
    errors = [o["max_abs_err"] for o in doc["outputs"] if o["max_abs_err"] is not None]
    record["max_abs_err"] = max(errors) if errors else None
    record.update(_drift_summary(doc["outputs"]))
    failed = [o for o in doc["outputs"] if not o["passed"]]
    checkpoints = [c for c in doc.get("checkpoints", []) if not c["passed"]]
    if doc.get("races"):
        record.update(category="race", reason=one_line(doc["races"][0]["message"]))
    elif checkpoints:
        worst = checkpoints[0]  # the first in graph order
        record.update(
            category="mismatch",
            reason=one_line(
                f"intermediate {worst['name']} (from {worst['op_type']} {worst['producer']}): "
                f"{worst['mismatches']} of {worst['size']} elements outside atol "
                f"{worst['atol']:.3g} + rtol {worst['rtol']:.3g}, max abs err "
                f"{worst['max_abs_err']:.3g}"
            ),
        )
    elif any(o.get("verifiable") is False for o in failed):
        worst = next(o for o in failed if o.get("verifiable") is False)
        record.update(
            category="unverifiable",
            reason=one_line(f"output {worst['name']}: {worst['unverifiable_reason']}"),
        )
    elif failed:
        worst = failed[0]
        record.update(
            category="mismatch",
            reason=one_line(
                f"output {worst['name']}: {worst.get('mismatches')} of {worst.get('size')} "
                f"elements outside atol {worst['atol']:.3g} + rtol {worst['rtol']:.3g}, "
                f"max abs err {worst['max_abs_err']:.3g}"
                + (f" ({len(failed)} outputs fail)" if len(failed) > 1 else "")
            ),
        )


def _drift_summary(outputs: list[dict]) -> dict:
    """The worst drift over a model's float outputs: what its casts cost against fp32."""
    drifts = [o["drift"] for o in outputs if o.get("drift")]
    if not drifts:
        return {"drift_max_abs_err": None, "drift_cosine": None, "drift_r": None}
    ratios = [d["r"] for d in drifts if d["r"] is not None]
    return {
        "drift_max_abs_err": max(d["max_abs_err"] for d in drifts),
        "drift_cosine": min(d["cosine"] for d in drifts),
        "drift_r": max(ratios) if ratios else None,
    }


def _timeout_record(path: Path, seconds: float, quantize: str | None) -> dict:
    record = blank_record(path, quantize)
    record.update(category="timeout", reason=f"stopped after {seconds:g} s")
    record["times"] = {"total": round(seconds, 3)}
    return record


def blank_record(path: Path, quantize: str | None = None) -> dict:
    """A record of a model that did not run (category crash until something better is known)."""
    return {
        "model": model_name(path),
        "path": str(path),
        "quantize": quantize,
        "source": None,
        "family": None,
        "passed": False,
        "verdict": "fail",
        "category": "crash",
        "reason": "",
        "ops": None,
        "op_types": None,
        "convs": None,
        "attention": None,
        "mlp": None,
        "max_abs_err": None,
        "drift_max_abs_err": None,
        "drift_cosine": None,
        "drift_r": None,
        "times": {},
    }


def _child(path: str, report_only: bool, quantize: str | None, conn) -> None:
    try:
        conn.send(run_one(path, report_only, quantize))
    finally:
        conn.close()


def run_guarded(
    path: str,
    report_only: bool = False,
    timeout: float = DEFAULT_TIMEOUT,
    quantize: str | None = None,
) -> dict:
    """`run_one` in a child process: a crash or a hang of the model costs only its record."""
    context = multiprocessing.get_context("fork" if sys.platform == "linux" else "spawn")
    receive, send = context.Pipe(duplex=False)
    process = context.Process(target=_child, args=(path, report_only, quantize, send), daemon=True)
    process.start()
    send.close()
    try:
        if not receive.poll(timeout):
            if process.is_alive():
                process.kill()
                process.join(5)
                return _timeout_record(Path(path), timeout, quantize)
        try:
            return receive.recv()
        except EOFError:
            record = blank_record(Path(path), quantize)
            record["reason"] = _died(process)
            return record
    finally:
        receive.close()
        process.join(5)


def _died(process) -> str:
    process.join(5)
    code = process.exitcode
    if code is not None and code < 0:
        return f"the worker died of signal {-code} (out of memory?)"
    return f"the worker exited with status {code} without a result"
