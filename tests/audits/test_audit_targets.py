"""Mechanism targets on small, fast configurations: soundness at eps in {1, 2}, controls' power."""

from __future__ import annotations

import numpy as np
import pytest

from dpaudit.audits.build import build_target, target_from_release
from dpaudit.audits.elm import ElmTarget, worst_case_input
from dpaudit.audits.engine import run_audit
from dpaudit.audits.heads import HeadTarget
from dpaudit.audits.mixmin import MixMinTarget, mixmin_config_for
from dpaudit.errors import UsageError

DELTA = 1e-5


def _synthetic_mix(n=400, k=4, seed=0):
    rng = np.random.default_rng(seed)
    probs = rng.uniform(0.02, 0.98, size=(n + 20, k))
    labels = (rng.uniform(size=n + 20) < probs[:, 0]).astype(float)
    return probs[:n], labels[:n], probs[n:], labels[n:]


@pytest.mark.parametrize("eps", [1.0, 2.0])
@pytest.mark.parametrize("canary", ["max-clip", "natural", "mislabeled"])
def test_mixmin_sound_at_eps(eps, canary):
    p, y, hp, hy = _synthetic_mix()
    cfg, claimed = mixmin_config_for(n_mix=len(y), k=4, epsilon=eps, delta=DELTA, expected_batch_size=100, steps=30)
    assert claimed <= eps
    for seed in (0, 1):
        t = MixMinTarget(p, y, cfg, claimed, DELTA, canary=canary, holdout_probs=hp, holdout_labels=hy, seed=seed)
        r = run_audit(t, runs=500, seed=seed, controls=(), reproducible_noise=True)
        assert r.epsilon_lower_bound <= claimed, (canary, eps, seed)


def test_mixmin_no_noise_full_batch_reaches_ceiling_and_null_none():
    p, y, hp, hy = _synthetic_mix(n=200)
    cfg, claimed = mixmin_config_for(n_mix=len(y), k=4, epsilon=1.0, delta=DELTA, expected_batch_size=200, steps=20)
    t = MixMinTarget(p, y, cfg, claimed, DELTA, canary="max-clip")
    r = run_audit(t, runs=400, seed=0, reproducible_noise=True)
    nn = r.controls["no-noise"]
    assert nn.epsilon_lower_bound == pytest.approx(nn.ceiling)  # q = 1, no noise: deterministic worlds
    assert r.controls["null"].epsilon_lower_bound < 0.5
    assert r.canary_info["top_sources"] and len(r.canary_info["direction"]) == 4
    assert abs(sum(r.canary_info["direction"])) < 1e-12  # zero-sum: all of C moves the weights


def test_mixmin_mislabeled_flips_the_label():
    p, y, hp, hy = _synthetic_mix()
    cfg, claimed = mixmin_config_for(n_mix=len(y), k=4, epsilon=1.0, delta=DELTA, expected_batch_size=100, steps=30)
    t = MixMinTarget(p, y, cfg, claimed, DELTA, canary="mislabeled", holdout_probs=hp, holdout_labels=hy)
    i = t.describe()["canary_info"]["holdout_index"]
    assert t.describe()["canary_info"]["label"] == 1.0 - hy[i]
    with pytest.raises(UsageError):
        MixMinTarget(p, y, cfg, claimed, DELTA, canary="natural")


@pytest.mark.parametrize("eps", [1.0, 2.0])
@pytest.mark.parametrize("canary", ["max-clip", "mislabeled", "natural"])
def test_dp_rvfl_heads_sound_at_eps(eps, canary):
    for seed in (0, 1):
        t = HeadTarget(model="dp-rvfl", dataset="digits", epsilon=eps, canary=canary, epochs=2, max_train=300, seed=seed)
        r = run_audit(t, runs=300, seed=seed, controls=(), reproducible_noise=True)
        assert r.claimed_epsilon <= eps
        assert r.epsilon_lower_bound <= r.claimed_epsilon, (eps, canary, seed)


def test_dp_rvfl_gradient_canary_on_dead_pixel_no_noise_power():
    t = HeadTarget(model="dp-rvfl", dataset="digits", epsilon=2.0, canary="max-clip", epochs=2, max_train=300)
    r = run_audit(t, runs=400, seed=0, controls=("no-noise",), reproducible_noise=True)
    info = r.canary_info
    assert "zero in every training record" in info["why"]
    nn = r.controls["no-noise"]
    # A count statistic: one false positive among the 100 EVAL out-runs (the 1e-12 noise still
    # moves the dead weight through Adam's normalisation) takes it from 0.97 to 0.84 of the
    # ceiling, and which stream of N(0, 1) draws the seed gives decides it (seeds 1-6: 0.94-0.97).
    assert nn.epsilon_lower_bound >= 0.8 * nn.ceiling
    assert nn.config["noise_multiplier_used"] < 1e-9 and nn.config["clipping_norm"] == 1.0


