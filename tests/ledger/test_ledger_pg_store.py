"""The PostgreSQL storage layer of the team ledger, against a real server (see conftest.py).

What the server itself enforces: append-only entries, a chain head that moves only with a
correctly chained insert, a writer role with INSERT and SELECT only, one writer at a time, and
no half-written entry when the server goes away mid-write.
"""

from __future__ import annotations

import threading
import time

import pytest

from dpaudit.ledger import store_pg as lp
from dpaudit.ledger.paths import resolve_ledger
from dpaudit.errors import LedgerError

from .conftest import with_schema

G = "0" * 64


def _store(url, **kw) -> lp.PostgresStore:
    return lp.PostgresStore(resolve_ledger(url), **kw)


class _closing:
    def __init__(self, st):
        self.st = st

    def __enter__(self):
        return self.st

    def __exit__(self, *a):
        self.st.close()


def _entry_columns(st) -> set:
    sql = "SELECT column_name FROM information_schema.columns WHERE table_schema = %s AND table_name = 'entries'"
    return {r[0] for r in st.execute(sql, (st.schema,)).fetchall()}


def _append(st, eid, prev, h, kind="cap"):
    with st.write():
        return st.insert(eid, kind, "2026-12-01T00:00:00+00:00", "ds", "{}", prev, h)


def test_a_new_ledger_has_the_latest_schema_the_triggers_and_a_key(pg_ledger_url):
    with _closing(_store(pg_ledger_url)) as st:
        assert st.schema_version() == lp.latest_schema_version() == 2
        assert st.head() == (0, 0, G) and st.last() is None and st.rows() == []
        assert st.health() == []
        key = st.fingerprint_key()
        assert len(key) == 32
    # Re-opening finds the same ledger (same key), creating nothing.
    with _closing(_store(pg_ledger_url)) as st:
        assert st.fingerprint_key() == key and st.schema_version() == 2


def test_entries_are_append_only_even_for_the_owner(pg_ledger_url):
    with _closing(_store(pg_ledger_url)) as st:
        assert _append(st, "a", G, "1" * 64) == 1
        for sql in (
            "UPDATE {s}.entries SET kind = 'x'",
            "DELETE FROM {s}.entries",
            "TRUNCATE {s}.entries",
            "UPDATE {s}.chain_head SET count = 7",
            "DELETE FROM {s}.chain_head",
            "TRUNCATE {s}.chain_head",
            "INSERT INTO {s}.chain_head VALUES (2, 0, 0, 'x')",
        ):
            with pytest.raises(LedgerError, match="append-only|moves only with an appended entry"):
                st.execute(sql.format(s=st.s))
        assert st.head() == (1, 1, "1" * 64)
        assert [r[1] for r in st.rows()] == ["a"]


def test_the_server_refuses_an_entry_that_does_not_follow_the_head(pg_ledger_url):
    with _closing(_store(pg_ledger_url)) as st:
        _append(st, "a", G, "1" * 64)
        with pytest.raises(LedgerError, match="does not follow the chain head"):
            _append(st, "b", G, "2" * 64)
        with pytest.raises(LedgerError, match="insert outside a write transaction"):
            st.insert("c", "cap", "t", "ds", "{}", "1" * 64, "3" * 64)
        assert [r[1] for r in st.rows()] == ["a"] and st.head() == (1, 1, "1" * 64)
        _append(st, "b", "1" * 64, "2" * 64)
        assert st.head() == (2, 2, "2" * 64)


def test_a_writer_role_can_insert_and_read_but_not_change_anything(
    pg_server_url, pg_schema, pg_role
):
    name, _pw, role_url = pg_role
    owner_url = with_schema(pg_server_url, pg_schema)
    with _closing(_store(owner_url)) as st:
        for sql in lp.grant_writer_sql(pg_schema, name):
            st.execute(sql)
    with _closing(_store(with_schema(role_url, pg_schema))) as w:
        assert _append(w, "a", G, "1" * 64) == 1  # the SECURITY DEFINER trigger moved the head
        assert w.head() == (1, 1, "1" * 64) and len(w.fingerprint_key()) == 32
        for sql in (
            "UPDATE {s}.entries SET kind = 'x'",
            "DELETE FROM {s}.entries",
            "TRUNCATE {s}.entries",
            "UPDATE {s}.chain_head SET count = 7",
            "ALTER TABLE {s}.entries DISABLE TRIGGER entries_no_update",
            "DROP TRIGGER entries_no_update ON {s}.entries",
            "UPDATE {s}.secret SET fingerprint_key = fingerprint_key",
        ):
            with pytest.raises(LedgerError, match="permission denied|must be owner"):
                w.execute(sql.format(s=w.s))
        assert w.health() == []
    # A writer cannot create a ledger of its own in a schema it may not create.
    with pytest.raises(LedgerError, match="cannot create ledger"):
        _store(with_schema(role_url, pg_schema + "_x"))


