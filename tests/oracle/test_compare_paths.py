"""The comparison's fast path for finite values gives the whole-array rule's figures to the bit.

`compare_output` judges most tensors in `_compare_finite`: the elements that differ only, the
zeros of the error counted rather than sorted, the sums of products shared. Every figure of
its record must be the one `_compare_general` (the rule written in whole-array passes) and
`_mismatches_with_allowance` give; floats are compared by their bits.
"""

from __future__ import annotations

import struct
from dataclasses import replace

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from onnx2bir.runtime.oracle import compare
from onnx2bir.runtime.oracle.compare import compare_output


def _general(actual, reference, atol, rtol, allowance=None):
    actual, reference = np.asarray(actual), np.asarray(reference)
    result = compare._compare_general("t", actual, reference, atol, rtol, "")
    if allowance is not None and np.shape(allowance) == reference.shape and not result.shape_error:
        bad = compare._mismatches_with_allowance(
            actual, reference, atol, rtol, np.asarray(allowance, np.float64)
        )
        result = replace(result, passed=not bool(bad.any()), mismatches=int(bad.sum()))
    return result.to_json()


def _differences(x, y, path=""):
    """Where two records differ, floats by their bits (NaN equal to NaN, -0 apart from 0)."""
    if isinstance(x, float) and isinstance(y, float):
        return [] if struct.pack("d", x) == struct.pack("d", y) else [f"{path}: {x!r} {y!r}"]
    if type(x) is not type(y):
        return [f"{path}: {x!r} {y!r}"]
    if isinstance(x, dict):
        if x.keys() != y.keys():
            return [f"{path}: keys"]
        return [d for k in x for d in _differences(x[k], y[k], f"{path}.{k}")]
    if isinstance(x, list | tuple):
        if len(x) != len(y):
            return [f"{path}: length"]
        return [d for i, (u, v) in enumerate(zip(x, y, strict=True)) for d in _differences(u, v)]
    return [] if x == y else [f"{path}: {x!r} {y!r}"]


def _assert_same(actual, reference, atol=1e-4, rtol=1e-3, allowance=None):
    fast = compare_output("t", actual, reference, atol, rtol, "", allowance).to_json()
    assert _differences(fast, _general(actual, reference, atol, rtol, allowance)) == []


def _pair(rng, shape, share_equal, scale=1.0):
    reference = (rng.standard_normal(shape) * scale).astype(np.float32)
    actual = reference + (rng.standard_normal(shape) * scale * 1e-4).astype(np.float32)
    equal = rng.random(shape) < share_equal
    return np.where(equal, reference, actual), reference


@pytest.mark.parametrize("share_equal", [0.0, 0.5, 0.9, 0.999, 1.0])
@pytest.mark.parametrize("shape", [(1,), (5,), (3, 7), (40_000,), (8, 64, 33)])
def test_a_finite_pair_gets_the_general_figures(share_equal, shape):
    rng = np.random.default_rng(len(shape) * 10 + int(share_equal * 100))
    actual, reference = _pair(rng, shape, share_equal)
    assert compare._compare_finite("t", actual, reference, 1e-4, 1e-3, "") is not None
    _assert_same(actual, reference)
    zeros = reference.copy()
    zeros.reshape(-1)[::3] = 0  # exact zero references: left out of the relative error
    _assert_same(np.where(actual == reference, zeros, actual), zeros)
    _assert_same(actual, reference, allowance=np.abs(rng.standard_normal(shape)) * 1e-4)


@pytest.mark.parametrize(
    "atol, rtol", [(0.0, 0.0), (0.0, 1e-3), (1e-4, 0.0), (1e-30, 1e-30), (10.0, 2.0)]
)
def test_every_bound_gets_the_general_figures(atol, rtol):
    rng = np.random.default_rng(7)
    actual, reference = _pair(rng, (999,), 0.8, scale=1e3)
    _assert_same(actual, reference, atol, rtol)
    _assert_same(actual, reference, atol, rtol, np.full(999, 0.5))


@pytest.mark.parametrize(
    "dtype", [np.float16, ml_dtypes.bfloat16, np.float64, np.int32, np.int64, np.bool_]
)
def test_every_dtype_gets_the_general_figures(dtype):
    rng = np.random.default_rng(3)
    actual, reference = _pair(rng, (2_000,), 0.7, scale=50.0)
    actual, reference = actual.astype(dtype), reference.astype(dtype)
    _assert_same(actual, reference)
    _assert_same(actual, reference, allowance=np.full(2_000, 1e-3))
    _assert_same(actual, reference.astype(np.float32))  # another dtype on each side


