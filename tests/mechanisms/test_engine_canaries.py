"""Head engine: many canaries (one-run audits) and the recorded trajectory (trajectory threat model)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import sparse

from dpaudit.errors import UsageError
from dpaudit.mechanisms.dpsgd import module_training as dpsgd, core as dpsgd_core
from dpaudit.mechanisms.dpsgd.module_training import DPSGDConfig
from dpaudit.mechanisms.dpsgd.loop import CanaryHook, train_heads
from dpaudit.noise import NoiseSource


def _data(n=40, d=5, k=3, seed=0, dead=2):
    """Features whose last ``dead`` columns are zero in every record (free canary coordinates)."""
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(n, d))
    z[:, d - dead :] = 0.0
    return z, rng.integers(0, k, n), rng.normal(size=(k, d + 1)) * 0.1


def _noise(seed=7):
    return NoiseSource("reproducible", seed=seed)


CFG = DPSGDConfig(sample_rate=0.3, steps=12, normalizer=10, noise_multiplier=0.8, clipping_norm=0.7)


def _dirac(m, k, d, coords, c):
    g = np.zeros((m, k, d + 1))
    for i, (r, j) in enumerate(coords):
        g[i, r, j] = c
    return g


def test_one_canary_as_many_equals_the_single_canary_path():
    """M = 1 through the many-canary path (included (R, 1), gradient (1, K, d+1)): the same draws and
    the same additions as the single-canary path, so the heads are bit-identical."""
    z, y, init = _data()
    inc = np.array([True, False, True, True])
    g = _dirac(1, 3, 5, [(1, 4)], CFG.clipping_norm)
    one = train_heads(
        z,
        y,
        3,
        CFG,
        noise=_noise(),
        runs=4,
        init=init,
        canary=CanaryHook(included=inc, gradient=g[0]),
    )
    many = train_heads(
        z,
        y,
        3,
        CFG,
        noise=_noise(),
        runs=4,
        init=init,
        canary=CanaryHook(included=inc[:, None], gradient=g),
    )
    assert np.array_equal(one.weights, many.weights)
    assert np.array_equal(one.canary_samples, many.canary_samples[:, 0])
    # a record canary too
    zc, yc = np.random.default_rng(3).normal(size=(1, 5)), np.array([2])
    one = train_heads(
        z, y, 3, CFG, noise=_noise(), runs=4, init=init, canary=CanaryHook(included=inc, z=zc, y=yc)
    )
    many = train_heads(
        z,
        y,
        3,
        CFG,
        noise=_noise(),
        runs=4,
        init=init,
        canary=CanaryHook(included=inc[:, None], z=zc, y=yc),
    )
    assert np.array_equal(one.weights, many.weights) and np.array_equal(
        one.canary_samples, many.canary_samples[:, 0]
    )


def test_many_gradient_canaries_add_exactly_their_sampled_gradients():
    """q = 1 and no noise: every included canary is sampled at every step, so M Dirac canaries in
    distinct coordinates act as one canary whose gradient is the sum of the included ones."""
    z, y, init = _data()
    cfg = DPSGDConfig(
        sample_rate=1.0, steps=6, normalizer=10, noise_multiplier=0.0, non_private=True
    )
    coords = [(0, 3), (1, 3), (2, 4), (0, 4)]
    g = _dirac(4, 3, 5, coords, 0.5)
    inc = np.array([[True, False, True, True], [False, False, False, False]])
    many = train_heads(
        z, y, 3, cfg, noise=_noise(), runs=2, init=init, canary=CanaryHook(included=inc, gradient=g)
    )
    for r in range(2):
        summed = (g * inc[r][:, None, None]).sum(axis=0)
        want = train_heads(
            z,
            y,
            3,
            cfg,
            noise=_noise(),
            runs=1,
            init=init,
            canary=CanaryHook(included=np.array([True]), gradient=summed),
        )
        assert np.array_equal(many.weights[r], want.weights[0])
    assert many.canary_samples.tolist() == [[6, 0, 6, 6], [0, 0, 0, 0]]
    # a sparse (M, K(d+1)) matrix is the same canaries
    sp = train_heads(
        z,
        y,
        3,
        cfg,
        noise=_noise(),
        runs=2,
        init=init,
        canary=CanaryHook(included=inc, gradient=sparse.csr_matrix(g.reshape(4, -1))),
    )
    assert np.array_equal(sp.weights, many.weights)


def test_many_record_canaries_are_extra_records():
    """q = 1, no noise: M record canaries, some included, equal training on the data with exactly
    the included records appended (same rows, same order, same clipped sums)."""
    z, y, init = _data(d=5, dead=0)
    cfg = DPSGDConfig(
        sample_rate=1.0, steps=5, normalizer=10, noise_multiplier=0.0, non_private=True
    )
    rng = np.random.default_rng(5)
    zc, yc = rng.normal(size=(3, 5)), np.array([0, 2, 1])
    inc = np.array([[True, False, True]])
    got = train_heads(
        z, y, 3, cfg, noise=_noise(), runs=1, init=init, canary=CanaryHook(included=inc, z=zc, y=yc)
    )
    want = train_heads(
        np.vstack([z, zc[[0, 2]]]),
        np.concatenate([y, yc[[0, 2]]]),
        3,
        cfg,
        noise=_noise(),
        runs=1,
        init=init,
    )
    assert np.array_equal(got.weights, want.weights)
    assert got.canary_samples.tolist() == [[5, 0, 5]]


def test_many_canaries_inclusion_and_sampling_frequencies():
    """Each included canary is sampled independently with rate q at every step; excluded never."""
    z, y, init = _data()
    cfg = DPSGDConfig(sample_rate=0.3, steps=150, normalizer=10, noise_multiplier=1.0)
    m, runs = 40, 3
    inc = np.random.default_rng(2).random((runs, m)) < 0.5
    coords = [
        (i % 3, 3 + (i // 3) % 2) for i in range(m)
    ]  # coordinates may repeat: the sums just add
    res = train_heads(
        z,
        y,
        3,
        cfg,
        noise=_noise(11),
        runs=runs,
        init=init,
        canary=CanaryHook(included=inc, gradient=_dirac(m, 3, 5, coords, 1.0)),
    )
    assert res.canary_samples.shape == (runs, m)
    assert np.all(res.canary_samples[~inc] == 0)
    rate = res.canary_samples[inc].sum() / (inc.sum() * cfg.steps)
    assert abs(rate - 0.3) < 0.02  # ~ 60 canaries x 150 steps: sd ~ 0.005
    # per canary: counts ~ Binomial(150, 0.3), mean 45 sd 5.6; independent draws, not one shared mask
    counts = res.canary_samples[inc]
    assert counts.min() > 20 and counts.max() < 70 and np.unique(counts).size > 5


def test_recorded_trajectory_is_what_the_sanitised_step_used(monkeypatch):
    """``record``: the privatised sums at the coordinates, bit for bit what Adam received times
    m0 (spy on the shared Adam step); recording changes no draw and no update."""
    z, y, init = _data()
    seen = []
    real_step = dpsgd_core.Adam.step

    def spy(self, grads, t):
        seen.append(np.array(grads[0]))
        return real_step(self, grads, t)

    coords = [(0, 4), (2, 1), (1, 5)]
    inc = np.array([True, False, True])
    g = _dirac(1, 3, 5, [(0, 4)], CFG.clipping_norm)[0]
    plain = train_heads(
        z, y, 3, CFG, noise=_noise(), runs=3, init=init, canary=CanaryHook(included=inc, gradient=g)
    )
    monkeypatch.setattr(dpsgd_core.Adam, "step", spy)
    rec = train_heads(
        z,
        y,
        3,
        CFG,
        noise=_noise(),
        runs=3,
        init=init,
        canary=CanaryHook(included=inc, gradient=g),
        record=coords,
    )
    assert np.array_equal(rec.weights, plain.weights)  # recording is read-only
    assert rec.recorded.shape == (3, CFG.steps, 3) and rec.recorded.dtype == np.float32
    used = np.stack(seen, axis=1)  # (R, T, K, d+1): what Adam saw, already / m0
    for p, (k, j) in enumerate(coords):
        assert np.array_equal(rec.recorded[:, :, p] / np.float32(CFG.normalizer), used[:, :, k, j])
    # the dead coordinate of a run without the canary is pure noise N(0, (sigma C)^2), not zero
    assert np.all(rec.recorded[1, :, 0] != 0)


def test_recorded_dead_coordinate_is_noise_plus_sampled_canary():
    """At a coordinate the data never move, the record is exactly noise + C * (canary sampled)."""
    z, y, init = _data()
    g = _dirac(1, 3, 5, [(2, 3)], CFG.clipping_norm)[0]
    inc = np.array([True, False])
    a = train_heads(
        z,
        y,
        3,
        CFG,
        noise=_noise(4),
        runs=2,
        init=init,
        canary=CanaryHook(included=inc, gradient=g),
        record=[(2, 3)],
    )
    nc = DPSGDConfig(
        sample_rate=CFG.sample_rate,
        steps=CFG.steps,
        normalizer=10,
        noise_multiplier=1e-9,
        clipping_norm=CFG.clipping_norm,
    )
    b = train_heads(
        z,
        y,
        3,
        nc,
        noise=_noise(4),
        runs=2,
        init=init,
        canary=CanaryHook(included=inc, gradient=g),
        record=[(2, 3)],
    )
    hits = np.round(b.recorded[:, :, 0] / CFG.clipping_norm)  # the no-noise record is C * sampled
    assert (
        set(np.unique(hits)) <= {0.0, 1.0}
        and hits[1].sum() == 0
        and hits[0].sum() == a.canary_samples[0]
    )
    assert hits[0].sum() == b.canary_samples[0]


def test_record_without_noise_is_the_clipped_sum():
    z, y, init = _data()
    cfg = DPSGDConfig(
        sample_rate=1.0, steps=3, normalizer=10, noise_multiplier=0.0, non_private=True
    )
    res = train_heads(
        z, y, 3, cfg, noise=_noise(), runs=1, init=init, record=[(0, 0)], dtype=torch.float64
    )
    # step 1 at init: the unclipped (non_private) gradient sum over all rows, coordinate (0, 0)
    z1 = np.hstack([z, np.ones((len(z), 1))])
    logits = z1 @ init.T
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    want = ((p[:, 0] - (y == 0)) * z1[:, 0]).sum()
    np.testing.assert_allclose(res.recorded[0, 0, 0], want, rtol=1e-10)


def test_many_canary_and_record_validation():
    z, y, init = _data()
    with pytest.raises(UsageError, match=r"canary gradients must be finite, shaped \(2, 3, 6\)"):
        train_heads(
            z,
            y,
            3,
            CFG,
            noise=_noise(),
            runs=1,
            canary=CanaryHook(included=np.ones((1, 2), bool), gradient=np.ones((3, 3, 6))),
        )
    with pytest.raises(
        UsageError, match=r"canary_in must be a boolean array of shape \(2, canaries >= 1\)"
    ):
        train_heads(
            z,
            y,
            3,
            CFG,
            noise=_noise(),
            runs=2,
            canary=CanaryHook(included=np.ones((1, 2), bool), gradient=np.ones((2, 3, 6))),
        )
    with pytest.raises(UsageError, match=r"canary rows must be one record per canary \(2\)"):
        train_heads(
            z,
            y,
            3,
            CFG,
            noise=_noise(),
            runs=1,
            canary=CanaryHook(
                included=np.ones((1, 2), bool), z=np.ones((3, 5)), y=np.zeros(3, int)
            ),
        )
    with pytest.raises(UsageError, match=r"canary included must have shape"):
        CanaryHook(included=np.ones((1, 2, 2), bool), gradient=np.ones((3, 6)))
    with pytest.raises(
        UsageError,
        match=r"record must be integer \(row, column\) pairs with rows in \[0, 3\) and columns in \[0, 5\]",
    ):
        train_heads(z, y, 3, CFG, noise=_noise(), runs=1, record=[(0, 6)])
    with pytest.raises(UsageError, match=r"record must be integer"):
        train_heads(z, y, 3, CFG, noise=_noise(), runs=1, record=[0.5, 1.0])
