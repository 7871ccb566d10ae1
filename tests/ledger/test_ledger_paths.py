"""--ledger / $DPAUDIT_LEDGER: a path is SQLite, postgresql:// is PostgreSQL, any other scheme is refused."""

from __future__ import annotations

from pathlib import Path

import urllib.parse

import pytest
from typer.testing import CliRunner

from dpaudit.ledger.paths import DEFAULT_LEDGER, resolve_ledger
from dpaudit.cli import app
from dpaudit.errors import UsageError


def test_a_path_stays_sqlite_and_the_default_is_unchanged(tmp_path, monkeypatch):
    monkeypatch.delenv("DPAUDIT_LEDGER")
    assert resolve_ledger().backend == "sqlite" and resolve_ledger().path == DEFAULT_LEDGER
    loc = resolve_ledger(tmp_path / "l.sqlite")
    assert (loc.backend, loc.path) == ("sqlite", tmp_path / "l.sqlite")
    assert resolve_ledger(str(tmp_path / "x")).path == tmp_path / "x"
    # A Windows drive letter or a colon later in the name is still a path.
    assert resolve_ledger("C:/ledgers/l.sqlite").backend == "sqlite"
    assert resolve_ledger("runs/a:b/l.sqlite").backend == "sqlite"


@pytest.mark.parametrize(
    "text",
    [
        "postgresql://alice@db.example/budget",
        "postgres://alice@db.example/budget",
    ],
)
def test_postgresql_urls_select_postgresql(text):
    loc = resolve_ledger(text)
    assert loc.backend == "postgresql" and loc.path is None
    assert loc.url == "postgresql://alice@db.example/budget" and loc.schema == "dpaudit"


def test_the_url_survives_pathlib_and_the_environment(monkeypatch):
    # The CLI's --ledger is a Path: pathlib collapses "//" to "/"; the URL must come back whole.
    url = "postgresql://alice:s3cret@127.0.0.1:5432/budget?sslmode=disable&schema=team_a"
    for value in (url, Path(url)):
        loc = resolve_ledger(value)
        assert loc.backend == "postgresql"
        assert loc.url == "postgresql://alice:s3cret@127.0.0.1:5432/budget?sslmode=disable"
        assert loc.schema == "team_a"
        assert "s3cret" not in loc.display and "***" in loc.display and "team_a" in loc.display
        assert resolve_ledger(loc.target) == loc
    monkeypatch.setenv("DPAUDIT_LEDGER", url)
    assert resolve_ledger().url == loc.url


@pytest.mark.parametrize(
    "text",
    [
        "foo://x/y",
        "sqlite://l.sqlite",
        "mysql://root@127.0.0.1/db",
        "file:///tmp/l.sqlite",
        "http://h/x",
    ],
)
def test_an_unknown_scheme_is_refused_naming_it(text):
    with pytest.raises(UsageError, match="unknown scheme") as ei:
        resolve_ledger(text)
    assert repr(text.split(":")[0]) in str(ei.value)
    with pytest.raises(UsageError):
        resolve_ledger(Path(text))


@pytest.mark.parametrize(
    "text,what",
    [
        ("postgresql://alice@h/", "must name a database"),
        ("postgresql://alice@h/db?schema=Bad-Name", "schema must be"),
    ],
)
def test_a_malformed_postgresql_url_is_refused(text, what):
    with pytest.raises(UsageError, match=what):
        resolve_ledger(text)


@pytest.mark.parametrize("value", ["foo://x/y", "postgresql://nobody@127.0.0.1:1/nothing"])
def test_the_cli_never_turns_a_url_into_a_file(tmp_path, monkeypatch, value):
    """Before: `--ledger postgresql://...` created ./postgresql:/.../ledger as an SQLite file."""
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(app, ["ledger", "summary", "--ledger", value])
    assert r.exit_code == 2, r.output
    assert not any(tmp_path.iterdir()), list(tmp_path.iterdir())
    if value.startswith("foo"):
        assert "unknown scheme 'foo'" in r.output


@pytest.mark.parametrize(
    "text",
    [
        "postgresql:///team",
        "postgresql:///team?host=/run/pg",
        "postgres:///team?schema=lab2",
        "postgresql://:pw@/team",
    ],
)
def test_url_with_an_empty_host_keeps_its_slashes(text):
    """postgresql:///DB (the local server's default socket) stays a URL with an empty host in
    every form the ledger hands on (urlunsplit alone would give postgresql:/DB)."""
    from dpaudit.ledger.paths import resolve_ledger

    loc = resolve_ledger(text)
    for form in (loc.url, loc.target, loc.display):
        assert form.startswith("postgresql:///") or form.startswith("postgresql://:"), form
    assert urllib.parse.urlsplit(loc.url).path == "/team"
    assert "pw" not in loc.display


def test_reading_a_missing_postgresql_ledger_creates_nothing(
    pg_ledger_url, pg_server_url, pg_schema
):
    """On PostgreSQL, a reading command on a schema that holds no ledger is an
    error naming it, and the schema is not created (a mistyped URL must not read as an empty ledger)."""
    import psycopg
    from typer.testing import CliRunner

    from dpaudit.cli import app
    from dpaudit.errors import LedgerError
    from dpaudit.ledger.book import open_ledger

    with pytest.raises(LedgerError, match="does not exist"):
        open_ledger(pg_ledger_url, create=False)
    for cmd in (["ledger", "summary"], ["ledger", "list"], ["ledger", "verify"]):
        r = CliRunner().invoke(app, cmd + ["--ledger", pg_ledger_url])
        assert r.exit_code == 2 and "does not exist" in r.output, (cmd, r.output)
    with psycopg.connect(pg_server_url) as c:
        assert (
            c.execute(
                "SELECT count(*) FROM information_schema.schemata WHERE schema_name = %s",
                (pg_schema,),
            ).fetchone()[0]
            == 0
        )
    with open_ledger(pg_ledger_url) as led:  # a writing command still creates it
        assert led.entries() == []
