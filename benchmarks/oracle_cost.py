"""What the verdict costs beside the run: `validate`'s oracle against its simulation, per model.

Usage:
    python benchmarks/oracle_cost.py --scaling          # the four models, 3 runs; 5k, 10k chains
    python benchmarks/oracle_cost.py --models resnet50 chain:5000 --repeat 1
    python benchmarks/oracle_cost.py --scaling --json benchmarks/oracle_cost.json \
        --before benchmarks/oracle_cost_before.json --markdown benchmarks/oracle_cost.md
    python benchmarks/oracle_cost.py --from-json benchmarks/oracle_cost.json \
        --before benchmarks/oracle_cost_before.json

Each model is validated `--repeat` times in one process with `onnx2bir.validate`, the function
the command line calls, and the table gives the medians of the document's own `timings`:
`simulate` (the machine running the BIR), `emulating_oracle` (every onnxruntime session of the
emulating oracle, its probe feeding, the comparisons of every output and checkpoint, the
import-rewrite check) and `onnxruntime` (the plain fp32 run that drift is measured against).
The breakdown comes from wrapping, in this process only:

- `onnxruntime.InferenceSession`: each session's creation and its runs, labelled by who made it
  (the weights' roundings, the plain emulation, the emulation resynchronised at the probes,
  the plain fp32 run, the import-rewrite check);
- the emulating oracle's runs (`validation.run.oracle_runner`): what they spend beside their
  sessions is building the emulating model and serialising it (`model`);
- `runtime/oracle/verdict.py`'s `compare_output`, `check_narrow`, `with_allowance` and `drift`:
  the comparisons (`compare`); what `emulating_oracle` leaves beside sessions, models and
  comparisons is bookkeeping (`other`).

The models:

- `resnet50`: light resnet50 with seeded random weights (`models/light.py`), 1x3x224x224;
- `bert12`: BERT with hidden 256, 12 layers, sequence 128 (`models/bert_depth.py 12`, an export
  made with torch; a missing export is reported, not made);
- `ocr640`: PP-OCRv4's text detector (DBNet on a PP-LCNet backbone, 1x3x640x640) as rapidocr
  ships it, fed its synthetic page (`python models/shipped.py` extracts it);
- `chain:N`: an elementwise chain of N nodes (Mul, Add, Relu in turn on a 128x64 tensor) built
  here; the default runs 20,000 nodes, and `--scaling` adds 5,000 and 10,000 for the growth.

The cores are shared with whatever else runs: read the ratios, and the load average printed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's onnx2bir, not an installed one
sys.path.insert(0, str(ROOT / "models"))

DEFAULT_MODELS = ["resnet50", "bert12", "ocr640", "chain:20000"]
SCALING = [5000, 10000, 20000]
CHAIN_SHAPE = (128, 64)
SESSION_LABELS = (
    "weights' roundings",
    "plain emulation",
    "resynchronised emulation",
    "plain fp32",
    "import rewrite check",
)


# --- the models ------------------------------------------------------------------------------
def chain_model(nodes: int, folder: Path) -> Path:
    """In: a node count. Out: the path of an elementwise chain of that many nodes (y = Relu(x ·
    0.75 + 0.25) repeated; its values stay near 1), written into `folder`."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    steps = [("Mul", ["scale"]), ("Add", ["shift"]), ("Relu", [])]
    made, previous = [], "x"
    for index in range(nodes):
        op_type, constants = steps[index % len(steps)]
        output = "y" if index == nodes - 1 else f"t{index}"
        made.append(helper.make_node(op_type, [previous, *constants], [output], name=f"n{index}"))
        previous = output
    graph = helper.make_graph(
        made,
        f"chain{nodes}",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(CHAIN_SHAPE))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(CHAIN_SHAPE))],
        [
            numpy_helper.from_array(np.array(0.75, np.float32), "scale"),
            numpy_helper.from_array(np.array(0.25, np.float32), "shift"),
        ],
    )
    path = folder / f"chain{nodes}.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def resolve(name: str, folder: Path) -> tuple[Path, dict]:
    """In: a model name of the module docstring. Out: its path and validate's keywords."""
    if name == "resnet50":
        from light import light_model_path

        return light_model_path("resnet50"), {}
    if name == "bert12":
        from bert_depth import path_of

        path = path_of(12)
        if not path.exists():
            raise FileNotFoundError(f"{path.name} not exported: run models/bert_depth.py 12")
        return path, {}
    if name == "ocr640":
        shipped = ROOT / "models" / ".cache" / "shipped"
        path = shipped / "ppocrv4_det.onnx"
        if not path.exists():
            raise FileNotFoundError(f"{path.name} not extracted: run models/shipped.py")
        inputs = shipped / "ppocrv4_det.inputs.npz"
        return path, {"input_shapes": {"x": (1, 3, 640, 640)}, "inputs": str(inputs)}
    if name.startswith("chain:"):
        return chain_model(int(name.removeprefix("chain:")), folder), {}
    return Path(name), {}


