"""Comparison statistics: Bonferroni CP eps_LB, TPR at fixed FPR, AUROC bootstrap, GDP.

References are independent of the implementation: closed-form Clopper–Pearson ends, scipy's beta
quantiles in explicit loops over every threshold, and scikit-learn's roc_auc_score.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats as sps
from sklearn.metrics import roc_auc_score

from dpaudit.audits import stats
from dpaudit.errors import UsageError
from dpaudit.records import _json_safe

DELTA = 1e-5


def brute_force_bonferroni(s, y, delta, confidence):
    """eps_LB by an explicit loop over every rule, with CP upper ends from scipy's beta quantiles."""
    s, y = np.asarray(s, float), np.asarray(y, bool)
    n_pos, n_neg = int(y.sum()), int((~y).sum())
    u = np.unique(s)
    cands = [-math.inf] + [(a + b) / 2 for a, b in zip(u[:-1], u[1:])] + [math.inf]
    m = max(2 * len(cands), s.size + 2)
    a = (1 - confidence) / (2 * m)

    def upper(k, n):
        return 1.0 if k == n else float(sps.beta.ppf(1 - a, k + 1, n - k))

    best = 0.0
    for t in cands:
        for pred in (s >= t, s <= t):
            fp, fn = int(np.sum(pred & ~y)), int(np.sum(~pred & y))
            fpr, fnr = upper(fp, n_neg), upper(fn, n_pos)
            for num, den in ((1 - delta - fnr, fpr), (1 - delta - fpr, fnr)):
                if num > 0 and den > 0:
                    best = max(best, math.log(num / den))
    return best, m


# ------------------------------------------------------------------------------ cp_bonferroni


def test_cp_bonferroni_perfect_separation_reaches_the_bonferroni_ceiling_by_hand():
    # 20 + 20 distinct scores, perfectly separated: 41 thresholds x 2 directions = 82 rules, each
    # bound at a = 0.05 / 164; with no errors the CP upper end is 1 - a^(1/20) (closed form).
    y = np.repeat([False, True], 20)
    s = np.arange(40.0)
    r = stats.cp_bonferroni(s, y, delta=DELTA, confidence=0.95)
    a = 0.05 / 164
    u = 1 - a ** (1 / 20)
    assert r["thresholds_tested"] == 82 and r["bonferroni_m"] == 82
    assert r["per_bound_significance"] == pytest.approx(a, rel=1e-12)
    assert r["epsilon_lower_bound"] == pytest.approx(math.log((1 - DELTA - u) / u), rel=1e-9)
    assert r["epsilon_lower_bound"] == pytest.approx(0.6951, abs=1e-3)  # the hand value
    assert (r["direction"], r["threshold"]) == ("greater", 19.5)
    assert r["counts"] == {"tp": 20, "fp": 0, "tn": 20, "fn": 0}
    # reversed orientation: the "less" rule is found, with the same bound
    r2 = stats.cp_bonferroni(-s, y, delta=DELTA, confidence=0.95)
    assert r2["direction"] == "less" and r2["epsilon_lower_bound"] == pytest.approx(
        r["epsilon_lower_bound"], rel=1e-12
    )


