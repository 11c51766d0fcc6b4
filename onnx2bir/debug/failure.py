"""What "still fails" means for a cut of a model (docs/debug.md#what-fails).

In: a candidate model, the values of its graph inputs, the compile options. Out: a `Failure`
or None. Two judges:

- **onnx2bir's own** (`OwnJudge`): the candidate is compiled and, unless the model's failure
  happens at compile time, validated on the given inputs against the emulating oracle. It fails
  *the same way* as the original when the kind matches — a compile refusal with the same
  message, unsupported ops among the original's, a mismatch, a race, a machine refusal, an
  internal error of the same exception type — or, with `fail_regex`, when its message matches;
- **a command** (`CommandJudge`): the candidate's path replaces `{}` in the command (appended
  when there is none) and its inputs file replaces `{inputs}`; exit 0 is good, any other exit
  fails — only when the output (stdout and stderr) matches `fail_regex`, if one is given.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from onnx2bir.compiler import compile_model
from onnx2bir.errors import CompileError, MachineError, UserError
from onnx2bir.options import CompileOptions

UNSUPPORTED = "unsupported op"
REFUSED = "does not compile"
MISMATCH = "mismatch"
RACE = "race"
MACHINE = "machine refusal"
INTERNAL = "internal error"
BAD_INPUT = "bad input"
COMMAND = "check command"
COMPILE_TIME = (UNSUPPORTED, REFUSED)


@dataclass(frozen=True)
class Failure:
    kind: str
    message: str
    key: str = ""  # what must match for the same failure (module docstring)

    def to_json(self) -> dict:
        return {"kind": self.kind, "message": self.message}

    def same_as(self, original: Failure) -> bool:
        if self.kind != original.kind:
            return False
        if self.kind == UNSUPPORTED:  # any of the original's unsupported op types
            return bool(self.key) and set(self.key.split(",")) <= set(original.key.split(","))
        return self.key == original.key


def _unsupported_types(message: str) -> str:
    """'unsupported ops in g: Det x1, LpNormalization x2' -> 'Det,LpNormalization'."""
    listing = message.split(": ", 1)[-1]
    return ",".join(sorted(part.rsplit(" x", 1)[0].strip() for part in listing.split(",")))


def classify(exc: BaseException, graph_name: str) -> Failure:
    """The failure an exception of the compile or the run stands for."""
    message = " ".join(str(exc).split())
    if isinstance(exc, MachineError):
        return Failure(MACHINE, message, message.replace(graph_name, "<model>"))
    if isinstance(exc, UserError) and "unsupported ops in" in message:
        return Failure(UNSUPPORTED, message, _unsupported_types(message))
    if isinstance(exc, CompileError):
        return Failure(REFUSED, message, message.replace(graph_name, "<model>"))
    if isinstance(exc, UserError):
        return Failure(BAD_INPUT, message, message)
    first = message.split(". ")[0][:200]
    return Failure(INTERNAL, f"{type(exc).__name__}: {first}", type(exc).__name__)


class OwnJudge:
    """onnx2bir's own verdict on a candidate (module docstring)."""

    def __init__(self, options: CompileOptions, fail_regex: str | None = None):
        self.options = options
        self.pattern = re.compile(fail_regex) if fail_regex else None
        self.original: Failure | None = None
        self.compile_only = False
        self.check_races = False

    def describe(self) -> str:
        if self.pattern is not None:
            return f"onnx2bir fails with a message matching {self.pattern.pattern!r}"
        return f"onnx2bir fails the same way ({self.original.kind})" if self.original else ""

    def judge_original(self, model: onnx.ModelProto, feeds: dict, path: Path) -> Failure | None:
        """The original model's failure, which candidates must repeat; validated with races
        checked, so a race is found too."""
        self.check_races = True
        failure = self.failure_of(model, feeds)
        self.original = failure
        self.compile_only = failure is not None and failure.kind in COMPILE_TIME
        self.check_races = failure is not None and failure.kind == RACE
        return failure if failure is None or self.pattern is None else self._matching(failure)

    def fails(self, model: onnx.ModelProto, feeds: dict, path: Path) -> Failure | None:
        failure = self.failure_of(model, feeds)
        if failure is None:
            return None
        if self.pattern is not None:
            return self._matching(failure)
        return failure if failure.same_as(self.original) else None

    def _matching(self, failure: Failure) -> Failure | None:
        return failure if self.pattern.search(failure.message) else None

    def failure_of(self, model: onnx.ModelProto, feeds: dict) -> Failure | None:
        from onnx2bir.runtime.oracle.tolerance import TolerancePolicy
        from onnx2bir.validation.run import run_validate

        name = model.graph.name
        shapes = {input_name: tuple(np.shape(value)) for input_name, value in feeds.items()}
        try:
            if self.compile_only:
                compile_model(model, self.options, input_shapes=shapes)
                return None
            doc, _, _ = run_validate(
                model,
                self.options,
                TolerancePolicy(),
                input_shapes=shapes,
                inputs=feeds,
                check_races=self.check_races,
            )
        except Exception as exc:  # every failure of onnx2bir is a verdict here
            return classify(exc, name)
        if doc["passed"]:
            return None
        if doc.get("races"):
            race = doc["races"][0]["message"]
            return Failure(RACE, race, "")
        bad = [c for c in doc.get("checkpoints", []) if not c["passed"]]
        bad += [o for o in doc["outputs"] if not o["passed"]]
        what = bad[0]["name"] if bad else "an output"
        return Failure(MISMATCH, f"{what} is outside its bound", "")


class CommandJudge:
    """A user's command decides (module docstring)."""

    def __init__(self, command: str, fail_regex: str | None = None, timeout: float = 3600):
        self.words = shlex.split(command)
        if not self.words:
            raise UserError("--check: the command is empty")
        self.pattern = re.compile(fail_regex) if fail_regex else None
        self.timeout = timeout

    def describe(self) -> str:
        text = f"`{shlex.join(self.words)}` exits non-zero"
        return text + (f" with output matching {self.pattern.pattern!r}" if self.pattern else "")

    def command_for(self, path: Path, inputs: Path | None) -> list[str]:
        words = [w.replace("{inputs}", str(inputs or "")) for w in self.words]
        if not any("{}" in w for w in words):
            return [*words, str(path)]
        return [w.replace("{}", str(path)) for w in words]

    def judge_original(self, model, feeds, path: Path) -> Failure | None:
        return self.fails(model, feeds, path)

    def fails(self, model, feeds, path: Path) -> Failure | None:
        inputs = path.with_suffix(".inputs.npz") if feeds else None
        command = self.command_for(path, inputs)
        try:
            done = subprocess.run(
                command, capture_output=True, text=True, timeout=self.timeout, check=False
            )
        except FileNotFoundError:
            raise UserError(f"--check: no such command {command[0]!r}") from None
        except subprocess.TimeoutExpired:
            return Failure(COMMAND, f"timed out after {self.timeout:g} s")
        if done.returncode == 0:
            return None
        output = done.stdout + done.stderr
        if self.pattern is not None and not self.pattern.search(output):
            return None
        last = (output.strip().splitlines() or [""])[-1][:200]
        return Failure(COMMAND, f"exit {done.returncode}" + (f": {last}" if last else ""))


def save_candidate(model: onnx.ModelProto, feeds: dict[str, np.ndarray], path: Path) -> Path | None:
    """Write the candidate and, when it has graph inputs, `<stem>.inputs.npz` beside it."""
    onnx.save(model, str(path))
    if not feeds:
        return None
    inputs = path.with_suffix(".inputs.npz")
    np.savez(inputs, **feeds)
    return inputs
