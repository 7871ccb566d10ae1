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
    p = power.audit_power(
        trials=300,
        delta=DELTA,
        claimed_epsilon=4.0,
        curve=claimed_curve(SubsampledGaussian(sigma, 1.0, 1)),
    )
    n_in = n_out = 150 - round(0.3 * 150)
    assert (p.eval_in, p.eval_out) == (n_in, n_out)
    perfect = -2.0 * st.norm.ppf(_cp(0, n_in))
    assert p.ceiling == pytest.approx(gdp_epsilon(perfect, DELTA), rel=1e-6)
    assert p.at_claim == pytest.approx(
        gdp_epsilon(max(_reference_box_mu(mu, n_in, n_out), 0.0), DELTA), rel=1e-6
    )
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
    assert big.detectable and "UNDERPOWERED" not in big.line()
    assert "n/a: an (epsilon, delta) claim without a DP event names no noise to scale" in big.line()
    # a record written before the factor was general
    new_keys = ("factor_note", "factor_name", "unit", "kind")
    old = {k: v for k, v in big.to_dict().items() if k not in new_keys}
    assert "not computed (needs a Gaussian claim)" in power.power_line(old)


def _pure_reference_best(eps_mechanism: float, claim: float, n_in: int, n_out: int) -> float:
    """max over every false-positive count of the box's eps_LB at the expected counts of a pure
    eps_mechanism-DP mechanism."""
    k = np.arange(n_out + 1)
    a = k / n_out
    e = np.exp(eps_mechanism)
    fn = np.round(n_in * np.maximum(0.0, np.maximum(1 - e * a, (1 - a) / e)))

    def upper(errors, n):
        return np.where(errors >= n, 1.0, st.beta.ppf(0.975, errors + 1, np.maximum(n - errors, 1)))

    fpr, fnr = upper(k, n_out), upper(fn, n_in)
    with np.errstate(divide="ignore", invalid="ignore"):
        both = np.maximum(np.log((1 - DELTA - fnr) / fpr), np.log((1 - DELTA - fpr) / fnr))
    return float(np.nanmax(both))


def test_pure_claim_smallest_factor_really_crosses_the_claim():
    """A Laplace (pure epsilon) claim: the factor scales the noise (epsilon / k), found, not n/a."""
    from dpaudit.accounting.events import PureEpsilon

    curve = claimed_curve(PureEpsilon(1.0))
    p = power.audit_power(trials=300, delta=DELTA, claimed_epsilon=1.0, curve=curve)
    k = p.smallest_factor
    assert p.factor_name == "noise" and 0.0 < k < 1.0 and f"noise x {k:.2f}" in p.line()
    assert _pure_reference_best(1.0 / k, 1.0, p.eval_in, p.eval_out) > 1.0
    assert _pure_reference_best(1.0 / (k * 1.002), 1.0, p.eval_in, p.eval_out) <= 1.0