def test_cp_bonferroni_heavy_ties_use_the_trial_count_not_the_rule_count():
    # Two distinct scores: only 3 thresholds (6 rules), but the FP/FN counts could take 2 (n + 2)
    # values, so the union bound must run over m = n + 2 = 62 (see the docstring).
    y = np.repeat([False, True], 30)
    s = y.astype(float)
    r = stats.cp_bonferroni(s, y, delta=DELTA, confidence=0.9)
    a = 0.1 / (2 * 62)
    u = 1 - a ** (1 / 30)
    assert r["thresholds_tested"] == 6 and r["bonferroni_m"] == 62
    assert r["epsilon_lower_bound"] == pytest.approx(math.log((1 - DELTA - u) / u), rel=1e-9)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 12), st.booleans()), min_size=2, max_size=40),
    st.sampled_from([0.0, 1e-5, 0.05]),
    st.sampled_from([0.9, 0.95]),
)
def test_cp_bonferroni_matches_a_brute_force_loop(pairs, delta, conf):
    s = np.array([p[0] for p in pairs], float)
    y = np.array([p[1] for p in pairs], bool)
    if y.all() or not y.any():
        y[0] = not y[0]
    r = stats.cp_bonferroni(s, y, delta=delta, confidence=conf)
    ref, m = brute_force_bonferroni(s, y, delta, conf)
    assert r["bonferroni_m"] == m
    assert r["epsilon_lower_bound"] == pytest.approx(ref, rel=1e-9, abs=1e-12)
    # the reported rule reproduces the reported bound from its own counts
    c = r["counts"]
    again = stats.epsilon_from_rates(
        stats.cp_upper(c["fp"], c["fp"] + c["tn"], conf, split=2 * m),
        stats.cp_upper(c["fn"], c["fn"] + c["tp"], conf, split=2 * m),
        delta,
    )
    assert again == pytest.approx(r["epsilon_lower_bound"], rel=1e-12, abs=1e-15)
    tp, fp, tn, fn = stats.confusion(s, y, r["threshold"], r["direction"])
    assert {"tp": tp, "fp": fp, "tn": tn, "fn": fn} == c


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.integers(5, 300), st.floats(0.0, 4.0))
def test_cp_bonferroni_never_exceeds_the_single_rule_bound_at_the_same_counts(seed, n, mu):
    rng = np.random.default_rng(seed)
    y = rng.random(n) < 0.5
    y[:2] = [True, False]
    s = rng.normal(size=n) + mu * y
    r = stats.cp_bonferroni(s, y, delta=DELTA)
    single = stats.epsilon_lower_bound(**r["counts"], delta=DELTA).epsilon  # one rule, split 2
    assert r["epsilon_lower_bound"] <= single + 1e-12
    # and never above the best uncorrected single rule over all thresholds (selection bias included)
    assert (
        r["epsilon_lower_bound"] <= stats.select_threshold(s, y, delta=DELTA).select_epsilon + 1e-12
    )


def test_cp_bonferroni_is_zero_on_null_data_in_at_least_95_percent_of_200_seeds():
    zero = 0
    for seed in range(200):
        rng = np.random.default_rng(seed)
        y = np.arange(200) % 2 == 0
        s = (
            rng.normal(size=200) if seed % 2 else rng.integers(0, 3, size=200).astype(float)
        )  # ties too
        zero += stats.cp_bonferroni(s, y, delta=DELTA)["epsilon_lower_bound"] == 0.0
    assert zero >= 190


@pytest.mark.parametrize("kind", ["gaussian", "randomized-response"])
def test_cp_bonferroni_on_exactly_calibrated_mechanisms_rarely_exceeds_the_truth(kind):
    """Scores are the exact privacy-loss statistic of a mechanism with known epsilon at delta."""
    over = 0
    for seed in range(200):
        rng = np.random.default_rng(10_000 + seed)
        if (
            kind == "gaussian"
        ):  # mu-GDP (a Gaussian mechanism), true eps (4.38) from the exact profile
            mu = 1.0
            y = np.arange(200) % 2 == 0
            s = rng.normal(size=y.size) + mu * y
            true = stats.gdp_epsilon(mu, DELTA)
        else:  # randomized response, pure eps = 2: two distinct scores (heavy ties); eps_LB ~1.7 here
            eps = 2.0
            y = np.arange(4000) % 2 == 0
            p = math.exp(eps) / (1 + math.exp(eps))
            s = (rng.random(y.size) < np.where(y, p, 1 - p)).astype(float)
            true = eps
        over += stats.cp_bonferroni(s, y, delta=DELTA)["epsilon_lower_bound"] > true
    assert over <= 10  # <= 1 - confidence of 200


# ------------------------------------------------------------------------------ TPR at FPR


def brute_force_tpr_at_fpr(s, y, target):
    best = 0
    for t in np.unique(s):
        pred = s >= t
        if np.sum(pred & ~y) / np.sum(~y) <= target:
            best = max(best, int(np.sum(pred & y)))
    return best


