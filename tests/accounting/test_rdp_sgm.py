"""The numpy-only RDP analysis (rdp_sgm.py) gives Opacus's numbers, to floating-point rounding.

The reference is ``opacus.accountants.analysis.rdp`` itself (imported here; in this process its
own module). "Rounding" is measured: both evaluate the same series in doubles, with different
special functions (scipy's binom / log_ndtr against math's erfc / gamma and exact products), and
in the fractional-order series (sums of terms that cancel) the two differ by up to ~1e-9 of a
curve value at a few orders, where each is further than that from the exact value (checked with
mpmath while writing this: q 0.5, sigma 30, order 1.1: reference 1.528032396e-05, ours
1.528032392e-05, exact 1.528032373e-05). On epsilon (what a claim reports) the largest
difference over the grid below is ~2e-12 relative.
"""

from __future__ import annotations

import itertools
import math
import subprocess
import sys
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import opacus.accountants.analysis.rdp as opacus_rdp
from scipy import special

from dpaudit.accounting import (
    Composed,
    Parallel,
    SubsampledGaussian,
    compute_delta,
    compute_epsilon,
    rdp_sgm,
)
from dpaudit.accounting.accountants import RDP_ORDERS

#: Largest relative difference allowed on an epsilon (observed: 2.2e-12 at T = 10,000).
EPS_RTOL = 5e-12
#: ... and on a value of the RDP curve (observed: 2.4e-9, q 0.5, sigma 30, order 1.1; see above).
CURVE_RTOL = 1e-8
ORDERS = list(RDP_ORDERS)


def _reference_curve(q, sigma, orders=ORDERS, steps=1):
    return np.asarray(
        opacus_rdp.compute_rdp(q=q, noise_multiplier=sigma, steps=steps, orders=orders), dtype=float
    )


def _reference_epsilon(curve, delta, orders=ORDERS):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Opacus warns about extreme optimal orders
        return opacus_rdp.get_privacy_spent(orders=orders, rdp=list(curve), delta=delta)


def _assert_same_curve(ours, theirs):
    assert np.array_equal(np.isnan(ours), np.isnan(theirs)) and np.array_equal(
        np.isinf(ours), np.isinf(theirs)
    )
    fin = np.isfinite(theirs)
    np.testing.assert_allclose(ours[fin], theirs[fin], rtol=CURVE_RTOL, atol=0)


GRID = list(
    itertools.product((1e-6, 1e-4, 0.004266, 0.01, 0.1, 0.5, 0.9), (0.3, 0.8, 1.1, 2.0, 5.0, 30.0))
)


@pytest.mark.parametrize("q,sigma", GRID, ids=[f"q{q:g}-s{s:g}" for q, s in GRID])
def test_curve_and_epsilon_equal_opacus(q, sigma):
    ours = rdp_sgm.compute_rdp(q=q, noise_multiplier=sigma, steps=1, orders=ORDERS)
    theirs = _reference_curve(q, sigma)
    _assert_same_curve(ours, theirs)
    for steps, delta in itertools.product((1, 100, 10_000), (1e-5, 1e-9)):
        e1, o1 = rdp_sgm.get_privacy_spent(orders=ORDERS, rdp=list(ours * steps), delta=delta)
        e2, o2 = _reference_epsilon(theirs * steps, delta)
        assert o1 == o2, (steps, delta)
        assert e1 == pytest.approx(e2, rel=EPS_RTOL, abs=0), (steps, delta)


def test_conversion_is_opacus_expression_bit_for_bit():
    curve = _reference_curve(0.01, 1.1) * 1000
    for delta in (1e-3, 1e-5, 1e-9):
        assert rdp_sgm.get_privacy_spent(
            orders=ORDERS, rdp=list(curve), delta=delta
        ) == _reference_epsilon(curve, delta)
    nan = [math.nan] * 3
    assert math.isinf(rdp_sgm.get_privacy_spent(orders=[2.0, 3.0, 4.0], rdp=nan, delta=1e-5)[0])


@pytest.mark.parametrize(
    "sigma,q,steps,delta",
    [
        (1.1, 0.004266, 2345, 1e-5),
        (0.6, 0.02, 500, 1e-5),
        (4.0, 0.01, 1000, 1e-6),
        (0.7, 0.001, 10000, 1e-5),
        (1.3, 0.05, 300, 1e-7),
        (2.0, 1.0, 10, 1e-5),
        (13.625, 1 / 188, 5640, 1e-5),
        (0.9, 0.25, 120, 1e-5),
    ],
)
def test_accountant_epsilon_and_delta_unchanged(sigma, q, steps, delta):
    """compute_epsilon / compute_delta (rdp) against the numbers of Opacus's analysis."""
    curve = _reference_curve(q, sigma, steps=steps)
    eps, order = _reference_epsilon(curve, delta)
    got = compute_epsilon(SubsampledGaussian(sigma, q, steps), delta=delta, accountant="rdp")
    assert (
        got.epsilon == pytest.approx(max(0.0, float(eps)), rel=EPS_RTOL, abs=0)
        and got.optimal_order == order
    )
    back = compute_delta(SubsampledGaussian(sigma, q, steps), epsilon=got.epsilon, accountant="rdp")
    assert back.delta == pytest.approx(delta, rel=1e-9)


