"""The report's own cross-check statistics against independent references."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpaudit.reports import stats


def _cp_upper_brute(k: int, n: int, alpha: float) -> float:
    """Largest p with P(Binom(n, p) <= k) >= alpha, by bisection on the binomial CDF."""
    from scipy.stats import binom

    if k >= n:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(80):
        mid = (lo + hi) / 2
        if binom.cdf(k, n, mid) > alpha:
            lo = mid
        else:
            hi = mid
    return lo


@pytest.mark.parametrize("k,n", [(0, 10), (3, 50), (17, 200), (99, 100), (100, 100)])
def test_cp_upper_matches_binomial_inversion(k, n):
    assert stats.cp_upper(k, n, 0.025) == pytest.approx(_cp_upper_brute(k, n, 0.025), abs=1e-9)


@pytest.mark.parametrize("per_world,expected", [(100, 3.3), (500, 4.9), (1000, 5.6)])
def test_ceiling_matches_design_reference(per_world, expected):
    c = stats.ceiling(n_in=per_world, n_out=per_world, delta=1e-5, confidence=0.95)
    assert c == pytest.approx(expected, abs=0.06)


def test_bound_agrees_with_the_audit_module():
    from dpaudit.audits import stats as astats

    for counts in [(480, 20, 490, 10), (250, 250, 250, 250), (100, 0, 100, 0), (30, 5, 40, 12)]:
        tp, fp, tn, fn = counts
        mine = stats.epsilon_lower_bound(tp=tp, fp=fp, tn=tn, fn=fn, delta=1e-5, confidence=0.95)
        theirs = astats.epsilon_lower_bound(
            tp=tp, fp=fp, tn=tn, fn=fn, delta=1e-5, confidence=0.95
        ).epsilon
        assert mine == pytest.approx(theirs, rel=1e-9, abs=1e-12)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 300), st.integers(1, 300), st.data())
def test_bound_never_exceeds_ceiling(n_in, n_out, data):
    fn = data.draw(st.integers(0, n_in))
    fp = data.draw(st.integers(0, n_out))
    b = stats.epsilon_lower_bound(
        tp=n_in - fn, fp=fp, tn=n_out - fp, fn=fn, delta=1e-5, confidence=0.95
    )
    c = stats.ceiling(n_in=n_in, n_out=n_out, delta=1e-5, confidence=0.95)
    assert 0.0 <= b <= c + 1e-12


def test_mean_sd_single_and_many():
    assert stats.mean_sd([0.5]) == (0.5, None, 1)
    m, sd, n = stats.mean_sd([1.0, 2.0, 4.0])
    assert (m, n) == (pytest.approx(7 / 3), 3) and sd == pytest.approx(np.std([1, 2, 4], ddof=1))
    m, sd, n = stats.mean_sd([])
    assert math.isnan(m) and sd is None and n == 0
