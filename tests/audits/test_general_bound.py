"""The published eps_LB is a lower bound on epsilon for ANY mechanism, and it is
not weaker than the Clopper-Pearson bound with Bonferroni over every threshold.

The reference is written independently here: an explicit loop over every threshold rule with
scipy's beta quantiles."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats as sps

from dpaudit.accounting.events import SubsampledGaussian
from dpaudit.audits import engine, stats, verdicts

DELTA = 1e-5


def reference_all_thresholds(s, y, delta, confidence, *, directions=("greater", "less")):
    """max over every threshold (midpoints of distinct scores, +-inf) and ``directions`` of the CP
    eps_LB with Bonferroni over 2 bounds x (n + 1) thresholds x len(directions)."""
    s, y = np.asarray(s, float), np.asarray(y, bool)
    n_pos, n_neg = int(y.sum()), int((~y).sum())
    a = (1 - confidence) / (2 * (s.size + 1) * len(directions))
    u = np.unique(s)
    cands = [-math.inf] + [(p + q) / 2 for p, q in zip(u[:-1], u[1:])] + [math.inf]

    def upper(k, n):
        return 1.0 if k == n else float(sps.beta.ppf(1 - a, k + 1, n - k))

    best = 0.0
    for t in cands:
        for d in directions:
            pred = s >= t if d == "greater" else s <= t
            fpr, fnr = upper(int(np.sum(pred & ~y)), n_neg), upper(int(np.sum(~pred & y)), n_pos)
            for num, den in ((1 - delta - fnr, fpr), (1 - delta - fpr, fnr)):
                if num > 0 and den > 0:
                    best = max(best, math.log(num / den))
    return best


def randomized_response(rng, world: np.ndarray, eps: float) -> np.ndarray:
    """Binary outputs: 1 with probability e^eps / (1 + e^eps) in the canary-in world, else 1 / (1 + e^eps)."""
    p = math.exp(eps) / (1 + math.exp(eps))
    return np.where(world, rng.random(world.size) < p, rng.random(world.size) < 1 - p).astype(float)


def test_randomized_response_against_a_gaussian_claim_it_satisfies_keeps_eps_lb_below_its_epsilon():
    # the case: randomized response with eps 1, audited against a Gaussian claim (mu = 1.3);
    # its claim-family epsilon reads ~5, but the published eps_LB must bound the true epsilon 1
    plan = engine.plan_trials(2000, seed=0)
    claim = SubsampledGaussian(1 / 1.3, 1.0, 1)
    rng = np.random.default_rng(7)
    below, family = 0, []
    sel, ev = plan.select, ~plan.select
    for _ in range(100):  # the published eps_LB of evaluate_scores, without its descriptive extras
        s = randomized_response(rng, plan.world, 1.0)
        thr = stats.select_threshold(s[sel], plan.world[sel], delta=DELTA)
        counts = dict(
            zip(
                ("tp", "fp", "tn", "fn"),
                stats.confusion(s[ev], plan.world[ev], thr.threshold, thr.direction),
            )
        )
        below += (
            engine.general_bound(s, plan.world, counts, delta=DELTA, confidence=0.95)[
                "epsilon_lower_bound"
            ]
            <= 1.0
        )
    assert below >= 95
    # through the audit path, with the claim: eps_LB is that bound, the family figure is its own
    for seed in range(3):
        s = randomized_response(np.random.default_rng(seed), plan.world, 1.0)
        r = engine.audit_scores(s[plan.world], s[~plan.world], delta=DELTA, claim=claim, seed=seed)
        assert r.statistic == "claimed-curve" and not r.violated
        assert r.epsilon_lower_bound <= 1.0 < r.claim_family_bound["family_epsilon"]
        assert r.epsilon_lower_bound == r.general_bound["epsilon_lower_bound"]
        family.append(r.claim_family_bound["family_epsilon"])
    assert min(family) > 3.0  # the figure that used to be published as eps_LB


@settings(max_examples=25, deadline=None)
@given(
    n_in=st.integers(5, 60),
    n_out=st.integers(5, 60),
    shift=st.floats(0.0, 4.0),
    ties=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_band_is_at_least_bonferroni_over_every_threshold(n_in, n_out, shift, ties, seed):
    rng = np.random.default_rng(seed)
    s = np.r_[rng.normal(shift, 1, n_in), rng.normal(0, 1, n_out)]
    if ties:
        s = np.round(s)
    y = np.r_[np.ones(n_in, bool), np.zeros(n_out, bool)]
    b = stats.band_bound(s, y, delta=DELTA, confidence=0.95)
    assert b["epsilon_lower_bound"] >= reference_all_thresholds(s, y, DELTA, 0.95) - 1e-9
    assert b["epsilon_lower_bound"] == pytest.approx(
        stats.band_epsilon(b, delta=DELTA, confidence=0.95), abs=1e-12
    )
    assert stats.band_epsilon(b, delta=DELTA, confidence=0.99) <= b["epsilon_lower_bound"] + 1e-12


def test_published_bound_on_the_exact_gaussian_is_not_weaker_than_bonferroni_over_thresholds():
    # exact Gaussian at claim eps 2, 2,000 trials (the case): the published eps_LB is at least
    # the CP bound with Bonferroni over every threshold rule of both directions (guaranteed by the band)
    mu = stats.gdp_mu_for_epsilon(2.0, DELTA)
    plan = engine.plan_trials(2000, seed=0)
    for seed in range(1):
        rng = np.random.default_rng(seed)
        s = rng.normal(0, 1, 2000) + mu * plan.world
        thr = stats.select_threshold(s[plan.select], plan.world[plan.select], delta=DELTA)
        counts = dict(
            zip(
                ("tp", "fp", "tn", "fn"),
                stats.confusion(
                    s[~plan.select], plan.world[~plan.select], thr.threshold, thr.direction
                ),
            )
        )
        gb = engine.general_bound(s, plan.world, counts, delta=DELTA, confidence=0.95)
        assert (
            gb["epsilon_lower_bound"] >= reference_all_thresholds(s, plan.world, DELTA, 0.95) - 1e-9
        )
        assert (
            gb["epsilon_lower_bound"]
            >= stats.cp_bonferroni(s, plan.world, delta=DELTA)["epsilon_lower_bound"] - 1e-9
        )
        # recomputable from what audit.json keeps
        rec = {"counts": counts, "delta": DELTA, "general_bound": gb}
        assert verdicts.general_epsilon_at(rec, 0.95) == pytest.approx(
            gb["epsilon_lower_bound"], abs=1e-12
        )


def test_old_claimed_curve_record_is_read_with_a_valid_bound():
    rng = np.random.default_rng(1)
    r = engine.audit_scores(
        rng.normal(1.0, 1, 300),
        rng.normal(0, 1, 300),
        delta=DELTA,
        claim=SubsampledGaussian(1.0, 1.0, 1),
    )
    d = r.to_dict()
    old = {k: v for k, v in d.items() if k not in ("general_bound", "claim_family_bound")}
    old["claimed_curve"] = {
        k: v for k, v in d["claimed_curve"].items() if k not in ("family_epsilon", "counts")
    }
    old["claimed_curve"]["epsilon_lower_bound"] = old["epsilon_lower_bound"] = d["claimed_curve"][
        "family_epsilon"
    ]
    back = engine.AuditResult.from_dict(old)
    assert back.epsilon_lower_bound == d["clopper_pearson_epsilon"]  # not the family figure
    assert (
        back.claimed_curve["family_epsilon"] == d["claimed_curve"]["family_epsilon"]
        and back.epsilon_lower_bound_note
    )
    assert back.claim_family_bound["statement"].startswith("noise_multiplier")
    assert (
        verdicts.decision_at(old, 0.95)["violated"] is r.violated
    )  # its box recomputed from rates and EVAL counts


# ---- the exactly calibrated band (why the bound is not weaker than Bonferroni)
def test_crossing_probability_closed_forms():
    # n = 1: P(V > u_0(a)) = a; n = 2: 1 - P(V_(1) <= b0, V_(2) <= b1) = 1 - b1^2 + (b1 - b0)^2
    for a in (0.1, 0.01, 1e-4):
        assert stats.crossing_probability(1, a) == pytest.approx(a, rel=1e-9)
        b0, b1 = stats._cp_table(2, a)[:2]
        assert stats.crossing_probability(2, a) == pytest.approx(
            1 - b1**2 + (b1 - b0) ** 2, rel=1e-9
        )


def test_crossing_probability_matches_simulated_order_statistics():
    n, a, draws = 25, 0.002, 200_000
    b = stats._cp_table(n, a)[:n]
    v = np.sort(np.random.default_rng(3).random((draws, n)), axis=1)
    p_mc = float(np.mean((v > b).any(axis=1)))
    p = stats.crossing_probability(n, a)
    assert abs(p - p_mc) < 4 * math.sqrt(p * (1 - p) / draws)
    assert a < p < n * a  # more than one count, less than the union bound


@pytest.mark.parametrize("n", [1, 3, 40, 400])
def test_band_level_spends_its_share_and_no_more(n):
    share = 0.05 / 8
    a = stats.band_level(n, share)
    assert share / n <= a <= share
    assert stats.crossing_probability(n, a) <= share * (1 + 1e-9)  # float rounding only
    if n > 1:
        assert (
            stats.crossing_probability(n, a * 1.01) > share * 0.995
        )  # tight: nothing left on the table


def test_band_is_simultaneous_for_every_rule_under_the_null():
    # The whole band (4 families at a quarter each) fails on at most its significance of score sets:
    # same law in both worlds, so every rule's true FPR + FNR = 1 and any eps_LB > 0 is a false positive.
    rng = np.random.default_rng(11)
    y = np.r_[np.ones(30, bool), np.zeros(30, bool)]
    false = sum(
        stats.band_bound(rng.normal(size=60), y, delta=0.0, confidence=0.8)["epsilon_lower_bound"]
        > 0
        for _ in range(400)
    )
    assert false <= 0.2 * 400


@settings(max_examples=30, deadline=None)
@given(
    n_in=st.integers(1, 70),
    n_out=st.integers(1, 70),
    shift=st.floats(0.0, 5.0),
    ties=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_published_bound_is_at_least_one_sided_bonferroni_over_every_threshold(
    n_in, n_out, shift, ties, seed
):
    # jax_privacy's CanaryScoreAuditor.epsilon_clopper_pearson (one-sided, TPR/FPR) with its Bonferroni
    # correction taken over every threshold (n + 1 of them, fixed before the scores) instead of the
    # data-chosen hull: the published eps_LB is never below it, whatever the split into SELECT and EVAL.
    rng = np.random.default_rng(seed)
    s = np.r_[rng.normal(shift, 1, n_in), rng.normal(0, 1, n_out)]
    if ties:
        s = np.round(s)
    y = np.r_[np.ones(n_in, bool), np.zeros(n_out, bool)]
    select = rng.random(y.size) < 0.3
    counts = dict(
        zip(("tp", "fp", "tn", "fn"), stats.confusion(s[~select], y[~select], 0.0, "greater"))
    )
    if min(counts["tp"] + counts["fn"], counts["tn"] + counts["fp"]) < 1:
        counts = {
            "tp": n_in,
            "fp": n_out,
            "tn": 0,
            "fn": 0,
        }  # any valid box: the band alone must suffice
    gb = engine.general_bound(s, y, counts, delta=DELTA, confidence=0.95)
    one_sided = reference_all_thresholds(s, y, DELTA, 0.95, directions=("greater",))
    assert gb["epsilon_lower_bound"] >= one_sided - 1e-9
    assert gb["epsilon_lower_bound"] >= reference_all_thresholds(s, y, DELTA, 0.95) - 1e-9


def test_split_gives_the_band_half_from_thirty_trials_per_world():
    assert stats.general_split(30, 30, 0.95) == pytest.approx((0.975, 0.975))
    box, band = stats.general_split(5, 5, 0.95)
    assert band < 0.975 < box and (1 - box) + (1 - band) == pytest.approx(0.05)
