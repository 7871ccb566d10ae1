"""The batched DP-MixMin runner's dense path: exact Bernoulli masks, clipped scalars, pre-drawn noise.

The dense path (sample rate >= DENSE_SAMPLE_RATE) computes every (run, record) pair and zeroes the
records a run did not sample; these tests pin down that it samples, clips and adds noise exactly
as Algorithm 1 does (the sparse path and the single run are the references).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import dpaudit.mechanisms.mixmin as mm
from dpaudit.mechanisms.mixmin import MixMinCanary, MixMinConfig, clip_scale, loss_coefficient, run_mixmin, run_mixmin_batched
from dpaudit.noise import NoiseSource


def _cfg(k=5, loss="bce", sigma=0.0, q=0.3, B=12.0, steps=6, C=0.5, eta=2.0):
    return MixMinConfig(k=k, loss=loss, noise_multiplier=sigma, sample_rate=q, expected_batch_size=B, steps=steps,
                        clipping_norm=C, step_size=eta)


class _ScriptedRng:
    """Stands in for numpy's Generator: returns the given top bytes and 45-bit tie-breakers."""

    def __init__(self, top_bytes, tie_bits):
        self.top = np.asarray(top_bytes, dtype=np.uint8)
        self.ties = np.asarray(tie_bits, dtype=np.int64)

    def integers(self, low, high, size, dtype):
        if high == 2**64:
            words = np.zeros(size * 8, dtype=np.uint8)
            words[: self.top.size] = self.top
            return words.view(np.uint64)
        assert high == 2**45 and size == self.ties.size
        return self.ties


def test_bernoulli_mask_decision_rule_is_exact():
    # q = t 2^-53 with t = 85 * 2^45 + lo: a pair is in iff its 53-bit uniform k = 2^45 a + b is < t.
    lo = 12345
    q = (85 * 2**45 + lo) / 2.0**53
    assert math.ceil(q * 2.0**53) == 85 * 2**45 + lo
    top = [84, 85, 85, 86, 0, 255, 85, 85]
    ties = [lo - 1, lo, 0, 2**45 - 1]  # for the four entries whose top byte is 85, in order
    got = mm._bernoulli_mask(_ScriptedRng(top, ties), 8, q)
    np.testing.assert_array_equal(got, [True, True, False, False, True, False, True, False])


@pytest.mark.parametrize("q", [85 / 256, 85.5 / 256, 0.33233632436025257, 0.1, 0.9999])
def test_bernoulli_mask_has_rate_q(q):
    n = 8_000_000
    freq = mm._bernoulli_mask(np.random.default_rng(7), n, q).mean()
    # 85.5/256 tells the tie rule from "top byte < 85" (off by 1/512, ~12 standard errors)
    assert abs(freq - q) < 5 * math.sqrt(q * (1 - q) / n)


@pytest.mark.parametrize("loss", ["bce", "nll", "mse"])
def test_dense_clipped_coefficients_match_reference(loss):
    rng = np.random.default_rng(3)
    R, n = 4, 300
    p = rng.uniform(0.0, 1.0, (R, n))
    p[0, :5] = [0.0, 1e-9, 1.0, 1 - 1e-9, 0.5]  # the probability floor applies at both ends
    if loss == "nll":
        p = p + 0.01
    y = rng.integers(0, 2, n).astype(float) if loss != "nll" else np.zeros(n)
    fnorm = rng.uniform(0.05, 3.0, n)
    fnorm[7] = 0.0  # an all-zero proxy row: cap = inf
    C = 1.5
    with np.errstate(divide="ignore"):
        cap = C / fnorm
    ref = clip_scale(loss_coefficient(p, y[None, :], loss), fnorm[None, :], C)  # row 7: unclipped (zero gradient)
    P = torch.tensor(p)
    got = mm._clipped_coefficients_dense(P, torch.tensor(y), torch.tensor(cap), torch.tensor(-cap), loss, torch.empty_like(P)).numpy()
    np.testing.assert_allclose(got, ref, rtol=1e-9, atol=0)


def test_dense_block_size_does_not_change_deterministic_runs(monkeypatch):
    rng = np.random.default_rng(0)
    probs, y = rng.uniform(0.02, 0.98, (50, 5)), rng.integers(0, 2, 50).astype(float)
    cfg = _cfg(q=1.0, B=50.0, steps=9)
    whole = run_mixmin_batched(probs, y, cfg, noise=NoiseSource("reproducible", seed=1), runs=7, dtype=torch.float64)
    monkeypatch.setattr(mm, "DENSE_BLOCK_ELEMENTS", 2 * 50)  # blocks of two runs, the last one of one
    blocked = run_mixmin_batched(probs, y, cfg, noise=NoiseSource("reproducible", seed=1), runs=7, dtype=torch.float64)
    single = run_mixmin(probs, y, cfg, noise=NoiseSource("reproducible", seed=1)).weights
    np.testing.assert_allclose(blocked, whole, rtol=0, atol=1e-13)
    np.testing.assert_allclose(whole, np.tile(single, (7, 1)), rtol=0, atol=1e-10)


