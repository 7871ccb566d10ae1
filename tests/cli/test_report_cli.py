"""`dpaudit report` through the CLI: formats, outputs, one-line errors, exit codes."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dpaudit.cli import app

_spec = importlib.util.spec_from_file_location(
    "report_fixtures_cli", Path(__file__).resolve().parents[1] / "reports" / "report_fixtures.py"
)
fx = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fx)

runner = CliRunner()


@pytest.fixture
def runs(tmp_path):
    root = tmp_path / "runs"
    rel = fx.make_release(root / "r1", noise_multiplier=6.0, sample_rate=1.0, steps=5)
    res, *_ = fx.synthetic_audit(claimed_epsilon=rel.epsilon, shift=0.2)
    fx.write_audit_record(root / "a1", res)
    return root


def _broken(root: Path) -> None:
    res, *_ = fx.synthetic_audit(claimed_epsilon=1.0, mechanism="broken")
    fx.write_audit_record(root / "broken", res, epsilon_lower_bound=2.5)


def test_json_format_prints_the_model_on_stdout(runs):
    r = runner.invoke(app, ["report", str(runs), "--format", "json"])
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)
    assert rep["schema"] == "dpaudit-report/1"
    assert [v["status"] for v in rep["sections"]["verdict"]] == ["no-evidence"]


def test_html_to_out_file_prints_verdict_and_path(runs, tmp_path):
    out = tmp_path / "rep.html"
    r = runner.invoke(app, ["report", str(runs), "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert out.read_text().startswith("<!DOCTYPE html>")
    assert (
        "dp-rvfl: no evidence of a violation" in r.stdout and f"report written to {out}" in r.stdout
    )


def test_md_with_json_summary(runs, tmp_path):
    out = tmp_path / "rep.md"
    r = runner.invoke(app, ["report", str(runs), "--format", "md", "--out", str(out), "--json"])
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout)
    assert summary["out"] == str(out) and summary["format"] == "md"
    assert summary["verdicts"][0]["status"] == "no-evidence"
    assert out.exists() and "## 1. Verdict" in out.read_text()


def test_violation_verdict_and_fail_flag(runs, tmp_path):
    _broken(runs)
    r = runner.invoke(app, ["report", str(runs), "--out", str(tmp_path / "x.html")])
    assert r.exit_code == 0
    assert "broken: VIOLATION: eps_LB 2.500 > claimed 1.000" in r.stdout
    r = runner.invoke(
        app, ["report", str(runs), "--out", str(tmp_path / "x2.html"), "--fail-on-violation"]
    )  # never over x.html
    assert r.exit_code == 1


def test_missing_path_is_one_line_error(tmp_path):
    r = runner.invoke(app, ["report", str(tmp_path / "nope")])
    assert r.exit_code == 2
    assert "error:" in r.stderr and "must be an existing" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.output


def test_only_truncated_inputs_is_one_line_error(tmp_path):
    fx.make_release(tmp_path / "r1", noise_multiplier=6.0, sample_rate=1.0, steps=5)
    fx.truncate(tmp_path / "r1" / "release.json")
    r = runner.invoke(app, ["report", str(tmp_path), "--format", "json"])
    assert r.exit_code == 2
    assert "truncated or corrupt" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_missing_explicit_ledger_is_one_line_error(runs, tmp_path):
    r = runner.invoke(
        app, ["report", str(runs), "--ledger", str(tmp_path / "none.sqlite"), "--format", "json"]
    )
    assert r.exit_code == 2 and "ledger must be an existing" in r.stderr


def test_truncated_audit_beside_good_release_is_a_note_not_a_crash(runs, tmp_path):
    fx.truncate(runs / "a1" / "audit.json")
    r = runner.invoke(app, ["report", str(runs), "--format", "json"])
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)
    assert rep["sections"]["verdict"][0]["status"] == "not-audited"
    assert any(n["level"] == "error" and "audit skipped" in n["message"] for n in rep["notes"])
