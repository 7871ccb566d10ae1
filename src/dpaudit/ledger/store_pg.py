"""PostgreSQL storage for the team ledger (``--ledger postgresql://USER@HOST/DB``): the tables of
the SQLite file in one schema (default ``dpaudit``; ``?schema=NAME``), plus ``secret`` (the key
of the dataset fingerprints, which the SQLite ledger keeps in ``<ledger>.key``).

Enforced in the database, not only in dpaudit:

- Append-only: triggers refuse UPDATE, DELETE and TRUNCATE on ``entries``; the writer role
  (:func:`grant_writer_sql`) holds INSERT and SELECT only.
- The chain head is advanced by a trigger on every insert (``SECURITY DEFINER``, so a writer
  needs no UPDATE right on ``chain_head``); the trigger also refuses an entry whose
  ``prev_hash`` is not the current head, numbers the entry (``seq`` = head + 1: gapless, which
  a sequence is not after a rollback), and ``chain_head`` refuses any change made outside it.
- Writes are serialised by one transaction-level advisory lock per ledger
  (``pg_advisory_xact_lock``), taken first in every write transaction: the budget check and the
  reservation entry happen while no other machine can append, exactly like SQLite's
  ``BEGIN IMMEDIATE``. A per-dataset lock would not help: every entry extends the one chain. The
  transaction stays READ COMMITTED on purpose: each statement after the lock sees every commit
  made before the lock was granted (a REPEATABLE READ / SERIALIZABLE snapshot would be taken at
  the lock statement itself, *before* the wait, and miss the previous holder's entry).
- Faults: a server restart or a dropped connection mid-write leaves no half-written entry (one
  :class:`LedgerError` line); the connection is re-opened before the next transaction, never inside one.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
from typing import Iterator

from ..accounting.base import first_line
from ..errors import LedgerError, UsageError
from .paths import LedgerLocation

# ENTRY_COLUMNS: re-exported (the store tests compare both stores' columns)
from .store import ENTRY_COLUMNS, StoreBase, core_tables  # noqa: F401

#: Triggers whose absence or disabling means the ledger was altered outside dpaudit.
REQUIRED_TRIGGERS = tuple(
    "entries_no_update entries_no_delete entries_no_truncate entries_chain chain_head_guard "
    "chain_head_no_truncate".split()
)
CONNECT_TIMEOUT_S = 10


def _q(schema: str) -> str:
    # The schema name was validated by ledger.paths (lower-case SQL name), so quoting is exact.
    return '"' + schema + '"'


def _migrate_to_1(s: str) -> list[str]:
    """The tables of SQLite schema 1, with the append-only rules enforced by the server."""
    # seq is set by advance_head: gapless, unlike a sequence
    return core_tables(f"{s}.", "bigint PRIMARY KEY") + [
        f"CREATE TABLE {s}.secret (one integer PRIMARY KEY CHECK (one = 1), fingerprint_key bytea NOT NULL CHECK (length(fingerprint_key) = 32))",
        f"""CREATE FUNCTION {s}.refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN RAISE EXCEPTION 'ledger entries are append-only' USING ERRCODE = 'integrity_constraint_violation'; END $$""",
        f"CREATE TRIGGER entries_no_update BEFORE UPDATE ON {s}.entries FOR EACH ROW EXECUTE FUNCTION {s}.refuse_change()",
        f"CREATE TRIGGER entries_no_delete BEFORE DELETE ON {s}.entries FOR EACH ROW EXECUTE FUNCTION {s}.refuse_change()",
        f"CREATE TRIGGER entries_no_truncate BEFORE TRUNCATE ON {s}.entries FOR EACH STATEMENT EXECUTE FUNCTION {s}.refuse_change()",
        f"CREATE TRIGGER chain_head_no_truncate BEFORE TRUNCATE ON {s}.chain_head FOR EACH STATEMENT EXECUTE FUNCTION {s}.refuse_change()",
        # The chain head moves only with an insert, checked against the entry's prev_hash.
        f"""CREATE FUNCTION {s}.advance_head() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER
            SET search_path = pg_catalog, pg_temp AS $$
            DECLARE h record;
            BEGIN
              SELECT seq, count, hash INTO h FROM {s}.chain_head WHERE one = 1 FOR UPDATE;
              IF NOT FOUND THEN
                RAISE EXCEPTION 'ledger chain head is missing' USING ERRCODE = 'integrity_constraint_violation';
              END IF;
              IF NEW.prev_hash <> h.hash THEN
                RAISE EXCEPTION 'entry % does not follow the chain head (its prev_hash %, head %)',
                  NEW.id, left(NEW.prev_hash, 16), left(h.hash, 16) USING ERRCODE = 'integrity_constraint_violation';
              END IF;
              -- The next number, under the head's row lock: gapless even when a transaction
              -- rolls back (a sequence would leave a gap that verify must read as a deletion).
              NEW.seq := h.seq + 1;
              UPDATE {s}.chain_head SET seq = NEW.seq, count = h.count + 1, hash = NEW.hash WHERE one = 1;
              RETURN NEW;
            END $$""",
        f"CREATE TRIGGER entries_chain BEFORE INSERT ON {s}.entries FOR EACH ROW EXECUTE FUNCTION {s}.advance_head()",
        f"""CREATE FUNCTION {s}.guard_head() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
              IF TG_OP = 'UPDATE' AND pg_trigger_depth() > 1 THEN RETURN NEW; END IF;  -- from advance_head only
              RAISE EXCEPTION 'the ledger chain head moves only with an appended entry' USING ERRCODE = 'integrity_constraint_violation';
            END $$""",
        f"CREATE TRIGGER chain_head_guard BEFORE UPDATE OR DELETE OR INSERT ON {s}.chain_head FOR EACH ROW EXECUTE FUNCTION {s}.guard_head()",
    ]


def _migrate_to_2(s: str) -> list[str]:
    """Signed entries: the signer's key id and the Ed25519 signature (NULL for unsigned entries)."""
    return [
        f"ALTER TABLE {s}.entries ADD COLUMN signer text",
        f"ALTER TABLE {s}.entries ADD COLUMN signature text",
    ]


