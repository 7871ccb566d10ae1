"""Nothing a user produced is replaced: a second run into the same place is refused (one line, exit 2, before any
work) or, for a default folder or file, goes to a fresh one named in one line; a plan runs once."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dpaudit.cli import app
from dpaudit.ledger import signing as sg
from dpaudit.ledger.book import open_ledger

runner = CliRunner()
GAUSSIAN = ["audit", "gaussian", "--runs", "40", "--no-controls"]


def _one_line_refusal(r, *words):
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.exit_code == 2 and len(lines) == 1 and "Traceback" not in r.output, r.output
    assert all(w in lines[0] for w in words), lines[0]


def _second_default_audit_is_fresh(here, args) -> Path:
    """Two default audits of ``args``: the second goes to ``-2`` beside the first (named in one line).
    Returns the first folder."""
    assert runner.invoke(app, args).exit_code == 0
    (first,) = [p.parent for p in here.glob("audits/*/audit.json")]
    before = (first / "audit.json").read_bytes()
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    second = first.with_name(first.name + "-2")
    assert (second / "audit.json").is_file() and (first / "audit.json").read_bytes() == before
    assert f"writing to {second.relative_to(here)}" in " ".join(r.stderr.split())
    return first


def test_a_second_default_audit_gets_a_fresh_folder_named_in_one_line(here):
    first = _second_default_audit_is_fresh(here, GAUSSIAN)
    assert (
        "synthetic" in first.name
    )  # the default folder names the data audited, not only mechanism, canary


def test_an_explicit_out_holding_an_audit_is_refused_before_any_trial(here):
    assert runner.invoke(app, [*GAUSSIAN, "--out", "a"]).exit_code == 0
    before = {p.name: p.read_bytes() for p in (here / "a").iterdir() if p.is_file()}
    r = runner.invoke(app, [*GAUSSIAN, "--seed", "7", "--out", "a"])
    _one_line_refusal(r, "--out must be a folder without results", "'a'", "audit.json")
    assert {p.name: p.read_bytes() for p in (here / "a").iterdir() if p.is_file()} == before
    # an audit one level below (a trajectory audit's final-model companion) counts as well
    r = runner.invoke(app, [*GAUSSIAN, "--out", "."])
    _one_line_refusal(r, "--out must be a folder without results")


def test_a_one_run_audit_into_a_folder_with_results_is_refused(here):
    (here / "o").mkdir()
    (here / "o" / "one_run.json").write_text('{"mine": 1}\n')
    r = runner.invoke(app, ["audit", "dp-rvfl", "--one-run", "--canaries", "20", "--out", "o"])
    _one_line_refusal(r, "--out must be a folder without results", "one_run.json")
    assert (here / "o" / "one_run.json").read_text() == '{"mine": 1}\n' and not (
        here / "ledger.sqlite"
    ).exists()


def test_audit_opacus_into_a_folder_with_results_is_refused_before_the_script_runs(here):
    (here / "train.py").write_text("open('ran', 'w').write('yes')\n")
    (here / "o").mkdir()
    (here / "o" / "one_run.json").write_text("{}\n")
    r = runner.invoke(app, ["audit", "opacus", "train.py", "--out", "o"])
    _one_line_refusal(r, "--out must be a folder without results")
    assert not (here / "ran").exists() and (here / "o" / "one_run.json").read_text() == "{}\n"


def test_report_out_refuses_an_existing_file_and_the_default_gets_a_fresh_name(here):
    assert runner.invoke(app, [*GAUSSIAN, "--out", "a"]).exit_code == 0
    (here / "mine.html").write_text("my page")
    _one_line_refusal(
        runner.invoke(app, ["report", "a", "--out", "mine.html"]),
        "--out must be a new file",
        "mine.html",
    )
    assert (here / "mine.html").read_text() == "my page"
    (here / "report.html").write_text("an earlier report")
    r = runner.invoke(app, ["report", "a"])
    assert (
        r.exit_code == 0
        and (here / "report-2.html").is_file()
        and (here / "report.html").read_text() == "an earlier report"
    )
    assert "writing to report-2.html" in " ".join(r.stderr.split())


def test_ledger_export_refuses_an_existing_file(here):
    assert runner.invoke(app, [*GAUSSIAN, "--out", "a"]).exit_code == 0
    (here / "e.json").write_text("keep")
    _one_line_refusal(
        runner.invoke(app, ["ledger", "export", "--out", "e.json"]),
        "--out must be a new file",
        "e.json",
    )
    assert (here / "e.json").read_text() == "keep"


def test_a_plan_runs_once_and_its_first_run_is_never_touched(here, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(here / "cfg"))
    monkeypatch.setenv(sg.SIGNING_KEY_ENV, str(sg.keygen("auditor").path))
    with open_ledger(None) as led:
        led.register_key()
    assert (
        runner.invoke(
            app, ["audit", "plan", "gaussian", "--runs", "40", "--no-controls", "--out", "p"]
        ).exit_code
        == 0
    )
    assert runner.invoke(app, ["audit", "--plan", "p/plan.json"]).exit_code == 0
    before = {p.name: p.read_bytes() for p in (here / "p").iterdir() if p.is_file()}
    r = runner.invoke(app, ["audit", "--plan", "p/plan.json"])
    _one_line_refusal(r, "plan must be run once", "'p'")
    assert {p.name: p.read_bytes() for p in (here / "p").iterdir() if p.is_file()} == before
    # a new plan into a folder holding an audit's results is refused too (its run would write over them)
    # (another claim: a plan of a target that was already audited is refused, verify's rule)
    r = runner.invoke(
        app, ["audit", "plan", "gaussian", "--eps", "3", "--runs", "40", "--out", "p2"]
    )
    assert r.exit_code == 0
    assert runner.invoke(app, [*GAUSSIAN, "--out", "q"]).exit_code == 0
    _one_line_refusal(
        runner.invoke(
            app, ["audit", "plan", "gaussian", "--eps", "4", "--runs", "40", "--out", "q"]
        ),
        "must be a folder without results",
    )


#: A catalogue entry audited by the generic ``audit NAME`` command.
NOISY_SUM = ["audit", "noisy-sum", "--runs", "40", "--no-controls"]


def test_generic_audit_command_never_overwrites(here):
    """``dpaudit audit NAME`` of an entry without its own audit target follows the same rule: an --out holding
    results is refused in one line before any trial, and a second default audit goes to a fresh folder
    named in one line."""
    assert runner.invoke(app, [*NOISY_SUM, "--out", "a"]).exit_code == 0
    before = {p.name: p.read_bytes() for p in (here / "a").iterdir() if p.is_file()}
    r = runner.invoke(app, [*NOISY_SUM, "--seed", "7", "--out", "a"])
    _one_line_refusal(r, "--out must be a folder without results", "'a'", "audit.json")
    assert {p.name: p.read_bytes() for p in (here / "a").iterdir() if p.is_file()} == before
    first = _second_default_audit_is_fresh(here, NOISY_SUM)
    assert first.name.startswith("noisy-sum-") and first.name.endswith(
        "-max-clip"
    )  # the data in between
