"""R head runs at once (engine.train_heads, as the audits run it): each run is exactly the
single-run protocol; the audit canaries (a CanaryHook per trial batch); validation."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from dpaudit.errors import UsageError
from dpaudit.mechanisms.dpsgd.module_training import DPSGDConfig
from dpaudit.mechanisms.dpsgd.core import check_head_inputs, head_clipped_sum
from dpaudit.mechanisms.dpsgd.loop import CanaryHook, HeadLayout, RecordUnits, train_heads
from dpaudit.noise import NoiseSource


def train_linear_heads_batched(
    z, y, n_classes, cfg, *, runs, canary=None, canary_in=None, chunk_runs=64, **kw
):
    """R runs with an audit canary (a CanaryHook whose ``included`` is replaced by ``canary_in``), as HeadTarget.scores trains them."""
    z, y, _ = check_head_inputs(z, y, n_classes, kw.get("binary_logit", False))
    hook = None if canary is None else dataclasses.replace(canary, included=canary_in)
    return train_heads(z, y, n_classes, cfg, runs=runs, canary=hook, chunk_runs=chunk_runs, **kw)


def _data(n=30, d=4, k=3, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, d)), rng.integers(0, k, n), rng.normal(size=(k, d + 1)) * 0.1


@pytest.mark.parametrize("binary_logit", [False, True])
def test_batched_clipped_sum_equals_single_per_run(binary_logit):
    rng = np.random.default_rng(1)
    n, d = 25, 6
    k = 1 if binary_logit else 4
    z1 = np.concatenate([rng.normal(size=(n, d)) * 3, np.ones((n, 1))], axis=1)
    y = rng.integers(0, 2 if binary_logit else k, n)
    w = rng.normal(size=(5, k, d + 1))
    idx = [
        np.array([], dtype=np.int64),
        np.array([3]),
        np.arange(0, 25, 2),
        np.array([1, 2, 24]),
        np.arange(25),
    ]
    norms = np.linalg.norm(z1, axis=1)
    layout = HeadLayout(z1, norms, y, n, d, k)
    cfg = DPSGDConfig(
        sample_rate=0.2, steps=1, normalizer=1, noise_multiplier=1.0, clipping_norm=0.4
    )
    units = RecordUnits(layout, cfg)
    got = np.zeros_like(w)
    for r in range(5):  # the engine's per-run clipped sum on its reused workspace, into views
        units.clipped_sum(idx[r], w[r], got[r])
    for r in range(5):
        want = (
            head_clipped_sum(
                w[r], z1[idx[r]], norms[idx[r]], y[idx[r]], 0.4, binary_logit=binary_logit
            )
            if idx[r].size
            else np.zeros((k, d + 1))
        )
        np.testing.assert_allclose(got[r], want, rtol=1e-12, atol=1e-14)


def test_deterministic_runs_equal_the_single_trainer():
    """q = 1 and no noise: every run is deterministic and must equal a single run."""
    z, y, init = _data()
    cfg = DPSGDConfig(
        sample_rate=1.0, steps=15, normalizer=30, noise_multiplier=0.0, non_private=True
    )
    single = train_heads(
        z, y, 3, cfg, noise=NoiseSource("reproducible", seed=0), init=init, dtype=torch.float64
    )
    batched = train_linear_heads_batched(
        z,
        y,
        3,
        cfg,
        noise=NoiseSource("reproducible", seed=0),
        runs=4,
        init=init,
        dtype=torch.float64,
        chunk_runs=3,
    )
    assert batched.weights.shape == (4, 3, 5) and batched.steps_executed == 15
    for r in range(4):
        np.testing.assert_allclose(batched.weights[r], single.weights[0], rtol=1e-10, atol=1e-12)


def test_private_runs_are_independent_and_reproducible():
    z, y, init = _data(n=200)
    cfg = DPSGDConfig(sample_rate=0.1, steps=20, normalizer=20, noise_multiplier=1.0)
    a = train_linear_heads_batched(
        z, y, 3, cfg, noise=NoiseSource("reproducible", seed=3), runs=6, init=init, chunk_runs=4
    ).weights
    b = train_linear_heads_batched(
        z, y, 3, cfg, noise=NoiseSource("reproducible", seed=3), runs=6, init=init, chunk_runs=4
    ).weights
    np.testing.assert_array_equal(a, b)
    for i in range(6):
        for j in range(i):
            assert not np.allclose(a[i], a[j])


def test_batched_matches_single_in_distribution():
    """Mean and spread of the final weights agree between R batched runs and R single runs."""
    z, y, init = _data(n=60, d=2, k=2, seed=4)
    cfg = DPSGDConfig(sample_rate=0.2, steps=10, normalizer=12, noise_multiplier=1.0, lr=0.05)
    runs = 150
    batched = train_linear_heads_batched(
        z, y, 2, cfg, noise=NoiseSource("reproducible", seed=5), runs=runs, init=init
    ).weights
    src = NoiseSource("reproducible", seed=6)
    single = np.stack(
        [train_heads(z, y, 2, cfg, noise=src, init=init).weights[0] for _ in range(runs)]
    )
    se = np.sqrt((batched.var(0) + single.var(0)) / runs)
    assert np.all(np.abs(batched.mean(0) - single.mean(0)) < 5 * se + 1e-6)
    assert np.all(np.abs(batched.std(0) / single.std(0) - 1) < 0.35)


def test_gradient_canary_is_added_only_in_including_runs():
    z, y, init = _data()
    cfg = DPSGDConfig(
        sample_rate=1.0,
        steps=8,
        normalizer=30,
        noise_multiplier=0.0,
        non_private=True,
        clipping_norm=0.7,
    )
    direction = np.random.default_rng(2).normal(size=(3, 5))
    canary = CanaryHook(
        np.zeros(1, bool), gradient=direction * (0.7 / np.linalg.norm(direction))
    )  # norm C
    res = train_linear_heads_batched(
        z,
        y,
        3,
        cfg,
        noise=NoiseSource("reproducible", seed=0),
        runs=4,
        init=init,
        canary=canary,
        canary_in=np.array([True, False, True, False]),
        dtype=torch.float64,
        chunk_runs=2,
    )
    single = train_heads(
        z, y, 3, cfg, noise=NoiseSource("reproducible", seed=0), init=init, dtype=torch.float64
    ).weights[0]
    assert res.canary_samples.tolist() == [8, 0, 8, 0]  # q = 1: sampled at every step
    np.testing.assert_allclose(res.weights[1], single, rtol=1e-10)
    np.testing.assert_allclose(res.weights[0], res.weights[2], rtol=1e-10)
    assert not np.allclose(res.weights[0], single)


def test_record_canary_equals_training_with_the_extra_record():
    z, y, init = _data()
    cz, cy = np.full(4, 2.0), 1
    cfg = DPSGDConfig(
        sample_rate=1.0, steps=8, normalizer=30, noise_multiplier=0.0, non_private=True
    )
    res = train_linear_heads_batched(
        z,
        y,
        3,
        cfg,
        noise=NoiseSource("reproducible", seed=0),
        runs=2,
        init=init,
        canary=CanaryHook(np.zeros(1, bool), z=cz[None], y=np.array([cy])),
        canary_in=np.array([True, False]),
        dtype=torch.float64,
    )
    with_canary = train_heads(
        np.vstack([z, cz]),
        np.append(y, cy),
        3,
        cfg,
        noise=NoiseSource("reproducible", seed=0),
        init=init,
        dtype=torch.float64,
    ).weights[0]
    without = train_heads(
        z, y, 3, cfg, noise=NoiseSource("reproducible", seed=0), init=init, dtype=torch.float64
    ).weights[0]
    np.testing.assert_allclose(res.weights[0], with_canary, rtol=1e-10)
    np.testing.assert_allclose(res.weights[1], without, rtol=1e-10)


def test_canary_sampling_rate_is_q():
    z, y, _ = _data(n=10)
    cfg = DPSGDConfig(sample_rate=0.25, steps=400, normalizer=3, noise_multiplier=1.0)
    res = train_linear_heads_batched(
        z,
        y,
        3,
        cfg,
        noise=NoiseSource("reproducible", seed=1),
        runs=8,
        canary=CanaryHook(np.zeros(1, bool), gradient=np.ones((3, 5))),
        canary_in=np.ones(8, dtype=bool),
    )
    rate = res.canary_samples.sum() / (8 * 400)
    assert abs(rate - 0.25) < 5 * np.sqrt(0.25 * 0.75 / 3200)


def test_validation():
    z, y, _ = _data()
    cfg = DPSGDConfig(sample_rate=0.5, steps=2, normalizer=3, noise_multiplier=1.0)
    noise = NoiseSource("reproducible", seed=0)
    with pytest.raises(UsageError, match="canary_in must be a boolean array of shape"):
        train_linear_heads_batched(
            z,
            y,
            3,
            cfg,
            noise=noise,
            runs=2,
            canary=CanaryHook(np.zeros(1, bool), gradient=np.ones((3, 5))),
            canary_in=np.ones(3, bool),
        )
    with pytest.raises(UsageError, match="canary gradient must be a finite array of shape"):
        train_linear_heads_batched(
            z,
            y,
            3,
            cfg,
            noise=noise,
            runs=2,
            canary=CanaryHook(np.zeros(1, bool), gradient=np.ones((2, 5))),
            canary_in=np.ones(2, bool),
        )
    with pytest.raises(UsageError, match="either rows"):
        CanaryHook(np.ones(2, bool))
    with pytest.raises(UsageError, match="runs must be"):
        train_linear_heads_batched(z, y, 3, cfg, noise=noise, runs=0)


def test_engine_canary_hook_validation():
    from dpaudit.mechanisms.dpsgd.loop import CanaryHook, train_heads

    z, y, _ = _data()
    cfg = DPSGDConfig(sample_rate=0.5, steps=2, normalizer=3, noise_multiplier=1.0)
    with pytest.raises(UsageError, match="either rows"):
        CanaryHook(included=np.ones(2, bool))
    with pytest.raises(UsageError, match="either rows"):
        CanaryHook(
            included=np.ones(2, bool), z=np.ones((1, 4)), y=np.array([0]), gradient=np.ones((3, 5))
        )
    with pytest.raises(
        UsageError, match=r"canary rows must have 4 features and labels in \[0, 3\)"
    ):
        train_heads(
            z,
            y,
            3,
            cfg,
            noise=NoiseSource("reproducible", seed=0),
            runs=2,
            canary=CanaryHook(np.ones(2, bool), z=np.ones((1, 4)), y=np.array([3])),
        )
    with pytest.raises(UsageError, match="a record canary must be one record"):
        train_heads(
            z,
            y,
            3,
            cfg,
            noise=NoiseSource("reproducible", seed=0),
            runs=2,
            canary=CanaryHook(np.ones(2, bool), z=np.ones((2, 4)), y=np.array([0, 1])),
        )
    with pytest.raises(
        UsageError, match=r"canary gradient must be a finite array of shape \(3, 5\)"
    ):
        train_heads(
            z,
            y,
            3,
            cfg,
            noise=NoiseSource("reproducible", seed=0),
            runs=2,
            canary=CanaryHook(np.ones(2, bool), gradient=np.ones((3, 4))),
        )
