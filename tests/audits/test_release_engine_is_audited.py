"""Releases and audits train with one DP-SGD loop, so a fault planted in it reaches both.

Before the engine the release trained its head with its own loop and the audits with
another, and modules had a loop of their own; a fault in the released mechanism could
not move an audit's eps_LB. Now every release and audit, head or module, record or user level, is
a call of ``engine.run_dp_sgd``. Known faults are planted as test fixtures (``plant_fault`` in
``tests/conftest.py``, monkeypatching a piece of the one loop; the library has no such switch):
"skip-clip" (the last unit of every clipped batch keeps its full gradient, an off-by-one in the
one clipping rule), "half-noise" (every step's noise at half the calibrated standard deviation)
and "double-rate" (the loop's sampler includes units at twice the accounted rate). Each must
change (a) what the release path publishes and (b) the scores of the audits, for record-level
heads, user-level heads and a trainable module.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dpaudit.audits.engine import run_audit
from dpaudit.mechanisms.dpsgd.head_audit import HeadTarget
from dpaudit.mechanisms.dpsgd.one_run_modules import module_config, modules_one_run
from dpaudit.mechanisms.dpsgd.user_head_audit import UserHeadTarget
from dpaudit.mechanisms.dpsgd import module_training as dpsgd, core as dpsgd_core, loop as engine
from dpaudit.noise import NoiseSource
from dpaudit.releasing import release
from dpaudit.requests import DPSGDRequest

FAULTS = ("skip-clip", "half-noise", "double-rate")


def _released_weights(tmp_path, tag: str, **request) -> np.ndarray:
    """The published weights of one reproducible-noise release through ``releasing.release``."""
    out = tmp_path / tag
    release(
        "dp-rvfl",
        DPSGDRequest(model="dp-rvfl", reproducible_noise=True, seed=3, **request),
        out_dir=out,
        record=False,
    )
    with np.load(out / "weights.npz") as z:
        return np.concatenate([np.asarray(z[k], dtype=np.float64).ravel() for k in sorted(z.files)])


def _released_module(tmp_path, tag: str) -> np.ndarray:
    out = tmp_path / tag
    release(
        "dp-dense",
        DPSGDRequest(model="dp-dense", reproducible_noise=True, epochs=1, seed=3),
        out_dir=out,
        record=False,
    )
    sd = torch.load(out / "model.pt", weights_only=True)
    return np.concatenate([v.double().numpy().ravel() for _, v in sorted(sd.items())])


_RELEASES = {
    "record head": lambda tmp, tag: _released_weights(tmp, tag, epochs=2),
    "user head": lambda tmp, tag: _released_weights(
        tmp,
        tag,
        epochs=2,
        privacy_unit="user",
        records_per_user=4,
        reference_size=315,
        user_ids=str(tmp / "ids.npy"),
    ),
    "module": _released_module,
}


@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("kind", sorted(_RELEASES))
def test_a_planted_fault_changes_the_release(tmp_path, plant_fault, kind, fault):
    np.save(tmp_path / "ids.npy", np.arange(1797) // 4)  # users of four records (digits)
    torch.set_num_threads(1)
    make = _RELEASES[kind]
    clean = make(tmp_path, "clean")
    assert np.array_equal(clean, make(tmp_path, "again"))  # reproducible: only the plant differs
    plant_fault(fault)
    faulty = make(tmp_path, "faulty")
    # digits features have norm ~12 >> C = 1: an unclipped unit moves the weights far more; half the noise moves them less
    assert not np.allclose(clean, faulty, rtol=0, atol=1e-4), kind


def _head_scores(kind: str) -> np.ndarray:
    worlds = np.array([True, False] * 4)
    if kind == "record head":
        t = HeadTarget(model="dp-rvfl", dataset="digits", canary="mislabeled", epochs=1)
    else:
        t = UserHeadTarget(
            model="dp-rvfl",
            dataset="digits",
            canary="mislabeled",
            epochs=1,
            records_per_user=4,
            reference_size=315,
        )
    return t.scores(worlds, NoiseSource("reproducible", seed=0))


def _module_scores(kind: str) -> np.ndarray:
    from dpaudit.data import load_dataset

    digits = load_dataset("digits")
    cfg, _ = module_config("dp-dense", digits, epsilon=2.0, delta=1e-5, epochs=1)
    return modules_one_run(
        "dp-dense",
        digits,
        cfg,
        canaries=20,
        noise=NoiseSource("reproducible", seed=1),
        seed=0,
        kind="input-mislabeled",
    ).scores


@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("kind", ["record head", "user head", "module"])
def test_a_planted_fault_changes_the_audit_scores(plant_fault, kind, fault):
    torch.set_num_threads(1)
    scores = _module_scores if kind == "module" else _head_scores
    clean = scores(kind)
    assert np.array_equal(clean, scores(kind))
    plant_fault(fault)
    assert not np.allclose(clean, scores(kind), rtol=0, atol=1e-6), kind


def test_releases_and_audits_all_run_the_one_loop(patch_everywhere, tmp_path):
    """Every release and audit -- heads and modules, record and user level -- is one call of engine.run_dp_sgd."""
    calls = []
    real = engine.run_dp_sgd

    def spy(units, params, config, **kw):
        calls.append((type(units).__name__, kw.get("runs", 1), kw.get("canary") is not None))
        return real(units, params, config, **kw)

    patch_everywhere(engine, "run_dp_sgd", spy)  # the engine's and every caller's reference to it
    assert dpsgd.run_dp_sgd is spy
    np.save(tmp_path / "ids.npy", np.arange(1797) // 4)
    for kind in ("record head", "user head", "module"):
        _RELEASES[kind](tmp_path, kind)
    _head_scores("record head")
    _head_scores("user head")
    _module_scores("module")
    assert calls == [
        ("RecordUnits", 1, False),
        ("UserUnits", 1, False),
        ("SumUnits", 1, False),
        ("RecordUnits", 8, True),
        ("UserUnits", 8, True),
        ("SumUnits", 1, False),
    ]


def test_audit_of_the_release_mechanism_sees_the_planted_fault(plant_fault):
    """The no-noise control of a mislabeled-canary audit of dp-rvfl on digits: with clipping intact
    the canary is lost among the sampled records (eps_LB 0); with the shared clipping rule broken
    the audit finds a large eps_LB (measured 0.0 -> 1.95 at 300 trials, seed 0)."""

    def audit() -> float:
        t = HeadTarget(
            model="dp-rvfl", dataset="digits", canary="mislabeled", epochs=4, noise=False
        )
        return run_audit(
            t, runs=300, seed=0, controls=(), reproducible_noise=True
        ).epsilon_lower_bound

    torch.set_num_threads(1)
    clean = audit()
    plant_fault("skip-clip")
    buggy = audit()
    assert clean < 0.5
    assert buggy > 1.0 and buggy > clean + 0.8


def test_half_noise_plant_halves_the_step_noise_and_nothing_else(plant_fault):
    """The "half-noise" plant (also used by benchmarks/bench_planted_bugs.py: DP-RVFL with the noise
    multiplier halved must be caught) halves the standard deviation of every DP-SGD step's noise."""
    cfg = dpsgd.DPSGDConfig(
        sample_rate=0.5, steps=1, normalizer=1, noise_multiplier=2.0, clipping_norm=1.0
    )

    def draw() -> np.ndarray:
        step = dpsgd_core.NoisyStep(
            [torch.zeros(20000, dtype=torch.float32)],
            cfg,
            noise=NoiseSource("reproducible", seed=7),
        )
        step.sums[0].zero_()
        a = step._arrays[0]
        for fill in step._fills:
            a += fill()
        return a.copy()

    clean = draw()
    plant_fault("half-noise")
    np.testing.assert_allclose(draw(), clean / 2.0, rtol=1e-6)  # same draws, half the scale
    assert abs(float(np.std(clean)) - 2.0) < 0.05
