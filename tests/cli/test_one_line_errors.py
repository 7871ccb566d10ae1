"""Bad input on the command line is one line on stderr and exit 2, naming the flag, the value and what is allowed: no
traceback, no usage box, and nothing written (no ledger reservation, no folder) before the refusal."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from dpaudit.cli import app

runner = CliRunner()


def _one_line(args, terminal_width=80):
    r = runner.invoke(app, args, terminal_width=terminal_width)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.exit_code == 2 and "Traceback" not in r.output and len(lines) == 1, r.output
    assert not any(c in r.output for c in "╭╰│"), r.output  # no usage box
    return lines[0]


@pytest.mark.parametrize(
    "args,says",
    [
        (
            ["train", "dp-elm", "--seed", "-1"],
            "--seed must be an integer >= 0 (a public seed), got -1.",
        ),
        (
            ["audit", "gaussian", "--seed", "-3"],
            "--seed must be an integer >= 0 (a public seed), got -3.",
        ),
        (
            ["train", "dp-rvfl", "--split-seed", "-2"],
            "--split-seed must be an integer >= 0 (a public seed), got -2.",
        ),
    ],
)
def test_a_negative_seed_is_refused_before_anything_is_written(here, args, says):
    assert _one_line(args) == f"error: {says}"
    assert list(here.iterdir()) == []  # no ledger (no reservation), no release folder


@pytest.mark.parametrize(
    "args,says",
    [
        (["report", "x", "--format", "pdf"], "--format must be one of html, md, json, got 'pdf'."),
        (["train", "dp-elm", "--width", "x"], "--width must be an integer, got 'x'."),
        (["calibrate", "--eps", "abc"], "--eps must be a number, got 'abc'."),
        (["bundle", "x"], "--out must be given (a path; see `dpaudit bundle --help`), got none."),
        (["report"], "PATHS must be given"),
        (
            ["calibrate", "--bogus", "1"],
            "option must be an option of `dpaudit calibrate --help`, got --bogus.",
        ),
        (["frob"], "COMMAND must be one of account, calibrate"),
        (["ledger", "summry"], "got 'summry'."),
        (["--bogus"], "got --bogus."),
    ],
)
def test_usage_errors_are_one_line_naming_flag_value_and_rule(here, args, says):
    line = _one_line(args)
    assert line.startswith("error: ") and says in line, line


def test_report_into_an_existing_folder_is_one_line(here):
    (here / "d").mkdir()
    assert "--out must be a file path, got 'd' (a folder)" in _one_line(
        ["report", "d", "--out", "d"]
    )


@pytest.mark.parametrize(
    "args",
    [
        ["bundle", "x", "--out", "/proc/dpaudit-bundle"],
        ["ledger", "export", "--out", "/proc/dpaudit.json"],
    ],
)
def test_unwritable_outputs_are_one_line(here, args):
    assert "--out must be a directory dpaudit can create and write" in _one_line(args)
