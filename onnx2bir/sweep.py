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
"convs": {"matched", "total"}, "attention", "mlp", "max_abs_err", "times": {"compile",
"simulate", "onnxruntime", "total"}}. Categories: export (no model file), unsupported op (an
op without a lowering), codegen refusal (onnx2bir refuses the model: import or code
generation), mismatch (an output outside the tolerance), timeout, crash (the machine rejected
the program, an internal error, or the worker died).

Resumable: with `--json OUT`, models already recorded in OUT are skipped and OUT is rewritten
after every model, so an interrupted sweep continues where it stopped.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from onnx2bir.errors import MachineError, UserError

CATEGORIES = ("export", "unsupported op", "codegen refusal", "mismatch", "timeout", "crash")
DEFAULT_TIMEOUT = 1800.0
META_PREFIX = "onnx2bir.sweep."
_MB = 1 << 20


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
            job = Job(
                item.name.removesuffix(".onnx").removesuffix(".export-error"),
                item,
                item.suffix == ".export-error",
            )
            other = jobs.get(job.name)
            if other is not None and other.path != item:
                if other.export_error != job.export_error:  # a model beats a stale error file
                    if job.export_error:
                        continue
                else:
                    raise UserError(f"two models named {job.name!r}: {other.path} and {item}")
            jobs[job.name] = job
    return sorted(jobs.values(), key=lambda job: job.name)


def memory_estimate(path: Path) -> int:
    """Bytes a validation of the model needs, roughly: the weights are held by onnxruntime, the
    import and the machine's DRAM (about 5 copies), plus 400 MB for the interpreter and
    onnxruntime themselves."""
    size = path.stat().st_size if path.exists() else 0
    return 400 * _MB + 5 * size


def _one_line(text: str, limit: int = 240) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


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


def run_one(path: str, report_only: bool = False) -> dict:
    """Validate (or report) one model; never raises: the record says what happened."""
    job_path = Path(path)
    name = job_path.name.removesuffix(".onnx").removesuffix(".export-error")
    record: dict = {
        "model": name,
        "path": str(job_path),
        "source": None,
        "family": None,
        "passed": False,
        "verdict": "fail",
        "category": None,
        "reason": "",
        "ops": None,
        "op_types": None,
        "convs": None,
        "attention": None,
        "mlp": None,
        "max_abs_err": None,
        "times": {},
    }
    start = time.perf_counter()
    if job_path.suffix == ".export-error":
        record.update(category="export", reason=_one_line(job_path.read_text() or "no reason"))
        return record
    record.update({k: v for k, v in _metadata(job_path).items() if k in ("source", "family")})
    try:
        _run(job_path, report_only, record)
    except MachineError as exc:
        record.update(category="crash", reason=_one_line(f"machine rejected: {exc}"))
    except UserError as exc:
        message = str(exc)
        category = "unsupported op" if message.startswith("unsupported ops") else "codegen refusal"
        record.update(category=category, reason=_one_line(message))
    except Exception as exc:  # an onnx2bir bug: recorded, the sweep goes on
        record.update(category="crash", reason=_one_line(f"{type(exc).__name__}: {exc}"))
    record["times"]["total"] = round(time.perf_counter() - start, 3)
    if record["category"] is None:
        record.update(passed=True, verdict="pass")
    return record


def _run(path: Path, report_only: bool, record: dict) -> None:
    from onnx2bir import report
    from onnx2bir.compiler import compile_model
    from onnx2bir.options import CompileOptions
    from onnx2bir.runtime.tolerance import TolerancePolicy
    from onnx2bir.validation_report import run_validate

    options = CompileOptions()
    if report_only:
        compilation = compile_model(path, options, keep_going=True)
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
            str(path), options, TolerancePolicy(), on_compiled=on_compiled, progress=False
        )
    except UserError:
        if "compilation" not in seen:  # refused before code generation: report what it found
            compilation = compile_model(path, options, keep_going=True)
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
    failed = [o for o in doc["outputs"] if not o["passed"]]
    if failed:
        worst = failed[0]
        record.update(
            category="mismatch",
            reason=_one_line(
                f"output {worst['name']}: {worst.get('mismatches')} of {worst.get('size')} "
                f"elements outside atol {worst['atol']:.3g} + rtol {worst['rtol']:.3g}, "
                f"max abs err {worst['max_abs_err']:.3g}"
                + (f" ({len(failed)} outputs fail)" if len(failed) > 1 else "")
            ),
        )


def _timeout_record(job: Job, seconds: float) -> dict:
    record = run_stub(job)
    record.update(category="timeout", reason=f"stopped after {seconds:g} s")
    record["times"] = {"total": round(seconds, 3)}
    return record


def run_stub(job: Job) -> dict:
    return {
        "model": job.name,
        "path": str(job.path),
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
        "times": {},
    }


# --- local processes ---------------------------------------------------------------------------


def _child(path: str, report_only: bool, conn) -> None:
    try:
        conn.send(run_one(path, report_only))
    finally:
        conn.close()


def run_guarded(path: str, report_only: bool = False, timeout: float = DEFAULT_TIMEOUT) -> dict:
    """`run_one` in a child process: a crash or a hang of the model costs only its record."""
    name = Path(path).name.removesuffix(".onnx").removesuffix(".export-error")
    job = Job(name, Path(path), False)
    context = multiprocessing.get_context("fork" if sys.platform == "linux" else "spawn")
    receive, send = context.Pipe(duplex=False)
    process = context.Process(target=_child, args=(path, report_only, send), daemon=True)
    process.start()
    send.close()
    try:
        if not receive.poll(timeout):
            if process.is_alive():
                process.kill()
                process.join(5)
                return _timeout_record(job, timeout)
        try:
            return receive.recv()
        except EOFError:
            record = run_stub(job)
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


