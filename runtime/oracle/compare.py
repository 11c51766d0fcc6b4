"""Compare the machine's values with the oracle's, one tensor at a time.

In: a machine array, a reference array, a tolerance (atol, rtol). Out: an `OutputComparison`
holding the verdict and the statistics a person needs to act on it.

Rule (numpy allclose, docs/validation.md#comparison-rule): an element passes when
|actual − reference| ≤ atol + rtol·|reference|. NaN passes only against NaN and ±inf only
against the same infinity (onnxruntime's op-test rule); any other non-finite pair fails.

Statistics over the elements where both sides are finite:
- absolute error |a − r| and relative error |a − r| / |r|: max, mean, median and p99
  (quantiles are nearest-rank, so an inf never turns into a NaN). The relative error is over
  the elements whose reference is not exactly 0 (|a − r| / 0 says nothing but "inf": a ReLU's
  zeros, a mask, padding); `zero_references` counts those left out, and the absolute error and
  the verdict still cover them. The worst element's "rel_err" is None when its reference is 0.
- the worst element: the one that uses the largest share of its allowance
  |a − r| / (atol + rtol·|r|), with its index and both values;
- cosine similarity (NaN when a non-finite value mismatches) and SNR in dB (secondary metrics
  only: cosine ≥ 0.997 still passes a bf16-accumulation bug, docs/validation.md#secondary-metrics),
  the largest distance in ULPs of the reference dtype;
- NaN / ±inf counts and the first few indices, on each side;
- the RMS of the reference's finite values (`reference_rms`: what the verdict's verifiability
  rule compares the atol with, docs/validation.md#verdict);
- the smallest tolerance that would have passed: min_atol (at the given rtol) =
  max(|a − r| − rtol·|r|), min_rtol (at the given atol) = max((|a − r| − atol) / |r|), both
  clipped at 0 and nudged up by an ULP when rounding would make them fail; inf when no value
  suffices (a non-finite mismatch, or r = 0 with |a − r| > atol for min_rtol).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

# Defaults for the fp32 generic path, kept here for existing callers; the policy that picks a
# tolerance per tensor is `onnx2bir.runtime.oracle.tolerance`.
FP32_ATOL = 1e-4
FP32_RTOL = 1e-3
FIRST_INDICES = 5  # how many positions of NaN / inf to list per side


# The error figures of one comparison that a node's localize record carries.
ERROR_KEYS = (
    "max_abs_err",
    "max_rel_err",
    "cosine",
    "atol",
    "rtol",
    "mismatches",
    "min_atol",
    "min_rtol",
    "worst",
)


@dataclass(frozen=True)
class OutputComparison:
    name: str
    shape: tuple[int, ...]
    max_abs_err: float
    max_rel_err: float
    cosine: float
    atol: float
    rtol: float
    passed: bool
    mismatches: int
    size: int = 0
    dtype: str = ""
    tolerance_source: str = ""
    abs_err: dict = field(default_factory=dict)  # max, mean, median, p99
    rel_err: dict = field(default_factory=dict)
    worst: dict | None = None  # index, machine, onnxruntime, abs_err, rel_err
    min_atol: float = 0.0
    min_rtol: float = 0.0
    nonfinite: dict = field(default_factory=dict)  # side → {nan, posinf, neginf, first}
    nonfinite_mismatches: int = 0
    max_ulp: int | None = None
    snr_db: float = float("inf")
    shape_error: str | None = None
    finite_pairs: int = 0  # elements where both sides are finite (the statistics' domain)
    zero_references: int = 0  # of those, the reference exactly 0: left out of the rel. error
    reference_rms: float = 0.0  # over the reference's finite values

    @property
    def has_nonfinite(self) -> bool:
        return any(
            side["nan"] + side["posinf"] + side["neginf"] for side in self.nonfinite.values()
        )

    def to_json(self) -> dict:
        """The fields as plain Python values (floats may be inf or NaN; see `json_safe`)."""
        return {
            "name": self.name,
            "shape": list(self.shape),
            "max_abs_err": self.max_abs_err,
            "max_rel_err": self.max_rel_err,
            "cosine": self.cosine,
            "atol": self.atol,
            "rtol": self.rtol,
            "passed": self.passed,
            "mismatches": self.mismatches,
            "size": self.size,
            "dtype": self.dtype,
            "tolerance_source": self.tolerance_source,
            "abs_err": self.abs_err,
            "rel_err": self.rel_err,
            "worst": self.worst,
            "min_atol": self.min_atol,
            "min_rtol": self.min_rtol,
            "nonfinite": self.nonfinite,
            "nonfinite_mismatches": self.nonfinite_mismatches,
            "max_ulp": self.max_ulp,
            "snr_db": self.snr_db,
            "shape_error": self.shape_error,
            "finite_pairs": self.finite_pairs,
            "zero_references": self.zero_references,
            "reference_rms": self.reference_rms,
        }


def json_safe(value):
    """`value` with every non-finite float replaced by None (JSON has no inf or NaN)."""
    if isinstance(value, float):
        return value if np.isfinite(value) else None
    if isinstance(value, dict):
        return {key: json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(item) for item in value]
    return value


def compare_output(
    name: str,
    actual: np.ndarray,
    reference: np.ndarray,
    atol: float = FP32_ATOL,
    rtol: float = FP32_RTOL,
    tolerance_source: str = "",
) -> OutputComparison:
    reference = np.asarray(reference)
    actual = np.asarray(actual)
    if actual.shape != reference.shape:
        return OutputComparison(
            name,
            tuple(reference.shape),
            float("inf"),
            float("inf"),
            float("nan"),
            atol,
            rtol,
            False,
            int(reference.size),
            int(reference.size),
            str(reference.dtype),
            tolerance_source,
            min_atol=float("inf"),
            min_rtol=float("inf"),
            nonfinite={"machine": _nonfinite(actual), "onnxruntime": _nonfinite(reference)},
            shape_error=f"machine shape {tuple(actual.shape)} != onnxruntime shape "
            f"{tuple(reference.shape)}",
        )
    a = _as_float64(actual)
    r = _as_float64(reference)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        finite = np.isfinite(a) & np.isfinite(r)
        all_finite = bool(finite.all())
        if all_finite:  # the usual case, without the masks
            nonfinite_bad = np.zeros(a.shape, bool)
            diff = np.abs(a - r)
            abs_r = np.abs(r)
        else:
            special = (np.isnan(a) & np.isnan(r)) | (np.isinf(a) & (a == r))
            nonfinite_bad = ~finite & ~special
            diff = np.where(finite, np.abs(a - r), 0.0)
            abs_r = np.where(finite, np.abs(r), 0.0)
        allowance = atol + rtol * abs_r
        bad = (diff > allowance) | nonfinite_bad
        # Relative to a reference of exactly 0 there is no relative error: left out (docstring).
        nonzero = abs_r > 0
        rel = np.divide(diff, abs_r, out=np.zeros(diff.shape), where=nonzero)
    pick = (lambda v: v.reshape(-1)) if all_finite else (lambda v: v[finite])
    d = pick(diff)
    af, rf = pick(a), pick(r)
    zero_references = int(np.count_nonzero(rf == 0))
    rr = rel[finite & nonzero] if zero_references or not all_finite else rel.reshape(-1)
    worst = None
    if d.size:
        with np.errstate(invalid="ignore", divide="ignore"):
            share = np.where(allowance > 0, diff / allowance, np.where(diff > 0, np.inf, 0.0))
        if not all_finite:
            share = np.where(finite, share, -1.0)
        flat = int(np.argmax(share))
        index = [int(i) for i in np.unravel_index(flat, reference.shape)]
        worst = {
            "index": index,
            "machine": float(a.reshape(-1)[flat]),
            "onnxruntime": float(r.reshape(-1)[flat]),
            "abs_err": float(diff.reshape(-1)[flat]),
            "rel_err": float(rel.reshape(-1)[flat]) if nonzero.reshape(-1)[flat] else None,
        }
    nonfinite_count = int(nonfinite_bad.sum())
    max_abs = float("inf") if nonfinite_count else (float(d.max()) if d.size else 0.0)
    max_rel = float("inf") if nonfinite_count else (float(rr.max()) if rr.size else 0.0)
    return OutputComparison(
        name=name,
        shape=tuple(reference.shape),
        max_abs_err=max_abs,
        max_rel_err=max_rel,
        cosine=float("nan") if nonfinite_count else _cosine(af, rf),
        atol=atol,
        rtol=rtol,
        passed=not bool(bad.any()),
        mismatches=int(bad.sum()),
        size=int(reference.size),
        dtype=str(reference.dtype),
        tolerance_source=tolerance_source,
        abs_err=_summary(d),
        rel_err=_summary(rr),
        worst=worst,
        min_atol=inf_if(nonfinite_count, lambda: min_atol(d, np.abs(rf), rtol)),
        min_rtol=inf_if(nonfinite_count, lambda: min_rtol(d, np.abs(rf), atol)),
        nonfinite={"machine": _nonfinite(actual), "onnxruntime": _nonfinite(reference)},
        nonfinite_mismatches=nonfinite_count,
        max_ulp=_max_ulp(actual, reference, None if all_finite else finite),
        snr_db=float("nan") if nonfinite_count else _snr_db(af, rf),
        finite_pairs=int(finite.sum()),
        zero_references=zero_references,
        reference_rms=_rms(r if all_finite else r[np.isfinite(r)]),
    )


def nonfinite_count(result: OutputComparison, side: str) -> int:
    """NaN and ±inf values on one side ("machine" or "onnxruntime")."""
    entry = result.nonfinite.get(side, {})
    return entry.get("nan", 0) + entry.get("posinf", 0) + entry.get("neginf", 0)


def tensor_record(result: OutputComparison) -> dict:
    """The few numbers a per-node report keeps of one comparison."""
    return {
        "tensor": result.name,
        "passed": result.passed,
        "max_abs_err": result.max_abs_err,
        "max_rel_err": result.max_rel_err,
        "cosine": result.cosine,
        "atol": result.atol,
        "rtol": result.rtol,
        "mismatches": result.mismatches,
        "size": result.size,
        "min_atol": result.min_atol,
        "min_rtol": result.min_rtol,
        "nonfinite_machine": nonfinite_count(result, "machine"),
        "nonfinite_onnxruntime": nonfinite_count(result, "onnxruntime"),
        "worst": result.worst,
        "tolerance_source": result.tolerance_source,
    }


def inf_if(condition, compute) -> float:
    return float("inf") if condition else compute()


def min_atol(diff: np.ndarray, abs_ref: np.ndarray, rtol: float) -> float:
    """Smallest atol with diff ≤ atol + rtol·|ref| everywhere (as the comparison computes it)."""
    if not diff.size:
        return 0.0
    slack = rtol * abs_ref
    value = max(0.0, float(np.max(diff - slack)))
    while np.any(diff > value + slack):  # rounding of the subtraction: at most a few ULPs
        value = float(np.nextafter(value, np.inf))
    return value


def min_rtol(diff: np.ndarray, abs_ref: np.ndarray, atol: float) -> float:
    """Smallest rtol with diff ≤ atol + rtol·|ref| everywhere; inf if none suffices."""
    over = diff > atol
    if not over.any():
        return 0.0
    if np.any(over & (abs_ref == 0)):
        return float("inf")
    value = float(np.max((diff[over] - atol) / abs_ref[over]))
    while np.any(diff > atol + value * abs_ref):
        value = float(np.nextafter(value, np.inf))
    return value


def _as_float64(values: np.ndarray) -> np.ndarray:
    if values.dtype.kind == "V" or values.dtype.kind == "f":  # ml_dtypes bf16 has kind "V"
        return values.astype(np.float32, copy=False).astype(np.float64)
    return values.astype(np.float64)


def _summary(values: np.ndarray) -> dict:
    if not values.size:
        return {"max": 0.0, "mean": 0.0, "median": 0.0, "p99": 0.0}
    with np.errstate(invalid="ignore", over="ignore"):
        mean = float(values.mean())
    median, p99 = np.quantile(values, [0.5, 0.99], method="nearest")
    return {
        "max": float(values.max()),
        "mean": mean if not np.isnan(mean) else float("inf"),
        "median": float(median),
        "p99": float(p99),
    }


def _nonfinite(values: np.ndarray) -> dict:
    if values.dtype.kind not in "fV":
        return {"nan": 0, "posinf": 0, "neginf": 0, "first": []}
    v = values.astype(np.float32) if values.dtype.kind == "V" else values
    nan, posinf, neginf = np.isnan(v), np.isposinf(v), np.isneginf(v)
    positions = np.flatnonzero(nan | posinf | neginf)[:FIRST_INDICES]
    return {
        "nan": int(nan.sum()),
        "posinf": int(posinf.sum()),
        "neginf": int(neginf.sum()),
        "first": [[int(i) for i in np.unravel_index(p, values.shape)] for p in positions],
    }


def _max_ulp(actual: np.ndarray, reference: np.ndarray, finite: np.ndarray | None) -> int | None:
    """Largest distance in units in the last place of the reference's float format, over the
    pairs where both are finite (`finite`; None: every pair)."""
    dtype = reference.dtype
    if dtype.kind not in "fV" or dtype.itemsize not in (2, 4):
        return None
    if finite is not None:
        if not finite.any():
            return None
        actual, reference = actual[finite], reference[finite]
    ints = np.int32 if dtype.itemsize == 4 else np.int16
    magnitude = ints(np.iinfo(ints).max)  # every bit but the sign

    def ordered(values: np.ndarray) -> np.ndarray:
        """The bits as integers in the order of the values, ±0 both 0 (fits `ints`)."""
        bits = np.ascontiguousarray(values.astype(dtype, copy=False)).view(ints)
        return np.where(bits < 0, -(bits & magnitude), bits)

    distance = np.subtract(ordered(actual), ordered(reference), dtype=np.int64)
    return int(np.max(np.abs(distance))) if distance.size else None


def _rms(values: np.ndarray) -> float:
    flat = values.reshape(-1)
    return float(np.sqrt(np.dot(flat, flat) / flat.size)) if flat.size else 0.0


def _snr_db(a: np.ndarray, r: np.ndarray) -> float:
    e = a - r
    noise = float(np.dot(e, e))
    signal = float(np.dot(r, r))
    if noise == 0.0:
        return float("inf")
    if signal == 0.0:
        return float("-inf")
    return 10.0 * float(np.log10(signal / noise))


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    norm = float(np.sqrt(np.dot(a, a) * np.dot(b, b)))
    if norm == 0.0:
        return 1.0 if not a.any() and not b.any() else 0.0
    return float(np.dot(a, b) / norm)
