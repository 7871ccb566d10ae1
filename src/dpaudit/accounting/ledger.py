"""The privacy budget ledger: a durable, append-only record of every release of every dataset.

One SQLite file (standard library ``sqlite3``; default ``./.dpaudit/ledger.sqlite``, or
``$DPAUDIT_LEDGER``, or ``--ledger PATH``), in WAL mode with ``synchronous=FULL``:

- Every write is one ``BEGIN IMMEDIATE`` transaction, so an entry is either fully there or
  absent, even if the writing process is killed (SIGKILL) half-way; concurrent writers queue
  on the lock (busy timeout) instead of failing or interleaving.
- Entries are append-only (``release``, ``void``, ``cap``, ``partition``). Triggers refuse
  UPDATE and DELETE; a release withdrawn by mistake gets a ``void`` entry referencing it.
- Each entry stores ``hash = sha256(prev_hash, id, kind, created_at, dataset, payload)``; the
  table ``chain_head`` holds the last hash and the entry count. :meth:`Ledger.verify` names
  the entry that was edited, deleted or reordered.
- The schema has a version table and an ordered list of migrations (:data:`MIGRATIONS`). A
  ledger of a newer schema, a corrupt or non-SQLite file or a read-only location is refused
  with one :class:`~dpaudit.errors.LedgerError` line before anything is written.

Composition of what was spent follows :mod:`dpaudit.accounting.ledger_compose`: sequential on
the same records, parallel (worst child) over declared disjoint partitions, and fail-closed
(a non-private release makes the budget unbounded; an unreadable guarantee is an error).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import json
import math
import os
import re
import sqlite3
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from .. import __version__
from ..errors import BudgetExceededError, LedgerError, UsageError
from ..records import Release, _json_safe
from ..validation import open_unit, positive_finite
from . import ledger_compose as lc
from .adjacency import Adjacency, require_same
from .events import Event
from .ledger_paths import resolve_ledger_path

#: PRAGMA application_id of a dpaudit ledger ("dpal").
APPLICATION_ID = 0x6470616C
#: Hash that precedes the first entry.
GENESIS_HASH = "0" * 64
#: Seconds a writer waits for another process's transaction before giving up.
BUSY_TIMEOUT_S = 60.0
ENTRY_KINDS = ("release", "void", "cap", "partition")
_SQLITE_MAGIC = b"SQLite format 3\x00"
_NAME_RE = re.compile(r"^[A-Za-z0-9_.\-]+(/[A-Za-z0-9_.\-]+)*$")


def _migrate_to_1(conn: sqlite3.Connection) -> None:
    conn.execute(
        """CREATE TABLE entries (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            id TEXT NOT NULL UNIQUE,
            kind TEXT NOT NULL,
            created_at TEXT NOT NULL,
            dataset TEXT NOT NULL,
            payload TEXT NOT NULL,
            prev_hash TEXT NOT NULL,
            hash TEXT NOT NULL
        )"""
    )
    conn.execute("CREATE INDEX entries_dataset ON entries(dataset)")
    conn.execute(
        "CREATE TABLE chain_head (one INTEGER PRIMARY KEY CHECK (one = 1), seq INTEGER NOT NULL, "
        "count INTEGER NOT NULL, hash TEXT NOT NULL)"
    )
    conn.execute("INSERT INTO chain_head (one, seq, count, hash) VALUES (1, 0, 0, ?)", (GENESIS_HASH,))
    conn.execute("CREATE TRIGGER entries_no_update BEFORE UPDATE ON entries BEGIN SELECT RAISE(ABORT, 'ledger entries are append-only'); END")
    conn.execute("CREATE TRIGGER entries_no_delete BEFORE DELETE ON entries BEGIN SELECT RAISE(ABORT, 'ledger entries are append-only'); END")


#: Ordered migrations: ``MIGRATIONS[v]`` turns a schema of version ``v - 1`` into version ``v``.
#: Version 0 is an empty database. A future schema change appends ``MIGRATIONS[2] = ...``;
#: opening an older ledger applies the missing steps in one transaction.
MIGRATIONS: dict[int, Callable[[sqlite3.Connection], None]] = {1: _migrate_to_1}
_REQUIRED_TRIGGERS = ("entries_no_update", "entries_no_delete")


def latest_schema_version() -> int:
    return max(MIGRATIONS)


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="microseconds")


def canonical_json(obj) -> str:
    """The one serialisation that is hashed: sorted keys, no spaces, non-finite floats as strings."""
    return json.dumps(_json_safe(obj), sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def _sweep_tag(config: object) -> dict | None:
    """``{"name", "task"}`` from a release's ``config["sweep"]`` (written by dpaudit.sweeps), else None."""
    tag = config.get("sweep") if isinstance(config, dict) else None
    if not isinstance(tag, dict) or not isinstance(tag.get("name"), str):
        return None
    return {"name": tag["name"], "task": tag.get("task")}


