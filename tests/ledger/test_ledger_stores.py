"""The storage contract both ledger backends keep (SQLite file, PostgreSQL schema).

The ledger's semantics are written once against this contract; these tests pin it on both.
"""

from __future__ import annotations

import pytest

from dpaudit.ledger import store_pg as ledger_pg, store_sqlite as ledger_sqlite
from dpaudit.ledger.paths import resolve_ledger
from dpaudit.errors import LedgerError

G = "0" * 64
H1, H2 = "1" * 64, "2" * 64


@pytest.fixture(params=["sqlite", "postgresql"])
def open_store(request, tmp_path):
    """A function that (re-)opens one ledger of the parametrised backend."""
    opened = []
    if request.param == "sqlite":
        target = tmp_path / "ledger.sqlite"

        def make(**kw):
            st = ledger_sqlite.SqliteStore(target, **kw)
            opened.append(st)
            return st
    else:
        url = request.getfixturevalue("pg_ledger_url")

        def make(**kw):
            st = ledger_pg.PostgresStore(resolve_ledger(url), **kw)
            opened.append(st)
            return st

    yield make
    for st in opened:
        st.close()


def test_the_schema_versions_agree():
    assert ledger_sqlite.latest_schema_version() == ledger_pg.latest_schema_version()
    assert ledger_sqlite.ENTRY_COLUMNS == ledger_pg.ENTRY_COLUMNS


def test_insert_rows_head_and_reopen(open_store):
    st = open_store()
    assert st.schema_version() == ledger_sqlite.latest_schema_version()
    assert tuple(st.head()) == (0, 0, G) and st.last() is None and st.health() == []
    with st.write():
        assert st.insert("a", "cap", "t1", "ds", "{}", G, H1) == 1
        assert (
            st.insert(
                "b",
                "release",
                "t2",
                "other",
                '{"dataset_fingerprint":"ab"}',
                H1,
                H2,
                "k" * 32,
                "s" * 128,
            )
            == 2
        )
    assert tuple(st.head()) == (2, 2, H2) and tuple(st.last()) == (2, H2)
    rows = [tuple(r) for r in st.rows()]
    assert rows == [
        (1, "a", "cap", "t1", "ds", "{}", G, H1, None, None),
        (
            2,
            "b",
            "release",
            "t2",
            "other",
            '{"dataset_fingerprint":"ab"}',
            H1,
            H2,
            "k" * 32,
            "s" * 128,
        ),
    ]
    assert [tuple(r) for r in st.rows(dataset="other")] == rows[1:]
    assert [tuple(r) for r in st.rows(entry_id="a")] == rows[:1]
    assert st.count_keyed() == 1
    key = st.fingerprint_key()
    st.close()
    st2 = open_store()
    assert [tuple(r) for r in st2.rows()] == rows and st2.fingerprint_key() == key


def test_a_failed_write_leaves_nothing(open_store):
    st = open_store()
    with pytest.raises(RuntimeError):
        with st.write():
            st.insert("a", "cap", "t", "ds", "{}", G, H1)
            raise RuntimeError("training crashed")
    assert st.rows() == [] and tuple(st.head()) == (0, 0, G)
    with pytest.raises(
        LedgerError
    ):  # a duplicate id: the second insert fails, the first rolls back too
        with st.write():
            st.insert("a", "cap", "t", "ds", "{}", G, H1)
            st.insert("a", "cap", "t", "ds", "{}", H1, H2)
    assert st.rows() == [] and tuple(st.head()) == (0, 0, G)
    with st.write():
        assert (
            st.insert("a", "cap", "t", "ds", "{}", G, H1) == 1
        )  # numbering has no gap after rollbacks


def test_reads_in_one_snapshot_and_inside_a_write(open_store):
    st = open_store()
    with st.read():
        assert tuple(st.head()) == (0, 0, G) and st.rows() == []
    with st.write():
        st.insert("a", "cap", "t", "ds", "{}", G, H1)
        with st.read():  # nested: the write's own view
            assert [r[1] for r in st.rows()] == ["a"]


def test_a_ledger_from_a_newer_dpaudit_is_refused_untouched(open_store):
    st = open_store()
    newer = ledger_sqlite.latest_schema_version() + 1
    if isinstance(st, ledger_sqlite.SqliteStore):
        with st.conn:
            st.conn.execute(
                "INSERT INTO schema_version (version, applied_at, dpaudit_version) VALUES (?, 't', '9.9')",
                (newer,),
            )
    else:
        st.execute(
            f"INSERT INTO {st.s}.schema_version (version, applied_at, dpaudit_version) VALUES (%s, 't', '9.9')",
            (newer,),
        )
    st.close()
    with pytest.raises(
        LedgerError,
        match=f"schema version {newer}, newer than this dpaudit .* upgrade dpaudit. The ledger was left untouched",
    ):
        open_store()