#: ``PG_MIGRATIONS[v]`` turns schema ``v - 1`` into ``v`` (the same numbering as the SQLite ledger's).
PG_MIGRATIONS = {1: _migrate_to_1, 2: _migrate_to_2}


def latest_schema_version() -> int:
    return max(PG_MIGRATIONS)


def grant_writer_sql(schema: str, role: str) -> list[str]:
    """What the ledger's owner runs to let ``role`` (an analyst, or a group role) write: read
    everything, append entries, nothing else (no UPDATE, DELETE, TRUNCATE or DDL)."""
    if not re.match(r"^[a-z_][a-z0-9_]{0,62}$", role or ""):
        raise UsageError(
            f"role must be a lower-case SQL name (letters, digits, '_'), got {role!r}."
        )
    s, r = _q(schema), '"' + role + '"'
    return [
        f"GRANT USAGE ON SCHEMA {s} TO {r}",
        f"GRANT SELECT ON {s}.schema_version, {s}.entries, {s}.chain_head, {s}.secret TO {r}",
        f"GRANT INSERT ON {s}.entries TO {r}",
    ]


#: What psycopg's messages say when the connection to the server was lost.
_LOST_CONNECTION = tuple(
    "terminating connection|server closed the connection|connection is lost|consuming input "
    "failed|the connection is closed|connection already closed".split("|")
)


def describe_pg_error(where: str, e: BaseException) -> str:
    """One line naming the ledger and what went wrong, for every psycopg error."""
    import psycopg

    msg = first_line(e)
    low = msg.lower()
    shutdown = isinstance(e, (psycopg.errors.AdminShutdown, psycopg.errors.CrashShutdown))
    if shutdown or any(words in low for words in _LOST_CONNECTION):
        return (
            f"ledger {where}: the connection to the PostgreSQL server was lost ({msg}); the transaction in flight "
            "was rolled back by the server, so no entry is half-written. Run again; `dpaudit ledger verify` checks the ledger."
        )
    if isinstance(e, psycopg.errors.InsufficientPrivilege):
        return f"ledger {where}: permission denied ({msg}); writers hold INSERT and SELECT only (the owner grants them: store_pg.grant_writer_sql)."
    if isinstance(e, psycopg.errors.LockNotAvailable) or "lock timeout" in low:
        return f"ledger {where} is busy: another writer held its lock for too long ({msg})."
    if isinstance(e, psycopg.OperationalError):
        return f"cannot reach ledger {where}: {msg}."
    return f"ledger {where}: {msg}."


