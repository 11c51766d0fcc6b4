"""The verdict can fail: on every model, under the default autocast and under fp16 and fp8
operands, a wrong answer — all zeros, a 2% gain, noise at 2% of the RMS, a permutation, one
weight of the saved program scaled by 1.05 — fails, and the right answer passes.

Output mutations are judged by the product's own verdict (`runtime/verdict.judge`) on the
evidence of one real run, with the machine's outputs replaced; the oracle's answers do not
depend on them and are computed once. The weight mutation goes through `onnx2bir run --model`
on a program written by `convert` whose constants sidecar was edited (sha256 updated). The
light models with random weights and the HF variants are slow (`-m slow`).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from onnx2bir.cli.commands import main
from onnx2bir.options import CompileOptions
from onnx2bir.runtime.machine import interpreter
from onnx2bir.runtime.machine.probes import ProbeReader
from onnx2bir.runtime.oracle.ort import synthesize_inputs
from onnx2bir.runtime.oracle.tolerance import TolerancePolicy
from onnx2bir.runtime.oracle.verdict import Evidence, judge
from onnx2bir.validation.prepared import prepare
from onnx2bir.validation.run import oracle_runner

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "models"))

from light import LIGHT_MODELS, light_model_path  # noqa: E402

ZOO = sorted(p.stem for p in (ROOT / "models").glob("*.onnx"))
LIGHT = sorted(LIGHT_MODELS.values())
HF = sorted(p.stem for p in (ROOT / "models" / "hf").glob("*.onnx"))
CAST_TYPES = ("bf16", "fp16", "fp8_e4m3")
MUTATIONS = ("zeros", "gain 1.02", "noise 2% of rms", "permutation")


def _path(name: str) -> Path:
    if name in ZOO:
        return ROOT / "models" / f"{name}.onnx"
    if name in HF:
        return ROOT / "models" / "hf" / f"{name}.onnx"
    return light_model_path(name)


def mutate(value: np.ndarray, how: str, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    v = np.asarray(value)
    if how == "zeros":
        return np.zeros_like(v)
    if how == "gain 1.02":
        return (v * 1.02).astype(v.dtype)
    if how == "noise 2% of rms":
        rms = np.sqrt(np.mean(np.square(v.astype(np.float64))))
        return (v + rng.standard_normal(v.shape) * 0.02 * rms).astype(v.dtype)
    flat = v.reshape(-1)
    return flat[rng.permutation(flat.size)].reshape(v.shape)


class Case:
    """One real run of a model: the evidence and a memo of the oracle's answers."""

    def __init__(self, name: str, cast_type: str, **options):
        options = CompileOptions(auto_cast_type=cast_type, **options)
        self.prepared = prepare(str(_path(name)), options)
        graph = self.prepared.pristine
        self.graph, self.plan = graph, self.prepared.compilation.cast_plan
        function = self.prepared.compilation.module.functions[0]
        reader = ProbeReader(
            function, self.plan.probes, {t: graph.tensors[t].shape for t in self.plan.probes}
        )
        feeds = synthesize_inputs(graph, 0)
        raw = interpreter.run_function(
            self.prepared.compilation.module, feeds, before=reader.before()
        )
        outputs = dict(zip(graph.outputs, (raw[loc] for loc in function.outputs), strict=True))
        from onnx2bir.runtime.oracle.ort import run_onnxruntime

        reference = run_onnxruntime(str(_path(name)), feeds, graph.outputs)
        self.evidence = Evidence(outputs, reader.values, reader.stored(), reference, "fp32")
        runner, self._memo = oracle_runner(self.prepared, feeds), {}

        def run_oracle(machine_values, wanted):
            key = (frozenset(machine_values), tuple(wanted))
            if key not in self._memo:
                self._memo[key] = runner(machine_values, wanted)
            return self._memo[key]

        self.run_oracle = run_oracle

    def passed(self, outputs: dict[str, np.ndarray]) -> bool:
        evidence = Evidence(
            outputs,
            self.evidence.probes,
            self.evidence.stored,
            self.evidence.reference,
            self.evidence.reference_kind,
        )
        judged, checkpoints, _ = judge(
            self.graph, self.plan, evidence, TolerancePolicy(), self.run_oracle
        )
        return all(o["passed"] for o in judged) and all(c["passed"] for c in checkpoints)

    def mutated(self, how: str) -> dict[str, np.ndarray]:
        """Every float output mutated (integer outputs are compared exactly elsewhere)."""
        return {
            name: mutate(value, how) if value.dtype.kind == "f" else value
            for name, value in self.evidence.machine.items()
        }

    def changed(self, how: str) -> bool:
        """Whether the mutation changes some output at all (a constant output permuted is
        the same output)."""
        return any(
            not np.array_equal(a, b, equal_nan=True)
            for a, b in zip(self.mutated(how).values(), self.evidence.machine.values(), strict=True)
        )


def check_mutations(name: str, cast_type: str, **options) -> None:
    case = Case(name, cast_type, **options)
    assert case.passed(case.evidence.machine), f"{name} {cast_type}: the right answer fails"
    floats = [v for v in case.evidence.machine.values() if v.dtype.kind == "f"]
    if not floats:
        pytest.skip(f"{name} has no float output")
    for how in MUTATIONS:
        if case.changed(how):
            assert not case.passed(case.mutated(how)), f"{name} {cast_type}: {how} passes"


@pytest.mark.parametrize("cast_type", CAST_TYPES)
@pytest.mark.parametrize("name", ZOO)
def test_wrong_outputs_fail_and_the_right_one_passes(name, cast_type):
    check_mutations(name, cast_type)


