"""`onnx2bir sweep`: validate (or only report) many models, in parallel, resumably.

In: paths of ONNX models or folders (a folder contributes its `*.onnx`, and its
`*.export-error` files: one line saying why a model could not be exported, written by an
export script in place of the model). Out: one record per model and a summary; `--json`
writes them, `--md` a Markdown table (docs/zoo.md is one).

Each model runs in its own process (a crash or a hang takes only that model down): local
processes by default (`--jobs N`), or Ray tasks with `--ray [ADDRESS]` (each task asks for one
CPU and for the model's memory estimate, `memory_estimate`, so a cluster schedules the zoo by
memory). A model that takes longer than `--timeout` seconds is stopped.

Record (JSON): {"model", "path", "source", "family", "passed", "verdict" ("pass" or "fail"),
"category" (null or one of CATEGORIES), "reason" (one line), "ops" (node count), "op_types",
"convs": {"matched", "total"}, "attention", "mlp", "max_abs_err" (against the emulating
oracle), "drift_max_abs_err", "drift_cosine", "drift_r" (the worst over the outputs, against
plain fp32 onnxruntime), "times": {"compile", "simulate", "onnxruntime", "total"}}. A
validation checks races too (`--check-races`). Categories: export (no model file), unsupported
op (an op without a lowering), codegen refusal (onnx2bir refuses the model: import or code
generation), mismatch (an output or a checked intermediate outside its bound), unverifiable
(an output whose bound cannot tell the answer from zeros), race, timeout, crash (the machine
rejected the program, an internal error, or the worker died).

Resumable: with `--json OUT`, models already recorded in OUT are skipped (except an export
failure whose model file now exists) and OUT is rewritten after every model, so an interrupted
sweep continues where it stopped. With `--merge`, the rows of an existing `--md` page for models
not in this sweep are kept (by name), and so are the records of `--json OUT`, so sweeping a
few models updates the page without dropping the rest; each record says the day it was
measured ("measured", UTC).

With `--quantize VARIANT` (qdq, qop, dynamic, int4), each model is first quantized by
onnxruntime's own tool in its worker (`onnx2bir.sweep.quantize`, seeded calibration) and the
quantized model is validated; the record says the variant ("quantize"), and a model the
quantizer fails on gets the category quantize with the quantizer's message. A JSON or page to
resume or merge must hold records of the same variant.
"""

from __future__ import annotations

import datetime
import json
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from onnx2bir import output_paths
from onnx2bir.errors import UserError
from onnx2bir.sweep.model import (
    DEFAULT_TIMEOUT,
    blank_record,
    memory_estimate,
    model_name,
    one_line,
    run_guarded,
    run_one,
)
from onnx2bir.sweep.quantize import VARIANTS as QUANTIZE_VARIANTS

CATEGORIES = (
    "export",
    "quantize",
    "unsupported op",
    "codegen refusal",
    "mismatch",
    "unverifiable",
    "race",
    "timeout",
    "crash",
)
__all__ = ["CATEGORIES", "collect", "memory_estimate", "run_guarded", "run_one", "sweep"]


@dataclass(frozen=True, slots=True)
class Job:
    name: str
    path: Path
    export_error: bool  # the path is an .export-error file, not a model


def collect(paths: Iterable[str | Path]) -> list[Job]:
    """The models named by `paths` (folders expanded), by name; a name seen twice is an error."""
    jobs: dict[str, Job] = {}
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found = sorted([*path.glob("*.onnx"), *path.glob("*.export-error")])
        elif path.is_file():
            found = [path]
        else:
            raise UserError(f"{path}: no such file or folder")
        for item in found:
            job = Job(model_name(item), item, item.suffix == ".export-error")
            other = jobs.get(job.name)
            if other is not None and other.path != item:
                if other.export_error != job.export_error:  # a model beats a stale error file
                    if job.export_error:
                        continue
                else:
                    raise UserError(f"two models named {job.name!r}: {other.path} and {item}")
            jobs[job.name] = job
    return sorted(jobs.values(), key=lambda job: job.name)


