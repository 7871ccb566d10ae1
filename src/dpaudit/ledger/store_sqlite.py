"""SQLite storage for the ledger: the embedded default (one file, standard library ``sqlite3``),
with the interface of :class:`~dpaudit.ledger.store_pg.PostgresStore`; what it guarantees:
docs/ledger.md, "Reliability" (:data:`MIGRATIONS`: the schema steps). The fingerprint key is ``<ledger>.key``.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from pathlib import Path
from typing import Callable, Iterator

from ..accounting.base import first_line
from ..errors import LedgerError
from .fingerprint import key_path, ledger_key, write_secret

# ENTRY_COLUMNS: re-exported (the store tests compare both stores' columns)
from .store import ENTRY_COLUMNS, StoreBase, core_tables  # noqa: F401

#: PRAGMA application_id of a dpaudit ledger ("dpal").
APPLICATION_ID = 0x6470616C
_SQLITE_MAGIC = b"SQLite format 3\x00"
REQUIRED_TRIGGERS = ("entries_no_update", "entries_no_delete")


def _migrate_to_1(conn: sqlite3.Connection) -> None:
    for stmt in core_tables("", "INTEGER PRIMARY KEY AUTOINCREMENT"):
        conn.execute(stmt)
    for trigger, event in zip(REQUIRED_TRIGGERS, ("UPDATE", "DELETE")):
        conn.execute(
            f"CREATE TRIGGER {trigger} BEFORE {event} ON entries BEGIN "
            "SELECT RAISE(ABORT, 'ledger entries are append-only'); END"
        )


def _migrate_to_2(conn: sqlite3.Connection) -> None:
    """Signed entries: the signer's key id and the Ed25519 signature (NULL for unsigned entries).
    ADD COLUMN rewrites no row, so the append-only triggers do not fire and old hashes stay valid."""
    conn.execute("ALTER TABLE entries ADD COLUMN signer TEXT")
    conn.execute("ALTER TABLE entries ADD COLUMN signature TEXT")


#: Ordered migrations: ``MIGRATIONS[v]`` turns a schema of version ``v - 1`` into version ``v``.
#: Version 0 is an empty database; opening an older ledger applies the missing steps in one transaction.
MIGRATIONS: dict[int, Callable[[sqlite3.Connection], None]] = {1: _migrate_to_1, 2: _migrate_to_2}


def latest_schema_version() -> int:
    return max(MIGRATIONS)


def describe_sqlite_error(path: Path, e: BaseException) -> str:
    text = first_line(e)
    low = text.lower()
    if "readonly" in low or "read-only" in low:
        return f"ledger {path} is read-only ({text}); dpaudit needs write access to the file and its directory."
    if "locked" in low or "busy" in low:
        return f"ledger {path} is busy: another process held its lock for too long ({text})."
    if "not a database" in low or "malformed" in low or "corrupt" in low:
        return (
            f"ledger {path} is corrupt or not an SQLite database ({text}); it was left untouched."
        )
    if "unable to open" in low:
        return (
            f"cannot open ledger {path} ({text}); check that its directory exists and is writable."
        )
    return f"ledger {path}: {text}."


def _check_existing_ledger(p: Path) -> None:
    """An existing ledger path must be an SQLite database that dpaudit may write (LedgerError)."""
    if p.is_dir():
        raise LedgerError(f"ledger path {p} is a directory; give a file path.")
    try:
        with open(p, "rb") as file:
            head = file.read(len(_SQLITE_MAGIC))
    except OSError as e:
        raise LedgerError(f"cannot read ledger {p}: {e.strerror}.") from None
    if head and head != _SQLITE_MAGIC:
        raise LedgerError(
            f"ledger {p} is not an SQLite database (corrupt or another kind of file); it was left untouched."
        )
    if not os.access(p, os.R_OK | os.W_OK) or not os.access(p.parent, os.W_OK):
        raise LedgerError(
            f"ledger {p} is read-only; dpaudit needs write access to the file and its directory (WAL mode)."
        )


class SqliteStore(StoreBase):
    """The rows of one ledger file."""

    backend = "sqlite"
    _migrations = MIGRATIONS
    required_triggers = REQUIRED_TRIGGERS

    def __init__(self, path: str | os.PathLike, *, busy_timeout: float = 60.0) -> None:
        self.path = Path(path)
        self.display, self._busy_timeout = str(self.path), float(busy_timeout)
        self._conn: sqlite3.Connection | None = None
        self._precheck_location()
        try:
            with self.errors():
                self._conn = sqlite3.connect(
                    str(self.path), timeout=self._busy_timeout, isolation_level=None
                )
                self._conn.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout * 1000)}")
                self._open_schema()
        except BaseException:
            self.close()
            raise

    @contextlib.contextmanager
    def errors(self) -> Iterator[None]:
        try:
            yield
        except sqlite3.Error as e:
            raise LedgerError(describe_sqlite_error(self.path, e)) from None

    def execute(self, sql: str, params: tuple = ()):
        with self.errors():
            return self.conn.execute(sql, params)

    # -- opening checks (nothing is written before they pass)
    def _precheck_location(self) -> None:
        p = self.path
        if p.exists():
            return _check_existing_ledger(p)
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise LedgerError(
                f"cannot create the ledger directory {p.parent}: {e.strerror or e}."
            ) from None
        if not os.access(p.parent, os.W_OK):
            raise LedgerError(f"cannot create ledger {p}: directory {p.parent} is read-only.")

    def _tables(self) -> set[str]:
        rows = self.conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        return {r[0] for r in rows}

    def _not_a_ledger(self) -> LedgerError:
        return LedgerError(
            f"{self.path} is an SQLite database but not a dpaudit ledger; it was left untouched."
        )

    def _open_schema(self) -> None:
        app_id = self.conn.execute("PRAGMA application_id").fetchone()[0]
        tables = self._tables()
        if not tables and app_id in (0, APPLICATION_ID):
            self._initialise()
            return
        if app_id != APPLICATION_ID or "schema_version" not in tables:
            raise self._not_a_ledger()
        self._upgrade(before=self._set_pragmas)

    def _set_pragmas(self) -> None:
        mode = self.conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise LedgerError(
                f"ledger {self.path} cannot use write-ahead logging (journal mode {mode}); use a local file system."
            )
        # FULL: a committed entry survives power loss too, not only a killed process.
        self.conn.execute("PRAGMA synchronous = FULL")

    def _initialise(self) -> None:
        self._set_pragmas()
        super()._initialise()

    def _create(self) -> None:
        self.conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
        self._create_tables()

    def _apply_migrations(self, current: int) -> None:
        super()._apply_migrations(current)
        self.conn.execute(f"PRAGMA user_version = {latest_schema_version()}")

    # -- transactions
    @contextlib.contextmanager
    def write(self) -> Iterator[sqlite3.Connection]:
        """One BEGIN IMMEDIATE transaction: all of it commits, or none of it."""
        conn = self.conn
        with self.errors():
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
                raise

    def _begin_read(self) -> None:
        self.conn.execute("BEGIN")

    # -- rows
    def _in_transaction(self) -> bool:
        return self.conn.in_transaction

    def _inserted(self, sql: str, values: tuple) -> int:
        with self.errors():
            seq = self.conn.execute(sql, values).lastrowid
            advance = "UPDATE chain_head SET seq = ?, count = count + 1, hash = ? WHERE one = 1"
            self.conn.execute(advance, (seq, values[6]))
        return int(seq)

    def fingerprint_key(self, *, create: bool = True) -> bytes:
        """The 32-byte key of the dataset fingerprints: ``<ledger>.key`` beside the file."""
        return ledger_key(self.path, create=create)

    def set_fingerprint_key(self, key: bytes) -> None:
        """Import: adopt the key of the ledger being imported (the file must not exist yet)."""
        p = key_path(self.path)
        try:
            write_secret(p, key)
        except FileExistsError:
            if p.read_bytes() != bytes(key):
                raise LedgerError(
                    f"ledger key {p} exists with another key; import into a new ledger."
                ) from None

    # -- integrity
    def health(self) -> list[tuple[str, str]]:
        """``(kind, message)`` for SQLite's integrity check and each missing append-only trigger."""
        out = []
        integrity = [r[0] for r in self.execute("PRAGMA integrity_check").fetchall()]
        if integrity != ["ok"]:
            out.append(("integrity", f"SQLite integrity check failed: {'; '.join(integrity[:3])}."))
        rows = self.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'").fetchall()
        return out + self._trigger_problems({r[0]: "O" for r in rows})
