"""What the two ledger stores (:mod:`.store_sqlite`, :mod:`.store_pg`) share: the entry columns,
the tables of schema 1, read snapshots, reading rows, appending one and applying the schema steps.
A store sets ``_prefix`` (its schema, qualifying the table names), ``_mark`` (its parameter
placeholder), ``display``, ``_conn`` and ``_migrations`` (its schema steps by version), and
provides ``execute``, ``write``, ``_in_transaction``, ``_begin_read`` (start a read snapshot) and
``_inserted`` (run the insert).
"""

from __future__ import annotations

import contextlib
from typing import Iterator

from .. import __version__
from ..errors import LedgerError
from .paths import GENESIS_HASH, utc_now

#: Every column of an entry, in the order the ledger's rows use (both stores, the export).
ENTRY_COLUMNS = tuple(
    "seq id kind created_at dataset payload prev_hash hash signer signature".split()
)


def core_tables(prefix: str, seq: str) -> list[str]:
    """The entries and the chain head of schema 1 (``seq``: the store's type of the entry
    number)."""
    texts = ", ".join(f"{c} text NOT NULL" + " UNIQUE" * (c == "id") for c in ENTRY_COLUMNS[1:8])
    head = f"{prefix}chain_head"
    return [
        f"CREATE TABLE {prefix}entries (seq {seq}, {texts})",
        f"CREATE INDEX entries_dataset ON {prefix}entries (dataset)",
        f"CREATE TABLE {head} (one integer PRIMARY KEY CHECK (one = 1), seq bigint NOT NULL, "
        "count bigint NOT NULL, hash text NOT NULL)",
        f"INSERT INTO {head} (one, seq, count, hash) VALUES (1, 0, 0, '{GENESIS_HASH}')",
    ]


class StoreBase:
    """The rows of one ledger, whatever holds them (see the module docstring)."""

    _prefix = ""
    _mark = "?"
    _conn = None

    @property
    def conn(self):
        if self._conn is None:
            raise LedgerError(f"ledger {self.display} is closed.")
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):  # closing a connection the server dropped
                self._conn.close()
            self._conn = None

    @contextlib.contextmanager
    def read(self) -> Iterator[None]:
        """One read snapshot for several reads (a no-op inside a transaction, which is already
        consistent)."""
        if self._in_transaction():
            yield
            return
        with self.errors():
            self._begin_read()
        try:
            yield
        finally:
            with self.errors():
                if self._open():
                    self.conn.execute("COMMIT")

    def _open(self) -> bool:
        """Whether the connection can still end the read (a dropped server connection cannot)."""
        return True

    def schema_version(self) -> int:
        row = self.execute(f"SELECT MAX(version) FROM {self._prefix}schema_version").fetchone()
        return int(row[0] or 0)

    def head(self) -> tuple[int, int, str] | None:
        sql = f"SELECT seq, count, hash FROM {self._prefix}chain_head WHERE one = 1"
        return self.execute(sql).fetchone()

    def last(self) -> tuple[int, str] | None:
        sql = f"SELECT seq, hash FROM {self._prefix}entries ORDER BY seq DESC LIMIT 1"
        return self.execute(sql).fetchone()

    def rows(self, *, dataset: str | None = None, entry_id: str | None = None) -> list[tuple]:
        """Rows as :data:`ENTRY_COLUMNS` tuples in append (seq) order."""
        where, params = "", ()
        if dataset is not None:
            where, params = f"WHERE dataset = {self._mark}", (dataset,)
        elif entry_id is not None:
            where, params = f"WHERE id = {self._mark}", (entry_id,)
        sql = f"SELECT {', '.join(ENTRY_COLUMNS)} FROM {self._prefix}entries {where} ORDER BY seq"
        return self.execute(sql, params).fetchall()

    def count_keyed(self) -> int:
        """Entries that carry a keyed fingerprint (or declare a version, or hold keyed row
        hashes)."""
        sql = (
            f"SELECT count(*) FROM {self._prefix}entries WHERE kind IN ('version', 'rows') "
            f"OR payload LIKE {self._mark}"
        )
        return int(self.execute(sql, ('%"dataset_fingerprint":"%',)).fetchone()[0])

    def insert(self, *row) -> int:
        """Append one row inside :meth:`write` and advance the chain head; returns its seq.

        Args:
            *row: the values of :data:`ENTRY_COLUMNS` after ``seq`` (``signer`` and
                ``signature`` may be left out: an unsigned entry).
        """
        if not self._in_transaction():
            raise LedgerError(
                f"ledger {self.display}: insert outside a write transaction (a dpaudit bug)."
            )
        values = tuple(row) + (None,) * (len(ENTRY_COLUMNS) - 1 - len(row))
        marks = ", ".join([self._mark] * len(values))
        sql = f"INSERT INTO {self._prefix}entries ({', '.join(ENTRY_COLUMNS[1:])}) VALUES ({marks})"
        return self._inserted(sql, values)

    def _trigger_problems(self, present: dict) -> list[tuple[str, str]]:
        """The health findings on the store's append-only triggers (``present``: name -> its
        ``tgenabled`` flag, ``"D"`` disabled), each missing or disabled one named."""
        required = self.required_triggers
        found = {
            "missing": [t for t in required if t not in present],
            "disabled": [t for t in required if present.get(t) == "D"],
        }
        message = "append-only triggers {} are {}: the ledger was altered outside dpaudit."
        return [("schema", message.format(", ".join(ts), how)) for how, ts in found.items() if ts]

    def _latest(self) -> int:
        return max(self._migrations)

    def _step(self, version: int) -> None:
        self._migrations[version](self.conn)

    def _upgrade(self, before=None) -> None:
        """Refuse a newer schema, then (after ``before``, if given) apply the missing steps in one
        write transaction."""
        version, latest = self.schema_version(), self._latest()
        # a schema from a newer dpaudit may mean more than this code can check: touch nothing
        if version > latest:
            raise LedgerError(
                f"ledger {self.display} has schema version {version}, newer than this dpaudit "
                f"({__version__}) supports ({latest}); upgrade dpaudit. The ledger was left "
                "untouched."
            )
        if before is not None:
            before()
        if version < latest:
            with self.write():
                self._apply_migrations(self.schema_version())

    def _initialise(self) -> None:
        """Create an empty ledger in one write transaction (:meth:`_create`: the store's own
        set-up), unless another process initialised it while this one waited for the lock."""
        with self.write():
            tables = self._tables()
            if "schema_version" in tables:
                return
            if tables:
                raise self._not_a_ledger()
            self._create()

    def _create_tables(self) -> None:
        """The schema_version table and every schema step (inside :meth:`_initialise`)."""
        self.conn.execute(
            f"CREATE TABLE {self._prefix}schema_version (version INTEGER NOT NULL, "
            "applied_at TEXT NOT NULL, dpaudit_version TEXT NOT NULL)"
        )
        self._apply_migrations(0)

    def _apply_migrations(self, current: int) -> None:
        marks = ", ".join([self._mark] * 3)
        for version in range(current + 1, self._latest() + 1):
            self._step(version)
            table = f"{self._prefix}schema_version (version, applied_at, dpaudit_version)"
            row = (version, utc_now(), __version__)
            self.conn.execute(f"INSERT INTO {table} VALUES ({marks})", row)