def entry_hash(prev_hash: str, entry_id: str, kind: str, created_at: str, dataset: str, payload_text: str) -> str:
    """sha256 over the previous hash and every stored column of the entry (seq excluded:
    an entry's place in the chain is fixed by ``prev_hash``)."""
    material = json.dumps(["dpaudit-ledger-v1", prev_hash, entry_id, kind, created_at, dataset, payload_text], separators=(",", ":"))
    return hashlib.sha256(material.encode("utf-8")).hexdigest()


def _check_name(what: str, value: object) -> str:
    if not isinstance(value, str) or not _NAME_RE.match(value):
        raise UsageError(f"{what} must be a non-empty name of letters, digits, '_', '-', '.' and '/' separators, got {value!r}.")
    return value


# ---------------------------------------------------------------- records


@dataclass(frozen=True)
class Entry:
    """One row of the ledger, as stored."""

    seq: int
    id: str
    kind: str
    created_at: str
    dataset: str
    payload: dict
    prev_hash: str
    hash: str
    voided_by: str | None = None

    def to_dict(self) -> dict:
        d = {
            "seq": self.seq, "id": self.id, "kind": self.kind, "created_at": self.created_at,
            "dataset": self.dataset, **self.payload, "prev_hash": self.prev_hash, "hash": self.hash,
        }
        if self.kind == "release":
            d["voided_by"] = self.voided_by
        return d


@dataclass(frozen=True)
class Problem:
    """One integrity finding of :meth:`Ledger.verify`."""

    kind: str  # edited | deleted | reordered | unreadable | schema | integrity
    message: str
    seq: int | None = None
    id: str | None = None

    def to_dict(self) -> dict:
        return {"kind": self.kind, "seq": self.seq, "id": self.id, "message": self.message}


@dataclass(frozen=True)
class VerifyReport:
    """Result of the hash-chain check; ``ok`` is derived from ``problems``."""

    path: str
    entries: int
    head_hash: str
    schema_version: int
    problems: tuple = field(default_factory=tuple)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict:
        return {
            "ledger": self.path, "ok": self.ok, "entries": self.entries, "head_hash": self.head_hash,
            "schema_version": self.schema_version, "problems": [p.to_dict() for p in self.problems],
        }

    def __str__(self) -> str:
        if self.ok:
            return f"ledger {self.path}: {self.entries} entries, hash chain intact (head {self.head_hash[:16]})."
        return "\n".join(p.message for p in self.problems)


# ---------------------------------------------------------------- opening


def open_ledger(path: str | os.PathLike | None = None, *, busy_timeout: float = BUSY_TIMEOUT_S) -> "Ledger":
    """Open (creating if absent) the ledger at ``path`` (see :func:`resolve_ledger_path`)."""
    return Ledger(resolve_ledger_path(path), busy_timeout=busy_timeout)


def _describe_sqlite_error(path: Path, e: BaseException) -> str:
    text = str(e).splitlines()[0] if str(e) else type(e).__name__
    low = text.lower()
    if "readonly" in low or "read-only" in low:
        return f"ledger {path} is read-only ({text}); dpaudit needs write access to the file and its directory."
    if "locked" in low or "busy" in low:
        return f"ledger {path} is busy: another process held its lock for too long ({text})."
    if "not a database" in low or "malformed" in low or "corrupt" in low:
        return f"ledger {path} is corrupt or not an SQLite database ({text}); it was left untouched."
    if "unable to open" in low:
        return f"cannot open ledger {path} ({text}); check that its directory exists and is writable."
    return f"ledger {path}: {text}."


@contextlib.contextmanager
def _sqlite_errors(path: Path) -> Iterator[None]:
    try:
        yield
    except sqlite3.Error as e:
        raise LedgerError(_describe_sqlite_error(path, e)) from None