class PostgresStore(StoreBase):
    """The rows of one ledger in a PostgreSQL schema. Not thread-safe (one per process/thread)."""

    backend = "postgresql"
    _migrations = PG_MIGRATIONS
    _mark = "%s"
    required_triggers = REQUIRED_TRIGGERS

    def __init__(
        self, location: LedgerLocation, *, busy_timeout: float = 60.0, initialise: bool = True
    ) -> None:
        self.location, self.display = location, location.display
        self.schema = location.schema or "dpaudit"
        self.s = _q(self.schema)
        self._prefix = self.s + "."
        self._busy_timeout = float(busy_timeout)
        # The advisory lock of this ledger: one 64-bit key from its schema name.
        digest = hashlib.sha256(f"dpaudit-ledger:{self.schema}".encode()).digest()
        self._lock_key = int.from_bytes(digest[:8], "big", signed=True)
        self._conn = None
        self._connect()
        try:
            self._open_schema(initialise)
        except BaseException:
            self.close()
            raise

    # -- connection
    def _connect(self) -> None:
        import psycopg

        with self.errors():
            self._conn = psycopg.connect(
                self.location.url,
                autocommit=True,
                connect_timeout=CONNECT_TIMEOUT_S,
                application_name="dpaudit",
            )

    def _ensure_connection(self) -> None:
        """Re-open a connection the server dropped (restart, network) -- only between transactions."""
        if self.conn.closed or self.conn.broken:
            with contextlib.suppress(Exception):
                self._conn.close()
            self._connect()

    @contextlib.contextmanager
    def errors(self) -> Iterator[None]:
        import psycopg

        try:
            yield
        except psycopg.Error as e:
            raise LedgerError(describe_pg_error(self.display, e)) from None

    def _in_transaction(self) -> bool:
        import psycopg

        return (
            self._conn is not None
            and not self._conn.closed
            and self._conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE
        )

    def execute(self, sql: str, params: tuple | list | None = None):
        with self.errors():
            if not self._in_transaction():  # a statement of its own: safe to reconnect first
                self._ensure_connection()
            return self.conn.execute(sql, params)

    # -- transactions
    @contextlib.contextmanager
    def write(self) -> Iterator[None]:
        """One write transaction holding the ledger's advisory lock: all of it commits, or none."""
        import psycopg

        if self._in_transaction():
            raise LedgerError(f"ledger {self.display}: nested write transaction (a dpaudit bug).")
        with self.errors():
            self._ensure_connection()
            conn = self.conn
            conn.execute("BEGIN ISOLATION LEVEL READ COMMITTED")
            try:
                conn.execute(f"SET LOCAL lock_timeout = {int(self._busy_timeout * 1000)}")
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (self._lock_key,))
                yield
            except BaseException:
                self._rollback()
                raise
            try:
                conn.execute("COMMIT")
            except psycopg.Error as e:
                self._rollback()
                if conn.broken or conn.closed:
                    raise LedgerError(
                        f"ledger {self.display}: the connection to the PostgreSQL server was lost while committing ({first_line(e)}); "
                        "the last write may or may not be recorded -- check with `dpaudit ledger list` before running again."
                    ) from None
                raise

    def _rollback(self) -> None:
        with contextlib.suppress(Exception):
            if self._conn is not None and not self._conn.closed and not self._conn.broken:
                self._conn.execute("ROLLBACK")

    def _begin_read(self) -> None:
        self._ensure_connection()
        self.conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")

    def _open(self) -> bool:
        return not self.conn.closed and not self.conn.broken

    # -- schema
    def _tables(self) -> set[str]:
        rows = self.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s",
            (self.schema,),
        ).fetchall()
        return {r[0] for r in rows}

    def _open_schema(self, initialise: bool) -> None:
        tables = self._tables()
        if not tables:
            if not initialise:
                raise LedgerError(
                    f"ledger {self.display} does not exist (no tables in schema {self.schema})."
                )
            self._initialise()
            return
        if "schema_version" not in tables or "entries" not in tables:
            raise self._not_a_ledger()
        self._upgrade()

    def _not_a_ledger(self) -> LedgerError:
        return LedgerError(
            f"schema {self.schema} of {self.display} holds tables but is not a "
            "dpaudit ledger; it was left untouched."
        )

    def _initialise(self) -> None:
        try:
            super()._initialise()
        except LedgerError as e:
            if "permission denied" in str(e):
                raise LedgerError(
                    f"cannot create ledger {self.display}: the role may not create schema {self.schema} in this database; "
                    "the ledger's owner creates it once (open it with an owner role), then grants writers access."
                ) from None
            raise

    def _create(self) -> None:
        self.conn.execute(f"CREATE SCHEMA IF NOT EXISTS {self.s}")
        self.conn.execute(f"REVOKE ALL ON SCHEMA {self.s} FROM PUBLIC")
        self._create_tables()
        self._insert_key(os.urandom(32))

    def _step(self, version: int) -> None:
        for stmt in PG_MIGRATIONS[version](self.s):
            self.conn.execute(stmt)

    # -- rows
    def _inserted(self, sql: str, values: tuple) -> int:
        # the server's trigger checks prev_hash, numbers the entry and moves the head
        return int(self.execute(sql + " RETURNING seq", values).fetchone()[0])

    def fingerprint_key(self, *, create: bool = True) -> bytes:
        """The 32-byte key of the dataset fingerprints, kept in the database (shared by the team)."""
        row = self.execute(f"SELECT fingerprint_key FROM {self.s}.secret WHERE one = 1").fetchone()
        if row is None:
            raise LedgerError(
                f"ledger {self.display} has lost its fingerprint key (table secret is empty); restore it from a backup."
            )
        return bytes(row[0])

    def set_fingerprint_key(self, key: bytes) -> None:
        """Import: adopt the key of the ledger being imported (only into an empty ledger)."""
        if len(key) != 32:
            raise UsageError(f"fingerprint key must be 32 bytes, got {len(key)}.")
        with self.errors():
            self.conn.execute(f"DELETE FROM {self.s}.secret WHERE one = 1")
            self._insert_key(bytes(key))

    def _insert_key(self, key: bytes) -> None:
        self.conn.execute(
            f"INSERT INTO {self.s}.secret (one, fingerprint_key) VALUES (1, %s)", (key,)
        )

    # -- integrity
    def health(self) -> list[tuple[str, str]]:
        """``(kind, message)`` for each missing or disabled append-only trigger."""
        rows = self.execute(
            "SELECT t.tgname, t.tgenabled FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid "
            "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND NOT t.tgisinternal",
            (self.schema,),
        ).fetchall()
        return self._trigger_problems(dict(rows))
