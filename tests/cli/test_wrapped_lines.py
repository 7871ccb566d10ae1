"""At 80 columns every line dpaudit prints wraps between words (what was written, verdicts,
refusals, notes, progress), so no line is wider than the terminal unless it is one word (a path, a
hash: kept whole to be copied); a pipe that declares no width keeps each message on one line (an
error stays the one line a script reads)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from rich.cells import cell_len
from rich.text import Text
from typer.testing import CliRunner

from dpaudit.cli import app
from dpaudit import console as consoles
from dpaudit.console import console, err_console

from .plan_flow import signed_auditor

DPAUDIT = str(Path(sys.executable).parent / "dpaudit")


def _too_wide(text: str, width: int = 80) -> list[str]:
    return [line for line in text.splitlines() if cell_len(line) > width and len(line.split()) > 1]


def test_words_are_never_split_and_continuations_are_indented():
    path = "runs/" + "x" * 90
    line = f"  release 1234 written to {path} (release.json); ledger l.sqlite entry 1234"
    text = consoles.wrap_words(Text(line), 40)
    assert text.plain.splitlines() == [
        "  release 1234 written to",
        f"    {path}",
        "    (release.json); ledger l.sqlite",
        "    entry 1234",
    ]
    assert consoles.wrap_words(Text("a " * 60), None).plain == "a " * 60  # no width known: one line


@pytest.fixture
def eighty(monkeypatch):
    for c in (console, err_console):
        monkeypatch.setattr(c, "_width", 80)
    monkeypatch.setenv("COLUMNS", "80")


def test_every_commands_lines_fit_80_columns(tmp_path, monkeypatch, eighty):
    signed_auditor(monkeypatch, tmp_path)
    runs = [
        "train dp-rvfl --epochs 1 --out runs/r1",
        "train dp-rvfl --epochs 1 --out runs/r1",  # refused: the folder holds a release
        "account --adjacency replace-record --noise-multiplier 1 --sample-rate 0.5 --steps 20",
        "audit plan dp-rvfl --release runs/r1 --runs 8 --no-controls --out p",
        "audit dp-rvfl --runs 8 --control-runs 4 --out a",
        "bundle runs/r1 p --out b",
        "ledger summary",
        "ledger verify",
        "ledger cap --dataset digits --eps 8 --delta 1e-5",
        "report runs a --out r.html",
        "report runs a --out r.html",
    ]  # the second: refused
    said = {}
    for args in map(str.split, runs):
        r = CliRunner().invoke(app, args)
        assert r.exit_code in (0, 2) and "Traceback" not in r.output, (args, r.output)
        said[" ".join(args[:2])] = _too_wide(r.output)
    assert not any(said.values()), said


def test_a_refusal_wraps_at_the_declared_width_and_is_one_line_in_a_plain_pipe():
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    args = [DPAUDIT, "account", "--noise-multiplier", "1", "--sample-rate", "0.1", "--steps", "0"]
    wrapped, piped = (
        subprocess.run(args, env=e, capture_output=True, text=True, timeout=120)
        for e in ({**env, "COLUMNS": "30"}, env)
    )
    assert wrapped.returncode == piped.returncode == 2, (wrapped.stderr, piped.stderr)
    errors = [line for line in piped.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and len(errors[0]) > 30 and "--steps" in errors[0], piped.stderr
    lines = wrapped.stderr[wrapped.stderr.index("error:") :].splitlines()
    assert len(lines) > 1 and all(cell_len(x) <= 30 for x in lines), lines
    assert all(x.startswith("  ") for x in lines[1:]), lines
    assert " ".join(" ".join(lines).split()) == " ".join(errors[0].split())
