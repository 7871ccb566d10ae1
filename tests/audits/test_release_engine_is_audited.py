"""Releases and audits train with one engine, so a bug planted in the release path reaches the audit.

Before the engine (issue 14) the release trained its head with its own loop and the audits with
another, so a fault in the released mechanism could not move an audit's eps_LB. Here a known fault
("skip-clip": the last unit of every sampled batch keeps its full gradient, an off-by-one in the
clipping loop) is planted through the engine's test-only hook and must (a) change what the
release trainers output and (b) be seen by an audit of that mechanism.
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch

from dpaudit.audits.engine import run_audit
from dpaudit.audits.heads import HeadTarget
from dpaudit.errors import UsageError
from dpaudit.mechanisms import dpsgd, engine
from dpaudit.mechanisms.dpsgd import DPSGDConfig, train_linear_head
from dpaudit.mechanisms.user_level import train_user_linear_head
from dpaudit.noise import NoiseSource


def _digits_release_inputs():
    """The public set-up of a dp-rvfl release on digits (features, labels, head init, schedule)."""
    t = HeadTarget(model="dp-rvfl", dataset="digits", canary="max-clip", epochs=1)
    t.prepare()
    cfg = DPSGDConfig(sample_rate=t._config.sample_rate, steps=40, normalizer=t._config.normalizer,
                      noise_multiplier=t._config.noise_multiplier)
    return t._z, t._y, t._n_classes, cfg, t._init


def test_planted_bug_is_off_by_default_and_scoped():
    assert dpsgd._PLANTED_BUG is None
    with engine.planted_bug("skip-clip"):
        assert dpsgd._PLANTED_BUG == "skip-clip"
    assert dpsgd._PLANTED_BUG is None
    with pytest.raises(UsageError, match="planted bug must be one of skip-clip, half-noise, got 'typo'"):
        with engine.planted_bug("typo"):
            pass


def test_releases_and_audits_all_run_the_engine(monkeypatch):
    """Every head trainer, release or audit, record or user level, is one call of engine.train_heads."""
    from dpaudit.audits.user_level import UserCanary, train_user_heads_batched

    calls = []
    real = engine.train_heads

    def spy(*a, **kw):
        calls.append((kw.get("runs"), kw.get("users") is not None, kw.get("canary") is not None))
        return real(*a, **kw)

    monkeypatch.setattr(engine, "train_heads", spy)
    z, y, k, cfg, init = _digits_release_inputs()
    cfg = DPSGDConfig(sample_rate=cfg.sample_rate, steps=3, normalizer=cfg.normalizer, noise_multiplier=1.0)
    train_linear_head(z, y, k, cfg, noise=NoiseSource("reproducible", seed=0), init=init)
    train_user_linear_head(z, y, np.arange(len(y)) // 3, k, cfg, records_per_user=3, noise=NoiseSource("reproducible", seed=0), init=init)
    worlds = np.array([True, False, True])
    HeadTarget(model="dp-rvfl", dataset="digits", canary="max-clip", epochs=1).scores(worlds, NoiseSource("reproducible", seed=0))
    canary_user = UserCanary(kind="records", z=z[:2], y=np.array([1, 1]))
    train_user_heads_batched(z, y, np.arange(len(y)) // 2, k, cfg, records_per_user=2, noise=NoiseSource("reproducible", seed=0), runs=3,
                             canary=canary_user, canary_in=worlds, init=init)  # what UserHeadTarget.scores runs
    assert calls == [(1, False, False), (1, True, False), (3, False, True), (3, True, True)]


def test_planted_bug_changes_the_release():
    z, y, k, cfg, init = _digits_release_inputs()
    ids = np.arange(len(y)) // 4  # users of four records

    def release():
        rec = train_linear_head(z, y, k, cfg, noise=NoiseSource("reproducible", seed=3), init=init).weight
        usr = train_user_linear_head(z, y, ids, k, cfg, records_per_user=4, noise=NoiseSource("reproducible", seed=3), init=init).weight
        return rec, usr

    clean = release()
    assert all(np.array_equal(a, b) for a, b in zip(clean, release()))  # reproducible: only the plant differs
    with engine.planted_bug("skip-clip"):
        buggy = release()
    for a, b in zip(clean, buggy):
        # digits features have norm ~12 >> C = 1: an unclipped unit moves the head far more
        assert not np.allclose(a, b, rtol=0, atol=1e-3)


def test_audit_of_the_release_mechanism_sees_the_planted_bug():
    """The no-noise control of a mislabeled-canary audit of dp-rvfl on digits: with clipping intact
    the canary is lost among the sampled records (eps_LB 0); with the release path's clipping
    broken the audit finds a large eps_LB (measured 0.0 -> 1.95 at 300 trials, seed 0)."""
    def audit(plant: bool) -> float:
        t = HeadTarget(model="dp-rvfl", dataset="digits", canary="mislabeled", epochs=4, noise=False)
        with engine.planted_bug("skip-clip") if plant else contextlib.nullcontext():
            return run_audit(t, runs=300, seed=0, controls=(), reproducible_noise=True).epsilon_lower_bound

    torch.set_num_threads(1)
    clean, buggy = audit(False), audit(True)
    assert clean < 0.5
    assert buggy > 1.0 and buggy > clean + 0.8


def test_half_noise_plant_halves_the_step_noise_and_nothing_else():
    """The "half-noise" plant (used by benchmarks/bench_planted_bugs.py: DP-RVFL with the noise
    multiplier halved must be caught) halves the standard deviation of every DP-SGD step's noise."""
    cfg = DPSGDConfig(sample_rate=0.5, steps=1, normalizer=1, noise_multiplier=2.0, clipping_norm=1.0)
    draws = {}
    for plant in (None, "half-noise"):
        p = torch.zeros(20000, dtype=torch.float32)
        with engine.planted_bug(plant) if plant else contextlib.nullcontext():
            step = dpsgd.NoisyAdamStep([p], cfg, noise=NoiseSource("reproducible", seed=7))
        step.sums[0].zero_()
        a = step._arrays[0]
        for fill in step._fills:
            a += fill()
        draws[plant] = a.copy()
    np.testing.assert_allclose(draws["half-noise"], draws[None] / 2.0, rtol=1e-6)  # same draws, half the scale
    assert abs(float(np.std(draws[None])) - 2.0) < 0.05