def test_tpr_at_fpr_by_hand():
    neg = np.arange(1000.0)
    pos = np.array([999.5] * 3 + [998.5] * 2 + [991.5] * 2 + [0.5] * 5)
    s = np.concatenate([neg, pos])
    y = np.concatenate([np.zeros(1000, bool), np.ones(12, bool)])
    r = stats.tpr_at_fpr(s, y, "greater", confidence=0.95)
    # FPR <= 0.1 %: at most one negative (999) above the threshold -> the 5 positives >= 998.5.
    # FPR <= 1 %: at most ten negatives (990..999) -> also the two at 991.5, 7 of 12.
    assert [e["fpr"] for e in r] == [0.001, 0.01]
    assert r[0]["tpr"] == pytest.approx(5 / 12) and r[1]["tpr"] == pytest.approx(7 / 12)
    assert r[0]["fpr_achieved"] == pytest.approx(0.001) and r[1]["fpr_achieved"] == pytest.approx(
        0.01
    )
    for e, k in zip(r, (5, 7)):
        lo, hi = e["tpr_interval"]
        assert lo == pytest.approx(sps.beta.ppf(0.025, k, 12 - k + 1), rel=1e-9)
        assert hi == pytest.approx(sps.beta.ppf(0.975, k + 1, 12 - k), rel=1e-9)
    # the same scores negated, read with direction "less", give the same answer
    assert stats.tpr_at_fpr(-s, y, "less") == r


def test_tpr_at_fpr_is_zero_when_only_the_trivial_rule_qualifies():
    y = np.repeat([False, True], 100)
    s = np.where(y, 0.0, 1.0) + np.arange(200) * 1e-3  # every positive below every negative
    r = stats.tpr_at_fpr(s, y, "greater")
    assert [e["tpr"] for e in r] == [0.0, 0.0]
    assert r[0]["tpr_interval"][0] == 0.0
    assert r[0]["tpr_interval"][1] == pytest.approx(1 - 0.025 ** (1 / 100), rel=1e-9)


def _two_worlds(seed: int, n: int, shift: float, ties: bool):
    """Scores N(shift * y, 1) of n trials (both worlds present), rounded to integers when ``ties``."""
    rng = np.random.default_rng(seed)
    y = rng.random(n) < 0.5
    y[:2] = [True, False]
    s = rng.normal(size=n) + shift * y
    return (np.round(s) if ties else s), y


@settings(max_examples=40, deadline=None)
@given(
    st.integers(0, 10_000), st.integers(2, 400), st.sampled_from([0.001, 0.01, 0.2]), st.booleans()
)
def test_tpr_at_fpr_matches_a_direct_computation(seed, n, target, ties):
    s, y = _two_worlds(seed, n, 1.5, ties)
    (r,) = stats.tpr_at_fpr(s, y, "greater", targets=(target,))
    assert r["tpr"] * y.sum() == pytest.approx(brute_force_tpr_at_fpr(s, y, target))
    assert r["fpr_achieved"] <= target


# ------------------------------------------------------------------------------ AUROC


@settings(max_examples=40, deadline=None)
@given(
    st.integers(0, 10_000), st.integers(2, 300), st.booleans(), st.sampled_from(["greater", "less"])
)
def test_auroc_equals_sklearn(seed, n, ties, direction):
    s, y = _two_worlds(seed, n, 0.7, ties)
    r = stats.auroc_bootstrap(s, y, direction, resamples=20, seed=seed)
    ref = roc_auc_score(y, s if direction == "greater" else -s)
    assert r["auc"] == pytest.approx(ref, rel=1e-12, abs=1e-15)
    assert 0.0 <= r["interval"][0] <= r["interval"][1] <= 1.0


def test_auroc_bootstrap_is_stratified_seeded_and_uses_the_public_stream():
    y = np.repeat([False, True], [3, 50])
    s = (
        y.astype(float) + np.arange(53) * 1e-3
    )  # perfectly separated: every stratified resample has AUC 1
    r = stats.auroc_bootstrap(s, y, "greater", seed=1)
    assert r["auc"] == 1.0 and r["interval"] == [1.0, 1.0] and r["bootstrap"] == 1000
    # an unstratified resample of 53 trials misses the 3 negatives with probability (50/53)^53 ~ 4.6 %,
    # which would give nan here; a reproducible, seed-dependent interval otherwise:
    rng = np.random.default_rng(3)
    y = rng.random(400) < 0.5
    s = rng.normal(size=400) + y
    a, b, c = (stats.auroc_bootstrap(s, y, "greater", seed=k, resamples=200) for k in (5, 5, 6))
    assert a == b and a["interval"] != c["interval"]
    # the resamples are the AUCs of explicit stratified index draws from public_rng(seed, TAG),
    # here by brute-force pairwise comparison (ties 1/2) over every (positive, negative) pair
    from dpaudit.noise import public_rng

    rng = public_rng(5, stats.TAG_AUROC_BOOTSTRAP)
    pos, neg = np.flatnonzero(y), np.flatnonzero(~y)
    sp = s[pos[rng.integers(0, pos.size, size=(200, pos.size))]][:, :, None]
    sn = s[neg[rng.integers(0, neg.size, size=(200, neg.size))]][:, None, :]
    boot = np.mean((sp > sn) + 0.5 * (sp == sn), axis=(1, 2))
    assert a["interval"] == pytest.approx(list(np.quantile(boot, [0.025, 0.975])), rel=1e-12)


