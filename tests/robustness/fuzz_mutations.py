"""Mutations of the models in `models/` and of the command line, for the robustness fuzzer.

A mutation takes a model (ModelProto) and a `Draw` (Hypothesis's `data.draw`, so runs shrink
and replay) and returns the bytes to write, any side files, and the command line. Kinds:

- structural, through the onnx API: drop a node, rewire an input, extreme attribute values,
  wrong initializer shapes or dtypes, odd input dims, opset and IR version, vendor domains,
  renamed op types, dropped or renamed outputs, external-data tricks;
- bytes: flips and truncations of the serialised model;
- flags: combinations of good and bad values of every validate flag.

`run_cli` runs one command in-process with a time limit and classifies the outcome.
"""

from __future__ import annotations

import contextlib
import io
import json
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

import numpy as np
import onnx
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from onnx2bir.cli.commands import main

ROOT = Path(__file__).resolve().parents[2]
MODELS = sorted((ROOT / "models").glob("*.onnx"))
# validate simulates: keep it to the models that run in about a second.
QUICK_MODELS = [m for m in MODELS if m.stem in ("small_cnn", "mha", "bert", "gpt2", "vit")]
TIME_LIMIT = 120  # seconds; longer counts as a hang

Draw = Callable[[st.SearchStrategy], object]


class Kind(StrEnum):
    DROP_NODE = "drop_node"
    REWIRE_INPUT = "rewire_input"
    EXTREME_ATTRIBUTE = "extreme_attribute"
    INITIALIZER_SHAPE = "initializer_shape"
    INITIALIZER_DTYPE = "initializer_dtype"
    INPUT_DIMS = "input_dims"
    OPSET = "opset"
    IR_VERSION = "ir_version"
    DOMAIN = "domain"
    OP_TYPE = "op_type"
    OUTPUTS = "outputs"
    EXTERNAL_DATA = "external_data"
    BYTE_FLIP = "byte_flip"
    TRUNCATE = "truncate"
    FLAGS = "flags"


STRUCTURAL = [k for k in Kind if k not in (Kind.BYTE_FLIP, Kind.TRUNCATE, Kind.FLAGS)]
EXTREME_INTS = [0, -1, 1, 2, 3, 7, 1 << 31, -(1 << 31), 1 << 62, -(1 << 62), (1 << 63) - 1]
ODD_DIMS = [0, 1, 2, 3, 1 << 20, 1 << 40, (1 << 62)]


@dataclass
class Mutant:
    kind: Kind
    model: bytes
    args: list[str] = field(default_factory=list)
    side_files: dict[str, bytes] = field(default_factory=dict)
    command: str = "convert"
    detail: str = ""


def _pick(draw: Draw, items):
    return items[draw(st.integers(0, len(items) - 1))]


def _tensor_names(model: onnx.ModelProto) -> list[str]:
    graph = model.graph
    names = [v.name for v in graph.input] + [i.name for i in graph.initializer]
    return names + [o for n in graph.node for o in n.output if o]


