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

from dataclasses import dataclass, field, replace

import numpy as np

from onnx2bir.runtime.oracle.blas_dot import dots

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
    allowance: np.ndarray | None = None,
) -> OutputComparison:
    """In: the machine's array, the reference, the bound. Out: their comparison (module
    docstring). `allowance`, an array of the reference's shape, is added to each element's
    bound for the verdict alone (`passed`, `mismatches`): the statistics, the worst element
    and the smallest tolerances stay those of atol and rtol (a kernel boundary's flips and a
    reduction's summation order, docs/validation.md#kernel-boundaries); NaN and ±inf pass as
    they do without it. An allowance of another shape is not applied."""
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
    if allowance is not None and np.shape(allowance) != reference.shape:
        allowance = None
    extra = None if allowance is None else np.asarray(allowance, np.float64).reshape(-1)
    finite_only = _compare_finite(name, actual, reference, atol, rtol, tolerance_source, extra)
    if finite_only is not None:
        return finite_only
    result = _compare_general(name, actual, reference, atol, rtol, tolerance_source)
    if extra is None:
        return result
    bad = _mismatches_with_allowance(actual, reference, atol, rtol, extra.reshape(reference.shape))
    return replace(result, passed=not bool(bad.any()), mismatches=int(bad.sum()))


