"""What each `--auto-cast` choice costs in accuracy, per model: the table of docs/autocast.md.

Usage:
    python benchmarks/autocast_table.py                       # the committed zoo (models/*.onnx)
    python benchmarks/autocast_table.py --light               # also the nine light models
    python benchmarks/autocast_table.py --models models/vit.onnx light:resnet50
    python benchmarks/autocast_table.py --light --write docs/autocast.md
    python benchmarks/autocast_table.py --from-json zoo.json light.json --write docs/autocast.md

Each model is validated (seed 0, the validator's random inputs) under six settings: none (fp32),
matmult with bf16 (the default), fp16, tf32 and fp8_e4m3, and all with bf16. Per model and
setting the table gives the drift of the output from plain fp32 onnxruntime — max abs error,
cosine similarity, SNR in dB, R (the machine's distance from fp32 over the emulation's) — and
the verdict against the emulating oracle with its bound and the machine's largest error from
it (the first output when a model has several; `--json` keeps them all); above it, the median
and worst R and cosine per setting over the models. `--write FILE` replaces the part of FILE
between the `<!-- autocast-table:start -->` and `<!-- autocast-table:end -->` markers.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import queue as queue_module
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's onnx2bir, in this process and the workers
sys.path.insert(0, str(ROOT / "models"))
from light import LIGHT_MODELS  # noqa: E402

LIGHT = sorted(LIGHT_MODELS.values())
SETTINGS = [
    ("none", "bf16"),
    ("matmult", "bf16"),
    ("matmult", "fp16"),
    ("matmult", "tf32"),
    ("matmult", "fp8_e4m3"),
    ("all", "bf16"),
]
START, END = "<!-- autocast-table:start -->", "<!-- autocast-table:end -->"


def _resolve(name: str) -> Path:
    if name.startswith("light:"):
        sys.path.insert(0, str(ROOT / "models"))
        from light import light_model_path

        return light_model_path(name.removeprefix("light:"))
    return Path(name)


def _label(auto_cast: str, cast_type: str) -> str:
    return "none" if auto_cast == "none" else f"{auto_cast} {cast_type}"


def _measure(name: str, queue) -> None:
    """Validate one model under every setting (in its own process: memory is returned)."""
    from onnx2bir.errors import MachineError, UserError
    from onnx2bir.options import CompileOptions
    from onnx2bir.runtime.oracle.tolerance import TolerancePolicy
    from onnx2bir.validation.run import run_validate

    rows = []
    for auto_cast, cast_type in SETTINGS:
        row = {"model": name, "setting": _label(auto_cast, cast_type)}
        try:
            options = CompileOptions(auto_cast=auto_cast, auto_cast_type=cast_type)
            doc, _, _ = run_validate(str(_resolve(name)), options, TolerancePolicy())
            row["passed"] = doc["passed"]
            row["outputs"] = [
                {key: entry[key] for key in ("name", "max_abs_err", "atol", "rtol", "bound")}
                | {
                    "passed": entry["passed"],
                    "source": entry["tolerance_source"],
                    "drift": entry["drift"],
                }
                for entry in doc["outputs"]
            ]
            row["checkpoints"] = len(doc["checkpoints"])
        except (UserError, MachineError) as exc:
            row["error"] = str(exc)
        rows.append(row)
    queue.put(rows)


def measure(name: str) -> list[dict]:
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    process = ctx.Process(target=_measure, args=(name, queue))
    process.start()
    while True:
        try:
            rows = queue.get(timeout=5)
            break
        except queue_module.Empty:
            if not process.is_alive():
                error = f"the worker process died (exit code {process.exitcode})"
                rows = [
                    {"model": name, "setting": _label(*setting), "error": error}
                    for setting in SETTINGS
                ]
                break
    process.join()
    return rows


def _fmt(value: float | None, spec: str) -> str:
    if value is None:
        return "-"
    if value != value or value in (float("inf"), float("-inf")):
        return str(value)
    return format(value, spec)


def markdown(rows: list[dict]) -> str:
    lines = [
        "| model | setting | drift: max abs err | cosine | SNR dB | R "
        "| verdict (bound; max error from the oracle) |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        model = Path(row["model"]).stem if not row["model"].startswith("light:") else row["model"]
        if "error" in row:
            lines.append(f"| {model} | {row['setting']} | - | - | - | - | error: {row['error']} |")
            continue
        out = row["outputs"][0]
        drift = out.get("drift") or {}
        verdict = "pass" if out["passed"] else "FAIL"
        lines.append(
            f"| {model} | {row['setting']} | {_fmt(drift.get('max_abs_err'), '.2e')} | "
            f"{_fmt(drift.get('cosine'), '.6f')} | {_fmt(drift.get('snr_db'), '.1f')} | "
            f"{_fmt(drift.get('r'), '.3f')} | {verdict} ({out['bound']} atol "
            f"{_fmt(out['atol'], '.0e')}, rtol {_fmt(out['rtol'], '.0e')}; "
            f"{_fmt(out['max_abs_err'], '.1e')}) |"
        )
    return "\n".join(lines)


def summary(rows: list[dict]) -> str:
    """Median and worst R and cosine per setting, over the models that ran."""
    import statistics

    lines = [
        "| setting | models | median R | worst R | median cosine | worst cosine | pass |",
        "|---|---|---|---|---|---|---|",
    ]
    for setting in [_label(*s) for s in SETTINGS]:
        ran = [r for r in rows if r["setting"] == setting and "outputs" in r]
        drifts = [r["outputs"][0].get("drift") or {} for r in ran]
        ratios = [d["r"] for d in drifts if d.get("r") is not None]
        cosines = [d["cosine"] for d in drifts if d.get("cosine") is not None]
        passed = sum(1 for r in ran if r["passed"])
        lines.append(
            f"| {setting} | {len(ran)} | "
            + (f"{statistics.median(ratios):.3f} | {max(ratios):.3f} | " if ratios else "- | - | ")
            + (
                f"{statistics.median(cosines):.6f} | {min(cosines):.6f} | "
                if cosines
                else "- | - | "
            )
            + f"{passed}/{len(ran)} |"
        )
    return "\n".join(lines)


def write_section(path: Path, table: str) -> None:
    text = path.read_text()
    head, start, rest = text.partition(START)
    _, end, tail = rest.partition(END)
    if not start or not end:
        raise SystemExit(f"{path}: no {START} ... {END} section to replace")
    path.write_text(f"{head}{START}\n{table}\n{END}{tail}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="*", help="model files, or light:NAME")
    parser.add_argument("--light", action="store_true", help="also the nine light models")
    parser.add_argument("--write", metavar="FILE.md", help="replace FILE's table section")
    parser.add_argument("--json", metavar="FILE.json", help="also write every figure as JSON")
    parser.add_argument(
        "--from-json",
        nargs="+",
        metavar="FILE.json",
        help="render the table from figures saved by --json instead of validating",
    )
    args = parser.parse_args(argv)
    if args.from_json:
        rows = [row for path in args.from_json for row in json.loads(Path(path).read_text())]
        table = summary(rows) + "\n\n" + markdown(rows)
        if args.write:
            write_section(Path(args.write), table)
        print(table)
        return 0
    names = args.models or [str(p.relative_to(ROOT)) for p in sorted(ROOT.glob("models/*.onnx"))]
    if args.light:
        names += [f"light:{name}" for name in LIGHT]
    rows = []
    for name in names:
        print(f"{name} ...", file=sys.stderr, flush=True)
        rows += measure(name)
    table = summary(rows) + "\n\n" + markdown(rows)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    if args.write:
        write_section(Path(args.write), table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
