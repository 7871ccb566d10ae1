"""DP-MixMin Algorithms 1 and 2 against slow, obviously-correct references (paper sec. 4, A.9)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.spatial.distance import cosine

from dpaudit.accounting import SubsampledGaussian, calibrate_noise_multiplier, compute_epsilon
from dpaudit.errors import DataError, UsageError
from dpaudit.mechanisms.mixmin.solver import (
    MixMinCanary,
    MixMinConfig,
    max_clip_direction,
    per_example_gradients,
    run_mixmin,
    run_mixmin_runs,
    solve_mixmin,
)
from dpaudit.noise import NoiseSource


def _data(n=60, k=5, seed=0, loss="bce"):
    rng = np.random.default_rng(seed)
    probs = rng.uniform(0.02, 0.98, size=(n, k))
    if loss == "bce":
        y = (rng.random(n) < probs[:, 1]).astype(np.float64)
    elif loss == "mse":
        y = rng.random(n)
    else:
        probs = rng.uniform(0.01, 3.0, size=(n, k))  # densities
        y = np.zeros(n)
    return probs, y


def _cfg(k=5, loss="bce", sigma=1.3, q=0.3, B=18.0, steps=7, C=0.7, eta=0.8, **kw):
    return MixMinConfig(
        k=k,
        loss=loss,
        noise_multiplier=sigma,
        sample_rate=q,
        expected_batch_size=B,
        steps=steps,
        clipping_norm=C,
        step_size=eta,
        **kw,
    )


def _torch_loss(p, y, loss):
    if loss == "bce":
        return -(y * torch.log(p) + (1 - y) * torch.log(1 - p))
    if loss == "nll":
        return -torch.log(p)
    return (p - y) ** 2


def _naive_grad(f, y, lam, loss):
    w = torch.tensor(lam, dtype=torch.float64, requires_grad=True)
    p = (w * torch.tensor(f, dtype=torch.float64)).sum()
    _torch_loss(p, torch.tensor(float(y), dtype=torch.float64), loss).backward()
    return w.grad.numpy()


@pytest.mark.parametrize("loss", ["bce", "nll", "mse"])
def test_per_example_gradients_match_autograd(loss):
    probs, y = _data(loss=loss)
    lam = np.random.default_rng(1).dirichlet(np.ones(5))
    fast = per_example_gradients(probs, y, lam, loss)
    ref = np.stack([_naive_grad(probs[i], y[i], lam, loss) for i in range(len(y))])
    np.testing.assert_allclose(fast, ref, rtol=0, atol=1e-10)


def _reference_algorithm1(probs, y, cfg, noise):
    """Algorithm 1 line by line: per-example loop, autograd, clip, sum, noise, / B, EG, renormalise."""
    n, k = probs.shape
    lam = np.full(k, 1.0 / k)
    for _ in range(cfg.steps):
        mask = noise.poisson_mask(n, cfg.sample_rate) if cfg.sample_rate < 1 else np.ones(n, bool)
        gsum = np.zeros(k)
        for i in np.flatnonzero(mask):
            g = _naive_grad(probs[i], y[i], lam, cfg.loss)
            nrm = np.linalg.norm(g)
            gsum += g * min(1.0, cfg.clipping_norm / nrm) if nrm > 0 else g
        if cfg.noise_multiplier > 0:
            gsum = gsum + noise.gaussian_numpy(k, cfg.noise_multiplier * cfg.clipping_norm)
        gbar = gsum / cfg.expected_batch_size
        lam = lam * np.exp(-cfg.step_size * gbar)
        lam = lam / lam.sum()
    return lam


@pytest.mark.parametrize("loss", ["bce", "nll", "mse"])
@pytest.mark.parametrize("sigma", [0.0, 1.3])
def test_algorithm1_matches_naive_loop(loss, sigma):
    probs, y = _data(loss=loss)
    cfg = _cfg(loss=loss, sigma=sigma)
    fast = run_mixmin(probs, y, cfg, noise=NoiseSource("reproducible", seed=7))
    ref = _reference_algorithm1(probs, y, cfg, NoiseSource("reproducible", seed=7))
    assert fast.steps_executed == cfg.steps
    np.testing.assert_allclose(fast.weights, ref, rtol=0, atol=1e-10)


def test_algorithm2_with_one_record_per_user_equals_algorithm1():
    probs, y = _data(n=80)
    cfg1 = _cfg(steps=10)
    cfg2 = _cfg(steps=10, privacy_unit="user", records_per_user=3)
    a = run_mixmin(probs, y, cfg1, noise=NoiseSource("reproducible", seed=3)).weights
    b = run_mixmin(
        probs, y, cfg2, noise=NoiseSource("reproducible", seed=3), user_ids=np.arange(80) * 7 + 5
    ).weights
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-12)


def test_algorithm2_matches_naive_user_loop_without_subsampling():
    probs, y = _data(n=45)
    rng = np.random.default_rng(2)
    users = rng.integers(0, 12, size=45)
    cfg = _cfg(steps=6, privacy_unit="user", records_per_user=100, q=0.4, B=4.8)
    fast = run_mixmin(
        probs, y, cfg, noise=NoiseSource("reproducible", seed=9), user_ids=users
    ).weights
    # reference: users in order of first appearance, per-user mean gradient, clip, noise, / B
    order = list(dict.fromkeys(users.tolist()))
    noise = NoiseSource("reproducible", seed=9)
    lam = np.full(5, 0.2)
    for _ in range(cfg.steps):
        umask = noise.poisson_mask(len(order), cfg.sample_rate)
        gsum = np.zeros(5)
        for j, u in enumerate(order):
            if umask[j]:
                rows = np.flatnonzero(users == u)
                g = np.mean([_naive_grad(probs[i], y[i], lam, "bce") for i in rows], axis=0)
                gsum += g * min(1.0, cfg.clipping_norm / np.linalg.norm(g))
        gsum += noise.gaussian_numpy(5, cfg.noise_multiplier * cfg.clipping_norm)
        lam = lam * np.exp(-cfg.step_size * gsum / cfg.expected_batch_size)
        lam /= lam.sum()
    np.testing.assert_allclose(fast, lam, rtol=0, atol=1e-10)


def test_algorithm2_caps_records_per_user():
    # One user with 50 identical-gradient records except one outlier; with G = 1 each step uses one
    # record, so the run stays on the simplex and differs from G = 50.
    probs, y = _data(n=50)
    users = np.zeros(50, dtype=int)
    base = dict(steps=5, privacy_unit="user", q=1.0, B=1.0, sigma=0.0, C=100.0)
    a = run_mixmin(
        probs,
        y,
        _cfg(records_per_user=1, **base),
        noise=NoiseSource("reproducible", seed=1),
        user_ids=users,
    ).weights
    b = run_mixmin(
        probs,
        y,
        _cfg(records_per_user=50, **base),
        noise=NoiseSource("reproducible", seed=1),
        user_ids=users,
    ).weights
    full = _reference_mean_descent(probs, y, steps=5, eta=0.8)
    np.testing.assert_allclose(b, full, atol=1e-12)  # G >= |D_u|: the user's mean gradient
    assert not np.allclose(a, b)
    assert abs(a.sum() - 1) < 1e-12


def _reference_mean_descent(probs, y, steps, eta):
    lam = np.full(probs.shape[1], 1.0 / probs.shape[1])
    for _ in range(steps):
        g = per_example_gradients(probs, y, lam, "bce").mean(axis=0)
        lam = lam * np.exp(-eta * g)
        lam /= lam.sum()
    return lam


@settings(max_examples=25, deadline=None)
@given(
    st.integers(2, 8),
    st.integers(1, 40),
    st.floats(0.05, 1.0),
    st.floats(0.0, 50.0),
    st.integers(0, 2**31 - 1),
)
def test_weights_stay_on_the_simplex(k, n, q, sigma, seed):
    rng = np.random.default_rng(seed)
    probs = rng.uniform(0, 1, size=(n, k))
    y = rng.integers(0, 2, size=n).astype(float)
    cfg = MixMinConfig(
        k=k,
        loss="bce",
        noise_multiplier=sigma,
        sample_rate=q,
        expected_batch_size=max(q * n, 0.5),
        steps=5,
        clipping_norm=2.0,
        step_size=3.0,
    )
    w = run_mixmin(probs, y, cfg, noise=NoiseSource("reproducible", seed=seed)).weights
    assert np.all(w >= 0) and np.all(np.isfinite(w)) and abs(w.sum() - 1) < 1e-9


@pytest.mark.parametrize("loss", ["bce", "nll", "mse"])
def test_runs_equal_single_run_without_sampling_or_noise(loss):
    probs, y = _data(loss=loss)
    cfg = _cfg(loss=loss, sigma=0.0, q=1.0, B=60.0, steps=12)
    single = run_mixmin(probs, y, cfg, noise=NoiseSource("reproducible", seed=1)).weights
    batched = run_mixmin_runs(probs, y, cfg, noise=NoiseSource("reproducible", seed=1), runs=3)
    np.testing.assert_allclose(batched, np.tile(single, (3, 1)), rtol=0, atol=1e-10)


def test_runs_are_independent_and_noisy():
    probs, y = _data(n=200)
    cfg = _cfg(q=0.1, B=20.0, steps=20, sigma=1.0)
    w = run_mixmin_runs(probs, y, cfg, noise=NoiseSource("reproducible", seed=5), runs=50)
    assert w.shape == (50, 5)
    assert np.allclose(w.sum(axis=1), 1, atol=1e-5)
    assert len({tuple(np.round(r, 6)) for r in w}) == 50


def test_gradient_canary_matches_reference():
    probs, y = _data()
    cfg = _cfg(sigma=0.0, q=1.0, B=60.0, steps=8, C=0.5)
    d = max_clip_direction(np.arange(5.0))
    canary = MixMinCanary(kind="gradient", direction=3.0 * d)
    out = run_mixmin_runs(
        probs,
        y,
        cfg,
        noise=NoiseSource("reproducible", seed=1),
        runs=2,
        canary=canary,
        canary_in=np.array([True, False]),
    )
    lam = np.full(5, 0.2)
    for _ in range(cfg.steps):
        g = per_example_gradients(probs, y, lam, "bce")
        norms = np.linalg.norm(g, axis=1)
        gsum = (g * np.minimum(1, cfg.clipping_norm / norms)[:, None]).sum(
            axis=0
        ) + d * cfg.clipping_norm
        lam = lam * np.exp(-cfg.step_size * gsum / cfg.expected_batch_size)
        lam /= lam.sum()
    np.testing.assert_allclose(out[0], lam, atol=1e-10)
    plain = run_mixmin(probs, y, cfg, noise=NoiseSource("reproducible", seed=1)).weights
    np.testing.assert_allclose(out[1], plain, atol=1e-10)


def test_record_canary_equals_appending_the_record():
    probs, y = _data()
    cfg = _cfg(sigma=0.0, q=1.0, B=60.0, steps=8)
    canary = MixMinCanary(kind="record", probs=probs[0] * 0.5, label=1.0)
    out = run_mixmin_runs(
        probs, y, cfg, noise=NoiseSource("reproducible", seed=1), runs=1, canary=canary
    )
    with_record = run_mixmin(
        np.vstack([probs, probs[0] * 0.5]),
        np.r_[y, 1.0],
        cfg,
        noise=NoiseSource("reproducible", seed=1),
    ).weights
    np.testing.assert_allclose(out[0], with_record, atol=1e-10)


def test_max_clip_direction():
    w = np.array([0.1, 0.5, 0.05, 0.35])
    d = max_clip_direction(w)
    assert abs(np.linalg.norm(d) - 1) < 1e-12 and abs(d.sum()) < 1e-12
    assert (
        np.argmin(d) == 1
    )  # a negative gradient on the most-weighted source moves weight toward it
    d2 = max_clip_direction(w, top=2, toward=False)
    assert set(np.argsort(-d2)[:2]) == {1, 3}
    with pytest.raises(UsageError, match="top must be"):
        max_clip_direction(w, top=4)


def test_solve_mixmin_recovers_the_generating_mixture():
    # Labels drawn from an exact mixture of the sources: the population minimiser is that mixture.
    rng = np.random.default_rng(0)
    n, k = 40000, 4
    probs = rng.uniform(0.05, 0.95, size=(n, k))
    true = np.array([0.6, 0.0, 0.4, 0.0])
    y = (rng.random(n) < probs @ true).astype(float)
    lam = solve_mixmin(probs, y, "bce")
    assert 1 - cosine(lam, true) > 0.99


def test_config_validation_messages():
    with pytest.raises(UsageError, match=r"^sample_rate must be in \(0, 1\], got 1.5\.$"):
        _cfg(q=1.5)
    with pytest.raises(UsageError, match="loss must be one of bce, nll, mse"):
        _cfg(loss="hinge")
    with pytest.raises(UsageError, match="noise_multiplier must be > 0"):
        _cfg(sigma=0.0).event()
    with pytest.raises(UsageError, match="user_ids must be given"):
        run_mixmin(*_data(), _cfg(privacy_unit="user"), noise=NoiseSource("reproducible", seed=1))
    with pytest.raises(DataError, match="probs must have k = 5 columns"):
        run_mixmin(
            np.ones((3, 4)) * 0.5, np.zeros(3), _cfg(), noise=NoiseSource("reproducible", seed=1)
        )
    with pytest.raises(DataError, match="labels must lie in"):
        run_mixmin(
            np.full((3, 5), 0.5),
            np.array([0, 2, 1.0]),
            _cfg(),
            noise=NoiseSource("reproducible", seed=1),
        )


def test_calibrated_config_meets_the_target():
    q, steps = 1000 / 9000, 200
    cal = calibrate_noise_multiplier(target_epsilon=1.0, delta=1e-5, sample_rate=q, steps=steps)
    cfg = MixMinConfig(
        k=14,
        loss="bce",
        noise_multiplier=cal.noise_multiplier,
        sample_rate=q,
        expected_batch_size=1000.0,
        steps=steps,
        clipping_norm=13.0,
        step_size=0.5,
    )
    ev = cfg.event()
    assert ev == SubsampledGaussian(cal.noise_multiplier, q, steps)
    assert compute_epsilon(ev, delta=1e-5).epsilon <= 1.0
    assert str(cfg.adjacency) == "add-remove-record"
    assert (
        str(MixMinConfig(**{**cfg.to_dict(), "privacy_unit": "user"}).adjacency)
        == "add-remove-user"
    )