def run_local(
    jobs: list[Job],
    workers: int,
    report_only: bool,
    timeout: float,
    done: Callable[[dict], None],
    quantize: str | None = None,
) -> None:
    """At most `workers` models at a time, each in its own process; `done(record)` in order of
    completion, on this thread."""
    from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = {
            pool.submit(run_guarded, str(job.path), report_only, timeout, quantize): job
            for job in jobs
        }
        pending = set(futures)
        while pending:
            finished, pending = wait(pending, return_when=FIRST_COMPLETED)
            for future in finished:
                done(future.result())


# --- Ray ---------------------------------------------------------------------------------------


def run_ray(
    jobs: list[Job],
    address: str | None,
    report_only: bool,
    timeout: float,
    done: Callable[[dict], None],
    quantize: str | None = None,
) -> None:
    """Each model a Ray task asking for one CPU and its memory estimate (`memory_estimate`);
    the task runs the model in a child process with the timeout, as locally."""
    from onnx2bir.ray_cluster import connect

    ray = connect(address)
    task = ray.remote(run_guarded)
    refs = {
        task.options(num_cpus=1, memory=memory_estimate(job.path), max_retries=0).remote(
            str(job.path), report_only, timeout, quantize
        ): job
        for job in jobs
    }
    while refs:
        ready, _ = ray.wait(list(refs), num_returns=1)
        for ref in ready:
            job = refs.pop(ref)
            try:
                record = ray.get(ref)
            except Exception as exc:  # the task's worker died
                record = blank_record(job.path, quantize)
                record["reason"] = one_line(f"Ray task failed: {type(exc).__name__}: {exc}")
            done(record)


# --- progress, output --------------------------------------------------------------------------


class Progress:
    """One redrawn line on a terminal, one line per finished model otherwise."""

    def __init__(self, total: int, stream: TextIO | None = None, enabled: bool = True) -> None:
        self.total, self.count = total, 0
        self.counts: Counter = Counter()
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.tty = enabled and self.stream.isatty()
        self.start = time.monotonic()

    def update(self, record: dict) -> None:
        self.count += 1
        self.counts[record["verdict"]] += 1
        if not self.enabled:
            return
        filled = int(30 * self.count / max(1, self.total))
        bar = "#" * filled + "." * (30 - filled)
        what = record["model"] if record["passed"] else f"{record['model']} ({record['category']})"
        line = (
            f"sweep [{bar}] {self.count}/{self.total} pass {self.counts['pass']} "
            f"fail {self.counts['fail']} {time.monotonic() - self.start:.0f}s  {what}"
        )
        if self.tty:
            self.stream.write("\r" + line[:150].ljust(150))
            if self.count == self.total:
                self.stream.write("\n")
        else:
            self.stream.write(line + "\n")
        self.stream.flush()


def summarize(records: list[dict], wall_seconds: float | None = None) -> dict:
    passed = sum(1 for r in records if r["passed"])
    return {
        "models": len(records),
        "passed": passed,
        "failed": len(records) - passed,
        "pass_rate": round(passed / len(records), 4) if records else None,
        "by_category": dict(Counter(r["category"] for r in records if r["category"])),
        "wall_seconds": None if wall_seconds is None else round(wall_seconds, 2),
    }


def write_json(path: Path, records: list[dict], summary: dict) -> None:
    text = json.dumps({"summary": summary, "models": records}, indent=1) + "\n"
    output_paths.replace_file(path, lambda tmp: tmp.write_text(text))


def read_json(path: Path) -> list[dict]:
    if not path.exists():
        return []
    try:
        doc = json.loads(path.read_text())
        return list(doc["models"])
    except (ValueError, KeyError, TypeError) as exc:
        raise UserError(f"{path}: not a sweep result to resume from ({exc})") from exc


