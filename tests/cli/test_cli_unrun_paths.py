"""CLI paths no other in-process test reaches: `ledger seal`, an empty summary, a bad import
file, an option given without its value, a group given without a command; the lazy groups."""

from __future__ import annotations

import json

import typer

from typer.testing import CliRunner

from dpaudit.cli import app
from dpaudit.ledger import signing

run = CliRunner().invoke


def test_the_owner_seals_an_empty_ledger(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    monkeypatch.delenv(signing.SIGNING_KEY_ENV, raising=False)
    led = ["--ledger", str(tmp_path / "ledger.sqlite")]
    assert run(app, ["ledger", "keygen", "--json"]).exit_code == 0
    assert run(app, ["ledger", "register-key", "--json", *led]).exit_code == 0
    r = run(app, ["ledger", "summary", *led])
    assert r.exit_code == 0 and "no releases recorded." in r.output
    r = run(app, ["ledger", "seal", "--json", *led])
    assert r.exit_code == 0, r.output
    sealed = json.loads(r.stdout)
    assert sealed["sealed_through"] == sealed["seq"] - 1 and len(sealed["hash"]) == 64
    r = run(app, ["ledger", "verify", *led])
    assert r.exit_code == 0, r.output


def test_import_of_a_file_that_is_not_an_export_is_one_line(tmp_path):
    bad = tmp_path / "dump.json"
    bad.write_text("{not json")
    r = run(app, ["ledger", "import", "--from", str(bad), "--ledger", str(tmp_path / "l.sqlite")])
    assert r.exit_code == 2
    assert "--from must be a file written by `dpaudit ledger export`" in " ".join(r.output.split())
    assert not (tmp_path / "l.sqlite").exists()


def test_an_option_without_its_value_and_a_bare_group():
    r = run(app, ["ledger", "summary", "--dataset"])
    assert r.exit_code == 2
    said = " ".join(r.output.split())
    assert said.startswith("error: --dataset must be given a value (see `dpaudit")
    assert said.endswith("--help`), got none.")
    r = run(app, ["ledger"])  # no command: the group's help, as click shows it
    assert r.exit_code == 2 and "Usage:" in r.output and "summary" in r.output


def test_every_lazy_group_lists_what_typer_builds():
    eager = typer.main.get_command(app)
    lazy = app.lazy_command()
    for name, command in eager.commands.items():
        if isinstance(command, typer.core.TyperGroup):
            assert list(lazy.commands[name].commands) == list(command.commands), name


def test_the_help_renderers_stand_ins_are_the_real_classes_when_used():
    from rich.markdown import Markdown

    from dpaudit.cli.common import _stand_in

    stand_in = _stand_in("rich.markdown", "Markdown")
    assert isinstance(stand_in("*x*"), Markdown) and stand_in.elements is Markdown.elements
