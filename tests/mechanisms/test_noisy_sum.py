"""noisy-sum: the first mechanism released through the contract (one module + one catalogue line).

References are independent of the mechanism's code: the clipped sum is recomputed row by row in
plain Python, the noise is redrawn from the reproducible source, the claim is recomputed from the
recorded guarantee, and the exact (analytic Gaussian) epsilon bounds the claim from below.
"""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from dpaudit.accounting import SubsampledGaussian, compute_epsilon, event_from_dict
from dpaudit.errors import AccountingMismatchError, BudgetExceededError, UsageError
from dpaudit.mechanisms.simple.noisy_sum import MECHANISM, NoisySumRequest, clipped_rows
from dpaudit.records import read_release
from dpaudit.releasing import release


@pytest.fixture(scope="module")
def digits():
    from dpaudit.data import load_dataset

    return load_dataset("digits")


def _reference_sum(x, c):
    total = np.zeros(x.shape[1])
    for row in np.asarray(x, dtype=np.float64):
        norm = math.sqrt(sum(float(v) * float(v) for v in row))
        total += row * (min(1.0, c / norm) if norm > 0 else 1.0)
    return total


def test_release_claim_recomputed_calibrated_and_request_recorded(tmp_path, digits):
    req = NoisySumRequest(
        epsilon=1.0, delta=1e-5, clipping_norm=2.0, reproducible_noise=True, seed=7
    )
    rel = release(
        "noisy-sum",
        req,
        out_dir=tmp_path / "r",
        ledger_path=tmp_path / "ledger.sqlite",
        prepared=digits,
    )
    sigma = rel.noise_multiplier
    # The claim is the accountant's epsilon of the recorded event, and does not exceed the target.
    ev = event_from_dict(rel.guarantee)
    assert ev == SubsampledGaussian(sigma, 1.0, 1)
    assert (
        rel.epsilon
        == compute_epsilon(ev, delta=1e-5, accountant="pld", adjacency="add-remove-record").epsilon
    )
    assert rel.epsilon <= 1.0 and rel.config["calibrated_epsilon"] <= 1.0
    # Sound and tight: the exact epsilon of one Gaussian release lies just below the PLD claim.
    from dpaudit.audits.gaussian import exact_epsilon

    assert exact_epsilon(sigma, 1e-5) <= rel.epsilon <= exact_epsilon(sigma, 1e-5) + 1e-3
    assert (
        rel.steps == rel.steps_executed == 1 and rel.clipping_norm == 2.0 and rel.sample_rate == 1.0
    )
    assert 0 < rel.noise_tail_delta <= 0.01 * 1e-5
    # The released vector: clipped sum (independent reference) + the reproducible noise stream.
    from dpaudit.noise import NoiseSource

    noise = NoiseSource("reproducible", seed=7).gaussian_numpy((digits.n_features,), sigma * 2.0)
    released = np.load(tmp_path / "r" / "sum.npz")["sum"]
    np.testing.assert_allclose(
        released, _reference_sum(digits.x_train, 2.0) + noise, rtol=0, atol=1e-9
    )
    # release.json carries the request; it round-trips and derives the recorded command.
    data = json.loads((tmp_path / "r" / "release.json").read_text())
    assert data["request"] == req.to_dict()
    assert NoisySumRequest.from_dict(data["request"]) == req
    assert data["command"] == req.command(out=tmp_path / "r")
    assert read_release(tmp_path / "r").request == req.to_dict()


def test_non_private_release_is_the_exact_clipped_sum(tmp_path, digits):
    rel = release(
        "noisy-sum",
        NoisySumRequest(non_private=True),
        out_dir=tmp_path / "r",
        ledger_path=tmp_path / "l.sqlite",
        prepared=digits,
    )
    assert (
        rel.non_private
        and rel.epsilon == float("inf")
        and rel.guarantee == {"type": "non-private"}
        and rel.noise_tail_delta == 0.0
    )
    np.testing.assert_allclose(
        np.load(tmp_path / "r" / "sum.npz")["sum"],
        _reference_sum(digits.x_train, 1.0),
        rtol=0,
        atol=1e-9,
    )


