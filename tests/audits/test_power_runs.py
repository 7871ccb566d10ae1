"""The power line of one-run and white-box audits: each number against the audit's own analysis at
independently computed expected statistics (their time: benchmarks/bench_power_line.py)."""

from __future__ import annotations


import numpy as np
import pytest
from scipy import optimize, stats as st

from dpaudit.accounting.events import PureEpsilon, SubsampledGaussian
from dpaudit.audits import one_run, power_runs, white_box as wb
from dpaudit.audits.curves import claimed_curve
from dpaudit.audits.gaussian import calibrate_exact

DELTA = 1e-5


def _gaussian_counts(mu: float, m: int) -> list[tuple[int, int]]:
    """Expected (guesses, correct) of an exact mu-GDP mechanism, by brentq (not the grid)."""
    out = []
    for k, _ in one_run.guess_grid(m):

        def share(a, k=k):
            return 1.0 - st.norm.cdf(st.norm.ppf(1.0 - a) - mu) + a - 2.0 * k / m

        a = optimize.brentq(share, 1e-15, 1.0 - 1e-15, xtol=1e-14)
        out.append(
            (2 * k, int(min(2 * k, round(m * (1.0 - st.norm.cdf(st.norm.ppf(1.0 - a) - mu))))))
        )
    return out


def _fdp_at(claim, counts, m: int) -> float:
    """The one-run record's own f-DP eps_LB at these counts (one_run._fdp_block)."""
    block = one_run._fdp_block(counts, m, claim, DELTA, 0.05, "rdp", "add-remove-record")
    return block["epsilon_lower_bound"]


def _gaussian_claim(eps: float) -> SubsampledGaussian:
    return SubsampledGaussian(calibrate_exact(eps, DELTA), 1.0, 1)


def test_one_run_limit_is_the_records_bound_at_the_expected_counts_and_grows_with_m():
    claim = _gaussian_claim(4.0)
    mu = 1.0 / claim.noise_multiplier
    limits = []
    for m in (200, 1000, 5000):
        p = power_runs.one_run_power(m, delta=DELTA, claim=claim)
        assert power_runs.expected_counts(
            power_runs.curve_values(claimed_curve(claim).fnr), m
        ) == _gaussian_counts(mu, m)
        assert p.at_claim == pytest.approx(_fdp_at(claim, _gaussian_counts(mu, m), m), rel=5e-3)
        assert (
            p.unit == "canaries" and p.kind == "one-run" and p.detectable and p.at_claim < p.ceiling
        )
        limits.append(p.at_claim)
    assert limits == sorted(limits) and limits[0] < limits[-1]


def test_one_run_smallest_factor_really_crosses_the_claim():
    claim = _gaussian_claim(2.0)
    mu, m = 1.0 / claim.noise_multiplier, 1000
    k = power_runs.one_run_power(m, delta=DELTA, claim=claim).smallest_factor
    values = power_runs.curve_values(claimed_curve(claim).fnr)
    each = 0.05 / len(one_run.guess_grid(m))

    def rejected(counts) -> bool:
        return any(one_run.fdp_rejects(values, m, r, v, each) for r, v in counts)

    assert (
        0.0 < k < 1.0
        and rejected(_gaussian_counts(mu / k, m))
        and not rejected(_gaussian_counts(mu / (k * 1.002), m))
    )


def test_one_run_canaries_for_90_percent_of_a_pure_claim():
    claim, eps = PureEpsilon(2.0), 2.0
    p = power_runs.one_run_power(1000, delta=DELTA, claim=claim)
    n90 = p.trials_for_90
    values = power_runs.curve_values(claimed_curve(claim).fnr)

    def at(m: int) -> float:
        return _fdp_at(claim, power_runs.expected_counts(values, m), m)

    # the expected counts are rounded, so eps_LB saw-tooths in m by ~0.01:
    # reached at n90, not 10 % earlier
    assert at(n90) >= 0.9 * eps * (1 - 2e-3) and at(int(n90 * 0.9)) < 0.9 * eps
    assert (
        p.factor_name == "noise"
        and "noise x" in p.line()
        and "canaries for 90 % of the claim" in p.line()
    )


def test_one_run_without_an_event_says_why_no_factor():
    p = power_runs.one_run_power(500, delta=DELTA, claimed_epsilon=2.0)
    counts = power_runs.expected_counts(
        power_runs.curve_values(
            lambda a: np.maximum(
                0.0, np.maximum(1 - DELTA - np.exp(2.0) * a, np.exp(-2.0) * (1 - DELTA - a))
            )
        ),
        500,
    )
    each = 0.05 / len(counts)
    assert p.at_claim == pytest.approx(
        max(one_run.steinke_epsilon(500, r, v, delta=DELTA, significance=each) for r, v in counts),
        abs=1e-3,
    )
    assert (
        p.smallest_factor is None
        and "n/a: an (epsilon, delta) claim without a DP event names no noise" in p.line()
    )


@pytest.mark.parametrize("threat_model, canaries", [("white-box", 2000), ("crafted-final", 4000)])
def test_white_box_limit_factor_and_canaries_are_the_expected_bounds(threat_model, canaries):
    claim = SubsampledGaussian(0.9, 0.01, 300)
    expected = wb.expected_step_bound if threat_model == "white-box" else wb.expected_final_bound
    eps = wb.compute_epsilon(claim, delta=DELTA, accountant="rdp").epsilon
    p = power_runs.white_box_power(claim, canaries, threat_model=threat_model, delta=DELTA)
    assert (
        p.at_claim == expected(claim, canaries, delta=DELTA)
        and p.claimed_epsilon == eps
        and p.ceiling is None
    )

    def at(k: float, m: int = canaries) -> float:
        return expected(SubsampledGaussian(0.9 * k, 0.01, 300), m, delta=DELTA)

    k, n90 = p.smallest_factor, p.trials_for_90
    assert at(k) > eps >= at(k * 1.002)
    if n90 is None:  # the crafted-final sum needs more canaries than the search looks at
        assert at(1.0, power_runs.MAX_CANARIES) < 0.9 * eps
    else:
        assert at(1.0, n90) >= 0.9 * eps > at(1.0, int(n90 * 0.97))


def test_one_run_power_of_a_record_matches_and_an_old_record_reads_not_recorded():
    from dpaudit.audits.power import power_cell, power_line

    claim = _gaussian_claim(2.0)
    bounds = {
        "canaries": 400,
        "delta": DELTA,
        "confidence": 0.95,
        "claimed_epsilon": 2.0,
        "fdp": {"event": claim.to_dict(), "accountant": "rdp", "adjacency": "add-remove-record"},
    }
    assert (
        power_runs.one_run_power_of(bounds)
        == power_runs.one_run_power(400, delta=DELTA, claim=claim, claimed_epsilon=2.0).to_dict()
    )
    assert power_line(None) == power_cell(None) == "power: not recorded"
