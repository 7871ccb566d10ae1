"""`dpaudit account` / `calibrate` under an adjacency: the number printed
is computed under the adjacency it is labelled with, and an accountant that declines a run is a
skipped column or a one-line error (exit 2), never a traceback."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from typer.testing import CliRunner

from dpaudit.cli import app

runner = CliRunner()
ISSUE_RUN = [
    "account",
    "--adjacency",
    "replace-record",
    "--noise-multiplier",
    "1",
    "--sample-rate",
    "0.005",
    "--steps",
    "2000",
]


def _profile():
    path = Path(__file__).resolve().parents[1] / "accounting" / "privacy_profile.py"
    spec = importlib.util.spec_from_file_location("privacy_profile", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _one_line_exit_2(r, needle: str) -> None:
    assert r.exit_code == 2, r.output
    err = r.stderr.strip()
    assert needle in err, err
    assert len(err.splitlines()) == 1 and "Traceback" not in r.output and r.stdout == ""


def test_replace_record_prints_the_replace_one_value():
    """Within 2 % of an independent replace-one computation."""
    ref = _profile().subsampled_gaussian_epsilon(1.0, 0.005, 2000, 1e-5, replace=True)
    r = runner.invoke(app, ISSUE_RUN + ["--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["accountant"] == "pld" and d["adjacency"] == "replace-record"
    assert abs(d["epsilon"] - ref) <= 0.02 * ref
    # rdp and prv are skipped with their reason, never relabelled add/remove numbers (1.458 / 1.218)
    by_name = {x["accountant"]: x for x in d["results"]}
    assert set(by_name) == {"rdp", "prv", "pld"}
    for name in ("rdp", "prv"):
        assert (
            by_name[name]["epsilon"] is None
            and "use the pld accountant" in by_name[name]["skipped"]
        )
        assert name in d["skipped"]
    # the human table shows the same
    t = runner.invoke(app, ISSUE_RUN)
    assert t.exit_code == 0, t.output
    assert f"{d['epsilon']:.6f}" in t.stdout and "1.457" not in t.stdout and "1.218" not in t.stdout
    assert "rdp skipped:" in t.stdout and "prv skipped:" in t.stdout


def test_single_accountant_refusing_the_adjacency_is_one_line_exit_2():
    for name in ("rdp", "prv"):
        r = runner.invoke(app, ISSUE_RUN + ["--accountant", name])
        _one_line_exit_2(r, "use the pld accountant")
    d = json.loads(runner.invoke(app, ISSUE_RUN + ["--accountant", "pld", "--json"]).stdout)
    assert d["accountant"] == "pld" and d["epsilon"] > 1.9


def test_account_all_skips_prv_when_it_declines():
    # more compositions than prv supports, and a run whose prv grid would exhaust memory
    for args, needle in (
        (
            ["--noise-multiplier", "1", "--sample-rate", "0.001", "--steps", "200000"],
            "compositions",
        ),
        (["--noise-multiplier", "0.3", "--sample-rate", "0.5", "--steps", "3000"], "grid points"),
    ):
        with _profile().memory_cap():  # today's code asked prv for a ~1e8-point grid (OOM-killed)
            r = runner.invoke(app, ["account", *args, "--json"])
        assert r.exit_code == 0, r.output
        d = json.loads(r.stdout)
        assert d["accountant"] == "rdp" and d["epsilon"] > 0
        assert needle in d["skipped"]["prv"]
        with _profile().memory_cap():
            t = runner.invoke(app, ["account", *args])
        assert t.exit_code == 0 and "prv skipped:" in t.stdout and "Traceback" not in t.output


def test_calibrate_prv_declining_is_one_line_exit_2():
    r = runner.invoke(
        app,
        [
            "calibrate",
            "--eps",
            "1",
            "--sample-rate",
            "0.001",
            "--steps",
            "200000",
            "--accountant",
            "prv",
            "--no-cache",
        ],
    )
    _one_line_exit_2(r, "at most 100000 compositions")
    r = runner.invoke(
        app,
        [
            "calibrate",
            "--eps",
            "2",
            "--sample-rate",
            "0.01",
            "--steps",
            "100",
            "--adjacency",
            "replace-record",
            "--accountant",
            "rdp",
            "--no-cache",
        ],
    )
    _one_line_exit_2(r, "use the pld accountant")


def test_calibrate_under_replace_record_defaults_to_an_accountant_that_supports_it():
    r = runner.invoke(
        app,
        [
            "calibrate",
            "--eps",
            "2",
            "--sample-rate",
            "0.05",
            "--steps",
            "50",
            "--adjacency",
            "replace-record",
            "--json",
        ],
    )
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["accountant"] == "pld" and d["adjacency"] == "replace-record" and d["epsilon"] <= 2.0
    ref = _profile().subsampled_gaussian_epsilon(
        d["noise_multiplier"], 0.05, 50, 1e-5, replace=True
    )
    assert ref <= 2.0 + 0.003
    a = json.loads(
        runner.invoke(
            app, ["calibrate", "--eps", "2", "--sample-rate", "0.05", "--steps", "50", "--json"]
        ).stdout
    )
    assert (
        a["accountant"] == "rdp"
        and a["adjacency"] == "add-remove-record"
        and a["noise_multiplier"] < d["noise_multiplier"]
    )
