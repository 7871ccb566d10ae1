"""Calibration never overshoots the target, hits it within tolerance, and caches safely."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpaudit.accounting import SubsampledGaussian, calibrate_noise_multiplier, compute_epsilon
from dpaudit.accounting.calibration import EPSILON_TOLERANCE, _cache_path
from dpaudit.errors import CalibrationError, UsageError


def _opacus_eps(sigma, q, steps, delta):
    from opacus.accountants import RDPAccountant

    from dpaudit.accounting import RDP_ORDERS

    acc = RDPAccountant()
    acc.history = [(sigma, q, steps)]
    return acc.get_epsilon(delta=delta, alphas=list(RDP_ORDERS))


@pytest.mark.parametrize("target", [0.1, 8.0])
def test_targets_point_one_and_eight_on_heart_schedule(target):
    c = calibrate_noise_multiplier(target_epsilon=target, delta=1e-5, sample_rate=0.25, steps=120, use_cache=False)
    ref = _opacus_eps(c.noise_multiplier, 0.25, 120, 1e-5)  # independent evaluation
    assert ref <= target
    assert target - ref <= EPSILON_TOLERANCE
    assert c.epsilon == pytest.approx(ref, rel=1e-9)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    target=st.floats(min_value=0.2, max_value=10.0),
    q=st.floats(min_value=1e-3, max_value=0.5),
    steps=st.integers(min_value=1, max_value=3000),
)
def test_calibrated_epsilon_never_exceeds_target(target, q, steps):
    c = calibrate_noise_multiplier(target_epsilon=target, delta=1e-5, sample_rate=q, steps=steps, use_cache=False)
    assert c.epsilon <= target
    assert compute_epsilon(SubsampledGaussian(c.noise_multiplier, q, steps), delta=1e-5).epsilon <= target


def test_prv_calibration_uses_the_upper_bound():
    c = calibrate_noise_multiplier(target_epsilon=2.0, delta=1e-5, sample_rate=0.25, steps=120, accountant="prv", use_cache=False)
    r = compute_epsilon(SubsampledGaussian(c.noise_multiplier, 0.25, 120), delta=1e-5, accountant="prv")
    assert r.epsilon <= 2.0 and 2.0 - r.epsilon <= EPSILON_TOLERANCE
    assert r.epsilon_estimate <= r.epsilon


def test_cache_makes_repeat_instant_and_is_reverified():
    kw = dict(target_epsilon=3.0, delta=1e-5, sample_rate=0.1, steps=50)
    first = calibrate_noise_multiplier(**kw)
    again = calibrate_noise_multiplier(**kw)
    assert not first.cached and again.cached
    assert again.noise_multiplier == first.noise_multiplier
    # Tamper with the cache: an entry that would overshoot is ignored, never returned.
    data = json.loads(_cache_path().read_text())
    for k in data:
        data[k] = 0.01
    _cache_path().write_text(json.dumps(data))
    fixed = calibrate_noise_multiplier(**kw)
    assert not fixed.cached and fixed.epsilon <= 3.0


def test_unreachable_target_is_a_clear_error():
    with pytest.raises(CalibrationError, match="needs a noise multiplier above"):
        calibrate_noise_multiplier(target_epsilon=1e-5, delta=1e-5, sample_rate=1.0, steps=10, use_cache=False)


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(target_epsilon=0.0), "epsilon must be a finite number > 0"),
        (dict(target_epsilon=float("inf")), "epsilon must be a finite number > 0"),
        (dict(delta=1.0), "delta must be in the open interval"),
        (dict(sample_rate=0.0), "sample_rate must be in"),
        (dict(steps=0), "steps must be an integer >= 1"),
    ],
)
def test_bad_input(kw, match):
    base = dict(target_epsilon=1.0, delta=1e-5, sample_rate=0.1, steps=10)
    base.update(kw)
    with pytest.raises(UsageError, match=match):
        calibrate_noise_multiplier(**base)
