"""The tolerance policy: which (atol, rtol) each compared tensor gets, and why.

In: a tensor's name, the op type of the node that produced it, its *path* (the least precise
storage its value went through) and its reference values. Out: a `Tolerance` whose `source`
says which rule chose it. The comparison is numpy's allclose form,
|a − r| ≤ atol + rtol·|r| (docs/validation.md#comparison-rule).

Built-in defaults, by path:

- **fp32** (every value stored in fp32): atol 1e-4, rtol 1e-3. rtol 1e-3 is the ONNX backend
  runner's and ORT backend suite's rtol, atol 1e-4 ORT's compare_bert_results
  (docs/validation.md#tolerance-defaults). They leave room for fp32 accumulation order (ORT and a
  numpy conv already differ by 1.4e-6 / 4e-6 on a 3x3x3 conv, docs/validation.md#tolerance);
  measured on models/small_cnn.onnx the machine is at 1.5e-8 absolute / 9.3e-7 relative, so they are
  not tight enough to need changing.
- **bf16 / fp16 / tf32 / fp8_e4m3** — the *statistical* bound. The verdict
  (`runtime/oracle/verdict.py`) compares with an oracle that rounds where the program rounds, so it
  uses the fp32 default wherever that oracle is exact, and this bound only where it is not:
  downstream of a raised attention kernel whose online softmax the oracle cannot compute
  (docs/validation.md#online-softmax), of an op that rounds inside
  itself, or of a model's own fp16/bf16 tensors (docs/validation.md#verdict); D then counts
  those approximate roundings on the tensor's longest chain since the last probe. Unit
  roundoff u = 2^-8 (bf16) or 2^-11 (fp16) (docs/validation.md#format-constants).

  A K-term dot product whose operands are rounded to the format and accumulated in fp32
  (PSUM always accumulates in fp32, docs/attention.md#cast-policy) has error e = Σ pᵢ(δᵢ + εᵢ) with
  |δ|, |ε| ≤ u. Worst case |e| ≤ 2u·Σ|pᵢ| (the K·u bound, docs/validation.md#format-constants); with
  independent roundings (variance u²/3 each) e is a random walk, σₑ = u·√(2/3)·√K·ρ with ρ the RMS
  of one product term (the √K·u bound there). So

      atol = max(1e-4, z·u·√(2/3)·√K·ρ)   with z = 6 (standard deviations)
      rtol = 2^-6 (bf16: two ULPs, the ONNX runner's bf16 floor; torch uses 1.6e-2)
             1e-3 (fp16: torch assert_close and ORT OpTester, about two ULPs)

  The bound grows as √K at fixed operand scale. ρ is rarely known at an output, but √K·ρ
  is: for terms of random sign the sum's RMS is √K·ρ, so ρ is estimated as rms(ref)/√K
  (when terms share a sign rms(ref) ≈ K·mean|p| > √K·ρ, a looser bound where relative error
  is small anyway). rtol covers the output's own rounding (0.5 ULP = u,
  docs/validation.md#format-constants).

  Measured (numpy, bf16-rounded operands, fp32 accumulation, N=2048x64 outputs, against
  float64): the smallest z that passes at rtol 2^-6 is 4.3 (K=9), 2.6 (K=64), 2.2 (K=576),
  2.3 (K=4608) for ReLU·He-init operands, 3.1 / 2.4 / 2.2 / 2.2 for unit-normal operands,
  ≤ 0 for positive operands; z = 6 passes them all. A real precision bug, accumulating in
  bf16, needs z = 8.8 (K=64), 50 (K=576), 123 (K=4608) and fails, as every allclose preset
  does (docs/validation.md#secondary-metrics), where cosine similarity stays above 0.997.
- **exact** (integer and bool tensors): atol 0, rtol 0.

Overrides, strongest first; atol and rtol resolve independently, so an override may set one:
`--tolerance NAME=ATOL,RTOL` (a tensor), the file's `tensors`, `--op-tolerance OP=ATOL,RTOL`
(tensors produced by that op type), the file's `op_types`, `--atol` / `--rtol`, the file's
`default`, the file's `paths` (keys fp32, bf16, fp16, exact), the built-in path default.

Tolerance file (`--tolerance-file FILE.json`), every key optional:

    {"default":  {"atol": 1e-4, "rtol": 1e-3},
     "paths":    {"bf16": {"rtol": 0.02}},
     "op_types": {"Conv": {"atol": 1e-3, "rtol": 1e-2}},
     "tensors":  {"logits": {"atol": 1e-3}}}

("outputs" is accepted as another name for "tensors".)
"""

