"""Errors a user can act on: one line naming the flag as typed and the value, exit 2, before any
work (an unwritable --out included); ``audit --fail-on-violation`` exits 1 on a VIOLATION."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from dpaudit.cli import app
from dpaudit.mechanisms.dpsgd import one_run_heads

runner = CliRunner()


def _one_line(args) -> str:
    r = runner.invoke(app, args)
    assert r.exit_code == 2, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    return lines[0]


@pytest.mark.parametrize(
    "args,says",
    [
        (["audit", "dp-rvfl", "--runs", "0"], "--runs must be an integer >= 4, got 0."),
        (["audit", "dp-rvfl", "--runs", "1"], "--runs must be an integer >= 4, got 1."),
        (
            ["audit", "dp-rvfl", "--canary", "foo"],
            "--canary must be one of max-clip, mislabeled, natural",
        ),
        (
            ["audit", "dp-rvfl", "--one-run", "--canaries", "1"],
            "--canaries must be an integer >= 2, got 1.",
        ),
        (
            ["audit", "dp-rvfl", "--one-run"],
            "--canaries must be given with --one-run (an integer >= 2), got none.",
        ),
        (
            ["audit", "dp-rvfl", "--privacy-unit", "user"],
            "--records-per-user must be given (an integer G >= 1) with --privacy-unit user",
        ),
        (["train", "dp-elm", "--eps", "-1"], "--eps must be a finite number > 0, got -1.0."),
        (
            ["train", "dp-elm", "--width", "0"],
            "--width must be an integer >= 1, got 0.",
        ),  # no note on defaults before it
        (["ledger", "summary", "--ledger", "foo://x"], "got 'foo://x' (unknown scheme 'foo')"),
    ],
)
def test_messages_name_flags_and_rules_as_typed(args, says):
    assert says in _one_line(args)


def test_a_value_typer_cannot_convert_is_echoed():
    r = runner.invoke(app, ["calibrate", "--eps", "abc", "--sample-rate", "0.1", "--steps", "10"])
    assert r.exit_code == 2 and "got 'abc'" in " ".join(r.stderr.split())


def test_unwritable_out_is_refused_before_any_work(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    bad = str(blocker / "sub")  # below a regular file: cannot be created, not even by root

    def no_training(*a, **k):
        raise AssertionError("trained before checking --out")

    monkeypatch.setattr(one_run_heads, "heads_one_run", no_training)
    for args in (
        ["audit", "dp-rvfl", "--one-run", "--canaries", "4"],
        ["audit", "dp-rvfl", "--runs", "8"],
        ["audit", "noisy-sum", "--runs", "8"],
        ["report", str(tmp_path)],
    ):
        line = _one_line([*args, "--out", bad + ("/report.html" if args[0] == "report" else "")])
        assert "--out must be a directory dpaudit can create and write" in line and "sub" in line


def test_audit_fail_on_violation_exits_1_only_when_asked(tmp_path):
    args = [
        "audit",
        "gaussian",
        "--broken-noise-factor",
        "20",
        "--runs",
        "200",
        "--no-controls",
        "--json",
    ]
    r = runner.invoke(app, [*args, "--out", str(tmp_path / "a")])
    assert r.exit_code == 0 and '"violated": true' in r.stdout
    r = runner.invoke(app, [*args, "--out", str(tmp_path / "b"), "--fail-on-violation"])
    assert r.exit_code == 1 and '"violated": true' in r.stdout
    r = runner.invoke(
        app,
        [
            "audit",
            "gaussian",
            "--runs",
            "200",
            "--no-controls",
            "--json",
            "--out",
            str(tmp_path / "c"),
            "--fail-on-violation",
        ],
    )
    assert r.exit_code == 0, r.output
