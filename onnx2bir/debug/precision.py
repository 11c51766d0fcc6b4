"""`onnx2bir debug precision`: which nodes to keep in fp32 for the drift to meet a target
(docs/debug.md#precision).

In: a model, the compile options (the autocast to search under), drift limits
(`--max-drift cosine=0.9999,snr=40,r=1.2`, docs/validation.md#drift), a search mode and a
direction. Out: a small set of *casting nodes* — the model's nodes whose inputs the program
rounds, as the cast plan lists them — that `--auto-cast-exclude` keeps in fp32 so that every
output's drift from fp32 onnxruntime meets the limits, written one per line for
`--auto-cast-exclude-file`.

1. **Bisection** over the casting nodes in the model's order (as Polygraphy's `debug
   precision`): the smallest N such that excluding the first N (`--dir forward`) or the last N
   (`--dir reverse`) meets the limits; `--mode linear` tries N = 1, 2, ... instead.
2. **Greedy removal**: each node of that prefix, latest first, is dropped from the set when the
   limits still hold without it — so the answer is minimal (no single node can be taken out)
   rather than a prefix.

Each evaluation is a validation (`onnx2bir/validation/run.py`) with the set excluded; its
verdict against the emulating oracle is kept too, so a compiler error is not mistaken for drift.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path

MODES = ("bisect", "linear")
DIRECTIONS = ("forward", "reverse")


class PrecisionSearch:
    def __init__(self, model, feeds, options, limits: dict, progress: Callable[[str], None]):
        self.model = model
        self.feeds = feeds
        self.options = options
        self.limits = limits
        self.progress = progress
        self.evaluations: list[dict] = []
        self._seen: dict[frozenset, dict] = {}

    def evaluate(self, excluded: list[str], phase: str) -> dict:
        """Validate with `excluded` kept in fp32: {"meets", "passed", "drift", "failures"}."""
        from onnx2bir.runtime.oracle.tolerance import TolerancePolicy
        from onnx2bir.validation.run import run_validate

        key = frozenset(excluded)
        if key in self._seen:
            return self._seen[key]
        options = dataclasses.replace(self.options, auto_cast_exclude=tuple(excluded))
        shapes = {name: tuple(value.shape) for name, value in self.feeds.items()}
        start = time.perf_counter()
        doc, _, _ = run_validate(
            self.model,
            options,
            TolerancePolicy(),
            input_shapes=shapes,
            inputs=self.feeds,
            max_drift=self.limits,
        )
        failures = [f"{o['name']}: {f}" for o in doc["outputs"] for f in o["drift_failures"]]
        verdict = all(o["passed"] or o["drift_failures"] for o in doc["outputs"]) and all(
            c["passed"] for c in doc["checkpoints"]
        )
        result = {
            "excluded": len(excluded),
            "meets": not failures,
            "passed": verdict,
            "drift": {o["name"]: o["drift"] for o in doc["outputs"] if o.get("drift")},
            "failures": failures,
            "seconds": round(time.perf_counter() - start, 3),
            "phase": phase,
        }
        self._seen[key] = result
        self.evaluations.append(result)
        self.progress(
            f"[{len(self.evaluations)}] {phase}: {len(excluded)} in fp32: "
            + ("meets" if result["meets"] else "; ".join(failures[:2]))
            + f" ({result['seconds']:.1f} s)"
        )
        return result

    def search(self, casting: list[str], mode: str, direction: str) -> tuple[list[str], list[str]]:
        """(the prefix found, the set after the greedy pass); the whole list meets."""
        order = casting if direction == "forward" else list(reversed(casting))
        if mode == "bisect":
            low, high = 1, len(order)  # order[:high] meets
            while low < high:
                middle = (low + high) // 2
                if self.evaluate(order[:middle], "bisect")["meets"]:
                    high = middle
                else:
                    low = middle + 1
            count = high
        else:
            count = next(
                n for n in range(1, len(order) + 1) if self.evaluate(order[:n], "linear")["meets"]
            )
        prefix = order[:count]
        chosen = list(prefix)
        for node in reversed(prefix):
            trial = [n for n in chosen if n != node]
            if trial and self.evaluate(trial, "greedy")["meets"]:
                chosen = trial
        return prefix, chosen


def casting_nodes(compilation) -> list[str]:
    """The model's nodes whose inputs the program rounds, in the model's order."""
    return list(dict.fromkeys(point.node for point in compilation.cast_plan.points))


def search_precision(
    model_path: str,
    options,
    output: str,
    *,
    max_drift: str,
    mode: str = "bisect",
    direction: str = "forward",
    inputs: str | None = None,
    seed: int = 0,
    input_shapes=None,
    dims=None,
    progress: Callable[[str], None] = lambda line: None,
) -> dict:
    """Search (module docstring) and write the exclusion file; the result as a JSON document:
    {"model", "autocast", "max_drift", "mode", "direction", "casting_nodes", "prefix",
    "excluded" [{"node", "op_type"}], "before", "after", "all_fp32", "evaluations",
    "wall_seconds", "output", "meets"}."""
    from onnx2bir.compiler import compile_model
    from onnx2bir.errors import UserError
    from onnx2bir.frontend.importer import import_model, load_model
    from onnx2bir.output_paths import check_file
    from onnx2bir.runtime.oracle.verdict import parse_max_drift
    from onnx2bir.validation.inputs import model_feeds

    limits = parse_max_drift(max_drift)
    if not limits:
        raise UserError("--max-drift is required: the drift to meet, e.g. cosine=0.9999")
    if mode not in MODES or direction not in DIRECTIONS:
        raise UserError(f"--mode {mode!r} / --dir {direction!r}: see --help")
    if options.auto_cast == "none":
        raise UserError("--auto-cast none casts nothing: there is no precision to search")
    out = check_file(output, "-o")
    start = time.perf_counter()
    model = load_model(model_path)
    graph = import_model(model, input_shapes, dims)
    feeds, _ = model_feeds(graph, inputs, seed=seed)
    shapes = {name: tuple(value.shape) for name, value in feeds.items()}
    compilation = compile_model(model, options, input_shapes=shapes)
    casting = casting_nodes(compilation)
    op_types = {name: data["op_type"] for name, data in graph.nodes()}
    search = PrecisionSearch(model, feeds, options, limits, progress)
    before = search.evaluate([], "before")
    prefix, chosen, after, every = [], [], before, None
    if not before["meets"] and casting:
        every = search.evaluate(casting, "all fp32")
        if every["meets"]:
            prefix, chosen = search.search(casting, mode, direction)
            after = search.evaluate(chosen, "after")
    meets = after["meets"]
    doc = {
        "model": str(model_path),
        "autocast": options.autocast_text,
        "max_drift": limits,
        "mode": mode,
        "direction": direction,
        "casting_nodes": len(casting),
        "prefix": len(prefix),
        "excluded": [{"node": n, "op_type": op_types.get(n, "?")} for n in chosen],
        "before": before,
        "after": after,
        "all_fp32": every,
        "evaluations": len(search.evaluations),
        "wall_seconds": round(time.perf_counter() - start, 3),
        "output": str(out) if meets else None,
        "meets": meets,
        "passed": after["passed"],
    }
    if meets:
        _write(out, doc)
    return doc


def _write(path: Path, doc: dict) -> None:
    lines = [
        "# onnx2bir debug precision: the nodes to keep in fp32 under --auto-cast "
        + doc["autocast"],
        "# for every output to meet --max-drift "
        + ",".join(f"{k}={v}" for k, v in doc["max_drift"].items()),
        f"# {len(doc['excluded'])} of {doc['casting_nodes']} casting nodes; use with "
        "--auto-cast-exclude-file",
    ]
    lines += [f"{entry['node']}  # {entry['op_type']}" for entry in doc["excluded"]]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