@pytest.mark.parametrize("model", ["logistic-raw", "dp-elm-sgd"])
def test_other_frozen_feature_models(model):
    t = HeadTarget(model=model, dataset="digits", epsilon=1.0, canary="max-clip", epochs=2, max_train=300, seed=3)
    r = run_audit(t, runs=100, seed=0, controls=(), reproducible_noise=True, chunk_size=50)
    assert r.mechanism == model and r.epsilon_lower_bound <= r.claimed_epsilon
    # ELM-SGD has no direct link: no feature is always zero, so the canary says it fell back
    assert ("fallback" in r.canary_info["why"]) == (model == "dp-elm-sgd")


def test_worst_case_input_maximises_every_feature():
    rng = np.random.default_rng(0)
    w, b = rng.standard_normal((16, 5)), rng.standard_normal(5)
    x = worst_case_input(w, b, 0.0, 1.0)
    assert np.all((x >= 0) & (x <= 1))
    best = (x @ w + b).min()
    for _ in range(200):  # no random point of the box does better on the weakest unit
        assert (rng.uniform(size=16) @ w + b).min() <= best + 1e-9


@pytest.mark.parametrize("eps", [1.0, 2.0])
@pytest.mark.parametrize("canary", ["worst-case", "mislabeled", "natural"])
def test_dp_elm_sound_and_controls(eps, canary):
    for seed in (0, 1):
        t = ElmTarget(dataset="digits", width=3, epsilon=eps, canary=canary, seed=seed)
        r = run_audit(t, runs=300, seed=seed, reproducible_noise=True, controls=("no-noise",))
        assert r.delta == 0.0 and r.claimed_epsilon == eps
        assert r.epsilon_lower_bound <= eps
        assert r.controls["no-noise"].epsilon_lower_bound == pytest.approx(r.controls["no-noise"].ceiling)
        assert r.gdp_estimate["delta"] == 1e-5  # stated at a fallback delta for a pure claim


def test_dp_elm_replace_one_adjacency():
    t = ElmTarget(dataset="digits", width=3, epsilon=1.0, canary="natural", adjacency="replace-record")
    r = run_audit(t, runs=200, seed=0, reproducible_noise=True, controls=())
    assert r.adjacency == "replace-record" and "replaced_test_index" in r.canary_info
    assert r.epsilon_lower_bound <= 1.0


def test_target_from_elm_release(tmp_path):
    from dpaudit.mechanisms.dp_elm import train_and_release_dp_elm

    rel = train_and_release_dp_elm(dataset="digits", width=3, epsilon=1.5, seed=7, out_dir=tmp_path, record=False)
    t = target_from_release(tmp_path)
    assert isinstance(t, ElmTarget) and t.width == 3 and t.epsilon == rel.epsilon and t.seed == 7
    r = run_audit(t, runs=100, seed=0, controls=(), reproducible_noise=True)
    assert r.claimed_epsilon == pytest.approx(1.5)


def test_target_from_rvfl_release(tmp_path):
    from dpaudit.mechanisms.rvfl import train_and_release

    rel = train_and_release("dp-rvfl", dataset="digits", epsilon=2.0, seed=5, out_dir=tmp_path, record=False, progress=False, epochs=1)
    t = target_from_release(tmp_path, canary="mislabeled")
    assert isinstance(t, HeadTarget)
    assert t.claimed_epsilon == pytest.approx(rel.epsilon)
    assert t._config.noise_multiplier == pytest.approx(rel.noise_multiplier) and t._config.steps == rel.steps


def test_build_target_refuses_mismatched_options():
    with pytest.raises(UsageError):
        build_target("gaussian", canary="worst-case")
    with pytest.raises(UsageError):
        build_target("dp-rvfl", task="digits-mix")
    with pytest.raises(UsageError):
        build_target("dp-elm", broken_noise_factor=4.0)


def test_target_from_mixmin_release(tmp_path):
    from dpaudit.mechanisms.mixmin_pipeline import train_and_release_mixmin

    rel = train_and_release_mixmin(task="digits-mix", epsilon=1.0, seed=42, out_dir=tmp_path, record=False)
    t = target_from_release(tmp_path, mechanism="mixmin")
    assert isinstance(t, MixMinTarget) and t.claimed_epsilon == pytest.approx(rel.epsilon)
    assert t.config.noise_multiplier == pytest.approx(rel.noise_multiplier) and t.config.steps == rel.steps
    assert t.task.startswith("digits-mix/")
    with pytest.raises(UsageError, match="must match"):
        target_from_release(tmp_path, mechanism="dp-elm")
