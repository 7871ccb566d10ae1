"""`dpaudit audit ...` through the CLI runner: exit codes, JSON on stdout, files written."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from dpaudit.cli import app

runner = CliRunner()


def _json(result) -> dict:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_gaussian_json_and_files(tmp_path):
    out = tmp_path / "a"
    r = runner.invoke(
        app,
        [
            "audit",
            "gaussian",
            "--runs",
            "400",
            "--eps",
            "2",
            "--out",
            str(out),
            "--json",
            "--reproducible-noise",
            "--workers",
            "1",
        ],
    )
    d = _json(r)
    assert d["mechanism"] == "gaussian" and d["canary"] == "max-clip" and d["runs"] == 400
    assert d["claimed_epsilon"] == pytest.approx(2.0) and d["epsilon_lower_bound"] <= 2.0
    assert set(d["controls"]) == {"no-noise", "null"} and d["audit_dir"] == str(out)
    on_disk = json.loads((out / "audit.json").read_text())
    assert on_disk["epsilon_lower_bound"] == d["epsilon_lower_bound"]
    assert np.load(out / "scores.npz")["main_score"].shape == (400,)


def test_gaussian_broken_variant_reports_violation(tmp_path):
    r = runner.invoke(
        app,
        [
            "audit",
            "gaussian",
            "--runs",
            "10000",
            "--eps",
            "2",
            "--broken-noise-factor",
            "4",
            "--out",
            str(tmp_path),
            "--no-controls",
            "--reproducible-noise",
            "--workers",
            "1",
        ],
    )
    assert r.exit_code == 0, r.output
    assert "VIOLATION" in r.stdout


def test_no_noise_flag_and_confidence(tmp_path):
    d = _json(
        runner.invoke(
            app,
            [
                "audit",
                "gaussian",
                "--runs",
                "200",
                "--no-noise",
                "--confidence",
                "0.9",
                "--out",
                str(tmp_path),
                "--json",
                "--workers",
                "1",
            ],
        )
    )
    assert d["noise"] is False and d["confidence"] == 0.9
    assert d["clopper_pearson_epsilon"] == pytest.approx(
        d["ceiling"]
    )  # the CP test reaches its ceiling
    assert (
        d["statistic"] == "claimed-curve" and d["epsilon_lower_bound"] > d["claimed_epsilon"]
    )  # the claim is evaluated anyway
    assert set(d["controls"]) == {"null"}


def test_mixmin_max_clip_on_embedded_task(tmp_path):
    d = _json(
        runner.invoke(
            app,
            [
                "audit",
                "mixmin",
                "--canary",
                "max-clip",
                "--runs",
                "200",
                "--out",
                str(tmp_path),
                "--json",
                "--workers",
                "1",
                "--reproducible-noise",
            ],
        )
    )
    assert (
        d["mechanism"] == "dp-mixmin"
        and d["dataset"] == "digits-mix"
        and d["task"].startswith("digits-mix/")
    )
    assert d["claimed_epsilon"] <= 1.0 and d["epsilon_lower_bound"] <= d["claimed_epsilon"]
    assert d["controls"]["no-noise"]["epsilon_lower_bound"] > 2.0


def test_audit_of_a_release(tmp_path):
    rel_dir = tmp_path / "rel"
    r = runner.invoke(
        app, ["train", "dp-elm", "--width", "3", "--eps", "1.5", "--out", str(rel_dir), "--json"]
    )
    assert r.exit_code == 0, r.output
    d = _json(
        runner.invoke(
            app,
            [
                "audit",
                "dp-elm",
                "--release",
                str(rel_dir),
                "--runs",
                "200",
                "--out",
                str(tmp_path / "aud"),
                "--json",
                "--workers",
                "1",
                "--no-controls",
            ],
        )
    )
    assert (
        d["mechanism"] == "dp-elm"
        and d["claimed_epsilon"] == pytest.approx(1.5)
        and d["config"]["width"] == 3
    )
    assert d["controls"] == {}
    rel = json.loads((rel_dir / "release.json").read_text())
    assert (
        d["release_id"] == rel["id"]
        and d["release_path"] == str(rel_dir.resolve())
        and "--release" in d["command"]
    )


@pytest.mark.parametrize(
    "args,needle",
    [
        (["audit", "nope"], "mechanism must be one of"),
        (["audit", "gaussian", "--canary", "mislabeled"], "--canary must be one of"),
        (["audit", "gaussian", "--runs", "2"], "runs must be"),
        (["audit", "gaussian", "--confidence", "1.5"], "confidence must be"),
        (["audit", "dp-rvfl", "--release", "/nonexistent/release.json"], "not found"),
        (["audit", "gaussian", "--executor", "spark"], "executor must be one of"),
        (
            ["audit", "gaussian", "--scheduler", "tcp://127.0.0.1:8786"],
            "executor must be dask when --scheduler",
        ),
        (
            [
                "audit",
                "gaussian",
                "--executor",
                "dask",
                "--scheduler",
                "tcp://127.0.0.1:8786",
                "--workers",
                "2",
            ],
            "workers must be omitted",
        ),
        (["audit", "gaussian", "--workers", "0"], "workers must be"),
    ],
)
def test_bad_input_one_line_exit_2(args, needle, tmp_path):
    r = runner.invoke(app, args + ["--out", str(tmp_path)])
    assert r.exit_code == 2
    assert needle in r.output and "Traceback" not in r.output


def test_recorded_command_re_creates_the_audit(tmp_path):
    import shlex

    d = _json(
        runner.invoke(
            app,
            [
                "audit",
                "gaussian",
                "--runs",
                "200",
                "--eps",
                "2",
                "--out",
                str(tmp_path / "x"),
                "--json",
                "--reproducible-noise",
                "--workers",
                "1",
                "--seed",
                "3",
            ],
        )
    )
    argv = shlex.split(d["command"])
    assert argv[:3] == ["dpaudit", "audit", "gaussian"]
    argv[argv.index("--out") + 1] = str(tmp_path / "y")
    again = _json(runner.invoke(app, argv[1:] + ["--json", "--workers", "1"]))
    assert again["counts"] == d["counts"] and again["id"] != d["id"]
    assert "threshold" not in d  # --json prints what audit.json holds; the threshold is local
    local = [json.loads((tmp_path / x / "audit_local.json").read_text()) for x in ("x", "y")]
    assert local[0]["threshold"] == local[1]["threshold"]
