"""White-box step audit and crafted-final audit (dpaudit.audits.white_box; docs/white_box.md):
exact mechanisms, simulated false-positive rates, broken mechanisms caught (simulated and through
the real DP-SGD loop with planted faults), and the CLI on a tiny configuration."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from typer.testing import CliRunner

from dpaudit.accounting.events import SubsampledGaussian
from dpaudit.audits import white_box as wb
from dpaudit.cli import app
from dpaudit.errors import UsageError

runner = CliRunner()
DELTA = 1e-5
CLAIM = SubsampledGaussian(0.8, 0.05, 200)


# ---------------------------------------------------------------- the statistics on exact mechanisms


def test_exact_mechanism_step_bound_is_below_and_close_to_the_claim():
    obs = wb.simulate_steps(np.random.default_rng(1), noise=0.8, rate=0.05, steps=200, canaries=500)
    b = wb.step_bound(obs, claimed=CLAIM, delta=DELTA)
    limit = wb.expected_step_bound(CLAIM, 500, delta=DELTA)
    assert not b.violation and 0.8 * b.claimed_epsilon <= b.epsilon_lb <= b.claimed_epsilon
    assert limit <= b.claimed_epsilon and b.epsilon_lb == pytest.approx(limit, rel=0.1)


def test_exact_mechanism_bound_by_a_tight_accountant_is_below_the_true_epsilon():
    obs = wb.simulate_steps(np.random.default_rng(6), noise=0.8, rate=0.05, steps=200, canaries=500)
    b = wb.step_bound(obs, claimed=CLAIM, delta=DELTA, accountant="pld")
    assert (
        0.8 * b.claimed_epsilon <= b.epsilon_lb <= b.claimed_epsilon
    )  # pld: the true epsilon, up to its discretisation


def test_exact_mechanism_final_bound_is_below_the_claim():
    obs = wb.simulate_final(
        np.random.default_rng(2), noise=0.8, rate=0.05, steps=200, canaries=4000
    )
    b = wb.final_bound(obs, claimed=CLAIM, delta=DELTA)
    assert not b.violation and 0.6 * b.claimed_epsilon <= b.epsilon_lb <= b.claimed_epsilon


def test_physical_limit_tends_to_the_claim():
    claimed = wb.step_bound(
        wb.simulate_steps(np.random.default_rng(0), noise=0.8, rate=0.05, steps=200, canaries=50),
        claimed=CLAIM,
        delta=DELTA,
    ).claimed_epsilon
    limits = [wb.expected_step_bound(CLAIM, m, delta=DELTA) for m in (100, 1000, 100_000)]
    assert limits == sorted(limits) and claimed * 0.99 < limits[-1] <= claimed


def test_gdp_ratio_of_the_final_sum_is_below_one():
    r = wb.gdp_mu_ratio(SubsampledGaussian(0.56, 0.005, 2000))
    assert 0.3 < r["ratio"] < 0.45 and r["mu_final"] < r["mu_trajectory"]


# ---------------------------------------------------------------- false positives (>= 1,000 replicates)


def test_step_bound_false_positive_rate_at_most_5_percent():
    """Replicates of a correct mechanism: eps_LB can exceed the claim only if s_hi / d_lo < sigma or
    q_lo > q (epsilon is monotone in both), so that event's rate bounds the false-positive rate."""
    rng = np.random.default_rng(11)
    sigma, q = 0.8, 0.1
    flagged = 0
    for _ in range(1000):
        s_hi, d_lo, q_lo = wb.step_statistics(
            wb.simulate_steps(rng, noise=sigma, rate=q, steps=50, canaries=20), 0.95
        )
        flagged += (d_lo <= 0 or s_hi / d_lo < sigma) or q_lo > q
    assert flagged / 1000 <= 0.05, flagged


def test_each_confidence_bound_covers_at_its_level():
    """1,000 replicates: s_hi < s, d_lo > d and q_lo > q each happen at most at rate alpha / 3 (1.7 %; 3 % allowed)."""
    rng = np.random.default_rng(13)
    misses = np.zeros(3)
    for _ in range(1000):
        s_hi, d_lo, q_lo = wb.step_statistics(
            wb.simulate_steps(rng, noise=0.8, rate=0.1, steps=50, canaries=20), 0.95
        )
        misses += (s_hi < 0.8, d_lo > 1.0, q_lo > 0.1)
    assert np.all(misses / 1000 <= 0.03), misses


def test_final_bound_false_positive_rate_at_most_5_percent():
    rng = np.random.default_rng(12)
    sigma, q, steps = (
        0.8,
        0.05,
        50,
    )  # q T = 2.5: a skewed inclusion count, the normal approximation's hard case
    flagged = 0
    for _ in range(1000):
        s_hi, d_lo = wb.final_statistics(
            wb.simulate_final(rng, noise=sigma, rate=q, steps=steps, canaries=200), q, 0.95
        )
        flagged += d_lo > 0 and s_hi / d_lo < sigma
    assert flagged / 1000 <= 0.05, flagged


# ---------------------------------------------------------------- broken mechanisms (simulated)


def test_catches_ten_percent_noise_understatement():
    claim = SubsampledGaussian(0.8, 0.05, 100)
    obs = wb.simulate_steps(
        np.random.default_rng(3), noise=0.72, rate=0.05, steps=100, canaries=2000
    )
    assert wb.step_bound(obs, claimed=claim, delta=DELTA).violation


def test_catches_a_clipping_bug():
    obs = wb.simulate_steps(
        np.random.default_rng(4), noise=0.8, rate=0.05, steps=100, canaries=1000, sensitivity=1.15
    )
    b = wb.step_bound(obs, claimed=SubsampledGaussian(0.8, 0.05, 100), delta=DELTA)
    assert b.violation and b.sensitivity_lower > 1.0