@pytest.mark.parametrize("path", ["dense", "sparse"])
def test_both_sampling_paths_have_the_single_run_distribution(monkeypatch, path):
    # Noise off: Poisson sampling is the only randomness, so the mean final weights over many runs
    # must agree with those of many single runs (run_mixmin, NoiseSource.poisson_mask).
    monkeypatch.setattr(mm, "DENSE_SAMPLE_RATE", 0.0 if path == "dense" else 1.1)
    rng = np.random.default_rng(1)
    probs, y = rng.uniform(0.02, 0.98, (40, 4)), rng.integers(0, 2, 40).astype(float)
    cfg = _cfg(k=4, q=0.25, B=10.0, steps=6)
    runs = 600
    batched = run_mixmin_batched(probs, y, cfg, noise=NoiseSource("reproducible", seed=21), runs=runs, dtype=torch.float64)
    ns = NoiseSource("reproducible", seed=22)
    single = np.stack([run_mixmin(probs, y, cfg, noise=ns).weights for _ in range(runs)])
    se = np.sqrt(batched.var(axis=0) / runs + single.var(axis=0) / runs)
    assert np.all(np.abs(batched.mean(axis=0) - single.mean(axis=0)) < 5 * se + 1e-12)
    assert np.all(batched.std(axis=0) > 0)


def _zero_gradient_task(n=30, k=4):
    # mse with every proxy 0.5 and every label 0.5: p = 0.5 for every mixture, so every record's
    # gradient is 0 and the final log-weights are the (centred) sum of what was added: noise, canary.
    return np.full((n, k), 0.5), np.full(n, 0.5)


@pytest.mark.parametrize("predraw", [None, 3])
def test_every_step_gets_fresh_noise(monkeypatch, predraw):
    probs, y = _zero_gradient_task()
    runs, k, steps, sigma, C, B, eta = 3000, 4, 7, 2.0, 0.5, 10.0, 1.0
    if predraw is not None:  # groups of 3, 3 and 1 steps
        monkeypatch.setattr(mm, "_PREDRAW_ELEMENTS", predraw * runs * k)
    cfg = MixMinConfig(k=k, loss="mse", noise_multiplier=sigma, sample_rate=0.5, expected_batch_size=B, steps=steps,
                       clipping_norm=C, step_size=eta)
    w = run_mixmin_batched(probs, y, cfg, noise=NoiseSource("reproducible", seed=3), runs=runs, dtype=torch.float64)
    lw = np.log(w)
    z = -(B / eta) * (lw - lw.mean(axis=1, keepdims=True))  # centred sum over steps of N(0, (sigma C)^2) per coordinate
    expected = steps * (sigma * C) ** 2 * (1 - 1 / k)
    assert abs(z.var(axis=0).mean() / expected - 1) < 0.05
    # coordinates of different runs and steps independent: no correlation between runs
    assert abs(np.corrcoef(z[:-1, 0], z[1:, 0])[0, 1]) < 0.06


@pytest.mark.parametrize("predraw", [None, 2])
def test_gradient_canary_hits_at_rate_q(monkeypatch, predraw):
    probs, y = _zero_gradient_task()
    runs, k, steps, q, C, B, eta = 4000, 4, 9, 0.3, 0.5, 10.0, 1.0
    if predraw is not None:
        monkeypatch.setattr(mm, "_PREDRAW_ELEMENTS", predraw * runs * k)
    cfg = MixMinConfig(k=k, loss="mse", noise_multiplier=0.0, sample_rate=q, expected_batch_size=B, steps=steps,
                       clipping_norm=C, step_size=eta)
    d = mm.max_clip_direction(np.array([0.4, 0.3, 0.2, 0.1]))
    cin = np.arange(runs) % 2 == 0
    w = run_mixmin_batched(probs, y, cfg, noise=NoiseSource("reproducible", seed=4), runs=runs, canary=MixMinCanary(kind="gradient", direction=d),
                           canary_in=cin, dtype=torch.float64)
    lw = np.log(w)
    hits = (-(B / eta) * (lw - lw.mean(axis=1, keepdims=True)) @ d) / C  # number of steps that sampled the canary
    np.testing.assert_allclose(hits[~cin], 0, atol=1e-9)
    assert np.allclose(hits[cin], np.round(hits[cin]), atol=1e-6)
    h = np.round(hits[cin])
    m = cin.sum()
    assert abs(h.mean() - steps * q) < 5 * math.sqrt(steps * q * (1 - q) / m)
    assert abs(h.var() / (steps * q * (1 - q)) - 1) < 0.1


@pytest.mark.parametrize("q", [1e-4, 0.05, 0.111, 0.3323, 0.34, 0.9])
def test_vectorised_geometric_is_numpys_sampler_value_for_value(q):
    ours, theirs = np.random.default_rng(5), np.random.default_rng(5)
    np.testing.assert_array_equal(mm._geometric(ours, q, 100_000), theirs.geometric(q, size=100_000))
    assert ours.random() == theirs.random()  # the generator is left in the same state