def test_bad_request_is_refused_before_loading(tmp_path, monkeypatch):
    def boom(*a, **k):
        raise AssertionError("loaded data before validating the request")

    monkeypatch.setattr(MECHANISM, "load", boom)
    with pytest.raises(UsageError, match=r"epsilon must be .*got 0"):
        release(
            MECHANISM,
            NoisySumRequest(epsilon=0.0),
            out_dir=tmp_path / "r",
            ledger_path=tmp_path / "l.sqlite",
        )
    with pytest.raises(UsageError, match="clipping_norm"):
        release(
            MECHANISM,
            NoisySumRequest(clipping_norm=-1.0),
            out_dir=tmp_path / "r",
            ledger_path=tmp_path / "l.sqlite",
        )
    assert not (tmp_path / "r").exists()


def test_skeleton_withholds_a_run_whose_steps_differ_from_the_plan(tmp_path, digits):
    from dpaudit.ledger.book import open_ledger

    class Cheat(type(MECHANISM)):
        def run(self, plan, data, noise, *, progress=None):
            return dataclasses.replace(
                super().run(plan, data, noise, progress=progress), steps_executed=2
            )

    with pytest.raises(
        AccountingMismatchError, match=r"steps executed \(2\) differ from steps accounted \(1\)"
    ):
        release(
            Cheat(),
            NoisySumRequest(reproducible_noise=True),
            out_dir=tmp_path / "r",
            ledger_path=tmp_path / "l.sqlite",
            prepared=digits,
        )
    assert not (tmp_path / "r" / "release.json").exists()
    with open_ledger(
        tmp_path / "l.sqlite"
    ) as ledger:  # the reservation was cancelled, nothing recorded
        assert ledger.entries(kind="release") == [] and ledger.open_reservations() == []


def test_budget_cap_is_checked_before_the_run(tmp_path, digits, monkeypatch):
    from dpaudit.ledger.book import open_ledger

    ledger_path = tmp_path / "l.sqlite"
    with open_ledger(ledger_path) as ledger:
        ledger.cap("digits", epsilon=0.5, delta=1e-5)

    def boom(*a, **k):
        raise AssertionError("ran before the budget check")

    monkeypatch.setattr(MECHANISM, "run", boom)
    with pytest.raises(BudgetExceededError):
        release(
            MECHANISM,
            NoisySumRequest(epsilon=1.0),
            out_dir=tmp_path / "r",
            ledger_path=ledger_path,
            prepared=digits,
        )


def test_audit_target_is_the_gaussian_mechanism_of_the_plan(digits):
    from dpaudit.audits.gaussian import GaussianTarget, exact_epsilon
    from dpaudit.mechanisms.contract import DataInfo

    req = NoisySumRequest(epsilon=2.0, clipping_norm=3.0)
    plan = MECHANISM.plan(req, DataInfo.from_prepared(digits))
    t = MECHANISM.audit_target(plan, "max-clip")
    assert isinstance(t, GaussianTarget) and t.mechanism == "noisy-sum"
    assert (t.noise_multiplier, t.clipping_norm, t.dimension, t.n_records) == (
        plan.event.noise_multiplier,
        3.0,
        digits.n_features,
        len(digits.y_train),
    )
    assert t.claimed_epsilon == exact_epsilon(plan.event.noise_multiplier, 1e-5) <= 2.0
    # The plan from the registry (before loading) gives the same noise.
    assert MECHANISM.plan(req, DataInfo.from_registry("digits")).event == plan.event
    with pytest.raises(UsageError, match="canary"):
        MECHANISM.audit_target(plan, "worst-case")


