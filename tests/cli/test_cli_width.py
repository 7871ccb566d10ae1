"""Output fits the terminal: at 80 and 120 columns and through a pipe (CliRunner is one), no
"…" cuts, no number column squeezed to nothing, help without <bool> metavars or broken choices."""

from __future__ import annotations

import json
import re

import pytest
import typer
from rich.cells import cell_len
from typer.testing import CliRunner

from dpaudit.accounting import SubsampledGaussian
from dpaudit.cli import app
from dpaudit.ledger.book import open_ledger
from dpaudit.cli.common import ROUTES, console, err_console, pack
from dpaudit.records import Release, write_release

runner = CliRunner()
MIX = "train/mixmin-keyed-bernoulli-v1-rho0.5-seed42"


@pytest.fixture(params=[80, 120])
def width(request, monkeypatch):
    for c in (console, err_console):
        monkeypatch.setattr(c, "_width", request.param)
    return request.param


def _run(args, width):
    r = runner.invoke(app, args, env={"COLUMNS": str(width)})
    assert r.exit_code == 0, r.output
    assert "…" not in r.output
    return r.output


def _commands(group, path=()):
    for name in group.list_commands(None):
        cmd = group.get_command(None, name)
        yield (*path, name)
        if isinstance(cmd, typer.core.TyperGroup):
            yield from _commands(cmd, (*path, name))


def _every_command():
    root = typer.main.get_command(app)
    return [[]] + [list(p) for p in _commands(root)] + [list(k) for k in ROUTES]


@pytest.mark.parametrize("cols", [80, 120])
def test_help_of_every_command_fits(cols):
    for path in _every_command():
        out = _run([*path, "--help"], cols)
        assert "<bool>" not in out, path
        assert max(cell_len(line) for line in out.splitlines()) <= cols, path
        # a choice list is never broken inside a word (it used to fold "crypt / ographic")
        assert not re.search(r"<[a-z0-9-]+\|[a-z0-9|-]*\s*│?\s*$", out, re.M), path


def _ledger(tmp_path):
    led = tmp_path / "l.sqlite"
    base = ["--dataset", "mnist-mix", "--declared-by", "dp-mixmin", "--ledger", str(led)]
    runner.invoke(app, ["ledger", "declare-partition", "--parent", "train", "--child", MIX, *base])
    runner.invoke(
        app,
        [
            "ledger",
            "declare-partition",
            "--parent",
            MIX,
            "--child",
            MIX + "/mix",
            "--child",
            MIX + "/ft",
            *base,
        ],
    )
    for i, part in enumerate([MIX + "/mix", MIX + "/ft"]):
        rel = Release(
            mechanism="dp-mixmin",
            dataset={"name": "mnist-mix", "sha256": "cd" * 32},
            adjacency="add-remove-record",
            accountant="rdp",
            epsilon=1.5,
            delta=1e-5,
            guarantee=SubsampledGaussian(2.0 + i, 1.0, 4).to_dict(),
            seed=3,
            noise_source={"kind": "os-entropy"},
            partition=part,
            git_commit=None,
        )
        write_release(rel, tmp_path / part.replace("/", "_"))
        assert (
            runner.invoke(
                app,
                ["ledger", "record", str(tmp_path / part.replace("/", "_")), "--ledger", str(led)],
            ).exit_code
            == 0
        )
    with open_ledger(led) as book:  # the library's cap: no MNIST files needed to declare rows
        book.cap("mnist-mix", 9, 1e-5)
    return led


def test_ledger_summary_and_list_never_hide_numbers_or_the_mix_ft_suffix(tmp_path, width):
    led = _ledger(tmp_path)
    rows = json.loads(
        runner.invoke(app, ["ledger", "summary", "--ledger", str(led), "--json"]).stdout
    )["rows"]
    out = _run(["ledger", "summary", "--ledger", str(led)], width)
    for r in rows:
        for key in ("epsilon", "epsilon_rdp", "epsilon_prv"):
            assert f"{r[key]:.3f}" in out
    assert re.search(r"^[│ ]+mix\b", out, re.M) and re.search(r"^[│ ]+ft\b", out, re.M)
    assert (
        "left" in out
        and f"{next(r for r in rows if r['partition'] == '*')['remaining']:.3f}" in out
    )
    table = [line for line in out.splitlines() if line[:1] in "┃│┏┡└"]
    assert all(cell_len(line) <= width for line in table)
    assert (width == 80) == (not table)  # stacked at 80 columns, a table at 120
    listing = " ".join(_run(["ledger", "list", "--ledger", str(led)], width).split())
    assert f"mnist-mix:{MIX}/mix" in listing.replace(
        " ", ""
    ) and f"mnist-mix:{MIX}/ft" in listing.replace(" ", "")


def test_pack_breaks_only_between_fields():
    fields = [
        "rel.=1/1",
        "epsilon=4.387",
        "rdp=4.729",
        "prv=4.387",
        "naive=1.500",
        "delta=1e-05",
        "cap=9",
    ]
    lines = pack(fields, 30, "  ")
    assert all(len(line) <= 30 for line in lines) and " ".join(lines).split() == fields
    assert pack(["x" * 50], 20) == ["x" * 20, "  " + "x" * 18, "  " + "x" * 12]


def test_accounting_outputs_fit(width):
    for args in (
        ["account", "--noise-multiplier", "1", "--sample-rate", "0.01", "--steps", "100"],
        ["schedule", "--n", "60000", "--batch-size", "256", "--epochs", "10"],
    ):
        out = _run(args, width)
        assert all(cell_len(line) <= width for line in out.splitlines())


def test_every_commands_normal_output_fits(tmp_path, width, monkeypatch):
    """train, audit, ledger verify, report and sweep at 80 / 120 columns through a pipe: no cut cell,
    every table line within the width (plain messages may run longer: they soft-wrap)."""
    monkeypatch.chdir(tmp_path)
    led = ["--ledger", str(tmp_path / "l.sqlite")]
    for args in (
        ["train", "dp-elm", "--width", "5", "--out", "rel", *led],
        ["audit", "noisy-sum", "--runs", "8", "--out", "aud", *led],
        ["ledger", "verify", *led],
        ["ledger", "summary", *led],
        ["report", "rel", "aud", "--out", "r.md", "--format", "md", *led],
        ["sweep", "--builtin", "selftest", "--out", "sw", *led],
    ):
        out = _run(args, width)
        table = [line for line in out.splitlines() if line[:1] in "┃│┏┡└"]
        assert all(cell_len(line) <= width for line in table), (args, out)
