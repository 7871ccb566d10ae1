"""The trajectory threat model of DP-SGD heads: exact likelihood-ratio score,
power against the final-model audit, validation, and `dpaudit audit --threat-model`."""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy import stats
from typer.testing import CliRunner

from dpaudit.audits.engine import run_audit
from dpaudit.mechanisms.dpsgd.head_audit import HeadTarget, trajectory_log_lr
from dpaudit.cli import app
from dpaudit.errors import UsageError

runner = CliRunner()


@pytest.mark.parametrize("q, sigma, c", [(0.05, 1.79, 1.0), (0.3, 0.7, 2.5), (1.0, 1.2, 0.4)])
def test_trajectory_log_lr_is_the_mixture_likelihood_ratio(q, sigma, c):
    """Against the densities themselves: in, each step's sum is (1-q) N(0, s^2) + q N(C, s^2);
    out, N(0, s^2); s = sigma C; steps independent, so the log-ratio sums over steps."""
    rng = np.random.default_rng(0)
    x = rng.normal(scale=sigma * c, size=(7, 30)) + c * (rng.random((7, 30)) < q)
    s = sigma * c
    ratio = ((1 - q) * stats.norm.pdf(x, 0.0, s) + q * stats.norm.pdf(x, c, s)) / stats.norm.pdf(
        x, 0.0, s
    )
    want = np.log(ratio).sum(axis=1)
    got = trajectory_log_lr(x, sample_rate=q, noise_multiplier=sigma, clipping_norm=c)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)


def test_trajectory_log_lr_is_finite_for_the_no_noise_control():
    """sigma = 1e-12: the ratio overflows as a float, its log does not (log-sum-exp)."""
    x = np.array([[0.0, 1.0, 1e-12], [1.0, 1.0, 1.0]])
    got = trajectory_log_lr(x, sample_rate=0.1, noise_multiplier=1e-12, clipping_norm=1.0)
    assert np.all(np.isfinite(got)) and got[1] > got[0] + 1e20


def test_threat_model_validation():
    with pytest.raises(
        UsageError, match=r"threat model must be one of final-model, trajectory, got 'iterates'"
    ):
        HeadTarget(threat_model="iterates")
    with pytest.raises(
        UsageError, match=r"canary must be max-clip with the trajectory threat model"
    ):
        HeadTarget(canary="mislabeled", threat_model="trajectory")
    t = HeadTarget()
    tr = t.with_threat_model("trajectory")  # describe() records it: see the CLI test below
    assert (
        tr.threat_model == "trajectory" and t.threat_model == "final-model"
    )  # the original is unchanged


def test_trajectory_audit_is_much_stronger_than_the_final_model():
    """Same trials (reproducible noise: the same engine runs), two threat models. At eps = 32
    (sigma 0.40, q 0.25, 8 steps) the final head hides most of the per-step evidence that the
    likelihood ratio of the recorded sums sees. Neither may exceed the claim."""
    base = HeadTarget(epsilon=32.0, max_train=200, epochs=2)
    got = {}
    for tm in ("trajectory", "final-model"):
        r = run_audit(
            base.with_threat_model(tm), runs=200, seed=0, controls=(), reproducible_noise=True
        ).to_dict()
        assert r["epsilon_lower_bound"] <= r["claimed_epsilon"]
        assert r.get("threat_model", tm) == tm
        got[tm] = r
    traj, final = got["trajectory"], got["final-model"]
    assert traj["auc"] > final["auc"] + 0.1
    assert traj["gdp_estimate"]["mu"] > 1.5 * final["gdp_estimate"]["mu"]
    # in the claim's own family (the figure that decides) and as a bound for any mechanism
    assert traj["claim_family_bound"]["family_epsilon"] > max(
        2.0, 3 * final["claim_family_bound"]["family_epsilon"]
    )
    assert traj["epsilon_lower_bound"] > 2 * final["epsilon_lower_bound"]


def test_cli_threat_model_refused_outside_head_models():
    r = runner.invoke(app, ["audit", "gaussian", "--threat-model", "trajectory", "--runs", "8"])
    assert r.exit_code == 2 and "threat model for gaussian must be final-model" in r.output
    r = runner.invoke(app, ["audit", "dp-rvfl", "--threat-model", "iterates", "--runs", "8"])
    assert (
        r.exit_code == 2
        and "threat model must be one of final-model, trajectory, white-box, crafted-final, got 'iterates'"
        in r.output
    )
    r = runner.invoke(
        app,
        [
            "audit",
            "dp-rvfl",
            "--threat-model",
            "trajectory",
            "--canary",
            "mislabeled",
            "--runs",
            "8",
        ],
    )
    assert (
        r.exit_code == 2 and "canary must be max-clip with the trajectory threat model" in r.output
    )


def test_cli_trajectory_writes_both_threat_models(tmp_path):
    out = tmp_path / "traj"
    r = runner.invoke(
        app,
        [
            "audit",
            "dp-rvfl",
            "--canary",
            "max-clip",
            "--threat-model",
            "trajectory",
            "--runs",
            "8",
            "--epochs",
            "1",
            "--no-controls",
            "--reproducible-noise",
            "--workers",
            "1",
            "--out",
            str(out),
        ],
    )
    assert r.exit_code == 0, r.output
    traj = json.loads((out / "audit.json").read_text())
    final = json.loads((out / "final-model" / "audit.json").read_text())
    text = " ".join(r.output.split())
    for name, d in (
        ("trajectory", traj),
        ("final-model", final),
    ):  # each line: the verdict, the family result, eps_LB
        assert f"{name}: " in text and f"eps_LB {d['epsilon_lower_bound']:.3f}" in text
        assert d["claim_family_bound"]["statement"] in text
    assert (
        traj["config"]["threat_model"] == "trajectory"
        and final["config"]["threat_model"] == "final-model"
    )
    assert (
        "--threat-model trajectory" in traj["command"] and "--threat-model" not in final["command"]
    )
    assert final["command"].endswith(f"--out {out / 'final-model'}")
    # the same public configuration and trials
    assert {k: v for k, v in traj["config"].items() if k != "threat_model"} == {
        k: v for k, v in final["config"].items() if k != "threat_model"
    }
    assert traj["runs"] == final["runs"] == 8
