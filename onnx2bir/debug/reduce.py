"""`onnx2bir debug reduce`: the smallest model that still fails (docs/debug.md#reduce).

In: a model that fails (by onnx2bir's judgement or a check command, `failure.py`), its inputs,
and onnxruntime's value of every tensor on them. Out: a `Reduction` — the smallest failing cut
found (`onnx2bir/validation/subgraph.py`), the node it ends at (the culprit), and every
candidate judged.

Three phases over the nodes in the model's (topological) order:

1. **Outputs earlier.** The model stopped after node k (`Cutter.truncated`) fails for the last
   node; find the smallest k that still fails. `bisect` halves the range (it assumes that once
   a node is in, the failure stays: true of a refused or unsupported node, and of a mismatch
   the verdict sees where it arises, docs/validation.md#resynchronisation); `linear` drops one
   node at a time from the end and stops at the first cut that passes (one evaluation per node,
   robust when the failure comes and goes along the order).
2. **Only what node k needs.** The side branches that do not reach node k are dropped
   (`Cutter.upstream`); kept only if the cut still fails.
3. **Inputs later.** The cut begins at node j instead of the model's inputs: what it reads
   from before j becomes graph inputs fed with onnxruntime's values, or constants
   (`onnx2bir/validation/subgraph.py`); find the largest j that still fails: node k alone
   first, then by bisection, or one node at a time from k down.

Each candidate is written as an ONNX model (and its inputs as `.inputs.npz`) into a work folder
and judged; a candidate judged before is not judged again.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from onnx2bir.debug.failure import Failure, save_candidate
from onnx2bir.validation.subgraph import Cut, Cutter

MODES = ("bisect", "linear")


@dataclass
class Evaluation:
    phase: str
    what: str
    nodes: int
    failure: Failure | None
    seconds: float

    def to_json(self) -> dict:
        return {
            "phase": self.phase,
            "candidate": self.what,
            "nodes": self.nodes,
            "fails": self.failure is not None,
            "failure": self.failure.to_json() if self.failure else None,
            "seconds": round(self.seconds, 3),
        }


@dataclass
class Reduction:
    nodes_before: int
    cut: Cut
    failure: Failure
    culprit: int  # index of the node the cut ends at
    evaluations: list[Evaluation] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


class Reducer:
    def __init__(
        self,
        cutter: Cutter,
        judge,
        mode: str,
        workdir: Path,
        progress: Callable[[str], None] = lambda line: None,
    ):
        self.cutter = cutter
        self.judge = judge
        self.mode = mode
        self.workdir = workdir
        self.progress = progress
        self.evaluations: list[Evaluation] = []
        self._seen: dict[str, Failure | None] = {}

    def fails(self, cut: Cut, phase: str, what: str) -> Failure | None:
        digest = hashlib.sha1(cut.model.SerializeToString()).hexdigest()
        if digest in self._seen:
            return self._seen[digest]
        path = self.workdir / f"candidate_{len(self.evaluations) + 1}.onnx"
        save_candidate(cut.model, cut.feeds, path)
        start = time.perf_counter()
        failure = self.judge.fails(cut.model, cut.feeds, path)
        evaluation = Evaluation(phase, what, cut.size, failure, time.perf_counter() - start)
        self.evaluations.append(evaluation)
        self._seen[digest] = failure
        verdict = f"fails ({failure.kind})" if failure else "passes"
        self.progress(
            f"[{len(self.evaluations)}] {phase}: {what}, {cut.size} nodes: {verdict} "
            f"({evaluation.seconds:.1f} s)"
        )
        return failure

    def reduce(self, original: Failure) -> Reduction:
        cutter = self.cutter
        total = len(cutter.nodes)
        notes: list[str] = []
        last = total - 1
        best, best_failure = cutter.truncated(last), original
        # 1. outputs earlier
        if self.mode == "bisect":
            low, high = 0, last
            while low < high:
                middle = (low + high) // 2
                cut = cutter.truncated(middle)
                failure = self.fails(cut, "outputs", self._after(middle))
                if failure:
                    high, best, best_failure = middle, cut, failure
                else:
                    low = middle + 1
            culprit = low
        else:
            culprit = last
            while culprit > 0:
                cut = cutter.truncated(culprit - 1)
                failure = self.fails(cut, "outputs", self._after(culprit - 1))
                if not failure:
                    break
                culprit, best, best_failure = culprit - 1, cut, failure
        # 2. only what the culprit needs
        upstream = cutter.upstream(culprit)
        failure = self.fails(upstream, "upstream", f"what {self._name(culprit)} needs")
        if not failure:
            notes.append(
                f"node {self._name(culprit)} does not fail without the side branches of the "
                "model before it: they are kept"
            )
            return Reduction(total, best, best_failure, culprit, self.evaluations, notes)
        best, best_failure = upstream, failure
        # 3. inputs later
        if cutter.values is None:
            notes.append("onnxruntime cannot run the model: the cut keeps the model's inputs")
            return Reduction(total, best, best_failure, culprit, self.evaluations, notes)
        starts = sorted({index for index in upstream.nodes})  # where a cut may begin
        if self.mode == "bisect":
            alone = cutter.upstream(culprit, culprit)  # most often the answer: try it first
            failure = self.fails(alone, "inputs", self._from(culprit))
            if failure:
                return Reduction(total, alone, failure, culprit, self.evaluations, notes)
            low, high = 0, len(starts) - 2  # starts[low] fails (the whole upstream)
            while low < high:
                middle = (low + high + 1) // 2
                cut = cutter.upstream(culprit, starts[middle])
                failure = self.fails(cut, "inputs", self._from(starts[middle]))
                if failure:
                    low, best, best_failure = middle, cut, failure
                else:
                    high = middle - 1
        else:
            for position in range(len(starts) - 1, 0, -1):
                cut = cutter.upstream(culprit, starts[position])
                failure = self.fails(cut, "inputs", self._from(starts[position]))
                if failure:
                    best, best_failure = cut, failure
                    break
        return Reduction(total, best, best_failure, culprit, self.evaluations, notes)

    def _name(self, index: int) -> str:
        node = self.cutter.nodes[index]
        return f"{node.op_type} {node.name or f'#{index}'}"

    def _after(self, index: int) -> str:
        return f"stop after node {index} ({self._name(index)})"

    def _from(self, index: int) -> str:
        return f"begin at node {index} ({self._name(index)})"


def reduce_model(
    model_path: str,
    options,
    output: str,
    *,
    mode: str = "bisect",
    check: str | None = None,
    fail_regex: str | None = None,
    inputs: str | None = None,
    seed: int = 0,
    input_shapes=None,
    dims=None,
    progress: Callable[[str], None] = lambda line: None,
) -> dict:
    """Reduce the model at `model_path` and write the smallest failing cut to `output` (with
    `<stem>.inputs.npz` beside it when it has graph inputs); the result as a JSON document:
    {"model", "mode", "judge", "failure", "nodes_before", "nodes_after", "culprit",
    "evaluations", "wall_seconds", "output", "inputs", "notes", "candidates"}."""
    import tempfile

    from onnx2bir.debug.failure import CommandJudge, OwnJudge
    from onnx2bir.errors import UserError
    from onnx2bir.frontend.importer import import_model, load_model
    from onnx2bir.output_paths import check_file
    from onnx2bir.validation.inputs import model_feeds
    from onnx2bir.validation.subgraph import all_values

    if mode not in MODES:
        raise UserError(f"--mode {mode!r}: expected one of {', '.join(MODES)}")
    out = check_file(output, "-o")
    start = time.perf_counter()
    model = load_model(model_path)
    graph = import_model(model, input_shapes, dims)
    feeds, _ = model_feeds(graph, inputs, seed=seed)
    notes = []
    try:
        values = all_values(model, feeds)
    except UserError as exc:
        values = None
        notes.append(f"{exc}: cuts keep the model's own inputs")
    judge = CommandJudge(check, fail_regex) if check else OwnJudge(options, fail_regex)
    cutter = Cutter(model, feeds, values)
    with tempfile.TemporaryDirectory(prefix="onnx2bir-reduce-") as folder:
        workdir = Path(folder)
        original_path = workdir / "original.onnx"
        save_candidate(model, feeds, original_path)
        original = judge.judge_original(model, feeds, original_path)
        if original is None:
            raise UserError(
                f"{model_path} does not fail ({judge.describe() or 'onnx2bir passes it'}): "
                "there is nothing to reduce"
            )
        progress(f"the model fails: {original.kind}: {original.message}")
        reducer = Reducer(cutter, judge, mode, workdir, progress)
        result = reducer.reduce(original)
    saved_inputs = save_candidate(result.cut.model, result.cut.feeds, out)
    culprit = cutter.nodes[result.culprit]
    return {
        "model": str(model_path),
        "mode": mode,
        "judge": judge.describe(),
        "failure": result.failure.to_json(),
        "original_failure": original.to_json(),
        "nodes_before": result.nodes_before,
        "nodes_after": result.cut.size,
        "culprit": {"node": culprit.name, "op_type": culprit.op_type, "index": result.culprit},
        "evaluations": len(result.evaluations),
        "wall_seconds": round(time.perf_counter() - start, 3),
        "output": str(out),
        "inputs": str(saved_inputs) if saved_inputs else None,
        "frozen": result.cut.frozen,
        "notes": notes + result.notes,
        "candidates": [evaluation.to_json() for evaluation in result.evaluations],
    }
