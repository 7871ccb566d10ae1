"""`dpaudit audit gaussian --sequential` through the CLI runner: the stop, the record, the power line."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from dpaudit.cli import app

runner = CliRunner()


def test_sequential_audit_stops_early_on_a_2x_understatement(tmp_path):
    out = tmp_path / "a"
    r = runner.invoke(
        app,
        [
            "audit",
            "gaussian",
            "--runs",
            "2000",
            "--eps",
            "4",
            "--broken-noise-factor",
            "2",
            "--sequential",
            "--control-runs",
            "100",
            "--out",
            str(out),
            "--reproducible-noise",
            "--workers",
            "1",
        ],
    )
    assert r.exit_code == 0, r.output
    assert (
        "VIOLATION" in r.stdout
        and "sequential: stopped after" in r.stdout
        and "a violation is certain" in r.stdout
    )
    assert "power (2000 trials" in r.stdout and "smallest noise understatement detected" in r.stdout
    rec = json.loads((out / "audit.json").read_text())
    seq = rec["sequential"]
    assert (
        seq["stopped"] == "violation"
        and rec["runs"] == seq["trials_used"] < 2000
        and "--sequential" in rec["command"]
    )
    assert rec["power"]["sequential"] is True and rec["controls"]["null"]["runs"] == 100


def test_fixed_n_audit_records_the_power_block(tmp_path):
    r = runner.invoke(
        app,
        [
            "audit",
            "gaussian",
            "--runs",
            "200",
            "--eps",
            "2",
            "--no-controls",
            "--out",
            str(tmp_path / "b"),
            "--workers",
            "1",
            "--json",
        ],
    )
    d = json.loads(r.stdout)
    assert "sequential" not in d and d["power"]["trials"] == 200 and d["power"]["detectable"]


def test_sequential_refuses_one_run(tmp_path):
    r = runner.invoke(
        app,
        [
            "audit",
            "dp-dense",
            "--one-run",
            "--canaries",
            "10",
            "--sequential",
            "--out",
            str(tmp_path),
        ],
    )
    assert (
        r.exit_code == 2
        and "sequential must only be used with a final-model trial audit" in r.output
    )


def test_report_rows_show_power_and_the_sequential_stop(tmp_path):
    out = tmp_path / "a"
    r = runner.invoke(
        app,
        [
            "audit",
            "gaussian",
            "--runs",
            "2000",
            "--eps",
            "4",
            "--broken-noise-factor",
            "2",
            "--sequential",
            "--no-controls",
            "--out",
            str(out),
            "--reproducible-noise",
            "--workers",
            "1",
        ],
    )
    assert r.exit_code == 0, r.output
    md = tmp_path / "r.md"
    r = runner.invoke(app, ["report", str(out), "--format", "md", "--out", str(md)])
    assert r.exit_code == 0, r.output
    text = md.read_text()
    assert "power (what this N can detect)" in text and "detects sigma x" in text
    assert "sequential, stopped (violation) of 2000" in text
    assert (
        "differs from the one recomputed" not in text
    )  # recomputed with the anytime sequences, not fixed-N bounds