def test_auroc_bootstrap_interval_covers_a_known_gaussian_shift():
    mu = 1.0
    true_auc = sps.norm.cdf(mu / math.sqrt(2))
    cover = 0
    for seed in range(50):
        rng = np.random.default_rng(500 + seed)
        y = np.arange(400) % 2 == 0
        s = rng.normal(size=400) + mu * y
        lo, hi = stats.auroc_bootstrap(s, y, "greater", seed=seed)["interval"]
        cover += lo <= true_auc <= hi
    assert cover >= 45  # nominal 95 %; >= 90 % of 50 seeds


# ------------------------------------------------------------------------------ comparison_statistics


def _audit(n=600, mu=1.0, seed=0):
    rng = np.random.default_rng(seed)
    world = np.arange(n) % 2 == 0
    select = rng.random(n) < 0.5
    s = rng.normal(size=n) + mu * world
    return s, world, select


def test_comparison_statistics_layout_and_which_trials_each_part_uses():
    s, world, select = _audit()
    s = s.copy()
    s[select & ~world] += 50.0  # SELECT trials wildly different: must not reach the EVAL statistics
    r = stats.comparison_statistics(
        s, world, select, "greater", delta=DELTA, confidence=0.9, seed=3
    )
    assert set(r) == {"cp_bonferroni", "tpr_at_fpr", "auroc", "gdp_estimate"}
    assert {"epsilon_lower_bound", "thresholds_tested", "threshold", "direction", "method"} <= set(
        r["cp_bonferroni"]
    )
    ev = ~select
    assert r["cp_bonferroni"] == stats.cp_bonferroni(
        s, world, delta=DELTA, confidence=0.9
    )  # ALL trials
    assert r["tpr_at_fpr"] == stats.tpr_at_fpr(s[ev], world[ev], "greater", confidence=0.9)
    assert [e["fpr"] for e in r["tpr_at_fpr"]] == [0.001, 0.01]
    assert r["auroc"]["auc"] == pytest.approx(roc_auc_score(world[ev], s[ev]), rel=1e-12)
    assert r["auroc"] == stats.auroc_bootstrap(s[ev], world[ev], "greater", confidence=0.9, seed=3)
    assert (
        set(r["auroc"]) >= {"auc", "interval", "bootstrap", "confidence"}
        and r["auroc"]["confidence"] == 0.9
    )
    assert r["gdp_estimate"] == stats.gdp_estimate(
        s, world, "greater", delta=DELTA, confidence=0.9
    )  # ALL trials
    json.dumps(_json_safe(r), allow_nan=False)  # storable in audit.json


def test_comparison_statistics_rejects_bad_input_with_a_clear_message():
    s, world, select = _audit(n=40)
    with pytest.raises(UsageError, match="direction must be one of greater, less, got 'up'"):
        stats.comparison_statistics(s, world, select, "up", delta=DELTA)
    with pytest.raises(UsageError, match="select must have one entry per trial, got 39 for 40"):
        stats.comparison_statistics(s, world, select[:-1], "greater", delta=DELTA)
    with pytest.raises(UsageError, match="EVAL trials per world must be >= 1"):
        stats.comparison_statistics(
            s, world, world, "greater", delta=DELTA
        )  # no EVAL canary-in trial
    with pytest.raises(UsageError, match="confidence"):
        stats.comparison_statistics(s, world, select, "greater", delta=DELTA, confidence=1.0)
    with pytest.raises(UsageError, match="delta"):
        stats.comparison_statistics(s, world, select, "greater", delta=1.5)
    with pytest.raises(UsageError, match="resamples must be an integer >= 1, got 0"):
        stats.auroc_bootstrap(s, world, "greater", resamples=0)
