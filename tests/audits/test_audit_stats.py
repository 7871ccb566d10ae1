"""Audit statistics against independent references: exact binomial / beta values, brute force."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import integrate, stats as sps

from dpaudit.audits import stats
from dpaudit.errors import DataError, UsageError


@pytest.mark.parametrize(
    "k,n,conf", [(0, 10, 0.95), (3, 50, 0.95), (17, 100, 0.9), (49, 50, 0.99), (250, 1000, 0.95)]
)
def test_cp_upper_is_the_exact_binomial_bound(k, n, conf):
    a = (1 - conf) / 2  # significance split between the two bounds
    u = stats.cp_upper(k, n, conf)
    # Definition: the largest p with P(Bin(n, p) <= k) >= a, i.e. P(Bin(n, u) <= k) = a exactly.
    assert sps.binom.cdf(k, n, u) == pytest.approx(a, rel=1e-7)
    assert u == pytest.approx(sps.beta.ppf(1 - a, k + 1, n - k), rel=1e-10)


def test_cp_upper_is_one_when_every_trial_errs_and_split_matters():
    assert stats.cp_upper(20, 20, 0.95) == 1.0
    # split=1 is a plain one-sided bound at 95 %: 1 - 0.05^(1/n) for k = 0
    assert stats.cp_upper(0, 100, 0.95, split=1) == pytest.approx(1 - 0.05 ** (1 / 100), rel=1e-10)
    assert stats.cp_upper(0, 100, 0.95) == pytest.approx(1 - 0.025 ** (1 / 100), rel=1e-10)


@pytest.mark.parametrize("p", [0.01, 0.1, 0.37, 0.8])
def test_cp_upper_coverage_at_least_nominal(p):
    n, conf = 60, 0.95
    a = (1 - conf) / 2
    # exact coverage over the binomial law
    ks = np.arange(n + 1)
    upper = stats.cp_upper(ks, np.full(n + 1, n), conf)
    exact = float(np.sum(sps.binom.pmf(ks, n, p) * (p <= upper)))
    assert exact >= 1 - a - 1e-12
    # and by simulation (20,000 draws; the tolerance is 4 Monte-Carlo standard errors)
    rng = np.random.default_rng(7)
    draws = rng.binomial(n, p, size=20_000)
    cover = np.mean(p <= upper[draws])
    assert cover >= 1 - a - 4 * math.sqrt(a * (1 - a) / draws.size)


def test_joint_coverage_of_eps_lb_by_simulation():
    """At an exact-epsilon Gaussian tradeoff the bound exceeds the truth in <= 5 % of audits."""
    rng = np.random.default_rng(11)
    mu, delta = 1.0, 1e-5
    true_eps = stats.gdp_epsilon(mu, delta)
    n = 200
    t = mu / 2  # fixed threshold: FPR = 1 - Phi(t), FNR = Phi(t - mu)
    fpr, fnr = 1 - sps.norm.cdf(t), sps.norm.cdf(t - mu)
    fp = rng.binomial(n, fpr, size=4000)
    fn = rng.binomial(n, fnr, size=4000)
    eps = stats.epsilon_from_rates(
        stats.cp_upper(fp, np.full(fp.size, n)), stats.cp_upper(fn, np.full(fn.size, n)), delta
    )
    point = math.log((1 - delta - fnr) / fpr)  # what this test can certify at best
    assert point < true_eps
    assert np.mean(eps > point) <= 0.05


def test_epsilon_from_rates_formula_and_delta_term():
    f, g, d = 0.01, 0.3, 1e-3
    want = max(0.0, math.log((1 - d - g) / f), math.log((1 - d - f) / g))
    assert stats.epsilon_from_rates(f, g, d) == pytest.approx(want)
    # dropping delta would inflate the bound
    assert stats.epsilon_from_rates(f, g, 0.0) > stats.epsilon_from_rates(f, g, 0.05)
    assert stats.epsilon_from_rates(0.6, 0.6, 1e-5) == 0.0


@pytest.mark.parametrize("per_world,expected", [(100, 3.3), (500, 4.9), (1000, 5.6)])
def test_ceiling_matches_design_values(per_world, expected):
    c = stats.ceiling(per_world, per_world, delta=1e-5, confidence=0.95)
    a = 0.025
    fpr = 1 - a ** (1 / per_world)
    assert c == pytest.approx(math.log((1 - 1e-5 - fpr) / fpr), rel=1e-9)
    assert round(c, 1) == pytest.approx(expected, abs=0.051)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 400), k=st.integers(0, 400), conf=st.floats(0.5, 0.999))
def test_cp_upper_invariants(n, k, conf):
    k = min(k, n)
    u = stats.cp_upper(k, n, conf)
    assert k / n <= u <= 1.0
    if k < n:
        assert stats.cp_upper(k + 1, n, conf) >= u
        assert stats.cp_upper(k, n, min(conf + 0.0005, 0.9995)) >= u - 1e-12


def _brute_force_select(s, y, delta, conf):
    best = -1.0
    u = np.unique(s)
    cands = [-np.inf, np.inf] + list((u[:-1] + u[1:]) / 2)
    for t in cands:
        for direction in ("greater", "less"):
            tp, fp, tn, fn = stats.confusion(s, y, t, direction)
            e = stats.epsilon_lower_bound(
                tp=tp, fp=fp, tn=tn, fn=fn, delta=delta, confidence=conf
            ).epsilon
            best = max(best, e)
    return best


@pytest.mark.parametrize("shift", [0.0, 0.8, -2.5])
def test_select_threshold_matches_brute_force(shift):
    rng = np.random.default_rng(3)
    y = rng.random(120) < 0.5
    s = rng.normal(size=120).round(1) + shift * y  # rounding creates ties
    thr = stats.select_threshold(s, y, delta=1e-5)
    assert thr.select_epsilon == pytest.approx(_brute_force_select(s, y, 1e-5, 0.95))
    tp, fp, tn, fn = stats.confusion(s, y, thr.threshold, thr.direction)
    assert stats.epsilon_lower_bound(
        tp=tp, fp=fp, tn=tn, fn=fn, delta=1e-5
    ).epsilon == pytest.approx(thr.select_epsilon)
    if shift < -1:
        assert thr.direction == "less"


def test_nonfinite_scores_are_refused():
    with pytest.raises(DataError, match="finite"):
        stats.select_threshold([0.0, np.nan, 1.0, 2.0], [True, False, True, False], delta=1e-5)
    with pytest.raises(UsageError):
        stats.epsilon_lower_bound(tp=0, fp=0, tn=0, fn=5, delta=1e-5)


def test_roc_and_auc_against_pairwise_count():
    rng = np.random.default_rng(5)
    y = np.r_[np.ones(40, bool), np.zeros(50, bool)]
    s = rng.normal(size=90).round(1) + y
    pairs = (s[y][:, None] > s[~y][None, :]).mean() + 0.5 * (s[y][:, None] == s[~y][None, :]).mean()
    r = stats.roc(s, y)
    assert r["auc"] == pytest.approx(pairs)
    assert stats.roc(s, y, "less")["auc"] == pytest.approx(1 - pairs)
    assert r["fpr"][0] == 0.0 and r["fpr"][-1] == 1.0 and r["tpr"][-1] == 1.0


def _delta_by_integration(eps, mu):
    """delta(eps) = E_{x ~ N(mu, 1)}[(1 - e^{eps - L(x)})_+], L(x) = mu x - mu^2 / 2 (privacy loss)."""
    f = lambda x: max(0.0, 1 - math.exp(eps - (mu * x - mu * mu / 2))) * sps.norm.pdf(x - mu)  # noqa: E731
    lo = (eps + mu * mu / 2) / mu
    return integrate.quad(f, lo, lo + 40, epsabs=1e-14, epsrel=1e-10, limit=200)[0]


@pytest.mark.parametrize("mu,eps", [(0.3, 0.5), (1.0, 1.0), (2.0, 4.0), (0.5, 2.0)])
def test_gdp_delta_matches_numerical_integration(mu, eps):
    assert stats.gdp_delta(eps, mu) == pytest.approx(_delta_by_integration(eps, mu), rel=1e-6)


def test_gdp_epsilon_inverts_delta_and_matches_prv():
    from dpaudit.accounting import SubsampledGaussian, compute_epsilon

    for sigma in (0.8, 2.0, 5.0):
        e = stats.gdp_epsilon(1 / sigma, 1e-5)
        assert stats.gdp_delta(e, 1 / sigma) == pytest.approx(1e-5, rel=1e-8)
        prv = compute_epsilon(
            SubsampledGaussian(sigma, 1.0, 1), delta=1e-5, accountant="prv"
        ).epsilon
        assert e == pytest.approx(prv, rel=0.02)
    assert stats.gdp_mu_for_epsilon(1.0, 1e-5) == pytest.approx(
        1 / 3.7305, rel=0.01
    )  # known sigma ~ 3.73 at (1, 1e-5)


def test_gdp_estimate_is_zero_on_reversed_scores_and_labelled():
    y = np.r_[np.ones(100, bool), np.zeros(100, bool)]
    s = np.r_[np.zeros(100), np.ones(100)]
    g = stats.gdp_estimate(s, y, "greater", delta=1e-5)
    assert g["mu"] == 0.0 and g["epsilon"] == 0.0 and "not a bound" in g["kind"]
    g0 = stats.gdp_estimate(
        s, y, "less", delta=0.0
    )  # pure-DP claims are stated at a fallback delta
    assert g0["delta"] == stats.GDP_FALLBACK_DELTA and g0["epsilon"] > 5


@pytest.mark.parametrize("confidence", [0.9, 0.95, 0.999])
def test_clopper_pearson_equals_statsmodels(confidence):
    """cp_upper / the two-sided interval are statsmodels' proportion_confint(method="beta"),
    computed without importing statsmodels (and pandas) at audit time."""
    from statsmodels.stats.proportion import proportion_confint

    from dpaudit.audits.stats import _two_sided_cp

    for n in (1, 2, 7, 100, 2000):
        k = np.unique(np.r_[0, 1, n // 3, n - 1, n].clip(0, n))
        a = (1.0 - confidence) / 2
        _, hi = proportion_confint(k, n, alpha=2 * a, method="beta")
        ours = stats.cp_upper(k, np.full(k.size, n), confidence)
        np.testing.assert_array_equal(ours, np.where(k == n, 1.0, hi))
        for kk in k:
            lo2, hi2 = proportion_confint(int(kk), n, alpha=1 - confidence, method="beta")
            lo2 = 0.0 if kk == 0 else float(lo2)
            hi2 = 1.0 if kk == n else float(hi2)
            assert _two_sided_cp(int(kk), n, confidence) == [lo2, hi2]


@given(
    st.lists(st.integers(-3, 3), min_size=1, max_size=30),
    st.lists(st.integers(-3, 3), min_size=1, max_size=30),
)
@settings(max_examples=200, deadline=None)
def test_mann_whitney_u_equals_scipy(x, y):
    """Ties (small integers) included: U counts tied pairs one half, as scipy.stats does."""
    assert stats.mann_whitney_u(x, y) == pytest.approx(sps.mannwhitneyu(x, y).statistic, abs=1e-9)


@given(st.lists(st.integers(-4, 4), min_size=2, max_size=60), st.integers(0, 2**31 - 1))
@settings(max_examples=200, deadline=None)
def test_roc_equals_scikit_learn(values, seed):
    """stats.roc (numpy only, no sklearn import at audit time) gives scikit-learn's points and AUC."""
    from sklearn.metrics import roc_auc_score, roc_curve

    s = np.asarray(values, dtype=float)
    y = np.random.default_rng(seed).random(s.size) < 0.5
    if y.all() or (~y).all():
        y[0] = not y[0]
    for direction in ("greater", "less"):
        r = stats.roc(s, y, direction, max_points=10_000)
        o = s if direction == "greater" else -s
        fpr, tpr, _ = roc_curve(y, o, drop_intermediate=True)
        np.testing.assert_array_equal(r["fpr"], fpr)
        np.testing.assert_array_equal(r["tpr"], tpr)
        assert r["auc"] == pytest.approx(roc_auc_score(y, o), abs=1e-12)