def _structural(model: onnx.ModelProto, kind: Kind, draw: Draw) -> str:
    """Mutate `model` in place; return what was done."""
    graph = model.graph
    nodes = graph.node
    if kind is Kind.DROP_NODE and nodes:
        index = draw(st.integers(0, len(nodes) - 1))
        detail = nodes[index].op_type
        del nodes[index]
        return detail
    if kind is Kind.REWIRE_INPUT and nodes:
        node = _pick(draw, nodes)
        if not node.input:
            return "no inputs"
        slot = draw(st.integers(0, len(node.input) - 1))
        choice = draw(st.sampled_from(["other", "empty", "missing"]))
        node.input[slot] = {
            "other": _pick(draw, _tensor_names(model)),
            "empty": "",
            "missing": "no_such_tensor",
        }[choice]
        return f"{node.op_type}.{slot}:{choice}"
    if kind is Kind.EXTREME_ATTRIBUTE:
        candidates = [n for n in nodes if n.attribute]
        if not candidates:
            return "no attributes"
        node = _pick(draw, candidates)
        attr = _pick(draw, node.attribute)
        if attr.type == onnx.AttributeProto.INT:
            attr.i = draw(st.sampled_from(EXTREME_INTS))
        elif attr.type == onnx.AttributeProto.INTS:
            value = draw(st.sampled_from(EXTREME_INTS))
            size = draw(st.sampled_from([len(attr.ints), 0, 1, 7]))
            del attr.ints[:]
            attr.ints.extend([value] * size)
        elif attr.type == onnx.AttributeProto.FLOAT:
            attr.f = draw(st.sampled_from([0.0, -1.0, float("nan"), float("inf"), 1e38]))
        elif attr.type == onnx.AttributeProto.STRING:
            attr.s = draw(st.sampled_from([b"", b"BOGUS", b"\xff\xfe", b"SAME_UPPER"]))
        else:
            node.attribute.remove(attr)
            return f"{node.op_type}.{attr.name}:removed"
        return f"{node.op_type}.{attr.name}"
    if kind is Kind.INITIALIZER_SHAPE and graph.initializer:
        init = _pick(draw, graph.initializer)
        value = numpy_helper.to_array(init)
        how = draw(st.sampled_from(["rank1", "transpose", "grow", "scalar", "empty"]))
        new = {
            "rank1": lambda: value.reshape(-1),
            "transpose": lambda: value.T.copy(),
            "grow": lambda: np.concatenate([value.reshape(-1)] * 2),
            "scalar": lambda: value.reshape(-1)[:1].reshape(()),
            "empty": lambda: value.reshape(-1)[:0],
        }[how]()
        init.CopyFrom(numpy_helper.from_array(np.ascontiguousarray(new), init.name))
        return f"{init.name}:{how}"
    if kind is Kind.INITIALIZER_DTYPE and graph.initializer:
        init = _pick(draw, graph.initializer)
        dtype = draw(st.sampled_from([np.float64, np.int32, np.int8, np.bool_, np.float16]))
        value = numpy_helper.to_array(init).astype(dtype)
        init.CopyFrom(numpy_helper.from_array(value, init.name))
        return f"{init.name}:{np.dtype(dtype).name}"
    if kind is Kind.INPUT_DIMS and graph.input:
        value = _pick(draw, graph.input)
        dims = value.type.tensor_type.shape.dim
        if not dims:
            return "scalar input"
        dim = _pick(draw, dims)
        choice = draw(st.sampled_from(["value", "symbol", "unset"]))
        if choice == "value":
            dim.dim_value = draw(st.sampled_from(ODD_DIMS))
        elif choice == "symbol":
            dim.dim_param = "odd"
        else:
            dim.Clear()
        return f"{value.name}:{choice}"
    if kind is Kind.OPSET:
        entry = next((e for e in model.opset_import if e.domain in ("", "ai.onnx")), None)
        if entry is None:
            return "no opset"
        entry.version = draw(st.sampled_from([0, 1, 6, 11, 13, 17, 21, 23, 28, 29, 99, 1 << 40]))
        return str(entry.version)
    if kind is Kind.IR_VERSION:
        model.ir_version = draw(st.sampled_from([0, 1, 2, 3, 4, 7, 11, 13, 15, 99]))
        return str(model.ir_version)
    if kind is Kind.DOMAIN and nodes:
        node = _pick(draw, nodes)
        node.domain = draw(st.sampled_from(["com.microsoft", "ai.onnx.ml", "bogus", "ai.onnx"]))
        if node.domain not in {e.domain for e in model.opset_import} and draw(st.booleans()):
            model.opset_import.append(helper.make_opsetid(node.domain, 1))
        return f"{node.op_type}:{node.domain}"
    if kind is Kind.OP_TYPE and nodes:
        node = _pick(draw, nodes)
        old = node.op_type
        node.op_type = draw(
            st.sampled_from(["Relu", "MatMul", "Conv", "Gather", "Softmax", "Frobnicate", ""])
        )
        return f"{old}->{node.op_type}"
    if kind is Kind.OUTPUTS:
        how = draw(st.sampled_from(["drop_all", "drop_one", "rename", "duplicate", "input"]))
        if how == "drop_all":
            del graph.output[:]
        elif how == "drop_one" and graph.output:
            del graph.output[0]
        elif how == "rename" and graph.output:
            graph.output[0].name = draw(st.sampled_from(["", "ghost"]))
        elif how == "duplicate" and graph.output:
            graph.output.append(graph.output[0])
        elif how == "input" and graph.input:
            graph.output.append(graph.input[0])
        return how
    return "unchanged"


