"""Ledger integrity: the hash chain names tampered rows; bad files are refused untouched; schema migrations."""

from __future__ import annotations

import hashlib
import os
import sqlite3

import pytest

from dpaudit.ledger import book as ledger_mod
from dpaudit.accounting.events import SubsampledGaussian
from dpaudit.ledger.book import APPLICATION_ID, open_ledger
from dpaudit.errors import LedgerError
from dpaudit.records import Release


def _release(i: int) -> Release:
    ev = SubsampledGaussian(1.0, 0.01, 10 + i)
    return Release(
        mechanism="m",
        dataset={"name": "toy", "sha256": "0" * 64},
        adjacency="add-remove-record",
        accountant="rdp",
        epsilon=1.0,
        delta=1e-5,
        guarantee=ev.to_dict(),
        seed=i,
        noise_source={},
        git_commit=None,
    )


@pytest.fixture
def filled(tmp_path):
    """A ledger with five releases; returns (path, ids in order)."""
    path = tmp_path / "ledger.sqlite"
    with open_ledger(path) as led:
        ids = [led.record(_release(i)) for i in range(5)]
        assert led.verify().ok
    return path, ids


def _tamper(path, *sql):
    """Edit the database behind dpaudit's back (dropping the append-only triggers first)."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("DROP TRIGGER IF EXISTS entries_no_update")
    conn.execute("DROP TRIGGER IF EXISTS entries_no_delete")
    for stmt in sql:
        conn.execute(stmt)
    conn.close()


def _problems(path):
    with open_ledger(path) as led:
        rep = led.verify()
    assert not rep.ok
    return [p for p in rep.problems if p.kind != "schema"], rep


def _digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_triggers_refuse_update_and_delete(filled):
    path, _ = filled
    conn = sqlite3.connect(path)
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        conn.execute("UPDATE entries SET dataset = 'x' WHERE seq = 1")
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        conn.execute("DELETE FROM entries WHERE seq = 1")
    conn.close()


def test_verify_names_an_edited_row(filled):
    path, ids = filled
    _tamper(
        path,
        "UPDATE entries SET payload = replace(payload, '\"steps\":12', '\"steps\":1') WHERE seq = 3",
    )
    probs, rep = _problems(path)
    assert [(p.kind, p.seq, p.id) for p in probs] == [("edited", 3, ids[2])]
    assert "entry #3" in probs[0].message and ids[2] in probs[0].message
    assert any(p.kind == "schema" for p in rep.problems)  # the dropped triggers are reported too
    # Budgets are never computed from a tampered ledger, and nothing more is appended to it.
    with open_ledger(path) as led:
        with pytest.raises(LedgerError, match="fails verification"):
            led.summary()
        with pytest.raises(LedgerError):
            led.record(_release(9))


def test_verify_names_a_row_edited_and_rehashed(filled):
    path, ids = filled
    _tamper(
        path,
        "UPDATE entries SET created_at = '2000-01-01', hash = 'f' || substr(hash, 2) WHERE seq = 2",
    )
    probs, _ = _problems(path)
    kinds = {(p.kind, p.seq) for p in probs}
    assert ("edited", 2) in kinds
    assert all(p.seq == 2 for p in probs)


def test_verify_names_a_deleted_row(filled):
    path, ids = filled
    _tamper(path, "DELETE FROM entries WHERE seq = 3")
    probs, _ = _problems(path)
    assert [(p.kind, p.seq, p.id) for p in probs] == [("deleted", 4, ids[3])]
    assert "between entry #2" in probs[0].message and "entry #4" in probs[0].message


def test_verify_names_a_deleted_last_row(filled):
    path, ids = filled
    _tamper(path, "DELETE FROM entries WHERE seq = 5")
    probs, _ = _problems(path)
    assert [(p.kind, p.seq) for p in probs] == [("deleted", 5)]
    assert "last entry #5" in probs[0].message and "holds 4" in probs[0].message


def test_verify_names_reordered_rows(filled):
    path, ids = filled
    _tamper(
        path,
        "UPDATE entries SET seq = -2 WHERE seq = 2",
        "UPDATE entries SET seq = 2 WHERE seq = 4",
        "UPDATE entries SET seq = 4 WHERE seq = -2",
    )
    probs, _ = _problems(path)
    assert {p.kind for p in probs} == {"reordered"}
    named = {p.id for p in probs}
    assert {ids[1], ids[3]} <= named
    msg = " ".join(p.message for p in probs)
    assert f"appended after entry #1 ({ids[0]})" in msg


def test_an_intact_ledger_verifies_after_every_kind_of_entry(tmp_path):
    with open_ledger(tmp_path / "l.sqlite") as led:
        a = led.record(_release(0))
        led.cap("toy", 3.0, 1e-5)
        led.declare_partition("toy", "train", ["train/a", "train/b"], "test")
        led.void(a, "test")
        rep = led.verify()
    assert rep.ok and rep.entries == 4 and rep.schema_version == ledger_mod.latest_schema_version()
    assert "intact" in str(rep)


def test_an_empty_file_becomes_a_new_ledger(tmp_path):
    path = tmp_path / "ledger.sqlite"
    path.touch()
    with open_ledger(path) as led:
        assert led.schema_version == ledger_mod.latest_schema_version() and led.entries() == []


@pytest.mark.parametrize(
    "content", [b"hello, this is not a database\n" * 10, b"SQLite", os.urandom(4096)]
)
def test_a_non_sqlite_file_is_refused_and_left_untouched(tmp_path, content):
    path = tmp_path / "ledger.sqlite"
    path.write_bytes(content)
    with pytest.raises(LedgerError, match="not an SQLite database") as ei:
        open_ledger(path)
    assert "\n" not in str(ei.value)
    assert path.read_bytes() == content
    assert not (tmp_path / "ledger.sqlite-wal").exists()


def test_a_truncated_ledger_is_refused_and_left_untouched(filled, tmp_path):
    path, _ = filled
    with open_ledger(path) as led:  # more pages, so that truncation cuts into the entries
        for i in range(5, 60):
            led.record(_release(i))
    data = path.read_bytes()
    assert len(data) > 8192
    path.write_bytes(data[: len(data) // 2])
    before = _digest(path)
    with pytest.raises(LedgerError, match="corrupt|malformed|fails verification"):
        with open_ledger(path) as led:
            led.summary()
    assert _digest(path) == before


def test_another_applications_sqlite_database_is_refused_and_left_untouched(tmp_path):
    path = tmp_path / "other.sqlite"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE notes (x TEXT)")
    conn.execute("INSERT INTO notes VALUES ('keep me')")
    conn.commit()
    conn.close()
    before = _digest(path)
    with pytest.raises(LedgerError, match="not a dpaudit ledger"):
        open_ledger(path)
    assert _digest(path) == before


def test_a_newer_schema_is_refused_and_left_untouched(filled):
    path, _ = filled
    conn = sqlite3.connect(path)
    conn.execute("INSERT INTO schema_version VALUES (7, '2030-01-01', '9.0')")
    conn.commit()
    conn.close()
    before = _digest(path)
    with pytest.raises(LedgerError, match="schema version 7, newer than") as ei:
        open_ledger(path)
    assert "\n" not in str(ei.value)
    assert _digest(path) == before


def test_an_unreachable_or_read_only_location_is_a_ledger_error(tmp_path):
    # /proc refuses new directories even to root.
    with pytest.raises(LedgerError, match="cannot create the ledger directory"):
        open_ledger("/proc/dpaudit-test/ledger.sqlite")
    with pytest.raises(LedgerError, match="is a directory"):
        open_ledger(tmp_path)


def test_a_read_only_ledger_file_is_refused_and_left_untouched(filled):
    path, _ = filled
    d = path.parent
    before = _digest(path)
    os.chmod(path, 0o444)
    os.chmod(d, 0o555)
    try:
        if os.access(path, os.W_OK):
            pytest.skip("running with privileges that ignore file permissions (root)")
        with pytest.raises(LedgerError, match="read-only"):
            open_ledger(path)
    finally:
        os.chmod(d, 0o755)
        os.chmod(path, 0o644)
    assert _digest(path) == before


def test_migration_path_upgrades_an_older_ledger_in_place(filled, monkeypatch):
    path, ids = filled

    latest = ledger_mod.latest_schema_version()
    nxt = latest + 1

    def to_next(conn):
        conn.execute("CREATE TABLE release_tags (release_id TEXT NOT NULL, tag TEXT NOT NULL)")

    monkeypatch.setitem(ledger_mod.MIGRATIONS, nxt, to_next)
    with open_ledger(path) as led:
        assert led.schema_version == nxt
        assert [e.id for e in led.entries()] == ids
        assert led.verify().ok
        led.cap("toy", 2.0, 1e-5)
    conn = sqlite3.connect(path)
    versions = [r[0] for r in conn.execute("SELECT version FROM schema_version ORDER BY version")]
    assert versions == list(range(1, nxt + 1))
    assert conn.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
    assert conn.execute("PRAGMA user_version").fetchone()[0] == nxt
    conn.close()
    # The same ledger is now too new for a dpaudit that knows only the versions before it.
    monkeypatch.delitem(ledger_mod.MIGRATIONS, nxt)
    with pytest.raises(LedgerError, match=f"schema version {nxt}, newer"):
        open_ledger(path)


def test_a_failing_migration_leaves_the_old_ledger_intact(filled, monkeypatch):
    path, ids = filled

    def broken(conn):
        conn.execute("CREATE TABLE half_done (x INTEGER)")
        raise sqlite3.OperationalError("disk on fire")

    latest = ledger_mod.latest_schema_version()
    monkeypatch.setitem(ledger_mod.MIGRATIONS, latest + 1, broken)
    with pytest.raises(LedgerError, match="disk on fire"):
        open_ledger(path)
    monkeypatch.delitem(ledger_mod.MIGRATIONS, latest + 1)
    with open_ledger(path) as led:
        assert (
            led.schema_version == latest
            and [e.id for e in led.entries()] == ids
            and led.verify().ok
        )
    conn = sqlite3.connect(path)
    assert (
        conn.execute("SELECT count(*) FROM sqlite_master WHERE name = 'half_done'").fetchone()[0]
        == 0
    )
    conn.close()
