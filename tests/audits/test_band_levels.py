"""The band level: its crossing probability against a plain one-bound-at-a-time recursion, the
level always qualifying, and a level stored in audit.json trusted only after one check (which is
what keeps a report over many large audits fast)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats as sps

from dpaudit.audits import engine, stats, verdicts

DELTA = 1e-5


def plain_crossing_probability(n: int, a: float) -> float:
    """The recursion with nothing left out: every count, each bound in turn, scipy's Poisson."""
    b = np.r_[0.0, stats._cp_table(n, a)[:n]]
    p = np.zeros(n + 1)
    p[0] = 1.0
    counts = np.arange(n + 1)
    for k in range(n):
        move = sps.poisson.pmf(counts, n * (b[k + 1] - b[k]))
        p = np.convolve(p, move)[: n + 1]
        p[: k + 1] = 0.0  # crossed: fewer than k + 1 points by b_k
    stay = p @ sps.poisson.pmf(n - counts, n * (1.0 - b[n])) / sps.poisson.pmf(n, n)
    return 1.0 - stay


@pytest.mark.parametrize("n", [1, 2, 5, 31, 32, 33, 70, 150])
@pytest.mark.parametrize("a", [1e-6, 1e-3, 0.05, 0.5])
def test_crossing_probability_agrees_with_the_plain_recursion(n, a):
    expected = plain_crossing_probability(n, a)
    assert stats.crossing_probability(n, a) == pytest.approx(expected, rel=1e-7, abs=1e-15)


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 300), share=st.floats(1e-6, 0.2))
def test_the_band_level_always_qualifies(n, share):
    a = stats.band_level(n, share)
    assert share / n * (1 - 1e-12) <= a <= share
    if n == 1:
        assert a == share  # P_1(a) = a exactly (test_general_bound's closed forms)
    else:
        assert stats.crossing_probability(n, a) <= share


def _clear_caches():
    for name in ("general_split", "band_level", "_solved_level", "_claimed_crossing"):
        fn = getattr(stats, name, None)
        if hasattr(fn, "cache_clear"):
            fn.cache_clear()


@pytest.fixture
def calls(monkeypatch):
    """The (n, a) of every crossing-probability call, from cold caches."""
    _clear_caches()
    seen: list[tuple[int, float]] = []
    real = stats.crossing_probability

    def counted(n, a):
        seen.append((n, a))
        return real(n, a)

    monkeypatch.setattr(stats, "crossing_probability", counted)
    yield seen
    _clear_caches()


def _record(trials: int = 400, seed: int = 0) -> dict:
    """An audit record's counts and general bound, as audit.json keeps them."""
    plan = engine.plan_trials(trials, seed=seed)
    s = np.random.default_rng(seed).normal(0, 1, trials) + 3.0 * plan.world
    ev = ~plan.select
    cells = stats.confusion(s[ev], plan.world[ev], 1.5, "greater")
    counts = dict(zip(("tp", "fp", "tn", "fn"), cells))
    bound = engine.general_bound(s, plan.world, counts, delta=DELTA, confidence=0.95)
    return {
        "counts": counts,
        "delta": DELTA,
        "confidence": 0.95,
        "claimed_epsilon": 1.0,
        "general_bound": bound,
    }


def _with_levels(rec: dict, levels: dict) -> dict:
    band = {**rec["general_bound"]["band"], "per_bound_significance": levels}
    return {**rec, "general_bound": {**rec["general_bound"], "band": band}}


def test_a_fresh_band_level_takes_few_crossing_probability_calls(calls):
    stats.band_level(2000, 0.05 / 8)
    assert len(calls) <= 6  # secant steps from a first guess (the regula falsi took 8)


def test_a_stored_level_is_checked_with_one_call_and_reproduces_the_published_bound(calls):
    rec = _record()
    _clear_caches()
    calls.clear()
    published = rec["general_bound"]["epsilon_lower_bound"]
    assert verdicts.general_epsilon_at(rec, 0.95) == published  # bit-identical
    assert len(calls) == 1  # both worlds hold 200 trials at the same level: one check, then cached


@pytest.mark.parametrize("edit", [3.0, 1.0001])
def test_an_edited_stored_level_that_does_not_qualify_is_not_trusted(edit):
    rec = _record()
    band = rec["general_bound"]["band"]
    level = band["per_bound_significance"]["in"]
    share = (1 - stats.general_split(200, 200, 0.95)[1]) / stats.BAND_FAMILIES
    assert stats.band_level(200, share, level) == level
    wrong = {"in": level * edit, "out": level * edit}
    edited = _with_levels(rec, wrong)
    assert stats.crossing_probability(200, level * edit) > share  # the edit does not qualify ...
    # ... so it is recomputed
    assert stats.band_level(200, share, level * edit) == stats.band_level(200, share)
    assert verdicts.general_epsilon_at(edited, 0.95) == verdicts.general_epsilon_at(rec, 0.95)


@pytest.mark.parametrize("stored", [None, "0.001", True, math.nan, -1e-4, 0.0, [1e-4]])
def test_stored_levels_that_are_not_positive_numbers_are_ignored(stored):
    band = {"per_bound_significance": {"in": stored, "out": 1e-4}}
    assert stats.stored_levels(band) == (None, 1e-4)
    assert stats.stored_levels({"per_bound_significance": "0.1"}) == (None, None)


def test_a_smaller_stored_level_that_qualifies_only_loosens_the_band():
    rec = _record()
    band = rec["general_bound"]["band"]
    smaller = {k: v / 2 for k, v in band["per_bound_significance"].items()}
    edited = _with_levels(rec, smaller)
    assert verdicts.general_epsilon_at(edited, 0.95) <= verdicts.general_epsilon_at(rec, 0.95)


def test_the_report_solves_the_bonferroni_level_once_per_trial_count(calls):
    records = [_record(seed=seed) for seed in range(3)]
    _clear_caches()
    calls.clear()
    verdicts.family_verdict(records)
    levels = {a for n, a in calls}
    assert len(calls) <= 7  # one check of the stored level, a few secant steps at 1 - alpha / 3
    assert len(levels) == len(calls)  # nothing evaluated twice


def test_a_report_over_audits_checks_their_stored_level_once(tmp_path, calls):
    from dpaudit.accounting.events import SubsampledGaussian
    from dpaudit.reports import build_report

    for seed in range(2):
        rng = np.random.default_rng(seed)
        res = engine.audit_scores(
            rng.normal(1.0, 1.0, 200),
            rng.normal(0.0, 1.0, 200),
            delta=DELTA,
            claim=SubsampledGaussian(2.0, 1.0, 1),
            seed=seed,
            mechanism="gaussian",
            canary="shift",
        )
        engine.write_audit(res, tmp_path / f"audit{seed}")
    _clear_caches()
    calls.clear()
    build_report([tmp_path], ledger_path=None)
    assert len(calls) <= 7  # one check of the stored level, then the Bonferroni level's few steps
    assert len({a for n, a in calls}) == len(calls)  # nothing evaluated twice
