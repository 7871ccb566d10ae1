"""The power line of a DP-SGD (PLD-profile) claim: its coarse curves and fast searches against the
exact computation (the audit's own curves, searched to 1e-3), a planted understatement of the
factor it reports caught by the record's own test, and the envelope of a profile (time:
benchmarks/bench_power_line.py)."""

from __future__ import annotations


import numpy as np
import pytest

from dpaudit.accounting.adjacency import Adjacency
from dpaudit.accounting.events import PureEpsilon, SubsampledGaussian
from dpaudit.audits import curves, one_run, power, power_runs
from dpaudit.audits.curves import ClaimedCurve, claimed_curve, scale_event

DELTA = 1e-5
CLAIM = SubsampledGaussian(0.8, 0.05, 60)  # a small DP-SGD claim, epsilon 5.6 by rdp
M = 1000


def _exact(monkeypatch) -> power.AuditPower:
    """The same line on the audit's own curves (coarse = exact) to a 1e-3 tolerance."""
    monkeypatch.setattr(power, "COARSE_SIGMA", 0.5)
    monkeypatch.setattr(power_runs, "COARSE_SIGMA", 0.5)
    monkeypatch.setattr(power, "PROFILE_TOLERANCE", 1e-3)
    return power_runs.one_run_power(M, delta=DELTA, claim=CLAIM)


def test_profile_line_matches_the_exact_computation_within_its_stated_bound(monkeypatch):
    """Stated bound: the smallest factor within 2 % of the exact search's (1 % tolerance, the
    coarse members about 1 % lower), the at-claim statistic never above the exact one by more
    than its 1 % tolerance and at most 5 % below it (coarser test curves are lower)."""
    fast = power_runs.one_run_power(M, delta=DELTA, claim=CLAIM)
    exact = _exact(monkeypatch)
    assert fast.smallest_factor == pytest.approx(exact.smallest_factor, rel=0.02)
    assert 0.95 * exact.at_claim <= fast.at_claim <= 1.01 * exact.at_claim
    assert fast.claimed_epsilon == exact.claimed_epsilon and fast.detectable


def _flagged(member, m: int) -> bool:
    """The one-run record's own f-DP test of the claim at the member's expected counts."""
    counts = power_runs.expected_counts(power_runs.curve_values(member), m)
    values = power_runs.curve_values(claimed_curve(CLAIM).fnr)
    each = 0.05 / len(one_run.guess_grid(m))
    return any(one_run.fdp_rejects(values, m, r, v, each) for r, v in counts)


def test_a_planted_understatement_of_the_reported_factor_is_caught_and_a_smaller_one_is_not():
    k = power_runs.one_run_power(M, delta=DELTA, claim=CLAIM).smallest_factor
    assert _flagged(claimed_curve(scale_event(CLAIM, k)).fnr, M)
    assert not _flagged(claimed_curve(scale_event(CLAIM, k * 1.03)).fnr, M)


@pytest.mark.parametrize("event", [SubsampledGaussian(0.527, 0.005, 1000), PureEpsilon(1.0, 3)])
def test_the_envelope_is_the_maximum_over_every_line(event):
    eps, delta = curves._branch_profile((event,), Adjacency.ADD_REMOVE_RECORD)
    points = np.concatenate([np.random.default_rng(0).random(300) ** 6, one_run._fdp_grid()])
    lines = np.maximum(
        (1.0 - delta)[None, :] - np.exp(eps)[None, :] * points[:, None],
        ((1.0 - delta)[None, :] - points[:, None]) / np.exp(eps)[None, :],
    )
    brute = np.maximum(lines.max(axis=1), 0.0)
    assert np.array_equal(curves.profile_fnr(points, eps, delta), brute)


def test_a_coarse_curve_lies_below_the_audits_own():
    event = SubsampledGaussian(0.6, 0.01, 300)
    grid = one_run._fdp_grid()
    fine = claimed_curve(event).fnr(grid)
    coarse = ClaimedCurve(event, "add-remove-record", power.COARSE_SIGMA).fnr(grid)
    assert np.all(coarse <= fine + 1e-12) and np.max(fine - coarse) < 0.01