def _external(model: onnx.ModelProto, draw: Draw) -> tuple[str, dict[str, bytes]]:
    graph = model.graph
    if not graph.initializer:
        return "no initializers", {}
    init = _pick(draw, graph.initializer)
    raw = numpy_helper.to_array(init).tobytes()
    init.ClearField("raw_data")
    for name in ("float_data", "int64_data", "int32_data", "double_data"):
        init.ClearField(name)
    init.data_location = TensorProto.EXTERNAL
    how = draw(
        st.sampled_from(
            ["ok", "negative_length", "negative_offset", "past_end", "huge", "escape", "text"]
        )
    )
    fields = {"location": "weights.bin", "offset": "0", "length": str(len(raw))}
    if how == "negative_length":
        fields["length"] = "-4"
    elif how == "negative_offset":
        fields["offset"] = "-8"
    elif how == "past_end":
        fields["offset"] = str(len(raw) + 16)
    elif how == "huge":
        fields["length"] = str(1 << 62)
    elif how == "escape":
        fields["location"] = "../../../etc/passwd"
    elif how == "text":
        fields["offset"] = "twelve"
    for key, value in fields.items():
        entry = init.external_data.add()
        entry.key, entry.value = key, value
    return how, {"weights.bin": raw}


def make_mutant(draw: Draw) -> Mutant:
    kind = draw(st.sampled_from(list(Kind)))
    if kind is Kind.FLAGS:
        source = draw(st.sampled_from([ROOT / "tests/robustness/corpus/ok.onnx", *QUICK_MODELS]))
        return Mutant(kind, source.read_bytes(), flag_combination(draw), command="validate")
    source = draw(st.sampled_from(MODELS))
    data = source.read_bytes()
    if kind is Kind.BYTE_FLIP:
        flips = draw(st.lists(st.integers(0, len(data) - 1), min_size=1, max_size=8))
        buffer = bytearray(data)
        for position in flips:
            buffer[position] ^= draw(st.integers(1, 255))
        return Mutant(kind, bytes(buffer), detail=f"{source.stem}:{len(flips)} flips")
    if kind is Kind.TRUNCATE:
        cut = draw(st.integers(0, len(data) - 1))
        return Mutant(kind, data[:cut], detail=f"{source.stem}:{cut}")
    model = onnx.load_from_string(data)
    side: dict[str, bytes] = {}
    if kind is Kind.EXTERNAL_DATA:
        detail, side = _external(model, draw)
    else:
        detail = _structural(model, kind, draw)
    command = "validate" if source in QUICK_MODELS and draw(st.booleans()) else "convert"
    return Mutant(
        kind, model.SerializeToString(), [], side, command, detail=f"{source.stem}:{detail}"
    )


