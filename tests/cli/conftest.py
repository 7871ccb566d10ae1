"""Make the CLI tests' shared flows (plan_flow.py) importable (the suite runs with --import-mode=importlib); the
``here`` fixture."""

import sys
from pathlib import Path

import pytest

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)


@pytest.fixture
def here(tmp_path, monkeypatch):
    """A command's working folder: its own ledger, plots without a display."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DPAUDIT_LEDGER", str(tmp_path / "ledger.sqlite"))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    return tmp_path
