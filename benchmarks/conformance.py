"""ONNX's own conformance suite as the yardstick: `onnx2bir validate` on every case.

The node cases are written from the installed onnx package
(`onnx.backend.test.case.node.collect_testcases()`: a model, its inputs and the outputs numpy
computed); the PyTorch-converted, PyTorch-operator and simple cases are the data onnx ships.
Each case is validated as a user would, `onnx2bir validate model.onnx --inputs
test_data_set_0 --reference test_data_set_0 --json`, in-process in a worker with a time
limit, and onnxruntime is run on the same model and inputs against the suite's expected
outputs (at the case's rtol/atol, the backend runner's rule) so its result stands beside ours.

Outcomes (docs/conformance.md):
  pass       validate exit 0
  mismatch   validate exit 1 with a verdict: a wrong answer (what the suite must never show)
  oracle_deviation
             validate exit 1 with a verdict, but the machine's outputs under `--auto-cast
             none` (no bf16 matmuls) match the suite's expected outputs at the case's
             tolerance: onnxruntime, the oracle, is what differs from the standard
  refused    exit 1 does_not_compile / machine_rejected, with the reason
  bad_input  exit 2 (a valid model called broken: the suite's models are the standard's own)
  crash      exit 3, or the worker died; timeout: over --timeout seconds

    python benchmarks/conformance.py                       # all suites, 2 workers
    python benchmarks/conformance.py --suite node --match 'test_(abs|add)'
    python benchmarks/conformance.py --json /tmp/c.json --md benchmarks/conformance.md
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import io
import json
import multiprocessing
import os
import re
import shutil
import signal
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

SHIPPED_SUITES = ("pytorch-converted", "pytorch-operator", "simple")
ALL_SUITES = ("node", *SHIPPED_SUITES)
DEFAULT_RTOL, DEFAULT_ATOL = 1e-3, 1e-7  # onnx.backend.test's defaults


# --- writing the cases ---------------------------------------------------------------------
def _value_proto(value, value_info: onnx.ValueInfoProto):
    """One input or output as the suite stores it: a tensor, a sequence, an optional or a map."""
    kind = value_info.type.WhichOneof("value")
    if kind == "sequence_type":
        return numpy_helper.from_list(value, value_info.name)
    if kind == "optional_type":
        return numpy_helper.from_optional(value, value_info.name)
    if kind == "map_type":
        return numpy_helper.from_dict(value, value_info.name)
    if isinstance(value, onnx.TensorProto):
        return value
    return numpy_helper.from_array(np.asarray(value), value_info.name)


def write_node_cases(root: Path, match: re.Pattern | None) -> list[Path]:
    """Write the node cases of the installed onnx into root/node/NAME/ (model.onnx and
    test_data_set_0/), with their rtol/atol in case.json; skip those already written."""
    from onnx.backend.test.case import node

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the generators divide by zero on purpose
        cases = node.collect_testcases(None)
    written = []
    for case in cases:
        if match and not match.search(case.name):
            continue
        folder = root / "node" / case.name
        written.append(folder)
        if (folder / "case.json").exists():
            continue
        data_set = folder / "test_data_set_0"
        data_set.mkdir(parents=True, exist_ok=True)
        (folder / "model.onnx").write_bytes(case.model.SerializeToString())
        inputs, outputs = case.data_sets[0]
        for prefix, values, infos in (
            ("input", inputs, case.model.graph.input),
            ("output", outputs, case.model.graph.output),
        ):
            for k, (value, info) in enumerate(zip(values, infos, strict=False)):
                proto = _value_proto(value, info)
                (data_set / f"{prefix}_{k}.pb").write_bytes(proto.SerializeToString())
        (folder / "case.json").write_text(json.dumps({"rtol": case.rtol, "atol": case.atol}))
    return written


def shipped_cases(root: Path, suite: str, match: re.Pattern | None) -> list[Path]:
    """Copy one of the suites onnx ships as data into root/SUITE/."""
    source = Path(onnx.__file__).parent / "backend" / "test" / "data" / suite
    folders = []
    for case in sorted(source.iterdir()):
        if not (case / "model.onnx").exists() or (match and not match.search(case.name)):
            continue
        target = root / suite / case.name
        if not target.exists():
            shutil.copytree(case, target)
        folders.append(target)
    return folders


# --- running one case ----------------------------------------------------------------------
class _Timeout(Exception):
    pass


def _on_alarm(signum, frame):
    raise _Timeout


def _tolerance(folder: Path) -> tuple[float, float]:
    meta = folder / "case.json"
    if meta.exists():
        data = json.loads(meta.read_text())
        return data["rtol"], data["atol"]
    return DEFAULT_RTOL, DEFAULT_ATOL


def _read_values(data_set: Path, prefix: str, infos) -> list:
    """The stored values, read as the value infos they belong to say (tensor, sequence,
    optional or map), as onnx's backend runner reads them."""
    files = sorted(data_set.glob(f"{prefix}_*.pb"), key=lambda p: int(p.stem.split("_")[1]))
    values = []
    for path, info in zip(files, infos, strict=False):
        kind = info.type.WhichOneof("value")
        proto, read = {
            "sequence_type": (onnx.SequenceProto, numpy_helper.to_list),
            "optional_type": (onnx.OptionalProto, numpy_helper.to_optional),
            "map_type": (onnx.MapProto, numpy_helper.to_dict),
        }.get(kind, (onnx.TensorProto, numpy_helper.to_array))
        message = proto()
        message.ParseFromString(path.read_bytes())
        values.append(read(message))
    return values


