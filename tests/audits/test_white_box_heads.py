"""The white-box step audit of the DP-SGD heads (dp-rvfl family, record level): the head trained
once by the one loop with Dirac canaries observed at every step, through the same statistic as the
module models. A correct run is close to its claim, its controls behave, a 10 % noise
understatement and an unclipped canary are caught, and the command line runs it."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from dpaudit.cli import app
from dpaudit.noise import NoiseSource

runner = CliRunner()


@pytest.fixture(scope="module")
def head():
    from dpaudit.mechanisms.dpsgd.head_audit import HeadTarget

    target = HeadTarget(model="dp-rvfl", dataset="digits", epsilon=8.0, epochs=2)
    target.prepare()
    claim = dict(
        event=target.claimed_event,
        accountant=target.accountant,
        delta=target.delta,
        claimed_epsilon=target.claimed_epsilon,
    )
    return target, claim


def _audit(head, controls=False, canaries=2000):
    from dpaudit.mechanisms.dpsgd.white_box_target import white_box_audit

    target, claim = head
    return white_box_audit(
        target,
        None,
        None,
        claim,
        canaries=canaries,
        noise=NoiseSource("reproducible", seed=3),
        seed=1,
        controls=controls,
    )


def test_a_correct_head_run_is_close_to_its_claim_and_its_controls_behave(head):
    result = _audit(head, controls=True)
    main = result.main
    assert result.infos["main"]["steps_executed"] == main.steps == head[0]._config.steps
    assert not main.violation and main.epsilon_lb > 0.85 * main.claimed_epsilon
    assert (
        0.9 < main.sensitivity_lower < 1.05
    )  # the clipped canary adds C (a 98.3 % lower bound on it)
    assert result.controls_ok() == {"no-noise": True, "null": True}
    assert "coordinates" not in result.to_dict()["runs"]["main"]  # data-derived: local only


def test_a_head_with_ten_percent_less_noise_is_caught_in_one_run(head, monkeypatch):
    from dpaudit.mechanisms.dpsgd import core as dpsgd_core

    real_fill = dpsgd_core.gaussian_filler
    monkeypatch.setattr(
        dpsgd_core, "gaussian_filler", lambda noise, out, std: real_fill(noise, out, 0.9 * std)
    )
    assert _audit(head).main.violation


def test_an_unclipped_head_canary_is_caught(head, plant_fault):
    plant_fault("skip-clip")
    assert _audit(head, canaries=300).main.violation


def test_cli_white_box_head_tiny(tmp_path):
    out = tmp_path / "wb"
    r = runner.invoke(
        app,
        [
            "audit",
            "dp-rvfl",
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
    assert d["threat_model"] == "white-box" and d["runs"]["main"]["model"] == "dp-rvfl"
    assert d["controls_ok"] == {"no-noise": True, "null": True} and not d["violated"]
    assert json.loads((out / "white_box_local.json").read_text())["runs"]["main"]["coordinates"]


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["dp-rvfl", "--threat-model", "crafted-final", "--canaries", "10"],
            "threat model for dp-rvfl must be",
        ),
        (
            [
                "dp-rvfl",
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
def test_cli_white_box_head_refusals(tmp_path, args, message):
    r = runner.invoke(app, ["audit", *args, "--out", str(tmp_path / "x")])
    assert r.exit_code == 2 and message in r.output, r.output
