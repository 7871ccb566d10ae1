"""One-run analysis (dpaudit.audits.one_run): exact values against independent references,
soundness on simulated exactly-calibrated mechanisms, the no-noise control, bring-your-own."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy import optimize, special, stats

from dpaudit.audits import one_run as O
from dpaudit.errors import UsageError


def _binom_pmf(k: int, n: int, q: float) -> float:
    return math.comb(n, k) * q**k * (1 - q) ** (n - k)


def _gdp_delta(eps: float, mu: float) -> float:
    return stats.norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * stats.norm.cdf(-eps / mu - mu / 2)


def _sigma_for(eps: float, delta: float) -> float:
    """Noise of the exactly calibrated Gaussian mechanism (sensitivity 1) at (eps, delta)."""
    return 1.0 / optimize.brentq(lambda mu: _gdp_delta(eps, mu) - delta, 1e-3, 50.0)


def _gauss_curve_at(sigma: float):
    return lambda s: lambda a: special.ndtr(-special.ndtri(np.asarray(a)) - 1.0 / (sigma * s))


# ---------------------------------------------------------------- (eps, delta): Steinke et al.


def test_p_value_delta_zero_is_the_binomial_tail():
    for m, r, v, eps in [
        (100, 50, 40, 0.7),
        (1000, 200, 150, 1.3),
        (10, 10, 10, 2.0),
        (50, 20, 0, 1.0),
    ]:
        want = stats.binom.sf(v - 1, r, 1.0 / (1.0 + math.exp(-eps)))
        assert O.steinke_p_value(m, r, v, eps, 0.0) == pytest.approx(want, rel=1e-12)


def test_p_value_delta_term_by_hand():
    # m = 5, r = 3, v = 2: beta = P[B >= 2]; alpha = max(P[B = 1] / 1, (P[B = 1] + P[B = 0]) / 2).
    m, r, v, eps, delta = 5, 3, 2, 0.4, 0.01
    q = math.exp(eps) / (1 + math.exp(eps))
    beta = _binom_pmf(2, 3, q) + _binom_pmf(3, 3, q)
    alpha = max(_binom_pmf(1, 3, q), (_binom_pmf(1, 3, q) + _binom_pmf(0, 3, q)) / 2)
    assert O.steinke_p_value(m, r, v, eps, delta) == pytest.approx(
        beta + 2 * m * delta * alpha, rel=1e-12
    )
    assert O.steinke_p_value(1, 1, 1, eps, delta) == pytest.approx(
        q + 2 * delta * (1 - q), rel=1e-12
    )


def test_epsilon_delta_zero_inverts_the_binomial_tail():
    for r, v in [(100, 80), (500, 330), (40, 40)]:
        eps = O.steinke_epsilon(1000, r, v, delta=0.0, significance=0.05)
        root = optimize.brentq(
            lambda e: stats.binom.sf(v - 1, r, special.expit(e)) - 0.05, 0.0, 50.0, xtol=1e-12
        )
        assert (
            eps == pytest.approx(root, abs=1e-5) and eps <= root + 1e-12
        )  # never above the exact root
        assert O.steinke_p_value(1000, r, v, eps, 0.0) <= 0.05


def test_all_correct_ceiling_m_1000():
    # delta = 0 closed form: q^r = 0.05 -> eps = logit(0.05^(1/r)) = 5.809 for r = m = 1000.
    closed = math.log(0.05 ** (1 / 1000) / (1 - 0.05 ** (1 / 1000)))
    assert O.steinke_epsilon(1000, 1000, 1000, delta=0.0, significance=0.05) == pytest.approx(
        closed, abs=1e-5
    )
    # delta = 1e-5 costs a little (the 2 m delta term): measured 5.782.
    with_delta = O.steinke_epsilon(1000, 1000, 1000, delta=1e-5, significance=0.05)
    assert 5.7 < with_delta < closed


def test_more_correct_guesses_never_lower_the_bound():
    vals = [
        O.steinke_epsilon(500, 200, v, delta=1e-5, significance=0.05) for v in range(100, 201, 10)
    ]
    assert vals == sorted(vals) and vals[0] == 0.0 and vals[-1] > 3


# ------------------------------------------------------------------- f-DP: Mahloujifar et al.


def _lp_sup(mu: float, m: int, c1: int, c: int) -> float:
    """Independent reference: max P[N >= c] over distributions of N on {0..c1} obeying
    r_i <= g(h_{i-1}) (g = 1 - f, f the mu-GDP curve), g relaxed to its tangent lines (an
    upper bound on the max, tight as the tangents get dense)."""
    from scipy.optimize import linprog

    n = c1 + 1
    j = np.arange(n)
    A, b = [], []
    hs = np.concatenate([np.logspace(-9, -1e-9, 400), [0.5]])
    g = stats.norm.cdf(stats.norm.ppf(hs) + mu)
    dg = stats.norm.pdf(stats.norm.ppf(hs) + mu) / stats.norm.pdf(stats.norm.ppf(hs))
    for i in range(1, n):
        r_row = np.where(j >= i, j / m, 0.0)
        h_row = np.where(j >= i - 1, (c1 - j) / m, 0.0)
        for gk, dk, hk in zip(g, dg, hs):
            A.append(r_row - dk * h_row)
            b.append(gk - dk * hk)
    res = linprog(
        -(j >= c).astype(float),
        A_ub=np.array(A),
        b_ub=np.array(b),
        A_eq=np.ones((1, n)),
        b_eq=[1.0],
        bounds=[(0, 1)] * n,
        method="highs",
    )
    assert res.status == 0
    return -res.fun


def _rec_sup(mu: float, m: int, c1: int, c: int) -> float:
    vals, convex = O._curve_values(lambda a: special.ndtr(-special.ndtri(a) - mu))
    assert convex
    lo, hi = 0.0, 1.0  # largest significance the recursion does not reject
    for _ in range(50):
        mid = (lo + hi) / 2
        if O.fdp_rejects(vals, m, c1, c, mid):
            hi = mid
        else:
            lo = mid
    return hi


@pytest.mark.parametrize(
    "mu,m,c1,c",
    [(1.0, 10, 8, 7), (2.0, 12, 10, 10), (0.5, 20, 6, 6), (3.0, 20, 20, 19), (1.0, 16, 14, 12)],
)
def test_fdp_recursion_matches_the_linear_program(mu, m, c1, c):
    lp, rec = _lp_sup(mu, m, c1, c), _rec_sup(mu, m, c1, c)
    # sound: the recursion never rejects a significance some feasible distribution reaches
    assert rec >= lp * (1 - 2e-3) - 1e-6
    # and tight: it is the optimum (up to the tangent relaxation and the FPR grid)
    assert lp < 0.99 and rec <= lp * (1 + 1e-2) + 1e-6


def test_fdp_non_convex_curve_is_refused():
    bumpy = lambda a: np.clip(1 - a + 0.05 * np.sin(40 * np.asarray(a)), 0, 1)  # noqa: E731
    out = O.fdp_family_search([(10, 10)], 20, curve_at=lambda s: bumpy, significance=0.05)
    assert out["scale_lower_bound"] is None and "not convex" in out["unavailable"]


# --------------------------------------------------------------------- soundness, simulated


@pytest.mark.parametrize("eps", [1.0, 2.0])
def test_soundness_exact_gaussian_canaries(eps):
    """m canaries, each an independent exactly calibrated Gaussian mechanism (sensitivity 1,
    score = output): over 20 seeds neither analysis ever exceeds the claim."""
    delta, m = 1e-5, 500
    sigma = _sigma_for(eps, delta)
    grid = O.guess_grid(m)
    worst, best_fdp = 0.0, 0.0
    for seed in range(20):
        rng = np.random.default_rng(1000 * int(eps) + seed)
        inc = rng.random(m) < 0.5
        scores = inc + sigma * rng.standard_normal(m)
        counts = [O.count_correct(scores, inc, kp, kn) for kp, kn in grid]
        st = max(
            O.steinke_epsilon(m, r, v, delta=delta, significance=0.05 / len(grid))
            for r, v in counts
        )
        fdp = O.fdp_family_search(counts, m, curve_at=_gauss_curve_at(sigma), significance=0.05)
        worst = max(worst, st)
        assert not fdp["violated"], (seed, fdp)
        assert fdp["scale_lower_bound"] is None or fdp["scale_lower_bound"] > 1.0
        best_fdp = max(
            best_fdp, 0.0 if fdp["scale_lower_bound"] is None else 1 / fdp["scale_lower_bound"]
        )
    assert worst <= eps
    assert best_fdp > 0.2  # the test has power: some seeds rule out noise >= 5x the true one


def test_planted_bug_is_caught():
    """Canaries with half the claimed noise (claim eps 1 at delta 1e-5; true noise sigma/4):
    the f-DP analysis rules out the claim."""
    m, delta = 1000, 1e-5
    sigma = _sigma_for(1.0, delta)
    rng = np.random.default_rng(7)
    inc = rng.random(m) < 0.5
    scores = inc + sigma / 4 * rng.standard_normal(m)
    counts = [O.count_correct(scores, inc, kp, kn) for kp, kn in O.guess_grid(m)]
    fdp = O.fdp_family_search(counts, m, curve_at=_gauss_curve_at(sigma), significance=0.05)
    assert fdp["violated"] and fdp["scale_lower_bound"] < 1.0


def test_no_noise_control_reaches_the_ceiling():
    from dpaudit.accounting.events import SubsampledGaussian

    m = 1000
    rng = np.random.default_rng(3)
    inc = rng.random(m) < 0.5
    d = O.audit_one_run(
        inc + 1e-9 * rng.standard_normal(m), inc, delta=1e-5, claim=SubsampledGaussian(3.73, 1.0, 1)
    )
    st = d["steinke"]
    assert st["epsilon_lower_bound"] >= 0.8 * st["ceiling"] and st["ceiling"] > 5.0
    assert d["fdp"]["violated"] and d["fdp"]["epsilon_lower_bound"] >= 0.8 * d["fdp"]["ceiling"]


# ------------------------------------------------------------------ bring your own / records


def test_bring_your_own_and_the_record(tmp_path):
    from dpaudit.accounting.events import SubsampledGaussian

    rng = np.random.default_rng(11)
    m = 400
    inc = rng.random(m) < 0.5
    sigma = _sigma_for(2.0, 1e-5)
    d = O.audit_one_run(
        inc + sigma * rng.standard_normal(m),
        inc,
        kind="input-ood",
        delta=1e-5,
        claim=SubsampledGaussian(sigma, 1.0, 1),
        info={"source": "test"},
    )
    assert (
        d["schema"] == "dpaudit.one-run/1"
        and d["canaries"] == m
        and d["included"] == int(inc.sum())
    )
    assert [g["k_pos"] for g in d["grid"]] == [4, 8, 20, 40, 100, 200]
    assert d["fdp"]["family"]["parameter"] == "noise_multiplier" and not d["fdp"]["violated"]
    assert d["claimed_epsilon"] > 2.0  # the rdp accountant's epsilon of the event (>= the exact 2)
    res = O.OneRunResult(bounds=d, mechanism="gaussian", command="x")
    O.write_one_run(res, tmp_path)
    back = json.loads((tmp_path / "one_run.json").read_text())
    assert back["statistic"] == "f-dp" and back["violated"] is False and back["command"] == "x"
    assert back["epsilon_lower_bound"] == res.epsilon_lower_bound == d["fdp"]["epsilon_lower_bound"]
    # without a claim the Steinke analysis decides
    d2 = O.audit_one_run(inc.astype(float), inc, delta=1e-5, claimed_epsilon=1.0)
    r2 = O.OneRunResult(bounds=d2)
    assert d2["fdp"] is None and r2.statistic == "steinke" and r2.violated


def test_ties_are_broken_by_index_not_inclusion():
    inc = np.array([True, False] * 10)
    r, v = O.count_correct(np.zeros(20), inc, 3, 3)
    assert (r, v) == (6, int(inc[:3].sum() + (~inc[-3:]).sum()))


def test_bad_input_is_refused():
    with pytest.raises(UsageError, match="included must be a 1-d array"):
        O.audit_one_run(np.zeros(5), np.zeros(4, bool), delta=1e-5)
    with pytest.raises(UsageError, match="scores must be finite"):
        O.audit_one_run(np.array([0.0, np.nan, 1.0]), np.array([1, 0, 1]), delta=1e-5)
    with pytest.raises(UsageError, match="kind must be one of"):
        O.audit_one_run(np.zeros(4), np.zeros(4, bool), delta=1e-5, kind="bogus")
    with pytest.raises(UsageError, match="confidence must be"):
        O.audit_one_run(np.zeros(4), np.zeros(4, bool), delta=1e-5, confidence=1.5)