def _close(actual, expected, rtol: float, atol: float) -> bool:
    """The backend runner's comparison: same dtype kind, allclose with NaNs equal."""
    if isinstance(expected, list):
        return (
            isinstance(actual, list)
            and len(actual) == len(expected)
            and all(_close(a, e, rtol, atol) for a, e in zip(actual, expected, strict=True))
        )
    if expected is None or actual is None:
        return expected is None and actual is None
    actual, expected = np.asarray(actual), np.asarray(expected)
    if actual.shape != expected.shape:
        return False
    if expected.dtype.kind in "OUS":
        return bool(np.array_equal(actual, expected))
    try:
        return bool(
            np.allclose(
                actual.astype(np.float64), expected.astype(np.float64), rtol, atol, equal_nan=True
            )
        )
    except (TypeError, ValueError):
        return bool(np.array_equal(actual, expected))


def onnxruntime_result(folder: Path) -> str:
    """onnxruntime on the case (upgraded as onnx2bir upgrades it), through the oracle's own
    call (which carries bf16, float8 and 4-bit values across onnxruntime's Python API): pass,
    differs or cannot_run."""
    from onnx2bir.frontend.opset_upgrade import upgrade_old_opset
    from onnx2bir.runtime.oracle.ort import run_onnxruntime

    rtol, atol = _tolerance(folder)
    data_set = folder / "test_data_set_0"
    try:
        model = upgrade_old_opset(onnx.load(folder / "model.onnx"))[0]
        declared = [
            i
            for i in model.graph.input
            if i.name not in {init.name for init in model.graph.initializer}
        ]
        inputs = _read_values(data_set, "input", declared)
        names = [i.name for i in declared]
        outputs = [o.name for o in model.graph.output]
        results = run_onnxruntime(model, dict(zip(names, inputs, strict=False)), outputs)
        got = [results[name] for name in outputs]
    except Exception:  # onnxruntime has no kernel, or rejects the model
        return "cannot_run"
    expected = _read_values(data_set, "output", model.graph.output)
    ok = all(_close(g, e, rtol, atol) for g, e in zip(got, expected, strict=False))
    return "pass" if ok and len(got) == len(expected) else "differs"


def validate_case(folder: Path, timeout: float) -> dict:
    """`onnx2bir validate` on one case, in this process: the outcome, exit code and message."""
    from onnx2bir.cli import main

    data_set = folder / "test_data_set_0"
    argv = ["validate", str(folder / "model.onnx"), "--inputs", str(data_set)]
    argv += ["--reference", str(data_set), "--json"]
    out, err = io.StringIO(), io.StringIO()
    start = time.perf_counter()
    signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(argv)
    except _Timeout:
        code = None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    seconds = round(time.perf_counter() - start, 2)
    record = {"exit": code, "seconds": seconds}
    if code is None:
        return {**record, "outcome": "timeout", "message": f"over {timeout:g} s"}
    try:
        doc = json.loads(out.getvalue())
    except json.JSONDecodeError:
        doc = {}
    error = doc.get("error")
    if code == 0:
        return {**record, "outcome": "pass"}
    if error is None and code == 1:
        worst = [o for o in doc.get("outputs", []) if not o.get("passed", True)]
        outcome = "oracle_deviation" if _matches_expected(folder, argv) else "mismatch"
        return {**record, "outcome": outcome, "message": json.dumps(worst)[:400]}
    message = (error or {}).get("message") or err.getvalue().strip()[-400:]
    outcome = {1: "refused", 2: "bad_input"}.get(code, "crash")
    return {**record, "outcome": outcome, "kind": (error or {}).get("kind"), "message": message}


def _matches_expected(folder: Path, argv: list[str]) -> bool:
    """Whether the machine's outputs, validated again with `--auto-cast none` and saved,
    match the suite's expected outputs (by position in the graph's outputs) at the case's
    tolerance."""
    from onnx2bir.cli import main

    saved = Path(tempfile.mkdtemp(prefix="onnx2bir-case-")) / "outputs.npz"
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        main([*argv, "--auto-cast", "none", "--save-outputs", str(saved)])
    if not saved.exists():
        return False
    model = onnx.load(folder / "model.onnx", load_external_data=False)
    expected = _read_values(folder / "test_data_set_0", "output", model.graph.output)
    rtol, atol = _tolerance(folder)
    with np.load(saved) as machine:
        names = [o.name for o in model.graph.output]
        if len(expected) != len(names) or any(name not in machine for name in names):
            return False
        return all(
            _close(machine[name], value, rtol, atol)
            for name, value in zip(names, expected, strict=True)
        )


