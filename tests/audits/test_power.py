"""The power line: exact values against a slow reference computation, and the underpowered flag."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as st

from dpaudit.accounting.events import SubsampledGaussian
from dpaudit.audits import power
from dpaudit.audits.curves import claimed_curve
from dpaudit.audits.gaussian import calibrate_exact
from dpaudit.audits.stats import gdp_epsilon

DELTA = 1e-5


def _cp(k: int, n: int, conf: float = 0.95) -> float:
    """One-sided Clopper-Pearson upper bound at (1 - conf) / 2, the textbook way."""
    return 1.0 if k >= n else float(st.beta.ppf(1.0 - (1.0 - conf) / 2.0, k + 1, n - k))


def _reference_box_mu(mu_true: float, n_in: int, n_out: int) -> float:
    """max over every false-positive count of the box corner's Gaussian-DP mu at the expected counts."""
    k = np.arange(n_out + 1)
    fn = np.round(n_in * st.norm.cdf(st.norm.ppf(1.0 - k / n_out) - mu_true))
    up = lambda e, n: np.where(e >= n, 1.0, st.beta.ppf(0.975, e + 1, np.maximum(n - e, 1)))  # noqa: E731
    return float(np.max(st.norm.ppf(1.0 - up(k, n_out)) - st.norm.ppf(up(fn, n_in))))


def test_gaussian_power_matches_the_slow_reference():
    sigma = calibrate_exact(4.0, DELTA)
    mu = 1.0 / sigma
    p = power.audit_power(trials=300, delta=DELTA, claimed_epsilon=4.0, curve=claimed_curve(SubsampledGaussian(sigma, 1.0, 1)))
    n_in = n_out = 150 - round(0.3 * 150)
    assert (p.eval_in, p.eval_out) == (n_in, n_out)
    perfect = -2.0 * st.norm.ppf(_cp(0, n_in))
    assert p.ceiling == pytest.approx(gdp_epsilon(perfect, DELTA), rel=1e-6)
    assert p.at_claim == pytest.approx(gdp_epsilon(max(_reference_box_mu(mu, n_in, n_out), 0.0), DELTA), rel=1e-6)
    assert p.detectable and p.estimator.startswith("claimed-curve")
    # the smallest detected understatement: caught at k, not at k + 0.002 (the search's tolerance is 1e-3)
    k = p.smallest_factor
    assert _reference_box_mu(mu / k, n_in, n_out) > mu
    assert _reference_box_mu(mu / (k + 0.002), n_in, n_out) <= mu
    # trials for 90 % of the claim: reached there, not 2 % earlier
    def at(n: int) -> float:
        i, o = power.eval_sizes(n)
        return gdp_epsilon(max(_reference_box_mu(mu, i, o), 0.0), DELTA)
    goal = 0.9 * gdp_epsilon(mu, DELTA)
    assert at(p.trials_for_90) >= goal and at(int(p.trials_for_90 * 0.98)) < goal


def test_point_claim_power_and_the_underpowered_flag():
    """No event: the (eps, delta) point's curve and the box's eps_LB; 40 trials cannot reach a claim of 8."""
    p = power.audit_power(trials=40, delta=DELTA, claimed_epsilon=8.0)
    n = 20 - round(0.3 * 20)
    assert p.ceiling == pytest.approx(math.log((1 - DELTA - _cp(0, n)) / _cp(0, n)), rel=1e-9)
    assert not p.detectable and p.smallest_factor is None
    assert "UNDERPOWERED" in p.line() and "cannot detect a violation at all" in p.line()
    assert "UNDERPOWERED" in power.power_cell(p.to_dict())
    big = power.audit_power(trials=4000, delta=DELTA, claimed_epsilon=1.0)
    assert big.detectable and "UNDERPOWERED" not in big.line() and "needs a Gaussian claim" in big.line()