from __future__ import annotations

import json
import math
import stat
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from onnx2bir.bir.enums import Dtype
from onnx2bir.errors import UserError
from onnx2bir.op_traits import Reduction, traits

FP32_ATOL = 1e-4
FP32_RTOL = 1e-3
Z_SIGMA = 6.0
UNIT_ROUNDOFF = {
    "bf16": 2.0**-8,
    "fp16": 2.0**-11,
    "tf32": 2.0**-11,
    "fp8_e4m3": 2.0**-4,
    "fp8_e5m2": 2.0**-3,
    "fp32": 2.0**-24,
}
LOW_PRECISION_RTOL = {
    "bf16": 2.0**-6,
    "fp16": 1e-3,
    "tf32": 1e-3,
    "fp8_e4m3": 2.0**-2,
    "fp8_e5m2": 2.0**-1,
}
PATHS = ("fp32", "tf32", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2", "exact")
# Looser paths win when paths meet (a bf16 value flowing into an fp32 op keeps bf16 error).
_LOOSENESS = {"exact": 0, "fp32": 1, "tf32": 2, "fp16": 3, "bf16": 4, "fp8_e4m3": 5, "fp8_e5m2": 6}
# float64 is computed in fp32 on chip (bir/dtypes.py DRAM_ONLY): its path is fp32's.
_DTYPE_PATHS = {
    Dtype.FP64: "fp32",
    Dtype.FP32: "fp32",
    Dtype.TF32: "tf32",
    Dtype.BF16: "bf16",
    Dtype.FP16: "fp16",
    Dtype.FP8_E4M3: "fp8_e4m3",
    Dtype.FP8_E5M2: "fp8_e5m2",
}
_FILE_KEYS = {"default", "paths", "op_types", "tensors", "outputs"}
MAX_TOLERANCE_FILE_BYTES = 1 << 20  # a tolerance file is a few hundred bytes


@dataclass(frozen=True)
class Tolerance:
    atol: float
    rtol: float
    source: str = "default"


@dataclass(frozen=True)
class Partial:
    """An override that may set only one of atol, rtol."""

    atol: float | None = None
    rtol: float | None = None
    source: str = ""


def path_of_dtype(dtype: Dtype | str) -> str:
    dtype = Dtype(dtype)
    return _DTYPE_PATHS.get(dtype, "exact")


def looser(a: str, b: str) -> str:
    return a if _LOOSENESS[a] >= _LOOSENESS[b] else b


def low_precision_tolerance(
    path: str,
    reduction: int,
    term_rms: float | None = None,
    reference: np.ndarray | None = None,
    depth: int = 1,
) -> Tolerance:
    """The low-precision bound for a reduction of length K after `depth` casting nodes on
    the tensor's longest chain (module docstring).

    Give `term_rms` (ρ, the RMS of one product term) when it is known; otherwise it is
    estimated from the reference as rms(ref)/√K.
    """
    u = UNIT_ROUNDOFF[path]
    k = max(1, int(reduction))
    d = max(1, int(depth))
    how = "ρ given"
    if term_rms is None:
        term_rms = _rms(reference) / math.sqrt(k) if reference is not None else 0.0
        how = "ρ = rms(ref)/√K"
    spread = Z_SIGMA * u * math.sqrt(2.0 / 3.0) * math.sqrt(k) * term_rms * math.sqrt(d)
    chain, depth_text = ("·√D", f", D={d}") if d > 1 else ("", "")
    return Tolerance(
        max(FP32_ATOL, spread),
        LOW_PRECISION_RTOL[path],
        f"{path} path: atol = {Z_SIGMA:g}·u·√(2/3)·√K·ρ{chain}, K={k}{depth_text}, {how}",
    )


def _rms(values: np.ndarray | None) -> float:
    if values is None or not np.size(values):
        return 0.0
    v = np.asarray(values).astype(np.float64)
    v = v[np.isfinite(v)]
    return float(np.sqrt(np.mean(v * v))) if v.size else 0.0


@dataclass
class TolerancePolicy:
    atol: float | None = None  # --atol / --rtol: the global default
    rtol: float | None = None
    tensors: dict[str, Partial] = field(default_factory=dict)  # --tolerance
    op_types: dict[str, Partial] = field(default_factory=dict)  # --op-tolerance
    file_default: Partial = field(default_factory=Partial)
    file_paths: dict[str, Partial] = field(default_factory=dict)
    file_op_types: dict[str, Partial] = field(default_factory=dict)
    file_tensors: dict[str, Partial] = field(default_factory=dict)

    def for_tensor(
        self,
        name: str,
        op_type: str | None,
        path: str,
        reference: np.ndarray | None = None,
        reduction: int = 1,
        depth: int = 1,
    ) -> Tolerance:
        """The tolerance of one tensor, each of atol and rtol from the strongest rule;
        `depth` is the count of approximate roundings on its longest chain
        (`runtime/oracle/verdict.py` `taints`)."""
        layers = [
            self.tensors.get(name),
            self.file_tensors.get(name),
            self.op_types.get(op_type) if op_type else None,
            self.file_op_types.get(op_type) if op_type else None,
            Partial(self.atol, self.rtol, "--atol/--rtol"),
            self.file_default,
            self.file_paths.get(path),
        ]
        atol = rtol = None
        atol_source = rtol_source = None
        for layer in layers:
            if layer is None:
                continue
            if atol is None and layer.atol is not None:
                atol, atol_source = layer.atol, layer.source
            if rtol is None and layer.rtol is not None:
                rtol, rtol_source = layer.rtol, layer.source
        if atol is None or rtol is None:
            base = self.path_default(path, reference, reduction, depth)
            if atol is None:
                atol, atol_source = base.atol, base.source
            if rtol is None:
                rtol, rtol_source = base.rtol, base.source
        if atol_source == rtol_source:
            return Tolerance(atol, rtol, atol_source)
        return Tolerance(atol, rtol, f"atol from {atol_source}; rtol from {rtol_source}")

    @staticmethod
    def path_default(
        path: str, reference: np.ndarray | None, reduction: int, depth: int = 1
    ) -> Tolerance:
        if path == "exact":
            return Tolerance(0.0, 0.0, "exact (integer or bool)")
        if path == "fp32":
            return Tolerance(FP32_ATOL, FP32_RTOL, "fp32 path default")
        return low_precision_tolerance(path, reduction, reference=reference, depth=depth)


# --- command line and file ---------------------------------------------------------------
def parse_override(text: str, what: str) -> tuple[str, Partial]:
    """`KEY=ATOL,RTOL` for `--tolerance` (what="tolerance", KEY a tensor) or `--op-tolerance`
    (KEY an op type); either number may be left empty to keep the next rule's value."""
    flag = f"--{what}"
    key_name = "OP" if what == "op-tolerance" else "NAME"
    key, sep, values = text.rpartition("=")
    parts = values.split(",")
    if not sep or not key or len(parts) != 2:
        raise UserError(
            f"{flag} {text!r}: expected {key_name}=ATOL,RTOL "
            "(e.g. logits=1e-3,1e-2; leave one empty to keep its default)"
        )
    atol, rtol = (_number(part, f"{flag} {text!r}") if part.strip() else None for part in parts)
    if atol is None and rtol is None:
        raise UserError(f"{flag} {text!r}: give ATOL, RTOL or both")
    return key, Partial(atol, rtol, f"{flag} {key}")


def _number(text: str, where: str) -> float:
    if isinstance(text, bool):
        raise UserError(f"{where}: {text!r} is not a number")
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise UserError(f"{where}: {str(text)[:40]!r} is not a number") from None
    except OverflowError:  # an integer of hundreds of digits
        raise UserError(f"{where}: {str(text)[:40]}... must be a finite number >= 0") from None
    if not math.isfinite(value) or value < 0:
        raise UserError(f"{where}: {str(text)[:40]!r} must be a finite number >= 0")
    return value


def _partial(entry: object, where: str) -> Partial:
    if not isinstance(entry, dict) or not entry or set(entry) - {"atol", "rtol"}:
        raise UserError(
            f'{where}: expected {{"atol": number, "rtol": number}} (either may be left out)'
        )
    return Partial(
        *(
            None if entry.get(key) is None else _number(entry[key], where)
            for key in ("atol", "rtol")
        ),
        source=where,
    )


def load_tolerance_file(path: str | Path, policy: TolerancePolicy) -> TolerancePolicy:
    """Fill the file layers of `policy` from a JSON file (module docstring for the format)."""
    path = Path(path)
    try:
        info = path.stat()
    except FileNotFoundError:
        raise UserError(f"{path}: no such tolerance file") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot read the tolerance file ({exc.strerror})") from None
    if not stat.S_ISREG(info.st_mode):  # a FIFO or a device would block or never end
        raise UserError(f"{path}: the tolerance file is not a regular file")
    if info.st_size > MAX_TOLERANCE_FILE_BYTES:
        raise UserError(f"{path}: the tolerance file is over {MAX_TOLERANCE_FILE_BYTES} bytes")
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except RecursionError:
        raise UserError(f"{path}: the tolerance file nests too deeply") from None
    except (OSError, ValueError) as exc:  # JSONDecodeError, bad UTF-8, a 5000-digit number
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise UserError(f"{path}: not a readable JSON tolerance file ({first})") from None
    if not isinstance(doc, dict) or set(doc) - _FILE_KEYS:
        unknown = sorted(set(doc) - _FILE_KEYS) if isinstance(doc, dict) else []
        raise UserError(
            f"{path}: expected an object with keys among "
            f"{', '.join(sorted(_FILE_KEYS))}"
            + (f"; unknown: {', '.join(unknown)}" if unknown else "")
        )
    if "default" in doc:
        policy.file_default = _partial(doc["default"], f"{path.name} default")
    for key, target in (
        ("paths", policy.file_paths),
        ("op_types", policy.file_op_types),
        ("tensors", policy.file_tensors),
        ("outputs", policy.file_tensors),
    ):
        section = doc.get(key, {})
        if not isinstance(section, dict):
            raise UserError(f'{path}: {key!r} must map names to {{"atol", "rtol"}}')
        for name, entry in section.items():
            if key == "paths" and name not in PATHS:
                raise UserError(f"{path}: unknown path {name!r} (one of {', '.join(PATHS)})")
            target[name] = _partial(entry, f"{path.name} {key}.{name}")
    return policy


def reduction_length(graph, node: str) -> int:
    """K of the node's reduction, by its op's `reduction` trait (1 for elementwise ops)."""
    data = graph.node(node)
    kind, inputs, attrs = traits(data["op_type"]).reduction, data["inputs"], data["attrs"]
    shape = lambda i: tuple(graph.tensors[inputs[i]].shape)  # noqa: E731
    try:
        if kind is Reduction.CONV:
            kernel = shape(1)
            return kernel[1] * math.prod(kernel[2:])
        if kind is Reduction.CONV_TRANSPOSE:
            kernel = shape(1)
            return kernel[0] // max(1, attrs.get("group", 1)) * math.prod(kernel[2:])
        if kind is Reduction.MATMUL:
            return shape(0)[-1]
        if kind is Reduction.GEMM:
            a = shape(0)
            return a[0] if attrs.get("transA", 0) else a[-1]
        if kind is Reduction.AXIS:
            return shape(0)[attrs.get("axis", -1)]
        if kind is Reduction.EINSUM:
            return einsum_terms(attrs.get("equation", ""), [shape(i) for i in range(len(inputs))])
        if kind is Reduction.TO_OUTPUT:
            out = graph.tensors[data["outputs"][0]].shape
            return max(1, math.prod(shape(0)) // max(1, math.prod(out)))
    except (IndexError, KeyError, TypeError):
        return 1
    return 1


def einsum_terms(equation: str, shapes: list[tuple]) -> int:
    """How many products an Einsum sums into one output element: the product of the sizes of
    the letters its inputs name and its output does not (the output, when the equation gives
    none, is the letters named once; `...` dims are never summed away here)."""
    equation = equation.replace(" ", "")
    lhs, arrow, rhs = equation.partition("->")
    operands = lhs.split(",")
    if not arrow:
        letters = "".join(operands).replace(".", "")
        rhs = "".join(c for c in sorted(set(letters)) if letters.count(c) == 1)
    sizes: dict[str, int] = {}
    for term, shape in zip(operands, shapes, strict=False):
        if "..." in term:
            head, _, tail = term.partition("...")
            named = list(zip(head, shape[: len(head)], strict=False))
            named += list(zip(tail, shape[len(shape) - len(tail) :], strict=False))
        else:
            named = list(zip(term, shape, strict=False))
        for letter, size in named:
            sizes[letter] = max(sizes.get(letter, 1), int(size))
    return math.prod(size for letter, size in sizes.items() if letter not in rhs)


RECURRENT_OPS = ("LSTM", "GRU", "RNN")


def chained_roundings(graph, node: str) -> int:
    """How many roundings one evaluation of the node puts on a chain: a recurrent op that
    rounds its state at every step chains one per step of its sequence (X is [seq, batch,
    input], or [batch, seq, input] with layout 1); any other op, one."""
    data = graph.node(node)
    if data["op_type"] not in RECURRENT_OPS:
        return 1
    try:
        shape = graph.tensors[data["inputs"][0]].shape
        return max(1, int(shape[1] if data["attrs"].get("layout", 0) else shape[0]))
    except (IndexError, KeyError, TypeError, ValueError):
        return 1