class Ledger:
    """An open ledger. Use as a context manager; every method is safe across processes."""

    def __init__(self, path: str | os.PathLike, *, busy_timeout: float = BUSY_TIMEOUT_S) -> None:
        self.path = Path(path)
        self._busy_timeout = float(busy_timeout)
        self._conn: sqlite3.Connection | None = None
        self._precheck_location()
        conn = None
        try:
            with _sqlite_errors(self.path):
                conn = sqlite3.connect(str(self.path), timeout=self._busy_timeout, isolation_level=None)
                conn.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout * 1000)}")
                self._conn = conn
                self._open_schema()
        except BaseException:
            if conn is not None:
                conn.close()
            self._conn = None
            raise

    # -- context manager
    def __enter__(self) -> "Ledger":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    @property
    def conn(self) -> sqlite3.Connection:
        if self._conn is None:
            raise LedgerError(f"ledger {self.path} is closed.")
        return self._conn

    # -- opening checks (nothing is written before they pass)
    def _precheck_location(self) -> None:
        p = self.path
        if p.exists():
            if p.is_dir():
                raise LedgerError(f"ledger path {p} is a directory; give a file path.")
            try:
                with open(p, "rb") as f:
                    head = f.read(len(_SQLITE_MAGIC))
            except OSError as e:
                raise LedgerError(f"cannot read ledger {p}: {e.strerror}.") from None
            if head and head != _SQLITE_MAGIC:
                raise LedgerError(f"ledger {p} is not an SQLite database (corrupt or another kind of file); it was left untouched.")
            if not os.access(p, os.R_OK | os.W_OK) or not os.access(p.parent, os.W_OK):
                raise LedgerError(f"ledger {p} is read-only; dpaudit needs write access to the file and its directory (WAL mode).")
            return
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise LedgerError(f"cannot create the ledger directory {p.parent}: {e.strerror or e}.") from None
        if not os.access(p.parent, os.W_OK):
            raise LedgerError(f"cannot create ledger {p}: directory {p.parent} is read-only.")

    def _open_schema(self) -> None:
        conn = self.conn
        app_id = conn.execute("PRAGMA application_id").fetchone()[0]
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if not tables and app_id in (0, APPLICATION_ID):
            self._initialise()
            return
        if app_id != APPLICATION_ID or "schema_version" not in tables:
            raise LedgerError(f"{self.path} is an SQLite database but not a dpaudit ledger; it was left untouched.")
        version = self._schema_version()
        latest = latest_schema_version()
        if version > latest:
            raise LedgerError(
                f"ledger {self.path} has schema version {version}, newer than this dpaudit ({__version__}) supports "
                f"({latest}); upgrade dpaudit. The ledger was left untouched."
            )
        self._set_pragmas()
        if version < latest:
            self._migrate()

    def _schema_version(self) -> int:
        row = self.conn.execute("SELECT MAX(version) FROM schema_version").fetchone()
        return int(row[0] or 0)

    def _set_pragmas(self) -> None:
        mode = self.conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise LedgerError(f"ledger {self.path} cannot use write-ahead logging (journal mode {mode}); use a local file system.")
        # FULL: a committed entry survives power loss too, not only a killed process.
        self.conn.execute("PRAGMA synchronous = FULL")

    def _initialise(self) -> None:
        self._set_pragmas()
        with self._write():
            tables = {r[0] for r in self.conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if "schema_version" in tables:  # another process initialised it while we waited
                return
            if tables:
                raise LedgerError(f"{self.path} is an SQLite database but not a dpaudit ledger; it was left untouched.")
            self.conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
            self.conn.execute("CREATE TABLE schema_version (version INTEGER NOT NULL, applied_at TEXT NOT NULL, dpaudit_version TEXT NOT NULL)")
            self._apply_migrations(0)

    def _migrate(self) -> None:
        with self._write():
            self._apply_migrations(self._schema_version())

    def _apply_migrations(self, current: int) -> None:
        latest = latest_schema_version()
        for v in range(current + 1, latest + 1):
            MIGRATIONS[v](self.conn)
            self.conn.execute("INSERT INTO schema_version (version, applied_at, dpaudit_version) VALUES (?, ?, ?)", (v, _now(), __version__))
        self.conn.execute(f"PRAGMA user_version = {latest}")

    @property
    def schema_version(self) -> int:
        with _sqlite_errors(self.path):
            return self._schema_version()

    # -- transactions
    @contextlib.contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One BEGIN IMMEDIATE transaction: all of it commits, or none of it."""
        conn = self.conn
        with _sqlite_errors(self.path):
            conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            raise
        with _sqlite_errors(self.path):
            try:
                conn.execute("COMMIT")
            except sqlite3.Error:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
                raise

    def _append(self, kind: str, dataset: str, payload: dict, entry_id: str | None = None) -> str:
        """Append one entry inside the caller's write transaction and advance the chain head."""
        conn = self.conn
        entry_id = entry_id or uuid.uuid4().hex
        with _sqlite_errors(self.path):
            head = conn.execute("SELECT seq, count, hash FROM chain_head WHERE one = 1").fetchone()
            if head is None:
                raise LedgerError(f"ledger {self.path} has no chain head; run `dpaudit ledger verify`.")
            last = conn.execute("SELECT seq, hash FROM entries ORDER BY seq DESC LIMIT 1").fetchone()
            if (last[1] if last else GENESIS_HASH) != head[2]:
                # Appending after a broken chain would bury the break; refuse instead.
                raise LedgerError(f"ledger {self.path} fails its integrity check (last entry does not match the chain head); run `dpaudit ledger verify`.")
            created_at = _now()
            text = canonical_json(payload)
            h = entry_hash(head[2], entry_id, kind, created_at, dataset, text)
            cur = conn.execute(
                "INSERT INTO entries (id, kind, created_at, dataset, payload, prev_hash, hash) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (entry_id, kind, created_at, dataset, text, head[2], h),
            )
            conn.execute("UPDATE chain_head SET seq = ?, count = count + 1, hash = ? WHERE one = 1", (cur.lastrowid, h))
        return entry_id

    # -- reading
    def _rows(self, where: str = "", params: tuple = ()) -> list[tuple]:
        with _sqlite_errors(self.path):
            return self.conn.execute(
                f"SELECT seq, id, kind, created_at, dataset, payload, prev_hash, hash FROM entries {where} ORDER BY seq", params
            ).fetchall()

    def _entries_from_rows(self, rows) -> list[Entry]:
        out = []
        for seq, eid, kind, created_at, dataset, text, prev, h in rows:
            try:
                payload = json.loads(text)
                if not isinstance(payload, dict):
                    raise ValueError("payload is not an object")
            except ValueError as e:
                raise LedgerError(f"ledger entry #{seq} ({eid}) is unreadable ({e}); run `dpaudit ledger verify`.") from None
            out.append(Entry(seq, eid, kind, created_at, dataset, payload, prev, h))
        voids = {e.payload.get("target"): e.id for e in out if e.kind == "void"}
        return [Entry(**{**e.__dict__, "voided_by": voids.get(e.id)}) if e.kind == "release" else e for e in out]

    def entries(self, *, dataset: str | None = None, kind: str | None = None) -> list[Entry]:
        """All entries in append order (optionally of one dataset and/or kind); voided releases carry ``voided_by``."""
        es = self._entries_from_rows(self._rows("WHERE dataset = ?", (dataset,)) if dataset else self._rows())
        return [e for e in es if kind is None or e.kind == kind]

    def get(self, entry_id: str) -> Entry:
        """The entry with this id (or a unique prefix of at least 6 characters)."""
        if not isinstance(entry_id, str) or not entry_id:
            raise UsageError(f"entry id must be a non-empty string, got {entry_id!r}.")
        es = self.entries()
        exact = [e for e in es if e.id == entry_id]
        if exact:
            return exact[0]
        matches = [e for e in es if e.id.startswith(entry_id)] if len(entry_id) >= 6 else []
        if len(matches) == 1:
            return matches[0]
        if len(matches) > 1:
            raise UsageError(f"entry id must identify one entry, got {entry_id!r} (matches {len(matches)}).")
        raise UsageError(f"entry id must be an id in ledger {self.path}, got {entry_id!r}.")

    def _intact_entries(self, dataset: str | None = None) -> list[Entry]:
        """Entries, after checking the whole hash chain: budgets are never computed from a
        ledger that was edited, truncated or reordered (fail closed)."""
        with _sqlite_errors(self.path):
            head, rows = self._head_and_rows()
        problems = chain_problems(head, rows)
        if problems:
            raise LedgerError(f"ledger {self.path} fails verification ({problems[0].message.rstrip('.')}); run `dpaudit ledger verify`.")
        return self._entries_from_rows([r for r in rows if dataset is None or r[4] == dataset])

    def _states(self, dataset: str | None = None, sweep: str | None = None) -> dict[str, lc.DatasetState]:
        # Voids reference releases of the same dataset, so a per-dataset read is complete.
        es = self._intact_entries(dataset)
        if sweep is not None:  # only that sweep's releases (caps, partitions and voids stay)
            es = [e for e in es if e.kind != "release" or (e.payload.get("sweep") or {}).get("name") == sweep]
        return lc.replay(es)

    def require_sweep(self, sweep: str) -> None:
        """Raise a UsageError naming the known sweeps unless ``sweep`` has releases here."""
        known = self.sweeps()
        if sweep not in known:
            allowed = ", ".join(sorted(known)) or "none recorded"
            raise UsageError(f"sweep must be one recorded in ledger {self.path} ({allowed}), got {sweep!r}.")

    def sweeps(self) -> dict[str, int]:
        """Sweep name -> number of releases recorded under it (see :func:`_sweep_tag`)."""
        out: dict[str, int] = {}
        for e in self.entries(kind="release"):
            name = (e.payload.get("sweep") or {}).get("name")
            if name is not None:
                out[name] = out.get(name, 0) + 1
        return out

    # -- writing
    def record(self, release: Release, *, artefact_path: str | None = None) -> str:
        """Append ``release`` (one transaction); returns its entry id (= ``release.id``).

        The guarantee must parse as an event unless the release is non-private (then the
        dataset's budget becomes unbounded). A release whose adjacency differs from the
        releases already recorded on its dataset is refused (AdjacencyMismatchError), since
        the two could never be composed. Recording the identical release twice is a no-op.
        The cap is *not* enforced here: by now the model exists, and an unrecorded release is
        worse than an over-cap one; :meth:`preflight` is where over-cap work is refused.
        """
        ds = release.dataset if isinstance(release.dataset, dict) else {}
        name = _check_name("dataset name", ds.get("name"))
        partition = _check_name("partition", release.partition)
        adjacency = Adjacency.parse(release.adjacency).value
        if not release.non_private:
            lc.parse_event(release.guarantee, f"guarantee of release {release.id}")
        payload = {
            "release_id": release.id,
            "mechanism": release.mechanism,
            "dataset_name": name,
            "dataset_sha256": ds.get("sha256"),
            "partition": partition,
            "adjacency": adjacency,
            "privacy_unit": getattr(release, "privacy_unit", None),
            "accountant": release.accountant,
            "guarantee": None if release.non_private else release.guarantee,
            "epsilon": math.inf if release.non_private else release.epsilon,
            "delta": release.delta,
            "noise_multiplier": release.noise_multiplier,
            "sample_rate": release.sample_rate,
            "steps": release.steps,
            "clipping_norm": release.clipping_norm,
            "non_private": bool(release.non_private),
            "artefact_path": artefact_path,
            "release_created_at": release.created_at,
            "dpaudit_version": release.dpaudit_version,
        }
        sweep = _sweep_tag(release.config)
        if sweep is not None:
            # Which sweep (and task) made this release, so `ledger list --sweep NAME` can show
            # what a whole sweep spent. Absent for releases not made by a sweep.
            payload["sweep"] = sweep
        with self._write():
            existing = self._rows("WHERE id = ?", (release.id,))
            if existing:
                if existing[0][5] == canonical_json(payload):
                    return release.id
                old = json.loads(existing[0][5])
                if "sweep" not in old and {k: v for k, v in payload.items() if k != "sweep"} == old:
                    return release.id  # recorded before ledgers kept the sweep tag: same release
                raise LedgerError(f"release {release.id} is already in ledger {self.path} with different content; a release id is recorded once.")
            state = self._states(name).get(name)
            current = state.adjacency() if state else None
            if current is not None:
                require_same(current, adjacency, f"releases on dataset {name!r}")
            return self._append("release", name, payload, entry_id=release.id)

    def cap(self, dataset: str, epsilon: float, delta: float) -> str:
        """Set the budget cap of ``dataset``: its composed epsilon at ``delta`` may not exceed ``epsilon``."""
        _check_name("dataset", dataset)
        epsilon = positive_finite("epsilon", epsilon)
        delta = open_unit("delta", delta)
        with self._write():
            return self._append("cap", dataset, {"dataset": dataset, "epsilon": epsilon, "delta": delta})

    def declare_partition(self, dataset: str, parent: str, children, declared_by: str) -> str:
        """Record that ``parent`` is the disjoint union of ``children`` (as stated by ``declared_by``,
        the mechanism or person that made the split). Releases on the children then compose in
        parallel. Re-declaring the identical split returns the existing entry id."""
        _check_name("dataset", dataset)
        _check_name("parent partition", parent)
        children = tuple(children)
        if not children:
            raise UsageError(f"children must be at least one partition, got {list(children)!r}.")
        for c in children:
            _check_name("child partition", c)
        if len(set(children)) != len(children) or parent in children:
            raise UsageError(f"children must be distinct and differ from the parent {parent!r}, got {list(children)!r}.")
        if not isinstance(declared_by, str) or not declared_by.strip():
            raise UsageError(f"declared_by must be a non-empty string naming who made the split, got {declared_by!r}.")
        with self._write():
            state = self._states(dataset).get(dataset) or lc.DatasetState(dataset)
            if state.check_partition(parent, children):
                for e in self.entries(dataset=dataset, kind="partition"):
                    if e.payload.get("parent") == parent:
                        return e.id
            payload = {"dataset": dataset, "parent": parent, "children": list(children), "declared_by": declared_by.strip()}
            return self._append("partition", dataset, payload)

    def void(self, entry_id: str, reason: str) -> str:
        """Withdraw a release recorded by mistake: appends a ``void`` entry referencing it.
        Voided releases no longer count towards the budget; the original entry stays."""
        if not isinstance(reason, str) or not reason.strip():
            raise UsageError(f"reason must be a non-empty explanation, got {reason!r}.")
        with self._write():
            target = self.get(entry_id)
            if target.kind != "release":
                raise UsageError(f"entry to void must be a release, got a {target.kind} entry ({target.id}).")
            if target.voided_by:
                raise UsageError(f"release to void must not be voided already, got {target.id} (voided by {target.voided_by}).")
            return self._append("void", target.dataset, {"target": target.id, "reason": reason.strip()})

    # -- budget
    def _delta_for(self, state: lc.DatasetState | None) -> float:
        return state.cap[1] if state and state.cap else lc.DEFAULT_DELTA

    def check(self, *, dataset: str, partition: str, event: Event | None, adjacency: str) -> dict:
        """What spending ``event`` on ``dataset:partition`` would do to the budget (no write)."""
        _check_name("dataset", dataset)
        _check_name("partition", partition)
        adj = Adjacency.parse(adjacency).value
        state = self._states(dataset).get(dataset) or lc.DatasetState(dataset)
        current = state.adjacency()
        if current is not None:
            require_same(current, adj, f"the planned release and the releases on dataset {dataset!r}")
        planned = lc.ReleaseView("planned", dataset, partition, adj, None, None, event, event is None)
        result = {"dataset": dataset, "partition": partition, "adjacency": adj, "cap": None, "allowed": True}
        if state.cap is None:
            return result
        cap_eps, cap_delta = state.cap
        before = lc.dataset_total(state)
        after = lc.dataset_total(state.with_release(planned))
        b_spent = lc.bounds(before.event, delta=cap_delta, adjacency=adj, unbounded=before.unbounded)
        b_alone = lc.bounds(event, delta=cap_delta, adjacency=adj, unbounded=event is None)
        b_after = lc.bounds(after.event, delta=cap_delta, adjacency=adj, unbounded=after.unbounded)
        result.update(
            cap={"epsilon": cap_eps, "delta": cap_delta}, spent=b_spent["epsilon"], needs=b_alone["epsilon"],
            total=b_after["epsilon"], releases=before.releases_subtree, allowed=b_after["epsilon"] <= cap_eps,
        )
        return result

    def preflight(self, *, dataset: str, partition: str, event: Event | None, adjacency: str) -> None:
        """Refuse (BudgetExceededError) a planned release that would push ``dataset`` over its cap.

        Called *before* any training. The composed total follows the partition tree (see
        :mod:`~dpaudit.accounting.ledger_compose`); no cap means no limit.
        """
        r = self.check(dataset=dataset, partition=partition, event=event, adjacency=adjacency)
        if r["allowed"]:
            return
        c = r["cap"]
        raise BudgetExceededError(
            f"budget of dataset {dataset!r} exceeded: {r['releases']} release(s) already spent epsilon={_fmt(r['spent'])}, "
            f"this release on {dataset}:{partition} needs epsilon={_fmt(r['needs'])} alone, composed total would be "
            f"epsilon={_fmt(r['total'])} > cap epsilon={_fmt(c['epsilon'])} at delta={c['delta']:g}; refused before training."
        )

    def summary(self, dataset: str | None = None, *, accountants=("rdp", "prv"), sweep: str | None = None) -> list[dict]:
        """Per dataset: one row for the whole dataset (partition ``"*"``) and one per partition.

        Each row: releases (directly on it / in its subtree), composed epsilon bounds at the
        cap's delta (default 1e-5) from rdp, prv (upper bound) and, for pure-only trees, the
        pure sum; ``epsilon`` = the smallest of those bounds; the naive sum of the releases'
        own claims; the cap; ``remaining`` = cap epsilon minus the *dataset* total (the budget a
        new release can still use, whatever partition it touches).

        ``sweep``: compose only the releases recorded under that sweep (what the sweep alone
        spent); ``remaining`` is then None, since it is a property of the whole dataset.
        """
        if dataset is not None:
            _check_name("dataset", dataset)
        if sweep is not None:
            self.require_sweep(sweep)
        states = self._states(dataset, sweep)
        if sweep is not None:
            states = {k: v for k, v in states.items() if v.releases}
        if dataset is not None and dataset not in states:
            raise UsageError(f"dataset must be one recorded in ledger {self.path}{'' if sweep is None else f' under sweep {sweep!r}'}, got {dataset!r}.")
        rows: list[dict] = []
        for name in sorted(states):
            st = states[name]
            adj = st.adjacency()
            delta = self._delta_for(st)
            total = lc.dataset_total(st)
            tb = lc.bounds(total.event, delta=delta, adjacency=adj, unbounded=total.unbounded, accountants=accountants)
            cap = {"epsilon": st.cap[0], "delta": st.cap[1]} if st.cap else None
            remaining = (st.cap[0] - tb["epsilon"]) if st.cap and sweep is None else None
            nodes = [(lc.DATASET_SCOPE, total, tb)]
            for p in st.tree_order():
                nt = lc.node_total(st, p)
                nodes.append((p, nt, lc.bounds(nt.event, delta=delta, adjacency=adj, unbounded=nt.unbounded, accountants=accountants)))
            for p, nt, b in nodes:
                rows.append({
                    "dataset": name,
                    "partition": p,
                    "node": name if p == lc.DATASET_SCOPE else f"{name}:{p}",
                    "parent": None if p == lc.DATASET_SCOPE else st.parent(p),
                    "children": list(st.roots()) if p == lc.DATASET_SCOPE else list(st.children.get(p, ())),
                    "subsets": [] if p == lc.DATASET_SCOPE else st.subsets(p),
                    "declared_by": None if p == lc.DATASET_SCOPE else st.declared_by.get(p),
                    "adjacency": adj,
                    "releases": nt.releases,
                    "releases_subtree": nt.releases_subtree,
                    "non_private_releases": nt.non_private,
                    "unbounded": nt.unbounded,
                    **b,
                    "naive_epsilon": nt.naive_epsilon,
                    "naive_delta": nt.naive_delta,
                    "cap": cap,
                    "remaining": remaining,
                    "voided_releases": len(st.voided) if p == lc.DATASET_SCOPE else None,
                    "dataset_sha256": sorted(st.sha256),
                })
        return rows

    # -- integrity
    def verify(self) -> VerifyReport:
        """Check the hash chain; each problem names the entry (seq and id) that was edited,
        deleted or reordered. Also runs SQLite's integrity check, checks the append-only
        triggers and parses every entry (an unreadable guarantee is a problem, never 0)."""
        problems: list[Problem] = []
        with _sqlite_errors(self.path):
            integrity = [r[0] for r in self.conn.execute("PRAGMA integrity_check").fetchall()]
            if integrity != ["ok"]:
                problems.append(Problem("integrity", f"SQLite integrity check failed: {'; '.join(integrity[:3])}."))
            triggers = {r[0] for r in self.conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'")}
            head, rows = self._head_and_rows()
            version = self._schema_version()
        missing = [t for t in _REQUIRED_TRIGGERS if t not in triggers]
        if missing:
            problems.append(Problem("schema", f"append-only triggers {', '.join(missing)} are missing: the ledger was altered outside dpaudit."))
        problems.extend(chain_problems(head, rows))
        for seq, eid, kind, _c, _d, text, _p, _h in rows:
            try:
                payload = json.loads(text)
                if kind not in ENTRY_KINDS:
                    raise ValueError(f"unknown kind {kind!r}")
                if kind == "release" and not payload.get("non_private"):
                    lc.parse_event(payload.get("guarantee"))
            except Exception as e:  # noqa: BLE001 - any failure to read an entry is reported, never skipped
                msg = str(e).splitlines()[0] if str(e) else type(e).__name__
                problems.append(Problem("unreadable", f"entry #{seq} ({kind} {eid}) cannot be read: {msg}", seq, eid))
        last_hash = rows[-1][7] if rows else GENESIS_HASH
        return VerifyReport(str(self.path), len(rows), last_hash, version, tuple(problems))

    def _head_and_rows(self):
        # One read transaction, so the head and the rows are from the same snapshot.
        conn = self.conn
        own = not conn.in_transaction
        if own:
            conn.execute("BEGIN")
        try:
            head = conn.execute("SELECT seq, count, hash FROM chain_head WHERE one = 1").fetchone()
            rows = self._rows()
        finally:
            if own:
                conn.execute("COMMIT")
        return head, rows


def chain_problems(head, rows) -> list[Problem]:
    """Hash-chain findings for ``rows`` (seq order) against the chain head, naming each entry."""
    problems: list[Problem] = []
    by_hash = {r[7]: r for r in rows}
    prev_row = None
    for r in rows:
        seq, eid, kind, created_at, dataset, text, prev, h = r
        label = f"entry #{seq} ({kind} {eid})"
        if entry_hash(prev, eid, kind, created_at, dataset, text) != h:
            problems.append(Problem("edited", f"{label} was edited: its content no longer matches its hash.", seq, eid))
        expected_prev = prev_row[7] if prev_row else GENESIS_HASH
        if prev != expected_prev:
            after = by_hash.get(prev)
            if after is not None and after is not r:
                problems.append(Problem(
                    "reordered",
                    f"{label} was reordered: it was appended after entry #{after[0]} ({after[1]}) but is now stored "
                    + (f"after entry #{prev_row[0]} ({prev_row[1]})." if prev_row else "first."),
                    seq, eid))
            elif prev == GENESIS_HASH:
                problems.append(Problem("reordered", f"{label} was reordered: it was the first entry but is now stored after entry #{prev_row[0]} ({prev_row[1]}).", seq, eid))
            elif (prev_row is not None and seq != prev_row[0] + 1) or (prev_row is None and seq != 1):
                where = f"between entry #{prev_row[0]} ({prev_row[1]}) and {label}" if prev_row else f"before {label}"
                problems.append(Problem("deleted", f"entry/entries {where} were deleted: {label} follows an entry that is no longer in the ledger.", seq, eid))
            elif prev_row is not None:
                problems.append(Problem(
                    "edited",
                    f"entry #{prev_row[0]} ({prev_row[2]} {prev_row[1]}) was edited and re-hashed: {label} no longer follows it "
                    "(or entries between them were deleted and the rest renumbered).",
                    prev_row[0], prev_row[1]))
            else:
                problems.append(Problem("deleted", f"the first entry/entries were deleted: {label} follows an entry that is no longer in the ledger.", seq, eid))
        prev_row = r
    last_hash = prev_row[7] if prev_row else GENESIS_HASH
    problems.extend(_check_head(head, rows, by_hash, last_hash, problems))
    return problems


def _check_head(head, rows, by_hash, last_hash, found) -> list[Problem]:
    """Compare the chain head (last hash, entry count) with what the table holds."""
    if head is None:
        return [Problem("deleted", "the chain head is missing: the ledger was altered outside dpaudit.")]
    head_seq, head_count, head_hash = head
    if head_hash == last_hash and head_count == len(rows):
        return []
    seqs = {r[0]: r for r in rows}
    if head_hash in by_hash:
        if any(p.kind == "reordered" for p in found):
            return []  # already named
        tail = [r for r in rows if r[0] > by_hash[head_hash][0]]
        if tail:
            return [Problem("edited", f"entry #{tail[0][0]} ({tail[0][1]}) and later were added outside dpaudit (after the chain head).", tail[0][0], tail[0][1])]
    elif head_hash != GENESIS_HASH or rows:
        if head_seq in seqs:
            r = seqs[head_seq]
            if any(p.kind == "edited" and p.seq == head_seq for p in found):
                return []
            return [Problem("edited", f"entry #{head_seq} ({r[2]} {r[1]}) was edited and re-hashed: its hash differs from the chain head.", head_seq, r[1])]
        last = rows[-1] if rows else None
        return [Problem(
            "deleted",
            f"the last entry #{head_seq} was deleted: the chain head records {head_count} entries ending at entry #{head_seq}, "
            f"but the ledger holds {len(rows)}" + (f" ending at entry #{last[0]} ({last[1]})." if last else "."),
            head_seq, None)]
    if head_count != len(rows) and not any(p.kind == "deleted" for p in found):
        return [Problem("deleted", f"the chain head records {head_count} entries but the ledger holds {len(rows)}.")]
    return []


def _fmt(x: float) -> str:
    return "inf" if math.isinf(x) else f"{x:.4f}"