def test_writers_are_serialised_by_the_ledger_lock(pg_ledger_url):
    a, b = _store(pg_ledger_url), _store(pg_ledger_url, busy_timeout=0.5)
    try:
        with a.write():
            a.insert("a", "cap", "t", "ds", "{}", G, "1" * 64)
            t0 = time.monotonic()
            with pytest.raises(LedgerError, match="busy"):
                with b.write():
                    pass
            assert time.monotonic() - t0 >= 0.4
        # Once a commits, b's next transaction sees a's entry (READ COMMITTED after the lock).
        done = threading.Event()
        seen = []

        def second():
            with b.write():
                seen.append(b.head())
                b.insert("b", "cap", "t", "ds", "{}", b.head()[2], "2" * 64)
            done.set()

        with a.write():
            a.insert("c", "cap", "t", "ds", "{}", "1" * 64, "3" * 64)
            th = threading.Thread(target=second)
            b._busy_timeout = 30.0
            th.start()
            time.sleep(0.3)
            assert not done.is_set()  # b waits for the lock
        th.join(30)
        assert seen == [(2, 2, "3" * 64)]
        assert [r[1] for r in a.rows()] == ["a", "c", "b"]
    finally:
        a.close()
        b.close()


def test_an_older_schema_is_migrated_and_a_newer_one_refused(pg_ledger_url, monkeypatch):
    monkeypatch.delitem(lp.PG_MIGRATIONS, 2)
    with _closing(_store(pg_ledger_url)) as st:
        assert st.schema_version() == 1 and "signer" not in _entry_columns(st)
        with st.write():
            st.conn.execute(
                f"INSERT INTO {st.s}.entries (id, kind, created_at, dataset, payload, prev_hash, hash) "
                f"VALUES ('old', 'cap', 't', 'ds', '{{}}', '{G}', '{'1' * 64}')"
            )
    monkeypatch.undo()
    with _closing(_store(pg_ledger_url)) as st:
        assert st.schema_version() == 2 and {"signer", "signature"} <= _entry_columns(st)
        assert st.rows()[0][1:3] == ("old", "cap") and st.rows()[0][8:] == (None, None)
        st.execute(f"INSERT INTO {st.s}.schema_version VALUES (99, 't', 'future')")
    with pytest.raises(LedgerError, match="schema version 99, newer"):
        _store(pg_ledger_url)


def test_a_schema_of_another_application_is_refused_and_left_untouched(pg_server_url, pg_schema):
    import psycopg

    with psycopg.connect(pg_server_url, autocommit=True) as c:
        c.execute(f'CREATE SCHEMA "{pg_schema}"')
        c.execute(f'CREATE TABLE "{pg_schema}".orders (id int)')
    with pytest.raises(LedgerError, match="not a dpaudit ledger"):
        _store(with_schema(pg_server_url, pg_schema))
    with psycopg.connect(pg_server_url) as c:
        tables = c.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s", (pg_schema,)
        ).fetchall()
    assert tables == [("orders",)]


def test_dropped_or_disabled_triggers_are_reported(pg_ledger_url):
    with _closing(_store(pg_ledger_url)) as st:
        st.execute(f"ALTER TABLE {st.s}.entries DISABLE TRIGGER entries_no_update")
        st.execute(f"DROP TRIGGER entries_no_delete ON {st.s}.entries")
        msgs = [m for _k, m in st.health()]
        assert any("entries_no_delete are missing" in m for m in msgs)
        assert any("entries_no_update are disabled" in m for m in msgs)


def test_an_unreachable_server_is_one_ledger_error_line():
    with pytest.raises(LedgerError) as ei:
        _store("postgresql://nobody:pw@127.0.0.1:1/db")
    msg = str(ei.value)
    assert (
        msg.startswith("cannot reach ledger postgresql://nobody:***@127.0.0.1:1/db")
        and "\n" not in msg
        and "pw@" not in msg
    )


@pytest.mark.slow
def test_a_server_restart_mid_write_leaves_no_half_written_entry(private_pg_cluster):
    helper, root, url = private_pg_cluster
    st = _store(url)
    try:
        _append(st, "a", G, "1" * 64)
        with pytest.raises(LedgerError) as ei:
            with st.write():
                st.insert("b", "cap", "t", "ds", "{}", "1" * 64, "2" * 64)
                helper.restart(root)  # the server goes away while the transaction is open
                st.insert("c", "cap", "t", "ds", "{}", "2" * 64, "3" * 64)
        msg = str(ei.value)
        assert (
            "connection to the PostgreSQL server was lost" in msg
            and "no entry is half-written" in msg
        )
        assert (
            "\n" not in msg and st.location.url.split(":")[2].split("@")[0] not in msg
        )  # no password
        # The next transaction reconnects; the interrupted one left nothing behind.
        assert [r[1] for r in st.rows()] == ["a"] and st.head() == (1, 1, "1" * 64)
        _append(st, "b", "1" * 64, "2" * 64)
        assert st.head() == (2, 2, "2" * 64)
    finally:
        st.close()
