"""The audit CLI at 80 columns: every line it prints wraps at the terminal width (verdict, power and
"wrote" lines included), and the table's abbreviations are explained on screen, one legend line each."""

from __future__ import annotations

import pytest
from rich.cells import cell_len
from typer.testing import CliRunner

from dpaudit.cli import app
from dpaudit.cli.common import console, err_console

runner = CliRunner()


@pytest.fixture
def eighty(monkeypatch):
    for c in (console, err_console):
        monkeypatch.setattr(c, "_width", 80)


def test_audit_lines_fit_80_columns_and_abbreviations_are_explained(tmp_path, eighty):
    r = runner.invoke(
        app,
        ["audit", "gaussian", "--runs", "200", "--no-controls", "--out", str(tmp_path / "a")],
        env={"COLUMNS": "80"},
    )
    assert r.exit_code == 0, r.output
    too_long = [line for line in r.output.splitlines() if cell_len(line) > 80]
    assert not too_long, too_long
    for term in ("eps_LB:", "CP ceiling:", "GDP est.:", "ruled out:"):
        assert any(line.startswith(term) for line in r.output.splitlines()), term