def run_local(
    jobs: list[Job], workers: int, report_only: bool, timeout: float, done: Callable[[dict], None]
) -> None:
    """At most `workers` models at a time, each in its own process; `done(record)` in order of
    completion, on this thread."""
    from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = {
            pool.submit(run_guarded, str(job.path), report_only, timeout): job for job in jobs
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
) -> None:
    """Each model a Ray task asking for one CPU and its memory estimate (`memory_estimate`);
    the task runs the model in a child process with the timeout, as locally."""
    try:
        import ray
    except ImportError as exc:
        raise UserError("--ray needs Ray: pip install 'onnx2bir[ray]'") from exc
    if not ray.is_initialized():
        try:
            ray.init(address=address or None, log_to_driver=False)
        except Exception as exc:
            raise UserError(f"--ray: cannot start or reach Ray ({_one_line(str(exc))})") from exc
    task = ray.remote(run_guarded)
    refs = {
        task.options(num_cpus=1, memory=memory_estimate(job.path), max_retries=0).remote(
            str(job.path), report_only, timeout
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
                record = run_stub(job)
                record["reason"] = _one_line(f"Ray task failed: {type(exc).__name__}: {exc}")
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
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(json.dumps({"summary": summary, "models": records}, indent=1) + "\n")
    os.replace(temporary, path)


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
) -> tuple[list[dict], dict]:
    """Run the sweep; returns every record (resumed ones included, in name order) and the
    summary. Writes `json_out` after each model and `md_out` at the end."""
    from onnx2bir.sweep_table import markdown

    if jobs < 1:
        raise UserError(f"--jobs {jobs}: must be at least 1")
    if timeout <= 0:
        raise UserError(f"--timeout {timeout:g}: must be > 0")
    todo = collect(paths)
    if not todo:
        raise UserError(f"no .onnx models in {', '.join(map(str, paths))}")
    for out in (json_out, md_out):
        if out is not None and not out.parent.is_dir():
            raise UserError(f"{out}: the folder {out.parent} does not exist")
    previous = read_json(json_out) if json_out else []
    names = {job.name for job in todo}
    records = {r["model"]: r for r in previous if r.get("model") in names}
    todo = [job for job in todo if job.name not in records]
    bar = Progress(len(todo), enabled=progress)
    start = time.monotonic()

    def done(record: dict) -> None:
        records[record["model"]] = record
        bar.update(record)
        if json_out:
            ordered = [records[n] for n in sorted(records)]
            write_json(json_out, ordered, summarize(ordered))

    if todo:
        if use_ray:
            run_ray(todo, ray_address, report_only, timeout, done)
        else:
            run_local(todo, jobs, report_only, timeout, done)
    ordered = [records[n] for n in sorted(records)]
    summary = summarize(ordered, time.monotonic() - start)
    summary["report_only"] = report_only
    if json_out:
        write_json(json_out, ordered, summary)
    if md_out:
        temporary = md_out.with_name(f".{md_out.name}.tmp")
        temporary.write_text(markdown(ordered, summary))
        os.replace(temporary, md_out)
    return ordered, summary


def format_summary(records: list[dict], summary: dict) -> str:
    """The lines `onnx2bir sweep` prints: the verdict, then each failure with its reason."""
    rate = summary["pass_rate"]
    lines = [
        f"{'PASS' if summary['failed'] == 0 else 'FAIL'}  {summary['passed']}/{summary['models']}"
        f" models {'compile' if summary.get('report_only') else 'validate'}"
        + (f" ({100 * rate:.1f}%)" if rate is not None else "")
        + (f" in {summary['wall_seconds']:.1f}s" if summary.get("wall_seconds") else "")
    ]
    for category, count in sorted(summary["by_category"].items()):
        lines.append(f"  {category}: {count}")
    for record in records:
        if not record["passed"]:
            lines.append(f"  {record['model']}: {record['category']}: {record['reason']}")
    return "\n".join(lines)


# --- command line (registered by onnx2bir.cli) -------------------------------------------------


def add_parser(commands) -> None:
    parser = commands.add_parser(
        "sweep",
        help="validate (or only report) many models, in parallel and resumably",
        description="Validate every model under PATH... (folders give their *.onnx and "
        "*.export-error files) and summarise the failures by category: export, unsupported "
        "op, codegen refusal, mismatch, timeout, crash. Exit 0: every model passed; 1: some "
        "did not; 2: bad input.",
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
        type=Path,
        metavar="OUT",
        help="write the records as JSON; models already in OUT are skipped (resume)",
    )
    parser.add_argument("--md", type=Path, metavar="OUT", help="write a Markdown table")
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
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")


def cmd_sweep(args) -> int:
    records, summary = sweep(
        args.paths,
        jobs=args.jobs,
        use_ray=args.ray is not None,
        ray_address=args.ray or None,
        json_out=args.json,
        md_out=args.md,
        report_only=args.report_only,
        timeout=args.timeout,
        progress=not args.no_progress,
    )
    print(format_summary(records, summary))
    return 0 if summary["failed"] == 0 else 1