def test_composed_and_parallel_events_unchanged():
    a, b, c = (
        SubsampledGaussian(1.0, 0.01, 1000),
        SubsampledGaussian(0.8, 0.02, 500),
        SubsampledGaussian(3.0, 1.0, 7),
    )
    curve_ab = _reference_curve(0.01, 1.0, steps=1000) + _reference_curve(0.02, 0.8, steps=500)
    eps_ab = _reference_epsilon(curve_ab, 1e-5)[0]
    eps_c = _reference_epsilon(_reference_curve(1.0, 3.0, steps=7), 1e-5)[0]
    assert compute_epsilon(Composed((a, b)), delta=1e-5).epsilon == pytest.approx(
        eps_ab, rel=EPS_RTOL, abs=0
    )
    assert compute_epsilon(Parallel((Composed((a, b)), c)), delta=1e-5).epsilon == pytest.approx(
        max(eps_ab, eps_c), rel=EPS_RTOL, abs=0
    )


def test_special_cases_and_huge_orders_as_opacus():
    """q 0 / 1, sigma 0, infinite orders, the NaN / inf the reference gives where binomial
    coefficients overflow (orders >= 2048), orders next to that boundary and large fractional
    orders (the last two are handed to the reference)."""
    orders = [
        1.5,
        2.0,
        3.0,
        64.0,
        70.5,
        1000.0,
        1024.0,
        1029.0,
        1030.0,
        1031.0,
        1032.0,
        1100.0,
        2048.0,
        4095.0,
        16384.0,
        math.inf,
    ]
    for q, sigma in [
        (0.0, 1.0),
        (1.0, 1.0),
        (1.0, 0.37),
        (0.3, 0.0),
        (0.004, 0.8),
        (0.5, 3.0),
        (0.9, 30.0),
    ]:
        ours = rdp_sgm.compute_rdp(q=q, noise_multiplier=sigma, steps=3, orders=orders)
        theirs = _reference_curve(q, sigma, orders, steps=3)
        _assert_same_curve(ours, theirs)


@settings(max_examples=30, deadline=None)
@given(q=st.floats(1e-7, 0.999), sigma=st.floats(0.2, 50.0), steps=st.integers(1, 100_000))
def test_property_matches_opacus(q, sigma, steps):
    orders = [1.1, 1.5, 2.0, 2.7, 4.0, 7.9, 12.0, 32.0, 100.0, 256.0]
    ours = rdp_sgm.compute_rdp(q=q, noise_multiplier=sigma, steps=steps, orders=orders)
    theirs = _reference_curve(q, sigma, orders, steps=steps)
    _assert_same_curve(ours, theirs)
    e1, o1 = rdp_sgm.get_privacy_spent(orders=orders, rdp=list(ours), delta=1e-5)
    e2, o2 = _reference_epsilon(theirs, 1e-5, orders)
    # The conversion is exactly Opacus's (test_conversion_is_opacus_expression_bit_for_bit) and is a minimum over
    # orders of rdp + a term of the order alone, so the epsilons differ by at most the curves' largest gap, which
    # _assert_same_curve bounds (seen: 1.8e-11 relative at q 0.625, sigma 4, 18,065 steps, above EPS_RTOL).
    fin = np.isfinite(theirs)
    gap = float(np.max(np.abs(np.asarray(ours)[fin] - np.asarray(theirs)[fin]), initial=0.0))
    assert abs(e1 - e2) <= gap + 4 * np.spacing(abs(e2)), (e1, e2, gap, o1, o2)


def test_log_erfc_against_scipy_log_ndtr():
    """The reference's log erfc is log(2) + scipy's log_ndtr(-x sqrt 2); ours agrees to a few ulp
    (of the result, or of log(2) where the result is a small difference)."""
    xs = np.concatenate(
        [np.linspace(-40, 40, 4001), np.logspace(-8, 3, 500), -np.logspace(-8, 3, 500)]
    )
    for x in xs:
        ref = math.log(2) + float(special.log_ndtr(-x * 2**0.5))
        got = rdp_sgm.log_erfc(float(x))
        # a few ulp of the larger of the result and the log(2) it is computed from
        assert abs(got - ref) <= 4 * math.ulp(max(abs(ref), 1.0)), (x, got, ref)


def test_module_does_not_import_scipy():
    code = (
        "import sys\nfrom dpaudit.accounting import rdp_sgm\n"
        "from dpaudit.accounting.accountants import RDP_ORDERS\n"
        "rdp_sgm.compute_rdp(q=0.01, noise_multiplier=1.1, steps=10, orders=RDP_ORDERS)\n"
        "print(sorted(m for m in ('scipy', 'opacus', 'torch') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    ).stdout.split()
    assert out == ["[]"]