def _mismatches_with_allowance(
    actual: np.ndarray, reference: np.ndarray, atol: float, rtol: float, allowance: np.ndarray
) -> np.ndarray:
    """The elements outside atol + rtol·|reference| + allowance, in the values' own float64
    (a float64 array is not rounded to float32 first, as the statistics are); a non-finite
    pair is outside unless both are NaN or the same infinity."""
    o = np.asarray(reference, np.float64)
    m = np.asarray(actual, np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        bound = atol + rtol * np.abs(o) + allowance
        finite = np.isfinite(m) & np.isfinite(o)
        return np.where(finite, np.abs(m - o) > bound, ~((np.isnan(m) & np.isnan(o)) | (m == o)))


def _compare_general(
    name: str,
    actual: np.ndarray,
    reference: np.ndarray,
    atol: float,
    rtol: float,
    tolerance_source: str,
) -> OutputComparison:
    """In: two arrays of one shape, any values. Out: their comparison (module docstring), NaN
    and ±inf included, in whole-array passes: the rule every faster path must equal."""
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


# A comparison where more than this share of the elements differ works on the whole arrays
# rather than on the positions that differ.
DENSE_SHARE = 0.5
QUANTILES = np.array([0.5, 0.99])  # median and p99, nearest rank (`np.quantile`'s "nearest")


def _compare_finite(
    name: str,
    actual: np.ndarray,
    reference: np.ndarray,
    atol: float,
    rtol: float,
    tolerance_source: str,
    allowance: np.ndarray | None = None,
) -> OutputComparison | None:
    """In: two arrays of one shape, and the flat allowance or None. Out: their comparison, the
    same to the bit as `_compare_general`'s (and `_mismatches_with_allowance`'s), when every
    pair is finite, atol and rtol are finite and >= 0, an allowance is >= 0 and the values are
    not float64 (whose statistics round to float32 where the allowance's rule does not): the
    usual case. None otherwise.

    How it saves passes: the sums of products are computed once each (a·a, r·r, a·r and the
    squared error: cosine, SNR and the reference's RMS share them; `blas_dot.dots`, numpy's
    own dot without waking BLAS threads), and their finiteness is the finiteness test (a NaN
    or ±inf makes a sum of squares non-finite). An element where
    the two sides are equal has error 0: it never mismatches, has share 0, contributes
    nothing to min_atol, min_rtol or the ULP distance, and is a 0 in the error's order
    statistics; so those figures are computed over the elements that differ (`Changed`), and
    the medians and p99s by counting the zeros and partitioning only the rest. The means,
    which numpy sums pairwise over the whole array, are taken over the whole arrays."""
    if not (reference.size and 0 <= atol < np.inf and 0 <= rtol < np.inf):
        return None
    if allowance is not None and not (
        _widens_exactly(actual.dtype)
        and _widens_exactly(reference.dtype)
        and allowance.size
        and allowance.min() >= 0
    ):
        return None
    a = _as_float64(actual).reshape(-1)
    r = _as_float64(reference).reshape(-1)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        diff = np.subtract(a, r)
        np.abs(diff, out=diff)
        # (a − r)·(a − r) as |a − r|·|a − r|: the same products
        sum_aa, sum_rr, sum_ar, sum_ee = dots((a, a), (r, r), (a, r), (diff, diff))
        if not (np.isfinite(sum_aa) and np.isfinite(sum_rr)):
            return None
        nonzero = r != 0
        zero_references = int(r.size - np.count_nonzero(nonzero))
        rel = np.divide(diff, r)
        np.abs(rel, out=rel)  # |d / r| = d / |r|, both rounded once
        rel_nonzero = rel[nonzero] if zero_references else rel
        changed = Changed(diff, r, rel, atol, rtol, allowance)
    flat = changed.worst()
    worst = {
        "index": [int(i) for i in np.unravel_index(flat, reference.shape)],
        "machine": float(a[flat]),
        "onnxruntime": float(r[flat]),
        "abs_err": float(diff[flat]),
        "rel_err": float(rel[flat]) if r[flat] != 0 else None,
    }
    return OutputComparison(
        name=name,
        shape=tuple(reference.shape),
        max_abs_err=changed.max_abs(),
        max_rel_err=changed.max_rel(),
        cosine=_cosine_of(sum_aa, sum_rr, sum_ar, a, r),
        atol=atol,
        rtol=rtol,
        passed=changed.bad == 0,
        mismatches=changed.bad,
        size=int(reference.size),
        dtype=str(reference.dtype),
        tolerance_source=tolerance_source,
        abs_err=changed.summary(diff, changed.diff_nonzero, changed.max_abs()),
        rel_err=changed.summary(rel_nonzero, changed.rel_nonzero, changed.max_rel()),
        worst=worst,
        min_atol=min_atol(changed.diff, changed.abs_ref, rtol),
        min_rtol=min_rtol(changed.diff, changed.abs_ref, atol),
        nonfinite={"machine": _no_nonfinite(), "onnxruntime": _no_nonfinite()},
        nonfinite_mismatches=0,
        max_ulp=changed.max_ulp(actual, reference),
        snr_db=_snr_db_of(float(sum_ee), float(sum_rr)),
        finite_pairs=int(reference.size),
        zero_references=zero_references,
        reference_rms=float(np.sqrt(sum_rr / r.size)),
    )


class Changed:
    """The elements of a finite comparison where the two sides differ (error > 0): their
    errors and relative errors (`diff_nonzero`, `rel_nonzero`), and the working arrays the
    mismatches, shares and smallest tolerances are computed on: those elements, or every
    element when more than DENSE_SHARE of them differ (`positions` None then).

    In: the errors |a − r|, the reference, the relative errors |a − r| / |r|, the tolerance,
    and the flat allowance >= 0 added to the bound for the mismatch count (`bad`), or None."""

    def __init__(self, diff, r, rel, atol: float, rtol: float, extra=None):
        positions = np.flatnonzero(diff > 0)  # (numpy finds a bool array's far faster)
        self.count = positions.size
        self.diff_nonzero, ref = diff[positions], r[positions]
        self.rel_nonzero = rel[positions][ref != 0]
        self.positions = None if positions.size > DENSE_SHARE * diff.size else positions
        if self.positions is None:
            self.diff, ref = diff, r
        else:
            self.diff = self.diff_nonzero
        self.abs_ref = np.abs(ref)
        allowance = atol + rtol * self.abs_ref
        if extra is not None:  # the verdict's bound (an element that does not differ passes)
            more = extra if self.positions is None else extra[self.positions]
            self.bad = int(np.count_nonzero(self.diff > allowance + more))
        else:
            self.bad = int(np.count_nonzero(self.diff > allowance))
        with np.errstate(invalid="ignore", divide="ignore"):
            if atol > 0:
                self.share = self.diff / allowance
            else:
                self.share = np.where(
                    allowance > 0, self.diff / allowance, np.where(self.diff > 0, np.inf, 0.0)
                )

    def worst(self) -> int:
        """The flat index of the first element of the largest share; elements that do not
        differ have share 0, so it is 0 when no element differs by a positive share."""
        if not self.share.size:
            return 0
        best = int(np.argmax(self.share))
        if self.positions is None:
            return best
        return int(self.positions[best]) if self.share[best] > 0 else 0

    def max_abs(self) -> float:
        """The largest error (0 when none differs: the errors are >= 0)."""
        return float(self.diff_nonzero.max()) if self.count else 0.0

    def max_rel(self) -> float:
        """The largest relative error where the reference is not 0."""
        return float(self.rel_nonzero.max()) if self.rel_nonzero.size else 0.0

    @staticmethod
    def summary(values: np.ndarray, nonzero: np.ndarray, largest: float) -> dict:
        """`_summary(values)` for values >= 0, `nonzero` the ones that are not 0 (in any
        order) and `largest` their maximum."""
        if not values.size:
            return _summary(values)
        with np.errstate(invalid="ignore", over="ignore"):
            mean = float(values.mean())
        # np.quantile's "nearest" ranks; the values at them do not depend on how they are found
        ranks = np.around((values.size - 1) * QUANTILES).astype(np.intp)
        median, p99 = _nearest_ranks(nonzero, values.size, ranks)
        return {
            "max": largest,
            "mean": mean if not np.isnan(mean) else float("inf"),
            "median": median,
            "p99": p99,
        }

    def max_ulp(self, actual: np.ndarray, reference: np.ndarray) -> int | None:
        """`_max_ulp` over every pair: over those that differ (the others are 0 ULPs apart)."""
        if self.positions is None:
            return _max_ulp(actual, reference, None)
        if not self.count:
            return None if _ulp_integers(reference.dtype) is None else 0
        picked = self.positions
        return _max_ulp(actual.reshape(-1)[picked], reference.reshape(-1)[picked], None)


def _nearest_ranks(nonzero: np.ndarray, size: int, ranks: np.ndarray) -> list[float]:
    """In: `nonzero`, the values among `size` values >= 0 that are not 0 (or all of them),
    and ascending ranks. Out: the value at each rank of the whole sorted."""
    zeros = size - nonzero.size
    above = [int(k) - zeros for k in ranks if k >= zeros]
    return [0.0] * (len(ranks) - len(above)) + _select(nonzero, above)


SELECT_DIRECTLY = 4096  # fewer values than this are partitioned whole
BUCKET_SHIFT = 44  # a bucket: the sign, exponent and top 8 mantissa bits of a float64


def _select(values: np.ndarray, ranks: list[int]) -> list[float]:
    """The values at `ranks` of float64 values >= 0 sorted. The errors take few distinct
    values (multiples of small powers of two), which makes a partition of all of them slow;
    so the values are put in buckets by the leading bits of their representation, which sort
    as the values do, counted, and only the bucket that holds a rank is partitioned."""
    if not ranks:
        return []
    if values.size <= SELECT_DIRECTLY:
        return [float(v) for v in np.partition(values, ranks)[ranks]]
    keys = np.ascontiguousarray(values).view(np.int64) >> BUCKET_SHIFT
    keys -= keys.min()
    counts = np.bincount(keys)
    ends = np.cumsum(counts)
    chosen = []
    for rank in ranks:
        bucket = int(np.searchsorted(ends, rank, side="right"))
        inside = values[keys == bucket]
        rank -= int(ends[bucket] - counts[bucket])
        chosen.append(float(np.partition(inside, rank)[rank]))
    return chosen


def _no_nonfinite() -> dict:
    return {"nan": 0, "posinf": 0, "neginf": 0, "first": []}


def _cosine_of(aa, bb, ab, a: np.ndarray, b: np.ndarray) -> float:
    """`_cosine(a, b)` from its three sums of products."""
    norm = float(np.sqrt(aa * bb))
    if norm == 0.0:
        return 1.0 if not a.any() and not b.any() else 0.0
    return float(ab / norm)


def _snr_db_of(noise: float, signal: float) -> float:
    """`_snr_db` from the squared error's and the reference's sums of squares."""
    if noise == 0.0:
        return float("inf")
    if signal == 0.0:
        return float("-inf")
    return 10.0 * float(np.log10(signal / noise))


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
    ints = _ulp_integers(dtype)
    if ints is None:
        return None
    if finite is not None:
        if not finite.any():
            return None
        actual, reference = actual[finite], reference[finite]
    magnitude = ints(np.iinfo(ints).max)  # every bit but the sign

    def ordered(values: np.ndarray) -> np.ndarray:
        """The bits as integers in the order of the values, ±0 both 0 (fits `ints`)."""
        bits = np.ascontiguousarray(values.astype(dtype, copy=False)).view(ints)
        return np.where(bits < 0, -(bits & magnitude), bits)

    distance = np.subtract(ordered(actual), ordered(reference), dtype=np.int64)
    return int(np.max(np.abs(distance))) if distance.size else None


def _widens_exactly(dtype: np.dtype) -> bool:
    """Whether `_as_float64` gives the values as they are: every dtype but float64 and wider,
    which it rounds to float32 first."""
    return not (dtype.kind in "fc" and dtype.itemsize > 4)


def _ulp_integers(dtype: np.dtype):
    """The signed integer type of a 2- or 4-byte float format's bits; None for others."""
    if dtype.kind not in "fV" or dtype.itemsize not in (2, 4):
        return None
    return np.int32 if dtype.itemsize == 4 else np.int16


def _rms(values: np.ndarray) -> float:
    flat = values.reshape(-1)
    return float(np.sqrt(dots((flat, flat))[0] / flat.size)) if flat.size else 0.0


def _snr_db(a: np.ndarray, r: np.ndarray) -> float:
    e = a - r
    noise, signal = (float(total) for total in dots((e, e), (r, r)))
    if noise == 0.0:
        return float("inf")
    if signal == 0.0:
        return float("-inf")
    return 10.0 * float(np.log10(signal / noise))


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    aa, bb, ab = dots((a, a), (b, b), (a, b))
    norm = float(np.sqrt(aa * bb))
    if norm == 0.0:
        return 1.0 if not a.any() and not b.any() else 0.0
    return float(ab / norm)
