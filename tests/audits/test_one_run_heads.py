"""One-run audits of DP-SGD heads: Dirac canaries in zero-gradient coordinates, extra zero features,
input-mislabeled canaries, and validation."""

from __future__ import annotations

import numpy as np
import pytest

from dpaudit.mechanisms.dpsgd.head_audit import HeadTarget
from dpaudit.mechanisms.dpsgd.one_run_heads import (
    free_coordinates,
    heads_one_run,
    with_zero_features,
)
from dpaudit.errors import UsageError
from dpaudit.noise import NoiseSource


@pytest.fixture(scope="module")
def target():
    t = HeadTarget(max_train=150, epochs=2)
    t.prepare()
    return t


def test_free_coordinates_and_zero_features_keep_the_outputs():
    z = np.array([[1.0, 0.0, 2.0, 0.0], [3.0, 0.0, -1.0, 0.0]])
    assert free_coordinates(z, 2).tolist() == [[0, 1], [1, 1], [0, 3], [1, 3]]
    init = np.arange(10.0).reshape(2, 5)
    z2, init2 = with_zero_features(z, init, 3)
    assert z2.shape == (2, 7) and init2.shape == (2, 8) and np.all(z2[:, 4:] == 0)
    assert np.array_equal(init2[:, -1], init[:, -1]) and np.all(init2[:, 4:7] == 0)
    logits = lambda zz, w: zz @ w[:, :-1].T + w[:, -1]  # noqa: E731
    assert np.array_equal(logits(z, init), logits(z2, init2))  # outputs on the real data unchanged


def test_gradient_canaries_no_noise_separate_and_extra_features_are_added(target):
    """No noise: an included canary's weight is pushed down by its sampled +C gradients; an
    excluded one moves only by the 1e-12 noise. m beyond the free coordinates adds zero features."""
    free = len(free_coordinates(target._z, target._k))
    assert free > 0 and free % 10 == 0  # digits: always-zero pixels, K = 10 rows each
    m = free + 25
    s = heads_one_run(
        target, canaries=m, noise=NoiseSource("reproducible", seed=1), seed=0, noise_on=False
    )
    assert s.kind == "gradient" and s.m == m and 0 < s.included.sum() < m
    assert (
        s.info["free_coordinates"] == free and s.info["extra_zero_features"] == 3
    )  # ceil(25 / 10)
    assert len({tuple(c) for c in s.info["coordinates"]}) == m  # distinct coordinates
    sampled_ever = 1 - (1 - target._config.sample_rate) ** target._config.steps
    assert sampled_ever > 0.9
    assert np.median(s.scores[s.included]) > 100 * np.abs(s.scores[~s.included]).max()


def test_gradient_canaries_with_noise_still_rank(target):
    """With the release's noise (eps 2) the included canaries score higher on average."""
    s = heads_one_run(target, canaries=400, noise=NoiseSource("reproducible", seed=2), seed=0)
    assert s.info["noise"] and s.info["noise_multiplier"] == target._config.noise_multiplier
    assert s.scores[s.included].mean() > s.scores[~s.included].mean()


def test_inclusion_is_a_fair_private_coin(target):
    inc = np.concatenate(
        [
            heads_one_run(
                target,
                canaries=200,
                noise=NoiseSource("reproducible", seed=k),
                seed=0,
                noise_on=False,
            ).included
            for k in range(3)
        ]
    )
    assert abs(inc.mean() - 0.5) < 0.06  # 600 coins: sd 0.02


def test_input_mislabeled_canaries(target):
    s = heads_one_run(
        target,
        canaries=20,
        noise=NoiseSource("reproducible", seed=3),
        seed=0,
        kind="input-mislabeled",
        noise_on=False,
    )
    assert s.kind == "input-mislabeled" and s.m == 20 and np.all(np.isfinite(s.scores))
    assert all(a != b for a, b in zip(s.info["labels"], s.info["true_labels"]))
    assert len(set(s.info["test_indices"])) == 20


def test_one_run_validation(target):
    with pytest.raises(UsageError, match="canaries must be an integer >= 2, got 1"):
        heads_one_run(target, canaries=1, noise=NoiseSource("reproducible", seed=0), seed=0)
    with pytest.raises(
        UsageError, match="kind must be one of gradient, input-mislabeled, got 'user'"
    ):
        heads_one_run(
            target, canaries=4, noise=NoiseSource("reproducible", seed=0), seed=0, kind="user"
        )
    with pytest.raises(UsageError, match=r"canaries must be at most \d+ \(held-out test records\)"):
        heads_one_run(
            target,
            canaries=100000,
            noise=NoiseSource("reproducible", seed=0),
            seed=0,
            kind="input-mislabeled",
        )
    with pytest.raises(UsageError, match="target must be a HeadTarget"):
        heads_one_run(object(), canaries=4, noise=NoiseSource("reproducible", seed=0), seed=0)
