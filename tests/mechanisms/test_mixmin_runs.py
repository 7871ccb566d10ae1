"""The one DP-MixMin loop of releases and audits: R runs of Algorithm 1 at once,
clipped scalars of every (run, record) pair, fresh noise every step, canaries at rate q."""

from __future__ import annotations

import math

import numpy as np
import pytest

import dpaudit.mechanisms.mixmin.solver as mm
from dpaudit.mechanisms.mixmin.solver import (
    MixMinCanary,
    MixMinConfig,
    clip_scale,
    loss_coefficient,
    run_mixmin,
    run_mixmin_runs,
)
from dpaudit.noise import NoiseSource


def _cfg(k=5, loss="bce", sigma=0.0, q=0.3, B=12.0, steps=6, C=0.5, eta=2.0):
    return MixMinConfig(
        k=k,
        loss=loss,
        noise_multiplier=sigma,
        sample_rate=q,
        expected_batch_size=B,
        steps=steps,
        clipping_norm=C,
        step_size=eta,
    )


@pytest.mark.parametrize("loss", ["bce", "nll", "mse"])
def test_clipped_sum_matches_reference(loss):
    rng = np.random.default_rng(3)
    R, n, k = 4, 300, 5
    F = rng.uniform(0.0, 1.0, (n, k)) + (0.01 if loss == "nll" else 0.0)
    F[7] = (
        0.0 if loss != "nll" else F[7]
    )  # an all-zero proxy row: its cap is inf, its gradient zero
    y = rng.integers(0, 2, n).astype(float) if loss != "nll" else np.zeros(n)
    w, mask = rng.dirichlet(np.ones(k), R), rng.random((R, n)) < 0.4
    cfg = _cfg(loss=loss, C=1.5)
    with np.errstate(divide="ignore", invalid="ignore"):
        _, clipped_sum = mm._record_sum(F, y, cfg)
        ref = np.stack(
            [
                (
                    clip_scale(loss_coefficient(F @ w[r], y, loss), np.linalg.norm(F, axis=1), 1.5)
                    * mask[r]
                )
                @ F
                for r in range(R)
            ]
        )
    np.testing.assert_allclose(clipped_sum(w, mask), np.nan_to_num(ref), rtol=1e-9, atol=1e-12)


def test_runs_without_sampling_or_noise_equal_the_release_run():
    rng = np.random.default_rng(0)
    probs, y = rng.uniform(0.02, 0.98, (50, 5)), rng.integers(0, 2, 50).astype(float)
    cfg = _cfg(q=1.0, B=50.0, steps=9)
    runs = run_mixmin_runs(probs, y, cfg, noise=NoiseSource("reproducible", seed=1), runs=7)
    single = run_mixmin(probs, y, cfg, noise=NoiseSource("reproducible", seed=1)).weights
    np.testing.assert_allclose(runs, np.tile(single, (7, 1)), rtol=0, atol=1e-13)


def test_runs_have_the_single_run_distribution():
    # Noise off: Poisson sampling is the only randomness, so the mean final weights over many runs
    # must agree with those of many single (release) runs.
    rng = np.random.default_rng(1)
    probs, y = rng.uniform(0.02, 0.98, (40, 4)), rng.integers(0, 2, 40).astype(float)
    cfg = _cfg(k=4, q=0.25, B=10.0, steps=6)
    runs = 600
    many = run_mixmin_runs(probs, y, cfg, noise=NoiseSource("reproducible", seed=21), runs=runs)
    ns = NoiseSource("reproducible", seed=22)
    single = np.stack([run_mixmin(probs, y, cfg, noise=ns).weights for _ in range(runs)])
    se = np.sqrt(many.var(axis=0) / runs + single.var(axis=0) / runs)
    assert np.all(np.abs(many.mean(axis=0) - single.mean(axis=0)) < 5 * se + 1e-12)
    assert np.all(many.std(axis=0) > 0)


def _zero_gradient_task(n=30, k=4):
    # mse with every proxy 0.5 and every label 0.5: p = 0.5 for every mixture, so every record's
    # gradient is 0 and the final log-weights are the (centred) sum of what was added: noise, canary.
    return np.full((n, k), 0.5), np.full(n, 0.5)


def test_every_step_gets_fresh_noise():
    probs, y = _zero_gradient_task()
    runs, k, steps, sigma, C, B, eta = 3000, 4, 7, 2.0, 0.5, 10.0, 1.0
    cfg = MixMinConfig(
        k=k,
        loss="mse",
        noise_multiplier=sigma,
        sample_rate=0.5,
        expected_batch_size=B,
        steps=steps,
        clipping_norm=C,
        step_size=eta,
    )
    lw = np.log(
        run_mixmin_runs(probs, y, cfg, noise=NoiseSource("reproducible", seed=3), runs=runs)
    )
    z = -(B / eta) * (
        lw - lw.mean(axis=1, keepdims=True)
    )  # centred sum over steps of N(0, (sigma C)^2) per coordinate
    expected = steps * (sigma * C) ** 2 * (1 - 1 / k)
    assert abs(z.var(axis=0).mean() / expected - 1) < 0.05
    # coordinates of different runs and steps independent: no correlation between runs
    assert abs(np.corrcoef(z[:-1, 0], z[1:, 0])[0, 1]) < 0.06


def test_gradient_canary_hits_at_rate_q():
    probs, y = _zero_gradient_task()
    runs, k, steps, q, C, B, eta = 4000, 4, 9, 0.3, 0.5, 10.0, 1.0
    cfg = MixMinConfig(
        k=k,
        loss="mse",
        noise_multiplier=0.0,
        sample_rate=q,
        expected_batch_size=B,
        steps=steps,
        clipping_norm=C,
        step_size=eta,
    )
    d = mm.max_clip_direction(np.array([0.4, 0.3, 0.2, 0.1]))
    cin = np.arange(runs) % 2 == 0
    w = run_mixmin_runs(
        probs,
        y,
        cfg,
        noise=NoiseSource("reproducible", seed=4),
        runs=runs,
        canary=MixMinCanary(kind="gradient", direction=d),
        canary_in=cin,
    )
    lw = np.log(w)
    hits = (
        -(B / eta) * (lw - lw.mean(axis=1, keepdims=True)) @ d
    ) / C  # number of steps that sampled the canary
    np.testing.assert_allclose(hits[~cin], 0, atol=1e-9)
    assert np.allclose(hits[cin], np.round(hits[cin]), atol=1e-6)
    h = np.round(hits[cin])
    m = cin.sum()
    assert abs(h.mean() - steps * q) < 5 * math.sqrt(steps * q * (1 - q) / m)
    assert abs(h.var() / (steps * q * (1 - q)) - 1) < 0.1