def test_the_other_cases_take_the_general_path():
    """NaN and ±inf, an allowance below 0 or NaN, a negative bound, a shape mismatch, empty
    arrays, a layout other than C's: the figures are the general rule's."""
    rng = np.random.default_rng(5)
    actual, reference = _pair(rng, (30, 20), 0.5)
    nan = actual.copy()
    nan[0, 0] = np.nan
    both_nan = reference.copy()
    both_nan[3, 4] = np.nan
    _assert_same(nan, reference)
    _assert_same(both_nan.copy(), both_nan)
    _assert_same(actual, np.full((30, 20), np.inf, np.float32))
    _assert_same(actual, reference, allowance=-np.ones((30, 20)))
    _assert_same(actual, reference, allowance=np.full((30, 20), np.nan))
    _assert_same(actual, reference, allowance=np.zeros(3))  # another shape: not applied
    _assert_same(actual, reference, atol=-1.0)
    _assert_same(np.asfortranarray(actual), reference)
    _assert_same(actual[:, ::3], reference[:, ::3])
    _assert_same(actual[:, :2].T, reference[:, :2].T)
    _assert_same(np.zeros((0, 4), np.float32), np.zeros((0, 4), np.float32))
    _assert_same(np.float32(1.5), np.float32(1.25))
    assert compare_output("t", np.zeros(3), np.zeros(4)).shape_error


_floats = st.floats(-1e6, 1e6, width=32, allow_nan=False, allow_infinity=False)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(_floats, _floats, st.booleans()), min_size=1, max_size=40),
    st.sampled_from([0.0, 1e-6, 1e-4, 0.5]),
    st.sampled_from([0.0, 1e-6, 1e-3, 0.5]),
)
def test_the_smallest_tolerances_and_the_worst_element_are_the_general_ones(pairs, atol, rtol):
    """min_atol and min_rtol sit on a rounding edge; ties of the worst share go to the first."""
    reference = np.array([r for _, r, _ in pairs], np.float32)
    actual = np.array([r if same else a for a, r, same in pairs], np.float32)
    _assert_same(actual, reference, atol, rtol)
    _assert_same(actual, reference, atol, rtol, np.abs(reference) * 1e-7)


@pytest.mark.parametrize("kind", ["ties", "wide", "one value", "tiny"])
def test_order_statistics_by_buckets_are_those_of_a_sort(kind):
    rng = np.random.default_rng(11)
    values = {
        "ties": rng.integers(1, 40, 50_000) * 2.0**-30,
        "wide": 10.0 ** rng.uniform(-300, 300, 50_000),
        "one value": np.full(50_000, 0.375),
        "tiny": rng.integers(1, 5, 50_000) * 5e-324,
    }[kind]
    ranks = [0, 1, 24_999, 49_500, 49_999]
    assert compare._select(values, ranks) == [float(v) for v in np.sort(values)[ranks]]


def test_comparisons_two_at_a_time_give_the_figures_of_one_at_a_time():
    """The verdict compares its checkpoints in two threads (`verdict._each`) with BLAS held
    on one thread (`blas_dot.one_thread`): every record is the one a lone comparison gives,
    NaN and ±inf included (the general path's own sums of products)."""
    from onnx2bir.runtime.oracle import blas_dot, verdict

    rng = np.random.default_rng(11)
    pairs = []
    for size in (100, 30_000, 1_000_003):
        r = rng.standard_normal(size).astype(np.float32)
        a = (r + rng.standard_normal(size).astype(np.float32) * 1e-4).astype(np.float32)
        pairs.append((a, r))
        special = a.copy()
        special[:3] = [np.nan, np.inf, -np.inf]
        pairs.append((special, r))
    alone = [compare_output("t", a, r).to_json() for a, r in pairs]
    together = verdict._each(lambda pair: compare_output("t", *pair).to_json(), pairs)
    for x, y in zip(alone, together, strict=True):
        assert not _differences(x, y)
    x, y = rng.standard_normal(1_000_003), rng.standard_normal(1_000_003)
    with blas_dot.one_thread():
        held = blas_dot.dots((x, y))[0]
    assert held == np.dot(x, y)