@pytest.mark.parametrize("kernel_cast", ["matmult-to-bf16", "matmult-to-fp16"])
def test_wrong_outputs_of_the_raised_attention_kernel_fail(kernel_cast):
    """The kernel's output judged at the fp32 bound (docs/validation.md#online-softmax)."""
    check_mutations(
        "long_attention",
        "bf16",
        enable_native_kernel_attention=True,
        enable_native_kernel_attention_bf16=True,
        native_kernel_cast_type=kernel_cast,
    )


@pytest.mark.slow
@pytest.mark.parametrize("cast_type", CAST_TYPES)
@pytest.mark.parametrize("name", LIGHT + HF)
def test_wrong_outputs_fail_on_the_light_and_hf_models(name, cast_type):
    check_mutations(name, cast_type)


# --- one weight of a saved program scaled by 1.05 -------------------------------------------------
def scale_constant(folder: Path, pick, factor: float) -> str:
    """Scale one constant of the program in `folder` (chosen by `pick(entries)`) by `factor`
    in its sidecar, and update its sha256 so that the program still loads."""
    bir = next(folder.glob("*.bir.json"))
    doc = json.loads(bir.read_text())
    sidecar = folder / doc["constants"]["file"]
    blob = bytearray(sidecar.read_bytes())
    entry = pick(doc["constants"]["entries"])
    dtype = {
        "float32": np.float32,
        "bfloat16": ml_dtypes.bfloat16,
        "float16": np.float16,
        "float8_e4m3": ml_dtypes.float8_e4m3fn,
    }[entry["dtype"]]
    start, stop = entry["offset"], entry["offset"] + entry["nbytes"]
    values = np.frombuffer(bytes(blob[start:stop]), dtype).astype(np.float32) * factor
    data = values.astype(dtype).tobytes()
    blob[start:stop] = data
    entry["sha256"] = hashlib.sha256(data).hexdigest()
    sidecar.write_bytes(bytes(blob))
    bir.write_text(json.dumps(doc))
    return entry["loc"]


def weights_that_matter(model: Path, inputs: Path, entries: list[dict]) -> list[dict]:
    """The program's constants that are the model's initializers (a kernel's copy is named
    `<initializer>@<node>...`) and whose scaling by 1.05 changes the model's own outputs on
    onnxruntime: the largest one, or none (not the PE transposes' identity tile, nor a
    constant of zeros or a loop bound the answer does not depend on)."""
    import onnx
    from onnx import numpy_helper

    from onnx2bir.runtime.oracle.ort import run_onnxruntime

    proto = onnx.load(str(model))
    initializers = {init.name: init for init in proto.graph.initializer}
    feeds = dict(np.load(inputs))
    before = run_onnxruntime(proto, feeds)
    for entry in sorted(entries, key=lambda e: (-int(np.prod(e["shape"])), e["loc"])):
        init = initializers.get(entry["loc"].split("@")[0])
        if init is None or init.data_type not in (1, 10, 16):  # float, float16, bfloat16
            continue
        scaled = onnx.ModelProto()
        scaled.CopyFrom(proto)
        target = next(i for i in scaled.graph.initializer if i.name == init.name)
        target.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * 1.05, init.name))
        after = run_onnxruntime(scaled, feeds)
        if any(not np.array_equal(before[k], after[k], equal_nan=True) for k in before):
            return [entry]
    return []


def check_scaled_weight(name: str, cast_type: str, tmp_path: Path, capsys) -> None:
    model = _path(name)
    program, inputs = tmp_path / "program", tmp_path / "inputs.npz"
    flags = ["--auto-cast-type", cast_type]
    assert main(["convert", str(model), "-o", str(program), *flags]) == 0
    assert main(["validate", str(model), *flags, "--save-inputs", str(inputs)]) == 0
    bir = str(next(program.glob("*.bir.json")))
    capsys.readouterr()
    assert main(["run", bir, "--inputs", str(inputs), "--model", str(model)]) == 0
    entries = json.loads(Path(bir).read_text())["constants"]["entries"]
    chosen = weights_that_matter(model, inputs, entries)
    mutated = tmp_path / "mutated"
    shutil.copytree(program, mutated)
    if not chosen:  # no weight the answer depends on: scaling one must change nothing
        scale_constant(mutated, lambda es: max(es, key=lambda e: (e["nbytes"], e["loc"])), 1.05)
        capsys.readouterr()
        code = main(
            [
                "run",
                str(next(mutated.glob("*.bir.json"))),
                "--inputs",
                str(inputs),
                "--model",
                str(model),
            ]
        )
        assert code == 0, f"{name}: a scaling that changes no answer fails"
        return
    scaled = scale_constant(mutated, lambda es: next(e for e in es if e == chosen[0]), 1.05)
    capsys.readouterr()
    code = main(
        [
            "run",
            str(next(mutated.glob("*.bir.json"))),
            "--inputs",
            str(inputs),
            "--model",
            str(model),
            "--json",
        ]
    )
    doc = json.loads(capsys.readouterr().out)
    assert code == 1, f"{name}: {scaled} scaled by 1.05 passes"
    failing = [o["name"] for o in doc["outputs"] if not o["passed"]]
    assert failing, f"{name}: no output named as failing"


@pytest.mark.parametrize("name", ZOO)
def test_a_saved_program_with_a_weight_scaled_fails_against_its_model(name, tmp_path, capsys):
    check_scaled_weight(name, "bf16", tmp_path, capsys)


@pytest.mark.slow
@pytest.mark.parametrize("cast_type", ("fp16", "fp8_e4m3"))
@pytest.mark.parametrize("name", ZOO)
def test_a_scaled_weight_fails_under_the_other_cast_types(name, cast_type, tmp_path, capsys):
    check_scaled_weight(name, cast_type, tmp_path, capsys)
