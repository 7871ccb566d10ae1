"""The audit engine on the exact-epsilon Gaussian mechanism and on bring-your-own callables."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from dpaudit.audits import stats
from dpaudit.audits.engine import (
    AUDIT_FILE,
    SCORES_FILE,
    SELECT_FRACTION,
    AuditResult,
    audit_callable,
    audit_scores,
    plan_trials,
    read_audit,
    run_audit,
    violated,
)
from dpaudit.audits.gaussian import GaussianTarget, calibrate_exact, exact_epsilon
from dpaudit.errors import UsageError

DELTA = 1e-5


def test_exact_epsilon_round_trip_and_reference_value():
    for eps in (0.5, 1.0, 2.0, 4.0):
        sigma = calibrate_exact(eps, DELTA)
        assert exact_epsilon(sigma, DELTA) <= eps
        assert exact_epsilon(sigma, DELTA) == pytest.approx(eps, rel=1e-9)
    # Balle & Wang 2018: sigma ~ 3.73 for (1, 1e-5) with unit sensitivity (classic bound gives 4.84)
    assert calibrate_exact(1.0, DELTA) == pytest.approx(3.7305, abs=2e-3)


def test_plan_is_balanced_stratified_and_seeded():
    p = plan_trials(1001, seed=3)
    assert p.world.sum() == 500
    for w in (True, False):
        sel = p.select[p.world == w]
        assert abs(sel.sum() - sel.size * SELECT_FRACTION) <= 1
        half = plan_trials(1001, seed=3, select_fraction=0.5).select[p.world == w]
        assert abs(half.sum() - half.size / 2) <= 1
    q = plan_trials(1001, seed=3)
    assert np.array_equal(p.world, q.world) and np.array_equal(p.select, q.select)
    assert not np.array_equal(p.world, plan_trials(1001, seed=4).world)


@pytest.mark.parametrize("sigma", [0.7, 1.5, 4.0])
def test_soundness_gaussian_several_sigmas_and_seeds(sigma):
    exact = exact_epsilon(sigma, DELTA)
    for seed in range(3):
        t = GaussianTarget(noise_multiplier=sigma, delta=DELTA, seed=seed)
        r = run_audit(t, runs=1000, seed=seed, controls=(), reproducible_noise=True)
        assert r.epsilon_lower_bound <= exact
        assert r.claimed_epsilon == pytest.approx(exact)


def test_controls_no_noise_finds_leakage_and_null_finds_none():
    r = run_audit(
        GaussianTarget.for_epsilon(epsilon=1.0), runs=1000, seed=1, reproducible_noise=True
    )
    nn, null = r.controls["no-noise"], r.controls["null"]
    # the Clopper–Pearson test and eps_LB (a bound for any mechanism) reach their ceilings; the
    # claim's Gaussian family result (which decides) goes beyond them, far above the claim
    assert nn.clopper_pearson_epsilon == pytest.approx(nn.ceiling) and nn.ceiling > 4
    assert nn.epsilon_lower_bound == pytest.approx(nn.general_bound["ceiling"])
    assert nn.statistic == "claimed-curve" and nn.claim_family_bound["family_epsilon"] > nn.ceiling
    assert not nn.noise and nn.canary_inserted
    assert null.epsilon_lower_bound < 0.5 and not null.canary_inserted
    assert null.gdp_estimate["mu_interval"][0] == 0.0  # the null estimate is not significant


@pytest.mark.parametrize("eps", [1.0, 2.0])
def test_broken_mechanism_is_caught(eps):
    """Noise divided by 4, claim unchanged: the audit must certify epsilon above the claim."""
    t = GaussianTarget.for_epsilon(epsilon=eps, broken_noise_factor=4.0)
    r = run_audit(t, runs=10_000, seed=0, controls=(), reproducible_noise=True)
    assert r.claimed_epsilon == pytest.approx(eps)
    assert r.epsilon_lower_bound > r.claimed_epsilon
    assert r.violated and violated(r.to_dict())


@pytest.mark.parametrize("eps", [1.0, 2.0, 4.0])
def test_gdp_estimate_calibration_within_30_percent(eps):
    r = run_audit(
        GaussianTarget.for_epsilon(epsilon=eps),
        runs=2000,
        seed=5,
        controls=(),
        reproducible_noise=True,
    )
    g = r.gdp_estimate
    assert abs(g["epsilon"] - eps) <= 0.3 * eps, g
    assert r.epsilon_lower_bound <= eps  # the CP bound, reported beside it, stays sound


def test_audit_json_schema_scores_and_round_trip(tmp_path):
    r = run_audit(
        GaussianTarget.for_epsilon(epsilon=1.0),
        runs=200,
        seed=2,
        out_dir=tmp_path,
        reproducible_noise=True,
    )
    d = json.loads((tmp_path / AUDIT_FILE).read_text())
    for key in (
        "mechanism",
        "canary",
        "runs",
        "claimed_epsilon",
        "delta",
        "epsilon_lower_bound",
        "confidence",
        "method",
        "counts",
        "ceiling",
        "gdp_estimate",
        "controls",
        "roc",
        "auc",
        "seeds",
        "task",
        "dataset",
        "select_size",
        "eval_size",
        "dpaudit_version",
    ):
        assert key in d, key
    # score-unit values and the reproducible noise seed are local (audit_local.json only)
    assert (
        "threshold" not in d
        and "threshold" not in d["controls"]["null"]
        and "seed" not in d["seeds"]["noise"]
    )
    local = json.loads((tmp_path / "audit_local.json").read_text())
    assert (
        local["audit_id"] == d["id"]
        and local["threshold"] == r.threshold
        and local["seeds"]["noise"]["seed"] == 2
    )
    assert "violated" not in d and "violated" not in d["controls"]["null"]
    assert set(d["counts"]) == {"tp", "fp", "tn", "fn"}
    assert d["select_size"] + d["eval_size"] == 200 and sum(d["counts"].values()) == d["eval_size"]
    assert set(d["controls"]) == {"no-noise", "null"} and "controls" not in d["controls"]["null"]
    z = np.load(tmp_path / SCORES_FILE)
    assert (
        z["main_score"].shape == (200,)
        and z["null_inserted"].sum() == 0
        and z["main_world"].sum() == 100
    )
    again = read_audit(tmp_path)
    assert again.epsilon_lower_bound == r.epsilon_lower_bound and again.controls["null"].runs == 200
    assert (
        again.threshold == r.threshold
        and again.controls["null"].threshold == r.controls["null"].threshold
    )
    assert read_audit(tmp_path, local=False).threshold is None
    assert not (tmp_path / ".checkpoint").exists()


class _Interrupt(Exception):
    pass


class _FlakyGaussian(GaussianTarget):
    """Raises after a number of batched calls (a crash in the middle of an audit)."""

    def __init__(self, *a, fail_after=None, **kw):
        super().__init__(*a, **kw)
        self.calls = 0
        self.fail_after = fail_after

    def scores(self, canary_in, noise):
        self.calls += 1
        if self.fail_after is not None and self.calls > self.fail_after:
            raise _Interrupt()
        return super().scores(canary_in, noise)


def test_interrupted_audit_resumes_and_matches_uninterrupted(tmp_path):
    sigma = calibrate_exact(1.0, DELTA)
    kw = dict(runs=400, seed=9, chunk_size=50, controls=(), reproducible_noise=True)
    full = run_audit(GaussianTarget(noise_multiplier=sigma), **kw)
    t = _FlakyGaussian(noise_multiplier=sigma, fail_after=3)
    with pytest.raises(_Interrupt):
        run_audit(t, out_dir=tmp_path, **kw)
    assert len(list((tmp_path / ".checkpoint" / "main").glob("chunk_*.npy"))) == 3
    t2 = _FlakyGaussian(noise_multiplier=sigma)
    resumed = run_audit(t2, out_dir=tmp_path, **kw)
    assert t2.calls == 8 - 3  # only the missing chunks ran
    assert np.array_equal(np.load(tmp_path / SCORES_FILE)["main_score"].shape, (400,))
    assert resumed.epsilon_lower_bound == full.epsilon_lower_bound and resumed.counts == full.counts


class _PrivateFlakyGaussian(_FlakyGaussian):
    """Trials charged to a private dataset, so the audit is a ledger entry."""

    def private_data(self):
        return {"dataset": "digits", "partition": "train"}


def test_resumed_audit_reuses_its_ledger_entry(tmp_path):
    from dpaudit.ledger.book import open_ledger

    led_path, out = tmp_path / "ledger.sqlite", tmp_path / "audit"
    kw = dict(runs=40, seed=9, chunk_size=10, controls=(), ledger_path=led_path, out_dir=out)
    sigma = calibrate_exact(1.0, DELTA)
    with pytest.raises(_Interrupt):
        run_audit(_PrivateFlakyGaussian(noise_multiplier=sigma, fail_after=2), **kw)
    resumed = run_audit(_PrivateFlakyGaussian(noise_multiplier=sigma), **kw)
    with open_ledger(led_path) as led:
        (entry,) = led.entries(kind="audit")
    assert entry.id == resumed.id and entry.payload["trials"] == 40


def test_checkpoint_of_another_configuration_is_not_reused(tmp_path):
    sigma = calibrate_exact(1.0, DELTA)
    t = _FlakyGaussian(noise_multiplier=sigma, fail_after=2)
    with pytest.raises(_Interrupt):
        run_audit(
            t,
            runs=400,
            seed=9,
            chunk_size=50,
            controls=(),
            out_dir=tmp_path,
            reproducible_noise=True,
        )
    t2 = _FlakyGaussian(noise_multiplier=2 * sigma)
    run_audit(
        t2, runs=400, seed=9, chunk_size=50, controls=(), out_dir=tmp_path, reproducible_noise=True
    )
    assert t2.calls == 8


def test_two_workers_give_the_same_trials_as_one():
    t = GaussianTarget.for_epsilon(epsilon=1.0)
    a = run_audit(
        t, runs=600, seed=4, chunk_size=100, controls=("null",), reproducible_noise=True, workers=1
    )
    b = run_audit(
        t, runs=600, seed=4, chunk_size=100, controls=("null",), reproducible_noise=True, workers=2
    )
    assert a.counts == b.counts and a.threshold == b.threshold
    assert a.controls["null"].counts == b.controls["null"].counts


def test_fresh_noise_without_reproducible_flag():
    t = GaussianTarget.for_epsilon(epsilon=1.0)
    a = run_audit(t, runs=200, seed=4, controls=())
    b = run_audit(t, runs=200, seed=4, controls=())
    assert a.threshold != b.threshold
    assert a.seeds["noise"]["secret"] and a.seeds["noise"]["seed"] is None


# ---------------------------------------------------------------------- bring your own mechanism

EPS_RR = 1.0


def _randomized_response(include_canary: bool, rng: np.random.Generator) -> int:
    """One bit, kept with probability e^eps / (1 + e^eps): exactly eps-DP (delta = 0)."""
    keep = rng.random() < math.exp(EPS_RR) / (1 + math.exp(EPS_RR))
    bit = int(include_canary)
    return bit if keep else 1 - bit


def _no_noise(include_canary: bool, rng: np.random.Generator) -> int:
    return int(include_canary)


def _identity(release) -> float:
    return float(release)


def test_audit_callable_sound_and_controls():
    r = audit_callable(
        _randomized_response,
        _identity,
        2000,
        claimed_epsilon=EPS_RR,
        delta=0.0,
        noiseless_mechanism=_no_noise,
        seed=3,
        reproducible_noise=True,
    )
    assert r.epsilon_lower_bound <= EPS_RR
    assert r.epsilon_lower_bound > 0.5  # randomized response is tight: a good audit gets close
    nn = r.controls["no-noise"]  # a perfect test: each bound at its own ceiling
    assert nn.clopper_pearson_epsilon == pytest.approx(nn.ceiling)
    assert nn.epsilon_lower_bound == pytest.approx(nn.general_bound["ceiling"])
    assert (
        r.controls["null"].epsilon_lower_bound == 0.0
        or r.controls["null"].epsilon_lower_bound < 0.3
    )
    assert r.mechanism == "custom" and r.config["callable"] == "_randomized_response"


def test_audit_callable_with_two_workers():
    r = audit_callable(
        _randomized_response,
        _identity,
        400,
        claimed_epsilon=EPS_RR,
        delta=0.0,
        workers=2,
        seed=1,
        reproducible_noise=True,
    )
    s = audit_callable(
        _randomized_response,
        _identity,
        400,
        claimed_epsilon=EPS_RR,
        delta=0.0,
        workers=1,
        seed=1,
        reproducible_noise=True,
    )
    assert r.counts == s.counts


def test_audit_scores_and_validation():
    rng = np.random.default_rng(0)
    r = audit_scores(rng.normal(3, 1, 500), rng.normal(0, 1, 500), delta=1e-5, claimed_epsilon=1.0)
    assert r.epsilon_lower_bound > 1.0 and r.violated
    assert isinstance(AuditResult.from_dict(r.to_dict()), AuditResult)
    with pytest.raises(UsageError):
        run_audit(GaussianTarget.for_epsilon(epsilon=1.0), runs=3)
    with pytest.raises(UsageError):
        run_audit(GaussianTarget.for_epsilon(epsilon=1.0), runs=100, controls=("bogus",))
    assert stats.ceiling(50, 50, delta=1e-5) < 3


def test_external_executor_gives_the_same_trials():
    executors = pytest.importorskip("dpaudit.sweeps.executors")
    t = GaussianTarget.for_epsilon(epsilon=1.0)
    a = run_audit(t, runs=600, seed=4, chunk_size=100, controls=("null",), reproducible_noise=True)
    for n in (1, 2):
        with executors.LocalExecutor(n) as ex:
            b = run_audit(
                t,
                runs=600,
                seed=4,
                chunk_size=100,
                controls=("null",),
                reproducible_noise=True,
                executor=ex,
            )
        assert a.counts == b.counts and a.threshold == b.threshold
        assert a.controls["null"].counts == b.controls["null"].counts