def sweep(
    paths: list[str],
    *,
    jobs: int = 1,
    ray_address: str | None = None,
    use_ray: bool = False,
    json_out: Path | None = None,
    md_out: Path | None = None,
    report_only: bool = False,
    timeout: float = DEFAULT_TIMEOUT,
    progress: bool = True,
    merge: bool = False,
    quantize: str | None = None,
) -> tuple[list[dict], dict]:
    """Run the sweep; returns every record (resumed ones included, in name order) and the
    summary. Writes `json_out` after each model and `md_out` at the end; with `merge`, both
    also keep what they held for models not in `paths` (the JSON's record, else the page's
    row). With `quantize`, each model is first quantized that way (module docstring)."""
    from onnx2bir.sweep.quantize import VARIANTS, onnx_ir_missing
    from onnx2bir.sweep.table import markdown, parse

    if merge and md_out is None and json_out is None:
        raise UserError("--merge keeps the other models of --json OUT or --md OUT: give one")

    if jobs < 1:
        raise UserError(f"--jobs {jobs}: must be at least 1")
    if not 0 < timeout < float("inf"):
        raise UserError(f"--timeout {timeout:g}: must be a finite number > 0")
    if quantize is not None and quantize not in VARIANTS:
        raise UserError(f"--quantize {quantize}: not one of {', '.join(VARIANTS)}")
    if quantize == "int4" and onnx_ir_missing():
        raise UserError(onnx_ir_missing())
    todo = collect(paths)
    if not todo:
        raise UserError(f"no .onnx models in {', '.join(map(str, paths))}")
    for out, flag in ((json_out, "--json"), (md_out, "--md")):
        if out is not None:
            output_paths.check_file(out, flag)
    previous = read_json(json_out) if json_out else []
    _same_variant(previous, quantize, json_out)
    by_name = {job.name: job for job in todo}
    # A recorded export failure is stale once the model file exists: run that model.
    records = {
        r["model"]: r
        for r in previous
        if r.get("model") in by_name
        and not (r.get("category") == "export" and not by_name[r["model"]].export_error)
    }
    todo = [job for job in todo if job.name not in records]
    kept: dict[str, dict] = {}  # with merge: models of the outputs that this sweep leaves
    if merge:
        if md_out is not None and md_out.exists():
            kept = {r["model"]: r for r in parse(md_out.read_text(), str(md_out))}
            _same_variant(list(kept.values()), quantize, md_out)
        kept.update((r["model"], r) for r in previous if r.get("model"))
        kept = {name: r for name, r in kept.items() if name not in by_name}
    today = datetime.datetime.now(datetime.UTC).date().isoformat()
    bar = Progress(len(todo), enabled=progress)
    start = time.monotonic()

    def done(record: dict) -> None:
        record.setdefault("measured", today)
        records[record["model"]] = record
        bar.update(record)
        if json_out:
            every = sorted([*records.values(), *kept.values()], key=lambda r: r["model"])
            write_json(json_out, every, summarize(every))

    if todo:
        if use_ray:
            run_ray(todo, ray_address, report_only, timeout, done, quantize)
        else:
            run_local(todo, jobs, report_only, timeout, done, quantize)
    ordered = [records[n] for n in sorted(records)]
    summary = summarize(ordered, time.monotonic() - start)
    summary.update(report_only=report_only, quantize=quantize)
    every = sorted([*ordered, *kept.values()], key=lambda r: r["model"])
    whole = summarize(every, summary["wall_seconds"])
    whole.update(report_only=report_only, quantize=quantize)
    if json_out:
        write_json(json_out, every, whole)
    if md_out:
        table = markdown(every, whole)
        output_paths.replace_file(md_out, lambda tmp: tmp.write_text(table))
    return ordered, summary


def _same_variant(records: list[dict], quantize: str | None, where: Path | None) -> None:
    """Records to resume from or to keep must be of this sweep's quantization variant."""
    other = {r.get("quantize") for r in records} - {quantize}
    if other:
        made = ", ".join(sorted(_variant_flag(v) for v in other))
        raise UserError(
            f"{where} holds records made with {made}, this sweep runs with "
            f"{_variant_flag(quantize)}: give another output file"
        )