# --- the breakdown ---------------------------------------------------------------------------
class Breakdown:
    """Seconds spent, by what, while the wrappers of `instrument` are in place."""

    def __init__(self):
        self.seconds: dict[str, float] = defaultdict(float)
        self.labels: list[str] = []
        self.emulation_runs = 0

    def label(self) -> str:
        return self.labels[-1] if self.labels else "other session"

    @contextlib.contextmanager
    def within(self, label: str):
        self.labels.append(label)
        try:
            yield
        finally:
            self.labels.pop()

    @contextlib.contextmanager
    def timed(self, key: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[key] += time.perf_counter() - start


def instrument(breakdown: Breakdown) -> None:
    """Wrap onnxruntime's sessions, the oracle's runs and the verdict's comparisons (module
    docstring) so that `breakdown` adds up their time."""
    import onnxruntime

    from onnx2bir.runtime.oracle import ort, verdict
    from onnx2bir.validation import run

    base = onnxruntime.InferenceSession

    class TimedSession(base):
        def __init__(self, *args, **kwargs):
            self._label = breakdown.label()
            with breakdown.timed(f"session {self._label}: build"):
                super().__init__(*args, **kwargs)

        def run(self, *args, **kwargs):
            with breakdown.timed(f"session {self._label}: run"):
                return super().run(*args, **kwargs)

    onnxruntime.InferenceSession = TimedSession  # what `ort.onnxruntime_session` makes

    def labelled(function, label_of):
        def wrapper(*args, **kwargs):
            with breakdown.within(label_of()):
                return function(*args, **kwargs)

        return wrapper

    original_runner = run.oracle_runner

    def oracle_runner(*args, **kwargs):
        runner = original_runner(*args, **kwargs)

        def timed_runner(*a, **k):
            breakdown.emulation_runs += 1
            first = breakdown.emulation_runs == 1
            label = "plain emulation" if first else "resynchronised emulation"
            with breakdown.within(label), breakdown.timed("oracle runs"):
                return runner(*a, **k)

        return timed_runner

    run.oracle_runner = oracle_runner
    run.round_weights = labelled(run.round_weights, lambda: "weights' roundings")
    run._import_rewrite_check = labelled(run._import_rewrite_check, lambda: "import rewrite check")
    plain_run = ort.run_onnxruntime

    def run_onnxruntime(*args, **kwargs):
        label = "plain fp32" if not breakdown.labels else breakdown.label()
        with breakdown.within(label):
            return plain_run(*args, **kwargs)

    ort.run_onnxruntime = run_onnxruntime  # validate's `oracle.run_onnxruntime`
    for name in ("compare_output", "check_narrow", "with_allowance", "drift"):
        if hasattr(verdict, name):  # with_allowance: before compare_output took the allowance
            setattr(verdict, name, _timed_comparison(breakdown, name, getattr(verdict, name)))


def _timed_comparison(breakdown: Breakdown, name: str, function):
    """`function` timed as a comparison; one called inside another (check_narrow's
    compare_output) counts once, for the outer."""

    def wrapper(*args, **kwargs):
        if breakdown.labels and breakdown.labels[-1] == "compare":
            return function(*args, **kwargs)
        with breakdown.within("compare"), breakdown.timed(f"compare: {name}"):
            return function(*args, **kwargs)

    return wrapper


def measure_once(name: str, folder: Path, breakdown: Breakdown) -> dict:
    """One validate of `name`: its timings, the breakdown's seconds, and its verdict."""
    import onnx2bir

    path, keywords = resolve(name, folder)
    breakdown.seconds.clear()
    breakdown.emulation_runs = 0
    start = time.perf_counter()
    result = onnx2bir.validate(str(path), **keywords)
    wall = time.perf_counter() - start
    doc = result.document
    timings = doc["timings"]
    seconds = dict(breakdown.seconds)
    oracle_sessions = sum(
        value
        for key, value in seconds.items()
        if key.startswith("session ") and not key.startswith("session plain fp32")
    )
    runner_sessions = sum(
        value
        for key, value in seconds.items()
        if key.startswith(("session plain emulation", "session resynchronised", "session weights"))
    )
    seconds["model"] = seconds.get("oracle runs", 0.0) - runner_sessions
    seconds["compare"] = sum(v for k, v in seconds.items() if k.startswith("compare: "))
    seconds["other"] = timings["emulating_oracle"] - (
        oracle_sessions + seconds["model"] + seconds["compare"]
    )
    return {
        "model": name,
        "wall": wall,
        "simulate": timings["simulate"],
        "emulating_oracle": timings["emulating_oracle"],
        "onnxruntime": timings["onnxruntime"],
        "codegen": timings.get("codegen", 0.0),
        "seconds": seconds,
        "passed": doc["passed"],
        "checkpoints": len(doc["checkpoints"]),
        "emulation_runs": breakdown.emulation_runs,
    }


def measure(name: str, repeat: int, folder: Path, breakdown: Breakdown) -> dict:
    """The medians of `repeat` validates of `name` (module docstring)."""
    runs = [measure_once(name, folder, breakdown) for _ in range(repeat)]
    keys = sorted({key for run in runs for key in run["seconds"]})
    row = {
        key: statistics.median(run[key] for run in runs)
        for key in ("wall", "simulate", "emulating_oracle", "onnxruntime", "codegen")
    }
    row["seconds"] = {
        key: statistics.median(run["seconds"].get(key, 0.0) for run in runs) for key in keys
    }
    row.update(
        model=name,
        runs=len(runs),
        passed=[run["passed"] for run in runs],
        checkpoints=runs[0]["checkpoints"],
        emulation_runs=runs[0]["emulation_runs"],
    )
    return row


# --- the tables ------------------------------------------------------------------------------
def _ratio(part: float, whole: float) -> str:
    return f"{part / whole:.2f}" if whole else "–"


def _session_cell(seconds: dict, label: str) -> str:
    build = seconds.get(f"session {label}: build")
    run = seconds.get(f"session {label}: run")
    if build is None and run is None:
        return "–"
    return f"{build or 0.0:.2f} / {run or 0.0:.2f}"


def table(rows: list[dict]) -> str:
    """The medians: simulate, oracle, ratios, and where the oracle's time goes."""
    labels = [label for label in SESSION_LABELS if any(_has(row, label) for row in rows)]
    head = (
        "| model | checkpoints | simulate s | oracle s | **oracle / simulate** "
        "| fp32 ORT s | (oracle + fp32) / simulate | "
        + " | ".join(f"{label} build / run s" for label in labels)
        + " | model building s | comparisons s | other s | verdict |"
    )
    lines = [head, "|---|" + "---:|" * (7 + len(labels) + 3) + "---|"]
    for row in rows:
        if "error" in row:
            lines.append(f"| {row['model']} | error: {row['error']} |")
            continue
        s = row["seconds"]
        sessions = " | ".join(_session_cell(s, label) for label in labels)
        verdict = "PASS" if all(row["passed"]) else "FAIL"
        lines.append(
            f"| {row['model']} | {row['checkpoints']} | {row['simulate']:.2f} | "
            f"{row['emulating_oracle']:.2f} | "
            f"**{_ratio(row['emulating_oracle'], row['simulate'])}** | {row['onnxruntime']:.2f} | "
            f"{_ratio(row['emulating_oracle'] + row['onnxruntime'], row['simulate'])} | "
            f"{sessions} | {s.get('model', 0.0):.2f} | {s.get('compare', 0.0):.2f} | "
            f"{s.get('other', 0.0):.2f} | {verdict} |"
        )
    return "\n".join(lines)


def _has(row: dict, label: str) -> bool:
    return "seconds" in row and any(k.startswith(f"session {label}:") for k in row["seconds"])


def scaling_table(rows: list[dict]) -> str:
    """The chain's validate against its node count: wall, simulate, oracle, per node."""
    chains = sorted(
        (int(row["model"].removeprefix("chain:")), row)
        for row in rows
        if row["model"].startswith("chain:") and "error" not in row
    )
    if len(chains) < 2:
        return ""
    lines = [
        "| nodes | validate wall s | codegen s | simulate s | oracle s | fp32 ORT s "
        "| wall per 1k nodes s | oracle per 1k nodes s |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for nodes, row in chains:
        lines.append(
            f"| {nodes:,} | {row['wall']:.2f} | {row['codegen']:.2f} | {row['simulate']:.2f} | "
            f"{row['emulating_oracle']:.2f} | {row['onnxruntime']:.2f} | "
            f"{row['wall'] / nodes * 1000:.3f} | {row['emulating_oracle'] / nodes * 1000:.3f} |"
        )
    return "\n".join(lines)


def measured_line(run: dict) -> str:
    """When, how and under what load a run was measured."""
    return (
        f"Measured {run['measured']} by `python benchmarks/oracle_cost.py` ({run['repeat']} "
        f"validates per model in one process, medians) on {run['cores']} cores, load average "
        f"{run['load']} at the end"
    )


def document(run: dict, before: dict | None) -> str:
    """In: a run (`measure_all`'s) and perhaps an earlier one. Out: the Markdown tables."""
    parts = [
        "# What the verdict costs beside the run",
        "",
        "`validate`'s stages per model (`benchmarks/oracle_cost.py`, its docstring says what "
        "each column measures; oracle = the document's `emulating_oracle`, fp32 ORT = its "
        "`onnxruntime`). The cores are shared: read the ratios, and the load.",
        "",
    ]
    for title, which in (("Before", before), ("After", run if before else None)):
        if which is None:
            continue
        parts += [f"## {title}", "", measured_line(which) + ".", ""]
        parts += [table(which["rows"]), ""]
        scaled = scaling_table(which["rows"])
        if scaled:
            parts += ["The chain against its node count:", "", scaled, ""]
    if before is None:
        parts += [measured_line(run) + ".", "", table(run["rows"]), ""]
        scaled = scaling_table(run["rows"])
        if scaled:
            parts += ["The chain against its node count:", "", scaled, ""]
    return "\n".join(parts)


def measure_all(names: list[str], repeat: int) -> dict:
    """Every model of `names` measured (`measure`), with when and under what load."""
    breakdown = Breakdown()
    instrument(breakdown)
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for name in names:
            try:
                row = measure(name, repeat, Path(folder), breakdown)
            except Exception as exc:  # report and go on with the next model
                row = {"model": name, "error": f"{type(exc).__name__}: {exc}"[:200]}
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    return {
        "measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "repeat": repeat,
        "cores": os.cpu_count(),
        "load": ", ".join(f"{x:.1f}" for x in os.getloadavg()),
        "rows": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", help="resnet50, bert12, ocr640, chain:N or paths")
    parser.add_argument("--repeat", type=int, default=3, help="validates per model (median)")
    parser.add_argument("--scaling", action="store_true", help="also chain:5000 and chain:10000")
    parser.add_argument("--json", type=Path, help="write the run as JSON")
    parser.add_argument("--from-json", type=Path, help="table a --json run instead of measuring")
    parser.add_argument("--before", type=Path, help="a --json run of an earlier revision")
    parser.add_argument("--markdown", type=Path, help="write the tables to this file")
    args = parser.parse_args()
    if args.from_json:
        run = json.loads(args.from_json.read_text())
    else:
        names = list(args.models or DEFAULT_MODELS)
        if args.scaling:
            names += [f"chain:{n}" for n in SCALING if f"chain:{n}" not in names]
        run = measure_all(names, args.repeat)
    before = json.loads(args.before.read_text()) if args.before else None
    text = document(run, before)
    print(text)
    if args.json:
        args.json.write_text(json.dumps(run, indent=1) + "\n")
    if args.markdown:
        args.markdown.write_text(text)


if __name__ == "__main__":
    main()
