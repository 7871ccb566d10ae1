"""Releases written before the mechanisms moved into packages (tests/audits/old_releases) still
load, audit and report: nothing they store names a mechanisms module, and the catalogue name
finds the moved implementation."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dpaudit.cli import app
from dpaudit.records import read_release

OLD = Path(__file__).parent / "old_releases"


@pytest.mark.parametrize("name", ["rvfl", "elm"])
def test_an_old_release_loads_audits_and_reports(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "rel").mkdir()
    shutil.copy(OLD / f"{name}.json", tmp_path / "rel" / "release.json")
    rel = read_release(tmp_path / "rel")
    assert "dpaudit.mechanisms" not in json.dumps(rel.to_dict())
    runner = CliRunner()
    args = ["--release", "rel/release.json", "--runs", "8", "--no-controls", "--reproducible-noise"]
    audit = runner.invoke(app, ["audit", rel.mechanism, *args, "--workers", "1", "--out", "aud"])
    assert audit.exit_code == 0, audit.output
    record = json.loads((tmp_path / "aud" / "audit.json").read_text())
    assert record["mechanism"] == rel.mechanism
    assert record["claimed_epsilon"] == pytest.approx(rel.epsilon)
    report = runner.invoke(app, ["report", "rel", "aud", "--format", "md", "--out", "r.md"])
    assert report.exit_code == 0, report.output
    assert f"{rel.mechanism} — release {rel.id[:12]}" in (tmp_path / "r.md").read_text()
