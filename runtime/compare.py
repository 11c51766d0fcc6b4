"""Compare the machine's outputs with the oracle's.

An element passes when |actual − reference| ≤ atol + rtol·|reference| (numpy's allclose
form); NaN passes only against NaN, ±inf only against the same infinity. Per output the
comparison reports the largest absolute and relative errors, the cosine similarity and the
tolerance that was applied.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Defaults for the fp32 generic path: a reduction of a few thousand fp32 products in another
# order moves the result by ~1e-6 relative; 1e-4 absolute covers values near zero.
FP32_ATOL = 1e-4
FP32_RTOL = 1e-3


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

    def to_json(self) -> dict:
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
        }


def compare_output(
    name: str,
    actual: np.ndarray,
    reference: np.ndarray,
    atol: float = FP32_ATOL,
    rtol: float = FP32_RTOL,
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
        )
    a = actual.astype(np.float64)
    r = reference.astype(np.float64)
    both_nan = np.isnan(a) & np.isnan(r)
    same_inf = np.isinf(a) & np.isinf(r) & (np.sign(a) == np.sign(r))
    special = both_nan | same_inf
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.where(special, 0.0, np.abs(a - r))
        diff = np.where(np.isnan(diff), np.inf, diff)
        bad = diff > atol + rtol * np.abs(np.where(special, 0.0, r))
        rel = diff / np.maximum(np.abs(r), np.finfo(np.float64).tiny)
    finite = ~special & np.isfinite(a) & np.isfinite(r)
    cosine = _cosine(a[finite], r[finite])
    return OutputComparison(
        name,
        tuple(reference.shape),
        float(diff.max()) if diff.size else 0.0,
        float(np.where(special, 0.0, rel).max()) if diff.size else 0.0,
        cosine,
        atol,
        rtol,
        not bool(bad.any()),
        int(bad.sum()),
    )


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    norm = float(np.linalg.norm(a) * np.linalg.norm(b))
    if norm == 0.0:
        return 1.0 if not a.any() and not b.any() else 0.0
    return float(np.dot(a.ravel(), b.ravel()) / norm)