# Values of each validate flag: the good ones and the ones once refused badly.
FLAG_VALUES = {
    "--seed": ["0", "7", "-1", "1e3", str(1 << 130), "٣"],
    "--localize-budget": ["1", "0.5", "nan", "inf", "-inf", "0", "-3", "1e308"],
    "--atol": ["1e-3", "0", "nan", "inf", "-1", "x"],
    "--rtol": ["1e-2", "nan", "-0.5"],
    "--dim": ["batch=1", "N=²", f"N={1 << 63}", "N=0", "=3", "N=-2", "N"],
    "--input-shape": ["x=1,2", f"input=1,3,{1 << 63}", "input=0", "input=", "=1"],
    "--tolerance": ["y=1e-3,1e-2", "y=,", "y=nan,1", "logits=1e400,0", "nonsense"],
    "--op-tolerance": ["Conv=1e-3,", "Conv=a,b", "=1,1"],
    "--tolerance-file": ["{tmp}/deep.json", "{tmp}/t400.json", "{tmp}/ok.json", "{tmp}/fifo"],
    "--inputs": ["{tmp}/fifo", "{tmp}/strings.npz", "{tmp}/complex.npz", "{tmp}", "/dev/null"],
    "--save-inputs": ["{tmp}/in.npz", "{tmp}/fifo", "/dev/null", "", "{tmp}/link", "/proc/x"],
    "--save-outputs": ["{tmp}/out", "{tmp}/out.npz", "{tmp}/fifo", "/proc/1/x.npz"],
    "--native-kernel-cast-type": ["bf16", "matmult-to-bf16", "nonsense", ""],
    "--target": ["trn1", "", "pdp11"],
}
SWITCHES = ["--localize", "--json", "--stats", "--no-progress", "--frobnicate"]


def flag_combination(draw: Draw) -> list[str]:
    args: list[str] = []
    flags = draw(st.lists(st.sampled_from(sorted(FLAG_VALUES)), max_size=4, unique=True))
    for flag in flags:
        args += [flag, draw(st.sampled_from(FLAG_VALUES[flag]))]
    args += draw(st.lists(st.sampled_from(SWITCHES), max_size=2, unique=True))
    return args


def prepare_side_files(tmp: Path) -> None:
    """The files flag values name: a FIFO, arrays of refused dtypes, odd tolerance files."""
    import json
    import os

    os.mkfifo(tmp / "fifo")
    np.savez(tmp / "strings.npz", x=np.array(["a"]))
    np.savez(tmp / "complex.npz", x=np.ones(3, np.complex64))
    (tmp / "t400.json").write_text(json.dumps({"default": {"atol": 10**400}}))
    (tmp / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    (tmp / "ok.json").write_text(json.dumps({"default": {"atol": 1e-3}}))
    (tmp / "link").symlink_to(tmp / "ok.json")


class Outcome(StrEnum):
    OK = "exit 0"
    MISMATCH = "exit 1"
    REFUSED = "exit 2"
    INTERNAL = "exit 3"
    HANG = "hang"
    TRACEBACK = "traceback"
    OTHER = "other exit"


class _Timeout(Exception):
    """A fuzzed run that went past its time limit (counted as a hang)."""


def _alarm(signum, frame):
    raise _Timeout


def run_cli(argv: list[str], limit: int = TIME_LIMIT) -> tuple[Outcome, str]:
    """Run `onnx2bir argv` in-process; (outcome, stderr)."""
    err, out = io.StringIO(), io.StringIO()
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(limit)
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            code = main(argv)
    except SystemExit as exc:
        code = exc.code
    except _Timeout:
        return Outcome.HANG, err.getvalue()
    except BaseException as exc:  # escaped main(): a traceback a user would see
        return Outcome.TRACEBACK, f"{type(exc).__name__}: {exc}"
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    text = err.getvalue()
    if "Traceback" in text:
        return Outcome.TRACEBACK, text
    if not text.strip() and "--json" in argv:
        # With --json a refusal is one JSON document on stdout: {"error": {kind, message}}.
        try:
            error = json.loads(out.getvalue())["error"]
            text = f"{error['kind']}: {error['message']}"
        except (ValueError, KeyError, TypeError):
            text = out.getvalue()
    outcome = {0: Outcome.OK, 1: Outcome.MISMATCH, 2: Outcome.REFUSED, 3: Outcome.INTERNAL}
    return outcome.get(code, Outcome.OTHER), text