def run_case(folder: str, timeout: float) -> dict:
    path = Path(folder)
    record = {"suite": path.parent.name, "case": path.name}
    try:
        record |= validate_case(path, timeout)
    except Exception as exc:  # outside the CLI's own handling: the harness's failure
        record |= {"outcome": "crash", "message": repr(exc)[:300]}
    record["onnxruntime"] = onnxruntime_result(path)
    return record


def _run_packed(work: tuple[str, float]) -> dict:
    return run_case(*work)


# --- the tally -----------------------------------------------------------------------------
def refusal_cause(record: dict) -> str:
    """A short cause for a refusal or a bad input: the unsupported op or dtype it names."""
    message = record.get("message") or ""
    found = re.search(r"unsupported ops?[^:]*: ([A-Za-z0-9_.]+)", message)
    if found:
        return f"unsupported op {found.group(1)}"
    dtypes = r"float64|float16|int16|uint\d+|int\d+|string|bool|object|\w*float[48]\w*"
    found = re.search(rf"dtype[^:]*?\b({dtypes})", message)
    if found:
        return f"dtype {found.group(1)}"
    return " ".join(message.split()[:6])


def tally(records: list[dict]) -> dict:
    suites = collections.defaultdict(collections.Counter)
    ort_suites = collections.defaultdict(collections.Counter)
    causes = collections.defaultdict(collections.Counter)
    for r in records:
        group = "node" if r["suite"] == "node" else "pytorch+simple"
        suites[group][r["outcome"]] += 1
        suites[group]["cases"] += 1
        ort_suites[group][r["onnxruntime"]] += 1
        if r["outcome"] in ("refused", "bad_input"):
            causes[r["outcome"]][refusal_cause(r)] += 1
    return {
        "suites": {k: dict(v) for k, v in suites.items()},
        "onnxruntime": {k: dict(v) for k, v in ort_suites.items()},
        "causes": {k: dict(v.most_common()) for k, v in causes.items()},
    }


def markdown(summary: dict, seconds: float) -> str:
    lines = [
        "| suite | cases | pass | refused (exit 1) | bad input (exit 2) | mismatch | "
        "oracle deviation | crash | timeout | onnxruntime pass / differs / cannot run |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for suite, c in summary["suites"].items():
        o = summary["onnxruntime"][suite]
        lines.append(
            f"| {suite} | {c['cases']} | {c.get('pass', 0)} | {c.get('refused', 0)} | "
            f"{c.get('bad_input', 0)} | {c.get('mismatch', 0)} | "
            f"{c.get('oracle_deviation', 0)} | {c.get('crash', 0)} | "
            f"{c.get('timeout', 0)} | {o.get('pass', 0)} / {o.get('differs', 0)} / "
            f"{o.get('cannot_run', 0)} |"
        )
    lines.append(f"\nWall time {seconds:.0f} s.\n")
    for outcome, causes in summary["causes"].items():
        lines.append(f"\n{outcome} by cause:\n")
        lines += [f"- {n} {cause}" for cause, n in causes.items()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--suite", action="append", choices=ALL_SUITES, help="default: all")
    parser.add_argument("--match", help="only cases whose name matches this regex")
    parser.add_argument("--cases", default="/tmp/onnx2bir-conformance", help="where to write")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per case")
    parser.add_argument("--json", help="write every case's record here")
    parser.add_argument("--md", help="write the tally as markdown here")
    args = parser.parse_args(argv)
    match = re.compile(args.match) if args.match else None
    root = Path(args.cases)
    folders: list[Path] = []
    for suite in args.suite or ALL_SUITES:
        if suite == "node":
            folders += write_node_cases(root, match)
        else:
            folders += shipped_cases(root, suite, match)
    start = time.perf_counter()
    records = []
    # A fresh worker every 20 cases keeps memory bounded; a case over --timeout is stopped by
    # an alarm inside its worker.
    context = multiprocessing.get_context("fork")
    with context.Pool(args.jobs, maxtasksperchild=20) as pool:
        work = [(str(f), args.timeout) for f in folders]
        for record in pool.imap_unordered(_run_packed, work, chunksize=1):
            records.append(record)
            if len(records) % 100 == 0:
                print(f"{len(records)}/{len(folders)}", file=sys.stderr, flush=True)
    seconds = time.perf_counter() - start
    records.sort(key=lambda r: (r["suite"], r["case"]))
    summary = tally(records)
    text = markdown(summary, seconds)
    print(text)
    if args.json:
        Path(args.json).write_text(json.dumps({"summary": summary, "cases": records}, indent=1))
    if args.md:
        Path(args.md).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