@settings(max_examples=50, deadline=None)
@given(
    arrays(
        np.float64, st.tuples(st.integers(1, 6), st.integers(1, 4)), elements=st.floats(-1e3, 1e3)
    ),
    st.floats(0.01, 100),
)
def test_clipping_bounds_every_row_and_keeps_short_rows(x, c):
    out = clipped_rows(x, c)
    norms = np.linalg.norm(x, axis=1)
    assert np.all(np.linalg.norm(out, axis=1) <= c * (1 + 1e-12))
    short = norms <= c
    np.testing.assert_array_equal(out[short], x[short])


def test_cli_train_audit_and_report(tmp_path):
    # The mechanism has no bespoke command: train / audit come from its Request and the catalogue line.
    from typer.testing import CliRunner

    from dpaudit.cli import app

    runner = CliRunner()
    ledger = str(tmp_path / "l.sqlite")
    res = runner.invoke(
        app,
        [
            "train",
            "noisy-sum",
            "--eps",
            "1.5",
            "--clipping-norm",
            "2",
            "--reproducible-noise",
            "--out",
            str(tmp_path / "rel"),
            "--ledger",
            ledger,
            "--json",
        ],
    )
    assert res.exit_code == 0, res.output
    on_disk = json.loads((tmp_path / "rel" / "release.json").read_text())
    assert on_disk["mechanism"] == "noisy-sum" and on_disk["epsilon"] <= 1.5
    assert (
        on_disk["request"]
        == NoisySumRequest(epsilon=1.5, clipping_norm=2.0, reproducible_noise=True).to_dict()
    )
    bad = runner.invoke(
        app,
        ["train", "noisy-sum", "--eps", "-1", "--out", str(tmp_path / "bad"), "--ledger", ledger],
    )
    assert bad.exit_code == 2 and "--eps must be" in bad.output and not (tmp_path / "bad").exists()

    res = runner.invoke(
        app,
        [
            "audit",
            "noisy-sum",
            "--release",
            str(tmp_path / "rel"),
            "--runs",
            "200",
            "--no-controls",
            "--reproducible-noise",
            "--workers",
            "1",
            "--out",
            str(tmp_path / "aud"),
            "--json",
        ],
    )
    assert res.exit_code == 0, res.output
    audit = json.loads((tmp_path / "aud" / "audit.json").read_text())
    from dpaudit.audits.gaussian import exact_epsilon

    # The audit runs the release's own noise (sigma, C, d) and checks the exact epsilon of it.
    assert audit["mechanism"] == "noisy-sum" and audit["claimed_epsilon"] == exact_epsilon(
        on_disk["noise_multiplier"], 1e-5
    )
    assert audit["claimed_epsilon"] <= on_disk["epsilon"]
    assert (
        audit["config"]["noise_multiplier"] == on_disk["noise_multiplier"]
        and audit["config"]["dimension"] == 64
    )
    assert audit["config"]["clipping_norm"] == 2.0 and audit["release_id"] == on_disk["id"]

    res = runner.invoke(
        app,
        [
            "report",
            str(tmp_path / "rel"),
            str(tmp_path / "aud"),
            "--format",
            "json",
            "--ledger",
            ledger,
        ],
    )
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    assert [v["mechanism"] for v in report["sections"]["verdict"]] == ["noisy-sum"]


def test_the_reservation_held_the_planned_noise_tail(tmp_path, digits):
    """releasing.release reserves the plan's sampler tail (at the target epsilon: >= the release's
    own, recorded at the claimed epsilon) with the budget, before any private computation."""
    from dpaudit.ledger.book import open_ledger

    rel = release(
        "noisy-sum",
        NoisySumRequest(),
        out_dir=tmp_path / "r",
        ledger_path=tmp_path / "l.sqlite",
        prepared=digits,
    )
    with open_ledger(tmp_path / "l.sqlite") as led:
        (res,) = led.entries(kind="reservation")
    assert res.payload["noise_tail_delta"] >= rel.noise_tail_delta > 0.0
