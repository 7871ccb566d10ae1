"""One-run audits of the trainable DP-SGD modules (dp-dense / dp-cnn / dp-attention) and the
loop's canary interface."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from dpaudit.audits.one_run import OneRunScores, one_run_bounds
from dpaudit.mechanisms.dpsgd.one_run_modules import (
    CANARY_TENSORS,
    DiracCanaries,
    choose_coordinates,
    modules_one_run,
)
from dpaudit.data import load_dataset
from dpaudit.errors import UsageError
from dpaudit.mechanisms.dpsgd.module_training import DPSGDConfig, train_module_dp_sgd
from dpaudit.mechanisms.dpsgd.models import build_module
from dpaudit.noise import NoiseSource


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits")


def _config(steps=30, sigma=1.0):
    return DPSGDConfig(sample_rate=0.1, steps=steps, normalizer=64, noise_multiplier=sigma)


def test_no_noise_control_separates_dense_canaries_perfectly(digits):
    # Quiet coordinates (fc1 weights on always-zero pixels) get no data gradient and ~no noise, so
    # an excluded canary's coordinate does not move at all and an included, sampled one moves down.
    cfg = DPSGDConfig(sample_rate=0.3, steps=40, normalizer=64, noise_multiplier=1.0)
    r = modules_one_run(
        "dp-dense",
        digits,
        cfg,
        canaries=200,
        noise=NoiseSource("reproducible", seed=3),
        seed=0,
        noise_on=False,
    )
    assert isinstance(r, OneRunScores) and r.kind == "gradient" and r.m == 200
    assert r.info["quiet_coordinates"] == 3 * 256 and all(
        n == "fc1.weight" for n, _ in r.info["coordinates"]
    )
    assert np.all(
        np.abs(r.scores[~r.included]) < 1e-7
    )  # float32 rounding of the 1e-12 noise under Adam
    assert np.all(
        r.scores[r.included] > 1e-4
    )  # 40 steps at q = 0.3: P(never sampled) = 0.7^40 < 1e-6
    b = one_run_bounds(r, delta=1e-5)
    assert b["steinke"]["epsilon_lower_bound"] >= 0.8 * b["steinke"]["ceiling"] > 0


def test_coins_are_private_and_coordinates_public(digits):
    cfg = _config(steps=2)
    a = modules_one_run(
        "dp-dense", digits, cfg, canaries=64, noise=NoiseSource("reproducible", seed=1), seed=5
    )
    b = modules_one_run(
        "dp-dense", digits, cfg, canaries=64, noise=NoiseSource("reproducible", seed=2), seed=5
    )
    assert a.info["coordinates"] == b.info["coordinates"]  # public seed only
    assert not np.array_equal(a.included, b.included)  # coins from the private source
    c = modules_one_run(
        "dp-dense", digits, cfg, canaries=64, noise=NoiseSource("reproducible", seed=1), seed=5
    )
    assert np.array_equal(a.included, c.included) and np.array_equal(a.scores, c.scores)


def test_choose_coordinates_prefers_quiet_then_uniform():
    shapes = {"w": (4, 5), "v": (3,)}
    g = choose_coordinates(shapes, ("w", "v"), 6, seed=0, quiet=np.array([0, 1, 2, 21]))
    flat = [i if n == "w" else 20 + i for n, i in g.coords]
    assert len(set(flat)) == 6 and {0, 1, 2, 21}.issubset(flat) and all(0 <= f < 23 for f in flat)
    only_quiet = choose_coordinates(shapes, ("w", "v"), 2, seed=0, quiet=np.array([0, 1, 2, 21]))
    assert {i if n == "w" else 20 + i for n, i in only_quiet.coords} <= {0, 1, 2, 21}
    with pytest.raises(UsageError, match="canaries must be an integer in \\[2, 23\\]"):
        choose_coordinates(shapes, ("w", "v"), 24, seed=0)


class _Noop:
    """A canary of the loop's interface that draws nothing private and adds nothing."""

    rows = False

    def __init__(self):
        self.seen = []

    def draw(self):
        return np.zeros(0, dtype=bool)

    def add(self, hit, sums):
        self.seen.append(len(sums))