def _variant_flag(variant: str | None) -> str:
    return f"--quantize {variant}" if variant else "no --quantize"


def format_summary(records: list[dict], summary: dict) -> str:
    """The lines `onnx2bir sweep` prints: the verdict, then each failure with its reason."""
    rate = summary["pass_rate"]
    lines = [
        f"{'PASS' if summary['failed'] == 0 else 'FAIL'}  {summary['passed']}/{summary['models']}"
        f" models {'compile' if summary.get('report_only') else 'validate'}"
        + (f" ({100 * rate:.1f}%)" if rate is not None else "")
        + (f" in {summary['wall_seconds']:.1f}s" if summary.get("wall_seconds") else "")
        + (
            f", each quantized by onnxruntime ({summary['quantize']})"
            if summary.get("quantize")
            else ""
        )
    ]
    for category, count in sorted(summary["by_category"].items()):
        lines.append(f"  {category}: {count}")
    for record in records:
        if not record["passed"]:
            lines.append(f"  {record['model']}: {record['category']}: {record['reason']}")
    return "\n".join(lines)


# --- command line (registered by onnx2bir.cli.commands) ------------------------------------


def add_parser(commands) -> None:
    parser = commands.add_parser(
        "sweep",
        help="validate (or only report) many models, in parallel and resumably",
        description="Validate every model under PATH... (folders give their *.onnx and "
        "*.export-error files) and summarise the failures by category: export, quantize, "
        "unsupported op, codegen refusal, mismatch, unverifiable, race, timeout, crash. Exit 0: "
        "every model passed; 1: some did not; 2: bad input.",
    )
    parser.add_argument("paths", nargs="+", metavar="PATH", help="ONNX models or folders")
    parser.add_argument(
        "--jobs", type=int, default=1, metavar="N", help="models at a time (default 1)"
    )
    parser.add_argument(
        "--ray",
        nargs="?",
        const="",
        default=None,
        metavar="ADDRESS",
        help="run each model as a Ray task (a local Ray instance without ADDRESS); needs the "
        "extra onnx2bir[ray]",
    )
    parser.add_argument(
        "--json",
        nargs="?",
        const=True,
        default=None,
        metavar="OUT",
        help="print the summary as one JSON document on stdout, as every command does; with "
        "OUT also write the records there, and skip the models already in OUT (resume)",
    )
    parser.add_argument("--md", type=Path, metavar="OUT", help="write a Markdown table")
    parser.add_argument(
        "--merge",
        action="store_true",
        help="keep what --md OUT and --json OUT hold for models not in this sweep (by name)",
    )
    parser.add_argument(
        "--report-only", action="store_true", help="compile and report only, no simulation"
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT,
        metavar="SECONDS",
        help="stop a model after this long (default %(default)g)",
    )
    parser.add_argument(
        "--quantize",
        choices=QUANTIZE_VARIANTS,
        metavar="{" + ",".join(QUANTIZE_VARIANTS) + "}",
        help="first quantize each model with onnxruntime's tool: QDQ, QOperator, dynamic, or "
        "4-bit MatMul weights (int4 needs the onnx_ir package); seeded calibration",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")


def cmd_sweep(args) -> int:
    json_out = Path(args.json) if isinstance(args.json, str) else None
    records, summary = sweep(
        args.paths,
        jobs=args.jobs,
        use_ray=args.ray is not None,
        ray_address=args.ray or None,
        json_out=json_out,
        md_out=args.md,
        report_only=args.report_only,
        timeout=args.timeout,
        progress=not args.no_progress and not args.json,
        merge=args.merge,
        quantize=args.quantize,
    )
    if args.json:
        print(json.dumps({"summary": summary, "models": records}, indent=1))
    else:
        print(format_summary(records, summary))
    return 0 if summary["failed"] == 0 else 1
