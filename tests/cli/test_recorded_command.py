"""cli.common.recorded_argv: the recorded command line of a command, written once from its parsed
parameters, parses back to the same parameters (the resolved ones written out, the omitted
ones -- how/where it runs -- at their defaults)."""

from __future__ import annotations

import shlex

import pytest
import typer

from dpaudit.cli import app
from dpaudit.cli.audit import NOT_RECORDED
from dpaudit.cli.common import recorded_argv

CASES = [
    ["audit", "gaussian"],
    [
        "audit",
        "gaussian",
        "--runs",
        "200",
        "--eps",
        "2",
        "--seed",
        "3",
        "--reproducible-noise",
        "--workers",
        "1",
        "--json",
    ],
    [
        "audit",
        "dp-rvfl",
        "--canary",
        "max-clip",
        "--no-controls",
        "--control-runs",
        "50",
        "--epochs",
        "2",
        "--data-dir",
        "/d/x y",
    ],
    [
        "audit",
        "mixmin",
        "--task",
        "mnist-mix",
        "--rho",
        "0.25",
        "--confidence",
        "0.9",
        "--chunk-size",
        "64",
        "--no-noise",
    ],
    [
        "audit",
        "dp-rvfl",
        "--one-run",
        "--canaries",
        "100",
        "--one-run-kind",
        "input-mislabeled",
        "--out",
        "o",
    ],
    [
        "audit",
        "dp-rvfl",
        "--privacy-unit",
        "user",
        "--records-per-user",
        "4",
        "--threat-model",
        "trajectory",
        "--delta",
        "1e-06",
    ],
    [
        "audit",
        "dp-elm",
        "--release",
        "r/release.json",
        "--executor",
        "dask",
        "--scheduler",
        "tcp://h:1",
    ],
]


def _context(argv):
    root = typer.main.get_command(app)
    parent = root.make_context("dpaudit", [], resilient_parsing=True)
    return root.commands[argv[0]].make_context(argv[0], list(argv[1:]), parent=parent)


@pytest.mark.parametrize("argv", CASES, ids=[" ".join(a[1:4]) for a in CASES])
def test_recorded_command_parses_back_to_the_same_parameters(argv):
    ctx = _context(argv)
    rec = recorded_argv(ctx, omit=NOT_RECORDED, always=("runs", "seed"))
    assert rec[:3] == ["dpaudit", *argv[:2]]
    assert rec == shlex.split(shlex.join(rec))
    again = _context(rec[1:])
    defaults = _context(argv[:2]).params
    for name, value in ctx.params.items():
        expected = defaults[name] if name in NOT_RECORDED else value
        assert again.params[name] == expected, name
    assert "--runs" in rec and "--seed" in rec  # `always` writes defaults out


def test_resolved_values_and_the_last_options():
    ctx = _context(["audit", "gaussian", "--out", "x", "--threat-model", "trajectory"])
    rec = recorded_argv(
        ctx,
        values={"epsilon": 2.0, "threat_model": "final-model", "out": "x/final-model"},
        omit=NOT_RECORDED,
    )
    assert "--threat-model" not in rec and rec[-2:] == ["--out", "x/final-model"]
    assert rec[rec.index("--eps") + 1] == "2.0"
    with_flag_off = recorded_argv(_context(["audit", "gaussian", "--no-controls"]))
    assert "--no-controls" in with_flag_off and "--controls" not in with_flag_off
