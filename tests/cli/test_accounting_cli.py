"""End-to-end CLI tests for account / calibrate / schedule, including bad input."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from dpaudit.cli import app

runner = CliRunner()


def _json(result):
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_version_and_help():
    r = runner.invoke(app, ["--version"])
    assert r.exit_code == 0 and r.stdout.startswith("dpaudit ")
    r = runner.invoke(app, ["--help"])
    assert r.exit_code == 0 and "account" in r.stdout and "calibrate" in r.stdout


def test_schedule_json():
    d = _json(
        runner.invoke(
            app, ["schedule", "--n", "51000", "--batch-size", "256", "--epochs", "10", "--json"]
        )
    )
    assert d == {"batches_per_epoch": 200, "sample_rate": 0.005, "steps": 2000, "normalizer": 255}


def test_account_rdp_and_prv_json():
    d = _json(
        runner.invoke(
            app,
            [
                "account",
                "--noise-multiplier",
                "1.0",
                "--sample-rate",
                "0.25",
                "--steps",
                "120",
                "--delta",
                "1e-5",
                "--accountant",
                "rdp",
                "--json",
            ],
        )
    )
    assert {"accountant", "epsilon", "delta", "adjacency"} <= d.keys() and d["accountant"] == "rdp"
    p = _json(
        runner.invoke(
            app,
            [
                "account",
                "--noise-multiplier",
                "1.0",
                "--sample-rate",
                "0.25",
                "--steps",
                "120",
                "--delta",
                "1e-5",
                "--accountant",
                "prv",
                "--json",
            ],
        )
    )
    assert p["epsilon_lower"] <= p["epsilon_estimate"] <= p["epsilon"]
    both = _json(
        runner.invoke(
            app,
            [
                "account",
                "--noise-multiplier",
                "1.0",
                "--sample-rate",
                "0.25",
                "--steps",
                "120",
                "--json",
            ],
        )
    )
    assert [r["accountant"] for r in both["results"]] == ["rdp", "prv"]


def test_calibrate_json():
    d = _json(
        runner.invoke(
            app,
            [
                "calibrate",
                "--eps",
                "2",
                "--delta",
                "1e-5",
                "--sample-rate",
                "0.25",
                "--steps",
                "120",
                "--json",
            ],
        )
    )
    assert {"noise_multiplier", "epsilon", "target_epsilon", "delta"} <= d.keys()
    assert d["epsilon"] <= d["target_epsilon"] == 2.0


def test_human_output_is_a_table():
    r = runner.invoke(
        app,
        [
            "account",
            "--noise-multiplier",
            "1.0",
            "--sample-rate",
            "0.25",
            "--steps",
            "120",
            "--accountant",
            "rdp",
        ],
    )
    assert r.exit_code == 0 and "rdp" in r.stdout


@pytest.mark.parametrize(
    "args,needle",
    [
        (
            ["calibrate", "--eps", "0", "--sample-rate", "0.1", "--steps", "10"],
            "--eps must be a finite number > 0, got 0.0",
        ),
        (
            ["calibrate", "--eps", "-1", "--sample-rate", "0.1", "--steps", "10"],
            "--eps must be a finite number > 0, got -1.0",
        ),
        (
            ["calibrate", "--eps", "nan", "--sample-rate", "0.1", "--steps", "10"],
            "--eps must be a finite number > 0, got nan",
        ),
        (
            ["calibrate", "--eps", "inf", "--sample-rate", "0.1", "--steps", "10"],
            "--eps must be a finite number > 0, got inf",
        ),
        (
            ["calibrate", "--eps", "1", "--delta", "1", "--sample-rate", "0.1", "--steps", "10"],
            "delta must be in the open interval (0, 1), got 1.0",
        ),
        (
            ["calibrate", "--eps", "1", "--delta", "0", "--sample-rate", "0.1", "--steps", "10"],
            "delta must be in the open interval (0, 1), got 0.0",
        ),
        (
            ["calibrate", "--eps", "1", "--sample-rate", "1.5", "--steps", "10"],
            "--sample-rate must be in (0, 1], got 1.5",
        ),
        (
            ["calibrate", "--eps", "1", "--sample-rate", "0", "--steps", "10"],
            "--sample-rate must be in (0, 1], got 0.0",
        ),
        (
            ["calibrate", "--eps", "1", "--sample-rate", "0.1", "--steps", "0"],
            "steps must be an integer >= 1, got 0",
        ),
        (
            ["account", "--noise-multiplier", "0", "--sample-rate", "0.1", "--steps", "10"],
            "--noise-multiplier must be a finite number > 0, got 0.0",
        ),
        (
            ["account", "--noise-multiplier", "1", "--sample-rate", "0.1", "--steps", "0"],
            "steps must be an integer >= 1, got 0",
        ),
        (
            ["schedule", "--n", "0", "--batch-size", "256", "--epochs", "1"],
            "n must be an integer >= 1, got 0",
        ),
        (
            ["calibrate", "--eps", "1e-5", "--sample-rate", "1", "--steps", "10", "--no-cache"],
            "needs a noise multiplier above",
        ),
    ],
)
def test_bad_input_is_one_line_exit_2(args, needle):
    r = runner.invoke(app, args)
    assert r.exit_code == 2, r.output
    err = r.stderr.strip()
    assert needle in err.replace("\n", " ")
    assert "Traceback" not in r.output and r.stdout == ""
    assert len(err.splitlines()) == 1