def test_a_canary_that_adds_nothing_leaves_the_run_unchanged(digits):
    # A canary is called once per step with every parameter's clipped sum, before the noise; one that
    # adds nothing (and draws nothing from the run's noise) reproduces the plain run bit for bit.
    x, y = digits.x_train[:200], digits.y_train[:200]
    cfg = DPSGDConfig(sample_rate=0.2, steps=5, normalizer=40, noise_multiplier=0.7)

    def run(**kw):
        m = build_module(
            "dense", kind="image", n_features=64, n_classes=10, image_shape=(1, 8, 8), seed=0
        )
        train_module_dp_sgd(m, x, y, cfg, noise=NoiseSource("reproducible", seed=9), **kw)
        return {n: p.detach().clone() for n, p in m.named_parameters()}

    noop = _Noop()
    plain, none, with_noop = run(), run(canary=None), run(canary=noop)
    assert noop.seen == [6] * 5
    assert all(
        torch.equal(plain[n], none[n]) and torch.equal(plain[n], with_noop[n]) for n in plain
    )


def test_dirac_canaries_add_c_at_their_coordinates_when_sampled():
    g = choose_coordinates({"w": (3, 4), "v": (5,)}, ("w", "v"), 4, seed=1)
    included = np.array([True, True, False, True])
    cfg = DPSGDConfig(
        sample_rate=1.0, steps=1, normalizer=1, noise_multiplier=1.0, clipping_norm=0.5
    )
    canaries = DiracCanaries(g, ["w", "v"], included, cfg, np.random.default_rng(0))
    hit = canaries.draw()
    assert np.array_equal(hit, included)  # q = 1: every included canary is sampled
    sums = [torch.zeros(3, 4), torch.zeros(5)]
    canaries.add(hit, sums)
    want = {("w", i): 0.0 for i in range(12)} | {("v", i): 0.0 for i in range(5)}
    for j, coord in enumerate(g.coords):
        want[coord] += 0.5 * included[j]
    assert [float(sums[0].view(-1)[i]) for i in range(12)] == [want["w", i] for i in range(12)]
    assert [float(sums[1][i]) for i in range(5)] == [want["v", i] for i in range(5)]


@pytest.mark.parametrize("model", ["dp-cnn", "dp-attention"])
def test_cnn_and_attention_canaries_sit_in_their_tensors(digits, model):
    r = modules_one_run(
        model,
        digits,
        _config(steps=2),
        canaries=40,
        noise=NoiseSource("reproducible", seed=0),
        seed=0,
    )
    name = model.removeprefix("dp-")
    assert {n for n, _ in r.info["coordinates"]} <= set(CANARY_TENSORS[name])
    assert (
        r.scores.shape == (40,) and np.all(np.isfinite(r.scores)) and r.info["steps_executed"] == 2
    )


def test_input_mislabeled_canaries_are_appended_when_included(digits):
    r = modules_one_run(
        "dp-dense",
        digits,
        _config(steps=3),
        canaries=30,
        noise=NoiseSource("reproducible", seed=0),
        seed=0,
        kind="input-mislabeled",
    )
    assert r.kind == "input-mislabeled" and r.info["n_units"] == digits.y_train.size + int(
        r.included.sum()
    )
    pool_y = np.concatenate([digits.y_test, digits.y_val])
    assert np.all(
        np.array(r.info["labels"]) != pool_y[r.info["rows"]]
    )  # every canary label is wrong


def test_bad_arguments_are_refused(digits):
    cfg = _config(steps=1)
    noise = NoiseSource("reproducible", seed=0)
    with pytest.raises(
        UsageError,
        match="model must be one of dp-dense, dp-cnn, dp-attention, dp-gru, got 'dp-rvfl'",
    ):
        modules_one_run("dp-rvfl", digits, cfg, canaries=4, noise=noise, seed=0)
    with pytest.raises(UsageError, match="kind must be one of gradient, input-mislabeled"):
        modules_one_run("dp-dense", digits, cfg, canaries=4, noise=noise, seed=0, kind="user")
    with pytest.raises(UsageError, match="canaries must be at most"):
        modules_one_run(
            "dp-dense", digits, cfg, canaries=10_000, noise=noise, seed=0, kind="input-mislabeled"
        )
    with pytest.raises(UsageError, match="config must be private"):
        modules_one_run(
            "dp-dense",
            digits,
            dataclasses.replace(cfg, non_private=True, noise_multiplier=0.0),
            canaries=4,
            noise=noise,
            seed=0,
        )
