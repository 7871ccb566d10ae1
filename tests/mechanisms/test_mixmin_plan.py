"""The rho guideline of appendix A.2 (eqs. 4-7), checked against the formulas written out again."""

from __future__ import annotations

import math

import pytest

from dpaudit.errors import UsageError
from dpaudit.mechanisms.mixmin.plan import alpha_for_size, plan_rho


def test_plan_matches_equations_and_paper_reading():
    p = plan_rho(n=89_700, k=14, epsilon=1.0, delta=1e-5, alpha=0.1, rho=0.1)
    assert p.statistics_limited_size == pytest.approx(4 / 0.01)
    assert p.privacy_limited_size == pytest.approx(2 * math.sqrt(14 * math.log(1e5)) / 0.1)
    assert p.required_size == max(p.statistics_limited_size, p.privacy_limited_size)
    assert p.rho == pytest.approx(p.required_size / 89_700)
    # the paper: "k = 14, delta = 1e-5 give eps* ~ 0.63 < 1" -> statistics-limited at eps = 1
    assert p.epsilon_crossover == pytest.approx(0.63, abs=0.01)
    assert p.regime == "statistics-limited" and p.feasible
    assert p.alpha_at_rho_given == pytest.approx(
        alpha_for_size(8_970, k=14, epsilon=1.0, delta=1e-5)
    )


def test_privacy_limited_below_crossover_and_infeasible_when_data_is_short():
    p = plan_rho(n=1_000, k=14, epsilon=0.1, delta=1e-5, alpha=0.1)
    assert p.regime == "privacy-limited"
    assert p.required_size == pytest.approx(2 * math.sqrt(14 * math.log(1e5)) / (0.1 * 0.1))
    assert not p.feasible and p.rho > 1


def test_alpha_for_size_inverts_the_plan():
    p = plan_rho(n=10**6, k=10, epsilon=0.5, delta=1e-6, alpha=0.05)
    assert alpha_for_size(p.required_size, k=10, epsilon=0.5, delta=1e-6) == pytest.approx(0.05)


def test_plan_validation():
    with pytest.raises(UsageError, match=r"^alpha must be a finite number > 0, got -1"):
        plan_rho(n=10, k=2, epsilon=1, delta=1e-5, alpha=-1)
    with pytest.raises(UsageError, match="rho must be in"):
        plan_rho(n=10, k=2, epsilon=1, delta=1e-5, alpha=0.1, rho=2.0)