def test_final_bound_catches_half_noise():
    obs = wb.simulate_final(
        np.random.default_rng(5), noise=0.4, rate=0.05, steps=200, canaries=2000
    )
    assert wb.final_bound(obs, claimed=CLAIM, delta=DELTA).violation


def test_bad_observations_are_refused():
    with pytest.raises(UsageError, match="observations must be finite"):
        wb.StepObservations(np.zeros((2, 3)), np.zeros((2, 4), dtype=bool))
    with pytest.raises(UsageError, match="inserted canaries must be at least"):
        wb.FinalObservations(np.zeros(10), np.ones(10, dtype=bool), 5)


# ---------------------------------------------------------------- through the real DP-SGD loop


@pytest.fixture(scope="module")
def digits_setup():
    from dpaudit.data import load_dataset
    from dpaudit.mechanisms.dpsgd.one_run_modules import module_config

    data = load_dataset("digits")
    cfg, event = module_config("dp-dense", data, epsilon=8.0, delta=DELTA)
    cfg = dataclasses.replace(cfg, steps=100)
    return data, cfg, dataclasses.replace(event, steps=100)


def _audit(setup, role="main", threat_model="white-box", canaries=2000):
    from dpaudit.mechanisms.dpsgd.white_box_target import white_box_run
    from dpaudit.noise import NoiseSource

    data, cfg, event = setup
    run = white_box_run(
        "dp-dense",
        data,
        cfg,
        canaries=canaries,
        noise=NoiseSource("reproducible", seed=7),
        seed=3,
        threat_model=threat_model,
        role=role,
    )
    bound = wb.step_bound if threat_model == "white-box" else wb.final_bound
    return run, bound(run.observations, claimed=event, delta=DELTA)


def test_loop_observations_of_a_correct_run_and_its_controls(digits_setup):
    run, b = _audit(digits_setup)
    assert run.info["steps_executed"] == 100 and run.observations.values.shape == (2000, 100)
    assert not b.violation and b.epsilon_lb > 0.8 * b.claimed_epsilon
    assert (
        b.sensitivity_lower < 1.0 < b.sensitivity_lower + 0.1
    )  # the clipped canary contributes exactly C
    assert _audit(digits_setup, role="no-noise")[1].violation
    assert _audit(digits_setup, role="null")[1].epsilon_lb == 0.0


@pytest.mark.parametrize("fault", ["half-noise", "skip-clip"])
def test_loop_planted_faults_are_caught(digits_setup, plant_fault, fault):
    plant_fault(fault)
    assert _audit(digits_setup)[1].violation


def test_loop_noise_understated_by_ten_percent_is_caught(digits_setup, monkeypatch):
    from dpaudit.mechanisms.dpsgd import core as dpsgd_core

    real_fill = dpsgd_core.gaussian_filler
    monkeypatch.setattr(
        dpsgd_core, "gaussian_filler", lambda noise, out, std: real_fill(noise, out, 0.9 * std)
    )
    assert _audit(digits_setup)[1].violation


def test_loop_crafted_final_on_quiet_coordinates(digits_setup):
    run, b = _audit(digits_setup, threat_model="crafted-final", canaries=700)
    assert run.info["dp_sgd"]["optimizer"] == "sgd" and run.info["dp_sgd"]["momentum"] == 0.0
    assert not b.violation and b.epsilon_lb > 0.0


# ---------------------------------------------------------------- the command line


def test_cli_white_box_tiny(tmp_path):
    out = tmp_path / "wb"
    r = runner.invoke(
        app,
        [
            "audit",
            "dp-dense",
            "--threat-model",
            "white-box",
            "--canaries",
            "300",
            "--eps",
            "8",
            "--epochs",
            "1",
            "--reproducible-noise",
            "--out",
            str(out),
            "--ledger",
            str(tmp_path / "l.sqlite"),
            "--json",
        ],
    )
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["threat_model"] == "white-box" and set(d["bounds"]) == {"main", "no-noise", "null"}
    assert d["controls_ok"] == {"no-noise": True, "null": True} and not d["violated"]
    assert json.loads((out / "white_box.json").read_text())["bounds"]["main"] == d["bounds"]["main"]
    assert "--threat-model white-box" in d["command"]
    assert "coordinates" not in d["runs"]["main"]  # data-derived: only in the local file
    assert json.loads((out / "white_box_local.json").read_text())["runs"]["main"]["coordinates"]
    p, claim = d["power"], d["bounds"]["main"]["claimed_event"]
    event = SubsampledGaussian(claim["noise_multiplier"], claim["sample_rate"], claim["steps"])
    assert p["kind"] == "white-box" and p["trials"] == 300
    assert p["at_claim"] == wb.expected_step_bound(event, 300, delta=d["bounds"]["main"]["delta"])


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["dp-attention", "--threat-model", "white-box", "--canaries", "10"],
            "threat model for dp-attention must be",
        ),
        (["dp-dense", "--threat-model", "white-box"], "canaries must be"),
        (
            ["dp-cnn", "--threat-model", "crafted-final", "--canaries", "10", "--one-run"],
            "threat model for --one-run must be",
        ),
        (
            [
                "dp-dense",
                "--threat-model",
                "white-box",
                "--canaries",
                "10",
                "--privacy-unit",
                "user",
            ],
            "must be final-model",
        ),
    ],
)
def test_cli_white_box_refusals(tmp_path, args, message):
    r = runner.invoke(app, ["audit", *args, "--out", str(tmp_path / "x")])
    assert r.exit_code == 2 and message in r.output, r.output
