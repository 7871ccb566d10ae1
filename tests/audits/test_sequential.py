"""The sequential (anytime-valid) claimed-curve test: its confidence sequences, its false-positive
rate on a correct mechanism, what it catches, futility, and the engine's record of it."""

from __future__ import annotations

import numpy as np
import pytest

from dpaudit.accounting.events import SubsampledGaussian
from dpaudit.audits import sequential as sq
from dpaudit.audits.curves import claimed_curve
from dpaudit.audits.engine import AuditResult, run_audit
from dpaudit.audits.gaussian import GaussianTarget, calibrate_exact, exact_epsilon
from dpaudit.audits.verdicts import decision_at, general_epsilon_at
from dpaudit.errors import UsageError

DELTA = 1e-5


def _claim(eps: float):
    sigma = calibrate_exact(eps, DELTA)
    return sigma, claimed_curve(SubsampledGaussian(sigma, 1.0, 1))


def _audit(rng, curve, mu_true: float, max_trials: int, seed: int):
    """One simulated sequential audit: the likelihood-ratio scores of a Gaussian mechanism (out N(0, 1), in N(mu, 1))."""
    plan = sq.plan_sequential(max_trials, seed=seed)
    scores = rng.normal(size=max_trials) + plan.world * mu_true
    test = sq.SequentialTest(curve, plan, confidence=0.95)
    used, look, reason = sq.run_sequential(lambda a, b: scores[a:b], test)
    return scores, plan, test, look, reason


def test_anytime_upper_holds_at_every_look_at_once():
    """Ville: the fraction of Bernoulli paths whose true rate ever leaves the sequence is <= alpha."""
    rng = np.random.default_rng(0)
    p, alpha, n = 0.1, 0.05, 400
    errors = np.cumsum(rng.random((600, n)) < p, axis=1)[:, 9::10]  # looks every 10 trials
    trials = np.broadcast_to(np.arange(10, n + 1, 10), errors.shape)
    upper = sq.anytime_upper(
        errors.ravel().astype(float), trials.ravel().astype(float), alpha
    ).reshape(errors.shape)
    ever_missed = np.mean(np.any(upper < p, axis=1))
    assert ever_missed <= alpha
    # scalar and vector paths agree; the bound only grows with the errors (futility's best case is no further error)
    assert sq.anytime_upper(7, 120, alpha) == pytest.approx(
        float(sq.anytime_upper(np.array([7.0]), np.array([120.0]), alpha)[0]), rel=1e-9
    )
    ups = [sq.anytime_upper(k, 120, alpha) for k in range(0, 30)]
    assert all(a < b for a, b in zip(ups, ups[1:]))


def test_false_positive_rate_on_a_correct_gaussian_mechanism():
    """1,000 audits of a mechanism exactly at its claim (every rule's point on the claimed curve): <= 5 % flagged."""
    rng = np.random.default_rng(1)
    sigma, curve = _claim(4.0)
    flagged = 0
    for r in range(1000):
        *_, look, reason = _audit(rng, curve, 1.0 / sigma, 200, r)
        flagged += reason == "violation"
        assert (reason == "violation") == look.violated
    assert flagged / 1000 <= 0.05


def test_catches_a_2x_noise_understatement_at_claim_4_and_stays_sound():
    """sigma / 2 against a claim of eps 4: flagged, at a median of <= 300 trials; the reported eps_LB never
    exceeds the mechanism's exact epsilon and the true noise is never ruled out."""
    rng = np.random.default_rng(2)
    sigma, curve = _claim(4.0)
    true_eps = exact_epsilon(sigma / 2.0, DELTA)
    stops, caught = [], 0
    for r in range(40):
        _, _, _, look, reason = _audit(rng, curve, 2.0 / sigma, 2000, r)
        stops.append(look.trials)
        caught += reason == "violation"
        assert sq.epsilon_at_stop(look, DELTA) <= true_eps
    assert caught == 40 and np.median(stops) <= 300


def test_futility_never_flags_and_no_later_look_could_have():
    """A futility stop reports no violation, and the audit's own remaining trials would not have produced one either."""
    rng = np.random.default_rng(3)
    sigma, curve = _claim(4.0)
    futile = 0
    for r in range(60):
        scores, plan, test, look, reason = _audit(
            rng, curve, 1.15 / sigma, 400, r
        )  # a slight understatement: often futile
        if reason != "futility":
            continue
        futile += 1
        assert not look.violated
        for end in plan.looks()[plan.looks() > look.trials]:
            assert not test.look(scores[:end]).violated
    assert futile >= 5


def test_plan_is_balanced_per_batch_and_checked():
    plan = sq.plan_sequential(200, seed=0)
    assert plan.world.reshape(-1, sq.BATCH).sum(axis=1).tolist() == [sq.BATCH // 2] * (
        200 // sq.BATCH
    )
    assert plan.looks()[0] == sq.SELECT_TRIALS + sq.BATCH and plan.looks()[-1] == 200
    with pytest.raises(UsageError, match="select_trials must be a multiple"):
        sq.plan_sequential(200, seed=0, batch=20, select_trials=30)


def test_engine_records_the_mode_the_stop_and_an_anytime_bound():
    sigma = calibrate_exact(4.0, DELTA)
    broken = GaussianTarget(noise_multiplier=sigma, broken_noise_factor=2.0)
    r = run_audit(
        broken,
        runs=2000,
        sequential=True,
        controls=("null",),
        control_runs=100,
        record=False,
        reproducible_noise=True,
        seed=3,
    )
    seq = r.sequential
    assert r.violated and seq["mode"] == "sequential" and seq["stopped"] == "violation"
    assert (
        r.runs == seq["trials_used"] < 2000
        and seq["max_trials"] == 2000
        and r.controls["null"].runs == 100
    )
    assert r.general_bound is None and r.claimed_curve["violated"] is True
    assert r.epsilon_lower_bound <= exact_epsilon(sigma / 2.0, DELTA)
    assert r.power["sequential"] is True and r.power["trials"] == 2000
    d = r.to_dict()
    back = AuditResult.from_dict(d)
    assert back.sequential == seq and back.violated
    # recomputed at a stricter confidence from the stored counts: the anytime sequences, never fixed-N bounds
    stricter = decision_at(d, 0.99)
    assert stricter["epsilon_lower_bound"] == pytest.approx(general_epsilon_at(d, 0.99))
    assert stricter["epsilon_lower_bound"] <= r.epsilon_lower_bound
    fixed = run_audit(broken, runs=400, controls=(), record=False, reproducible_noise=True, seed=3)
    assert "sequential" not in fixed.to_dict() and fixed.general_bound is not None


def test_sequential_needs_a_claimed_event_and_room_for_a_look():
    from dpaudit.audits.targets import CallableTarget

    t = CallableTarget(
        mechanism_fn=lambda inc, rng: float(inc) + rng.normal(),
        score_fn=float,
        claimed_epsilon=1.0,
        delta=DELTA,
    )
    with pytest.raises(UsageError, match="sequential must only be used with a claimed event"):
        run_audit(t, runs=200, sequential=True, controls=(), record=False)
    with pytest.raises(UsageError, match="runs must be"):
        run_audit(
            GaussianTarget(noise_multiplier=1.0),
            runs=40,
            sequential=True,
            controls=(),
            record=False,
        )
